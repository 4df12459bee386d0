//! An HTTPS webhook receiver for tests: records every request, answers as the
//! test scripts it, and verifies signatures the way a user's receiver would.

use std::{
    collections::VecDeque,
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Context;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::Notify};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use webhooks_signature::{platform::SIGNATURE_HEADER, platform::Verifier};

use crate::{
    WAIT,
    ca::{LOCAL_NAMES, ServerCert, TestCa},
};

/// One answer of the receiver.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Never answer (until the receiver is dropped).
    pub hang: bool,
}

impl Reply {
    /// An empty answer with `status`.
    pub fn status(status: u16) -> Reply {
        Reply { status, headers: Vec::new(), body: Bytes::new(), delay: Duration::ZERO, hang: false }
    }

    /// `200 OK`.
    pub fn ok() -> Reply {
        Reply::status(200)
    }

    /// A redirect to `location`.
    pub fn redirect(status: u16, location: &str) -> Reply {
        Reply::status(status).header("Location", location)
    }

    /// An answer that never comes.
    pub fn hang() -> Reply {
        Reply { hang: true, ..Reply::ok() }
    }

    /// The same answer with a header added.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The same answer with `body`.
    pub fn body(mut self, body: impl Into<Bytes>) -> Reply {
        self.body = body.into();
        self
    }

    /// The same answer, given after `delay`.
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

/// A request as the receiver got it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query.
    pub path: String,
    pub headers: HeaderMap,
    /// The raw body, exactly as received: what signatures cover.
    pub body: Bytes,
    /// When the request was complete, by the receiver's clock.
    pub received_at: SystemTime,
    /// The status it was answered with (answered once recorded).
    pub answered: u16,
}

impl RecordedRequest {
    /// A header's value, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body).context("request body is not JSON")
    }

    /// `received_at` in unix milliseconds.
    pub fn received_at_ms(&self) -> i64 {
        self.received_at.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// Decides an answer from the request and every request before it.
pub type Responder = Arc<dyn Fn(&RecordedRequest, &[RecordedRequest]) -> Reply + Send + Sync>;

struct State {
    requests: Mutex<Vec<RecordedRequest>>,
    arrived: Notify,
    script: Mutex<VecDeque<Reply>>,
    fallback: Mutex<Reply>,
    responder: Mutex<Option<Responder>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("requests", &self.requests).finish_non_exhaustive()
    }
}

/// An HTTPS server on `127.0.0.1:0`. It stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    addr: SocketAddr,
    state: Arc<State>,
    shutdown: CancellationToken,
}

impl Receiver {
    /// A receiver presenting a certificate from `ca` for `localhost` and the
    /// loopback addresses.
    pub async fn start(ca: &TestCa) -> anyhow::Result<Receiver> {
        Receiver::with_cert(ca.issue(LOCAL_NAMES)).await
    }

    /// A receiver presenting `cert`, whatever it is worth.
    pub async fn with_cert(cert: ServerCert) -> anyhow::Result<Receiver> {
        let acceptor = TlsAcceptor::from(cert.server_config()?);
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind receiver")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            requests: Mutex::default(),
            arrived: Notify::new(),
            script: Mutex::default(),
            fallback: Mutex::new(Reply::ok()),
            responder: Mutex::default(),
        });
        let shutdown = CancellationToken::new();
        let answering = state.clone();
        tokio::spawn(accept_loop(listener, acceptor, shutdown.clone(), move |request| {
            answer(answering.clone(), request)
        }));
        Ok(Receiver { addr, state, shutdown })
    }

    /// `https://localhost:<port>/hook`.
    pub fn url(&self) -> String {
        self.url_with_host("localhost")
    }

    /// `https://<host>:<port>/hook`; IPv6 hosts need their brackets.
    pub fn url_with_host(&self, host: &str) -> String {
        format!("https://{host}:{}/hook", self.addr.port())
    }

    /// The socket address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Answers every request not covered by a [`Receiver::reply_sequence`] with `reply`.
    pub fn reply_always(&self, reply: Reply) {
        *self.state.fallback.lock().unwrap_or_else(|e| e.into_inner()) = reply;
    }

    /// Answers every request not covered by a [`Receiver::reply_sequence`] as
    /// `responder` decides, from the request and all those before it (in
    /// place of [`Receiver::reply_always`]).
    pub fn reply_with(
        &self,
        responder: impl Fn(&RecordedRequest, &[RecordedRequest]) -> Reply + Send + Sync + 'static,
    ) {
        *self.state.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(responder));
    }

    /// Answers the next requests with `replies`, in order, then falls back to
    /// [`Receiver::reply_always`]'s answer (200 by default).
    pub fn reply_sequence(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.script.lock().unwrap_or_else(|e| e.into_inner()).extend(replies);
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.requests.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many requests arrived so far.
    pub fn count(&self) -> usize {
        self.state.requests.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Waits until at least `n` requests arrived (up to [`WAIT`]) and returns all of them.
    pub async fn wait_for(&self, n: usize) -> anyhow::Result<Vec<RecordedRequest>> {
        self.wait_for_within(n, WAIT).await
    }

    /// Waits until at least `n` requests arrived, up to `timeout`.
    pub async fn wait_for_within(&self, n: usize, timeout: Duration) -> anyhow::Result<Vec<RecordedRequest>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let arrived = self.state.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let count = self.count();
            if count >= n {
                return Ok(self.requests());
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                anyhow::bail!("the receiver got {} of {n} requests within {timeout:?}", self.count());
            }
        }
    }

    /// Checks every recorded request's `X-Webhook-Signature` against the
    /// endpoint's PEM public key, with the 10-minute replay window measured
    /// from when the request arrived. Returns the signed timestamps.
    pub fn verify_with(&self, public_key_pem: &str) -> anyhow::Result<Vec<i64>> {
        let verifier = Verifier::from_pem(public_key_pem).context("the endpoint's public_key")?;
        self.requests()
            .iter()
            .enumerate()
            .map(|(i, request)| {
                let header = request
                    .header(SIGNATURE_HEADER)
                    .with_context(|| format!("request {i} has no {SIGNATURE_HEADER} header"))?;
                verifier
                    .verify(header, &request.body, Some(request.received_at_ms()))
                    .with_context(|| format!("request {i}: signature {header:?} does not verify"))
            })
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Serves HTTPS on `listener` until `shutdown`, one task per connection,
/// answering each request with `answer`: the loop every test receiver runs.
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shutdown: CancellationToken,
    answer: F,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    loop {
        let tcp = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(error) => {
                    tracing::debug!(%error, "receiver accept failed");
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, answer, shutdown) = (acceptor.clone(), answer.clone(), shutdown.clone());
        tokio::spawn(async move {
            let serve = async {
                // Handshakes fail on purpose in certificate tests.
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = service_fn(answer);
                if let Err(error) = http1::Builder::new().serve_connection(TokioIo::new(tls), service).await {
                    tracing::debug!(%error, "receiver connection ended");
                }
            };
            tokio::select! {
                () = serve => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
}

async fn answer(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(plain(StatusCode::BAD_REQUEST)),
    };
    let mut recorded = RecordedRequest {
        method: parts.method.to_string(),
        path: parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_owned(), ToString::to_string),
        headers: parts.headers,
        body,
        received_at: SystemTime::now(),
        answered: 0,
    };
    let responder = state.responder.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let next = state.script.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
    // Decided and recorded under one lock: a responder sees every earlier
    // request with its answer.
    let reply = {
        let mut requests = state.requests.lock().unwrap_or_else(|e| e.into_inner());
        let reply = match (next, responder) {
            (Some(reply), _) => reply,
            (None, Some(responder)) => responder(&recorded, &requests),
            (None, None) => state.fallback.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        };
        recorded.answered = reply.status;
        requests.push(recorded);
        reply
    };
    state.arrived.notify_waiters();

    if reply.hang {
        std::future::pending::<()>().await;
    }
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response = Response::new(Full::new(reply.body));
    *response.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in reply.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            response.headers_mut().append(name, value);
        }
    }
    Ok(response)
}

/// An answer with `status` and no body.
pub(crate) fn plain(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use webhooks_keys::generate_rsa_2048;
    use webhooks_net::tls;
    use webhooks_signature::platform::Signer;

    use super::*;

    fn client(ca: &TestCa) -> reqwest::Client {
        crate::init();
        let roots = tls::root_store(Some(ca.pem_path())).expect("roots");
        let config = tls::client_config(roots).expect("client config");
        tls::delivery_client(config, true, Duration::from_secs(10), Duration::from_secs(5)).expect("client")
    }

    fn now_ms() -> i64 {
        i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
    }

    #[tokio::test]
    async fn records_requests_and_verifies_signatures() {
        let ca = TestCa::new().unwrap();
        let receiver = Receiver::start(&ca).await.unwrap();
        let client = client(&ca);
        let pair = generate_rsa_2048().unwrap();
        let signer = Signer::from_pkcs8_der(&pair.private_pkcs8_der).unwrap();

        let body = br#"{"event_id":"wh_1"}"#;
        let response = client
            .post(receiver.url())
            .header(SIGNATURE_HEADER, signer.sign(now_ms(), body))
            .header("Content-Type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);

        let requests = receiver.wait_for(1).await.unwrap();
        assert_eq!(requests[0].method, "POST");
        assert_eq!(requests[0].path, "/hook");
        assert_eq!(&requests[0].body[..], body);
        assert_eq!(requests[0].header("content-type"), Some("application/json"));
        assert_eq!(receiver.verify_with(&pair.public_key_pem).unwrap().len(), 1);

        // Another key, a tampered body and a stale timestamp are all caught.
        let other = generate_rsa_2048().unwrap();
        assert!(receiver.verify_with(&other.public_key_pem).is_err());
        let stale = now_ms() - 11 * 60 * 1000;
        client
            .post(receiver.url())
            .header(SIGNATURE_HEADER, signer.sign(stale, body))
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        receiver.wait_for(2).await.unwrap();
        assert!(receiver.verify_with(&pair.public_key_pem).is_err());
    }

    #[tokio::test]
    async fn answers_as_scripted() {
        let ca = TestCa::new().unwrap();
        let receiver = Receiver::start(&ca).await.unwrap();
        let client = client(&ca);
        receiver.reply_always(Reply::status(204));
        receiver.reply_sequence([
            Reply::status(503).body("busy"),
            Reply::redirect(302, "https://localhost:1/elsewhere"),
            Reply::ok().after(Duration::from_millis(200)),
        ]);

        let first = client.post(receiver.url()).body("1").send().await.unwrap();
        assert_eq!(first.status(), 503);
        assert_eq!(first.text().await.unwrap(), "busy");
        let second = client.post(receiver.url()).body("2").send().await.unwrap();
        assert_eq!(second.status(), 302, "the delivery client follows no redirect");
        assert_eq!(second.headers()["location"], "https://localhost:1/elsewhere");
        let started = Instant::now();
        let third = client.post(receiver.url()).body("3").send().await.unwrap();
        assert_eq!(third.status(), 200);
        assert!(started.elapsed() >= Duration::from_millis(200));
        let fourth = client.post(receiver.url()).body("4").send().await.unwrap();
        assert_eq!(fourth.status(), 204);
        assert_eq!(receiver.count(), 4);

        receiver.reply_always(Reply::hang());
        let hung = client.post(receiver.url()).timeout(Duration::from_millis(300)).body("5").send().await;
        assert!(hung.unwrap_err().is_timeout());
        assert_eq!(receiver.wait_for(5).await.unwrap().len(), 5, "a hung request is still recorded");
    }

    #[tokio::test]
    async fn wait_for_gives_up_after_its_timeout() {
        let ca = TestCa::new().unwrap();
        let receiver = Receiver::start(&ca).await.unwrap();
        assert!(receiver.wait_for_within(1, Duration::from_millis(100)).await.is_err());
    }

    #[tokio::test]
    async fn bad_certificates_fail_the_handshake() {
        let ca = TestCa::new().unwrap();
        let client = client(&ca);
        for cert in [
            TestCa::self_signed(LOCAL_NAMES),
            ca.issue_expired(LOCAL_NAMES),
            ca.issue_for_other_host(),
            TestCa::new().unwrap().issue(LOCAL_NAMES),
        ] {
            let receiver = Receiver::with_cert(cert).await.unwrap();
            assert!(client.post(receiver.url()).body("x").send().await.is_err());
            assert_eq!(receiver.count(), 0);
        }
        let good = Receiver::start(&ca).await.unwrap();
        client.post(good.url_with_host("127.0.0.1")).body("x").send().await.unwrap();
    }
}
