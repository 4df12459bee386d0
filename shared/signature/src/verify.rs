//! Request-level verification of a delivery, for Rust receivers: the Rust kit
//! of `kits/` (see `kits/README.md` and `kits/rust/README.md`).
//!
//! The key the receiver holds picks the scheme: a PEM RSA public key
//! (`-----BEGIN PUBLIC KEY-----`, or PKCS#1 `-----BEGIN RSA PUBLIC KEY-----`)
//! means `platform` and only `X-Webhook-Id` / `X-Webhook-Signature` are read; a
//! `whpk_…` Ed25519 key means `standard` and only `webhook-id` /
//! `webhook-timestamp` / `webhook-signature` are read. A refusal is one of the
//! four [`Refusal`] reasons, the same as every kit's; a key that cannot be used
//! is an [`UnusableKey`], never a refusal.
//!
//! The headers are parsed here as strictly as the other kits do (`t` and the
//! timestamp 1 to 15 digits, strict base64, one header per name whatever its
//! case); the cryptography is [`crate::platform::Verifier`] (RSA, two passes of
//! SHA-256) and [`crate::standard::verify`] (Ed25519).
//!
//! ```
//! use webhooks_signature::verify::{ReceiverKey, Refusal, verify_request};
//!
//! // The example published in the original platform's documentation.
//! # let vector: serde_json::Value = serde_json::from_str(include_str!(concat!(
//! #     env!("CARGO_MANIFEST_DIR"), "/../../kits/vectors/platform-signature.json")))?;
//! # let public_key_pem = vector["public_key_pem"].as_str().unwrap();
//! # let signature = vector["header_value"].as_str().unwrap();
//! # let t = vector["timestamp_ms"].as_i64().unwrap();
//! let body = br#"{"message":"Hello World!"}"#; // the raw bytes received
//! let headers = [("X-Webhook-Id", "evt_1"), ("X-Webhook-Signature", signature)];
//!
//! // Key text and check in one call:
//! let verified = verify_request(headers, body, public_key_pem, t)?;
//! assert_eq!(verified.scheme.as_str(), "platform");
//! assert_eq!(verified.event_id.as_deref(), Some("evt_1"));
//! assert_eq!(verified.timestamp_ms, t);
//!
//! // Or parse the key once (an unusable key is then a startup error) and
//! // check each request; a refusal is one of the four reasons.
//! let key = ReceiverKey::parse(public_key_pem)?;
//! assert_eq!(key.verify(headers, b"{}", t), Err(Refusal::NoSignatureMatches));
//! assert_eq!(key.verify(headers, body, t + 10 * 60 * 1000 + 1).unwrap_err().to_string(), "stale timestamp");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use base64::Engine as _;
use base64::alphabet;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use crate::STANDARD_PUBLIC_KEY_PREFIX;
use crate::Scheme;
use crate::platform::{self, Verifier};
use crate::standard::{self, StandardError};

/// How far the `platform` `t` may be from the receiver's clock, either way;
/// exactly this far is accepted.
pub const PLATFORM_WINDOW_MS: u64 = platform::REPLAY_WINDOW_MS;
/// How far the `standard` `webhook-timestamp` may be from the receiver's
/// clock, either way, in milliseconds; exactly this far is accepted.
pub const STANDARD_WINDOW_MS: u64 = standard::TOLERANCE_SECONDS.unsigned_abs() * 1000;

/// Why a delivery is not accepted. `Display` gives the kits' reason text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Refusal {
    /// The signature header of the key's scheme is absent.
    #[error("no signature header")]
    NoSignatureHeader,
    /// A header of the key's scheme is structurally wrong, or given twice.
    #[error("malformed header")]
    MalformedHeader,
    /// No signature entry of the key's scheme verifies with the key.
    #[error("no signature matches")]
    NoSignatureMatches,
    /// A signature verified, but its timestamp is outside the window (check
    /// the receiver's clock).
    #[error("stale timestamp")]
    StaleTimestamp,
}

impl Refusal {
    /// The reason as the kits print it after `refused: `.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoSignatureHeader => "no signature header",
            Refusal::MalformedHeader => "malformed header",
            Refusal::NoSignatureMatches => "no signature matches",
            Refusal::StaleTimestamp => "stale timestamp",
        }
    }
}

/// The receiver's key cannot verify anything: a configuration error, not a
/// refusal of the delivery.
#[derive(Debug, thiserror::Error)]
pub enum UnusableKey {
    /// Neither a PEM public key (from its first line) nor `whpk_…`.
    #[error("key is neither a PEM public key nor whpk_<base64>")]
    Unrecognized,
    /// `whpk_` followed by something other than the base64 of 32 bytes.
    #[error("whpk_ key must be the base64 of 32 bytes")]
    Standard,
    /// A PEM that is not an RSA public key of 2048 to 8192 bits (a private
    /// key, a certificate, an EC key, a short key, …).
    #[error("PEM key is not an RSA public key of 2048 to 8192 bits: {0}")]
    Pem(#[source] crate::KeyError),
}

/// What [`verify_request`] can fail with: a refusal of the delivery, or a key
/// that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum VerifyRequestError {
    /// The delivery is not accepted; `Display` is the reason alone.
    #[error(transparent)]
    Refused(Refusal),
    /// The key is unusable.
    #[error(transparent)]
    UnusableKey(UnusableKey),
}

impl VerifyRequestError {
    /// The refusal, when it is one.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            VerifyRequestError::Refused(refusal) => Some(*refusal),
            VerifyRequestError::UnusableKey(_) => None,
        }
    }
}

impl From<Refusal> for VerifyRequestError {
    fn from(refusal: Refusal) -> Self {
        VerifyRequestError::Refused(refusal)
    }
}

impl From<UnusableKey> for VerifyRequestError {
    fn from(key: UnusableKey) -> Self {
        VerifyRequestError::UnusableKey(key)
    }
}

/// A genuine delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The scheme that verified (the key's).
    pub scheme: Scheme,
    /// `X-Webhook-Id` / `webhook-id`: handle each event once (retries repeat
    /// it). Always present for `standard`; `None` when a `platform` delivery
    /// has no `X-Webhook-Id` (that header is not signed in that scheme).
    pub event_id: Option<String>,
    /// The signed time, unix milliseconds (`standard`: the seconds × 1000).
    pub timestamp_ms: i64,
}

/// One request header, as a name and its value's bytes: implemented for pairs
/// (`(&str, &str)`, `(String, String)`, `(&HeaderName, &HeaderValue)` of
/// `http`, …) and references to them, so `&[(&str, &str)]`, `&HashMap<String,
/// String>` and `&http::HeaderMap` can all be passed as they are.
pub trait HeaderEntry {
    /// The header name, in any case.
    fn name(&self) -> &str;
    /// The header value, as received.
    fn value(&self) -> &[u8];
}

impl<K: AsRef<str>, V: AsRef<[u8]>> HeaderEntry for (K, V) {
    fn name(&self) -> &str {
        self.0.as_ref()
    }
    fn value(&self) -> &[u8] {
        self.1.as_ref()
    }
}

impl<K: AsRef<str>, V: AsRef<[u8]>> HeaderEntry for &(K, V) {
    fn name(&self) -> &str {
        self.0.as_ref()
    }
    fn value(&self) -> &[u8] {
        self.1.as_ref()
    }
}

/// The receiver's public key, parsed: load it once (at startup, so that an
/// unusable key is a startup error) and verify each request with
/// [`ReceiverKey::verify`].
#[derive(Clone)]
pub struct ReceiverKey(KeyKind);

#[derive(Clone)]
enum KeyKind {
    Platform(Verifier),
    /// `whpk_` and the canonical (padded) base64 of the 32 bytes, as
    /// [`standard::verify`] reads it.
    Standard(String),
}

impl fmt::Debug for ReceiverKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            KeyKind::Platform(verifier) => f.debug_tuple("ReceiverKey::Platform").field(verifier).finish(),
            KeyKind::Standard(key) => f.debug_tuple("ReceiverKey::Standard").field(key).finish(),
        }
    }
}

impl ReceiverKey {
    /// Reads the key as the API shows it: `whpk_<base64>` (`standard`) or a
    /// PEM RSA public key (`platform`, SPKI or PKCS#1). Surrounding whitespace
    /// is ignored; anything else before the PEM's `-----BEGIN` line is not.
    pub fn parse(text: &str) -> Result<ReceiverKey, UnusableKey> {
        let text = text.trim();
        if let Some(encoded) = text.strip_prefix(STANDARD_PUBLIC_KEY_PREFIX) {
            let raw = decode_base64(encoded).filter(|raw| raw.len() == 32).ok_or(UnusableKey::Standard)?;
            return Ok(ReceiverKey(KeyKind::Standard(format!("{STANDARD_PUBLIC_KEY_PREFIX}{}", STANDARD.encode(raw)))));
        }
        if text.starts_with("-----BEGIN ") {
            return Verifier::from_pem(text).map(|v| ReceiverKey(KeyKind::Platform(v))).map_err(UnusableKey::Pem);
        }
        Err(UnusableKey::Unrecognized)
    }

    /// The scheme this key verifies (the headers it reads).
    pub fn scheme(&self) -> Scheme {
        match self.0 {
            KeyKind::Platform(_) => Scheme::Platform,
            KeyKind::Standard(_) => Scheme::Standard,
        }
    }

    /// Verifies one request: its headers, its raw body bytes exactly as
    /// received (never JSON re-serialized), and the receiver's clock in unix
    /// milliseconds. Every signature entry is tried; the window is checked
    /// after the signature.
    pub fn verify<H>(&self, headers: H, body: &[u8], now_ms: i64) -> Result<Verified, Refusal>
    where
        H: IntoIterator,
        H::Item: HeaderEntry,
    {
        let headers: Vec<H::Item> = headers.into_iter().collect();
        match &self.0 {
            KeyKind::Platform(verifier) => verify_platform(verifier, &headers, body, now_ms),
            KeyKind::Standard(key) => verify_standard(key, &headers, body, now_ms),
        }
    }
}

/// Verifies one request with the key's text: [`ReceiverKey::parse`] then
/// [`ReceiverKey::verify`]. `headers` is anything that iterates over (name,
/// value) pairs, see [`HeaderEntry`].
pub fn verify_request<H>(headers: H, body: &[u8], key: &str, now_ms: i64) -> Result<Verified, VerifyRequestError>
where
    H: IntoIterator,
    H::Item: HeaderEntry,
{
    Ok(ReceiverKey::parse(key)?.verify(headers, body, now_ms)?)
}

fn verify_platform<E: HeaderEntry>(
    verifier: &Verifier,
    headers: &[E],
    body: &[u8],
    now_ms: i64,
) -> Result<Verified, Refusal> {
    let value = header(headers, "x-webhook-signature")?.ok_or(Refusal::NoSignatureHeader)?;
    let mut t: Option<&str> = None;
    let mut signatures = Vec::new();
    for entry in value.split(',').map(trim) {
        if entry.is_empty() {
            continue;
        }
        let (name, text) = entry.split_once('=').ok_or(Refusal::MalformedHeader)?;
        match (trim(name), trim(text)) {
            ("t", text) => {
                if t.is_some() || !is_digits(text) {
                    return Err(Refusal::MalformedHeader);
                }
                // The digest covers t exactly as written.
                t = Some(text);
            }
            ("v0", text) => signatures.push(decode_base64(text).ok_or(Refusal::MalformedHeader)?),
            _ => {} // other entries: future schemes, ignored
        }
    }
    let Some(t) = t.filter(|_| !signatures.is_empty()) else {
        return Err(Refusal::MalformedHeader);
    };
    // The parts again in the form `Verifier` parses (it is more lenient about
    // `t` and stricter about base64 padding than the kits).
    let mut canonical = format!("t={t}");
    for signature in &signatures {
        canonical.push_str(",v0=");
        STANDARD.encode_string(signature, &mut canonical);
    }
    let timestamp_ms = verifier.verify(&canonical, body, Some(now_ms)).map_err(|error| match error {
        platform::VerifyError::Mismatch => Refusal::NoSignatureMatches,
        platform::VerifyError::Expired { .. } => Refusal::StaleTimestamp,
        _ => Refusal::MalformedHeader,
    })?;
    // Not signed in this scheme; informational, but one header only.
    let event_id = header(headers, "x-webhook-id")?.map(str::to_owned);
    Ok(Verified { scheme: Scheme::Platform, event_id, timestamp_ms })
}

fn verify_standard<E: HeaderEntry>(
    public_key: &str,
    headers: &[E],
    body: &[u8],
    now_ms: i64,
) -> Result<Verified, Refusal> {
    let value = header(headers, "webhook-signature")?.ok_or(Refusal::NoSignatureHeader)?;
    let id = header(headers, "webhook-id")?.filter(|id| !id.is_empty()).ok_or(Refusal::MalformedHeader)?;
    let timestamp = header(headers, "webhook-timestamp")?.map(trim).filter(|ts| is_digits(ts));
    let timestamp = timestamp.ok_or(Refusal::MalformedHeader)?;
    let entries: Vec<&str> = value.split([' ', '\t']).filter(|entry| !entry.is_empty()).collect();
    if entries.is_empty() {
        return Err(Refusal::MalformedHeader);
    }
    let mut canonical = String::new();
    for entry in entries {
        let (version, text) = entry.split_once(',').ok_or(Refusal::MalformedHeader)?;
        if version != "v1a" {
            continue; // v1 (HMAC) and other versions: not ours
        }
        let signature = decode_base64(text).ok_or(Refusal::MalformedHeader)?;
        if !canonical.is_empty() {
            canonical.push(' ');
        }
        canonical.push_str("v1a,");
        STANDARD.encode_string(signature, &mut canonical);
    }
    // The window is checked here, in milliseconds: `standard::verify` compares
    // whole seconds, which would accept 5 minutes and 999 ms.
    let seconds = standard::verify(public_key, id, timestamp, &canonical, body, None).map_err(|error| match error {
        StandardError::Mismatch => Refusal::NoSignatureMatches,
        StandardError::Expired { .. } => Refusal::StaleTimestamp,
        StandardError::BadTimestamp | StandardError::BadKey => Refusal::MalformedHeader,
    })?;
    // At most 15 digits: no overflow.
    let timestamp_ms = seconds * 1000;
    if now_ms.abs_diff(timestamp_ms) > STANDARD_WINDOW_MS {
        return Err(Refusal::StaleTimestamp);
    }
    Ok(Verified { scheme: Scheme::Standard, event_id: Some(id.to_owned()), timestamp_ms })
}

/// The one value of a header, looked up case-insensitively: `None` when
/// absent, malformed when given twice (under any spellings) or not UTF-8.
fn header<'a, E: HeaderEntry>(headers: &'a [E], name: &str) -> Result<Option<&'a str>, Refusal> {
    let mut found = headers.iter().filter(|entry| entry.name().chars().flat_map(char::to_lowercase).eq(name.chars()));
    let Some(first) = found.next() else {
        return Ok(None);
    };
    if found.next().is_some() {
        return Err(Refusal::MalformedHeader);
    }
    std::str::from_utf8(first.value()).map(Some).map_err(|_| Refusal::MalformedHeader)
}

/// Spaces and tabs only, like the other kits.
fn trim(text: &str) -> &str {
    text.trim_matches([' ', '\t'])
}

/// 1 to 15 ASCII digits.
fn is_digits(text: &str) -> bool {
    (1..=15).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
}

/// Strict base64 as in the other kits: the standard alphabet, at most two
/// `=` at the end (not checked against the length), something before them.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    const BARE: GeneralPurpose = GeneralPurpose::new(
        &alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    );
    let bare = text.trim_end_matches('=');
    if text.len() - bare.len() > 2 || bare.is_empty() || bare.len() % 4 == 1 {
        return None;
    }
    BARE.decode(bare).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use aws_lc_rs::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
    use serde_json::Value;

    use super::*;

    fn vectors_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../kits/vectors")
    }

    fn read_json(name: &str) -> Value {
        let path = vectors_dir().join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        serde_json::from_str(&text).expect("vector JSON")
    }

    /// The line the kits' CLIs print.
    fn line(result: &Result<Verified, VerifyRequestError>) -> String {
        match result {
            Ok(verified) => format!("genuine: {} signature", verified.scheme.as_str()),
            Err(VerifyRequestError::Refused(refusal)) => format!("refused: {refusal}"),
            Err(VerifyRequestError::UnusableKey(error)) => format!("unusable key: {error}"),
        }
    }

    #[test]
    fn verify_every_case_of_the_kits_vectors() {
        let cases = read_json("cases.json");
        let cases = cases["cases"].as_array().expect("cases");
        assert!(cases.len() >= 86, "{} cases", cases.len());
        let mut failures = Vec::new();
        for case in cases {
            let name = case["name"].as_str().expect("name");
            let headers: Vec<(&str, &str)> = case["headers"]
                .as_object()
                .expect("headers")
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str().expect("string header")))
                .collect();
            let body = STANDARD.decode(case["body_base64"].as_str().expect("body")).expect("base64 body");
            let key = case["key"].as_str().expect("key");
            let now_ms = case["now_ms"].as_i64().expect("now_ms");
            let result = verify_request(&headers, &body, key, now_ms);
            let got = line(&result);
            let want = case["expect"].as_str().expect("expect");
            if got != want {
                failures.push(format!("{name}: got {got:?}, want {want:?}"));
            }
            if let Ok(verified) = &result {
                let id_header = match verified.scheme {
                    Scheme::Platform => "x-webhook-id",
                    Scheme::Standard => "webhook-id",
                };
                let id = headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(id_header)).map(|(_, v)| *v);
                assert_eq!(verified.event_id.as_deref(), id, "{name}");
            }
        }
        assert!(failures.is_empty(), "{} of {} cases fail:\n{}", failures.len(), cases.len(), failures.join("\n"));
    }

    struct Published {
        key: String,
        header: String,
        body: Vec<u8>,
        t: i64,
    }

    fn published() -> Published {
        let vector = read_json("platform-signature.json");
        assert_eq!(vector["header_name"], "X-Webhook-Signature");
        Published {
            key: vector["public_key_pem"].as_str().expect("key").to_owned(),
            header: vector["header_value"].as_str().expect("header").to_owned(),
            body: vector["raw_body"].as_str().expect("body").as_bytes().to_vec(),
            t: vector["timestamp_ms"].as_i64().expect("t"),
        }
    }

    #[test]
    fn verify_the_published_example() {
        let p = published();
        let headers = [("X-Webhook-Signature", p.header.as_str())];
        let verified = verify_request(headers, &p.body, &p.key, p.t).expect("genuine");
        assert_eq!(verified, Verified { scheme: Scheme::Platform, event_id: None, timestamp_ms: p.t });

        let mut changed = p.body.clone();
        let at = changed.len() - 3; // the `!` of `Hello World!`
        changed[at] = b'?';
        let refused = verify_request(headers, &changed, &p.key, p.t).expect_err("body changed");
        assert_eq!(refused.refusal(), Some(Refusal::NoSignatureMatches));

        let window = i64::try_from(PLATFORM_WINDOW_MS).expect("fits");
        let key = ReceiverKey::parse(&p.key).expect("key");
        assert_eq!(key.scheme(), Scheme::Platform);
        assert!(key.verify(headers, &p.body, p.t + window).is_ok());
        assert_eq!(key.verify(headers, &p.body, p.t + window + 1), Err(Refusal::StaleTimestamp));
    }

    /// The signature covers SHA-256 of `<t>.<body>` (two passes of hashing): a
    /// check over the undigested string fails.
    #[test]
    fn verify_the_published_example_is_not_single_hash() {
        let p = published();
        let spki = pem::parse(&p.key).expect("pem");
        let key = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, spki.contents());
        let signature = STANDARD.decode(p.header.split_once(",v0=").expect("v0").1).expect("base64");
        let signed = [format!("{}.", p.t).as_bytes(), &p.body].concat();
        assert!(key.verify(&signed, &signature).is_err());
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &signed);
        assert!(key.verify(digest.as_ref(), &signature).is_ok());
    }

    #[test]
    fn verify_headers_from_maps_and_owned_pairs() {
        let p = published();
        let map: HashMap<String, String> = HashMap::from([
            ("x-webhook-signature".to_owned(), p.header.clone()),
            ("x-webhook-id".into(), "evt_1".into()),
        ]);
        let verified = verify_request(&map, &p.body, &p.key, p.t).expect("genuine");
        assert_eq!(verified.event_id.as_deref(), Some("evt_1"));
        let owned: Vec<(String, Vec<u8>)> = vec![("X-Webhook-Signature".into(), p.header.clone().into_bytes())];
        assert!(verify_request(owned, &p.body, &p.key, p.t).is_ok());

        // Twice under two spellings, or an id given twice: malformed.
        let twice = [("X-Webhook-Signature", p.header.as_str()), ("x-webhook-signature", p.header.as_str())];
        assert_eq!(verify_request(twice, &p.body, &p.key, p.t).unwrap_err().refusal(), Some(Refusal::MalformedHeader));
        let ids = [("X-Webhook-Signature", p.header.as_str()), ("X-Webhook-Id", "a"), ("x-webhook-id", "b")];
        assert_eq!(verify_request(ids, &p.body, &p.key, p.t).unwrap_err().refusal(), Some(Refusal::MalformedHeader));
        // A value that is not UTF-8: malformed.
        let bytes: [(&str, &[u8]); 1] = [("X-Webhook-Signature", b"t=1,v0=\xff")];
        assert_eq!(verify_request(bytes, &p.body, &p.key, p.t).unwrap_err().refusal(), Some(Refusal::MalformedHeader));
    }

    #[test]
    fn verify_refuses_unusable_keys() {
        let p = published();
        let headers = [("X-Webhook-Signature", p.header.as_str())];
        let ec_key = rcgen::KeyPair::generate().expect("ecdsa key").public_key_pem();
        let private = rcgen::KeyPair::generate().expect("ecdsa key").serialize_pem();
        let keys = ["not a key", "whpk_AAAA", "whpk_", &ec_key, &private, &format!("my key:\n{}", p.key)];
        for key in keys {
            let error = verify_request(headers, &p.body, key, p.t).expect_err(key);
            assert!(matches!(error, VerifyRequestError::UnusableKey(_)), "{key}: {error:?}");
            assert_eq!(error.refusal(), None);
        }
        // Surrounding whitespace is ignored.
        assert!(verify_request(headers, &p.body, &format!("\n  {}\n\n", p.key), p.t).is_ok());
    }

    #[test]
    fn verify_refusal_texts_are_the_kits() {
        let all = [
            Refusal::NoSignatureHeader,
            Refusal::MalformedHeader,
            Refusal::NoSignatureMatches,
            Refusal::StaleTimestamp,
        ];
        let texts: Vec<String> = all.iter().map(ToString::to_string).collect();
        assert_eq!(texts, ["no signature header", "malformed header", "no signature matches", "stale timestamp"]);
        assert!(all.iter().all(|r| r.as_str() == r.to_string()));
        assert_eq!(VerifyRequestError::from(Refusal::StaleTimestamp).to_string(), "stale timestamp");
    }

    #[test]
    fn verify_base64_is_as_strict_as_the_kits() {
        assert_eq!(decode_base64("AAEC"), Some(vec![0, 1, 2]));
        assert_eq!(decode_base64("AAE"), Some(vec![0, 1]));
        assert_eq!(decode_base64("AAE="), Some(vec![0, 1]));
        assert_eq!(decode_base64("AAE=="), Some(vec![0, 1]));
        for bad in ["", "=", "A", "AAAAA", "AAE===", "AA-_", "AA E", "!!not*base64!!", "AA=A"] {
            assert_eq!(decode_base64(bad), None, "{bad:?}");
        }
        assert!(is_digits("0") && is_digits("123456789012345"));
        assert!(!is_digits("") && !is_digits("1234567890123456") && !is_digits("-5") && !is_digits("+5"));
    }
}
