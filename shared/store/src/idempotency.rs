//! Stored responses for `Idempotency-Key` (API.md §3): per developer, 24 hours.

use std::time::Duration;

/// How long a stored answer is replayed.
pub const IDEMPOTENCY_KEY_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// How long a claim may stay unanswered before another request takes it over
/// (its process died).
pub const IDEMPOTENCY_CLAIM_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// A response kept for replay.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// What claiming a key found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The key is new (or expired): this request runs and records its answer.
    Claimed,
    /// The same key came with another request.
    Mismatch,
    /// The first request with this key has not finished yet.
    InProgress,
    /// The answer to replay.
    Completed(StoredResponse),
}

/// A stored key's fingerprint, status (`None` while its request runs) and body.
pub(crate) type ExistingClaim = (Vec<u8>, Option<u16>, Option<Vec<u8>>);

impl Claim {
    /// What an existing claim means for a request with `fingerprint`, given
    /// the key's row if it still has one.
    pub(crate) fn of_existing(fingerprint: &[u8], row: Option<ExistingClaim>) -> Claim {
        match row {
            // Released between the claim and this read: the caller may try again.
            None => Claim::InProgress,
            Some((stored, _, _)) if stored != fingerprint => Claim::Mismatch,
            Some((_, Some(status), body)) => {
                Claim::Completed(StoredResponse { status, body: body.unwrap_or_default() })
            }
            Some((_, None, _)) => Claim::InProgress,
        }
    }
}
