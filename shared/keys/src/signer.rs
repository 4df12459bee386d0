//! Everything that signs one endpoint's deliveries: its current key and,
//! during a rotation's overlap (API.md §8.2), the key it replaced, in either
//! scheme (§6, §8.4). Each attempt carries the headers of every scheme that
//! has a live key, newest key first, so a receiver holding either public key
//! verifies it.

use chrono::{DateTime, Utc};

use webhooks_model::SignatureScheme;
use webhooks_signature::{
    platform::{self as signing, SIGNATURE_HEADER, Signer},
    standard::{self, StandardSigner},
};

use crate::KeyError;

/// One loaded private key.
#[derive(Debug)]
pub enum KeySigner {
    Platform(Signer),
    Standard(StandardSigner),
}

impl KeySigner {
    /// Loads a stored (opened) private key of `scheme`.
    pub fn load(scheme: SignatureScheme, der: &[u8]) -> Result<KeySigner, KeyError> {
        Ok(match scheme {
            SignatureScheme::Platform => KeySigner::Platform(Signer::from_pkcs8_der(der)?),
            SignatureScheme::Standard => KeySigner::Standard(StandardSigner::from_pkcs8_der(der)?),
        })
    }
}

/// An endpoint's signing keys.
#[derive(Debug)]
pub struct EndpointSigner {
    current: KeySigner,
    /// The replaced key and when it stops signing.
    previous: Option<(KeySigner, DateTime<Utc>)>,
}

impl EndpointSigner {
    /// The keys of an endpoint: its current one, and the previous one while it
    /// overlaps.
    pub fn new(current: KeySigner, previous: Option<(KeySigner, DateTime<Utc>)>) -> EndpointSigner {
        EndpointSigner { current, previous }
    }

    /// The signature headers of one attempt at `now`: `X-Webhook-Signature`
    /// if a `platform` key signs, the three `webhook-*` headers if a
    /// `standard` one does; within a header, the newest key first. The
    /// previous key signs only until it expires.
    pub fn headers(&self, event_id: &str, now: DateTime<Utc>, body: &[u8]) -> Vec<(&'static str, String)> {
        let previous = self.previous.as_ref().filter(|(_, expires_at)| now < *expires_at).map(|(key, _)| key);
        let keys = std::iter::once(&self.current).chain(previous);
        let mut platform = Vec::new();
        let mut standard = Vec::new();
        for key in keys {
            match key {
                KeySigner::Platform(signer) => platform.push(signer),
                KeySigner::Standard(signer) => standard.push(signer),
            }
        }
        let mut headers = Vec::with_capacity(4);
        if !platform.is_empty() {
            headers.push((SIGNATURE_HEADER, signing::sign_all(&platform, now.timestamp_millis(), body)));
        }
        if !standard.is_empty() {
            let seconds = now.timestamp();
            headers.push((standard::ID_HEADER, event_id.to_owned()));
            headers.push((standard::TIMESTAMP_HEADER, seconds.to_string()));
            headers.push((standard::SIGNATURE_HEADER, standard::sign_all(&standard, event_id, seconds, body)));
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate as keys;
    use webhooks_signature::platform::Verifier;

    fn load(scheme: SignatureScheme) -> (KeySigner, String) {
        let pair = keys::generate(scheme).unwrap();
        (KeySigner::load(scheme, &pair.private_pkcs8_der).unwrap(), pair.public_key_pem)
    }

    fn header<'a>(headers: &'a [(&str, String)], name: &str) -> Option<&'a str> {
        headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn during_the_overlap_both_keys_sign_newest_first_and_after_it_only_the_new_one() {
        let (new, new_public) = load(SignatureScheme::Platform);
        let (old, old_public) = load(SignatureScheme::Platform);
        let now = webhooks_model::time::now();
        let signer = EndpointSigner::new(new, Some((old, now + chrono::Duration::hours(1))));
        let during = signer.headers("wh_1", now, b"{}");
        let value = header(&during, SIGNATURE_HEADER).unwrap();
        assert_eq!(value.matches(",v0=").count(), 2);
        let parsed = signing::parse_header(value).unwrap();
        let new_verifier = Verifier::from_pem(&new_public).unwrap();
        let old_verifier = Verifier::from_pem(&old_public).unwrap();
        // Newest first: the first entry alone verifies with the new key.
        let first_only = signing::header_value(parsed.timestamp_ms, &parsed.signatures[0]);
        assert!(new_verifier.verify(&first_only, b"{}", None).is_ok());
        assert!(old_verifier.verify(value, b"{}", None).is_ok());
        let after = signer.headers("wh_1", now + chrono::Duration::hours(2), b"{}");
        let value = header(&after, SIGNATURE_HEADER).unwrap();
        assert_eq!(value.matches(",v0=").count(), 1);
        assert!(old_verifier.verify(value, b"{}", None).is_err());
        assert!(header(&after, standard::SIGNATURE_HEADER).is_none());
    }

    #[test]
    fn a_scheme_change_sends_both_schemes_during_the_overlap() {
        let (new, new_public) = load(SignatureScheme::Standard);
        let (old, old_public) = load(SignatureScheme::Platform);
        let now = webhooks_model::time::now();
        let signer = EndpointSigner::new(new, Some((old, now + chrono::Duration::hours(1))));
        let headers = signer.headers("wh_1", now, b"{}");
        let platform = header(&headers, SIGNATURE_HEADER).unwrap();
        assert!(Verifier::from_pem(&old_public).unwrap().verify(platform, b"{}", None).is_ok());
        let timestamp = header(&headers, standard::TIMESTAMP_HEADER).unwrap();
        assert_eq!(header(&headers, standard::ID_HEADER), Some("wh_1"));
        let signature = header(&headers, standard::SIGNATURE_HEADER).unwrap();
        assert!(standard::verify(&new_public, "wh_1", timestamp, signature, b"{}", None).is_ok());
    }
}
