#!/usr/bin/env python3
"""Writes the shared test vectors of the receiver kits, kits/vectors/cases.json.

    python make.py            write cases.json from test-only-keys.json
    python make.py --check    exit 1 unless cases.json is exactly what it would write
    python make.py --new-keys make new test keys first (then commit both files)

Every signature here is deterministic (RSA PKCS#1 v1.5 and Ed25519), so with the
committed keys the output is the same on every machine: --check proves that the
committed vectors were made by this script and nothing else.

The keys in test-only-keys.json are TEST ONLY: their private halves are published
in this repository. Never use them for a real endpoint.

Needs the `cryptography` package (kits/run setup puts it in its venv).
"""

import base64
import hashlib
import json
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.padding import PKCS1v15
from cryptography.hazmat.primitives.hashes import SHA256

HERE = Path(__file__).resolve().parent
KEYS_FILE = HERE / "test-only-keys.json"
CASES_FILE = HERE / "cases.json"
PUBLISHED_FILE = HERE / "platform-signature.json"

KEY_NAMES = [
    "platform-old", "platform-new", "platform-other",
    "standard-old", "standard-new", "standard-other",
]

T_MS = 1767225600123  # 2026-01-01T00:00:00.123Z, the platform scheme's t
T_S = 1767225600  # the same instant in seconds, the standard scheme's timestamp
NOW = T_MS + 1500  # the receiver's clock: a second and a half after signing
PLATFORM_WINDOW_MS = 10 * 60 * 1000
STANDARD_WINDOW_S = 5 * 60
EVENT_ID = "evt_2VbZ0gq7XkR4m1sT"
# Spaces and non-ASCII on purpose: re-serializing this JSON changes its bytes.
BODY = '{"type": "invoice.paid",  "data":{"amount":1999,"note":"café ✓"}}\n'.encode()
BINARY_BODY = b"\x00\xff\xfe binary, not UTF-8 \x80\r\n"


# ---------------------------------------------------------------- keys


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def new_keys() -> dict:
    keys = {
        "warning": "TEST ONLY. These private keys are published in this repository; "
        "never use them for a real endpoint.",
    }
    for name in KEY_NAMES:
        if name.startswith("platform"):
            private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        else:
            private = ed25519.Ed25519PrivateKey.generate()
        pem = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode("ascii")
        keys[name] = {"private_pkcs8_pem": pem, "public": public_text(private)}
    return keys


def public_text(private) -> str:
    """The public key as an endpoint shows it: SPKI PEM, or whpk_<base64 raw>."""
    public = private.public_key()
    if isinstance(public, ed25519.Ed25519PublicKey):
        raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return "whpk_" + b64(raw)
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


class Keys:
    def __init__(self, data: dict):
        self.public = {}
        self.private = {}
        for name in KEY_NAMES:
            private = serialization.load_pem_private_key(
                data[name]["private_pkcs8_pem"].encode(), password=None
            )
            if public_text(private) != data[name]["public"]:
                sys.exit(f"make.py: {KEYS_FILE.name}: {name}: public key does not match")
            self.private[name] = private
            self.public[name] = data[name]["public"]

    # Scheme platform: RSA PKCS#1 v1.5 SHA-256 over SHA-256("<t>.<body>").
    def platform(self, name: str, t: str, body: bytes) -> str:
        digest = hashlib.sha256(t.encode() + b"." + body).digest()
        return b64(self.private[name].sign(digest, PKCS1v15(), SHA256()))

    # What a wrong signer makes: one pass of hashing only. Must be refused.
    def platform_single_hash(self, name: str, t: str, body: bytes) -> str:
        return b64(self.private[name].sign(t.encode() + b"." + body, PKCS1v15(), SHA256()))

    # Scheme standard: Ed25519 over "<webhook-id>.<webhook-timestamp>.<body>".
    def standard(self, name: str, msg_id: str, ts: str, body: bytes) -> str:
        return b64(self.private[name].sign(f"{msg_id}.{ts}.".encode() + body))


# ---------------------------------------------------------------- cases

GENUINE_PLATFORM = "genuine: platform signature"
GENUINE_STANDARD = "genuine: standard signature"
NO_HEADER = "refused: no signature header"
STALE = "refused: stale timestamp"
NO_MATCH = "refused: no signature matches"
MALFORMED = "refused: malformed header"


def build_cases(keys: Keys, published: dict) -> list:
    cases = []

    def case(name, headers, expect, key, body=BODY, now_ms=NOW, public=None):
        cases.append({
            "name": name,
            "headers": headers,
            "body_base64": b64(body),
            "key_name": key,
            "key": public if public is not None else keys.public[key],
            "now_ms": now_ms,
            "expect": expect,
            "exit_code": 0 if expect.startswith("genuine:") else 1,
        })

    t = str(T_MS)
    ts = str(T_S)

    def platform_headers(sig_value, names=("X-Webhook-Id", "X-Webhook-Signature")):
        return {names[0]: EVENT_ID, names[1]: sig_value}

    def standard_headers(sig_value, msg_id=EVENT_ID, timestamp=ts,
                         names=("webhook-id", "webhook-timestamp", "webhook-signature")):
        return {names[0]: msg_id, names[1]: timestamp, names[2]: sig_value}

    # ---- scheme platform
    old = keys.platform("platform-old", t, BODY)
    new = keys.platform("platform-new", t, BODY)
    other = keys.platform("platform-other", t, BODY)
    one = f"t={t},v0={old}"
    case("platform: one signature", platform_headers(one), GENUINE_PLATFORM, "platform-old")
    case("platform: header names in lower case",
         platform_headers(one, ("x-webhook-id", "x-webhook-signature")), GENUINE_PLATFORM, "platform-old")
    case("platform: header names in upper case",
         platform_headers(one, ("X-WEBHOOK-ID", "X-WEBHOOK-SIGNATURE")), GENUINE_PLATFORM, "platform-old")
    case("platform: body bytes that are not UTF-8",
         platform_headers(f"t={t},v0={keys.platform('platform-old', t, BINARY_BODY)}"),
         GENUINE_PLATFORM, "platform-old", body=BINARY_BODY)
    case("platform: empty body",
         platform_headers(f"t={t},v0={keys.platform('platform-old', t, b'')}"),
         GENUINE_PLATFORM, "platform-old", body=b"")
    rotation = f"t={t},v0={new},v0={old}"
    case("platform: rotation overlap, receiver holds the old key",
         platform_headers(rotation), GENUINE_PLATFORM, "platform-old")
    case("platform: rotation overlap, receiver holds the new key",
         platform_headers(rotation), GENUINE_PLATFORM, "platform-new")
    case("platform: rotation overlap, receiver holds an unrelated key",
         platform_headers(rotation), NO_MATCH, "platform-other")
    case("platform: three signatures, the matching one last",
         platform_headers(f"t={t},v0={other},v0={new},v0={old}"), GENUINE_PLATFORM, "platform-old")
    case("platform: signature without base64 padding",
         platform_headers(f"t={t},v0={old.rstrip('=')}"), GENUINE_PLATFORM, "platform-old")
    case("platform: spaces and unknown entries are tolerated",
         platform_headers(f" t={t} , v1=future-scheme,  v0={old} "), GENUINE_PLATFORM, "platform-old")
    case("platform: signed by another key", platform_headers(f"t={t},v0={other}"), NO_MATCH, "platform-old")
    case("platform: body changed", platform_headers(one), NO_MATCH, "platform-old",
         body=BODY.replace(b"1999", b"1998"))
    case("platform: JSON body re-serialized (bytes differ)", platform_headers(one), NO_MATCH,
         "platform-old", body=json.dumps(json.loads(BODY)).encode())
    case("platform: t changed", platform_headers(f"t={T_MS + 1},v0={old}"), NO_MATCH, "platform-old")
    case("platform: t written with a leading zero (the digest covers t as written)",
         platform_headers(f"t=0{t},v0={old}"), NO_MATCH, "platform-old")
    case("platform: single-hash signature (signer skipped the first SHA-256 pass)",
         platform_headers(f"t={t},v0={keys.platform_single_hash('platform-old', t, BODY)}"),
         NO_MATCH, "platform-old")
    case("platform: t 10 minutes old is accepted", platform_headers(one), GENUINE_PLATFORM,
         "platform-old", now_ms=T_MS + PLATFORM_WINDOW_MS)
    case("platform: t 10 minutes ahead is accepted", platform_headers(one), GENUINE_PLATFORM,
         "platform-old", now_ms=T_MS - PLATFORM_WINDOW_MS)
    case("platform: t 10 minutes and 1 ms old is stale", platform_headers(one), STALE,
         "platform-old", now_ms=T_MS + PLATFORM_WINDOW_MS + 1)
    case("platform: t 10 minutes and 1 ms ahead is stale", platform_headers(one), STALE,
         "platform-old", now_ms=T_MS - PLATFORM_WINDOW_MS - 1)
    case("platform: t a day old is stale", platform_headers(one), STALE,
         "platform-old", now_ms=T_MS + 86_400_000)
    case("platform: forged signature with a stale t (signatures are checked first)",
         platform_headers(f"t={t},v0={other}"), NO_MATCH, "platform-old", now_ms=T_MS + 86_400_000)
    case("platform: no signature header", {"X-Webhook-Id": EVENT_ID}, NO_HEADER, "platform-old")
    for label, value in [
        ("empty", ""),
        ("an entry without '='", f"t={t},garbage,v0={old}"),
        ("no t entry", f"v0={old}"),
        ("no v0 entry", f"t={t}"),
        ("only an unknown signature entry", f"t={t},v1={old}"),
        ("t is not a number", f"t=12ab,v0={old}"),
        ("t is negative", f"t=-{t},v0={old}"),
        ("t is empty", f"t=,v0={old}"),
        ("two t entries", f"t={t},t={t},v0={old}"),
        ("v0 is not base64", f"t={t},v0=!!not*base64!!"),
        ("v0 is empty", f"t={t},v0="),
    ]:
        case(f"platform: malformed header, {label}", platform_headers(value), MALFORMED, "platform-old")

    # The published example: the key and header from the original platform's docs.
    pub_headers = {published["header_name"]: published["header_value"]}
    pub_body = published["raw_body"].encode()
    pub_t = published["timestamp_ms"]
    case("published example (replay window ignored: now = t)", pub_headers, GENUINE_PLATFORM,
         "published", body=pub_body, now_ms=pub_t, public=published["public_key_pem"])
    case("published example, body changed", pub_headers, NO_MATCH, "published",
         body=pub_body.replace(b"World!", b"World?"), now_ms=pub_t, public=published["public_key_pem"])
    case("published example, checked today (stale)", pub_headers, STALE, "published",
         body=pub_body, now_ms=NOW, public=published["public_key_pem"])
    case("published example against a test key", pub_headers, NO_MATCH, "platform-old",
         body=pub_body, now_ms=pub_t)
    pkcs1 = serialization.load_pem_public_key(published["public_key_pem"].encode()).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.PKCS1).decode("ascii")
    case("published example, key given as PKCS#1 PEM (BEGIN RSA PUBLIC KEY)", pub_headers,
         GENUINE_PLATFORM, "published-pkcs1", body=pub_body, now_ms=pub_t, public=pkcs1)

    # ---- scheme standard
    s_old = keys.standard("standard-old", EVENT_ID, ts, BODY)
    s_new = keys.standard("standard-new", EVENT_ID, ts, BODY)
    s_other = keys.standard("standard-other", EVENT_ID, ts, BODY)
    s_one = f"v1a,{s_old}"
    case("standard: one signature", standard_headers(s_one), GENUINE_STANDARD, "standard-old")
    case("standard: header names in title case",
         standard_headers(s_one, names=("Webhook-Id", "Webhook-Timestamp", "Webhook-Signature")),
         GENUINE_STANDARD, "standard-old")
    case("standard: header names in upper case",
         standard_headers(s_one, names=("WEBHOOK-ID", "WEBHOOK-TIMESTAMP", "WEBHOOK-SIGNATURE")),
         GENUINE_STANDARD, "standard-old")
    case("standard: body bytes that are not UTF-8",
         standard_headers(f"v1a,{keys.standard('standard-old', EVENT_ID, ts, BINARY_BODY)}"),
         GENUINE_STANDARD, "standard-old", body=BINARY_BODY)
    case("standard: empty body",
         standard_headers(f"v1a,{keys.standard('standard-old', EVENT_ID, ts, b'')}"),
         GENUINE_STANDARD, "standard-old", body=b"")
    s_rotation = f"v1a,{s_new} v1a,{s_old}"
    case("standard: rotation overlap, receiver holds the old key",
         standard_headers(s_rotation), GENUINE_STANDARD, "standard-old")
    case("standard: rotation overlap, receiver holds the new key",
         standard_headers(s_rotation), GENUINE_STANDARD, "standard-new")
    case("standard: rotation overlap, receiver holds an unrelated key",
         standard_headers(s_rotation), NO_MATCH, "standard-other")
    case("standard: extra spaces between entries",
         standard_headers(f"  v1a,{s_new}   v1a,{s_old} "), GENUINE_STANDARD, "standard-old")
    case("standard: v1 (HMAC) and unknown versions are ignored",
         standard_headers(f"v1,{b64(bytes(32))} v2,whatever v1a,{s_old}"), GENUINE_STANDARD, "standard-old")
    case("standard: only a v1 (HMAC) entry", standard_headers(f"v1,{b64(bytes(32))}"),
         NO_MATCH, "standard-old")
    case("standard: signature without base64 padding",
         standard_headers(f"v1a,{s_old.rstrip('=')}"), GENUINE_STANDARD, "standard-old")
    case("standard: signed by another key", standard_headers(f"v1a,{s_other}"), NO_MATCH, "standard-old")
    case("standard: signature of the wrong length",
         standard_headers(f"v1a,{b64(bytes(10))}"), NO_MATCH, "standard-old")
    case("standard: body changed", standard_headers(s_one), NO_MATCH, "standard-old",
         body=BODY.replace(b"1999", b"1998"))
    case("standard: JSON body re-serialized (bytes differ)", standard_headers(s_one), NO_MATCH,
         "standard-old", body=json.dumps(json.loads(BODY)).encode())
    case("standard: webhook-id changed", standard_headers(s_one, msg_id=EVENT_ID + "x"), NO_MATCH,
         "standard-old")
    case("standard: webhook-timestamp changed", standard_headers(s_one, timestamp=str(T_S + 1)),
         NO_MATCH, "standard-old")
    case("standard: platform-style signature under v1a (signed t.body)",
         standard_headers(f"v1a,{b64(keys.private['standard-old'].sign(f'{ts}.'.encode() + BODY))}"),
         NO_MATCH, "standard-old")
    ms = str(T_MS)
    case("standard: sender put milliseconds in webhook-timestamp (genuine, but far ahead)",
         standard_headers(f"v1a,{keys.standard('standard-old', EVENT_ID, ms, BODY)}", timestamp=ms),
         STALE, "standard-old")
    case("standard: timestamp 5 minutes old is accepted", standard_headers(s_one), GENUINE_STANDARD,
         "standard-old", now_ms=(T_S + STANDARD_WINDOW_S) * 1000)
    case("standard: timestamp 5 minutes ahead is accepted", standard_headers(s_one), GENUINE_STANDARD,
         "standard-old", now_ms=(T_S - STANDARD_WINDOW_S) * 1000)
    case("standard: timestamp 5 minutes and 1 ms old is stale", standard_headers(s_one), STALE,
         "standard-old", now_ms=(T_S + STANDARD_WINDOW_S) * 1000 + 1)
    case("standard: timestamp 5 minutes and 1 ms ahead is stale", standard_headers(s_one), STALE,
         "standard-old", now_ms=(T_S - STANDARD_WINDOW_S) * 1000 - 1)
    case("standard: 6 minutes old is stale (the platform's 10 minutes do not apply)",
         standard_headers(s_one), STALE, "standard-old", now_ms=(T_S + 360) * 1000)
    case("standard: forged signature with a stale timestamp (signatures are checked first)",
         standard_headers(f"v1a,{s_other}"), NO_MATCH, "standard-old", now_ms=(T_S + 3600) * 1000)
    case("standard: no signature header", {"webhook-id": EVENT_ID, "webhook-timestamp": ts},
         NO_HEADER, "standard-old")
    case("standard: malformed, no webhook-timestamp",
         {"webhook-id": EVENT_ID, "webhook-signature": s_one}, MALFORMED, "standard-old")
    case("standard: malformed, no webhook-id",
         {"webhook-timestamp": ts, "webhook-signature": s_one}, MALFORMED, "standard-old")
    for label, headers in [
        ("empty signature header", standard_headers("")),
        ("an entry without a comma", standard_headers(f"v1a{s_old}")),
        ("v1a signature is not base64", standard_headers("v1a,!!not*base64!!")),
        ("v1a signature is empty", standard_headers("v1a,")),
        ("timestamp is not a number", standard_headers(s_one, timestamp="soon")),
        ("timestamp has a fraction", standard_headers(s_one, timestamp=ts + ".5")),
        ("webhook-id is empty", standard_headers(s_one, msg_id="")),
    ]:
        case(f"standard: malformed, {label}", headers, MALFORMED, "standard-old")

    # ---- scheme switch overlap: both header sets, each signed with its own key
    p_to_s = {**standard_headers(f"v1a,{s_new}"), **platform_headers(f"t={t},v0={old}")}
    case("switch platform->standard: receiver holds the old PEM key", p_to_s, GENUINE_PLATFORM,
         "platform-old")
    case("switch platform->standard: receiver holds the new whpk key", p_to_s, GENUINE_STANDARD,
         "standard-new")
    case("switch platform->standard: a PEM key that signed neither", p_to_s, NO_MATCH, "platform-new")
    case("switch platform->standard: a whpk key that signed neither", p_to_s, NO_MATCH, "standard-old")
    s_to_p = {**platform_headers(f"t={t},v0={new}"), **standard_headers(f"v1a,{s_old}")}
    case("switch standard->platform: receiver holds the old whpk key", s_to_p, GENUINE_STANDARD,
         "standard-old")
    case("switch standard->platform: receiver holds the new PEM key", s_to_p, GENUINE_PLATFORM,
         "platform-new")
    case("switch: PEM key, only standard headers", standard_headers(s_one), NO_HEADER, "platform-old")
    case("switch: whpk key, only platform headers", platform_headers(one), NO_HEADER, "standard-old")
    case("switch: PEM key, stale standard headers do not matter",
         {**standard_headers(s_one), **platform_headers(one)}, GENUINE_PLATFORM, "platform-old",
         now_ms=T_MS + 8 * 60 * 1000)
    case("switch: whpk key, a malformed platform header does not matter",
         {**standard_headers(s_one), **platform_headers("garbage")}, GENUINE_STANDARD, "standard-old")

    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


def render(keys: Keys, published: dict) -> tuple:
    cases = build_cases(keys, published)
    document = {
        "what": "Test vectors for the receiver kits (kits/README.md). Each case: the request "
        "headers, the raw body (base64), the receiver's public key, the receiver's clock in "
        "unix milliseconds, and the line the kits' CLIs print (exit code 0 for 'genuine:', "
        "1 for 'refused:'). Generated by make.py from test-only-keys.json (TEST-ONLY keys); "
        "do not edit by hand.",
        "cases": cases,
    }
    return json.dumps(document, indent=1, ensure_ascii=False) + "\n", len(cases)


def main(argv: list) -> int:
    args = set(argv)
    if not args <= {"--check", "--new-keys"} or args == {"--check", "--new-keys"}:
        print(__doc__, file=sys.stderr)
        return 2
    if "--new-keys" in args:
        KEYS_FILE.write_text(json.dumps(new_keys(), indent=1) + "\n")
    keys = Keys(json.loads(KEYS_FILE.read_text()))
    published = json.loads(PUBLISHED_FILE.read_text())
    text, count = render(keys, published)
    if "--check" in args:
        current = CASES_FILE.read_text(encoding="utf-8") if CASES_FILE.exists() else ""
        if current != text:
            print("make.py: cases.json differs from what make.py writes; run "
                  "`python kits/vectors/make.py` and commit the result", file=sys.stderr)
            return 1
        print(f"vectors: cases.json is reproducible ({count} cases)")
        return 0
    CASES_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {CASES_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
