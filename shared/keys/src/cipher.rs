//! Sealing endpoint private keys at rest with `KEY_ENCRYPTION_KEY`.
//!
//! The setting is a comma-separated list of keys, so that the key can change
//! without an outage: the first key seals, every key opens. Each key has an
//! id, the first 8 bytes of its SHA-256 in hex, which names it in stored
//! blobs, logs and messages without giving it away.
//!
//! A stored private key is a self-describing blob:
//!
//! | format | layout | written |
//! |---|---|---|
//! | `0x00` | `0x00 ‖ PKCS#8 DER` | while no key is configured |
//! | `0x01` | `0x01 ‖ nonce (12) ‖ AES-256-GCM(DER) ‖ tag (16)` | by releases before key ids |
//! | `0x02` | `0x02 ‖ key id (8) ‖ nonce (12) ‖ AES-256-GCM(DER) ‖ tag (16)` | now, by the first key |
//!
//! The associated data of both encrypted formats is the endpoint id, so a
//! ciphertext cannot be moved to another row. A `0x02` blob opens with the
//! key its id names; a `0x01` blob names none, so every configured key is
//! tried. The id is not secret and needs no protection: a changed id names a
//! key that does not open the blob.

use std::fmt;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::digest::{SHA256, digest};
use aws_lc_rs::rand::{SecureRandom as _, SystemRandom};
use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use crate::KeyError;

/// Format byte of a blob holding the private key in the clear.
const FORMAT_PLAINTEXT: u8 = 0x00;
/// Format byte of a blob holding `nonce ‖ AES-256-GCM ciphertext ‖ tag`,
/// sealed by a key it does not name.
const FORMAT_UNNAMED: u8 = 0x01;
/// Format byte of a blob holding `key id ‖ nonce ‖ AES-256-GCM ciphertext ‖
/// tag`: what [`KeyCipher::seal`] writes when a key is configured.
pub const FORMAT_NAMED: u8 = 0x02;
/// Length of a key id in a blob.
const KEY_ID_LEN: usize = 8;
/// The head of a `0x02` blob, its format byte and key id: what tells blobs
/// sealed by different keys apart (the store groups blobs by it). Every
/// other format's head is its first byte.
pub const NAMED_HEAD_LEN: usize = 1 + KEY_ID_LEN;
/// Length of the configured encryption key.
const KEY_LEN: usize = 32;

/// Accepts base64 with or without padding; the length check happens after decoding.
const BASE64_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The id of a key-encryption key: the first 8 bytes of the SHA-256 of the
/// 32-byte key, written as 16 hex digits. An operator computes it with
/// `base64 -d <<< "$KEY" | sha256sum | cut -c1-16` (or `xxd -r -p` for a hex
/// key).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId([u8; KEY_ID_LEN]);

impl KeyId {
    fn of(key: &[u8; KEY_LEN]) -> KeyId {
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&digest(&SHA256, key).as_ref()[..KEY_ID_LEN]);
        KeyId(id)
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// How a stored blob is sealed, read from its head without opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SealedBy {
    /// `0x00`: not sealed at all.
    Nothing,
    /// `0x01`: sealed by a key the blob does not name.
    UnnamedKey,
    /// `0x02`: sealed by the key with this id.
    Key(KeyId),
    /// Empty, cut short, or an unknown format byte.
    Unknown,
}

impl SealedBy {
    /// How `blob` (or its head) is sealed.
    pub fn of(blob: &[u8]) -> SealedBy {
        match blob.split_first() {
            Some((&FORMAT_PLAINTEXT, _)) => SealedBy::Nothing,
            Some((&FORMAT_UNNAMED, _)) => SealedBy::UnnamedKey,
            Some((&FORMAT_NAMED, rest)) => match rest.first_chunk::<KEY_ID_LEN>() {
                Some(id) => SealedBy::Key(KeyId(*id)),
                None => SealedBy::Unknown,
            },
            _ => SealedBy::Unknown,
        }
    }
}

impl fmt::Display for SealedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SealedBy::Nothing => f.write_str("stored in the clear"),
            SealedBy::UnnamedKey => f.write_str("sealed without a key id"),
            SealedBy::Key(id) => write!(f, "sealed with key id {id}"),
            SealedBy::Unknown => f.write_str("of an unknown format"),
        }
    }
}

/// What [`KeyCipher::reseal`] made of a stored blob.
pub enum Resealed {
    /// The blob is sealed with the first key already: nothing to write.
    Current,
    /// The same private key sealed with the first key, to store in place of
    /// the blob.
    Sealed(Vec<u8>),
}

impl fmt::Debug for Resealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resealed::Current => f.write_str("Current"),
            Resealed::Sealed(_) => f.write_str("Sealed(..)"),
        }
    }
}

/// One configured key and its id.
struct Kek {
    id: KeyId,
    key: LessSafeKey,
}

/// Seals and opens endpoint private keys for storage, with the keys of
/// `KEY_ENCRYPTION_KEY` or, without any, in the clear.
///
/// Built once from configuration and shared behind an `Arc`. Its `Debug`
/// shows the key ids, never a key.
pub struct KeyCipher {
    /// In the configured order: the first seals.
    keys: Vec<Kek>,
    rng: SystemRandom,
}

impl fmt::Debug for KeyCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyCipher").field("key_ids", &self.key_ids().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

impl KeyCipher {
    /// Builds the cipher from the `KEY_ENCRYPTION_KEY` setting: `None` stores
    /// keys in the clear; `Some` is a comma-separated list of keys, each 32
    /// bytes as standard base64 (padding optional) or as 64 hex characters,
    /// surrounding whitespace ignored. The first key seals; all of them open.
    ///
    /// A malformed entry (an empty one too) is refused rather than skipped,
    /// so a typo never silently stores keys unencrypted or leaves a key out;
    /// the error names the entry by its position and never repeats a value.
    /// A key listed twice is refused as well.
    pub fn new(setting: Option<&str>) -> Result<KeyCipher, KeyError> {
        let entries: Vec<&str> = setting.map(|s| s.split(',').collect()).unwrap_or_default();
        let mut keys: Vec<Kek> = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let invalid = || KeyError::InvalidKeyConfig { entry: index + 1, entries: entries.len() };
            let bytes = decode_config_key(entry).ok_or_else(invalid)?;
            let id = KeyId::of(&bytes);
            if let Some(first) = keys.iter().position(|kek| kek.id == id) {
                return Err(KeyError::RepeatedKey { first: first + 1, entry: index + 1 });
            }
            let unbound = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| invalid())?;
            keys.push(Kek { id, key: LessSafeKey::new(unbound) });
        }
        Ok(KeyCipher { keys, rng: SystemRandom::new() })
    }

    /// Whether new blobs are encrypted, for start-up logs and health reporting.
    pub fn is_encrypting(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The id of the key that seals: the first one configured.
    pub fn sealing_key(&self) -> Option<KeyId> {
        self.keys.first().map(|kek| kek.id)
    }

    /// The ids of every configured key, in the configured order.
    pub fn key_ids(&self) -> impl Iterator<Item = KeyId> + '_ {
        self.keys.iter().map(|kek| kek.id)
    }

    /// Wraps a private key for storage in the row of endpoint `aad` (its
    /// id): format `0x02` under the first key, or `0x00` without one.
    ///
    /// Each call draws a fresh random nonce, so sealing the same key twice gives
    /// different blobs.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>, KeyError> {
        let Some(first) = self.keys.first() else {
            let mut out = Vec::with_capacity(1 + plaintext.len());
            out.push(FORMAT_PLAINTEXT);
            out.extend_from_slice(plaintext);
            return Ok(out);
        };
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| KeyError::Encrypt)?;
        let header_len = NAMED_HEAD_LEN + NONCE_LEN;
        let mut out = Vec::with_capacity(header_len + plaintext.len() + AES_256_GCM.tag_len());
        out.push(FORMAT_NAMED);
        out.extend_from_slice(&first.id.0);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plaintext);
        let tag = first
            .key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut out[header_len..])
            .map_err(|_| KeyError::Encrypt)?;
        out.extend_from_slice(tag.as_ref());
        Ok(out)
    }

    /// Recovers a private key stored by [`KeyCipher::seal`] (of this release
    /// or an earlier one) for endpoint `aad`.
    ///
    /// Plaintext blobs open whether or not a key is configured, so rows written
    /// before encryption was enabled keep working.
    pub fn open(&self, stored: &[u8], aad: &[u8]) -> Result<Vec<u8>, KeyError> {
        match stored.split_first() {
            Some((&FORMAT_PLAINTEXT, plaintext)) => Ok(plaintext.to_vec()),
            Some((&FORMAT_UNNAMED, sealed)) => {
                if self.keys.is_empty() {
                    return Err(KeyError::KeyRequired);
                }
                self.keys.iter().find_map(|kek| open_with(&kek.key, sealed, aad).ok()).ok_or(KeyError::Decrypt)
            }
            Some((&FORMAT_NAMED, rest)) => {
                let Some((id, sealed)) = rest.split_first_chunk::<KEY_ID_LEN>() else {
                    return Err(KeyError::Decrypt);
                };
                if self.keys.is_empty() {
                    return Err(KeyError::KeyRequired);
                }
                let id = KeyId(*id);
                let kek = self.keys.iter().find(|kek| kek.id == id).ok_or(KeyError::KeyNotConfigured(id))?;
                open_with(&kek.key, sealed, aad)
            }
            _ => Err(KeyError::UnknownFormat),
        }
    }

    /// Seals the private key of blob `stored` again with the first key, for
    /// `keys reseal`: [`Resealed::Current`] when that key sealed it already.
    /// Either way the blob is opened first, so a blob that no configured key
    /// opens is an error, never skipped.
    pub fn reseal(&self, stored: &[u8], aad: &[u8]) -> Result<Resealed, KeyError> {
        let first = self.sealing_key().ok_or(KeyError::KeyRequired)?;
        let plaintext = self.open(stored, aad)?;
        if SealedBy::of(stored) == SealedBy::Key(first) {
            return Ok(Resealed::Current);
        }
        Ok(Resealed::Sealed(self.seal(&plaintext, aad)?))
    }
}

/// Opens `nonce ‖ ciphertext ‖ tag` with `key`.
fn open_with(key: &LessSafeKey, sealed: &[u8], aad: &[u8]) -> Result<Vec<u8>, KeyError> {
    if sealed.len() < NONCE_LEN + AES_256_GCM.tag_len() {
        return Err(KeyError::Decrypt);
    }
    let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| KeyError::Decrypt)?;
    let mut buffer = ciphertext.to_vec();
    let plaintext_len = key.open_in_place(nonce, Aad::from(aad), &mut buffer).map_err(|_| KeyError::Decrypt)?.len();
    buffer.truncate(plaintext_len);
    Ok(buffer)
}

/// Reads one 32-byte key from its configured spelling, hex first because 64
/// hex characters are also valid base64 (of 48 bytes).
fn decode_config_key(value: &str) -> Option<[u8; KEY_LEN]> {
    let value = value.trim();
    let mut key = [0u8; KEY_LEN];
    if value.len() == 2 * KEY_LEN && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        hex::decode_to_slice(value, &mut key).ok()?;
        return Some(key);
    }
    // Room for the decoder's length estimate of anything that might be 32 bytes;
    // longer input fails here, shorter fails the length check.
    let mut buffer = [0u8; KEY_LEN + 3];
    let len = BASE64_ANY_PADDING.decode_slice(value, &mut buffer).ok()?;
    if len != KEY_LEN {
        return None;
    }
    key.copy_from_slice(&buffer[..KEY_LEN]);
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const KEY_B64: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    /// `sha256sum` of the 32 bytes of [`KEY_HEX`], cut to 16 digits.
    const KEY_ID: &str = "630dcd2966c43366";
    const OTHER_KEY_HEX: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const OTHER_KEY_ID: &str = "297e3971a2ca15c1";
    const THIRD_KEY_B64: &str = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=";
    const SECRET: &[u8] = b"pretend this is a PKCS#8 private key";
    const ENDPOINT: &[u8] = b"wep_0123456789abcdef0123456789abcdef";

    fn cipher(setting: &str) -> KeyCipher {
        KeyCipher::new(Some(setting)).expect("valid test keys")
    }

    fn id_of(setting: &str) -> KeyId {
        cipher(setting).sealing_key().expect("a key")
    }

    /// A `0x01` blob as releases before key ids wrote it: no key id, the
    /// endpoint id as associated data.
    fn unnamed_blob(key_hex: &str, plaintext: &[u8], aad: &[u8]) -> Vec<u8> {
        let bytes = hex::decode(key_hex).unwrap();
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &bytes).unwrap());
        let nonce = [7u8; NONCE_LEN];
        let mut out = vec![FORMAT_UNNAMED];
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plaintext);
        let tag = key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut out[1 + NONCE_LEN..])
            .unwrap();
        out.extend_from_slice(tag.as_ref());
        out
    }

    #[test]
    fn without_key_blobs_are_tagged_plaintext() {
        let cipher = KeyCipher::new(None).expect("no key");
        assert!(!cipher.is_encrypting());
        assert_eq!(cipher.sealing_key(), None);
        let stored = cipher.seal(SECRET, ENDPOINT).expect("seal");
        assert_eq!(stored[0], FORMAT_PLAINTEXT);
        assert_eq!(&stored[1..], SECRET);
        assert_eq!(SealedBy::of(&stored), SealedBy::Nothing);
        assert_eq!(cipher.open(&stored, ENDPOINT).expect("open"), SECRET);
    }

    #[test]
    fn a_sealed_blob_names_its_key_by_a_sha256_prefix() {
        let cipher = cipher(KEY_HEX);
        assert!(cipher.is_encrypting());
        assert_eq!(cipher.sealing_key().unwrap().to_string(), KEY_ID);
        let stored = cipher.seal(SECRET, ENDPOINT).expect("seal");
        assert_eq!(stored[0], FORMAT_NAMED);
        assert_eq!(hex::encode(&stored[1..NAMED_HEAD_LEN]), KEY_ID);
        assert_eq!(stored.len(), NAMED_HEAD_LEN + NONCE_LEN + SECRET.len() + 16);
        assert!(!stored.windows(SECRET.len()).any(|w| w == SECRET));
        let sealed_by = SealedBy::of(&stored);
        assert_eq!(sealed_by, SealedBy::Key(cipher.sealing_key().unwrap()));
        assert_eq!(SealedBy::of(&stored[..NAMED_HEAD_LEN]), sealed_by, "the head alone says as much");
        assert_eq!(sealed_by.to_string(), format!("sealed with key id {KEY_ID}"));
        assert_eq!(cipher.open(&stored, ENDPOINT).expect("open"), SECRET);
        assert_eq!(cipher.open(&cipher.seal(b"", ENDPOINT).unwrap(), ENDPOINT).unwrap(), b"");
        assert_eq!(id_of(OTHER_KEY_HEX).to_string(), OTHER_KEY_ID);
    }

    #[test]
    fn each_seal_uses_a_fresh_nonce() {
        let cipher = cipher(KEY_HEX);
        let a = cipher.seal(SECRET, ENDPOINT).expect("seal");
        let b = cipher.seal(SECRET, ENDPOINT).expect("seal");
        let nonce = NAMED_HEAD_LEN..NAMED_HEAD_LEN + NONCE_LEN;
        assert_ne!(a[nonce.clone()], b[nonce]);
        assert_ne!(a, b);
    }

    #[test]
    fn wrong_aad_fails() {
        let cipher = cipher(KEY_HEX);
        let stored = cipher.seal(SECRET, ENDPOINT).expect("seal");
        let err = cipher.open(&stored, b"wep_another").unwrap_err();
        assert!(matches!(err, KeyError::Decrypt), "{err:?}");
        let unnamed = unnamed_blob(KEY_HEX, SECRET, ENDPOINT);
        assert!(matches!(cipher.open(&unnamed, b"wep_another"), Err(KeyError::Decrypt)));
    }

    #[test]
    fn a_key_that_is_not_configured_is_named() {
        let stored = cipher(KEY_HEX).seal(SECRET, ENDPOINT).expect("seal");
        let err = cipher(OTHER_KEY_HEX).open(&stored, ENDPOINT).unwrap_err();
        assert!(matches!(err, KeyError::KeyNotConfigured(id) if id.to_string() == KEY_ID), "{err:?}");
        assert!(err.to_string().contains(KEY_ID), "{err}");
    }

    #[test]
    fn the_first_key_seals_and_every_key_opens() {
        let old = cipher(KEY_HEX).seal(SECRET, ENDPOINT).unwrap();
        let both = cipher(&format!("{OTHER_KEY_HEX},{KEY_B64}"));
        assert_eq!(both.key_ids().map(|id| id.to_string()).collect::<Vec<_>>(), [OTHER_KEY_ID, KEY_ID]);
        let new = both.seal(SECRET, ENDPOINT).unwrap();
        assert_eq!(hex::encode(&new[1..NAMED_HEAD_LEN]), OTHER_KEY_ID);
        for blob in [&old, &new] {
            assert_eq!(both.open(blob, ENDPOINT).unwrap(), SECRET);
            assert_eq!(cipher(&format!("{KEY_HEX},{OTHER_KEY_HEX}")).open(blob, ENDPOINT).unwrap(), SECRET);
        }
        assert!(matches!(cipher(KEY_HEX).open(&new, ENDPOINT), Err(KeyError::KeyNotConfigured(_))));
        assert!(matches!(cipher(OTHER_KEY_HEX).open(&old, ENDPOINT), Err(KeyError::KeyNotConfigured(_))));
    }

    #[test]
    fn blobs_without_a_key_id_open_with_whichever_configured_key_sealed_them() {
        let unnamed = unnamed_blob(KEY_HEX, SECRET, ENDPOINT);
        assert_eq!(SealedBy::of(&unnamed), SealedBy::UnnamedKey);
        assert_eq!(SealedBy::UnnamedKey.to_string(), "sealed without a key id");
        for setting in
            [KEY_HEX, &format!("{OTHER_KEY_HEX},{KEY_HEX}"), &format!("{THIRD_KEY_B64},{OTHER_KEY_HEX},{KEY_B64}")]
        {
            assert_eq!(cipher(setting).open(&unnamed, ENDPOINT).expect(setting), SECRET);
        }
        let err = cipher(&format!("{OTHER_KEY_HEX},{THIRD_KEY_B64}")).open(&unnamed, ENDPOINT).unwrap_err();
        assert!(matches!(err, KeyError::Decrypt), "{err:?}");
        let err = KeyCipher::new(None).unwrap().open(&unnamed, ENDPOINT).unwrap_err();
        assert!(matches!(err, KeyError::KeyRequired), "{err:?}");
    }

    #[test]
    fn altered_or_truncated_ciphertext_fails() {
        let cipher = cipher(KEY_HEX);
        let stored = cipher.seal(SECRET, ENDPOINT).expect("seal");
        for i in 1..stored.len() {
            let mut altered = stored.clone();
            altered[i] ^= 0x01;
            let err = cipher.open(&altered, ENDPOINT).unwrap_err();
            if i < NAMED_HEAD_LEN {
                assert!(matches!(err, KeyError::KeyNotConfigured(_)), "byte {i}: {err:?}");
            } else {
                assert!(matches!(err, KeyError::Decrypt), "byte {i}: {err:?}");
            }
        }
        for len in 1..stored.len() {
            assert!(matches!(cipher.open(&stored[..len], ENDPOINT), Err(KeyError::Decrypt)), "{len} bytes");
        }
        let unnamed = unnamed_blob(KEY_HEX, SECRET, ENDPOINT);
        for len in 1..unnamed.len() {
            assert!(matches!(cipher.open(&unnamed[..len], ENDPOINT), Err(KeyError::Decrypt)), "{len} bytes");
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
        for stored in [&b""[..], b"\x03abc", b"\xffabc"] {
            assert!(matches!(cipher.open(stored, ENDPOINT), Err(KeyError::UnknownFormat)));
            assert_eq!(SealedBy::of(stored), SealedBy::Unknown);
        }
        assert_eq!(SealedBy::of(b"\x02abc"), SealedBy::Unknown, "a head cut short");
    }

    #[test]
    fn hex_and_base64_spellings_are_the_same_key() {
        let unpadded = KEY_B64.trim_end_matches('=');
        let upper_hex = KEY_HEX.to_ascii_uppercase();
        let padded_ws = format!("  {KEY_B64}\n");
        let listed = format!(" {OTHER_KEY_HEX} ,\n{KEY_B64} ");
        let stored = cipher(KEY_HEX).seal(SECRET, ENDPOINT).expect("seal");
        for spelling in [KEY_B64, unpadded, &upper_hex, &padded_ws, &listed] {
            let opened = cipher(spelling).open(&stored, ENDPOINT).expect(spelling);
            assert_eq!(opened, SECRET);
        }
        assert_eq!(id_of(KEY_B64), id_of(&upper_hex));
    }

    #[test]
    fn bad_entries_are_refused_by_position_without_echoing_the_value() {
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
            assert!(matches!(err, KeyError::InvalidKeyConfig { entry: 1, entries: 1 }), "{value:?}: {err:?}");
            let shown = format!("{err} {err:?}");
            assert!(shown.contains("KEY_ENCRYPTION_KEY must be 32 bytes"), "{shown}");
            if !value.trim().is_empty() {
                assert!(!shown.contains(value.trim()), "{shown}");
            }
        }
        let lists = [
            (format!("{KEY_HEX},"), 2, 2),
            (format!(",{KEY_HEX}"), 1, 2),
            (format!("{KEY_HEX},secret-passphrase,{OTHER_KEY_HEX}"), 2, 3),
            (format!("{KEY_HEX};{OTHER_KEY_HEX}"), 1, 1),
            (format!("{KEY_HEX},{OTHER_KEY_HEX},{}", &THIRD_KEY_B64[..40]), 3, 3),
        ];
        for (value, at, of) in lists {
            let err = KeyCipher::new(Some(&value)).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(
                matches!(err, KeyError::InvalidKeyConfig { entry, entries } if entry == at && entries == of),
                "{value:?}: {shown}"
            );
            if of > 1 {
                assert!(shown.contains(&format!("entry {at} of {of}")), "{shown}");
            }
            for secret in [KEY_HEX, OTHER_KEY_HEX, &THIRD_KEY_B64[..40], "secret-passphrase"] {
                assert!(!shown.contains(secret), "{shown}");
            }
        }
    }

    #[test]
    fn a_key_listed_twice_is_refused() {
        let err = KeyCipher::new(Some(&format!("{KEY_HEX},{OTHER_KEY_HEX},{KEY_B64}"))).unwrap_err();
        assert!(matches!(err, KeyError::RepeatedKey { first: 1, entry: 3 }), "{err:?}");
        assert!(!err.to_string().contains(KEY_B64), "{err}");
    }

    #[test]
    fn reseal_moves_every_format_to_the_first_key_and_skips_what_it_sealed() {
        let rotated = cipher(&format!("{OTHER_KEY_HEX},{KEY_HEX}"));
        let first = rotated.sealing_key().unwrap();
        let blobs = [
            KeyCipher::new(None).unwrap().seal(SECRET, ENDPOINT).unwrap(),
            unnamed_blob(KEY_HEX, SECRET, ENDPOINT),
            cipher(KEY_HEX).seal(SECRET, ENDPOINT).unwrap(),
        ];
        for blob in &blobs {
            let Resealed::Sealed(resealed) = rotated.reseal(blob, ENDPOINT).unwrap() else {
                panic!("{:?} left as it was", SealedBy::of(blob));
            };
            assert_eq!(SealedBy::of(&resealed), SealedBy::Key(first));
            assert_eq!(cipher(OTHER_KEY_HEX).open(&resealed, ENDPOINT).unwrap(), SECRET, "the old key is not needed");
            assert!(matches!(rotated.reseal(&resealed, ENDPOINT).unwrap(), Resealed::Current));
        }
        let foreign = cipher(THIRD_KEY_B64).seal(SECRET, ENDPOINT).unwrap();
        assert!(matches!(rotated.reseal(&foreign, ENDPOINT), Err(KeyError::KeyNotConfigured(_))));
        let mut altered = rotated.seal(SECRET, ENDPOINT).unwrap();
        *altered.last_mut().unwrap() ^= 1;
        assert!(matches!(rotated.reseal(&altered, ENDPOINT), Err(KeyError::Decrypt)), "opened before skipped");
        let err = KeyCipher::new(None).unwrap().reseal(&blobs[0], ENDPOINT).unwrap_err();
        assert!(matches!(err, KeyError::KeyRequired), "{err:?}");
    }

    #[test]
    fn debug_shows_key_ids_never_keys() {
        let shown = format!("{:?}", cipher(&format!("{KEY_HEX},{THIRD_KEY_B64}")));
        let third = id_of(THIRD_KEY_B64);
        assert_eq!(shown, format!("KeyCipher {{ key_ids: [KeyId({KEY_ID}), KeyId({third})], .. }}"));
        assert!(!shown.contains(&KEY_HEX[..16]) && !shown.contains(&THIRD_KEY_B64[..16]), "{shown}");
        let shown = format!("{:?}", KeyCipher::new(None).unwrap());
        assert_eq!(shown, "KeyCipher { key_ids: [], .. }");
    }
}
