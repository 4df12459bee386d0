//! The objects of the service's contract and the facts around them: what
//! users see in responses, what receivers get in deliveries, public ids,
//! times, lanes and queue names, endpoint changes and the retry schedule.
//! Every other crate of the workspace builds on this one.

mod changes;
pub mod ids;
mod objects;
mod retry;
pub mod time;
mod topology;

pub use changes::{ChangeKind, EndpointChanged};
pub use objects::*;
pub use retry::{DEFAULT_RETRY_SCHEDULE, RetrySchedule, parse_duration};
pub use topology::{Lane, RetryRoute, Topology};

/// Whether two endpoint URLs name the same target once normalised (host case,
/// the default port, an empty path, percent-encoding the parser settles): a
/// change from one to the other is no change. A string that does not parse
/// is equal only to itself.
pub fn same_url(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (url::Url::parse(a), url::Url::parse(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_url_are_the_same_url() {
        assert!(same_url("https://Example.COM:443/path", "https://example.com/path"));
        assert!(same_url("HTTPS://example.com", "https://example.com/"));
        assert!(same_url("https://example.com/a/../b", "https://example.com/b"));
        assert!(!same_url("https://example.com/path", "https://example.com/path/"));
        assert!(!same_url("https://example.com:8443/path", "https://example.com/path"));
        assert!(!same_url("https://example.com/path?a=1", "https://example.com/path"));
        assert!(same_url("not a url", "not a url"));
        assert!(!same_url("not a url", "https://example.com/"));
    }
}
