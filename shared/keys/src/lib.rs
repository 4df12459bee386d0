//! Endpoint keys on the sender's side: each endpoint's key pair, its private
//! half protected at rest with `KEY_ENCRYPTION_KEY`, and the [`signer`] that
//! signs the endpoint's deliveries with it.
//!
//! The private key never leaves the service. It is stored in a self-describing
//! blob ([`KeyCipher`]): in the clear while no encryption key is configured,
//! else AES-256-GCM under the first key of `KEY_ENCRYPTION_KEY`, naming that
//! key's id, with the endpoint id as associated data so a ciphertext cannot
//! be moved to another row. Every configured key opens, and blobs of every
//! earlier format stay readable, so enabling encryption or changing the key
//! needs no migration; `webhooks-api keys reseal` moves stored blobs to the
//! first key.

use webhooks_model::SignatureScheme;
pub use webhooks_signature::{GeneratedKeyPair, STANDARD_PUBLIC_KEY_PREFIX, generate_ed25519, generate_rsa_2048};

mod cipher;
pub mod signer;

pub use cipher::{FORMAT_NAMED, KeyCipher, KeyId, NAMED_HEAD_LEN, Resealed, SealedBy};

/// Why a key could not be generated, loaded, protected or recovered.
///
/// Messages never contain key material or the configured encryption key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Generating or loading the key itself failed.
    #[error(transparent)]
    Key(#[from] webhooks_signature::KeyError),
    /// An entry of `KEY_ENCRYPTION_KEY` (`entry` of `entries`, counted from 1)
    /// is not a 256-bit key in a known spelling.
    #[error("{}", invalid_entry(*entry, *entries))]
    InvalidKeyConfig { entry: usize, entries: usize },
    /// `KEY_ENCRYPTION_KEY` lists one key twice.
    #[error("KEY_ENCRYPTION_KEY lists one key twice (entries {first} and {entry}): list each key once")]
    RepeatedKey { first: usize, entry: usize },
    /// The system random generator failed while encrypting.
    #[error("could not encrypt a private key: the system random generator failed")]
    Encrypt,
    /// The blob is encrypted but does not open under this key and endpoint id.
    #[error(
        "stored private key could not be decrypted: wrong KEY_ENCRYPTION_KEY, or the \
         stored value was altered or belongs to another endpoint"
    )]
    Decrypt,
    /// The blob names a key that `KEY_ENCRYPTION_KEY` does not hold.
    #[error("stored private key was sealed with key id {0}, which KEY_ENCRYPTION_KEY does not hold")]
    KeyNotConfigured(KeyId),
    /// The blob is encrypted and no `KEY_ENCRYPTION_KEY` is configured.
    #[error("stored private key is encrypted but KEY_ENCRYPTION_KEY is not set")]
    KeyRequired,
    /// The blob is empty or starts with an unknown format byte.
    #[error("stored private key has an unknown format")]
    UnknownFormat,
}

/// The message of a malformed `KEY_ENCRYPTION_KEY` entry: where, never what.
fn invalid_entry(entry: usize, entries: usize) -> String {
    const SPELLING: &str = "32 bytes written as base64 (44 characters, or 43 without padding) or as 64 hex characters";
    if entries == 1 {
        format!("KEY_ENCRYPTION_KEY must be {SPELLING}, or a comma-separated list of such keys")
    } else {
        format!("KEY_ENCRYPTION_KEY entry {entry} of {entries} (comma-separated, counted from 1) must be {SPELLING}")
    }
}

/// Generates a key pair for `scheme`: RSA-2048 for `platform`, Ed25519 for
/// `standard`. In `public_key_pem`, the public key as the API shows it.
pub fn generate(scheme: SignatureScheme) -> Result<GeneratedKeyPair, KeyError> {
    Ok(webhooks_signature::generate(signature_scheme(scheme))?)
}

/// The scheme of the signature crate that `scheme` names.
pub fn signature_scheme(scheme: SignatureScheme) -> webhooks_signature::Scheme {
    match scheme {
        SignatureScheme::Platform => webhooks_signature::Scheme::Platform,
        SignatureScheme::Standard => webhooks_signature::Scheme::Standard,
    }
}
