//! In-process hand-offs between threads and their spin-then-park waiting: a thread's
//! [`ThreadBell`], the [`Idle`] policy of a thread with nothing to do, the one-value
//! [`Slot`], and the bounded [`Queue`].
//!
//! A thread about to park announces it on its bell (`sleeping = true`), issues a SeqCst
//! fence, re-checks for work, and parks; a producer publishes its work, issues a SeqCst
//! fence, and unparks the consumer only if it announced sleep. Either the consumer's
//! re-check sees the work or the producer sees the announcement (the two fences order the
//! store-load pairs), so no wake-up is lost, and a busy producer never enters the kernel.
//! `loom_tests.rs` models this protocol.
//!
//! (strata-host's `Doorbell` is the cross-process counterpart: a futex counter in shared
//! memory that children of other processes ring. A `ThreadBell` parks one thread of this
//! process with `std`'s park/unpark.)

use crate::spin::{CpuHint, Spin};
use crate::sync::{fence, thread, AtomicBool, Mutex, Ordering};
use std::time::{Duration, Instant};

#[cfg(not(loom))]
type QueueImpl<T> = crossbeam_queue::ArrayQueue<T>;

/// A bounded multi-producer multi-consumer queue: crossbeam's `ArrayQueue`, or a
/// mutex-protected deque under loom (which cannot model crossbeam's internals).
pub struct Queue<T> {
    #[cfg(not(loom))]
    q: QueueImpl<T>,
    #[cfg(loom)]
    q: loom::sync::Mutex<std::collections::VecDeque<T>>,
    #[cfg(loom)]
    cap: usize,
}

impl<T> std::fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("empty", &self.is_empty())
            .finish()
    }
}

impl<T> Queue<T> {
    /// A queue of `cap` values (`cap > 0`).
    pub fn new(cap: usize) -> Self {
        Queue {
            #[cfg(not(loom))]
            q: QueueImpl::new(cap),
            #[cfg(loom)]
            q: loom::sync::Mutex::new(std::collections::VecDeque::new()),
            #[cfg(loom)]
            cap,
        }
    }

    /// Pushes; gives the value back if the queue is full.
    #[inline]
    pub fn push(&self, v: T) -> Result<(), T> {
        #[cfg(not(loom))]
        {
            self.q.push(v)
        }
        #[cfg(loom)]
        {
            let mut q = self.q.lock().unwrap();
            if q.len() >= self.cap {
                return Err(v);
            }
            q.push_back(v);
            Ok(())
        }
    }

    /// Pops the oldest value, if any.
    #[inline]
    pub fn pop(&self) -> Option<T> {
        #[cfg(not(loom))]
        {
            self.q.pop()
        }
        #[cfg(loom)]
        {
            self.q.lock().unwrap().pop_front()
        }
    }

    /// Whether the queue is empty right now.
    #[inline]
    pub fn is_empty(&self) -> bool {
        #[cfg(not(loom))]
        {
            self.q.is_empty()
        }
        #[cfg(loom)]
        {
            self.q.lock().unwrap().is_empty()
        }
    }
}

/// A thread's doorbell: lets producers wake it only when it parked.
///
/// The owner is the thread registered last ([`ThreadBell::register_current`]): a
/// long-lived thread registers once; a thread that waits for a reply registers before it
/// parks (the waiting thread may differ from one wait to the next).
pub struct ThreadBell {
    sleeping: AtomicBool,
    owner: Mutex<Option<thread::Thread>>,
}

impl std::fmt::Debug for ThreadBell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadBell")
            .field("sleeping", &self.is_sleeping())
            .finish()
    }
}

impl Default for ThreadBell {
    fn default() -> Self {
        ThreadBell {
            sleeping: AtomicBool::new(false),
            owner: Mutex::new(None),
        }
    }
}

impl ThreadBell {
    /// Records the calling thread as the one this bell wakes. Call it from the owner
    /// thread before it sleeps on the bell.
    pub fn register_current(&self) {
        *self.owner.lock() = Some(thread::current());
    }

    /// Wakes the owner if it announced sleep. Call it after publishing work.
    #[inline]
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Acquire) {
            self.unpark();
        }
    }

    /// Wakes the owner unconditionally (shutdown, cancellation).
    pub fn unpark(&self) {
        if let Some(t) = self.owner.lock().as_ref() {
            t.unpark();
        }
    }

    /// Whether the owner is (about to be) parked.
    #[inline]
    pub fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::Relaxed)
    }

    /// Announces sleep, re-checks `has_work`, and parks (at most `timeout`) if there is
    /// none. Spurious returns are possible: the caller loops. The calling thread must be
    /// the registered owner.
    pub fn sleep(&self, timeout: Option<Duration>, has_work: impl FnOnce() -> bool) {
        // Release: a producer that sees the announcement (Acquire) also sees the owner
        // registered before it.
        self.sleeping.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        if !has_work() {
            match timeout {
                Some(t) => thread::park_timeout(t),
                None => thread::park(),
            }
        }
        self.sleeping.store(false, Ordering::Relaxed);
    }
}

/// Spin-then-yield-then-park for one idle thread.
///
/// A thread with nothing to do first spins (a few microseconds: a busy hand-off costs no
/// system call), then yields its CPU for up to the configured spin budget (so on a machine
/// with fewer CPUs than runnable threads, the others run), then parks on its bell: an
/// idle thread uses no CPU. Unlike [`Spin`], it counts steps rather than reading the clock
/// during its first phase: an idle loop checks several sources per step, and a step that
/// finds work resets it, so the first 1024 steps must cost no clock read.
#[derive(Debug)]
#[cfg_attr(loom, allow(dead_code))]
pub struct Idle {
    steps: u32,
    since: Option<Instant>,
    spin: Duration,
}

/// Idle steps that only spin (one pause instruction each, so a hand-off is noticed within
/// tens of nanoseconds) before the yield phase: about 20 µs.
#[cfg(not(loom))]
const SPIN_STEPS: u32 = 1024;

impl Idle {
    /// An idle policy that yields for up to `spin` after its pure-spin phase.
    pub fn new(spin: Duration) -> Self {
        Idle {
            steps: 0,
            since: None,
            spin,
        }
    }

    /// Work was found: start the next idle period with spinning again.
    #[inline]
    pub fn reset(&mut self) {
        self.steps = 0;
        self.since = None;
    }

    /// One idle step: spin, or yield the CPU, or (once the spin budget is spent) park on
    /// `bell` until rung or `timeout` passes. `has_work` is the re-check made after
    /// announcing sleep.
    #[inline]
    pub fn step(
        &mut self,
        bell: &ThreadBell,
        timeout: Option<Duration>,
        has_work: impl FnOnce() -> bool,
    ) {
        #[cfg(not(loom))]
        {
            self.steps += 1;
            if self.steps < SPIN_STEPS {
                std::hint::spin_loop();
                return;
            }
            let now = Instant::now();
            let since = *self.since.get_or_insert(now);
            if now.duration_since(since) < self.spin {
                std::thread::yield_now();
                return;
            }
        }
        bell.sleep(timeout, has_work);
        self.reset();
    }
}

/// A one-value mailbox between two threads: the producer [`Slot::post`]s, the consumer
/// takes; the consumer's bell is rung on post, so a parked consumer is woken and a
/// spinning one sees the `full` flag flip. At most one value is in flight (each protocol
/// using a slot posts only after the previous value was taken).
pub struct Slot<T> {
    full: AtomicBool,
    value: Mutex<Option<T>>,
    /// The consumer's bell.
    pub bell: ThreadBell,
}

impl<T> std::fmt::Debug for Slot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("full", &self.is_full())
            .finish()
    }
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            full: AtomicBool::new(false),
            value: Mutex::new(None),
            bell: ThreadBell::default(),
        }
    }
}

impl<T> Slot<T> {
    /// Stores `v` and wakes the consumer if it parked.
    #[inline]
    pub fn post(&self, v: T) {
        {
            let mut g = self.value.lock();
            *g = Some(v);
            self.full.store(true, Ordering::Release);
        }
        self.bell.ring();
    }

    /// Whether a value is waiting (one load; what a spinning consumer polls).
    #[inline]
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// Takes the value, if any.
    #[inline]
    pub fn take(&self) -> Option<T> {
        if !self.is_full() {
            return None;
        }
        let mut g = self.value.lock();
        self.full.store(false, Ordering::Relaxed);
        g.take()
    }

    /// Waits for a value: spins for up to `spin` (see [`Spin`]: yielding after
    /// [`crate::YIELD_AFTER`], or at once while `cpus` — this thread's and the producer's
    /// hints — say the producer last ran on this CPU), then parks on the slot's bell in
    /// slices of `slice` (`None`: until rung). After each slice (or spurious wake-up)
    /// `keep_waiting` decides whether to go on; `None` once it says no and no value
    /// arrived.
    pub fn wait(
        &self,
        spin: Duration,
        cpus: Option<(&CpuHint, &CpuHint)>,
        slice: Option<Duration>,
        mut keep_waiting: impl FnMut() -> bool,
    ) -> Option<T> {
        if let Some(v) = self.take() {
            return Some(v);
        }
        let mut budget = Spin::new(spin).with_cpus(cpus);
        while budget.spin() {
            if let Some(v) = self.take() {
                return Some(v);
            }
        }
        self.bell.register_current();
        loop {
            self.bell.sleep(slice, || self.is_full());
            if let Some(v) = self.take() {
                return Some(v);
            }
            if !keep_waiting() {
                return self.take();
            }
        }
    }
}
