//! How the service's HTTP listeners (the API's public and internal ones, the
//! dispatcher's) take connections, so that slow or many clients cannot hold
//! them:
//!
//! - at most `MAX_CONNECTIONS` connections are open at once; further clients
//!   wait in the kernel's accept queue until one closes;
//! - a request line and headers must arrive within `HEADER_READ_TIMEOUT`
//!   (which also closes a kept-alive connection idle that long), and an answer
//!   the client takes no byte of for as long closes the connection too;
//! - a whole request, its body included, must be answered within
//!   `REQUEST_TIMEOUT`, or it answers 408 `timeout` ([`request_timeout`]);
//! - with a token set, every request but the probes needs it as a bearer
//!   ([`require_token`]), and a listener off loopback needs a token
//!   ([`check_exposure`]);
//! - a request head hyper refuses before the router sees it (431: more than
//!   100 headers, or a head over about 400 KiB; 414: a target over 64 KiB;
//!   400: a request line or header it cannot parse) answers in the error
//!   shape like every other error ([`Refusal`]), not with hyper's empty body.
//!
//! On shutdown the listener closes, connections with no request in flight
//! close at once (idle ones, and ones still sending their headers), and
//! requests in flight are answered before [`serve`] returns; a connection
//! still open `REQUEST_TIMEOUT` plus `HEADER_READ_TIMEOUT` later is closed.

use std::{
    convert::Infallible,
    future::Future,
    io::{self, IoSlice},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
    time::Sleep,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::ServiceExt;

use subtle::ConstantTimeEq;
use webhooks_model::parse_duration;

/// What bounds one listener's connections.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Limits {
    /// Longest time a client may take to send a request's line and headers
    /// (and longest idle time of a kept-alive connection, and of an answer
    /// the client takes no byte of); then the connection is closed, so slow
    /// clients cannot hold it.
    #[arg(long, env = "HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// Longest time one request may take, its body included; then it
    /// answers 408 `timeout`.
    #[arg(long, env = "REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Connections a listener holds open at once; further clients wait in
    /// the accept queue until one closes.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
}

impl Limits {
    /// How long a stop waits for requests in flight: each is answered within
    /// the request timeout, and its answer either moves or is given up on
    /// within the header timeout. A backstop; connections close before.
    fn drain_deadline(&self) -> Duration {
        self.request_timeout + self.header_read_timeout
    }
}

/// What a listener refuses before a handler answers, in the service's error
/// shape `{code, message}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The request took longer than `REQUEST_TIMEOUT`: 408 `timeout`.
    Timeout(Duration),
    /// 431 `too_large`.
    HeadersTooLarge,
    /// 414 `too_large`.
    UriTooLong,
    /// 400 `invalid`: hyper could not parse the head.
    MalformedHead,
    /// 401 `invalid`: the bearer token is missing or wrong.
    BadToken,
}

impl Refused {
    /// The answer's status.
    pub fn status(self) -> StatusCode {
        match self {
            Refused::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            Refused::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Refused::UriTooLong => StatusCode::URI_TOO_LONG,
            Refused::MalformedHead => StatusCode::BAD_REQUEST,
            Refused::BadToken => StatusCode::UNAUTHORIZED,
        }
    }

    /// The answer's body.
    pub fn body(self) -> Vec<u8> {
        let (code, message) = match self {
            Refused::Timeout(limit) => {
                ("timeout", format!("The request was not completed within {} s; send it again", limit.as_secs_f64()))
            }
            Refused::HeadersTooLarge => (
                "too_large",
                "The request headers are too large (at most 100 headers and about 400 KiB with the request line)"
                    .to_owned(),
            ),
            Refused::UriTooLong => ("too_large", "The request target (path and query) is too long".to_owned()),
            Refused::MalformedHead => {
                ("invalid", "The request line or a header could not be parsed as HTTP/1.1".to_owned())
            }
            Refused::BadToken => {
                let body = serde_json::json!({
                    "code": "invalid",
                    "message": "Missing or invalid bearer token",
                    "source": { "location": "header", "key": "Authorization" },
                });
                return body.to_string().into_bytes();
            }
        };
        serde_json::json!({ "code": code, "message": message }).to_string().into_bytes()
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let mut response = (self.status(), [(header::CONTENT_TYPE, "application/json")], self.body()).into_response();
        if self != Refused::BadToken {
            // The rest of the request may stay unread, so the connection
            // closes: say so, or a client may send its next request on it
            // and lose that request.
            response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
        }
        response
    }
}

/// The internal bearer token of a listener, and the paths served without it.
#[derive(Debug, Clone)]
pub struct Token {
    /// Never blank.
    expected: Arc<str>,
    open: &'static [&'static str],
}

impl Token {
    /// `token` unless it is blank (an empty bearer never authenticates),
    /// required on every path but `open`.
    pub fn new(token: Option<&str>, open: &'static [&'static str]) -> Option<Token> {
        let token = token.filter(|token| !token.trim().is_empty())?;
        Some(Token { expected: Arc::from(token), open })
    }
}

/// Middleware: with a token, a request to any path but the open ones needs
/// `Authorization: Bearer <token>`, compared in constant time; else 401.
pub async fn require_token(State(token): State<Option<Token>>, request: Request, next: Next) -> Response {
    if let Some(token) = token
        && !token.open.contains(&request.uri().path())
    {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if presented.is_empty() || !bool::from(presented.as_bytes().ct_eq(token.expected.as_bytes())) {
            return Refused::BadToken.into_response();
        }
    }
    next.run(request).await
}

/// Refuses a listener named `setting` on `addr` that anyone on the network
/// could reach without a token.
pub fn check_exposure(setting: &str, addr: std::net::SocketAddr, token: Option<&str>) -> Result<(), String> {
    if addr.ip().to_canonical().is_loopback() || token.is_some_and(|token| !token.trim().is_empty()) {
        return Ok(());
    }
    Err(format!(
        "{setting} {addr} is not a loopback address and INTERNAL_TOKEN is not set: set a non-empty INTERNAL_TOKEN, \
         or listen on 127.0.0.1"
    ))
}

/// Serves `app` over HTTP/1.1 on `listener` within `limits` until `shutdown`
/// fires; then stops accepting, closes connections with nothing in flight,
/// and returns once the answers in flight are written (or the drain deadline
/// passed).
pub async fn serve(listener: TcpListener, app: Router, limits: Limits, shutdown: CancellationToken) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let deadline_passed = CancellationToken::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    loop {
        // A permit first: at the cap, clients wait in the kernel's accept
        // queue rather than being taken and starved.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.map_err(io::Error::other)?,
            () = shutdown.cancelled() => break,
        };
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(error) => {
                    accept_failed(error).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let in_flight = InFlight::default();
        let service = counted(app.clone(), in_flight.clone());
        let io = TokioIo::new(WriteStall::new(tcp, limits.header_read_timeout));
        let connection = http.serve_connection(io, hyper::service::service_fn(service));
        let (shutdown, deadline_passed) = (shutdown.clone(), deadline_passed.clone());
        connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let served = tokio::select! {
                served = connection.as_mut() => served,
                () = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    if in_flight.is_empty() {
                        // Idle, or still sending its head: nothing to answer.
                        Ok(())
                    } else {
                        tokio::select! {
                            served = connection.as_mut() => served,
                            () = deadline_passed.cancelled() => Ok(()),
                        }
                    }
                }
            };
            if let Err(error) = served {
                // Header and write timeouts, resets: the client's doing.
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    connections.close();
    let deadline = limits.drain_deadline();
    if tokio::time::timeout(deadline, connections.wait()).await.is_err() {
        tracing::warn!(
            open = connections.len(),
            ?deadline,
            "connections still open at the drain deadline; closing them"
        );
        deadline_passed.cancel();
        connections.wait().await;
    }
    Ok(())
}

/// After a failed accept: a connection that went away before it was taken is
/// nothing; anything else (out of file descriptors, say) is logged and waited
/// out for a second rather than retried in a hot loop.
async fn accept_failed(error: io::Error) {
    if matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accept failed; pausing for a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Middleware: a request not answered within `limit` (its body read
/// included) answers 408 `timeout` and its connection closes. Work already
/// handed to a task of its own (an idempotent POST) finishes and is stored.
pub async fn request_timeout(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => Refused::Timeout(limit).into_response(),
    }
}

/// The requests of one connection from their head until their answer is
/// written, so a stop knows which connections it may close at once.
#[derive(Debug, Clone, Default)]
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn is_empty(&self) -> bool {
        self.0.load(Ordering::Acquire) == 0
    }

    fn enter(&self) -> Exchange {
        self.0.fetch_add(1, Ordering::AcqRel);
        Exchange(self.0.clone())
    }
}

/// One request in flight; it ends when dropped.
#[derive(Debug)]
struct Exchange(Arc<AtomicUsize>);

impl Drop for Exchange {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

type Served = std::pin::Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// `app` as a hyper service that counts each request in `in_flight` from the
/// moment its head is read until its answer's body is written (or dropped).
fn counted(app: Router, in_flight: InFlight) -> impl Fn(hyper::Request<hyper::body::Incoming>) -> Served + Clone {
    move |request| {
        let exchange = in_flight.enter();
        let app = app.clone();
        Box::pin(async move {
            let response = app.oneshot(request.map(Body::new)).await?;
            Ok(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &exchange;
                    frame
                }))
            }))
        })
    }
}

/// hyper answers a request head it cannot take itself, before any service
/// sees a request, and closes the connection: 431, 414 or 400 with an empty
/// body. [`WriteStall`] recognises such an answer as it is written and writes
/// this instead: the same status with the contract's error body.
#[derive(Debug)]
struct Refusal {
    /// The whole answer: head and body.
    bytes: Vec<u8>,
    /// How much of it is written.
    written: usize,
}

impl Refusal {
    /// The rewritten answer, when `head` starts with one of hyper's automatic
    /// answers, and the length of that answer's head (all of it: its body is
    /// empty). An answer of the router always carries `Content-Type`, and a
    /// body chunk cannot pass for a head: the bodies are JSON, whose strings
    /// escape CR and LF.
    fn of(head: &[u8]) -> Option<(Refusal, usize)> {
        if !(head.starts_with(b"HTTP/1.1 ") || head.starts_with(b"HTTP/1.0 ")) {
            return None;
        }
        let error = match head.get(9..13)? {
            b"431 " => Refused::HeadersTooLarge,
            b"414 " => Refused::UriTooLong,
            b"400 " => Refused::MalformedHead,
            _ => return None,
        };
        let end = head.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let text = std::str::from_utf8(&head[..end]).ok()?;
        let lines = text.split("\r\n").skip(1).filter(|line| !line.is_empty());
        let mut kept = Vec::new();
        for line in lines {
            let name = line.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
            match name.as_str() {
                "content-type" => return None,
                "content-length" | "connection" | "transfer-encoding" => {}
                _ => kept.push(line),
            }
        }
        let body = error.body();
        let status = error.status();
        let mut bytes = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or_default(),
            body.len()
        )
        .into_bytes();
        for line in kept {
            bytes.extend_from_slice(line.as_bytes());
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"\r\n");
        bytes.extend_from_slice(&body);
        tracing::debug!(%status, "request head refused");
        Some((Refusal { bytes, written: 0 }, end))
    }
}

/// A TCP stream whose writes fail when the client takes no byte for `limit`:
/// an answer the client does not read cannot hold a connection (and a slot
/// of `MAX_CONNECTIONS`) for ever. It also puts hyper's automatic answers
/// into the error shape ([`Refusal`]).
#[derive(Debug)]
struct WriteStall {
    stream: TcpStream,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
    /// A rewritten automatic answer: once it is out, nothing else is (hyper
    /// closes the connection after it).
    refusal: Option<Refusal>,
}

impl WriteStall {
    fn new(stream: TcpStream, limit: Duration) -> WriteStall {
        WriteStall { stream, limit, stalled: None, refusal: None }
    }

    /// Takes an automatic answer of hyper's that starts `bufs` in place of
    /// writing it: how many bytes of `bufs` that answer is. hyper encodes a
    /// head whole before it writes it, into a buffer of its own: the first.
    fn intercept(&mut self, bufs: &[IoSlice<'_>]) -> Option<usize> {
        let first = bufs.iter().find(|b| !b.is_empty())?;
        let (refusal, consumed) = Refusal::of(first)?;
        self.refusal = Some(refusal);
        Some(consumed)
    }

    /// Writes what is left of a rewritten answer.
    fn poll_refusal(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let Some(refusal) = &self.refusal else { return Poll::Ready(Ok(())) };
            if refusal.written == refusal.bytes.len() {
                return Poll::Ready(Ok(()));
            }
            let polled = Pin::new(&mut self.stream).poll_write(cx, &refusal.bytes[refusal.written..]);
            let n = ready!(self.watch(polled, cx))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if let Some(refusal) = &mut self.refusal {
                refusal.written += n;
            }
        }
    }

    /// A write of `len` bytes, given `bufs`: an automatic answer is taken in
    /// place of writing it, and once a rewritten answer is out, nothing more
    /// reaches the client. `None`: write as usual.
    fn poll_replaced(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
        len: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        if self.refusal.is_none() {
            let consumed = self.intercept(bufs)?;
            return Some(Poll::Ready(Ok(consumed)));
        }
        Some(self.poll_refusal(cx).map_ok(|()| len))
    }

    /// Passes a write's outcome on; a write pending longer than `limit` since
    /// the last progress fails with `TimedOut`.
    fn watch<T>(&mut self, polled: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if stalled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client stopped taking the answer")));
        }
        Poll::Pending
    }
}

impl AsyncRead for WriteStall {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteStall {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Some(replaced) = self.poll_replaced(cx, &[IoSlice::new(buf)], buf.len()) {
            return replaced;
        }
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch(polled, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len = bufs.iter().map(|b| b.len()).sum();
        if let Some(replaced) = self.poll_replaced(cx, bufs, len) {
            return replaced;
        }
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_refusal(cx))?;
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.watch(polled, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_refusal(cx))?;
        let polled = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.watch(polled, cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn hyper_s_empty_refusals_are_rewritten_and_answers_of_the_router_are_not() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Sun, 22 Nov 2026 10:00:00 GMT\r\n\r\n";
        let (refusal, consumed) = Refusal::of(head).unwrap();
        assert_eq!(consumed, head.len());
        let text = String::from_utf8(refusal.bytes).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{head}");
        assert!(head.contains("content-type: application/json") && head.contains("connection: close"), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        assert!(head.contains("date: Sun, 22 Nov 2026") && !head.contains("content-length: 0"), "{head}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], "too_large");

        assert!(
            Refusal::of(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                .is_none()
        );
        assert!(Refusal::of(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(Refusal::of(b"{\"code\":\"HTTP/1.1 431 \"}").is_none());
    }

    /// Sends `request` to a server of `limits` and returns the whole answer.
    async fn exchange(request: Vec<u8>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let limits = Limits {
            header_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            max_connections: 8,
        };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app, limits, shutdown.clone()));
        let mut client = TcpStream::connect(address).await.unwrap();
        client.write_all(&request).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut answer)).await.unwrap().unwrap();
        shutdown.cancel();
        server.await.unwrap().unwrap();
        String::from_utf8(answer).unwrap()
    }

    #[tokio::test]
    async fn too_many_headers_answer_431_in_the_error_shape() {
        let mut request = b"GET / HTTP/1.1\r\nhost: x\r\n".to_vec();
        for i in 0..150 {
            request.extend_from_slice(format!("x-h{i}: v\r\n").as_bytes());
        }
        request.extend_from_slice(b"\r\n");
        let answer = exchange(request).await;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{answer}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], "too_large", "{answer}");
    }

    #[tokio::test]
    async fn a_malformed_head_answers_400_in_the_error_shape_and_good_ones_pass() {
        let answer = exchange(b"GET / HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n".to_vec()).await;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 "), "{answer}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], "invalid", "{answer}");

        let answer = exchange(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".to_vec()).await;
        assert!(answer.starts_with("HTTP/1.1 200 ") && answer.ends_with("\r\n\r\nok"), "{answer}");
    }
}
