//! The signatures of deliveries, both schemes, for the sender and for the
//! receiver: key pairs, signing, and verifying a request. It needs no async
//! runtime, database or broker, so a Rust receiver depends on it alone.
//!
//! - [`platform`]: the original platform's scheme (RSA-2048, `X-Webhook-Signature`);
//! - [`standard`]: Standard Webhooks with asymmetric keys (Ed25519, `webhook-signature`);
//! - [`verify`]: a whole request checked the way every receiver kit checks it.

pub mod platform;
pub mod standard;
pub mod verify;

use std::fmt;

use aws_lc_rs::rand::SystemRandom;
use base64::Engine as _;
use rcgen::PublicKeyData as _;

/// Which scheme a key signs or verifies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// RSA PKCS#1 v1.5 over the SHA-256 digest of `<t>.<body>`.
    Platform,
    /// Standard Webhooks, Ed25519.
    Standard,
}

impl Scheme {
    /// The scheme's name, as endpoints spell it (`signature_scheme`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Platform => "platform",
            Scheme::Standard => "standard",
        }
    }
}

/// Why a key could not be generated or loaded.
///
/// Messages never contain key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The RSA key pair generator failed.
    #[error("could not generate an RSA key pair")]
    Generation(#[source] rcgen::Error),
    /// The Ed25519 key pair generator failed.
    #[error("could not generate an Ed25519 key pair")]
    Ed25519Generation,
    /// The private key is not an Ed25519 PKCS#8 key.
    #[error("Ed25519 private key rejected: {0}")]
    InvalidEd25519Key(aws_lc_rs::error::KeyRejected),
    /// The private key is not an RSA PKCS#8 key accepted for signing.
    #[error("private key rejected: {0}")]
    InvalidPrivateKey(aws_lc_rs::error::KeyRejected),
    /// The public key is not PEM.
    #[error("public key is not valid PEM")]
    PublicKeyPem(#[source] pem::PemError),
    /// The RSA key is smaller or larger than signing and verification accept
    /// (2048 to 4096 bits to sign, 2048 to 8192 to verify).
    #[error("unsupported RSA key size: {bits} bits")]
    UnsupportedKeySize {
        /// Size of the modulus.
        bits: usize,
    },
    /// The public key is PEM but not a usable RSA public key.
    #[error("public key rejected: {0}")]
    InvalidPublicKey(&'static str),
}

/// A freshly generated endpoint key pair: the private half to store (through
/// `webhooks_keys::KeyCipher::seal`) and the public half to hand to the endpoint's owner.
pub struct GeneratedKeyPair {
    /// PKCS#8 v1 DER of the RSA private key, the form [`crate::platform::Signer`] loads.
    pub private_pkcs8_der: Vec<u8>,
    /// SubjectPublicKeyInfo PEM (`-----BEGIN PUBLIC KEY-----`, 64-character lines,
    /// `\n` endings), the form receivers load with OpenSSL or any JOSE/PEM library.
    pub public_key_pem: String,
}

impl fmt::Debug for GeneratedKeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GeneratedKeyPair")
            .field("private_pkcs8_der", &"<redacted>")
            .field("public_key_pem", &self.public_key_pem)
            .finish()
    }
}

/// Generates the RSA-2048 key pair an endpoint signs its deliveries with.
///
/// rcgen (on aws-lc-rs) generates the pair; the result is checked to load as a
/// signing key before it is handed out.
pub fn generate_rsa_2048() -> Result<GeneratedKeyPair, KeyError> {
    let key_pair = rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
        .map_err(KeyError::Generation)?;
    let private_pkcs8_der = key_pair.serialize_der();
    aws_lc_rs::signature::RsaKeyPair::from_pkcs8(&private_pkcs8_der).map_err(KeyError::InvalidPrivateKey)?;
    let public_key_pem = pem::encode_config(
        &pem::Pem::new("PUBLIC KEY", key_pair.subject_public_key_info()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    );
    Ok(GeneratedKeyPair { private_pkcs8_der, public_key_pem })
}

/// Prefix of a `standard` endpoint's public key: `whpk_` and the standard
/// base64 of its 32 bytes.
pub const STANDARD_PUBLIC_KEY_PREFIX: &str = "whpk_";

/// Generates the Ed25519 key pair of a `standard` endpoint: the private half
/// as PKCS#8 DER, the public half as `whpk_<base64>`.
pub fn generate_ed25519() -> Result<GeneratedKeyPair, KeyError> {
    use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair as _};
    let document = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).map_err(|_| KeyError::Ed25519Generation)?;
    let private_pkcs8_der = document.as_ref().to_vec();
    let key_pair = Ed25519KeyPair::from_pkcs8(&private_pkcs8_der).map_err(KeyError::InvalidEd25519Key)?;
    let public_key_pem = format!(
        "{STANDARD_PUBLIC_KEY_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(key_pair.public_key().as_ref())
    );
    Ok(GeneratedKeyPair { private_pkcs8_der, public_key_pem })
}

/// Generates a key pair for `scheme`: RSA-2048 for `platform`, Ed25519 for
/// `standard`. In `public_key_pem`, the public key as the API shows it.
pub fn generate(scheme: Scheme) -> Result<GeneratedKeyPair, KeyError> {
    match scheme {
        Scheme::Platform => generate_rsa_2048(),
        Scheme::Standard => generate_ed25519(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_key_pair_loads_for_signing_and_has_a_spki_pem() {
        let pair = generate_rsa_2048().expect("generate");
        let signing_key =
            aws_lc_rs::signature::RsaKeyPair::from_pkcs8(&pair.private_pkcs8_der).expect("the signing key loads");
        assert_eq!(signing_key.public_modulus_len(), 256);

        let pem = &pair.public_key_pem;
        assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----\n"), "{pem}");
        assert!(pem.ends_with("\n-----END PUBLIC KEY-----\n"), "{pem}");
        assert!(!pem.contains('\r'));
        let body: Vec<&str> = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let (last, full) = body.split_last().expect("body lines");
        assert!(full.iter().all(|l| l.len() == 64));
        assert!(!last.is_empty() && last.len() <= 64);
        let parsed = pem::parse(pem).expect("parses");
        assert_eq!(parsed.tag(), "PUBLIC KEY");
        // SEQUENCE { SEQUENCE { rsaEncryption, NULL }, BIT STRING … }
        let contents = parsed.contents();
        let rsa_encryption = [0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00];
        assert!(contents.windows(rsa_encryption.len()).any(|w| w == rsa_encryption));
        assert!(contents.ends_with(aws_lc_rs::signature::KeyPair::public_key(&signing_key).as_ref()));
    }

    #[test]
    fn generated_key_pairs_differ_and_debug_hides_the_private_key() {
        let a = generate_rsa_2048().expect("generate");
        let b = generate_rsa_2048().expect("generate");
        assert_ne!(a.private_pkcs8_der, b.private_pkcs8_der);
        let shown = format!("{a:?}");
        assert!(shown.contains("<redacted>"));
        assert!(!shown.contains(&format!("{:?}", &a.private_pkcs8_der[..8])));
        assert!(shown.contains("BEGIN PUBLIC KEY"));
    }
}
