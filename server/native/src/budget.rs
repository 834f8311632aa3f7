//! Admission control: bounded pools of request bytes and calls, shared by every connection
//! of a worker process (and, through the `Budget` Python class, by its HTTP front end), and
//! one pool of bytes per connection.
//!
//! A request takes what it needs before it reads its body: when a pool has no room it waits
//! (its body unread, so HTTP/2 flow control holds the client back) until room is given back
//! or its deadline passes, and is then refused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A pool of `max` units (bytes or calls) with a count in use.
pub struct Pool {
    used: AtomicUsize,
    max: usize,
}

impl Pool {
    pub fn new(max: usize) -> Self {
        Pool { used: AtomicUsize::new(0), max }
    }

    /// Take `n` units when they fit; false (nothing taken) when they do not.
    pub fn try_take(&self, n: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            if used.saturating_add(n) > self.max {
                return false;
            }
            match self.used.compare_exchange_weak(used, used + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    pub fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

/// The bytes and calls in flight of one worker process, and who waits for them.
pub struct Shared {
    pub bytes: Pool,
    pub calls: Pool,
    /// The most bytes in flight since the last `take_peak`.
    peak: AtomicUsize,
    /// Woken whenever something is given back.
    freed: Notify,
}

impl Shared {
    /// Take `calls` calls and `bytes` bytes together, or nothing.
    pub fn try_take(&self, calls: usize, bytes: usize) -> bool {
        if !self.calls.try_take(calls) {
            return false;
        }
        if !self.bytes.try_take(bytes) {
            self.calls.give(calls);
            return false;
        }
        self.peak.fetch_max(self.bytes.used(), Ordering::Relaxed);
        true
    }

    pub fn give(&self, calls: usize, bytes: usize) {
        self.calls.give(calls);
        self.bytes.give(bytes);
        self.freed.notify_waiters();
    }
}

/// Wait until `take()` succeeds or `deadline` passes (false); woken by `freed`.
pub async fn wait_for(freed: &Notify, deadline: Instant, mut take: impl FnMut() -> bool) -> bool {
    loop {
        let notified = freed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable(); // registered before the try: no give can slip between
        if take() {
            return true;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return take();
        }
    }
}

/// What one request holds of the process's budget and of its connection's bytes; given back
/// when dropped (the request answered, refused, or its client gone).
pub struct Held {
    budget: Arc<Shared>,
    connection: Option<Arc<Connection>>,
    calls: usize,
    bytes: usize,
}

impl Held {
    /// One call, no bytes yet; waits until `deadline` for room (None: refused).
    pub async fn call(budget: &Arc<Shared>, deadline: Instant) -> Option<Held> {
        if !wait_for(&budget.freed, deadline, || budget.try_take(1, 0)).await {
            return None;
        }
        Some(Held { budget: budget.clone(), connection: None, calls: 1, bytes: 0 })
    }

    /// One call and `bytes` bytes together (an HTTP request: its connection holds no other);
    /// waits until `deadline` for room (None: refused).
    pub async fn request(budget: &Arc<Shared>, bytes: usize, deadline: Instant) -> Option<Held> {
        if !wait_for(&budget.freed, deadline, || budget.try_take(1, bytes)).await {
            return None;
        }
        Some(Held { budget: budget.clone(), connection: None, calls: 1, bytes })
    }

    /// Hold `bytes` bytes for this call, from `connection`'s pool and the process's: more
    /// waits until `deadline` for room in both (false: refused, what was held is kept), less
    /// gives the rest back.
    pub async fn resize(&mut self, connection: &Arc<Connection>, bytes: usize, deadline: Instant) -> bool {
        if bytes <= self.bytes {
            let extra = self.bytes - bytes;
            if let Some(held) = &self.connection {
                held.give(extra);
            }
            self.budget.give(0, extra);
            self.bytes = bytes;
            return true;
        }
        self.grow(connection, bytes - self.bytes, deadline).await
    }

    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    async fn grow(&mut self, connection: &Arc<Connection>, bytes: usize, deadline: Instant) -> bool {
        if let Some(held) = &self.connection {
            debug_assert!(Arc::ptr_eq(held, connection), "one call, one connection");
        }
        let budget = self.budget.clone();
        let taken = wait_for(&connection.freed, deadline, || connection.bytes.try_take(bytes)).await
            && {
                let ok = wait_for(&budget.freed, deadline, || budget.try_take(0, bytes)).await;
                if !ok {
                    connection.give(bytes);
                }
                ok
            };
        if taken {
            self.bytes += bytes;
            self.connection = Some(connection.clone());
        }
        taken
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(connection) = &self.connection {
            connection.give(self.bytes);
        }
        self.budget.give(self.calls, self.bytes);
    }
}

/// The request bytes one connection holds.
pub struct Connection {
    pub bytes: Pool,
    freed: Notify,
}

impl Connection {
    pub fn new(max_bytes: usize) -> Self {
        Connection { bytes: Pool::new(max_bytes), freed: Notify::new() }
    }

    fn give(&self, bytes: usize) {
        self.bytes.give(bytes);
        self.freed.notify_waiters();
    }
}

/// The request bytes and calls in flight in one worker process: the gRPC transport waits for
/// room here, and the HTTP front end takes and gives back its own requests' share.
#[pyclass(module = "tierserve_native", frozen)]
pub struct Budget {
    pub shared: Arc<Shared>,
}

impl Budget {
    /// A budget's shared part on its own (for tests).
    #[cfg(test)]
    pub fn shared(max_bytes: usize, max_calls: usize) -> Arc<Shared> {
        Budget::new(max_bytes, max_calls).shared
    }
}

#[pymethods]
impl Budget {
    #[new]
    fn new(max_bytes: usize, max_calls: usize) -> Self {
        Budget {
            shared: Arc::new(Shared {
                bytes: Pool::new(max_bytes),
                calls: Pool::new(max_calls),
                peak: AtomicUsize::new(0),
                freed: Notify::new(),
            }),
        }
    }

    /// Take `calls` calls and `nbytes` bytes if both fit (True), else nothing (False).
    fn try_take(&self, calls: usize, nbytes: usize) -> bool {
        self.shared.try_take(calls, nbytes)
    }

    /// Give back what `try_take` took.
    fn give(&self, calls: usize, nbytes: usize) {
        self.shared.give(calls, nbytes);
    }

    /// Request bytes in flight.
    #[getter]
    fn nbytes(&self) -> usize {
        self.shared.bytes.used()
    }

    /// Calls in flight.
    #[getter]
    fn calls(&self) -> usize {
        self.shared.calls.used()
    }

    #[getter]
    fn max_bytes(&self) -> usize {
        self.shared.bytes.max()
    }

    #[getter]
    fn max_calls(&self) -> usize {
        self.shared.calls.max()
    }

    /// The most bytes in flight since the last call (then counted again from now).
    fn take_peak(&self) -> usize {
        self.shared.peak.swap(self.shared.bytes.used(), Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn budget(bytes: usize, calls: usize) -> Arc<Shared> {
        Budget::new(bytes, calls).shared
    }

    #[test]
    fn takes_all_or_nothing() {
        let shared = budget(100, 2);
        assert!(shared.try_take(1, 60));
        assert!(!shared.try_take(1, 41)); // bytes do not fit: the call is not taken either
        assert_eq!(shared.calls.used(), 1);
        assert!(shared.try_take(1, 40));
        assert!(!shared.try_take(1, 0)); // calls full
        shared.give(2, 100);
        assert_eq!((shared.calls.used(), shared.bytes.used()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gets_room_when_it_is_given_back_and_is_refused_at_its_deadline() {
        let shared = budget(100, 10);
        let connection = Arc::new(Connection::new(1000));
        let mut first = Held::call(&shared, Instant::now()).await.unwrap();
        assert!(first.resize(&connection, 80, Instant::now()).await);
        let deadline = Instant::now() + Duration::from_secs(5);
        let waiter = {
            let shared = shared.clone();
            let connection = connection.clone();
            tokio::spawn(async move {
                let mut held = Held::call(&shared, deadline).await.unwrap();
                let ok = held.resize(&connection, 50, deadline).await;
                (ok, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(first);
        let (ok, when) = waiter.await.unwrap();
        assert!(ok && when < deadline);
        assert_eq!((shared.bytes.used(), connection.bytes.used()), (0, 0)); // all given back
        let mut big = Held::call(&shared, Instant::now()).await.unwrap();
        let started = Instant::now();
        assert!(!big.resize(&connection, 101, started + Duration::from_secs(2)).await);
        assert_eq!(Instant::now() - started, Duration::from_secs(2));
        assert_eq!((shared.bytes.used(), connection.bytes.used()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn the_connection_pool_bounds_one_connection() {
        let shared = budget(1000, 10);
        let connection = Arc::new(Connection::new(100));
        let mut a = Held::call(&shared, Instant::now()).await.unwrap();
        assert!(a.resize(&connection, 100, Instant::now()).await);
        let mut b = Held::call(&shared, Instant::now()).await.unwrap();
        assert!(!b.resize(&connection, 1, Instant::now() + Duration::from_millis(10)).await);
        let other = Arc::new(Connection::new(100));
        assert!(b.resize(&other, 100, Instant::now()).await); // another connection has room
        assert_eq!(shared.bytes.used(), 200);
        assert!(a.resize(&connection, 30, Instant::now()).await); // less: the rest goes back
        assert_eq!((shared.bytes.used(), connection.bytes.used(), a.bytes()), (130, 30, 30));
    }

    #[test]
    fn the_peak_is_kept_until_taken() {
        let object = Budget::new(100, 10);
        assert!(object.try_take(1, 70));
        object.give(1, 70);
        assert_eq!(object.take_peak(), 70);
        assert_eq!(object.take_peak(), 0);
    }
}
