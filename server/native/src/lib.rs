//! tierserve's native gRPC transport.
//!
//! HTTP/2 and gRPC framing run here, on a small tokio runtime; the RPCs themselves are
//! answered in Python (`server/grpc_native.py`), on the server's event loop, by the same
//! code as the `grpc.aio` front end.  No thread of this module ever takes the GIL: a request
//! is queued and an eventfd is written when the queue was empty; the event loop, woken by
//! the eventfd, takes every queued request at once (`take`) and answers each with `reply`.
//! A call still unanswered at its `grpc-timeout`, or cancelled by the client, stops being
//! `pending` (Python then drops it if it has not run) and the transport answers the deadline
//! itself.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Read;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

const SERVICE_PREFIX: &str = "/inference.GRPCInferenceService/";

/// gRPC status codes used by the transport itself.
const DEADLINE_EXCEEDED: u32 = 4;
const UNIMPLEMENTED: u32 = 12;
const INTERNAL: u32 = 13;
const RESOURCE_EXHAUSTED: u32 = 8;
const UNAVAILABLE: u32 = 14;

/// One RPC waiting for Python.
struct Call {
    id: u64,
    method: String,
    message: Bytes,
    authorization: Option<String>,
}

/// Python's answer: a gRPC status, its message, and (status 0) the serialized response.
struct Reply {
    status: u32,
    message: String,
    payload: Bytes,
}

struct Shared {
    queue: Mutex<Vec<Call>>,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    next_id: AtomicU64,
    in_flight: AtomicUsize,
    eventfd: RawFd,
    max_message_bytes: usize,
}

impl Shared {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a full counter (EAGAIN)
        // already means "wake up".
        unsafe { libc::write(self.eventfd, &one as *const u64 as *const libc::c_void, 8) };
    }

    fn clear_wake(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe { libc::read(self.eventfd, &mut count as *mut u64 as *mut libc::c_void, 8) };
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the eventfd is ours and closed once, here.
        unsafe { libc::close(self.eventfd) };
    }
}

/// Keeps call `id` answerable while it lives: dropped when the call ends (answered, its
/// deadline passed, or the client cancelled it, which drops the request's future), it takes
/// the call out of `waiting`, so `pending` turns false and a late `reply` is refused.
struct Waiting {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.shared.waiting.lock().unwrap().remove(&self.id);
    }
}

/// The `grpc-timeout` header's duration ("Timeout": at most 8 digits and a unit, H M S m u
/// n), at most a year (the timer's range), or `None` when it is malformed.
fn grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 || !value.is_ascii() {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let year = Duration::from_secs(365 * 24 * 3600);
    Some(year.min(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    }))
}

/// Counts a request in flight from its arrival until its response is built.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A unary gRPC response body: at most one data frame, then the trailers.
struct GrpcBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for GrpcBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(trailers) = self.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

/// grpc-message is percent-encoded (gRPC over HTTP/2, "Responses").
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn grpc_headers(headers: &mut HeaderMap) {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-accept-encoding", HeaderValue::from_static("identity,gzip,deflate"));
}

/// A Trailers-Only response: the status in the headers, no body.
fn status_only(status: u32, message: &str) -> Response<GrpcBody> {
    let mut response = Response::new(GrpcBody { data: None, trailers: None });
    let headers = response.headers_mut();
    grpc_headers(headers);
    headers.insert("grpc-status", HeaderValue::from(status));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", value);
    }
    response
}

fn answer(reply: Reply) -> Response<GrpcBody> {
    if reply.status != 0 {
        return status_only(reply.status, &reply.message);
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut response = Response::new(GrpcBody { data: Some(reply.payload), trailers: Some(trailers) });
    grpc_headers(response.headers_mut());
    response
}

/// A compressed request message, inflated to at most `limit` bytes.
fn decompress(encoding: &str, compressed: &[u8], limit: usize) -> Result<Bytes, Response<GrpcBody>> {
    let mut inflated = Vec::new();
    let read = match encoding {
        "gzip" => flate2::read::GzDecoder::new(compressed).take(limit as u64 + 1).read_to_end(&mut inflated),
        "deflate" => flate2::read::ZlibDecoder::new(compressed).take(limit as u64 + 1).read_to_end(&mut inflated),
        other => {
            return Err(status_only(
                UNIMPLEMENTED,
                &format!("grpc-encoding {other:?} is not supported: use identity, gzip or deflate"),
            ))
        }
    };
    if let Err(error) = read {
        return Err(status_only(INTERNAL, &format!("the {encoding} request message does not inflate: {error}")));
    }
    if inflated.len() > limit {
        return Err(status_only(RESOURCE_EXHAUSTED, &format!("received message larger than max ({limit} bytes)")));
    }
    Ok(Bytes::from(inflated))
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<GrpcBody>, Infallible> {
    let _in_flight = InFlight::new(&shared);
    let path = request.uri().path();
    let method = match path.strip_prefix(SERVICE_PREFIX) {
        Some(method) if request.method() == Method::POST && !method.is_empty() => method.to_string(),
        _ => return Ok(status_only(UNIMPLEMENTED, &format!("unknown method {path}"))),
    };
    let authorization = request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let timeout = match request.headers().get("grpc-timeout") {
        None => None,
        Some(value) => match value.to_str().ok().and_then(grpc_timeout) {
            Some(timeout) => Some(timeout),
            None => {
                return Ok(status_only(
                    INTERNAL,
                    &format!("malformed grpc-timeout header {:?}: give 1-8 digits and a unit (H, M, S, m, u, n)", value),
                ))
            }
        },
    };
    let arrived = tokio::time::Instant::now();
    let encoding = request
        .headers()
        .get("grpc-encoding")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("identity")
        .to_string();
    let limit = shared.max_message_bytes;
    let body = match Limited::new(request.into_body(), limit + 5).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<LengthLimitError>() => {
            return Ok(status_only(
                RESOURCE_EXHAUSTED,
                &format!("received message larger than max ({limit} bytes)"),
            ))
        }
        Err(error) => return Ok(status_only(INTERNAL, &format!("reading the request failed: {error}"))),
    };
    if body.len() < 5 {
        return Ok(status_only(INTERNAL, "malformed gRPC request: no message"));
    }
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if length != body.len() - 5 {
        return Ok(status_only(
            INTERNAL,
            &format!(
                "malformed gRPC request: the message prefix says {length} bytes, the stream carried {}",
                body.len() - 5
            ),
        ));
    }
    let message = match body[0] {
        0 => body.slice(5..),
        1 => match decompress(&encoding, &body[5..], limit) {
            Ok(message) => message,
            Err(refusal) => return Ok(refusal),
        },
        flag => return Ok(status_only(INTERNAL, &format!("malformed gRPC request: compressed flag {flag}"))),
    };
    let (sender, receiver) = oneshot::channel();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    shared.waiting.lock().unwrap().insert(id, sender);
    let _waiting = Waiting { shared: shared.clone(), id };
    let first = {
        let mut queue = shared.queue.lock().unwrap();
        queue.push(Call { id, method, message, authorization });
        queue.len() == 1
    };
    if first {
        shared.wake();
    }
    let replied = match timeout {
        None => receiver.await,
        Some(timeout) => match tokio::time::timeout_at(arrived + timeout, receiver).await {
            Ok(replied) => replied,
            // the client has given up by now: answer as it expects; Python sees the call
            // no longer pending and skips it if it has not run yet
            Err(_) => return Ok(status_only(DEADLINE_EXCEEDED, "deadline exceeded")),
        },
    };
    Ok(match replied {
        Ok(reply) => answer(reply),
        Err(_) => status_only(UNAVAILABLE, "the server is shutting down"),
    })
}

/// Resolves once shutdown was asked for.
async fn closing(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|closing| *closing).await;
}

async fn serve_connection(shared: Arc<Shared>, stream: tokio::net::TcpStream, shutdown: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |request| handle(shared.clone(), request));
    let connection = http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(8 << 20)
        .max_frame_size(1 << 20)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = closing(shutdown) => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
    let stop = closing(shutdown.clone());
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(serve_connection(shared.clone(), stream, shutdown.clone()));
                }
                // out of descriptors and the like: a moment, then accept again
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = &mut stop => break,
        }
    }
}

fn bind(host: &str, port: u16, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    let address: SocketAddr = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no address for {host}")))?;
    let socket = socket2::Socket::new(socket2::Domain::for_address(address), socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// The gRPC transport: serves HTTP/2 on `host:port` and queues every unary call of
/// `inference.GRPCInferenceService` for Python (see the module documentation).
#[pyclass(module = "tierserve_native")]
struct GrpcTransport {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: watch::Sender<bool>,
    port: u16,
}

#[pymethods]
impl GrpcTransport {
    /// Bind `host:port` (0: a free port) and start serving on `threads` threads.
    #[new]
    #[pyo3(signature = (host, port, *, reuse_port = false, max_message_bytes = 64 << 20, threads = 1))]
    fn new(host: &str, port: u16, reuse_port: bool, max_message_bytes: usize, threads: usize) -> PyResult<Self> {
        if threads == 0 {
            return Err(PyValueError::new_err("threads: give at least 1"));
        }
        let listener = bind(host, port, reuse_port)
            .map_err(|error| PyOSError::new_err(format!("gRPC transport cannot listen on {host}:{port}: {error}")))?;
        let port = listener.local_addr().map_err(|error| PyOSError::new_err(error.to_string()))?.port();
        // SAFETY: eventfd has no memory arguments; the result is checked.
        let eventfd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if eventfd < 0 {
            return Err(PyOSError::new_err(format!("eventfd: {}", std::io::Error::last_os_error())));
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Vec::new()),
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            eventfd,
            max_message_bytes,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("tierserve-grpc-io")
            .enable_all()
            .build()
            .map_err(|error| PyRuntimeError::new_err(format!("tokio runtime: {error}")))?;
        let (shutdown, closing) = watch::channel(false);
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener).map_err(|error| PyOSError::new_err(error.to_string()))?
        };
        runtime.spawn(accept_loop(shared.clone(), listener, closing));
        Ok(GrpcTransport { shared, runtime: Some(runtime), shutdown, port })
    }

    /// The port served.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// The eventfd that becomes readable when calls are queued.
    #[getter]
    fn fd(&self) -> RawFd {
        self.shared.eventfd
    }

    /// Requests received and not yet answered (or still being written).
    #[getter]
    fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Every queued call, as `(id, method, message, authorization)` tuples; clears the
    /// eventfd first, so a call queued after this returns wakes the loop again.
    fn take<'py>(&self, py: Python<'py>) -> Vec<(u64, String, Bound<'py, PyBytes>, Option<String>)> {
        self.shared.clear_wake();
        let calls = std::mem::take(&mut *self.shared.queue.lock().unwrap());
        calls
            .into_iter()
            .map(|call| (call.id, call.method, PyBytes::new(py, &call.message), call.authorization))
            .collect()
    }

    /// Whether call `id` still waits for its answer (false once answered, past its
    /// deadline, or cancelled by the client).
    fn pending(&self, id: u64) -> bool {
        self.shared.waiting.lock().unwrap().contains_key(&id)
    }

    /// Answer call `id`: status 0 and the serialized response, or a gRPC status code and
    /// its message.  False when the call is gone (answered already, or never queued).
    #[pyo3(signature = (id, status, message, payload))]
    fn reply(&self, id: u64, status: u32, message: &str, payload: &[u8]) -> bool {
        let Some(sender) = self.shared.waiting.lock().unwrap().remove(&id) else {
            return false;
        };
        let payload = if status == 0 {
            let mut framed = BytesMut::with_capacity(payload.len() + 5);
            framed.put_u8(0);
            framed.put_u32(payload.len() as u32);
            framed.extend_from_slice(payload);
            framed.freeze()
        } else {
            Bytes::new()
        };
        // the client may have gone: nothing to do then
        let _ = sender.send(Reply { status, message: message.to_string(), payload });
        true
    }

    /// Stop accepting connections and ask open ones to finish (GOAWAY); calls in flight
    /// are still answered until `close`.
    fn begin_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Stop serving: calls not yet answered get UNAVAILABLE; waits for the runtime's
    /// threads, without holding the GIL.
    fn close(&mut self, py: Python<'_>) {
        let _ = self.shutdown.send(true);
        self.shared.waiting.lock().unwrap().clear();
        self.shared.queue.lock().unwrap().clear();
        if let Some(runtime) = self.runtime.take() {
            py.detach(move || runtime.shutdown_timeout(Duration::from_secs(1)));
        }
    }
}

impl Drop for GrpcTransport {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[pymodule]
fn tierserve_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<GrpcTransport>()?;
    Ok(())
}
