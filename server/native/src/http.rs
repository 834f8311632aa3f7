//! The HTTP/1.1 front end: connections, request heads and bodies within the limits, infer
//! requests decoded here, every request queued for Python and its answer written back.
//!
//! One task per connection reads requests one after another (keep-alive; pipelined requests
//! wait in the buffer for their turn), each within its limits: the head (request line and
//! headers) within `max_header_bytes` and `max_header_count` as it arrives (414 for the URL,
//! 431 else, before more is read), within the header timeout of its first byte (or of the
//! connection opening); the body (Content-Length or chunked) within the body timeout, after
//! its room in the budget was found (waiting for it with nothing read; `Expect:
//! 100-continue` is answered then); a connection idle between requests is closed after the
//! keep-alive timeout.  `POST /v2/models/{m}[/versions/{v}]/infer` is inflated and decoded
//! here (`kserve`); anything that is not a well-formed request of that kind, and every other
//! route, is handed to Python as it came.  While a request waits for its answer the socket
//! is watched: a client that hangs up has its request dropped (`pending` turns false).

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::budget::{self, Held};
use crate::head::{error_reply, framing, infer_path, parse_head, response_head, Framing, Head, Refusal};
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

struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Counted(counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

// --- one connection -------------------------------------------------------------------------

/// Why a connection stops.
enum Stop {
    /// Closed, timed out, or gone: nothing more is written.
    Closed,
}

struct Conn<'a> {
    server: &'a HttpServer,
    stream: TcpStream,
    buf: BytesMut,
    draining: bool,
}

impl Conn<'_> {
    /// Read more into the buffer until `deadline` (Err: closed, failed or timed out).
    async fn read_more(&mut self, deadline: Instant) -> Result<(), Stop> {
        self.buf.reserve(16 << 10);
        match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
            Ok(Ok(n)) if n > 0 => Ok(()),
            _ => Err(Stop::Closed),
        }
    }

    async fn write(&mut self, head: &[u8], body: &[u8]) -> Result<(), Stop> {
        let deadline = Instant::now() + self.server.limits.body_timeout;
        let write = async {
            if body.len() < (64 << 10) {
                let mut all = Vec::with_capacity(head.len() + body.len());
                all.extend_from_slice(head);
                all.extend_from_slice(body);
                self.stream.write_all(&all).await
            } else {
                self.stream.write_all(head).await?;
                self.stream.write_all(body).await
            }
        };
        match tokio::time::timeout_at(deadline, write).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(Stop::Closed),
        }
    }

    async fn answer(&mut self, reply: &Reply, head_only: bool, close: bool) -> Result<(), Stop> {
        let head = response_head(reply.status, &reply.headers, reply.body.len(), close);
        self.write(&head, if head_only { b"" } else { &reply.body }).await
    }

    /// Wait for the next request's head: its first byte by `deadline`, then all of it
    /// within the header timeout of that byte (`rearm` false: still by `deadline`, which is
    /// the header timeout of the connection's opening for its first request).
    async fn next_head(&mut self, mut deadline: Instant, mut rearm: bool, shutdown: &mut watch::Receiver<bool>) -> Result<Head, Stop> {
        let limits = self.server.limits;
        if !self.buf.is_empty() && rearm {
            deadline = Instant::now() + limits.header_timeout; // pipelined: it has begun
            rearm = false;
        }
        loop {
            match parse_head(&self.buf, &limits) {
                Ok(Some(head)) => return Ok(head),
                Ok(None) => {}
                Err(refusal) => {
                    let _ = self.answer(&error_reply(&refusal), false, true).await;
                    return Err(Stop::Closed);
                }
            }
            if self.draining && self.buf.is_empty() && unread(self.stream.as_raw_fd()) == 0 {
                return Err(Stop::Closed); // between requests, nothing on its way: closed at once
            }
            tokio::select! {
                read = self.read_more(deadline) => {
                    read?;
                    if rearm {
                        deadline = Instant::now() + limits.header_timeout;
                        rearm = false;
                    }
                }
                _ = signalled(shutdown), if !self.draining => self.draining = true,
            }
        }
    }
}

/// Resolves once `signal` is true.
async fn signalled(signal: &mut watch::Receiver<bool>) {
    let _ = signal.wait_for(|on| *on).await;
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

/// Serve one connection until it closes (see the module documentation).
pub async fn serve_connection(server: Arc<HttpServer>, stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
    let _open = Open(server.clone());
    let _ = stream.set_nodelay(true);
    let limits = server.limits;
    let mut conn = Conn { server: &server, stream, buf: BytesMut::with_capacity(8 << 10), draining: *shutdown.borrow() };
    let mut deadline = Instant::now() + limits.header_timeout;
    let mut rearm = false; // the first request's head is due within the header timeout of opening
    loop {
        let Ok(head) = conn.next_head(deadline, rearm, &mut shutdown).await else { return };
        let _ = conn.buf.split_to(head.length);
        let keep = match request(&mut conn, head, &mut shutdown).await {
            Ok(keep) => keep,
            Err(Stop::Closed) => return,
        };
        if !keep {
            let _ = conn.stream.shutdown().await;
            return;
        }
        deadline = Instant::now() + limits.keep_alive_timeout;
        rearm = true;
    }
}

/// Counts an open connection until dropped.
struct Open(Arc<HttpServer>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Queue `item` for Python and wait for its answer (None: the client left, and its request
/// is dropped, or the transport closes).
async fn ask(conn: &mut Conn<'_>, item: Item, shutdown: &mut watch::Receiver<bool>) -> Option<Reply> {
    let server = conn.server;
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
    await_reply(conn, receiver, shutdown).await
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

/// Serve one request whose head was read; Ok(false): close the connection after it.
async fn request(conn: &mut Conn<'_>, head: Head, shutdown: &mut watch::Receiver<bool>) -> Result<bool, Stop> {
    let server = conn.server;
    let _in_flight = Counted::new(&server.in_flight);
    let arrived = Instant::now();
    let limits = server.limits;
    let framing = match framing(&head) {
        Ok(framing) => framing,
        Err(refusal) => {
            conn.answer(&error_reply(&refusal), false, true).await?;
            return Ok(false);
        }
    };
    let expect = !head.http10 && head.has_token(b"expect", "100-continue");
    let keep = head.keep_alive();
    let infer = infer_path(&head.method, &head.target);
    let has_body = framing != Framing::Length(0);
    let over_limit = matches!(framing, Framing::Length(n) if n > limits.max_request_bytes);
    let fields = |head: &Head| InferHeaders {
        length: head.text(b"content-length"),
        encoding: head.text(b"content-encoding"),
        header_length: head.text(b"inference-header-content-length"),
    };
    // refused before its body is read: a model not served (Python has the last word), a
    // declared body over the limit
    let refused = match &infer {
        Some((model, version)) if over_limit || !server.serves(model, version) => {
            let problem = if over_limit { "too large" } else { "check" };
            Some(Item::Body {
                id: server.next_id.fetch_add(1, Ordering::Relaxed),
                model: model.clone(),
                version: version.clone(),
                headers: fields(&head),
                body: None,
                problem: Some(problem),
                arrived,
            })
        }
        None if over_limit => Some(raw_item(server, &head, Bytes::new())),
        _ => None,
    };
    if let Some(item) = refused {
        let Some(reply) = ask(conn, item, shutdown).await else { return Err(Stop::Closed) };
        if reply.status != 0 {
            // answered at once; its body is skipped (unless the client waits to be asked for it)
            let keep = keep && !expect && !conn.draining;
            conn.answer(&reply, head.method == "HEAD", !keep).await?;
            return if keep { skip(conn, &framing).await.map(|()| true) } else { Ok(false) };
        }
    }
    // room in the budget before the body is read: its declared length, or the most allowed
    let mut held = None;
    if has_body {
        let need = match framing {
            Framing::Length(n) => n,
            Framing::Chunked => limits.max_request_bytes,
        };
        held = Held::request(&server.budget, need, arrived + limits.admission_timeout).await;
        if held.is_none() {
            let reply = match &infer {
                Some((model, version)) => {
                    let id = server.next_id.fetch_add(1, Ordering::Relaxed);
                    let item = Item::Body {
                        id,
                        model: model.clone(),
                        version: version.clone(),
                        headers: fields(&head),
                        body: None,
                        problem: Some("busy"),
                        arrived,
                    };
                    ask(conn, item, shutdown).await.ok_or(Stop::Closed)?
                }
                None => error_reply(&busy(server)),
            };
            conn.answer(&reply, head.method == "HEAD", true).await?;
            return Ok(false); // its body unread
        }
        if expect && conn.buf.len() < if let Framing::Length(n) = framing { n } else { usize::MAX } {
            conn.write(b"HTTP/1.1 100 Continue\r\n\r\n", b"").await?;
        }
    }
    let deadline = Instant::now() + limits.body_timeout;
    let read = match framing {
        Framing::Length(n) => read_length(conn, n, deadline).await.map(|b| (b, false)),
        Framing::Chunked => read_chunked(conn, limits.max_request_bytes, deadline).await,
    };
    let (body, exceeded) = match read {
        Ok(read) => read,
        Err(stop) => {
            if let Some((model, _)) = infer {
                server.gone.lock().unwrap().push((model, arrived)); // counted as a 499
                crate::wake(server.eventfd);
            }
            return Err(stop);
        }
    };
    let item = match infer {
        Some((model, version)) => {
            let id = server.next_id.fetch_add(1, Ordering::Relaxed);
            if exceeded {
                let headers = fields(&head);
                Item::Body { id, model, version, headers, body: None, problem: Some("exceeded"), arrived }
            } else {
                infer_item(id, model, version, fields(&head), body, arrived, limits.max_request_bytes)
            }
        }
        None => raw_item(server, &head, body),
    };
    let Some(reply) = ask(conn, item, shutdown).await else { return Err(Stop::Closed) };
    let keep = keep && !conn.draining;
    conn.answer(&reply, head.method == "HEAD", !keep).await?;
    drop(held); // room given back once the answer is written
    Ok(keep)
}

fn raw_item(server: &HttpServer, head: &Head, body: Bytes) -> Item {
    Item::Raw {
        id: server.next_id.fetch_add(1, Ordering::Relaxed),
        method: head.method.clone(),
        target: head.target.clone(),
        headers: head.headers.clone(),
        body,
    }
}

/// Read past the body of a request answered without it.
async fn skip(conn: &mut Conn<'_>, framing: &Framing) -> Result<(), Stop> {
    let deadline = Instant::now() + conn.server.limits.body_timeout;
    match *framing {
        Framing::Length(mut left) => {
            while left > 0 {
                if conn.buf.is_empty() {
                    conn.read_more(deadline).await?;
                }
                let n = left.min(conn.buf.len());
                let _ = conn.buf.split_to(n);
                left -= n;
            }
            Ok(())
        }
        Framing::Chunked => read_chunked(conn, 0, deadline).await.map(|_| ()),
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

/// Wait for Python's answer, reading what the client sends meanwhile (a pipelined request,
/// up to a bound): None when the client closed its side (its request is dropped) or the
/// transport closes.
async fn await_reply(conn: &mut Conn<'_>, receiver: oneshot::Receiver<Reply>, shutdown: &mut watch::Receiver<bool>) -> Option<Reply> {
    tokio::pin!(receiver);
    let cap = conn.server.limits.max_header_bytes + (64 << 10);
    loop {
        tokio::select! {
            reply = &mut receiver => return reply.ok(),
            read = async { conn.buf.reserve(16 << 10); conn.stream.read_buf(&mut conn.buf).await }, if conn.buf.len() < cap => {
                match read {
                    Ok(n) if n > 0 => {}
                    _ => return None,
                }
            }
            _ = signalled(shutdown), if !conn.draining => conn.draining = true,
        }
    }
}

async fn read_length(conn: &mut Conn<'_>, length: usize, deadline: Instant) -> Result<Bytes, Stop> {
    if conn.buf.len() < length {
        conn.buf.reserve(length - conn.buf.len());
    }
    while conn.buf.len() < length {
        match tokio::time::timeout_at(deadline, conn.stream.read_buf(&mut conn.buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Err(Stop::Closed),
        }
    }
    Ok(conn.buf.split_to(length).freeze())
}

/// A chunked body, at most `limit` bytes (past it the rest is read and dropped, and `true`
/// says so), trailers read and dropped.
async fn read_chunked(conn: &mut Conn<'_>, limit: usize, deadline: Instant) -> Result<(Bytes, bool), Stop> {
    let mut body = BytesMut::new();
    let mut exceeded = false;
    let max_line = conn.server.limits.max_header_bytes;
    loop {
        let (skip, size) = loop {
            match httparse::parse_chunk_size(&conn.buf) {
                Ok(httparse::Status::Complete((skip, size))) => break (skip, size),
                Ok(httparse::Status::Partial) if conn.buf.len() <= max_line => conn.read_more(deadline).await?,
                _ => return Err(Stop::Closed),
            }
        };
        let _ = conn.buf.split_to(skip);
        if size == 0 {
            // trailers, then the empty line
            loop {
                let mut fields = [httparse::EMPTY_HEADER; 16];
                match httparse::parse_headers(&conn.buf, &mut fields) {
                    Ok(httparse::Status::Complete((used, _))) => {
                        let _ = conn.buf.split_to(used);
                        return Ok((body.freeze(), exceeded));
                    }
                    Ok(httparse::Status::Partial) if conn.buf.len() <= max_line => conn.read_more(deadline).await?,
                    _ => return Err(Stop::Closed),
                }
            }
        }
        let Ok(mut left) = usize::try_from(size) else { return Err(Stop::Closed) };
        if !exceeded && body.len().saturating_add(left) > limit {
            exceeded = true;
            body = BytesMut::new();
        }
        while left > 0 {
            if conn.buf.is_empty() {
                conn.read_more(deadline).await?;
            }
            let n = left.min(conn.buf.len());
            let data = conn.buf.split_to(n);
            if !exceeded {
                body.extend_from_slice(&data);
            }
            left -= n;
        }
        while conn.buf.len() < 2 {
            conn.read_more(deadline).await?;
        }
        if &conn.buf[..2] != b"\r\n" {
            return Err(Stop::Closed);
        }
        let _ = conn.buf.split_to(2);
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

/// Accept connections until shutdown; then take those waiting in the accept queue (their
/// clients may have sent requests on them) before the listener closes.
pub async fn accept_loop(
    server: Arc<HttpServer>,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
    kill: watch::Receiver<bool>,
) {
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => admit(&server, stream, &shutdown, &kill),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = signalled(&mut stop) => break,
        }
    }
    let fd = listener.as_raw_fd();
    while crate::conn::accept_queue(fd) > 0 {
        match tokio::time::timeout(Duration::from_millis(100), listener.accept()).await {
            Ok(Ok((stream, _))) => admit(&server, stream, &shutdown, &kill),
            _ => break,
        }
    }
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
        assert!(answers.ends_with("connection: close\r\n\r\n"), "{answers}");
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
}
