#!/usr/bin/env python3
"""Runs every kit's CLI over every case of cases.json and checks the CLI contract.

    python check_clis.py 'node /abs/kits/node/cli.js' '/abs/target/debug/webhooks-api verify' ...

Each argument is one CLI's command (as `kits/run commands` prints them). For each:
  - every case: the exact output line ("genuine: ..." / "refused: <reason>") and exit code 0/1;
  - a fresh delivery signed now (each scheme, and a switch overlap) verifies without --now-ms;
  - usage errors exit 2 with nothing on stdout.
Fresh deliveries are signed with the TEST-ONLY keys, so this needs `cryptography`.
"""

import base64
import hashlib
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.padding import PKCS1v15
from cryptography.hazmat.primitives.hashes import SHA256

HERE = Path(__file__).resolve().parent
CASES = json.loads((HERE / "cases.json").read_text(encoding="utf-8"))["cases"]
KEYS = json.loads((HERE / "test-only-keys.json").read_text())
EC_PUBLIC_PEM = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def private(name):
    return serialization.load_pem_private_key(KEYS[name]["private_pkcs8_pem"].encode(), password=None)


def fresh_cases():
    """Deliveries signed at the current time: the CLIs' default clock must accept them."""
    body = b'{"type":"fresh.delivery","at":"now"}'
    t = str(int(time.time() * 1000))
    ts = str(int(time.time()))
    digest = hashlib.sha256(t.encode() + b"." + body).digest()
    v0 = base64.b64encode(private("platform-new").sign(digest, PKCS1v15(), SHA256())).decode()
    v1a = base64.b64encode(private("standard-new").sign(f"evt_fresh.{ts}.".encode() + body)).decode()
    platform = {"X-Webhook-Id": "evt_fresh", "X-Webhook-Signature": f"t={t},v0={v0}"}
    standard = {"webhook-id": "evt_fresh", "webhook-timestamp": ts, "webhook-signature": f"v1a,{v1a}"}
    both = {**platform, **standard}
    return [
        ("fresh platform delivery, default clock", platform, body, "platform-new", "genuine: platform signature"),
        ("fresh standard delivery, default clock", standard, body, "standard-new", "genuine: standard signature"),
        ("fresh switch overlap, PEM key", both, body, "platform-new", "genuine: platform signature"),
        ("fresh switch overlap, whpk key", both, body, "standard-new", "genuine: standard signature"),
    ]


class Runner:
    def __init__(self, command, workdir):
        self.argv = shlex.split(command)
        self.dir = Path(workdir)
        self.passed = 0
        self.failures = []

    def files(self, headers, body, key):
        (self.dir / "headers.json").write_text(json.dumps(headers), encoding="utf-8")
        (self.dir / "body").write_bytes(body)
        (self.dir / "key").write_text(key, encoding="utf-8")
        return ["--headers", str(self.dir / "headers.json"), "--body", str(self.dir / "body"),
                "--key", str(self.dir / "key")]

    def run(self, args):
        done = subprocess.run(self.argv + args, capture_output=True, timeout=60)
        return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")

    def expect(self, name, args, want_line, want_code):
        code, out, err = self.run(args)
        ok = code == want_code and (out == f"{want_line}\n" if want_line is not None else out == "")
        if ok:
            self.passed += 1
        else:
            self.failures.append(f"{name}: exit {code}, stdout {out!r}, stderr {err.strip()[:300]!r}; "
                                 f"want exit {want_code}, {want_line!r}")

    def check(self):
        for c in CASES:
            args = self.files(c["headers"], base64.b64decode(c["body_base64"]), c["key"])
            self.expect(c["name"], args + ["--now-ms", str(c["now_ms"])], c["expect"], c["exit_code"])
        for name, headers, body, key, want in fresh_cases():
            self.expect(name, self.files(headers, body, KEYS[key]["public"]), want, 0)

        good = CASES[0]
        args = self.files(good["headers"], base64.b64decode(good["body_base64"]), good["key"])
        now = ["--now-ms", str(good["now_ms"])]
        joined = [f"{args[i]}={args[i + 1]}" for i in range(0, len(args), 2)]
        self.expect("options as --name=value", joined + [f"--now-ms={good['now_ms']}"], good["expect"], 0)
        missing = self.dir / "does-not-exist"
        for name, bad in [
            ("no arguments", []),
            ("--key missing", args[:4] + now),
            ("--body missing", args[:2] + args[4:] + now),
            ("unknown option", args + now + ["--verbose"]),
            ("stray argument", args + now + ["extra"]),
            ("--now-ms not an integer", args + ["--now-ms", "soon"]),
            ("--now-ms without a value", args + ["--now-ms"]),
            ("headers file missing", ["--headers", str(missing)] + args[2:] + now),
            ("body file missing", args[:2] + ["--body", str(missing)] + args[4:] + now),
            ("key file missing", args[:4] + ["--key", str(missing)] + now),
        ]:
            self.expect(f"usage error: {name}", bad, None, 2)
        for name, headers_text, key_text in [
            ("headers file is not JSON", "X-Webhook-Signature: t=1", good["key"]),
            ("headers file is a JSON array", "[]", good["key"]),
            ("a header value is not a string", '{"X-Webhook-Signature": 5}', good["key"]),
            ("key file is not a key", json.dumps(good["headers"]), "not a key"),
            ("key is an EC key", json.dumps(good["headers"]), EC_PUBLIC_PEM),
            ("whpk key of the wrong length", json.dumps(good["headers"]), "whpk_AAAA"),
            ("key is a private key", json.dumps(good["headers"]), KEYS["platform-old"]["private_pkcs8_pem"]),
            ("key has text before the PEM", json.dumps(good["headers"]), "my key:\n" + good["key"]),
        ]:
            (self.dir / "bad-headers.json").write_text(headers_text)
            (self.dir / "bad-key").write_text(key_text)
            self.expect(f"usage error: {name}", ["--headers", str(self.dir / "bad-headers.json")] + args[2:4]
                        + ["--key", str(self.dir / "bad-key")] + now, None, 2)


def label(argv):
    """The script or binary, with a subcommand after it (`webhooks-api verify`)."""
    if len(argv) > 1 and "/" not in argv[-1]:
        return f"{Path(argv[-2]).name} {argv[-1]}"
    return argv[-1]


def main(commands):
    if not commands:
        print(__doc__, file=sys.stderr)
        return 2
    total_passed = total_failed = 0
    for command in commands:
        with tempfile.TemporaryDirectory(prefix="kits-cli-") as workdir:
            runner = Runner(command, workdir)
            runner.check()
        for failure in runner.failures:
            print(f"FAIL [{command}] {failure}")
        print(f"cli {label(runner.argv)}: {runner.passed} passed, {len(runner.failures)} failed")
        total_passed += runner.passed
        total_failed += len(runner.failures)
    print(f"{total_passed} passed, {total_failed} failed")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
