//! The shapes API.md promises, as assertions: error bodies, timestamps, ids,
//! public keys.

use base64::Engine as _;
use serde_json::{Value, json};

/// The 401 body for a request without `Api-Key` (API.md §2, word for word).
pub fn missing_key_body() -> Value {
    json!({"code":"required","location":"header","name":"Api-Key","message":"Missing Api-Key header","source":{"location":"header","key":"Api-Key"}})
}

/// The 401 body for a request whose `Api-Key` is not a working key.
pub fn invalid_key_body() -> Value {
    json!({"code":"invalid","location":"header","name":"Api-Key","message":"Invalid Api-Key header","source":{"location":"header","key":"Api-Key"}})
}

/// What is wrong with an error body, by the shape of API.md §2: `code` of
/// 1–256 characters, `message` of 1–512, and a well-formed `source` when
/// present. Empty when nothing is.
pub fn error_shape_problems(body: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    match body["code"].as_str() {
        None => problems.push("no string code".to_owned()),
        Some(code) if !(1..=256).contains(&code.chars().count()) => {
            problems.push(format!("code of {} characters", code.chars().count()));
        }
        Some(_) => {}
    }
    match body["message"].as_str() {
        None => problems.push("no string message".to_owned()),
        Some(message) if !(1..=512).contains(&message.chars().count()) => {
            problems.push(format!("message of {} characters", message.chars().count()));
        }
        Some(_) => {}
    }
    if let Some(source) = body.get("source") {
        if !source["location"].as_str().is_some_and(|l| ["path", "query", "body", "header"].contains(&l)) {
            problems.push(format!("source.location {}", source["location"]));
        }
        if source["key"].as_str().is_none_or(str::is_empty) {
            problems.push(format!("source.key {}", source["key"]));
        }
    }
    problems
}

/// Asserts the error body shape of API.md §2 (see [`error_shape_problems`]).
#[track_caller]
pub fn error_shape(body: &Value) {
    let problems = error_shape_problems(body);
    assert!(problems.is_empty(), "error body {body}: {}", problems.join(", "));
}

/// Checks a timestamp of the contract: RFC 3339, UTC, milliseconds, `Z`
/// (`2026-11-21T10:04:05.123Z`). Returns it parsed.
#[track_caller]
pub fn timestamp(value: &Value) -> chrono::DateTime<chrono::Utc> {
    let text = value.as_str().unwrap_or_else(|| panic!("timestamp is not a string: {value}"));
    let shape_ok = text.len() == 24
        && text.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            10 => b == b'T',
            13 | 16 => b == b':',
            19 => b == b'.',
            23 => b == b'Z',
            _ => b.is_ascii_digit(),
        });
    assert!(shape_ok, "timestamp {text:?} is not YYYY-MM-DDTHH:MM:SS.mmmZ");
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("timestamp {text:?}: {e}"))
        .with_timezone(&chrono::Utc)
}

/// Whether `id` is `wep_` + 32 lowercase hex digits.
pub fn is_endpoint_id(id: &str) -> bool {
    id.strip_prefix("wep_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// Checks that `pem` is a PEM SubjectPublicKeyInfo of an RSA-2048 key that a
/// receiver can load with `webhooks_signature::platform::Verifier`.
#[track_caller]
pub fn rsa_2048_public_key(pem: &str) {
    assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----\n"), "public_key does not start as PEM SPKI: {pem:?}");
    assert!(pem.ends_with("-----END PUBLIC KEY-----\n"), "public_key does not end as PEM SPKI: {pem:?}");
    webhooks_signature::platform::Verifier::from_pem(pem)
        .unwrap_or_else(|e| panic!("public_key does not load as a verifier: {e}"));
    let base64: String = pem.lines().filter(|line| !line.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(base64)
        .unwrap_or_else(|e| panic!("public_key body is not base64: {e}"));
    // SEQUENCE { AlgorithmIdentifier rsaEncryption, BIT STRING { RSAPublicKey } }
    // with a 2048-bit modulus and e = 65537 is exactly 294 bytes.
    assert_eq!(der.len(), 294, "public_key is not an RSA-2048 SPKI ({} DER bytes)", der.len());
    const RSA_ENCRYPTION_OID: &[u8] = &[0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
    assert!(der.windows(RSA_ENCRYPTION_OID.len()).any(|w| w == RSA_ENCRYPTION_OID), "public_key is not RSA");
}
