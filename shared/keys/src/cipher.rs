//! Sealing endpoint private keys at rest with `KEY_ENCRYPTION_KEY`.

use std::fmt;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::rand::{SecureRandom as _, SystemRandom};
use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use crate::KeyError;

/// Format byte of a blob holding the private key in the clear.
const FORMAT_PLAINTEXT: u8 = 0x00;
/// Format byte of a blob holding `nonce ‖ AES-256-GCM ciphertext ‖ tag`.
const FORMAT_AES_256_GCM: u8 = 0x01;
/// Length of the configured encryption key.
const KEY_LEN: usize = 32;

/// Accepts base64 with or without padding; the length check happens after decoding.
const BASE64_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Seals and opens endpoint private keys for storage, with or without a configured
/// `KEY_ENCRYPTION_KEY`.
///
/// Built once from configuration and shared behind an `Arc`.
pub struct KeyCipher {
    key: Option<LessSafeKey>,
    rng: SystemRandom,
}

impl fmt::Debug for KeyCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyCipher").field("encrypting", &self.is_encrypting()).finish_non_exhaustive()
    }
}

impl KeyCipher {
    /// Builds the cipher from the `KEY_ENCRYPTION_KEY` setting: `None` stores keys
    /// in the clear, `Some` must be 32 bytes as standard base64 (padding optional)
    /// or as 64 hex characters; surrounding whitespace is ignored.
    ///
    /// A malformed value is refused rather than ignored, so a typo never silently
    /// stores keys unencrypted; the error does not repeat the value.
    pub fn new(key: Option<&str>) -> Result<KeyCipher, KeyError> {
        let key = match key {
            None => None,
            Some(value) => {
                let bytes = decode_config_key(value)?;
                let unbound = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| KeyError::InvalidKeyConfig)?;
                Some(LessSafeKey::new(unbound))
            }
        };
        Ok(KeyCipher { key, rng: SystemRandom::new() })
    }

    /// Whether new blobs are encrypted, for start-up logs and health reporting.
    pub fn is_encrypting(&self) -> bool {
        self.key.is_some()
    }

    /// Wraps a private key for storage in the row of endpoint `aad` (its id).
    ///
    /// Each call draws a fresh random nonce, so sealing the same key twice gives
    /// different blobs.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>, KeyError> {
        let Some(key) = &self.key else {
            let mut out = Vec::with_capacity(1 + plaintext.len());
            out.push(FORMAT_PLAINTEXT);
            out.extend_from_slice(plaintext);
            return Ok(out);
        };
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| KeyError::Encrypt)?;
        let tag_len = AES_256_GCM.tag_len();
        let mut out = Vec::with_capacity(1 + NONCE_LEN + plaintext.len() + tag_len);
        out.push(FORMAT_AES_256_GCM);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plaintext);
        let header_len = 1 + NONCE_LEN;
        let tag = key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut out[header_len..])
            .map_err(|_| KeyError::Encrypt)?;
        out.extend_from_slice(tag.as_ref());
        Ok(out)
    }

    /// Recovers a private key stored by [`KeyCipher::seal`] for endpoint `aad`.
    ///
    /// Plaintext blobs open whether or not a key is configured, so rows written
    /// before encryption was enabled keep working.
    pub fn open(&self, stored: &[u8], aad: &[u8]) -> Result<Vec<u8>, KeyError> {
        match stored.split_first() {
            Some((&FORMAT_PLAINTEXT, plaintext)) => Ok(plaintext.to_vec()),
            Some((&FORMAT_AES_256_GCM, sealed)) => {
                let key = self.key.as_ref().ok_or(KeyError::KeyRequired)?;
                if sealed.len() < NONCE_LEN + AES_256_GCM.tag_len() {
                    return Err(KeyError::Decrypt);
                }
                let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
                let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| KeyError::Decrypt)?;
                let mut buffer = ciphertext.to_vec();
                let plaintext_len =
                    key.open_in_place(nonce, Aad::from(aad), &mut buffer).map_err(|_| KeyError::Decrypt)?.len();
                buffer.truncate(plaintext_len);
                Ok(buffer)
            }
            _ => Err(KeyError::UnknownFormat),
        }
    }
}

/// Reads the 32-byte key from its configured spelling, hex first because 64 hex
/// characters are also valid base64 (of 48 bytes).
fn decode_config_key(value: &str) -> Result<[u8; KEY_LEN], KeyError> {
    let value = value.trim();
    let mut key = [0u8; KEY_LEN];
    if value.len() == 2 * KEY_LEN && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        hex::decode_to_slice(value, &mut key).map_err(|_| KeyError::InvalidKeyConfig)?;
        return Ok(key);
    }
    // Room for the decoder's length estimate of anything that might be 32 bytes;
    // longer input fails here, shorter fails the length check.
    let mut buffer = [0u8; KEY_LEN + 3];
    let len = BASE64_ANY_PADDING.decode_slice(value, &mut buffer).map_err(|_| KeyError::InvalidKeyConfig)?;
    if len != KEY_LEN {
        return Err(KeyError::InvalidKeyConfig);
    }
    key.copy_from_slice(&buffer[..KEY_LEN]);
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const KEY_B64: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const OTHER_KEY_HEX: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const SECRET: &[u8] = b"pretend this is a PKCS#8 private key";
    const ENDPOINT: &[u8] = b"wep_0123456789abcdef0123456789abcdef";

    fn cipher(key: &str) -> KeyCipher {
        KeyCipher::new(Some(key)).expect("valid test key")
    }

    #[test]
    fn without_key_blobs_are_tagged_plaintext() {
        let cipher = KeyCipher::new(None).expect("no key");
        assert!(!cipher.is_encrypting());
        let stored = cipher.seal(SECRET, ENDPOINT).expect("seal");
        assert_eq!(stored[0], FORMAT_PLAINTEXT);
        assert_eq!(&stored[1..], SECRET);
        assert_eq!(cipher.open(&stored, ENDPOINT).expect("open"), SECRET);
    }

    #[test]
    fn encrypted_round_trip() {
        let cipher = cipher(KEY_HEX);
        assert!(cipher.is_encrypting());
        let stored = cipher.seal(SECRET, ENDPOINT).expect("seal");
        assert_eq!(stored[0], FORMAT_AES_256_GCM);
        assert_eq!(stored.len(), 1 + NONCE_LEN + SECRET.len() + 16);
        assert!(!stored.windows(SECRET.len()).any(|w| w == SECRET));
        assert_eq!(cipher.open(&stored, ENDPOINT).expect("open"), SECRET);
        assert_eq!(cipher.open(&cipher.seal(b"", ENDPOINT).unwrap(), ENDPOINT).unwrap(), b"");
    }

    #[test]
    fn each_seal_uses_a_fresh_nonce() {
        let cipher = cipher(KEY_HEX);
        let a = cipher.seal(SECRET, ENDPOINT).expect("seal");
        let b = cipher.seal(SECRET, ENDPOINT).expect("seal");
        assert_ne!(a[1..1 + NONCE_LEN], b[1..1 + NONCE_LEN]);
        assert_ne!(a, b);
    }

    #[test]
    fn wrong_aad_fails() {
        let cipher = cipher(KEY_HEX);
        let stored = cipher.seal(SECRET, ENDPOINT).expect("seal");
        let err = cipher.open(&stored, b"wep_another").unwrap_err();
        assert!(matches!(err, KeyError::Decrypt), "{err:?}");
    }

    #[test]
    fn wrong_key_fails() {
        let stored = cipher(KEY_HEX).seal(SECRET, ENDPOINT).expect("seal");
        let err = cipher(OTHER_KEY_HEX).open(&stored, ENDPOINT).unwrap_err();
        assert!(matches!(err, KeyError::Decrypt), "{err:?}");
    }

    #[test]
    fn altered_or_truncated_ciphertext_fails() {
        let cipher = cipher(KEY_HEX);
        let stored = cipher.seal(SECRET, ENDPOINT).expect("seal");
        for i in 1..stored.len() {
            let mut altered = stored.clone();
            altered[i] ^= 0x01;
            assert!(matches!(cipher.open(&altered, ENDPOINT), Err(KeyError::Decrypt)));
        }
        for len in 1..stored.len() {
            assert!(matches!(cipher.open(&stored[..len], ENDPOINT), Err(KeyError::Decrypt)));
        }
    }

    #[test]
    fn encrypted_blob_without_key_requires_key() {
        let stored = cipher(KEY_HEX).seal(SECRET, ENDPOINT).expect("seal");
        let err = KeyCipher::new(None).unwrap().open(&stored, ENDPOINT).unwrap_err();
        assert!(matches!(err, KeyError::KeyRequired), "{err:?}");
    }

    #[test]
    fn plaintext_blobs_stay_readable_after_enabling_encryption() {
        let stored = KeyCipher::new(None).unwrap().seal(SECRET, ENDPOINT).unwrap();
        assert_eq!(cipher(KEY_HEX).open(&stored, ENDPOINT).expect("open"), SECRET);
        // The endpoint id does not bind plaintext blobs: there is nothing to bind.
        assert_eq!(cipher(KEY_HEX).open(&stored, b"other").expect("open"), SECRET);
    }

    #[test]
    fn unknown_formats_are_refused() {
        let cipher = cipher(KEY_HEX);
        for stored in [&b""[..], b"\x02abc", b"\xffabc"] {
            assert!(matches!(cipher.open(stored, ENDPOINT), Err(KeyError::UnknownFormat)));
        }
    }

    #[test]
    fn hex_and_base64_spellings_are_the_same_key() {
        let unpadded = KEY_B64.trim_end_matches('=');
        let upper_hex = KEY_HEX.to_ascii_uppercase();
        let padded_ws = format!("  {KEY_B64}\n");
        let stored = cipher(KEY_HEX).seal(SECRET, ENDPOINT).expect("seal");
        for spelling in [KEY_B64, unpadded, &upper_hex, &padded_ws] {
            let opened = cipher(spelling).open(&stored, ENDPOINT).expect(spelling);
            assert_eq!(opened, SECRET);
        }
    }

    #[test]
    fn bad_configs_are_refused_without_echoing_the_value() {
        let too_long_b64 = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gIQ==";
        let bad = [
            "",
            "   ",
            "secret-passphrase",
            &KEY_HEX[..62],
            &format!("{KEY_HEX}00"),
            &format!("{}zz", &KEY_HEX[..62]),
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHg==",
            too_long_b64,
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=extra",
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh-_",
        ];
        for value in bad {
            let err = KeyCipher::new(Some(value)).unwrap_err();
            assert!(matches!(err, KeyError::InvalidKeyConfig), "{value:?}: {err:?}");
            let shown = format!("{err} {err:?}");
            if !value.trim().is_empty() {
                assert!(!shown.contains(value.trim()), "{shown}");
            }
        }
    }

    #[test]
    fn debug_hides_the_key() {
        let shown = format!("{:?}", cipher(KEY_HEX));
        assert_eq!(shown, "KeyCipher { encrypting: true, .. }");
        let shown = format!("{:?}", KeyCipher::new(None).unwrap());
        assert_eq!(shown, "KeyCipher { encrypting: false, .. }");
    }
}
