//! A counting HTTPS receiver for long and large runs: where
//! [`crate::Receiver`] keeps every request, this one keeps a count per event
//! id, and checks each request as it comes the way a user's receiver would:
//! the signature against the endpoint's public key (with the replay window),
//! `X-Webhook-Id` against the body, and that the event is the endpoint's
//! developer's and of a category it asked for. A request that fails a check
//! is answered 400 and not counted as delivered.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::Context;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use webhooks_model::{Category, categories_include};
use webhooks_signature::{platform::SIGNATURE_HEADER, platform::Verifier};

use crate::{
    ca::{LOCAL_NAMES, TestCa},
    receiver::{accept_loop, plain},
};

/// An event id (`wh_` + 32 hex digits) as a number: a compact key.
pub fn event_key(event_id: &str) -> Option<u128> {
    let hex = event_id.strip_prefix("wh_")?;
    if hex.len() != 32 {
        return None;
    }
    u128::from_str_radix(hex, 16).ok()
}

/// What the endpoint behind a tally is: whose, which categories, which key.
#[derive(Debug)]
struct Expect {
    verifier: Verifier,
    developer: Uuid,
    categories: Vec<Category>,
}

/// What a tally has seen.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Requests answered 2xx, per event.
    pub delivered: HashMap<u128, u32>,
    /// Requests answered 503 on purpose ([`Tally::start`]'s `fail_every`).
    pub refused: u64,
    /// Requests whose signature did not verify (answered 400).
    pub bad_signature: u64,
    /// Requests whose body or headers were wrong, or meant for another
    /// developer or category (answered 400).
    pub misrouted: u64,
    /// Requests that came before the endpoint was known (answered 400).
    pub unexpected_early: u64,
    /// The first few problems, for the report.
    pub samples: Vec<String>,
}

impl Counts {
    fn problem(&mut self, text: String) {
        if self.samples.len() < 5 {
            self.samples.push(text);
        }
    }
}

#[derive(Debug)]
struct State {
    expect: OnceLock<Expect>,
    fail_every: u64,
    requests: AtomicU64,
    counts: Mutex<Counts>,
}

/// A counting HTTPS server on `127.0.0.1:0`, with a certificate from the
/// CA the system trusts. It stops when dropped.
#[derive(Debug)]
pub struct Tally {
    addr: SocketAddr,
    state: Arc<State>,
    shutdown: CancellationToken,
}

impl Tally {
    /// Starts a tally; with `fail_every` = n > 0 it answers every n-th
    /// request 503 (a receiver's passing trouble, which the sender retries).
    pub async fn start(ca: &TestCa, fail_every: u64) -> anyhow::Result<Tally> {
        Tally::start_at(ca, fail_every, IpAddr::from([127, 0, 0, 1])).await
    }

    /// [`Tally::start`] on a free port of `ip` (an address of this host
    /// other receivers' senders reach), its certificate valid for `ip` too.
    pub async fn start_at(ca: &TestCa, fail_every: u64, ip: IpAddr) -> anyhow::Result<Tally> {
        let ip_name = ip.to_string();
        let mut names = LOCAL_NAMES.to_vec();
        names.push(&ip_name);
        let acceptor = TlsAcceptor::from(ca.issue(&names).server_config()?);
        let listener = TcpListener::bind((ip, 0)).await.context("bind a tally receiver")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            expect: OnceLock::new(),
            fail_every,
            requests: AtomicU64::new(0),
            counts: Mutex::default(),
        });
        let shutdown = CancellationToken::new();
        let answering = state.clone();
        tokio::spawn(accept_loop(listener, acceptor, shutdown.clone(), move |request| {
            answer(answering.clone(), request)
        }));
        Ok(Tally { addr, state, shutdown })
    }

    /// `https://localhost:<port>/hook`, or the address it listens on when
    /// that is not loopback.
    pub fn url(&self) -> String {
        match self.addr.ip() {
            ip if ip.is_loopback() => format!("https://localhost:{}/hook", self.addr.port()),
            _ => format!("https://{}/hook", self.addr),
        }
    }

    /// Tells the tally which endpoint it serves: its `Webhook` as the API
    /// answered it (for `public_key`), its developer and its categories
    /// (empty: all). Call it before switching the endpoint on.
    pub fn serve_endpoint(&self, webhook: &Value, developer: Uuid, categories: &[Category]) -> anyhow::Result<()> {
        let pem = webhook["public_key"].as_str().context("the Webhook has no public_key")?;
        let verifier = Verifier::from_pem(pem).context("the endpoint's public_key")?;
        let expect = Expect { verifier, developer, categories: categories.to_vec() };
        self.state.expect.set(expect).map_err(|_| anyhow::anyhow!("the tally serves an endpoint already"))
    }

    /// Every request so far, whatever its answer.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }

    /// How many distinct events were delivered (answered 2xx).
    pub fn distinct(&self) -> usize {
        self.lock().delivered.len()
    }

    /// Whether `event` was delivered.
    pub fn has(&self, event: u128) -> bool {
        self.lock().delivered.contains_key(&event)
    }

    /// A copy of the counts.
    pub fn counts(&self) -> Counts {
        self.lock().clone()
    }

    /// Runs `f` on the counts, without copying them.
    pub fn with_counts<T>(&self, f: impl FnOnce(&Counts) -> T) -> T {
        f(&self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.state.counts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

async fn answer(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let Ok(body) = body.collect().await.map(|c| c.to_bytes()) else { return Ok(plain(StatusCode::BAD_REQUEST)) };
    let n = state.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (id_header, signature) = (header("x-webhook-id").unwrap_or_default(), header(SIGNATURE_HEADER));

    let Some(expect) = state.expect.get() else {
        let mut counts = state.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.unexpected_early += 1;
        counts.problem(format!("{id_header}: arrived before the endpoint was known"));
        return Ok(plain(StatusCode::BAD_REQUEST));
    };
    let verified = signature
        .as_deref()
        .map(|s| expect.verifier.verify(s, &body, Some(now_ms())).map_err(|e| e.to_string()))
        .unwrap_or_else(|| Err(format!("no {SIGNATURE_HEADER}")));
    let checked = check_body(&body, &id_header, expect);
    let refuse = state.fail_every > 0 && n.is_multiple_of(state.fail_every);

    let mut counts = state.counts.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(error) = verified {
        counts.bad_signature += 1;
        counts.problem(format!("{id_header}: signature: {error}"));
        return Ok(plain(StatusCode::BAD_REQUEST));
    }
    let event = match checked {
        Ok(event) => event,
        Err(error) => {
            counts.misrouted += 1;
            counts.problem(format!("{id_header}: {error}"));
            return Ok(plain(StatusCode::BAD_REQUEST));
        }
    };
    if refuse {
        counts.refused += 1;
        return Ok(plain(StatusCode::SERVICE_UNAVAILABLE));
    }
    *counts.delivered.entry(event).or_default() += 1;
    Ok(plain(StatusCode::OK))
}

/// Checks a delivery's body against its `X-Webhook-Id` and the endpoint;
/// returns the event's key.
fn check_body(body: &[u8], id_header: &str, expect: &Expect) -> Result<u128, String> {
    let event: Value = serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let id = event["event_id"].as_str().unwrap_or_default();
    if id != id_header {
        return Err(format!("X-Webhook-Id {id_header:?} but event_id {id:?}"));
    }
    let key = event_key(id).ok_or_else(|| format!("event_id {id:?} is not wh_ + 32 hex"))?;
    let developer = event["event_developer_id"].as_str().unwrap_or_default();
    if developer != expect.developer.to_string() {
        return Err(format!("an event of developer {developer}, not of {}", expect.developer));
    }
    let category = event["event_category"].as_str().unwrap_or_default();
    match category.parse::<Category>() {
        Ok(category) if categories_include(&expect.categories, category) => Ok(key),
        _ => Err(format!("category {category:?}, which the endpoint did not ask for")),
    }
}
