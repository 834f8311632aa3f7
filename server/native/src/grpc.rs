//! One gRPC call: its room in the budget taken and its message read within the limits (room
//! before the body is read, the body within the body timeout), then handed to tonic, which
//! unframes and inflates it (gzip, deflate; bounded by the message limit), and answers it:
//! status, percent-encoded message, trailers.  The message itself stays bytes (`Raw`): it is
//! queued for Python, which decodes the protobuf and replies.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

use crate::budget::{self, Held};
use crate::conn::{ConnState, Limits};

const SERVICE_PREFIX: &str = "/inference.GRPCInferenceService/";

/// The largest HTTP/2 frame a client may send: what a call reads before it knows its
/// message's length (and has room for it).
pub const MAX_FRAME: usize = 64 << 10;

/// One RPC waiting for Python.
pub struct Call {
    pub id: u64,
    pub method: String,
    pub message: Bytes,
    pub authorization: Option<String>,
}

/// Python's answer: a gRPC status, its message, and (status 0) the serialized response.
pub struct Reply {
    pub status: u32,
    pub message: String,
    pub payload: Bytes,
}

/// What the transport's threads share with Python.
pub struct Server {
    pub queue: Mutex<Vec<Call>>,
    pub waiting: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    pub next_id: AtomicU64,
    pub in_flight: AtomicUsize,
    pub connections: AtomicUsize,
    /// Connections closed at once: over the cap, or into the descriptor reserve.
    pub refused: AtomicU64,
    pub eventfd: RawFd,
    pub limits: Limits,
    pub budget: Arc<budget::Shared>,
}

impl Server {
    pub fn wake(&self) {
        crate::wake(self.eventfd);
    }

    pub fn clear_wake(&self) {
        crate::clear_wake(self.eventfd);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: the eventfd is ours and closed once, here.
        unsafe { libc::close(self.eventfd) };
    }
}

/// Keeps call `id` answerable while it lives: dropped when the call ends (answered, its
/// deadline passed, or the client cancelled it, which drops the request's future), it takes
/// the call out of `waiting`, so `pending` turns false and a late `reply` is refused.
struct Waiting {
    server: Arc<Server>,
    id: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.server.waiting.lock().unwrap().remove(&self.id);
    }
}

/// Counts a request in flight from its arrival until its response is built.
struct InFlight(Arc<Server>);

impl InFlight {
    fn new(server: &Arc<Server>) -> Self {
        server.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(server.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The `grpc-timeout` header's duration ("Timeout": at most 8 digits and a unit, H M S m u
/// n), at most a year (the timer's range), or `None` when it is malformed.  (tonic parses it
/// only inside its own server, whose connections this transport does not use.)
pub fn grpc_timeout(value: &str) -> Option<Duration> {
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

/// Messages as bytes both ways: Python decodes requests and encodes responses.
#[derive(Clone, Copy, Debug, Default)]
pub struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let length = src.remaining();
        Ok(Some(src.copy_to_bytes(length)))
    }
}

/// A response body: tonic's, holding the request until it is sent when the call was refused
/// before its request was read (dropping an unread request first would reset the stream,
/// CANCEL, ahead of the answer).
pub struct GrpcBody {
    inner: tonic::body::Body,
    #[allow(dead_code)] // held, not read
    request: Option<Incoming>,
}

impl http_body::Body for GrpcBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

fn refusal(code: Code, message: impl Into<String>) -> Response<tonic::body::Body> {
    Status::new(code, message).into_http()
}

fn too_large(limit: usize) -> Response<tonic::body::Body> {
    refusal(Code::ResourceExhausted, format!("received message larger than max ({limit} bytes)"))
}

/// The refusal of a call that found no room within the admission timeout.
fn busy(server: &Server) -> Status {
    let limits = &server.limits;
    Status::resource_exhausted(format!(
        "the server is busy: no room for this call within admission_timeout_s ({} s) under \
         max_inflight_calls ({}), max_inflight_bytes ({}) and max_connection_bytes ({}); retry later",
        limits.admission_timeout.as_secs_f64(),
        server.budget.calls.max(),
        server.budget.bytes.max(),
        limits.max_connection_bytes,
    ))
}

/// The call's framed message (prefix included), read as room is found for it: one frame's
/// worth before its length is known, then the whole message; every frame within the body
/// timeout.  The prefix is read only for the length the call must hold; tonic unframes.
async fn read_message(
    server: &Server,
    connection: &Arc<ConnState>,
    held: &mut Held,
    body: &mut Incoming,
    admission: Instant,
    deadline: Instant,
) -> Result<Bytes, Response<tonic::body::Body>> {
    let limits = &server.limits;
    let limit = limits.max_message_bytes;
    if !held.resize(&connection.bytes, MAX_FRAME.min(limit + 5), admission).await {
        return Err(busy(server).into_http());
    }
    let mut buffer = BytesMut::new();
    let mut expected: Option<usize> = None;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Err(refusal(
                    Code::DeadlineExceeded,
                    format!(
                        "the request message did not arrive within body_timeout_s ({} s)",
                        limits.body_timeout.as_secs_f64()
                    ),
                ))
            }
            Ok(None) => break,
            Ok(Some(Err(error))) => return Err(refusal(Code::Internal, format!("reading the request failed: {error}"))),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue }; // trailers: nothing to read
        if buffer.len() + data.len() > expected.unwrap_or(limit + 5) {
            return Err(match expected {
                Some(total) => refusal(
                    Code::Internal,
                    format!("malformed gRPC request: the message prefix says {} bytes, the stream carried more", total - 5),
                ),
                None => too_large(limit),
            });
        }
        buffer.extend_from_slice(&data);
        if expected.is_none() && buffer.len() >= 5 {
            let length = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
            if length > limit {
                return Err(too_large(limit));
            }
            if !held.resize(&connection.bytes, length + 5, admission).await {
                return Err(busy(server).into_http());
            }
            buffer.reserve(length + 5 - buffer.len());
            expected = Some(length + 5);
        }
    }
    Ok(buffer.freeze())
}

pub async fn handle(server: Arc<Server>, connection: Arc<ConnState>, request: Request<Incoming>) -> Response<GrpcBody> {
    let (head, mut body) = request.into_parts();
    let answer = call(server, connection, head, &mut body).await;
    answer.map(|inner| GrpcBody { inner, request: Some(body) })
}

async fn call(
    server: Arc<Server>,
    connection: Arc<ConnState>,
    head: hyper::http::request::Parts,
    body: &mut Incoming,
) -> Response<tonic::body::Body> {
    let _in_flight = InFlight::new(&server);
    let _active = connection.call();
    let arrived = Instant::now();
    let path = head.uri.path();
    let method = match path.strip_prefix(SERVICE_PREFIX) {
        Some(method) if head.method == Method::POST && !method.is_empty() => method.to_string(),
        _ => return refusal(Code::Unimplemented, format!("unknown method {path}")),
    };
    let timeout = match head.headers.get("grpc-timeout") {
        None => None,
        Some(value) => match value.to_str().ok().and_then(grpc_timeout) {
            Some(timeout) => Some(timeout),
            None => {
                return refusal(
                    Code::Internal,
                    format!("malformed grpc-timeout header {value:?}: give 1-8 digits and a unit (H, M, S, m, u, n)"),
                )
            }
        },
    };
    let limits = server.limits;
    // the call's own deadline, when sooner, ends every wait, and is answered as such
    let called_off = timeout.map(|timeout| arrived + timeout);
    let sooner = |deadline: Instant| called_off.map_or(deadline, |end| end.min(deadline));
    let admission = sooner(arrived + limits.admission_timeout);
    let gave_up = || called_off.is_some_and(|end| Instant::now() >= end);
    let deadline_exceeded = || refusal(Code::DeadlineExceeded, "deadline exceeded");
    let Some(mut held) = Held::call(&server.budget, admission).await else {
        return if gave_up() { deadline_exceeded() } else { busy(&server).into_http() };
    };
    let body_deadline = sooner(arrived + limits.body_timeout);
    let message = match read_message(&server, &connection, &mut held, body, admission, body_deadline).await {
        Ok(message) => message,
        Err(_) if gave_up() => return deadline_exceeded(),
        Err(refusal) => return refusal,
    };
    let dispatch = Dispatch { server: server.clone(), connection, held: Some(held), method, admission };
    let request = Request::from_parts(head, Full::new(message));
    let mut grpc = tonic::server::Grpc::new(Raw)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate)
        .max_decoding_message_size(limits.max_message_bytes)
        .max_encoding_message_size(usize::MAX);
    let answered = grpc.unary(dispatch, request);
    match called_off {
        None => answered.await,
        // the client has given up by now: answer as it expects; Python sees the call no
        // longer pending (the call's future is dropped) and skips it if it has not run yet
        Some(end) => tokio::time::timeout_at(end, answered).await.unwrap_or_else(|_| deadline_exceeded()),
    }
}

/// Hands a call tonic has unframed to Python, and its answer back to tonic.
struct Dispatch {
    server: Arc<Server>,
    connection: Arc<ConnState>,
    held: Option<Held>,
    method: String,
    admission: Instant,
}

type Answer = Result<tonic::Response<Bytes>, Status>;

impl tonic::server::UnaryService<Bytes> for Dispatch {
    type Response = Bytes;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let (server, connection, held) = (self.server.clone(), self.connection.clone(), self.held.take());
        let (method, admission) = (std::mem::take(&mut self.method), self.admission);
        Box::pin(async move {
            let mut held = held.ok_or_else(|| Status::internal("one message per call"))?;
            let authorization = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
            let message = request.into_inner();
            // inflated: the larger message is what stays; room for it, or refused
            if message.len() > held.bytes() && !held.resize(&connection.bytes, message.len(), admission).await {
                return Err(busy(&server));
            }
            let reply = queue(&server, Call { id: 0, method, message, authorization }).await?;
            drop(held);
            if reply.status == 0 {
                Ok(tonic::Response::new(reply.payload))
            } else {
                Err(Status::new(Code::from_i32(reply.status as i32), reply.message))
            }
        })
    }
}

/// Queue `call` for Python and wait for its reply.
async fn queue(server: &Arc<Server>, mut call: Call) -> Result<Reply, Status> {
    let (sender, receiver) = oneshot::channel();
    let id = server.next_id.fetch_add(1, Ordering::Relaxed);
    call.id = id;
    server.waiting.lock().unwrap().insert(id, sender);
    let _waiting = Waiting { server: server.clone(), id };
    let first = {
        let mut queue = server.queue.lock().unwrap();
        queue.push(call);
        queue.len() == 1
    };
    if first {
        server.wake();
    }
    receiver.await.map_err(|_| Status::unavailable("the server is shutting down"))
}

/// A hyper service answering every request with `handle` (it never fails).
pub fn service(
    server: Arc<Server>,
    state: Arc<ConnState>,
) -> impl hyper::service::Service<Request<Incoming>, Response = Response<GrpcBody>, Error = Infallible, Future: Send> + Clone {
    hyper::service::service_fn(move |request: Request<Incoming>| {
        let (server, state) = (server.clone(), state.clone());
        async move { Ok::<_, Infallible>(handle(server, state, request).await) }
    })
}

/// A framed message (for tests): the 5-byte prefix and `message`.
#[cfg(test)]
fn framed(compressed: bool, message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(message.len() + 5);
    out.put_u8(compressed as u8);
    out.put_u32(message.len() as u32);
    out.extend_from_slice(message);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_and_malformed_ones_do_not() {
        assert_eq!(grpc_timeout("200m"), Some(Duration::from_millis(200)));
        assert_eq!(grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(grpc_timeout("99999999H"), Some(Duration::from_secs(365 * 24 * 3600)));
        for bad in ["", "5", "2x", "123456789S", "-1S", "1.5S"] {
            assert_eq!(grpc_timeout(bad), None, "{bad}");
        }
    }

    /// A service that answers with the message it was given (the raw codec both ways).
    struct Echo;

    impl tonic::server::UnaryService<Bytes> for Echo {
        type Response = Bytes;
        type Future = std::future::Ready<Answer>;

        fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
            std::future::ready(Ok(tonic::Response::new(request.into_inner())))
        }
    }

    async fn through_tonic(body: Bytes, encoding: &str, limit: usize) -> (Option<Bytes>, Option<String>) {
        let request = Request::builder()
            .method("POST")
            .uri("/inference.GRPCInferenceService/ModelInfer")
            .header("content-type", "application/grpc")
            .header("grpc-encoding", encoding)
            .body(Full::new(body))
            .unwrap();
        let mut grpc = tonic::server::Grpc::new(Raw)
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Deflate)
            .max_decoding_message_size(limit);
        let response = grpc.unary(Echo, request).await;
        let status = response.headers().get("grpc-status").map(|v| v.to_str().unwrap().to_string());
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        let data = collected.to_bytes();
        let status = status.or_else(|| trailers.and_then(|t| t.get("grpc-status").map(|v| v.to_str().unwrap().to_string())));
        (if data.is_empty() { None } else { Some(data) }, status)
    }

    #[tokio::test]
    async fn messages_pass_through_tonic_as_bytes_and_inflate_within_the_limit() {
        let (echo, status) = through_tonic(framed(false, b"abc"), "identity", 10).await;
        assert_eq!((echo, status.as_deref()), (Some(framed(false, b"abc")), Some("0")));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &[7u8; 100]).unwrap();
        let compressed = gz.finish().unwrap();
        let (echo, _) = through_tonic(framed(true, &compressed), "gzip", 100).await;
        assert_eq!(echo, Some(framed(false, &[7u8; 100]))); // answered uncompressed
        let (echo, status) = through_tonic(framed(true, &compressed), "gzip", 99).await;
        assert_eq!((echo, status.as_deref()), (None, Some("8"))); // RESOURCE_EXHAUSTED
        let (_, status) = through_tonic(framed(true, &compressed), "br", 1000).await;
        assert_eq!(status.as_deref(), Some("12")); // UNIMPLEMENTED
    }

    #[test]
    fn refusals_carry_the_status_and_a_percent_encoded_message() {
        let response = refusal(Code::Internal, "a b%c\n\u{e9}");
        assert_eq!(response.headers()["grpc-status"], "13");
        assert_eq!(response.headers()["grpc-message"], "a%20b%25c%0A%C3%A9");
        assert_eq!(response.headers()["content-type"], "application/grpc");
    }
}
