//! Connections: accepting them (within the connection cap and the descriptor reserve),
//! serving each over HTTP/2, and closing those that hold the server without using it.  What
//! the watchdog knows of a connection (`ConnState`: bytes read, calls in progress and
//! ended), the stream that counts what is read (`Watched`), binding and accepting
//! (`accept_until`) serve the HTTP/1.1 transport (module `http`) as well.
//!
//! A connection that has not sent the 24 bytes of the HTTP/2 preface within the header
//! timeout is dropped; one without a call in progress for the idle timeout is asked to go
//! (GOAWAY) and dropped if it has not gone after the header timeout more.  On shutdown the
//! connections already waiting in the listener's accept queue are accepted first (their
//! clients may have sent calls on them), then every connection is asked to go.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::budget;
use crate::grpc::{self, Server};

/// The client connection preface every HTTP/2 connection starts with (RFC 9113, 3.4).
const PREFACE_LEN: usize = 24;
/// HTTP/2 flow-control windows: what a client may send before the server reads it, on one
/// call and on one connection (calls waiting for room hold what they sent in these).
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 2 << 20;

/// The bounds every connection and call is held to (see server/settings.py for each).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_message_bytes: usize,
    pub max_connection_bytes: usize,
    pub max_header_bytes: u32,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub admission_timeout: Duration,
    pub max_connections: usize,
    /// Accepted sockets whose descriptor is this or higher are closed at once: fewer than the
    /// reserve are free.
    pub max_descriptor: RawFd,
}

/// What the connection watchdog knows of one connection (either transport's).
pub struct ConnState {
    pub bytes: Arc<budget::Connection>,
    opened: Instant,
    /// Bytes read from the connection.
    read: AtomicUsize,
    active: AtomicUsize,
    /// Calls ended, and `read` when the last one ended.
    ended: AtomicUsize,
    read_at_end: AtomicUsize,
    /// Milliseconds after `opened` when the last call ended (or 0).
    last_call_ms: AtomicU64,
}

impl ConnState {
    pub fn new(max_bytes: usize) -> Self {
        ConnState {
            bytes: Arc::new(budget::Connection::new(max_bytes)),
            opened: Instant::now(),
            read: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            ended: AtomicUsize::new(0),
            read_at_end: AtomicUsize::new(0),
            last_call_ms: AtomicU64::new(0),
        }
    }

    /// Calls ended.
    pub fn ended(&self) -> usize {
        self.ended.load(Ordering::SeqCst)
    }

    /// Calls in progress.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Whether the connection has served a call and sent nothing since the last one ended,
    /// for `idle` or longer (HTTP/1.1's keep-alive timeout).
    pub fn idle_between_calls(&self, idle: Duration) -> bool {
        self.ended.load(Ordering::SeqCst) > 0
            && self.read.load(Ordering::SeqCst) == self.read_at_end.load(Ordering::SeqCst)
            && self.idle_for().is_some_and(|for_| for_ >= idle)
    }

    /// Whether anything was read since the last call ended (or the connection opened).
    pub fn read_since_call(&self) -> bool {
        self.read.load(Ordering::SeqCst) != self.read_at_end.load(Ordering::SeqCst)
    }

    /// Counts a call in progress on this connection until dropped.
    pub fn call(self: &Arc<Self>) -> ActiveCall {
        self.active.fetch_add(1, Ordering::SeqCst);
        ActiveCall(self.clone())
    }

    fn idle_for(&self) -> Option<Duration> {
        if self.active.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_call_ms.load(Ordering::SeqCst));
        Some(self.opened.elapsed().saturating_sub(last))
    }
}

pub struct ActiveCall(Arc<ConnState>);

impl Drop for ActiveCall {
    fn drop(&mut self) {
        let state = &self.0;
        state.last_call_ms.store(state.opened.elapsed().as_millis() as u64, Ordering::SeqCst);
        state.read_at_end.store(state.read.load(Ordering::SeqCst), Ordering::SeqCst);
        state.ended.fetch_add(1, Ordering::SeqCst);
        state.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A TCP stream that counts the bytes read from it, for the watchdog.
pub struct Watched {
    pub stream: TcpStream,
    state: Arc<ConnState>,
}

impl Watched {
    pub fn new(stream: TcpStream, state: Arc<ConnState>) -> Self {
        Watched { stream, state }
    }

    pub fn state(&self) -> &Arc<ConnState> {
        &self.state
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            self.state.read.fetch_add(read, Ordering::SeqCst);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Resolves once shutdown was asked for.
pub async fn closing(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|closing| *closing).await;
}

/// Counts an open connection until dropped.
struct Open(Arc<Server>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve_connection(server: Arc<Server>, stream: TcpStream, shutdown: watch::Receiver<bool>) {
    let _open = Open(server.clone());
    let _ = stream.set_nodelay(true);
    let limits = server.limits;
    let state = Arc::new(ConnState::new(limits.max_connection_bytes));
    let io = Watched { stream, state: state.clone() };
    let service = grpc::service(server.clone(), state.clone());
    let connection = http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(crate::grpc::MAX_FRAME as u32)
        .max_header_list_size(limits.max_header_bytes)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let period = limits.header_timeout.min(limits.idle_timeout).div_f64(4.0);
    let mut tick = tokio::time::interval(period.clamp(Duration::from_millis(5), Duration::from_secs(1)));
    let shutting_down = loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            _ = closing(shutdown.clone()) => break true,
            _ = tick.tick() => {
                if state.read.load(Ordering::Relaxed) < PREFACE_LEN && state.opened.elapsed() >= limits.header_timeout {
                    return; // no preface: dropped, which closes it
                }
                if state.idle_for().is_some_and(|idle| idle >= limits.idle_timeout) {
                    break false;
                }
            }
        }
    };
    connection.as_mut().graceful_shutdown();
    if shutting_down {
        // calls in flight are answered; `close` ends what is left
        let _ = connection.await;
    } else {
        let _ = tokio::time::timeout(limits.header_timeout, connection).await;
    }
}

/// Connections waiting in the accept queue of listening socket `fd` (Linux: TCP_INFO's
/// `tcpi_unacked` on a listener); 0 where it cannot be read.
pub fn accept_queue(fd: RawFd) -> u32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: tcp_info is plain old data; getsockopt writes at most `len` bytes into it.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let ok = unsafe {
            libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info as *mut _ as *mut libc::c_void, &mut len)
        };
        if ok == 0 {
            return info.tcpi_unacked;
        }
    }
    let _ = fd;
    0
}

fn admit(server: &Arc<Server>, stream: TcpStream, shutdown: &watch::Receiver<bool>, kill: &watch::Receiver<bool>) {
    let limits = &server.limits;
    if stream.as_raw_fd() >= limits.max_descriptor {
        server.refused.fetch_add(1, Ordering::Relaxed);
        return; // dropped: closed at once, leaving the reserve free
    }
    if server.connections.fetch_add(1, Ordering::SeqCst) >= limits.max_connections {
        server.connections.fetch_sub(1, Ordering::SeqCst);
        server.refused.fetch_add(1, Ordering::Relaxed);
        return;
    }
    crate::spawn_killable(kill, serve_connection(server.clone(), stream, shutdown.clone()));
}

pub async fn accept_loop(
    server: Arc<Server>,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
    kill: watch::Receiver<bool>,
) {
    accept_until(listener, shutdown.clone(), |stream| admit(&server, stream, &shutdown, &kill)).await;
}

/// Accept connections on `listener` into `admit` until shutdown; then those the kernel
/// accepted already (their clients may have sent calls on them) before the listener closes.
pub async fn accept_until(listener: TcpListener, shutdown: watch::Receiver<bool>, mut admit: impl FnMut(TcpStream)) {
    let stop = closing(shutdown);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => admit(stream),
                // out of descriptors and the like: a moment, then accept again
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = &mut stop => break,
        }
    }
    let fd = listener.as_raw_fd();
    while accept_queue(fd) > 0 {
        match tokio::time::timeout(Duration::from_millis(100), listener.accept()).await {
            Ok(Ok((stream, _))) => admit(stream),
            _ => break,
        }
    }
}

pub fn bind(host: &str, port: u16, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    let address: SocketAddr = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no address for {host}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_queue_counts_connections_not_yet_accepted() {
        let listener = bind("127.0.0.1", 0, false).unwrap();
        let address = listener.local_addr().unwrap();
        assert_eq!(accept_queue(listener.as_raw_fd()), 0);
        let clients: Vec<_> = (0..3).map(|_| std::net::TcpStream::connect(address).unwrap()).collect();
        assert_eq!(accept_queue(listener.as_raw_fd()), 3);
        let _first = loop {
            match listener.accept() {
                Ok(accepted) => break accepted,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(error) => panic!("{error}"),
            }
        };
        assert_eq!(accept_queue(listener.as_raw_fd()), 2);
        drop(clients);
    }

    #[test]
    fn idle_time_counts_from_the_last_call() {
        let state = Arc::new(ConnState::new(10));
        let call = state.call();
        assert_eq!(state.idle_for(), None);
        drop(call);
        assert!(state.idle_for().unwrap() < Duration::from_secs(1));
    }
}
