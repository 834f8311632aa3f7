//! One gRPC call: its headers checked, its message read within the limits (room in the
//! budget taken before the body is read, the body within the body timeout), queued for
//! Python, and its answer framed.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Read;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::budget::{self, Held};
use crate::conn::{ConnState, Limits};

const SERVICE_PREFIX: &str = "/inference.GRPCInferenceService/";

/// The largest HTTP/2 frame a client may send: what a call reads before it knows its
/// message's length (and has room for it).
pub const MAX_FRAME: usize = 64 << 10;

/// gRPC status codes used by the transport itself.
const DEADLINE_EXCEEDED: u32 = 4;
const UNIMPLEMENTED: u32 = 12;
const INTERNAL: u32 = 13;
const RESOURCE_EXHAUSTED: u32 = 8;
const UNAVAILABLE: u32 = 14;

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
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a full counter (EAGAIN)
        // already means "wake up".
        unsafe { libc::write(self.eventfd, &one as *const u64 as *const libc::c_void, 8) };
    }

    pub fn clear_wake(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe { libc::read(self.eventfd, &mut count as *mut u64 as *mut libc::c_void, 8) };
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
/// n), at most a year (the timer's range), or `None` when it is malformed.
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

/// A unary gRPC response body: at most one data frame, then the trailers.  A call refused
/// before its request was read keeps the request here until the answer is sent: dropping an
/// unread request first would reset the stream (CANCEL) ahead of the answer.
#[derive(Debug)]
pub struct GrpcBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
    request: Option<Incoming>,
}

/// `response`, keeping `request` until it is sent.
fn holding(mut response: Response<GrpcBody>, request: Incoming) -> Response<GrpcBody> {
    response.body_mut().request = Some(request);
    response
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
    let mut response = Response::new(GrpcBody { data: None, trailers: None, request: None });
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
    let mut response = Response::new(GrpcBody { data: Some(reply.payload), trailers: Some(trailers), request: None });
    grpc_headers(response.headers_mut());
    response
}

fn too_large(limit: usize) -> Response<GrpcBody> {
    status_only(RESOURCE_EXHAUSTED, &format!("received message larger than max ({limit} bytes)"))
}

/// The refusal of a call that found no room within the admission timeout.
fn busy(server: &Server) -> Response<GrpcBody> {
    let limits = &server.limits;
    status_only(
        RESOURCE_EXHAUSTED,
        &format!(
            "the server is busy: no room for this call within admission_timeout_s ({} s) under \
             max_inflight_calls ({}), max_inflight_bytes ({}) and max_connection_bytes ({}); retry later",
            limits.admission_timeout.as_secs_f64(),
            server.budget.calls.max(),
            server.budget.bytes.max(),
            limits.max_connection_bytes,
        ),
    )
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
        return Err(too_large(limit));
    }
    Ok(Bytes::from(inflated))
}

/// The call's framed message (prefix included), read as room is found for it: one frame's
/// worth before its length is known, then the whole message; every frame within the body
/// timeout.
async fn read_message(
    server: &Server,
    connection: &Arc<ConnState>,
    held: &mut Held,
    body: &mut Incoming,
    admission: Instant,
    deadline: Instant,
) -> Result<Bytes, Response<GrpcBody>> {
    let limits = &server.limits;
    let limit = limits.max_message_bytes;
    if !held.resize(&connection.bytes, MAX_FRAME.min(limit + 5), admission).await {
        return Err(busy(server));
    }
    let mut buffer = BytesMut::new();
    let mut expected: Option<usize> = None;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Err(status_only(
                    DEADLINE_EXCEEDED,
                    &format!(
                        "the request message did not arrive within body_timeout_s ({} s)",
                        limits.body_timeout.as_secs_f64()
                    ),
                ))
            }
            Ok(None) => break,
            Ok(Some(Err(error))) => return Err(status_only(INTERNAL, &format!("reading the request failed: {error}"))),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue }; // trailers: nothing to read
        if buffer.len() + data.len() > expected.unwrap_or(limit + 5) {
            return Err(match expected {
                Some(total) => status_only(
                    INTERNAL,
                    &format!("malformed gRPC request: the message prefix says {} bytes, the stream carried more", total - 5),
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
                return Err(busy(server));
            }
            buffer.reserve(length + 5 - buffer.len());
            expected = Some(length + 5);
        }
    }
    Ok(buffer.freeze())
}

/// The message of a read body: its prefix checked, inflated when compressed.
fn unframe(body: Bytes, encoding: &str, limit: usize) -> Result<Bytes, Response<GrpcBody>> {
    if body.len() < 5 {
        return Err(status_only(INTERNAL, "malformed gRPC request: no message"));
    }
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if length != body.len() - 5 {
        return Err(status_only(
            INTERNAL,
            &format!(
                "malformed gRPC request: the message prefix says {length} bytes, the stream carried {}",
                body.len() - 5
            ),
        ));
    }
    match body[0] {
        0 => Ok(body.slice(5..)),
        1 => decompress(encoding, &body[5..], limit),
        flag => Err(status_only(INTERNAL, &format!("malformed gRPC request: compressed flag {flag}"))),
    }
}

pub async fn handle(server: Arc<Server>, connection: Arc<ConnState>, request: Request<Incoming>) -> Response<GrpcBody> {
    let (head, mut request) = request.into_parts();
    let answer = call(server, connection, head, &mut request).await;
    holding(answer, request)
}

async fn call(
    server: Arc<Server>,
    connection: Arc<ConnState>,
    head: hyper::http::request::Parts,
    request: &mut Incoming,
) -> Response<GrpcBody> {
    let _in_flight = InFlight::new(&server);
    let _active = connection.call();
    let arrived = Instant::now();
    let path = head.uri.path();
    let method = match path.strip_prefix(SERVICE_PREFIX) {
        Some(method) if head.method == Method::POST && !method.is_empty() => method.to_string(),
        _ => return status_only(UNIMPLEMENTED, &format!("unknown method {path}")),
    };
    let authorization = head.headers.get("authorization").and_then(|value| value.to_str().ok()).map(str::to_string);
    let timeout = match head.headers.get("grpc-timeout") {
        None => None,
        Some(value) => match value.to_str().ok().and_then(grpc_timeout) {
            Some(timeout) => Some(timeout),
            None => {
                return status_only(
                    INTERNAL,
                    &format!("malformed grpc-timeout header {:?}: give 1-8 digits and a unit (H, M, S, m, u, n)", value),
                )
            }
        },
    };
    let encoding = head.headers.get("grpc-encoding").and_then(|value| value.to_str().ok()).unwrap_or("identity").to_string();
    let limits = server.limits;
    // the call's own deadline, when sooner, ends every wait, and is answered as such
    let called_off = timeout.map(|timeout| arrived + timeout);
    let sooner = |deadline: Instant| called_off.map_or(deadline, |end| end.min(deadline));
    let admission = sooner(arrived + limits.admission_timeout);
    let gave_up = || called_off.is_some_and(|end| Instant::now() >= end);
    let Some(mut held) = Held::call(&server.budget, admission).await else {
        return if gave_up() { status_only(DEADLINE_EXCEEDED, "deadline exceeded") } else { busy(&server) };
    };
    let body_deadline = sooner(arrived + limits.body_timeout);
    let body = match read_message(&server, &connection, &mut held, request, admission, body_deadline).await {
        Ok(body) => body,
        Err(_) if gave_up() => return status_only(DEADLINE_EXCEEDED, "deadline exceeded"),
        Err(refusal) => return refusal,
    };
    let message = match unframe(body, &encoding, limits.max_message_bytes) {
        Ok(message) => message,
        Err(refusal) => return refusal,
    };
    if message.len() > held.bytes() {
        // inflated: the larger message is what stays; room for it, or refused
        if !held.resize(&connection.bytes, message.len(), admission).await {
            return busy(&server);
        }
    }
    let (sender, receiver) = oneshot::channel();
    let id = server.next_id.fetch_add(1, Ordering::Relaxed);
    server.waiting.lock().unwrap().insert(id, sender);
    let _waiting = Waiting { server: server.clone(), id };
    let first = {
        let mut queue = server.queue.lock().unwrap();
        queue.push(Call { id, method, message, authorization });
        queue.len() == 1
    };
    if first {
        server.wake();
    }
    let replied = match called_off {
        None => receiver.await,
        Some(end) => match tokio::time::timeout_at(end, receiver).await {
            Ok(replied) => replied,
            // the client has given up by now: answer as it expects; Python sees the call
            // no longer pending and skips it if it has not run yet
            Err(_) => return status_only(DEADLINE_EXCEEDED, "deadline exceeded"),
        },
    };
    match replied {
        Ok(reply) => answer(reply),
        Err(_) => status_only(UNAVAILABLE, "the server is shutting down"),
    }
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

    #[test]
    fn messages_unframe_and_inflate_within_the_limit() {
        let framed = Bytes::from_static(b"\x00\x00\x00\x00\x03abc");
        assert_eq!(unframe(framed, "identity", 10).unwrap(), Bytes::from_static(b"abc"));
        let short = Bytes::from_static(b"\x00\x00\x00\x00\x05abc");
        assert!(unframe(short, "identity", 10).is_err());
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &[0u8; 100]).unwrap();
        let compressed = gz.finish().unwrap();
        let mut framed = vec![1u8];
        framed.extend_from_slice(&(compressed.len() as u32).to_be_bytes());
        framed.extend_from_slice(&compressed);
        assert_eq!(unframe(Bytes::from(framed.clone()), "gzip", 100).unwrap().len(), 100);
        let refused = unframe(Bytes::from(framed), "gzip", 99).unwrap_err();
        assert_eq!(refused.headers()["grpc-status"], "8");
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode("a b%c\n\u{e9}"), "a b%25c%0A%C3%A9");
    }
}
