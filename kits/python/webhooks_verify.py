"""Verifies a webhook delivery's signature (needs the `cryptography` package).

scheme "platform": X-Webhook-Signature: t=<ms>,v0=<base64>   (RSA key, PEM)
scheme "standard": webhook-id / webhook-timestamp / webhook-signature: v1a,<base64>
                   (Standard Webhooks, Ed25519 key shown as whpk_<base64>)
The key you hold decides which headers are checked. Pass the RAW body bytes exactly
as received (Flask: request.get_data()): never parse and re-serialize the JSON.
"""

import base64
import hashlib
import re
import time
from typing import Mapping, NamedTuple, Optional, Union

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.padding import PKCS1v15
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.serialization import load_pem_public_key

PLATFORM_WINDOW_MS = 10 * 60 * 1000
STANDARD_WINDOW_MS = 5 * 60 * 1000
_DIGITS = re.compile(r"[0-9]{1,15}")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_WS = " \t"  # the only whitespace tolerated around entries


class WebhookVerificationError(Exception):
    """Not genuine. .reason is one of: 'no signature header', 'stale timestamp',
    'no signature matches', 'malformed header'."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Verified(NamedTuple):
    scheme: str  # "platform" or "standard"
    id: Optional[str]  # X-Webhook-Id / webhook-id: your idempotency key
    timestamp_ms: int


class PublicKey(NamedTuple):
    scheme: str
    key: Union[RSAPublicKey, Ed25519PublicKey]


def _b64(text: str) -> Optional[bytes]:
    """Strict base64 (standard alphabet, padding optional); None when invalid."""
    bare = text.rstrip("=")
    if not _BASE64.fullmatch(text) or not bare or len(bare) % 4 == 1:
        return None
    return base64.b64decode(bare + "=" * (-len(bare) % 4))


def load_public_key(text: Union[str, bytes]) -> PublicKey:
    """'whpk_...' -> standard, PEM -> platform. Raises ValueError if neither."""
    text = (text.decode() if isinstance(text, bytes) else text).strip()
    if text.startswith("whpk_"):
        raw = _b64(text[5:])
        if raw is None or len(raw) != 32:
            raise ValueError("whpk_ key must be base64 of 32 bytes")
        return PublicKey("standard", Ed25519PublicKey.from_public_bytes(raw))
    if text.startswith("-----BEGIN"):
        key = load_pem_public_key(text.encode())
        if not isinstance(key, RSAPublicKey) or key.key_size < 2048:
            raise ValueError("PEM key is not an RSA public key of at least 2048 bits")
        return PublicKey("platform", key)
    raise ValueError("key is neither a PEM public key nor whpk_<base64>")


def _header(headers: Mapping[str, str], name: str) -> Optional[str]:
    """Case-insensitive lookup (dict, Flask/Werkzeug Headers, ...)."""
    found = [v for k, v in headers.items() if k.lower() == name]
    if not found:
        return None
    if len(found) > 1 or not isinstance(found[0], str):
        raise WebhookVerificationError("malformed header")
    return found[0]


def _verify_platform(headers, body: bytes, key: RSAPublicKey, now_ms: int) -> Verified:
    value = _header(headers, "x-webhook-signature")
    if value is None:
        raise WebhookVerificationError("no signature header")
    t, signatures = None, []
    for entry in (e.strip(_WS) for e in value.split(",")):
        if not entry:
            continue
        name, eq, text = entry.partition("=")
        name, text = name.strip(_WS), text.strip(_WS)
        if not eq:
            raise WebhookVerificationError("malformed header")
        if name == "t":
            if t is not None or not _DIGITS.fullmatch(text):
                raise WebhookVerificationError("malformed header")
            t = text  # the digest covers t exactly as written
        elif name == "v0":
            signature = _b64(text)
            if signature is None:
                raise WebhookVerificationError("malformed header")
            signatures.append(signature)
        # other entries: future schemes, ignored
    if t is None or not signatures:
        raise WebhookVerificationError("malformed header")
    # Two passes of hashing: SHA-256 of "<t>.<body>", then RSA PKCS#1 v1.5 SHA-256 over it.
    digest = hashlib.sha256(t.encode() + b"." + body).digest()
    if not any(_rsa_ok(key, sig, digest) for sig in signatures):  # EVERY v0 is tried
        raise WebhookVerificationError("no signature matches")
    if abs(now_ms - int(t)) > PLATFORM_WINDOW_MS:
        raise WebhookVerificationError("stale timestamp")
    return Verified("platform", _header(headers, "x-webhook-id"), int(t))


def _rsa_ok(key: RSAPublicKey, signature: bytes, digest: bytes) -> bool:
    try:
        key.verify(signature, digest, PKCS1v15(), SHA256())
        return True
    except InvalidSignature:
        return False


def _verify_standard(headers, body: bytes, key: Ed25519PublicKey, now_ms: int) -> Verified:
    value = _header(headers, "webhook-signature")
    if value is None:
        raise WebhookVerificationError("no signature header")
    msg_id = _header(headers, "webhook-id")
    ts = (_header(headers, "webhook-timestamp") or "").strip(_WS)
    entries = [e for e in re.split("[ \t]+", value) if e]
    if not msg_id or not _DIGITS.fullmatch(ts) or not entries:
        raise WebhookVerificationError("malformed header")
    signatures = []
    for entry in entries:
        version, comma, text = entry.partition(",")
        if not comma:
            raise WebhookVerificationError("malformed header")
        if version != "v1a":
            continue  # v1 (HMAC) and other versions: not ours
        signature = _b64(text)
        if signature is None:
            raise WebhookVerificationError("malformed header")
        signatures.append(signature)
    content = f"{msg_id}.{ts}.".encode() + body
    if not any(_ed25519_ok(key, sig, content) for sig in signatures):
        raise WebhookVerificationError("no signature matches")
    if abs(now_ms - int(ts) * 1000) > STANDARD_WINDOW_MS:
        raise WebhookVerificationError("stale timestamp")
    return Verified("standard", msg_id, int(ts) * 1000)


def _ed25519_ok(key: Ed25519PublicKey, signature: bytes, content: bytes) -> bool:
    try:
        key.verify(signature, content)
        return True
    except InvalidSignature:
        return False


def verify(headers: Mapping[str, str], body: bytes, public_key: Union[str, bytes, PublicKey],
           now_ms: Optional[int] = None) -> Verified:
    """Returns Verified, or raises WebhookVerificationError (.reason) when not genuine.
    Raises ValueError/TypeError when the key or the body argument is unusable."""
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError("body must be the raw bytes received")
    key = public_key if isinstance(public_key, PublicKey) else load_public_key(public_key)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if key.scheme == "standard":
        return _verify_standard(headers, bytes(body), key.key, now_ms)
    return _verify_platform(headers, bytes(body), key.key, now_ms)
