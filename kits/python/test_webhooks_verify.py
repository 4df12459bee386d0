"""pytest kits/python   (kits/run test runs it in its venv)"""

import base64
import hashlib
import hmac
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.padding import PKCS1v15
from cryptography.hazmat.primitives.hashes import SHA256

from webhooks_verify import (PublicKey, Verified, WebhookVerificationError, load_public_key,
                             verify)

VECTORS = Path(__file__).resolve().parent.parent / "vectors"
CASES = json.loads((VECTORS / "cases.json").read_text(encoding="utf-8"))["cases"]
PUBLISHED = json.loads((VECTORS / "platform-signature.json").read_text())
TEST_KEYS = json.loads((VECTORS / "test-only-keys.json").read_text())


def outcome(headers, body, key, now_ms):
    try:
        return f"genuine: {verify(headers, body, key, now_ms=now_ms).scheme} signature"
    except WebhookVerificationError as err:
        return f"refused: {err.reason}"


def case(name):
    return next(c for c in CASES if c["name"] == name)


@pytest.mark.parametrize("c", CASES, ids=[c["name"] for c in CASES])
def test_vector(c):
    body = base64.b64decode(c["body_base64"])
    assert outcome(c["headers"], body, c["key"], c["now_ms"]) == c["expect"]


def test_published_example():
    headers = {PUBLISHED["header_name"]: PUBLISHED["header_value"]}
    body = PUBLISHED["raw_body"].encode()
    t = PUBLISHED["timestamp_ms"]
    assert verify(headers, body, PUBLISHED["public_key_pem"], now_ms=t) == Verified("platform", None, t)
    assert outcome(headers, body + b" ", PUBLISHED["public_key_pem"], t) == "refused: no signature matches"


def test_published_example_single_hash_fails():
    key = serialization.load_pem_public_key(PUBLISHED["public_key_pem"].encode())
    sig = base64.b64decode(PUBLISHED["header_value"].split(",v0=")[1])
    signed = f"{PUBLISHED['timestamp_ms']}.{PUBLISHED['raw_body']}".encode()
    with pytest.raises(InvalidSignature):
        key.verify(sig, signed, PKCS1v15(), SHA256())
    key.verify(sig, hashlib.sha256(signed).digest(), PKCS1v15(), SHA256())  # two passes: fine


def test_default_now_is_the_clock():
    c = case("platform: one signature")
    with pytest.raises(WebhookVerificationError, match="stale timestamp"):
        verify(c["headers"], base64.b64decode(c["body_base64"]), c["key"])


class FrameworkHeaders:
    """Stands in for a framework's header object: a mapping with its own key case."""

    def __init__(self, pairs):
        self._pairs = [(k.title(), v) for k, v in pairs.items()]

    def items(self):
        return iter(self._pairs)


def test_framework_headers_and_a_loaded_key():
    c = case("standard: one signature")
    key = load_public_key(c["key"].encode())
    assert isinstance(key, PublicKey) and key.scheme == "standard"
    result = verify(FrameworkHeaders(c["headers"]), bytearray(base64.b64decode(c["body_base64"])), key,
                    now_ms=c["now_ms"])
    assert result == Verified("standard", c["headers"]["webhook-id"],
                              int(c["headers"]["webhook-timestamp"]) * 1000)


def test_same_header_twice_is_malformed():
    c = case("platform: one signature")
    headers = {**c["headers"], "x-webhook-signature": c["headers"]["X-Webhook-Signature"]}
    body = base64.b64decode(c["body_base64"])
    assert outcome(headers, body, c["key"], c["now_ms"]) == "refused: malformed header"


def test_str_body_is_refused():
    c = CASES[0]
    with pytest.raises(TypeError):
        verify(c["headers"], base64.b64decode(c["body_base64"]).decode(), c["key"], now_ms=c["now_ms"])


def pem(public) -> str:
    return public.public_bytes(serialization.Encoding.PEM,
                               serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.mark.parametrize("key", [
    "", "hello", "whpk_AAAA", "whpk_!!", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    pem(ec.generate_private_key(ec.SECP256R1()).public_key()),
    pem(rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()),
])
def test_unusable_keys_are_value_errors(key):
    with pytest.raises(ValueError):
        load_public_key(key)


def test_cross_check_with_the_standardwebhooks_library():
    """The PyPI `standardwebhooks` library does v1 (HMAC) only, not v1a (Ed25519).

    What it can check: that it builds the signed content "<id>.<timestamp>.<body>" exactly as
    this kit does, and that it reads a webhook-signature header carrying v1a entries beside
    its own v1 entry. One delivery carries "v1,<HMAC by the library> v1a,<Ed25519 by a
    test-only key>"; the library verifies it with the HMAC secret and this kit with whpk_.
    """
    standardwebhooks = pytest.importorskip("standardwebhooks")
    secret = bytes(range(32))
    webhook = standardwebhooks.Webhook("whsec_" + base64.b64encode(secret).decode())
    msg_id, now = "msg_cross_check", int(time.time())
    body = '{"type":"cross.check","note":"café"}'.encode()
    content = f"{msg_id}.{now}.".encode() + body
    v1 = webhook.sign(msg_id, datetime.fromtimestamp(now, tz=timezone.utc), body.decode())
    # Same content on both sides: the library's HMAC is the HMAC of our content.
    assert v1 == "v1," + base64.b64encode(hmac.new(secret, content, hashlib.sha256).digest()).decode()
    private = serialization.load_pem_private_key(
        TEST_KEYS["standard-new"]["private_pkcs8_pem"].encode(), password=None)
    v1a = "v1a," + base64.b64encode(private.sign(content)).decode()
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(now), "webhook-signature": f"{v1} {v1a}"}
    webhook.verify(body, headers)  # raises if the library refuses
    assert verify(headers, body, TEST_KEYS["standard-new"]["public"]).scheme == "standard"
    # The library ignores v1a entries: a delivery with v1a only is refused by it.
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        webhook.verify(body, {**headers, "webhook-signature": v1a})


def test_flask_receiver():
    """The README's Flask view: request.get_data() and request.headers as they are."""
    flask = pytest.importorskip("flask")
    app = flask.Flask(__name__)
    key = load_public_key(TEST_KEYS["platform-new"]["public"])
    handled = []

    @app.post("/webhooks")
    def webhook():
        body = flask.request.get_data()  # raw bytes; read before request.json
        try:
            result = verify(flask.request.headers, body, key)
        except WebhookVerificationError as err:
            return err.reason, 400
        handled.append((result.id, flask.request.get_json()["n"]))
        return "", 204

    private = serialization.load_pem_private_key(
        TEST_KEYS["platform-new"]["private_pkcs8_pem"].encode(), password=None)
    body = b'{"type": "example",   "n": 1}'
    t = str(int(time.time() * 1000))
    sig = private.sign(hashlib.sha256(f"{t}.".encode() + body).digest(), PKCS1v15(), SHA256())
    headers = {"X-Webhook-Id": "evt_flask", "X-Webhook-Signature": f"t={t},v0={base64.b64encode(sig).decode()}",
               "Content-Type": "application/json"}
    client = app.test_client()
    assert client.post("/webhooks", data=body, headers=headers).status_code == 204
    refused = client.post("/webhooks", data=body.replace(b"1", b"2"), headers=headers)
    assert (refused.status_code, refused.get_data()) == (400, b"no signature matches")
    assert handled == [("evt_flask", 1)]
