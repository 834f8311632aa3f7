//! The HTTP/1.1 front end: hyper's HTTP/1.1 server (`hyper::server::conn::http1`) on each
//! connection, requests within the limits, infer requests decoded here, every request
//! queued for Python and its answer written back.
//!
//! hyper reads requests one after another (keep-alive; pipelined requests wait in its
//! buffer for their turn), frames bodies (Content-Length or chunked; smuggling refused),
//! answers `Expect: 100-continue` when the body is first read, and refuses a head over
//! `max_header_bytes` or `max_header_count` (431; 414 for the URL) or not due within the
//! header timeout (`header_read_timeout`).  Its own refusals get our JSON error bodies
//! (`h1io`).  This module's service holds each request to the rest: room in the budget
//! before its body is read (waiting for it with nothing read, so no 100 Continue is sent
//! meanwhile), the body within the body timeout and `max_request_bytes`; the connection
//! watchdog closes a connection idle between requests after the keep-alive timeout.
//! `POST /v2/models/{m}[/versions/{v}]/infer` is inflated and decoded here (`kserve`);
//! anything that is not a well-formed request of that kind, and every other route, is
//! handed to Python as it came.  A client that hangs up while its request waits has it
//! dropped (hyper drops the request's future: `pending` turns false).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::budget::{self, Held};
use crate::conn::{closing, ActiveCall, ConnState, Watched};
use crate::h1io::Http1Io;
use crate::head::{error_reply, infer_path, response_head, Refusal};
use crate::kserve::{self, Decoded};

/// The bounds every HTTP connection and request is held to (server/settings.py's).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_request_bytes: usize,
    pub max_header_bytes: usize,
    pub max_header_count: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub keep_alive_timeout: Duration,
    pub admission_timeout: Duration,
    pub max_connections: usize,
    /// Accepted sockets whose descriptor is this or higher are refused (503).
    pub max_descriptor: RawFd,
}

/// The fields of an infer request Python reads when it decodes the body itself.
#[derive(Clone, Debug, Default)]
pub struct InferHeaders {
    pub length: Option<String>,
    pub encoding: Option<String>,
    pub header_length: Option<String>,
}

/// A request waiting for Python.
pub enum Item {
    /// Any route but infer, for the ASGI app: method, target, headers (names lower case).
    Raw { id: u64, method: String, target: Bytes, headers: Vec<(Bytes, Bytes)>, body: Bytes },
    /// An infer request decoded here.
    Infer { id: u64, model: String, version: String, decoded: Decoded, arrived: Instant },
    /// An infer request Python decodes, or refuses (`body` None: not read; `problem`: why).
    Body {
        id: u64,
        model: String,
        version: String,
        headers: InferHeaders,
        body: Option<Bytes>,
        problem: Option<&'static str>,
        arrived: Instant,
    },
}

impl Item {
    pub fn id(&self) -> u64 {
        match self {
            Item::Raw { id, .. } | Item::Infer { id, .. } | Item::Body { id, .. } => *id,
        }
    }

    pub fn size(&self) -> usize {
        match self {
            Item::Raw { body, .. } => body.len(),
            Item::Infer { decoded, .. } => decoded.inputs.iter().map(|t| t.data.len()).sum(),
            Item::Body { body, .. } => body.as_ref().map_or(0, Bytes::len),
        }
    }
}

/// Python's answer to one request.
pub struct Reply {
    pub status: u16,
    /// Header fields besides content-length, date and connection (names lower case).
    pub headers: Vec<(Bytes, Bytes)>,
    pub body: Bytes,
}

/// What the connections share with Python.
pub struct HttpServer {
    pub queue: Mutex<VecDeque<Item>>,
    pub waiting: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    /// Infer requests whose client left before Python took them: (model, arrival).
    pub gone: Mutex<Vec<(String, Instant)>>,
    pub next_id: AtomicU64,
    pub in_flight: AtomicUsize,
    pub connections: AtomicUsize,
    pub refused: AtomicU64,
    pub eventfd: RawFd,
    pub limits: Limits,
    pub budget: Arc<budget::Shared>,
    /// For the busy message (an HTTP connection holds one request at a time).
    pub max_connection_bytes: usize,
    /// The models served, and their versions (None until Python says; then every model is
    /// taken to be served).
    pub models: RwLock<Option<HashMap<String, String>>>,
}

impl HttpServer {
    /// Whether `model` (`version`, when given) is served, as far as this transport knows.
    fn serves(&self, model: &str, version: &str) -> bool {
        match &*self.models.read().unwrap() {
            None => true,
            Some(models) => models.get(model).is_some_and(|served| version.is_empty() || version == served),
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        // SAFETY: the eventfd is ours and closed once, here.
        unsafe { libc::close(self.eventfd) };
    }
}

/// Keeps request `id` answerable while it lives (see grpc.rs's `Waiting`).
struct Waiting<'a>(&'a HttpServer, u64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.lock().unwrap().remove(&self.1);
    }
}

/// Counts a request in flight until its answer is written (held by its response body).
struct InFlight(Arc<HttpServer>);

impl InFlight {
    fn new(server: &Arc<HttpServer>) -> Self {
        server.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(server.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}


// --- one request ----------------------------------------------------------------------------

/// A response's body: Python's answer, and what the request holds until hyper is done with
/// it (its room in the budget, its count in flight and on the connection).
pub struct ReplyBody {
    data: Option<Bytes>,
    _held: Option<Held>,
    _in_flight: Option<InFlight>,
    _call: Option<ActiveCall>,
}

impl http_body::Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.data.take().filter(|d| !d.is_empty()).map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.as_ref().is_none_or(Bytes::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// Why a connection is dropped without an answer (hyper closes it).
#[derive(Debug)]
struct Dropped(&'static str);

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Dropped {}

/// What a request holds while it is served.
struct Guards {
    in_flight: InFlight,
    call: ActiveCall,
}

/// The response to Python's `reply` (`close`: the connection closes after it).
fn respond(reply: Reply, close: bool, guards: Guards, held: Option<Held>) -> Response<ReplyBody> {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(ReplyBody {
        data: None,
        _held: held,
        _in_flight: Some(guards.in_flight),
        _call: Some(guards.call),
    });
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in reply.headers {
        if matches!(name.as_ref(), b"content-length" | b"transfer-encoding" | b"connection" | b"date") {
            continue;
        }
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(&name), HeaderValue::from_maybe_shared(value)) {
            headers.append(name, value);
        }
    }
    // set here, so that a HEAD request's answer says the length of what GET would send
    headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(reply.body.len()));
    if close {
        headers.insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    }
    response.body_mut().data = Some(reply.body);
    response
}

/// Queue `item` for Python and wait for its answer (None: the transport closes).  When the
/// client leaves, hyper drops this future, and with it the request (`pending` turns false).
async fn ask(server: &HttpServer, item: Item) -> Option<Reply> {
    let id = item.id();
    let (sender, receiver) = oneshot::channel();
    server.waiting.lock().unwrap().insert(id, sender);
    let _waiting = Waiting(server, id);
    let first = {
        let mut queue = server.queue.lock().unwrap();
        queue.push_back(item);
        queue.len() == 1
    };
    if first {
        crate::wake(server.eventfd);
    }
    receiver.await.ok()
}

/// The refusal of a request that found no room within the admission timeout (the words of
/// server/runtime/admission.py's `busy_error` and the gRPC transport's).
fn busy(server: &HttpServer) -> Refusal {
    let limits = &server.limits;
    Refusal(
        503,
        format!(
            "the server is busy: no room for this call within admission_timeout_s ({} s) under \
             max_inflight_calls ({}), max_inflight_bytes ({}) and max_connection_bytes ({}); retry later",
            limits.admission_timeout.as_secs_f64(),
            server.budget.calls.max(),
            server.budget.bytes.max(),
            server.max_connection_bytes,
        ),
    )
}

/// The fields of a request's head this module reads.
struct Head {
    method: String,
    target: Bytes,
    headers: Vec<(Bytes, Bytes)>,
    expect: bool,
    /// An HTTP/1.0 request without `Connection: keep-alive`: its answer says it closes.
    http10_close: bool,
}

impl Head {
    fn of(parts: &hyper::http::request::Parts) -> Head {
        let target = match parts.uri.path_and_query() {
            Some(path) => Bytes::copy_from_slice(path.as_str().as_bytes()),
            None => Bytes::from_static(b"/"),
        };
        let headers = parts
            .headers
            .iter()
            .map(|(n, v)| (Bytes::copy_from_slice(n.as_str().as_bytes()), Bytes::copy_from_slice(v.as_bytes())))
            .collect();
        let expect = parts.version == hyper::Version::HTTP_11
            && parts.headers.get_all(hyper::header::EXPECT).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let http10_close = parts.version == hyper::Version::HTTP_10
            && !parts.headers.get_all(hyper::header::CONNECTION).iter().any(|v| {
                v.as_bytes().split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"keep-alive"))
            });
        Head { method: parts.method.as_str().to_string(), target, headers, expect, http10_close }
    }

    fn text(&self, name: &[u8]) -> Option<String> {
        self.headers.iter().find(|(n, _)| n.as_ref() == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    fn fields(&self) -> InferHeaders {
        InferHeaders {
            length: self.text(b"content-length"),
            encoding: self.text(b"content-encoding"),
            header_length: self.text(b"inference-header-content-length"),
        }
    }

    /// An infer request refused, or asked about, before (or instead of) its body: `problem`
    /// says why (see server/http/native.py).
    fn unread(&self, id: u64, model: &str, version: &str, problem: &'static str, arrived: Instant) -> Item {
        let (model, version) = (model.to_string(), version.to_string());
        Item::Body { id, model, version, headers: self.fields(), body: None, problem: Some(problem), arrived }
    }

    /// The request for the ASGI app without its body (the app refuses it).
    fn clone_raw(&self, id: u64) -> Item {
        Item::Raw { id, method: self.method.clone(), target: self.target.clone(), headers: self.headers.clone(), body: Bytes::new() }
    }

    fn raw(self, server: &HttpServer, body: Bytes) -> Item {
        Item::Raw { id: server.next_id.fetch_add(1, Ordering::Relaxed), method: self.method, target: self.target, headers: self.headers, body }
    }
}

/// Serve one request (see the module documentation); Err: the connection is dropped
/// without an answer (its body did not come within the body timeout, or the transport
/// closes).  The head is read before the future is made, so that an infer request whose
/// future hyper drops is counted (as a 499) even when it is dropped before its first poll.
fn handle(
    server: Arc<HttpServer>,
    state: Arc<ConnState>,
    request: Request<Incoming>,
) -> impl std::future::Future<Output = Result<Response<ReplyBody>, Dropped>> {
    let arrived = Instant::now();
    let (parts, body) = request.into_parts();
    let head = Head::of(&parts);
    let infer = infer_path(&head.method, &head.target);
    let unanswered = Unanswered { server: server.clone(), model: infer.as_ref().map(|(model, _)| model.clone()), arrived };
    serve(server, state, head, body, infer, unanswered)
}

async fn serve(
    server: Arc<HttpServer>,
    state: Arc<ConnState>,
    head: Head,
    mut body: Incoming,
    infer: Option<(String, String)>,
    mut unanswered: Unanswered,
) -> Result<Response<ReplyBody>, Dropped> {
    let guards = Guards { in_flight: InFlight::new(&server), call: state.call() };
    let arrived = unanswered.arrived;
    let limits = server.limits;
    // hyper framed the body: a Content-Length is its exact size, a chunked body has none
    let declared = body.size_hint().exact().map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let over_limit = declared.is_some_and(|n| n > limits.max_request_bytes);
    let new_id = || server.next_id.fetch_add(1, Ordering::Relaxed);
    // refused before its body is read: a model not served (Python has the last word), a
    // declared body over the limit
    let refused = match &infer {
        Some((model, version)) if over_limit || !server.serves(model, version) => {
            let problem = if over_limit { "too large" } else { "check" };
            Some(head.unread(new_id(), model, version, problem, arrived))
        }
        None if over_limit => Some(head.clone_raw(new_id())),
        _ => None,
    };
    if let Some(item) = refused {
        let reply = unanswered.hand_off(item).await.ok_or(Dropped("closing"))?;
        if reply.status != 0 {
            // answered at once; its body skipped (a client waiting to be asked for it is not
            // asked: the connection closes after the answer)
            let keep = !head.expect && !head.http10_close && skip(&mut body, Instant::now() + limits.body_timeout).await;
            return Ok(respond(reply, !keep, guards, None));
        }
        unanswered.rearm(&infer); // Python let it go on to its body
    }
    // room in the budget before the body is read: its declared length, or the most allowed
    let mut held = None;
    if declared != Some(0) {
        let need = declared.unwrap_or(limits.max_request_bytes);
        held = Held::request(&server.budget, need, arrived + limits.admission_timeout).await;
        if held.is_none() {
            let reply = match &infer {
                Some((model, version)) => unanswered
                    .hand_off(head.unread(new_id(), model, version, "busy", arrived))
                    .await
                    .ok_or(Dropped("closing"))?,
                None => error_reply(&busy(&server)),
            };
            return Ok(respond(reply, true, guards, None)); // its body unread
        }
    }
    let read = read_body(&mut body, declared, limits.max_request_bytes, Instant::now() + limits.body_timeout).await;
    let Some((data, exceeded)) = read else {
        return Err(Dropped("the request body did not arrive within body_timeout_s"));
    };
    let close = head.http10_close;
    let item = match infer {
        Some((model, version)) if exceeded => head.unread(new_id(), &model, &version, "exceeded", arrived),
        Some((model, version)) => infer_item(new_id(), model, version, head.fields(), data, arrived, limits.max_request_bytes),
        None => head.raw(&server, data),
    };
    let reply = unanswered.hand_off(item).await.ok_or(Dropped("closing"))?;
    Ok(respond(reply, close, guards, held)) // room given back once hyper is done with it
}

/// Counts an infer request that was not handed to Python (`model` still set when it is
/// dropped) with the requests whose clients left, as a 499: its client left first (hyper
/// drops the request's future, perhaps before its first poll), or its body did not come
/// within the body timeout.  Once handed over, Python counts it.
struct Unanswered {
    server: Arc<HttpServer>,
    model: Option<String>,
    arrived: Instant,
}

impl Unanswered {
    /// Queue `item` for Python (see `ask`); from here on Python counts the request.
    async fn hand_off(&mut self, item: Item) -> Option<Reply> {
        self.model = None; // `ask` queues it on its first poll: nothing is dropped between
        ask(&self.server, item).await
    }

    fn rearm(&mut self, infer: &Option<(String, String)>) {
        self.model = infer.as_ref().map(|(model, _)| model.clone());
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(model) = self.model.take() {
            self.server.gone.lock().unwrap().push((model, self.arrived));
            crate::wake(self.server.eventfd);
        }
    }
}

/// A request's body, read until `deadline` (None: it did not come, or the client left): at
/// most `limit` bytes (past it the rest is read and dropped, and `true` says so).
async fn read_body(body: &mut Incoming, declared: Option<usize>, limit: usize, deadline: Instant) -> Option<(Bytes, bool)> {
    let mut first: Option<Bytes> = None;
    let mut buffer = BytesMut::new();
    let mut size = 0usize;
    let mut exceeded = false;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            _ => return None,
        };
        let Ok(data) = frame.into_data() else { continue }; // trailers: dropped
        size = size.saturating_add(data.len());
        if exceeded {
            continue;
        }
        if size > limit {
            exceeded = true;
            (first, buffer) = (None, BytesMut::new());
            continue;
        }
        // one frame (the usual case for a body that arrived with its head): kept as it is
        match first.take() {
            None if buffer.is_empty() => first = Some(data),
            Some(earlier) => {
                buffer.reserve(declared.unwrap_or(0).max(earlier.len() + data.len()));
                buffer.extend_from_slice(&earlier);
                buffer.extend_from_slice(&data);
            }
            None => buffer.extend_from_slice(&data),
        }
    }
    Some((first.unwrap_or_else(|| buffer.freeze()), exceeded))
}

/// Read past the body of a request answered without it, until `deadline`: whether it all
/// came (the connection can go on).
async fn skip(body: &mut Incoming, deadline: Instant) -> bool {
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(_))) => {}
            Ok(None) => return true,
            _ => return false,
        }
    }
}

/// An infer request whose body is in: decoded here, or left to Python.
fn infer_item(id: u64, model: String, version: String, headers: InferHeaders, body: Bytes, arrived: Instant, limit: usize) -> Item {
    let inflated = match headers.encoding.as_deref().map(|e| e.trim().to_ascii_lowercase()) {
        None => Some(body.clone()),
        Some(e) if e.is_empty() || e == "identity" => Some(body.clone()),
        Some(e) if e == "gzip" || e == "deflate" => inflate(&e, &body, limit),
        Some(_) => None,
    };
    let decoded = inflated.and_then(|inflated| {
        let header_length = match headers.header_length.as_deref() {
            None => None,
            Some(text) => Some(parse_digits(text.trim())?),
        };
        kserve::decode(&inflated, header_length)
    });
    match decoded {
        Some(decoded) => Item::Infer { id, model, version, decoded, arrived },
        None => Item::Body { id, model, version, headers, body: Some(body), problem: None, arrived },
    }
}

fn parse_digits(text: &str) -> Option<usize> {
    (!text.is_empty() && text.len() <= 19 && text.bytes().all(|b| b.is_ascii_digit())).then(|| text.parse().ok()).flatten()
}

/// A gzip or deflate body inflated to at most `limit` bytes (None: Python explains).
fn inflate(encoding: &str, body: &[u8], limit: usize) -> Option<Bytes> {
    let mut out = Vec::new();
    let read = if encoding == "gzip" {
        flate2::read::GzDecoder::new(body).take(limit as u64 + 1).read_to_end(&mut out)
    } else {
        flate2::read::ZlibDecoder::new(body).take(limit as u64 + 1).read_to_end(&mut out)
    };
    (read.is_ok() && out.len() <= limit).then(|| Bytes::from(out))
}

// --- one connection -------------------------------------------------------------------------

/// hyper's HTTP/1.1 server, set to `limits`.
fn builder(limits: &Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .keep_alive(true)
        .half_close(false)
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_headers(limits.max_header_count)
        // a head up to the limit fits in the read buffer (hyper's default is 400 KiB)
        .max_buf_size((limits.max_header_bytes + 1).max(400 << 10));
    // not `pipeline_flush`: it holds answers back while the read buffer is not empty, which
    // a head hyper refused never leaves (its refusal would wait for the client to go)
    builder
}

/// Serve one connection until it closes: hyper serves its requests; the watchdog closes it
/// when idle between requests for the keep-alive timeout, and on shutdown lets the request
/// in progress (or one already on its way) be answered, with `Connection: close`.
pub async fn serve_connection(server: Arc<HttpServer>, stream: TcpStream, shutdown: watch::Receiver<bool>) {
    let _open = Open(server.clone());
    let _ = stream.set_nodelay(true);
    let fd = stream.as_raw_fd();
    let limits = server.limits;
    let state = Arc::new(ConnState::new(server.max_connection_bytes));
    let io = Http1Io::new(Watched::new(stream, state.clone()), limits.max_header_bytes, limits.max_header_count);
    let service = {
        let (server, state) = (server.clone(), state.clone());
        hyper::service::service_fn(move |request| handle(server.clone(), state.clone(), request))
    };
    let connection = builder(&limits).serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let period = limits.keep_alive_timeout.div_f64(4.0).clamp(Duration::from_millis(5), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    let stop = closing(shutdown);
    tokio::pin!(stop);
    let mut draining = false;
    loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            _ = &mut stop, if !draining => {
                draining = true;
                tick = tokio::time::interval(Duration::from_millis(5));
            }
            _ = tick.tick() => {
                if !draining {
                    if state.idle_between_calls(limits.keep_alive_timeout) {
                        return; // dropped, which closes it
                    }
                } else if state.active() > 0 {
                    break; // answered, then closed
                } else if !state.read_since_call() && unread(fd) == 0 {
                    return; // between requests, nothing on its way: closed at once
                }
            }
        }
    }
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}

/// Bytes waiting in the kernel to be read from socket `fd` (0 when unknown).
fn unread(fd: RawFd) -> usize {
    let mut count: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let ok = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut count) };
    if ok == 0 {
        count.max(0) as usize
    } else {
        0
    }
}

/// Counts an open connection until dropped.
struct Open(Arc<HttpServer>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

// --- accepting ------------------------------------------------------------------------------

fn admit(server: &Arc<HttpServer>, stream: TcpStream, shutdown: &watch::Receiver<bool>, kill: &watch::Receiver<bool>) {
    let limits = &server.limits;
    let over = stream.as_raw_fd() >= limits.max_descriptor
        || server.connections.fetch_add(1, Ordering::SeqCst) >= limits.max_connections;
    if over {
        if stream.as_raw_fd() < limits.max_descriptor {
            server.connections.fetch_sub(1, Ordering::SeqCst);
        }
        server.refused.fetch_add(1, Ordering::Relaxed);
        let refusal = Refusal(503, "the server has too many connections open; retry later".into());
        let reply = error_reply(&refusal);
        let mut bytes = response_head(503, &reply.headers, reply.body.len(), true);
        bytes.extend_from_slice(&reply.body);
        let _ = stream.try_write(&bytes); // one try: the refusal holds nothing
        return;
    }
    crate::spawn_killable(kill, serve_connection(server.clone(), stream, shutdown.clone()));
}

/// Accept connections until shutdown (see `conn::accept_until`).
pub async fn accept_loop(
    server: Arc<HttpServer>,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
    kill: watch::Receiver<bool>,
) {
    crate::conn::accept_until(listener, shutdown.clone(), |stream| admit(&server, stream, &shutdown, &kill)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::tests::limits;
    use std::io::Write as _;

    /// What a test holds while its transport serves (dropping the signals' senders stops it).
    type Serving = (Arc<HttpServer>, tokio::runtime::Runtime, [watch::Sender<bool>; 2]);

    /// A transport on a free port whose "Python" answers every request with its body
    /// (infer requests: their rows), until the test ends.
    fn serve(limits: Limits) -> (std::net::SocketAddr, Serving) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = crate::conn::bind("127.0.0.1", 0, false).unwrap();
        let address = listener.local_addr().unwrap();
        // SAFETY: see `new_eventfd`
        let eventfd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        let server = Arc::new(HttpServer {
            queue: Mutex::new(VecDeque::new()),
            waiting: Mutex::new(HashMap::new()),
            gone: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            eventfd,
            limits,
            budget: crate::budget::Budget::shared(10_000, 10),
            max_connection_bytes: 1 << 20,
            models: RwLock::new(None),
        });
        let (stop, shutdown) = watch::channel(false);
        let (killer, kill) = watch::channel(false);
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener).unwrap()
        };
        runtime.spawn(accept_loop(server.clone(), listener, shutdown, kill));
        let python = server.clone();
        runtime.spawn(async move {
            loop {
                let items: Vec<Item> = python.queue.lock().unwrap().drain(..).collect();
                for item in items {
                    let (id, body) = match item {
                        Item::Raw { id, body, .. } => (id, body),
                        Item::Infer { id, decoded, .. } => (id, Bytes::from(format!("rows {:?}", decoded.rows()))),
                        Item::Body { id, problem, .. } => (id, Bytes::from(format!("problem {problem:?}"))),
                    };
                    if let Some(sender) = python.waiting.lock().unwrap().remove(&id) {
                        let _ = sender.send(Reply { status: 200, headers: vec![], body });
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        (address, (server, runtime, [stop, killer]))
    }

    /// Everything the server sends until it closes the connection or `wait` passes.
    fn read_all(stream: &mut std::net::TcpStream, wait: Duration) -> String {
        stream.set_read_timeout(Some(wait)).unwrap();
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stream.read(&mut chunk) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn pipelined_chunked_and_continued_requests_are_answered_in_order() {
        let (address, _serving) = serve(limits());
        let mut client = std::net::TcpStream::connect(address).unwrap();
        let infer = br#"{"inputs":[{"name":"X","datatype":"FP32","shape":[2,1],"data":[1,2]}]}"#;
        let mut requests = format!("POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: {}\r\n\r\n", infer.len()).into_bytes();
        requests.extend_from_slice(infer);
        requests.extend_from_slice(b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n");
        requests.extend_from_slice(b"GET /v2 HTTP/1.1\r\nConnection: close\r\n\r\n");
        client.write_all(&requests).unwrap();
        let answers = read_all(&mut client, Duration::from_secs(5));
        let bodies: Vec<&str> = answers.split("HTTP/1.1 200 OK").skip(1).map(|a| a.rsplit("\r\n\r\n").next().unwrap()).collect();
        assert_eq!(bodies, ["rows Some(2)", "abcde", ""], "{answers}");
        assert!(answers.rsplit("HTTP/1.1").next().unwrap().contains("connection: close\r\n"), "{answers}");
        let mut continued = std::net::TcpStream::connect(address).unwrap();
        continued.write_all(b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n").unwrap();
        let mut first = [0u8; 25];
        continued.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"HTTP/1.1 100 Continue\r\n\r\n");
        continued.write_all(b"hi").unwrap();
        assert!(read_all(&mut continued, Duration::from_millis(200)).ends_with("\r\n\r\nhi"));
    }

    #[test]
    fn idle_silent_and_slow_connections_are_closed_and_oversized_bodies_skipped() {
        let (address, _serving) = serve(limits());
        let started = std::time::Instant::now();
        let mut silent = std::net::TcpStream::connect(address).unwrap();
        assert_eq!(read_all(&mut silent, Duration::from_secs(3)), ""); // closed: header timeout
        assert!(started.elapsed() >= Duration::from_millis(350));
        let mut slow = std::net::TcpStream::connect(address).unwrap();
        slow.write_all(b"POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nab").unwrap();
        assert_eq!(read_all(&mut slow, Duration::from_secs(3)), ""); // closed: body timeout
        let mut idle = std::net::TcpStream::connect(address).unwrap();
        idle.write_all(b"GET /v2 HTTP/1.1\r\n\r\n").unwrap();
        let answer = read_all(&mut idle, Duration::from_secs(3)); // answered, then closed when idle
        assert!(answer.starts_with("HTTP/1.1 200 OK") && !answer.contains("connection: close"), "{answer}");
        let mut big = std::net::TcpStream::connect(address).unwrap();
        let mut requests = b"POST /echo HTTP/1.1\r\nContent-Length: 1001\r\n\r\n".to_vec();
        requests.extend_from_slice(&[b'x'; 1001]);
        requests.extend_from_slice(b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        big.write_all(&requests).unwrap();
        let answers = read_all(&mut big, Duration::from_secs(3));
        // over the limit: handed on without its body (the app refuses it), which is skipped
        assert_eq!(answers.matches("HTTP/1.1 200 OK").count(), 2, "{answers}");
        assert!(answers.ends_with("\r\n\r\nok"), "{answers}");
    }


    /// The status line and body of the answer to `request` on a fresh connection, and
    /// whether the server closed the connection after it.
    fn refused(address: std::net::SocketAddr, request: &[u8]) -> (String, String) {
        let mut client = std::net::TcpStream::connect(address).unwrap();
        let _ = client.write_all(request); // the server may close before it has read it all
        let answer = read_all(&mut client, Duration::from_secs(3));
        let status = answer.split("\r\n").next().unwrap_or("").to_string();
        (status, answer.rsplit("\r\n\r\n").next().unwrap_or("").to_string())
    }

    #[test]
    fn heads_over_the_limits_get_our_refusals_and_the_connection_closes() {
        let (address, _serving) = serve(limits()); // 200 bytes of head, 4 header lines
        let (status, body) = refused(address, &[b"GET /".as_slice(), &[b'a'; 300]].concat());
        assert_eq!(status, "HTTP/1.1 414 URI Too Long");
        let (status, _) = refused(address, &[b"GET /".as_slice(), &[b'a'; 198]].concat()); // 203 bytes: the URL 199
        assert_eq!(status, "HTTP/1.1 414 URI Too Long");
        assert_eq!(body, r#"{"error":"the request URL exceed max_header_bytes (200)"}"#);
        let (status, body) = refused(address, &[b"GET / HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 300]].concat());
        assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
        assert_eq!(body, r#"{"error":"the request line and headers exceed max_header_bytes (200)"}"#);
        let (status, body) = refused(address, b"GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
        assert_eq!(body, r#"{"error":"the header lines exceed max_header_count (4)"}"#);
        for bad in [&b"GET / HTTP/1.1\r\nno colon\r\n\r\n"[..], b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"] {
            let (status, body) = refused(address, bad);
            assert_eq!(status, "HTTP/1.1 400 Bad Request");
            assert!(body.starts_with(r#"{"error":"invalid HTTP request"#), "{body}");
        }
        // a head within the limits, after an answered one on the same connection
        let mut client = std::net::TcpStream::connect(address).unwrap();
        client.write_all(b"GET /a HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\n\r\n").unwrap();
        client.write_all(&[b"GET / HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 300]].concat()).unwrap();
        let answers = read_all(&mut client, Duration::from_secs(3));
        assert!(answers.starts_with("HTTP/1.1 200 OK") && answers.contains("HTTP/1.1 431"), "{answers}");
    }

    #[test]
    fn a_body_waits_for_room_in_the_budget_and_is_refused_unread_past_the_admission_timeout() {
        let (address, serving) = serve(limits());
        assert!(serving.0.budget.try_take(10, 0)); // every call of the budget taken
        let (status, body) = refused(address, b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 503 Service Unavailable"); // no 100 Continue before it
        assert!(body.contains("admission_timeout_s"), "{body}");
        serving.0.budget.give(10, 0);
        let (status, body) = refused(address, b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi");
        assert_eq!((status.as_str(), body.as_str()), ("HTTP/1.1 200 OK", "hi"));
        assert_eq!((serving.0.budget.calls.used(), serving.0.budget.bytes.used()), (0, 0)); // given back
    }

    #[test]
    fn an_infer_request_whose_client_left_while_it_waited_for_room_is_counted_as_gone() {
        // its future is dropped before it is handed to Python (as hyper may drop it even
        // before its first poll): the request is counted with those whose clients left
        let (address, serving) = serve(Limits { admission_timeout: Duration::from_secs(30), ..limits() });
        let server = &serving.0;
        assert!(server.budget.try_take(10, 0)); // every call of the budget taken
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.write_all(b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while server.in_flight.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2)); // until it waits for room
        }
        drop(stream);
        while server.gone.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        let gone: Vec<String> = server.gone.lock().unwrap().iter().map(|(model, _)| model.clone()).collect();
        assert_eq!(gone, vec!["m".to_string()]);
        assert_eq!(server.in_flight.load(Ordering::SeqCst), 0);
    }
}
