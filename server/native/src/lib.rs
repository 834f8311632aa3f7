//! tierserve's native gRPC transport.
//!
//! HTTP/2 and gRPC framing run here, on a small tokio runtime; the RPCs themselves are
//! answered in Python (`server/grpc_native.py`), on the server's event loop, by the same
//! code as the `grpc.aio` front end.  No thread of this module ever takes the GIL: a request
//! is queued and an eventfd is written when the queue was empty; the event loop, woken by
//! the eventfd, takes the queued requests (`take`) and answers each with `reply`.
//! A call still unanswered at its `grpc-timeout`, or cancelled by the client, stops being
//! `pending` (Python then drops it if it has not run) and the transport answers the deadline
//! itself.
//!
//! Every call is held to the limits of `conn::Limits`: room for it in the process's
//! `Budget` (calls and bytes in flight, shared with the HTTP front end) and in its
//! connection's bytes is taken before its body is read, waiting up to the admission timeout
//! (`budget`); its body must arrive within the body timeout; connections without a preface
//! or without calls are closed, and new ones are refused over the connection cap or when
//! the descriptors run short (`conn`).  Large blocks are mapped on their own (`alloc`), so
//! the memory of a burst goes back to the OS.

mod alloc;
mod budget;
mod conn;
mod grpc;

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
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

fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("{name}: give a positive number of seconds, not {value}")))
}

/// The gRPC transport: serves HTTP/2 on `host:port` and queues every unary call of
/// `inference.GRPCInferenceService` for Python (see the module documentation).
#[pyclass(module = "tierserve_native")]
struct GrpcTransport {
    shared: Arc<Server>,
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: watch::Sender<bool>,
    port: u16,
}

#[pymethods]
impl GrpcTransport {
    /// Bind `host:port` (0: a free port) and start serving on `threads` threads, taking room
    /// for calls from `budget`; the limits are server/settings.py's of the same names.
    #[new]
    #[pyo3(signature = (
        host, port, *, budget, reuse_port = false, max_message_bytes = 64 << 20,
        max_connection_bytes = 128 << 20, max_header_bytes = 64 << 10, header_timeout_s = 10.0,
        body_timeout_s = 60.0, idle_timeout_s = 60.0, admission_timeout_s = 5.0,
        max_connections = 4096, max_descriptor = RawFd::MAX, threads = 1,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
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
    ) -> PyResult<Self> {
        if threads == 0 {
            return Err(PyValueError::new_err("threads: give at least 1"));
        }
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
        let listener = conn::bind(host, port, reuse_port)
            .map_err(|error| PyOSError::new_err(format!("gRPC transport cannot listen on {host}:{port}: {error}")))?;
        let port = listener.local_addr().map_err(|error| PyOSError::new_err(error.to_string()))?.port();
        // SAFETY: eventfd has no memory arguments; the result is checked.
        let eventfd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if eventfd < 0 {
            return Err(PyOSError::new_err(format!("eventfd: {}", std::io::Error::last_os_error())));
        }
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
        runtime.spawn(conn::accept_loop(shared.clone(), listener, closing));
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
    module.add_class::<Budget>()?;
    Ok(())
}
