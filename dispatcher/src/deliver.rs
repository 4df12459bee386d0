//! One HTTP delivery attempt: sign afresh, POST, read a capped response.

use std::time::{Duration, Instant};

use chrono::Utc;
use reqwest::{
    Client, StatusCode,
    header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER, USER_AGENT},
};
use webhooks_net::guard as net;

use crate::cache::Endpoint;

/// The `User-Agent` of every delivery.
pub const USER_AGENT_VALUE: &str = concat!("webhooks-dispatcher/", env!("CARGO_PKG_VERSION"));
/// The receiver's idempotency key header.
pub const WEBHOOK_ID_HEADER: &str = "X-Webhook-Id";
/// How much of a response body is read.
const READ_CAP: usize = 64 * 1024;
/// How much of it is kept in the log.
const LOG_CAP: usize = 4 * 1024;

/// What came of one attempt.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub status: Option<u16>,
    pub response_body: Option<String>,
    /// A short reason when no acceptable response came.
    pub error: Option<&'static str>,
    /// What failed, safe to show (see `webhooks_net::guard::describe_reqwest_error`):
    /// for a non-2xx answer its status line.
    pub error_detail: Option<String>,
    pub duration: Duration,
    /// The receiver's `Retry-After`, if it sent one.
    pub retry_after: Option<Duration>,
}

impl Attempt {
    /// Any 2xx is success.
    pub fn succeeded(&self) -> bool {
        self.error.is_none() && self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// POSTs `body` to the endpoint, signed at `now` with its keys; `timeout` is
/// the client's (`DELIVERY_TIMEOUT`), named in the log when it runs out.
pub async fn attempt(
    client: &Client,
    endpoint: &Endpoint,
    event_id: &str,
    body: &str,
    allow_private: bool,
    now: chrono::DateTime<Utc>,
    timeout: Duration,
) -> Attempt {
    let started = Instant::now();
    let failed = |error: &'static str, detail: String| Attempt {
        status: None,
        response_body: None,
        error: Some(error),
        error_detail: Some(detail),
        duration: started.elapsed(),
        retry_after: None,
    };
    // The resolver guards names; IP literals never reach it.
    if let Err(error) = net::check_literal_host(&endpoint.url, allow_private) {
        return failed(error.code(), format!("not sent: {error}"));
    }
    let mut request = client
        .post(endpoint.url.clone())
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE))
        .header(WEBHOOK_ID_HEADER, event_id);
    for (name, value) in endpoint.signer.headers(event_id, now, body.as_bytes()) {
        request = request.header(name, value);
    }
    let request = request.body(body.to_owned());
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(error) => {
            let detail = net::describe_reqwest_error(&error, timeout);
            return failed(net::classify_reqwest_error(&error), detail);
        }
    };
    let status = response.status();
    let retry_after = retry_after(&response);
    let mut read = Vec::new();
    let mut error = None;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = READ_CAP - read.len();
                read.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if read.len() >= READ_CAP {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => {
                // The status is the answer; a body cut short (say, a close
                // without TLS close_notify) does not change it, unless it ran
                // past the timeout.
                if e.is_timeout() {
                    error = Some("timeout");
                }
                break;
            }
        }
    }
    let redirect = status.is_redirection().then_some("redirect");
    let error = error.or(redirect);
    let error_detail = match error {
        Some("timeout") => Some(format!(
            "timed out: {} came, the body did not end within {}s",
            status_line(status),
            timeout.as_secs_f64()
        )),
        Some(_) => Some(format!("{}: redirects are not followed", status_line(status))),
        None if !status.is_success() => Some(status_line(status)),
        None => None,
    };
    Attempt {
        status: Some(status.as_u16()),
        response_body: Some(loggable(&read)),
        error,
        error_detail,
        duration: started.elapsed(),
        retry_after,
    }
}

/// `HTTP 503 Service Unavailable`: the status line as the log shows it (the
/// reason phrase is the standard one, never the receiver's text).
fn status_line(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    }
}

/// What of a response body goes in the log: text without NUL (which PostgreSQL
/// text refuses), at most `LOG_CAP` bytes, cut at a character boundary.
fn loggable(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(LOG_CAP)]).replace('\0', "\u{fffd}");
    let mut end = text.len().min(LOG_CAP);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// `Retry-After` in seconds or as an HTTP date; only on 429 and 503, where it
/// means "come back later".
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    if !matches!(response.status(), StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
        return None;
    }
    let value = response.headers().get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    (at.with_timezone(&Utc) - Utc::now()).to_std().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_bodies_are_capped_text_without_nul() {
        let body = [b"ok\0".as_slice(), &[0xff; 10], "é".repeat(3000).as_bytes()].concat();
        let logged = loggable(&body);
        assert!(logged.len() <= LOG_CAP, "{}", logged.len());
        assert!(!logged.contains('\0'));
        assert!(logged.starts_with("ok\u{fffd}"));
        assert_eq!(loggable(b"plain"), "plain");
    }
}
