//! The delivery signature (API.md §6): signing each attempt in the dispatcher and
//! verifying it the way a receiver of the original platform does.
//!
//! `X-Webhook-Signature: t=<unix ms>,v0=<base64 signature>`, where the signature is
//! RSA PKCS#1 v1.5 with SHA-256 over the 32-byte SHA-256 digest of `<t>.<raw body>`.
//! The digest is signed as the message, so it is hashed a second time inside the
//! signature scheme; receivers written for the original platform check exactly
//! that, and a single-pass check does not match.

use std::fmt::{self, Write as _};

use aws_lc_rs::digest;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{RSA_PKCS1_2048_8192_SHA256, RSA_PKCS1_SHA256, RsaKeyPair, UnparsedPublicKey};
use base64::Engine as _;
use base64::alphabet;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use crate::KeyError;

/// Name of the header that carries the signature of a delivery.
pub const SIGNATURE_HEADER: &str = "X-Webhook-Signature";

/// How far a signed `t` may be from the receiver's clock, in either direction,
/// before [`Verifier::verify`] refuses it as a possible replay.
pub const REPLAY_WINDOW_MS: u64 = 10 * 60 * 1000;

/// Largest signature produced here: RSA signing keys are at most 4096 bits.
const MAX_SIGNATURE_LEN: usize = 4096 / 8;
/// Room for `t=`, an `i64` in decimal and `,v0=`.
const HEADER_OVERHEAD: usize = "t=".len() + "-9223372036854775808".len() + ",v0=".len();

/// Signature entries are decoded leniently about padding: the RSA check decides.
const BASE64_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a signature header was refused.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The header is structurally wrong (empty, an entry without `=`, two `t`s, an
    /// empty `v0`).
    #[error("malformed signature header: {0}")]
    Malformed(&'static str),
    /// No `t=` entry.
    #[error("signature header has no t= entry")]
    MissingTimestamp,
    /// `t` is not a whole number of milliseconds.
    #[error("signature header t= is not an integer")]
    InvalidTimestamp(#[source] std::num::ParseIntError),
    /// No `v0=` entry.
    #[error("signature header has no v0= entry")]
    MissingSignature,
    /// A `v0` entry is not standard base64.
    #[error("signature header v0= is not base64")]
    InvalidBase64(#[source] base64::DecodeError),
    /// No `v0` signature matches this body and `t` under the endpoint's key.
    #[error("no signature matches the body and timestamp")]
    Mismatch,
    /// The signature is genuine but `t` is outside the replay window.
    #[error("signature timestamp {timestamp_ms} is more than 10 minutes from now ({now_ms})")]
    Expired {
        /// The signed `t`.
        timestamp_ms: i64,
        /// The receiver's clock.
        now_ms: i64,
    },
}

/// A signature header split into its parts, for receivers that want to inspect it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSignature {
    /// The signed `t`, unix milliseconds.
    pub timestamp_ms: i64,
    /// Every `v0` signature, decoded; one matching is enough (several allow key
    /// rotation).
    pub signatures: Vec<Vec<u8>>,
}

/// Signs deliveries with one endpoint's private key.
///
/// Load it once per endpoint and reuse it: signing then costs the RSA operation,
/// two SHA-256 passes and the one output string.
pub struct Signer {
    key_pair: RsaKeyPair,
    rng: SystemRandom,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signer")
            .field("modulus_bits", &(self.key_pair.public_modulus_len() * 8))
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// Loads an endpoint's private key as stored (after `webhooks_keys::KeyCipher::open`).
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Signer, KeyError> {
        let key_pair = RsaKeyPair::from_pkcs8(der).map_err(KeyError::InvalidPrivateKey)?;
        let modulus_len = key_pair.public_modulus_len();
        if modulus_len > MAX_SIGNATURE_LEN {
            // Such keys are refused; the signature buffer relies on it.
            return Err(KeyError::UnsupportedKeySize { bits: modulus_len * 8 });
        }
        Ok(Signer { key_pair, rng: SystemRandom::new() })
    }

    /// Signs one delivery attempt and returns the whole `X-Webhook-Signature` value.
    ///
    /// # Panics
    ///
    /// Only if the operating system's random generator fails (aws-lc blinds the RSA
    /// operation with random values); there is no way to sign without it.
    pub fn sign(&self, timestamp_ms: i64, body: &[u8]) -> String {
        let signature_len = self.key_pair.public_modulus_len();
        let mut header = String::with_capacity(header_len(signature_len));
        push_timestamp(&mut header, timestamp_ms);
        let digest = pre_digest(&header["t=".len()..], body);
        let mut buffer = [0u8; MAX_SIGNATURE_LEN];
        let signature = &mut buffer[..signature_len];
        self.key_pair
            .sign(&RSA_PKCS1_SHA256, &self.rng, digest.as_ref(), signature)
            .expect("RSA signing fails only when the system random generator does");
        push_signature(&mut header, signature);
        header
    }
}

/// Signs one delivery attempt with several keys at once (a rotation's
/// overlap): one `t`, then one `v0` per signer in the order given, newest
/// first. The same as [`Signer::sign`] for one signer.
///
/// # Panics
///
/// As [`Signer::sign`].
pub fn sign_all(signers: &[&Signer], timestamp_ms: i64, body: &[u8]) -> String {
    let longest = signers.iter().map(|s| s.key_pair.public_modulus_len()).max().unwrap_or(0);
    let mut header = String::with_capacity(header_len(longest) * signers.len().max(1));
    push_timestamp(&mut header, timestamp_ms);
    let digest = pre_digest(&header["t=".len()..], body);
    let mut buffer = [0u8; MAX_SIGNATURE_LEN];
    for signer in signers {
        let signature = &mut buffer[..signer.key_pair.public_modulus_len()];
        signer
            .key_pair
            .sign(&RSA_PKCS1_SHA256, &signer.rng, digest.as_ref(), signature)
            .expect("RSA signing fails only when the system random generator does");
        push_signature(&mut header, signature);
    }
    header
}

/// Formats a signature header from its parts, for tools and tests that sign
/// elsewhere; [`Signer::sign`] produces the same format.
pub fn header_value(timestamp_ms: i64, signature: &[u8]) -> String {
    let mut header = String::with_capacity(header_len(signature.len()));
    push_timestamp(&mut header, timestamp_ms);
    push_signature(&mut header, signature);
    header
}

/// Splits a signature header into `t` and its `v0` signatures.
///
/// Tolerant the way receivers need to be: spaces around entries, several `v0`
/// entries and unknown keys (future schemes) are accepted.
pub fn parse_header(value: &str) -> Result<ParsedSignature, VerifyError> {
    let (timestamp_ms, _, signatures) = split_header(value)?;
    Ok(ParsedSignature { timestamp_ms, signatures })
}

/// Checks delivery signatures against an endpoint's public key, as a receiver does.
///
/// Test receivers use it, and it is the reference for receivers' documentation.
#[derive(Clone)]
pub struct Verifier {
    key: UnparsedPublicKey<Vec<u8>>,
    modulus_bits: usize,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier").field("modulus_bits", &self.modulus_bits).finish_non_exhaustive()
    }
}

impl Verifier {
    /// Loads the endpoint's `public_key` as the API returns it
    /// (`-----BEGIN PUBLIC KEY-----`, SubjectPublicKeyInfo); a PKCS#1
    /// `-----BEGIN RSA PUBLIC KEY-----` is accepted too.
    pub fn from_pem(pem: &str) -> Result<Verifier, KeyError> {
        let parsed = pem::parse(pem).map_err(KeyError::PublicKeyPem)?;
        let rsa_public_key = match parsed.tag() {
            "PUBLIC KEY" => der::rsa_public_key_from_spki(parsed.contents())?,
            "RSA PUBLIC KEY" => parsed.contents(),
            _ => return Err(KeyError::InvalidPublicKey("PEM label is not PUBLIC KEY")),
        };
        let modulus_bits = der::rsa_modulus_bits(rsa_public_key)?;
        if !(2048..=8192).contains(&modulus_bits) {
            return Err(KeyError::UnsupportedKeySize { bits: modulus_bits });
        }
        Ok(Verifier { key: UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, rsa_public_key.to_vec()), modulus_bits })
    }

    /// Verifies a header value against the raw body and returns the signed `t`.
    ///
    /// With `now_ms`, a genuine signature whose `t` is more than
    /// [`REPLAY_WINDOW_MS`] away from it is refused as [`VerifyError::Expired`];
    /// `None` skips that check (published examples, replayed logs).
    pub fn verify(&self, header_value: &str, body: &[u8], now_ms: Option<i64>) -> Result<i64, VerifyError> {
        let (timestamp_ms, timestamp_text, signatures) = split_header(header_value)?;
        // The digest covers `t` exactly as sent, as the original platform's receivers do.
        let digest = pre_digest(timestamp_text, body);
        let genuine = signatures.iter().any(|signature| self.key.verify(digest.as_ref(), signature).is_ok());
        if !genuine {
            return Err(VerifyError::Mismatch);
        }
        if let Some(now_ms) = now_ms
            && now_ms.abs_diff(timestamp_ms) > REPLAY_WINDOW_MS
        {
            return Err(VerifyError::Expired { timestamp_ms, now_ms });
        }
        Ok(timestamp_ms)
    }
}

/// The first pass: SHA-256 of `<t>.<body>`, which is then signed as the message.
fn pre_digest(timestamp_text: &str, body: &[u8]) -> digest::Digest {
    let mut context = digest::Context::new(&digest::SHA256);
    context.update(timestamp_text.as_bytes());
    context.update(b".");
    context.update(body);
    context.finish()
}

fn header_len(signature_len: usize) -> usize {
    HEADER_OVERHEAD + base64::encoded_len(signature_len, true).unwrap_or(0)
}

fn push_timestamp(header: &mut String, timestamp_ms: i64) {
    header.push_str("t=");
    // Writing to a String cannot fail.
    let _ = write!(header, "{timestamp_ms}");
}

fn push_signature(header: &mut String, signature: &[u8]) {
    header.push_str(",v0=");
    STANDARD.encode_string(signature, header);
}

/// Parses a header into `t`, the text `t` was written as, and the decoded `v0`s.
fn split_header(value: &str) -> Result<(i64, &str, Vec<Vec<u8>>), VerifyError> {
    if value.trim().is_empty() {
        return Err(VerifyError::Malformed("empty header"));
    }
    let mut timestamp: Option<(i64, &str)> = None;
    let mut signatures = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, text) = entry.split_once('=').ok_or(VerifyError::Malformed("entry without '='"))?;
        let text = text.trim();
        match key.trim() {
            "t" => {
                if timestamp.is_some() {
                    return Err(VerifyError::Malformed("more than one t= entry"));
                }
                let parsed = text.parse().map_err(VerifyError::InvalidTimestamp)?;
                timestamp = Some((parsed, text));
            }
            "v0" => {
                if text.is_empty() {
                    return Err(VerifyError::Malformed("empty v0= entry"));
                }
                let signature = BASE64_ANY_PADDING.decode(text).map_err(VerifyError::InvalidBase64)?;
                signatures.push(signature);
            }
            _ => {}
        }
    }
    let (timestamp_ms, timestamp_text) = timestamp.ok_or(VerifyError::MissingTimestamp)?;
    if signatures.is_empty() {
        return Err(VerifyError::MissingSignature);
    }
    Ok((timestamp_ms, timestamp_text, signatures))
}

/// Just enough DER to take the RSA key out of a SubjectPublicKeyInfo; aws-lc checks
/// the key itself.
mod der {
    use crate::KeyError;

    const SEQUENCE: u8 = 0x30;
    const INTEGER: u8 = 0x02;
    const BIT_STRING: u8 = 0x03;
    const NULL: u8 = 0x05;
    const OBJECT_IDENTIFIER: u8 = 0x06;
    /// 1.2.840.113549.1.1.1
    const RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];

    fn bad(reason: &'static str) -> KeyError {
        KeyError::InvalidPublicKey(reason)
    }

    /// Reads one element with the expected tag; returns its contents and the rest.
    fn read(input: &[u8], tag: u8) -> Result<(&[u8], &[u8]), KeyError> {
        let (&found, rest) = input.split_first().ok_or(bad("truncated DER"))?;
        if found != tag {
            return Err(bad("unexpected DER element"));
        }
        let (&first, mut rest) = rest.split_first().ok_or(bad("truncated DER"))?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 || rest.len() < count {
                return Err(bad("unsupported DER length"));
            }
            let (bytes, after) = rest.split_at(count);
            rest = after;
            bytes.iter().fold(0usize, |len, &b| (len << 8) | usize::from(b))
        };
        if rest.len() < len {
            return Err(bad("truncated DER"));
        }
        Ok(rest.split_at(len))
    }

    /// Returns the RSAPublicKey DER inside an rsaEncryption SubjectPublicKeyInfo.
    pub(super) fn rsa_public_key_from_spki(spki: &[u8]) -> Result<&[u8], KeyError> {
        let (info, trailing) = read(spki, SEQUENCE)?;
        if !trailing.is_empty() {
            return Err(bad("trailing data after SubjectPublicKeyInfo"));
        }
        let (algorithm, rest) = read(info, SEQUENCE)?;
        let (oid, params) = read(algorithm, OBJECT_IDENTIFIER)?;
        if oid != RSA_ENCRYPTION {
            return Err(bad("not an RSA key"));
        }
        if !(params.is_empty() || params == [NULL, 0x00]) {
            return Err(bad("unexpected rsaEncryption parameters"));
        }
        let (bits, trailing) = read(rest, BIT_STRING)?;
        if !trailing.is_empty() {
            return Err(bad("trailing data after the public key"));
        }
        match bits.split_first() {
            Some((0, key)) => Ok(key),
            _ => Err(bad("public key bit string has unused bits")),
        }
    }

    /// Size of the modulus of an RSAPublicKey, in bits.
    pub(super) fn rsa_modulus_bits(rsa_public_key: &[u8]) -> Result<usize, KeyError> {
        let (key, trailing) = read(rsa_public_key, SEQUENCE)?;
        if !trailing.is_empty() {
            return Err(bad("trailing data after RSAPublicKey"));
        }
        let (modulus, _exponent) = read(key, INTEGER)?;
        let modulus = match modulus.split_first() {
            Some((0, rest)) => rest,
            _ => modulus,
        };
        let Some(&top) = modulus.first() else {
            return Err(bad("empty RSA modulus"));
        };
        let top_bits = usize::try_from(u8::BITS - top.leading_zeros()).unwrap_or(8);
        Ok((modulus.len() - 1) * 8 + top_bits)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use super::*;
    use crate::{GeneratedKeyPair, generate_rsa_2048};

    /// `kits/vectors/platform-signature.json`, from the original platform's docs.
    const VECTOR_PUBLIC_KEY_PEM: &str = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAtqsEE4eI7EmzhcquGJXt
LX9PMK0UH6Kl1WIR21sv8HtueG8BuvvpP3MiN7ltzmIhS8KaynCjN4l+620PnXeu
xWG+CSnEdkinL9hCqbEid5vv9zl0j9LWiJx3FkKHqADU7cgm46aa8dKUdIQYF2X+
O7WmyLkC4wUM/mWhBPMsIQBznashRMZxx7XJjsVp27ACUE4eNIjEXbVYN6U8jSbU
hG++CfL8xXu+GHDqKmFE6Po6HnuURvLFVnCtE3mXXBcVFlPy+octfx8nOMLT3X8O
9UehIigJ34o2yMm/Fq3HUJzg2BsiAiGgtr0vmeoV9Q7upSNj9TuOumAzZFi4pYA+
qwIDAQAB
-----END PUBLIC KEY-----
";
    const VECTOR_HEADER: &str = "t=1705854411204,v0=jz/0dmHJ63FAzacGutrDTEoq+iSz/PHm/ugdooXDQu5NwuVIT2LmZGjsnCsBHgR9Py6OBP9zurzW4dHgygU4EDqmMPTUOvhvndYb4lWt+TY66LihaFI2whL6DAf/jb1QjYjNU0A6x9SLzC45dgE6X7zTDUM+2Z+scG/WEQf6SxQMt4E2sEipl5PqMK5lYUe3otdJV+X2c9D64bGwCEE7QSia+Vhozg8QNOQEk/rdz2IEONIg6oC43CeiN4E2kF9XLAGuy9uAHx9O9OJH5ZPLJZjyo4VcXYeWQgxaQ1gZ1Qu6hEEzgiPSff/1nou58dm4bIIazgCWli/mO0NyGcpfFw==";
    const VECTOR_BODY: &[u8] = br#"{"message":"Hello World!"}"#;
    const VECTOR_T: i64 = 1_705_854_411_204;

    const NOW: i64 = 1_763_719_445_123;
    const BODY: &[u8] = br#"{"api_version":"v0","event_id":"wh_0123"}"#;

    fn vector_verifier() -> Verifier {
        Verifier::from_pem(VECTOR_PUBLIC_KEY_PEM).expect("vector key loads")
    }

    /// One key for the whole module: RSA generation is slow on a busy machine.
    fn test_key() -> &'static (GeneratedKeyPair, Signer, Verifier) {
        static KEY: OnceLock<(GeneratedKeyPair, Signer, Verifier)> = OnceLock::new();
        KEY.get_or_init(|| {
            let pair = generate_rsa_2048().expect("generate");
            let signer = Signer::from_pkcs8_der(&pair.private_pkcs8_der).expect("signer");
            let verifier = Verifier::from_pem(&pair.public_key_pem).expect("verifier");
            (pair, signer, verifier)
        })
    }

    #[test]
    fn published_vector_verifies() {
        let t = vector_verifier().verify(VECTOR_HEADER, VECTOR_BODY, None).expect("vector verifies");
        assert_eq!(t, VECTOR_T);
    }

    #[test]
    fn published_vector_is_two_pass_not_one_pass() {
        let verifier = vector_verifier();
        let parsed = parse_header(VECTOR_HEADER).expect("parses");
        let [signature] = parsed.signatures.as_slice() else {
            panic!("one signature expected");
        };
        let signed_string = [b"1705854411204.".as_slice(), VECTOR_BODY].concat();
        assert!(verifier.key.verify(&signed_string, signature).is_err());
        let digest = digest::digest(&digest::SHA256, &signed_string);
        assert!(verifier.key.verify(digest.as_ref(), signature).is_ok());
    }

    #[test]
    fn published_vector_refuses_tampering() {
        let verifier = vector_verifier();
        let body = br#"{"message":"Hello World?"}"#;
        assert!(matches!(verifier.verify(VECTOR_HEADER, body, None), Err(VerifyError::Mismatch)));
        let later = VECTOR_HEADER.replace("t=1705854411204", "t=1705854411205");
        assert!(matches!(verifier.verify(&later, VECTOR_BODY, None), Err(VerifyError::Mismatch)));
        // Same number, different text: the digest covers t as written.
        let padded = VECTOR_HEADER.replace("t=1705854411204", "t=01705854411204");
        assert!(matches!(verifier.verify(&padded, VECTOR_BODY, None), Err(VerifyError::Mismatch)));
    }

    #[test]
    fn published_vector_is_expired_now() {
        assert!(matches!(
            vector_verifier().verify(VECTOR_HEADER, VECTOR_BODY, Some(NOW)),
            Err(VerifyError::Expired { timestamp_ms: VECTOR_T, now_ms: NOW })
        ));
    }

    #[test]
    fn sign_then_verify_with_a_generated_key() {
        let (_, signer, verifier) = test_key();
        let header = signer.sign(NOW, BODY);
        let expected_prefix = format!("t={NOW},v0=");
        assert!(header.starts_with(&expected_prefix), "{header}");
        let parsed = parse_header(&header).expect("parses");
        assert_eq!(parsed.timestamp_ms, NOW);
        assert_eq!(parsed.signatures.len(), 1);
        assert_eq!(parsed.signatures[0].len(), 256);
        assert_eq!(header, header_value(NOW, &parsed.signatures[0]));
        assert_eq!(verifier.verify(&header, BODY, Some(NOW)).expect("verifies"), NOW);
        assert_eq!(verifier.verify(&header, BODY, None).expect("verifies"), NOW);

        assert!(matches!(verifier.verify(&header, b"{}", None), Err(VerifyError::Mismatch)));
        let other_t = header.replace(&format!("t={NOW}"), &format!("t={}", NOW + 1));
        assert!(matches!(verifier.verify(&other_t, BODY, None), Err(VerifyError::Mismatch)));
        assert!(matches!(vector_verifier().verify(&header, BODY, None), Err(VerifyError::Mismatch)));
    }

    #[test]
    fn generated_signature_is_two_pass() {
        let (_, signer, verifier) = test_key();
        let header = signer.sign(NOW, BODY);
        let signature = &parse_header(&header).expect("parses").signatures[0];
        let signed_string = [format!("{NOW}.").as_bytes(), BODY].concat();
        assert!(verifier.key.verify(&signed_string, signature).is_err());
    }

    #[test]
    fn replay_window_is_ten_minutes_each_way() {
        let (_, signer, verifier) = test_key();
        let window = i64::try_from(REPLAY_WINDOW_MS).expect("fits");
        for t in [NOW - window, NOW + window, NOW] {
            let header = signer.sign(t, BODY);
            assert_eq!(verifier.verify(&header, BODY, Some(NOW)).expect("in window"), t);
        }
        for t in [NOW - window - 1, NOW + window + 1, 0] {
            let header = signer.sign(t, BODY);
            assert!(matches!(
                verifier.verify(&header, BODY, Some(NOW)),
                Err(VerifyError::Expired { timestamp_ms, now_ms: NOW }) if timestamp_ms == t
            ));
            assert_eq!(verifier.verify(&header, BODY, None).expect("no window"), t);
        }
        let header = signer.sign(i64::MIN, BODY);
        assert!(matches!(verifier.verify(&header, BODY, Some(i64::MAX)), Err(VerifyError::Expired { .. })));
    }

    #[test]
    fn any_matching_v0_is_enough() {
        let (_, signer, verifier) = test_key();
        let header = signer.sign(NOW, BODY);
        let signature = header.split_once(",v0=").expect("v0").1;
        let bogus = STANDARD.encode([7u8; 256]);
        let rotated = format!("t={NOW}, v0={bogus}, v1=future-scheme, v0={signature}");
        assert_eq!(verifier.verify(&rotated, BODY, Some(NOW)).expect("verifies"), NOW);
        let only_bogus = format!("t={NOW},v0={bogus}");
        assert!(matches!(verifier.verify(&only_bogus, BODY, None), Err(VerifyError::Mismatch)));
    }

    #[test]
    fn parse_header_is_tolerant() {
        let parsed = parse_header(" t=42, v0=AAEC ,  x=whatever,v0=AwQ, v1=zzz ").expect("parses");
        assert_eq!(parsed, ParsedSignature { timestamp_ms: 42, signatures: vec![vec![0, 1, 2], vec![3, 4]] });
        let reordered = parse_header("v0=AAEC,t=42").expect("parses");
        assert_eq!(reordered.timestamp_ms, 42);
    }

    #[test]
    fn malformed_headers_are_errors() {
        type Expected = fn(&VerifyError) -> bool;
        let cases: [(&str, Expected); 12] = [
            ("", |e| matches!(e, VerifyError::Malformed(_))),
            ("   ", |e| matches!(e, VerifyError::Malformed(_))),
            ("v0=AAEC", |e| matches!(e, VerifyError::MissingTimestamp)),
            ("t=42", |e| matches!(e, VerifyError::MissingSignature)),
            ("t=42,v1=AAEC", |e| matches!(e, VerifyError::MissingSignature)),
            ("t=,v0=AAEC", |e| matches!(e, VerifyError::InvalidTimestamp(_))),
            ("t=4x2,v0=AAEC", |e| matches!(e, VerifyError::InvalidTimestamp(_))),
            ("t=99999999999999999999,v0=AAEC", |e| matches!(e, VerifyError::InvalidTimestamp(_))),
            ("t=42,v0=!!!", |e| matches!(e, VerifyError::InvalidBase64(_))),
            ("t=42,v0=", |e| matches!(e, VerifyError::Malformed(_))),
            ("t=42,t=43,v0=AAEC", |e| matches!(e, VerifyError::Malformed(_))),
            ("t=42,garbage,v0=AAEC", |e| matches!(e, VerifyError::Malformed(_))),
        ];
        let verifier = vector_verifier();
        for (header, expected) in cases {
            let err = parse_header(header).expect_err(header);
            assert!(expected(&err), "{header:?}: {err:?}");
            let err = verifier.verify(header, BODY, Some(NOW)).expect_err(header);
            assert!(expected(&err), "{header:?}: {err:?}");
        }
        assert!(matches!(verifier.verify("t=42,v0=AAEC", BODY, None), Err(VerifyError::Mismatch)));
    }

    #[test]
    fn public_keys_are_checked_when_loaded() {
        let ec_key = rcgen::KeyPair::generate().expect("ecdsa key").public_key_pem();
        let not_pem = "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAtqsEE4eI7EmzhcquGJXt";
        let cert_label = VECTOR_PUBLIC_KEY_PEM.replace("PUBLIC KEY", "CERTIFICATE");
        let truncated = pem::encode(&pem::Pem::new(
            "PUBLIC KEY",
            &pem::parse(VECTOR_PUBLIC_KEY_PEM).expect("pem").contents()[..100],
        ));
        assert!(matches!(Verifier::from_pem(not_pem), Err(KeyError::PublicKeyPem(_))));
        for pem in [&ec_key, &cert_label, &truncated] {
            assert!(matches!(Verifier::from_pem(pem), Err(KeyError::InvalidPublicKey(_))), "{pem}");
        }
    }

    #[test]
    fn pkcs1_public_key_pem_is_accepted() {
        let spki = pem::parse(VECTOR_PUBLIC_KEY_PEM).expect("pem");
        let rsa = der::rsa_public_key_from_spki(spki.contents()).expect("rsa key");
        let pkcs1 = pem::encode(&pem::Pem::new("RSA PUBLIC KEY", rsa));
        let verifier = Verifier::from_pem(&pkcs1).expect("pkcs1 loads");
        assert_eq!(verifier.verify(VECTOR_HEADER, VECTOR_BODY, None).expect("ok"), VECTOR_T);
    }

    #[test]
    fn bad_private_keys_are_refused() {
        assert!(matches!(Signer::from_pkcs8_der(b"not a key"), Err(KeyError::InvalidPrivateKey(_))));
        let ec = rcgen::KeyPair::generate().expect("ecdsa key").serialize_der();
        assert!(matches!(Signer::from_pkcs8_der(&ec), Err(KeyError::InvalidPrivateKey(_))));
    }

    #[test]
    fn debug_output_shows_no_key_material() {
        let (pair, signer, verifier) = test_key();
        assert_eq!(format!("{signer:?}"), "Signer { modulus_bits: 2048, .. }");
        assert_eq!(format!("{verifier:?}"), "Verifier { modulus_bits: 2048, .. }");
        assert!(!format!("{pair:?}").contains(&format!("{:?}", pair.private_pkcs8_der)));
    }

    #[test]
    fn header_value_format() {
        assert_eq!(header_value(1, &[0xfb, 0xff]), "t=1,v0=+/8=");
        assert_eq!(header_value(-5, &[]), "t=-5,v0=");
    }
}
