#!/usr/bin/env python3
"""Checks the vectors with the `openssl` command line tool, apart from every kit.

    python check_openssl.py

Standard library only (no `cryptography`), and the signed content is built here
from the scheme's description, not by the kits or make.py. For every case whose
expected outcome is "genuine: ..." one signature in the relevant header must verify
under openssl; for every "no signature matches" case none may. Other refusals
(missing or malformed headers, stale timestamps) are about parsing and clocks, not
cryptography, and are left to the kits' own tests.
"""

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# SubjectPublicKeyInfo DER for Ed25519 is this prefix followed by the 32 raw key bytes.
ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")


def b64(text):
    text = text.rstrip("=")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def header(headers, name):
    return next((v for k, v in headers.items() if k.lower() == name), None)


def openssl(*args):
    return subprocess.run(["openssl", *args], capture_output=True).returncode == 0


def platform_signatures(case, body):
    """(message file content, [signatures]) for `openssl dgst -sha256 -verify`."""
    entries = [e.strip(" \t").split("=", 1) for e in header(case["headers"], "x-webhook-signature").split(",")]
    t = next(v for k, v in entries if k.strip() == "t").strip()
    sigs = [b64(v.strip()) for k, v in entries if k.strip() == "v0"]
    # openssl dgst hashes its input once more: feeding it SHA-256("<t>.<body>") is the two passes.
    return hashlib.sha256(t.encode() + b"." + body).digest(), sigs


def standard_signatures(case, body):
    h = case["headers"]
    ts = header(h, "webhook-timestamp").strip()
    content = header(h, "webhook-id").encode() + b"." + ts.encode() + b"." + body
    sigs = [b64(e[4:]) for e in header(h, "webhook-signature").split() if e.startswith("v1a,")]
    return content, sigs


def main():
    if not shutil.which("openssl"):
        print("openssl: not installed, skipped")
        return 0
    cases = json.loads((HERE / "cases.json").read_text(encoding="utf-8"))["cases"]
    passed, failed = 0, []
    with tempfile.TemporaryDirectory(prefix="kits-openssl-") as tmp:
        tmp = Path(tmp)
        for case in cases:
            genuine = case["expect"].startswith("genuine:")
            if not genuine and case["expect"] != "refused: no signature matches":
                continue
            body = base64.b64decode(case["body_base64"])
            key = case["key"].strip()
            if key.startswith("whpk_"):
                der = ED25519_SPKI_PREFIX + b64(key[5:])
                pem = "-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(der).decode() + "\n-----END PUBLIC KEY-----\n"
                (tmp / "key.pem").write_text(pem)
                message, sigs = standard_signatures(case, body)
                verify = ["pkeyutl", "-verify", "-pubin", "-inkey", str(tmp / "key.pem"), "-rawin",
                          "-in", str(tmp / "message"), "-sigfile", str(tmp / "sig")]
            else:
                (tmp / "key.pem").write_text(key)
                message, sigs = platform_signatures(case, body)
                verify = ["dgst", "-sha256", "-verify", str(tmp / "key.pem"), "-signature", str(tmp / "sig"),
                          str(tmp / "message")]
            (tmp / "message").write_bytes(message)
            matches = 0
            for sig in sigs:
                (tmp / "sig").write_bytes(sig)
                matches += openssl(*verify)
            if (matches > 0) == genuine:
                passed += 1
            else:
                failed.append(f"{case['name']}: openssl found {matches} matching signature(s)")
    for failure in failed:
        print(f"FAIL {failure}")
    print(f"openssl: {passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
