//! `HttpTransport`: the HTTP front end (module `http`) as Python sees it.

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use tokio::time::Instant;

use crate::batch::{self, Group, Taken};
use crate::budget::Budget;
use crate::http::{self, HttpServer, Item, Reply};
use crate::kserve::{self, Answer, Dtype, Output};
use crate::{listen, new_eventfd, seconds, Runtime, Signals};

/// The HTTP/1.1 transport: serves `host:port` and queues every request for Python, infer
/// requests decoded (see server/native/src/http.rs).
#[pyclass(module = "tierserve_native")]
pub struct HttpTransport {
    shared: Arc<HttpServer>,
    runtime: Py<Runtime>,
    owned: bool,
    signals: Signals,
    port: u16,
}

fn age(arrived: Instant) -> f64 {
    arrived.elapsed().as_secs_f64()
}

fn bytes<'py>(py: Python<'py>, data: &[u8]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, data)
}

/// One group as Python takes it: `("infer", model, version, ids, rows, ages, request ids,
/// inputs as (name, datatype, shape, bytes), outputs as (name, binary or None) or None,
/// binary_output)`.
fn group_tuple<'py>(py: Python<'py>, group: Group) -> PyResult<Bound<'py, PyTuple>> {
    let ids: Vec<u64> = group.members.iter().map(|m| m.id).collect();
    let rows: Vec<usize> = group.members.iter().map(|m| m.rows).collect();
    let ages: Vec<f64> = group.members.iter().map(|m| age(m.arrived)).collect();
    let request_ids: Vec<String> = group.members.into_iter().map(|m| m.request_id).collect();
    let mut inputs = Vec::with_capacity(group.inputs.len());
    for input in group.inputs {
        let data = if input.parts.len() == 1 {
            bytes(py, &input.parts[0])
        } else {
            let total = input.parts.iter().map(Bytes::len).sum();
            PyBytes::new_with(py, total, |buffer| {
                let mut at = 0;
                for part in &input.parts {
                    buffer[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
                Ok(())
            })?
        };
        inputs.push((input.name, input.dtype.name(), PyTuple::new(py, input.shape)?, data));
    }
    ("infer", group.model, group.version, ids, rows, ages, request_ids, inputs, group.outputs, group.binary_output)
        .into_pyobject(py)
}

fn item_tuple<'py>(py: Python<'py>, item: Item) -> PyResult<Bound<'py, PyTuple>> {
    match item {
        Item::Raw { id, method, target, headers, body, .. } => {
            let headers: Vec<(Bound<PyBytes>, Bound<PyBytes>)> =
                headers.iter().map(|(n, v)| (bytes(py, n), bytes(py, v))).collect();
            ("raw", id, method, bytes(py, &target), headers, bytes(py, &body)).into_pyobject(py)
        }
        Item::Body { id, model, version, headers, body, problem, arrived } => (
            "body",
            id,
            model,
            version,
            headers.length,
            headers.encoding,
            headers.header_length,
            body.map(|b| bytes(py, &b)),
            problem,
            age(arrived),
        )
            .into_pyobject(py),
        Item::Infer { .. } => unreachable!("decoded requests are taken in groups"),
    }
}

#[pymethods]
impl HttpTransport {
    /// Bind `host:port` (0: a free port) and serve HTTP/1.1 on `runtime` (or a runtime of
    /// its own of `threads` threads), taking room for requests with a body from `budget`;
    /// the limits are server/settings.py's of the same names.
    #[new]
    #[pyo3(signature = (
        host, port, *, budget, reuse_port = false, max_request_bytes = 64 << 20,
        max_header_bytes = 64 << 10, max_header_count = 100, header_timeout_s = 10.0,
        body_timeout_s = 60.0, keep_alive_timeout_s = 5.0, admission_timeout_s = 5.0,
        max_connections = 4096, max_descriptor = RawFd::MAX, max_connection_bytes = 128 << 20,
        threads = 1, runtime = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        host: &str,
        port: u16,
        budget: &Budget,
        reuse_port: bool,
        max_request_bytes: usize,
        max_header_bytes: usize,
        max_header_count: usize,
        header_timeout_s: f64,
        body_timeout_s: f64,
        keep_alive_timeout_s: f64,
        admission_timeout_s: f64,
        max_connections: usize,
        max_descriptor: RawFd,
        max_connection_bytes: usize,
        threads: usize,
        runtime: Option<Py<Runtime>>,
    ) -> PyResult<Self> {
        if max_header_count == 0 {
            return Err(PyValueError::new_err("max_header_count: give at least 1"));
        }
        let owned = runtime.is_none();
        let runtime = Runtime::pick(runtime, threads, py)?;
        let limits = http::Limits {
            max_request_bytes,
            max_header_bytes,
            max_header_count,
            header_timeout: seconds("header_timeout_s", header_timeout_s)?,
            body_timeout: seconds("body_timeout_s", body_timeout_s)?,
            keep_alive_timeout: seconds("keep_alive_timeout_s", keep_alive_timeout_s)?,
            admission_timeout: seconds("admission_timeout_s", admission_timeout_s)?,
            max_connections,
            max_descriptor,
        };
        let (listener, port) = listen(runtime.get(), "HTTP", host, port, reuse_port)?;
        let shared = Arc::new(HttpServer {
            queue: Mutex::new(VecDeque::new()),
            waiting: Mutex::new(HashMap::new()),
            gone: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            eventfd: new_eventfd()?,
            limits,
            budget: budget.shared.clone(),
            max_connection_bytes,
            models: RwLock::new(None),
        });
        let signals = Signals::new();
        let (closing, kill) = (signals.shutdown.subscribe(), signals.kill.subscribe());
        runtime.get().handle.spawn(http::accept_loop(shared.clone(), listener, closing, kill));
        Ok(HttpTransport { shared, runtime, owned, signals, port })
    }

    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// The eventfd that becomes readable when requests are queued.
    #[getter]
    fn fd(&self) -> RawFd {
        self.shared.eventfd
    }

    /// Requests received and not yet answered (or still being written).
    #[getter]
    fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    #[getter]
    fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Connections refused as soon as accepted (503): over the cap, or into the reserve.
    #[getter]
    fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    #[getter]
    fn queued(&self) -> usize {
        self.shared.queue.lock().unwrap().len()
    }

    /// The queued requests, oldest first: at most `max_calls`, no more once `max_bytes` of
    /// bodies are taken (the first is always taken).  Decoded infer requests of one
    /// signature come merged (see server/native/src/batch.rs); an infer request whose
    /// client left before it was taken comes as `("gone", model, age)`.  Clears the eventfd
    /// first (see `GrpcTransport.take`).
    #[pyo3(signature = (max_calls = usize::MAX, max_bytes = usize::MAX))]
    fn take<'py>(&self, py: Python<'py>, max_calls: usize, max_bytes: usize) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        crate::clear_wake(self.shared.eventfd);
        let mut gone: Vec<(String, Instant)> = std::mem::take(&mut *self.shared.gone.lock().unwrap());
        let mut items = Vec::new();
        {
            let mut queue = self.shared.queue.lock().unwrap();
            let waiting = self.shared.waiting.lock().unwrap();
            let mut size = 0;
            while items.len() < max_calls && (items.is_empty() || size < max_bytes) {
                let Some(item) = queue.pop_front() else { break };
                size += item.size();
                if waiting.contains_key(&item.id()) {
                    items.push(item);
                } else if let Item::Infer { model, arrived, .. } | Item::Body { model, arrived, .. } = item {
                    gone.push((model, arrived)); // its client left before its turn
                }
            }
        }
        let mut out = Vec::with_capacity(items.len() + gone.len());
        for (model, arrived) in gone {
            out.push(("gone", model, age(arrived)).into_pyobject(py)?);
        }
        for taken in batch::group(items) {
            out.push(match taken {
                Taken::Group(group) => group_tuple(py, group)?,
                Taken::Item(item) => item_tuple(py, item)?,
            });
        }
        Ok(out)
    }

    /// The models served, and the version each serves: an infer request for another is
    /// asked about (Python's `refuse`) before its body is read.
    fn set_models(&self, models: HashMap<String, String>) {
        *self.shared.models.write().unwrap() = Some(models);
    }

    /// Whether request `id` still waits for its answer (false once answered, or its client
    /// left).
    fn pending(&self, id: u64) -> bool {
        self.shared.waiting.lock().unwrap().contains_key(&id)
    }

    /// Whether any of `ids` still waits for its answer.
    fn any_pending(&self, ids: Vec<u64>) -> bool {
        let waiting = self.shared.waiting.lock().unwrap();
        ids.iter().any(|id| waiting.contains_key(id))
    }

    /// Answer request `id` with `status`, header fields (name, value) and `body`; False
    /// when it is gone.
    #[pyo3(signature = (id, status, body, headers = Vec::new()))]
    fn reply(&self, id: u64, status: u16, body: &[u8], headers: Vec<(Vec<u8>, Vec<u8>)>) -> bool {
        let Some(sender) = self.shared.waiting.lock().unwrap().remove(&id) else {
            return false;
        };
        let headers = headers.into_iter().map(|(n, v)| (Bytes::from(n.to_ascii_lowercase()), Bytes::from(v))).collect();
        sender.send(Reply { status, headers, body: Bytes::copy_from_slice(body) }).is_ok()
    }

    /// Answer the members of a group (`ids`, `request_ids` their clients' ids) from one set
    /// of outputs, `(name, datatype, shape, bytes, binary)` each, encoded here: member `i`
    /// gets rows `rows[i]` of them (the first dimension; `rows` None: one member, whole
    /// outputs); which members were still there.
    #[allow(clippy::too_many_arguments)]
    fn reply_infer(
        &self,
        py: Python<'_>,
        ids: Vec<u64>,
        rows: Option<Vec<usize>>,
        model_name: String,
        model_version: String,
        request_ids: Vec<String>,
        outputs: Vec<(String, String, Vec<usize>, Vec<u8>, bool)>,
    ) -> PyResult<Vec<bool>> {
        let mut dtypes = Vec::with_capacity(outputs.len());
        for (name, datatype, shape, data, _) in &outputs {
            let dtype = Dtype::from_name(datatype)
                .ok_or_else(|| PyValueError::new_err(format!("output {name}: datatype {datatype} is not encoded here")))?;
            let whole = shape.iter().product::<usize>() * dtype.size();
            let batched = rows.as_ref().map_or(true, |rows| shape.first() == Some(&rows.iter().sum()));
            if data.len() != whole || !batched {
                return Err(PyValueError::new_err(format!("output {name}: {} bytes of shape {shape:?} for rows {rows:?}", data.len())));
            }
            dtypes.push(dtype);
        }
        if rows.as_ref().map_or(ids.len() != 1, |rows| rows.len() != ids.len()) || request_ids.len() != ids.len() {
            return Err(PyValueError::new_err("give one request id (and rows) per member"));
        }
        let bodies: Vec<(Vec<u8>, Option<usize>)> = py.detach(|| {
            let mut start = 0;
            (0..ids.len())
                .map(|i| {
                    let count = rows.as_ref().map(|rows| rows[i]);
                    let shapes: Vec<Vec<usize>> = outputs
                        .iter()
                        .map(|(_, _, shape, _, _)| match count {
                            Some(n) => std::iter::once(n).chain(shape.iter().skip(1).copied()).collect(),
                            None => shape.clone(),
                        })
                        .collect();
                    let views: Vec<Output> = outputs
                        .iter()
                        .zip(&dtypes)
                        .zip(&shapes)
                        .map(|(((name, _, shape, data, binary), &dtype), cut)| {
                            let data = match count {
                                Some(n) => {
                                    let per_row = shape[1..].iter().product::<usize>() * dtype.size();
                                    &data[start * per_row..(start + n) * per_row]
                                }
                                None => &data[..],
                            };
                            Output { name, dtype, shape: cut, data, binary: *binary }
                        })
                        .collect();
                    start += count.unwrap_or(0);
                    let answer = Answer { model_name: &model_name, model_version: &model_version, id: &request_ids[i] };
                    kserve::encode(&answer, &views)
                })
                .collect()
        });
        let mut waiting = self.shared.waiting.lock().unwrap();
        Ok(ids
            .iter()
            .zip(bodies)
            .map(|(id, (body, header))| {
                let Some(sender) = waiting.remove(id) else { return false };
                let media: &'static [u8] = if header.is_some() { b"application/octet-stream" } else { b"application/json" };
                let mut headers = vec![(Bytes::from_static(b"content-type"), Bytes::from_static(media))];
                if let Some(length) = header {
                    headers.push((Bytes::from_static(b"inference-header-content-length"), Bytes::from(length.to_string())));
                }
                sender.send(Reply { status: 200, headers, body: Bytes::from(body) }).is_ok()
            })
            .collect())
    }

    /// Stop accepting connections; requests in flight, and those already sent on open
    /// connections, are still answered (each with `Connection: close`) until `close`.
    fn begin_shutdown(&self) {
        let _ = self.signals.shutdown.send(true);
    }

    /// Stop serving: connections are dropped; a runtime of its own is stopped.
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

impl Drop for HttpTransport {
    fn drop(&mut self) {
        let _ = self.signals.shutdown.send(true);
        let _ = self.signals.kill.send(true);
    }
}
