//! The hand-off between the scheduler and the emulated cores, and spin-then-park waiting.
//!
//! Each core has a [`CoreLink`]: a dispatch ring written only by the scheduler (the
//! emulated `DATA_MAIN_BASE` register, generalised to hold a *running* and a *pending*
//! descriptor), a completion ring written only by the core (the `COND` register's FIN), a
//! cancel word, and the core's [`Doorbell`]. The scheduler never has more than two
//! descriptors outstanding on a core (running + pending), so neither ring ever fills.
//! Popping a descriptor is the core's ACK (the pending slot is free again); pushing a
//! completion is its FIN.
//!
//! Waiting is spin, then yield, then park ([`Idle`]). A thread about to park announces it
//! on its doorbell (`sleeping = true`), issues a SeqCst fence, re-checks for work, and
//! parks; a producer publishes its work, issues a SeqCst fence, and unparks the consumer
//! only if it announced sleep. Either the consumer's re-check sees the work or the producer
//! sees the announcement (the two fences order the store-load pairs), so no wake-up is lost,
//! and a busy producer never enters the kernel. `loom_*` tests model this protocol.

use crate::sync::{fence, AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[cfg(not(loom))]
type QueueImpl<T> = crossbeam_queue::ArrayQueue<T>;

/// A bounded queue (crossbeam's `ArrayQueue`; a mutex-protected deque under loom, which
/// cannot model crossbeam's internals).
pub(crate) struct Queue<T> {
    #[cfg(not(loom))]
    q: QueueImpl<T>,
    #[cfg(loom)]
    q: loom::sync::Mutex<std::collections::VecDeque<T>>,
    #[cfg(loom)]
    cap: usize,
}

impl<T> Queue<T> {
    pub(crate) fn new(cap: usize) -> Self {
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
    pub(crate) fn push(&self, v: T) -> Result<(), T> {
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

    pub(crate) fn pop(&self) -> Option<T> {
        #[cfg(not(loom))]
        {
            self.q.pop()
        }
        #[cfg(loom)]
        {
            self.q.lock().unwrap().pop_front()
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
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
pub(crate) struct Doorbell {
    sleeping: AtomicBool,
    #[cfg(not(loom))]
    owner: std::sync::OnceLock<std::thread::Thread>,
    #[cfg(loom)]
    owner: loom::sync::Mutex<Option<loom::thread::Thread>>,
}

impl Default for Doorbell {
    fn default() -> Self {
        Doorbell {
            sleeping: AtomicBool::new(false),
            #[cfg(not(loom))]
            owner: std::sync::OnceLock::new(),
            #[cfg(loom)]
            owner: loom::sync::Mutex::new(None),
        }
    }
}

impl Doorbell {
    /// Records the calling thread as the one this doorbell wakes. Call it from the owner
    /// thread before its first wait.
    pub(crate) fn register_current(&self) {
        #[cfg(not(loom))]
        {
            let _ = self.owner.set(std::thread::current());
        }
        #[cfg(loom)]
        {
            *self.owner.lock().unwrap() = Some(loom::thread::current());
        }
    }

    /// Wakes the owner if it announced sleep. Call it after publishing work.
    pub(crate) fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.unpark();
        }
    }

    /// Wakes the owner unconditionally (shutdown, cancellation).
    pub(crate) fn unpark(&self) {
        #[cfg(not(loom))]
        if let Some(t) = self.owner.get() {
            t.unpark();
        }
        #[cfg(loom)]
        if let Some(t) = self.owner.lock().unwrap().as_ref() {
            t.unpark();
        }
    }

    /// Whether the owner is (about to be) parked.
    pub(crate) fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::Relaxed)
    }

    /// Announces sleep, re-checks `has_work`, and parks (at most `timeout`) if there is
    /// none. Spurious returns are possible: the caller loops.
    pub(crate) fn sleep(&self, timeout: Option<Duration>, has_work: impl FnOnce() -> bool) {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !has_work() {
            park(timeout);
        }
        self.sleeping.store(false, Ordering::Relaxed);
    }
}

#[cfg(not(loom))]
fn park(timeout: Option<Duration>) {
    match timeout {
        Some(t) => std::thread::park_timeout(t),
        None => std::thread::park(),
    }
}

#[cfg(loom)]
fn park(_timeout: Option<Duration>) {
    loom::thread::park();
}

/// Threads of every chip in this process that are running (working or spinning) rather
/// than parked. An idle thread spins only while this is at most the number of CPUs, so a
/// chip with more threads than the machine has cores does not fight itself for them.
/// Spin-then-yield-then-park for one idle thread.
///
/// A thread with nothing to do first spins (a few microseconds: a busy hand-off costs no
/// system call), then yields its CPU for up to the configured spin budget (so on a machine
/// with fewer CPUs than runnable threads, the others run), then parks on its doorbell: an
/// idle chip uses no CPU.
#[derive(Debug)]
#[cfg_attr(loom, allow(dead_code))]
pub(crate) struct Idle {
    steps: u32,
    since: Option<Instant>,
    spin: Duration,
}

/// Idle steps that only spin (one pause instruction each, so a hand-off is noticed within
/// tens of nanoseconds) before the yield phase: about 20 µs.
#[cfg(not(loom))]
const SPIN_STEPS: u32 = 1024;

impl Idle {
    pub(crate) fn new(spin: Duration) -> Self {
        Idle {
            steps: 0,
            since: None,
            spin,
        }
    }

    /// Work was found: start the next idle period with spinning again.
    pub(crate) fn reset(&mut self) {
        self.steps = 0;
        self.since = None;
    }

    /// One idle step: spin, or yield the CPU, or (once the spin budget is spent) park on
    /// `bell` until rung or `timeout` passes. `has_work` is the re-check made after
    /// announcing sleep.
    pub(crate) fn step(
        &mut self,
        bell: &Doorbell,
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

/// What the scheduler sends a core.
pub(crate) enum CoreMsg {
    /// Run one (task, block, subtask).
    Run(crate::aicore::Dispatch),
    /// Leave the core loop.
    Exit,
}

/// What a core reports for one dispatch.
pub(crate) struct Completion {
    /// The dispatch's sequence number on this core.
    pub(crate) seq: u64,
    /// The task, handed back (moving the `Arc` touches no reference count).
    pub(crate) desc: std::sync::Arc<crate::task::TaskDesc>,
    /// `None` on success, else the kernel's error message.
    pub(crate) failure: Option<Box<str>>,
    /// Start and end (ns since the chip's epoch) when timing was requested.
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
}

/// Capacity of a core's dispatch ring: running + pending, plus room for EXIT.
pub(crate) const DISPATCH_RING: usize = 3;
/// Capacity of a core's completion ring.
pub(crate) const COMPLETION_RING: usize = 4;

/// The scheduler ↔ core link of one emulated core.
pub(crate) struct CoreLink {
    pub(crate) dispatch: Queue<CoreMsg>,
    pub(crate) completions: Queue<Completion>,
    pub(crate) bell: Doorbell,
    /// Sequence number of the dispatch the scheduler asked to stop (0 = none).
    pub(crate) cancel: AtomicU64,
    /// Set when the core thread left its loop.
    pub(crate) exited: AtomicBool,
    /// The current run's environment (the core re-reads it when a dispatch carries a new
    /// epoch).
    pub(crate) env: std::sync::Mutex<std::sync::Arc<crate::task::RunEnv>>,
}

impl Default for CoreLink {
    fn default() -> Self {
        CoreLink {
            dispatch: Queue::new(DISPATCH_RING),
            completions: Queue::new(COMPLETION_RING),
            bell: Doorbell::default(),
            cancel: AtomicU64::new(0),
            exited: AtomicBool::new(false),
            env: std::sync::Mutex::new(std::sync::Arc::new(crate::task::RunEnv::new(
                0,
                std::sync::Arc::new(crate::registry::Registry::new()),
                None,
            ))),
        }
    }
}
