//! tierserve's native front end: gRPC and HTTP/1.1 in Rust, answered in Python.
//!
//! Both transports run on one small tokio runtime (`Runtime`), both on hyper: gRPC
//! (`GrpcTransport`) is hyper's HTTP/2 with tonic's gRPC protocol; HTTP (`HttpTransport`,
//! module `http`) is hyper's HTTP/1.1, and decodes KServe v2 infer requests (`kserve`).  The requests are
//! answered in Python, on the server's event loop (`server/grpc/native.py`,
//! `server/http/native.py`).  No thread of this module ever takes the GIL: a request is
//! queued and an eventfd is written when the queue was empty; the event loop, woken by the
//! eventfd, takes the queued requests (`take`) and answers each with `reply`.  A request
//! whose client gave up (a gRPC deadline or cancel, an HTTP client that hung up) stops being
//! `pending`, and Python drops it if it has not run.
//!
//! Every request is held to its transport's limits: room in the process's `Budget` (calls
//! and bytes in flight, shared by both transports) before its body is read, waiting up to
//! the admission timeout; its body within the body timeout; connections without a request
//! (or an HTTP/2 preface) are closed, and new ones are refused over the connection cap or
//! when the descriptors run short.  Large blocks are mapped on their own (`alloc`), so the
//! memory of a burst goes back to the OS.

mod alloc;
mod batch;
mod budget;
mod conn;
mod grpc;
mod h1io;
mod head;
mod http;
mod http_py;
mod kserve;

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::net::TcpListener;
use tokio::sync::watch;

use budget::Budget;
use conn::Limits;
use grpc::{Reply, Server};

#[global_allocator]
static ALLOCATOR: alloc::MapLarge = alloc::MapLarge;

pub fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("{name}: give a positive number of seconds, not {value}")))
}

/// The tokio runtime the transports of one process share.
#[pyclass(module = "tierserve_native", frozen)]
pub struct Runtime {
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
}

impl Runtime {
    fn build(threads: usize) -> PyResult<Runtime> {
        if threads == 0 {
            return Err(PyValueError::new_err("threads: give at least 1"));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("tierserve-io")
            .enable_all()
            .build()
            .map_err(|error| PyRuntimeError::new_err(format!("tokio runtime: {error}")))?;
        let handle = runtime.handle().clone();
        Ok(Runtime { runtime: Mutex::new(Some(runtime)), handle })
    }

    /// The runtime to serve on: `shared`, or one of its own of `threads` threads.
    fn pick(shared: Option<Py<Runtime>>, threads: usize, py: Python<'_>) -> PyResult<Py<Runtime>> {
        match shared {
            Some(runtime) => Ok(runtime),
            None => Py::new(py, Runtime::build(threads)?),
        }
    }
}

#[pymethods]
impl Runtime {
    #[new]
    #[pyo3(signature = (threads = 1))]
    fn new(threads: usize) -> PyResult<Self> {
        Runtime::build(threads)
    }

    /// Stop the runtime's threads (what still runs on them is dropped), without the GIL.
    fn close(&self, py: Python<'_>) {
        if let Some(runtime) = self.runtime.lock().unwrap().take() {
            py.detach(move || runtime.shutdown_timeout(Duration::from_secs(1)));
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.lock().unwrap().take() {
            runtime.shutdown_background();
        }
    }
}

/// What a transport's tasks are told: `shutdown` (drain: stop accepting, answer what was
/// sent) and `kill` (stop at once).
pub struct Signals {
    shutdown: watch::Sender<bool>,
    kill: watch::Sender<bool>,
}

impl Signals {
    fn new() -> Signals {
        Signals { shutdown: watch::channel(false).0, kill: watch::channel(false).0 }
    }
}

/// Run `task` on `runtime` until it ends or `kill` is sent.
pub fn spawn_killable<F>(kill: &watch::Receiver<bool>, task: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut kill = kill.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = task => {}
            _ = async { let _ = kill.wait_for(|killed| *killed).await; } => {}
        }
    });
}

/// An eventfd for one transport's queue.
fn new_eventfd() -> PyResult<RawFd> {
    // SAFETY: eventfd has no memory arguments; the result is checked.
    let eventfd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if eventfd < 0 {
        return Err(PyOSError::new_err(format!("eventfd: {}", std::io::Error::last_os_error())));
    }
    Ok(eventfd)
}

/// Bind `host:port` for a transport and hand the listener to `runtime`.
fn listen(runtime: &Runtime, what: &str, host: &str, port: u16, reuse_port: bool) -> PyResult<(TcpListener, u16)> {
    let listener = conn::bind(host, port, reuse_port)
        .map_err(|error| PyOSError::new_err(format!("{what} transport cannot listen on {host}:{port}: {error}")))?;
    let port = listener.local_addr().map_err(|error| PyOSError::new_err(error.to_string()))?.port();
    let _entered = runtime.handle.enter();
    let listener = TcpListener::from_std(listener).map_err(|error| PyOSError::new_err(error.to_string()))?;
    Ok((listener, port))
}

/// The gRPC transport: serves HTTP/2 on `host:port` and queues every unary call of
/// `inference.GRPCInferenceService` for Python (see the module documentation).
#[pyclass(module = "tierserve_native")]
struct GrpcTransport {
    shared: Arc<Server>,
    runtime: Py<Runtime>,
    /// The runtime is this transport's own (closed with it).
    owned: bool,
    signals: Signals,
    port: u16,
}

#[pymethods]
impl GrpcTransport {
    /// Bind `host:port` (0: a free port) and start serving on `runtime` (or a runtime of its
    /// own of `threads` threads), taking room for calls from `budget`; the limits are
    /// server/settings.py's of the same names.
    #[new]
    #[pyo3(signature = (
        host, port, *, budget, reuse_port = false, max_message_bytes = 64 << 20,
        max_connection_bytes = 128 << 20, max_header_bytes = 64 << 10, header_timeout_s = 10.0,
        body_timeout_s = 60.0, idle_timeout_s = 60.0, admission_timeout_s = 5.0,
        max_connections = 4096, max_descriptor = RawFd::MAX, threads = 1, runtime = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        host: &str,
        port: u16,
        budget: &Budget,
        reuse_port: bool,
        max_message_bytes: usize,
        max_connection_bytes: usize,
        max_header_bytes: u32,
        header_timeout_s: f64,
        body_timeout_s: f64,
        idle_timeout_s: f64,
        admission_timeout_s: f64,
        max_connections: usize,
        max_descriptor: RawFd,
        threads: usize,
        runtime: Option<Py<Runtime>>,
    ) -> PyResult<Self> {
        let owned = runtime.is_none();
        let runtime = Runtime::pick(runtime, threads, py)?;
        let limits = Limits {
            max_message_bytes,
            max_connection_bytes,
            max_header_bytes,
            header_timeout: seconds("header_timeout_s", header_timeout_s)?,
            body_timeout: seconds("body_timeout_s", body_timeout_s)?,
            idle_timeout: seconds("idle_timeout_s", idle_timeout_s)?,
            admission_timeout: seconds("admission_timeout_s", admission_timeout_s)?,
            max_connections,
            max_descriptor,
        };
        let (listener, port) = listen(runtime.get(), "gRPC", host, port, reuse_port)?;
        let eventfd = new_eventfd()?;
        let shared = Arc::new(Server {
            queue: Mutex::new(Vec::new()),
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            eventfd,
            limits,
            budget: budget.shared.clone(),
        });
        let signals = Signals::new();
        let (closing, kill) = (signals.shutdown.subscribe(), signals.kill.subscribe());
        runtime.get().handle.spawn(conn::accept_loop(shared.clone(), listener, closing, kill));
        Ok(GrpcTransport { shared, runtime, owned, signals, port })
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

    /// Open connections.
    #[getter]
    fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Connections closed as soon as accepted: over the cap, or into the descriptor reserve.
    #[getter]
    fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Calls queued for `take`.
    #[getter]
    fn queued(&self) -> usize {
        self.shared.queue.lock().unwrap().len()
    }

    /// The queued calls, oldest first, as `(id, method, message, authorization)` tuples: at
    /// most `max_calls`, and no more once `max_bytes` of messages are taken (the first is
    /// always taken).  Clears the eventfd first, so a call queued after this returns wakes
    /// the loop again; calls left queued (see `queued`) do not.
    #[pyo3(signature = (max_calls = usize::MAX, max_bytes = usize::MAX))]
    fn take<'py>(
        &self,
        py: Python<'py>,
        max_calls: usize,
        max_bytes: usize,
    ) -> Vec<(u64, String, Bound<'py, PyBytes>, Option<String>)> {
        self.shared.clear_wake();
        let calls: Vec<grpc::Call> = {
            let mut queue = self.shared.queue.lock().unwrap();
            let (mut count, mut size) = (0, 0);
            while count < queue.len() && count < max_calls && (count == 0 || size < max_bytes) {
                size += queue[count].message.len();
                count += 1;
            }
            queue.drain(..count).collect()
        };
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
        let payload = if status == 0 { Bytes::copy_from_slice(payload) } else { Bytes::new() };
        // the client may have gone: nothing to do then
        let _ = sender.send(Reply { status, message: message.to_string(), payload });
        true
    }

    /// Stop accepting connections and ask open ones to finish (GOAWAY); calls in flight
    /// are still answered until `close`.
    fn begin_shutdown(&self) {
        let _ = self.signals.shutdown.send(true);
    }

    /// Stop serving: calls not yet answered get UNAVAILABLE, connections are dropped; a
    /// runtime of its own is stopped (without holding the GIL).
    fn close(&mut self, py: Python<'_>) {
        let _ = self.signals.shutdown.send(true);
        let _ = self.signals.kill.send(true);
        self.shared.waiting.lock().unwrap().clear();
        self.shared.queue.lock().unwrap().clear();
        if self.owned {
            self.runtime.get().close(py);
        }
    }
}

impl Drop for GrpcTransport {
    fn drop(&mut self) {
        let _ = self.signals.shutdown.send(true);
        let _ = self.signals.kill.send(true);
    }
}

/// Make `eventfd` readable (the event loop wakes up).
pub fn wake(eventfd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a full counter (EAGAIN)
    // already means "wake up".
    unsafe { libc::write(eventfd, &one as *const u64 as *const libc::c_void, 8) };
}

/// Make `eventfd` unreadable again.
pub fn clear_wake(eventfd: RawFd) {
    let mut count: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
    unsafe { libc::read(eventfd, &mut count as *mut u64 as *mut libc::c_void, 8) };
}

#[pymodule]
fn tierserve_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Runtime>()?;
    module.add_class::<GrpcTransport>()?;
    module.add_class::<http_py::HttpTransport>()?;
    module.add_class::<Budget>()?;
    Ok(())
}
