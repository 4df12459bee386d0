//! The `standard` signature scheme (API.md §8.4): Standard Webhooks with
//! asymmetric keys. Each delivery carries
//!
//! - `webhook-id`: the event id (the receiver's idempotency key);
//! - `webhook-timestamp`: unix seconds;
//! - `webhook-signature`: `v1a,<base64 Ed25519 signature>`, one entry per
//!   signing key separated by spaces, newest first,
//!
//! where each signature covers `<webhook-id>.<webhook-timestamp>.<raw body>`.
//! The endpoint's public key is `whpk_` and the base64 of its 32 bytes.

use std::fmt;

use aws_lc_rs::signature::{ED25519, Ed25519KeyPair, UnparsedPublicKey};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::{KeyError, STANDARD_PUBLIC_KEY_PREFIX};

/// The header names of the scheme, lower-case as the specification writes them.
pub const ID_HEADER: &str = "webhook-id";
/// Unix seconds of the attempt.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The space-separated `v1a,<base64>` entries.
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// How far `webhook-timestamp` may be from the receiver's clock, either way
/// (the specification's tolerance).
pub const TOLERANCE_SECONDS: i64 = 5 * 60;

/// Signs deliveries with one `standard` endpoint key.
pub struct StandardSigner {
    key_pair: Ed25519KeyPair,
}

impl fmt::Debug for StandardSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandardSigner").finish_non_exhaustive()
    }
}

impl StandardSigner {
    /// Loads a private key as stored (PKCS#8 DER, after opening).
    pub fn from_pkcs8_der(der: &[u8]) -> Result<StandardSigner, KeyError> {
        Ok(StandardSigner { key_pair: Ed25519KeyPair::from_pkcs8(der).map_err(KeyError::InvalidEd25519Key)? })
    }
}

/// The `webhook-signature` value for one attempt: one `v1a` entry per signer,
/// in the order given (newest first).
pub fn sign_all(signers: &[&StandardSigner], id: &str, timestamp_seconds: i64, body: &[u8]) -> String {
    let mut content = Vec::with_capacity(id.len() + 24 + body.len());
    content.extend_from_slice(id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp_seconds.to_string().as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    let mut header = String::with_capacity(92 * signers.len());
    for signer in signers {
        if !header.is_empty() {
            header.push(' ');
        }
        header.push_str("v1a,");
        STANDARD.encode_string(signer.key_pair.sign(&content).as_ref(), &mut header);
    }
    header
}

/// Why a `standard` delivery was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum StandardError {
    /// The public key is not `whpk_` and the base64 of 32 bytes.
    #[error("the key is not whpk_ and the base64 of a 32-byte Ed25519 key")]
    BadKey,
    /// `webhook-timestamp` is not whole seconds.
    #[error("webhook-timestamp is not an integer")]
    BadTimestamp,
    /// No `v1a` entry verifies.
    #[error("no signature matches the body, id and timestamp")]
    Mismatch,
    /// Genuine, but signed more than five minutes from now.
    #[error("webhook-timestamp {timestamp} is more than 5 minutes from now ({now})")]
    Expired {
        /// The signed timestamp, seconds.
        timestamp: i64,
        /// The receiver's clock, seconds.
        now: i64,
    },
}

/// Checks a `standard` delivery as a receiver does: any `v1a` entry that
/// verifies under `public_key` (`whpk_…`) is enough; with `now_seconds`, a
/// timestamp more than [`TOLERANCE_SECONDS`] away is refused.
pub fn verify(
    public_key: &str,
    id: &str,
    timestamp: &str,
    signature_header: &str,
    body: &[u8],
    now_seconds: Option<i64>,
) -> Result<i64, StandardError> {
    let raw = public_key
        .trim()
        .strip_prefix(STANDARD_PUBLIC_KEY_PREFIX)
        .and_then(|b64| STANDARD.decode(b64).ok())
        .filter(|raw| raw.len() == 32)
        .ok_or(StandardError::BadKey)?;
    let seconds: i64 = timestamp.trim().parse().map_err(|_| StandardError::BadTimestamp)?;
    let key = UnparsedPublicKey::new(&ED25519, raw);
    let content = [id.as_bytes(), b".", timestamp.trim().as_bytes(), b".", body].concat();
    let genuine = signature_header
        .split_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1a,"))
        .filter_map(|b64| STANDARD.decode(b64).ok())
        .any(|signature| key.verify(&content, &signature).is_ok());
    if !genuine {
        return Err(StandardError::Mismatch);
    }
    if let Some(now) = now_seconds
        && (now - seconds).abs() > TOLERANCE_SECONDS
    {
        return Err(StandardError::Expired { timestamp: seconds, now });
    }
    Ok(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate_ed25519;

    fn pair() -> (StandardSigner, String) {
        let generated = generate_ed25519().unwrap();
        (StandardSigner::from_pkcs8_der(&generated.private_pkcs8_der).unwrap(), generated.public_key_pem)
    }

    #[test]
    fn each_key_verifies_its_entry_of_a_two_key_header() {
        let (new, new_public) = pair();
        let (old, old_public) = pair();
        let header = sign_all(&[&new, &old], "wh_1", 1_700_000_000, b"{}");
        assert_eq!(header.split(' ').count(), 2);
        assert!(header.split(' ').all(|entry| entry.starts_with("v1a,")));
        for key in [&new_public, &old_public] {
            assert_eq!(verify(key, "wh_1", "1700000000", &header, b"{}", Some(1_700_000_100)), Ok(1_700_000_000));
        }
        let (_, stranger) = pair();
        assert_eq!(verify(&stranger, "wh_1", "1700000000", &header, b"{}", None), Err(StandardError::Mismatch));
    }

    #[test]
    fn the_id_the_timestamp_and_the_body_are_all_signed() {
        let (signer, public) = pair();
        let header = sign_all(&[&signer], "wh_1", 1_700_000_000, b"{}");
        assert!(verify(&public, "wh_2", "1700000000", &header, b"{}", None).is_err());
        assert!(verify(&public, "wh_1", "1700000001", &header, b"{}", None).is_err());
        assert!(verify(&public, "wh_1", "1700000000", &header, b"{ }", None).is_err());
    }

    #[test]
    fn stale_timestamps_and_bad_keys_are_refused() {
        let (signer, public) = pair();
        let header = sign_all(&[&signer], "wh_1", 1_700_000_000, b"{}");
        assert_eq!(
            verify(&public, "wh_1", "1700000000", &header, b"{}", Some(1_700_000_301)),
            Err(StandardError::Expired { timestamp: 1_700_000_000, now: 1_700_000_301 })
        );
        assert_eq!(verify("whpk_AAAA", "wh_1", "1700000000", &header, b"{}", None), Err(StandardError::BadKey));
        assert!(public.starts_with("whpk_"));
    }
}
