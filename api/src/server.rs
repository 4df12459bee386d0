//! How both listeners take connections, so that slow or many clients cannot
//! hold them:
//!
//! - at most `MAX_CONNECTIONS` connections are open at once; further clients
//!   wait in the kernel's accept queue until one closes;
//! - a request line and headers must arrive within `HEADER_READ_TIMEOUT`
//!   (which also closes a kept-alive connection idle that long), and an answer
//!   the client takes no byte of for as long closes the connection too;
//! - a whole request, its body included, must be answered within
//!   `REQUEST_TIMEOUT`, or it answers 408 `timeout` ([`request_timeout`]).
//!
//! On shutdown the listener closes, connections with no request in flight
//! close at once (idle ones, and ones still sending their headers), and
//! requests in flight are answered before [`serve`] returns; a connection
//! still open `REQUEST_TIMEOUT` plus `HEADER_READ_TIMEOUT` later is closed.

use std::{
    convert::Infallible,
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
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

use crate::{config::Config, error::ApiError};

/// What bounds one listener's connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `HEADER_READ_TIMEOUT`: for a request's head, and for an answer the
    /// client does not take.
    pub header_read_timeout: Duration,
    /// `REQUEST_TIMEOUT`.
    pub request_timeout: Duration,
    /// `MAX_CONNECTIONS`.
    pub max_connections: usize,
}

impl Limits {
    /// The limits `config` sets.
    pub fn of(config: &Config) -> Limits {
        Limits {
            header_read_timeout: config.header_read_timeout,
            request_timeout: config.request_timeout,
            max_connections: config.max_connections,
        }
    }

    /// How long a stop waits for requests in flight: each is answered within
    /// the request timeout, and its answer either moves or is given up on
    /// within the header timeout. A backstop; connections close before.
    fn drain_deadline(&self) -> Duration {
        self.request_timeout + self.header_read_timeout
    }
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
        Err(_) => ApiError::Timeout(limit).into_response(),
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

/// A TCP stream whose writes fail when the client takes no byte for `limit`:
/// an answer the client does not read cannot hold a connection (and a slot
/// of `MAX_CONNECTIONS`) for ever.
#[derive(Debug)]
struct WriteStall {
    stream: TcpStream,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl WriteStall {
    fn new(stream: TcpStream, limit: Duration) -> WriteStall {
        WriteStall { stream, limit, stalled: None }
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
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch(polled, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.watch(polled, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.watch(polled, cx)
    }
}
