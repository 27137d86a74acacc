//! The chip's hand-offs and spin-then-park waiting.
//!
//! Each core has a [`CoreLink`]: a dispatch ring written only by the scheduler (the
//! emulated `DATA_MAIN_BASE` register, generalised to hold a *running* and a *pending*
//! descriptor), a completion ring written only by the core (the `COND` register's FIN), a
//! cancel word, and the core's [`Doorbell`]. The scheduler never has more than two
//! descriptors outstanding on a core (running + pending), so neither ring ever fills.
//! Popping a descriptor is the core's ACK (the pending slot is free again); pushing a
//! completion is its FIN.
//!
//! A run's request and its reply travel through [`Slot`]s: a
//! one-value mailbox with a `full` flag and the taker's doorbell, so a hand-off between
//! two spinning threads is a cache-line transfer, not a system call.
//!
//! Waiting is spin, then yield, then park ([`Idle`], [`Backoff`]). A thread about to park
//! announces it on its doorbell (`sleeping = true`), issues a SeqCst fence, re-checks for
//! work, and parks; a producer publishes its work, issues a SeqCst fence, and unparks the
//! consumer only if it announced sleep. Either the consumer's re-check sees the work or the
//! producer sees the announcement (the two fences order the store-load pairs), so no
//! wake-up is lost, and a busy producer never enters the kernel. `loom_*` tests model this
//! protocol.

use crate::sync::{fence, AtomicBool, AtomicU64, Mutex, Ordering};
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
///
/// The owner is the thread registered last ([`Doorbell::register_current`]): the
/// emulator's own threads register once; a host thread waiting for a run registers before
/// it parks (the caller of `ChipWorker::run` may differ from run to run).
pub(crate) struct Doorbell {
    sleeping: AtomicBool,
    #[cfg(not(loom))]
    owner: Mutex<Option<std::thread::Thread>>,
    #[cfg(loom)]
    owner: Mutex<Option<loom::thread::Thread>>,
}

impl Default for Doorbell {
    fn default() -> Self {
        Doorbell {
            sleeping: AtomicBool::new(false),
            owner: Mutex::new(None),
        }
    }
}

impl Doorbell {
    /// Records the calling thread as the one this doorbell wakes. Call it from the owner
    /// thread before it sleeps on the doorbell.
    pub(crate) fn register_current(&self) {
        #[cfg(not(loom))]
        let me = std::thread::current();
        #[cfg(loom)]
        let me = loom::thread::current();
        *self.owner.lock().unwrap_or_else(|e| e.into_inner()) = Some(me);
    }

    /// Wakes the owner if it announced sleep. Call it after publishing work.
    pub(crate) fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Acquire) {
            self.unpark();
        }
    }

    /// Wakes the owner unconditionally (shutdown, cancellation).
    pub(crate) fn unpark(&self) {
        if let Some(t) = self
            .owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            t.unpark();
        }
    }

    /// Whether the owner is (about to be) parked.
    pub(crate) fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::Relaxed)
    }

    /// Announces sleep, re-checks `has_work`, and parks (at most `timeout`) if there is
    /// none. Spurious returns are possible: the caller loops. The calling thread must be
    /// the registered owner.
    pub(crate) fn sleep(&self, timeout: Option<Duration>, has_work: impl FnOnce() -> bool) {
        // Release: a producer that sees the announcement (Acquire) also sees the owner
        // registered before it.
        self.sleeping.store(true, Ordering::Release);
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

/// A spin-wait that has not succeeded after this long yields the CPU every 64 polls: on a
/// machine with fewer CPUs than runnable threads, the peer it waits for may be queued
/// behind it on the same CPU (strata-mailbox's waits do the same).
#[cfg_attr(loom, allow(dead_code))]
pub(crate) const YIELD_AFTER: Duration = Duration::from_micros(5);

/// The CPU a thread last reported running on, so that a peer spinning for it can tell
/// whether it is queued behind that spin on the same CPU (then spinning only delays it: the
/// spinner yields at once instead of after [`YIELD_AFTER`]). A hint, never a guarantee.
#[derive(Debug)]
pub(crate) struct CpuHint(std::sync::atomic::AtomicU32);

impl Default for CpuHint {
    fn default() -> Self {
        CpuHint(std::sync::atomic::AtomicU32::new(u32::MAX))
    }
}

impl CpuHint {
    /// Records the calling thread's current CPU and returns it (`u32::MAX` if unknown).
    pub(crate) fn update(&self) -> u32 {
        let cpu = current_cpu();
        self.0.store(cpu, std::sync::atomic::Ordering::Relaxed);
        cpu
    }

    /// The CPU last recorded.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn get(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The CPU the calling thread runs on (`u32::MAX` if unknown).
fn current_cpu() -> u32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `sched_getcpu` has no preconditions and touches no memory of ours (it is
        // a vDSO call on x86-64).
        let c = unsafe { libc::sched_getcpu() };
        u32::try_from(c).unwrap_or(u32::MAX)
    }
    #[cfg(not(target_os = "linux"))]
    {
        u32::MAX
    }
}

/// The spinning half of a spin-then-park wait: pause between polls, and every 64 polls
/// (and at the first) check the clock and, given a peer's [`CpuHint`], whether the peer
/// last ran on this CPU: yield the CPU if it did, or once [`YIELD_AFTER`] has passed; give
/// up once the budget is spent (then the caller parks). Under loom it gives up at once.
#[derive(Debug)]
#[cfg_attr(loom, allow(dead_code))]
pub(crate) struct Backoff<'a> {
    polls: u32,
    start: Option<Instant>,
    budget: Duration,
    /// This thread's hint and the awaited peer's.
    cpus: Option<(&'a CpuHint, &'a CpuHint)>,
}

impl<'a> Backoff<'a> {
    pub(crate) fn new(budget: Duration, cpus: Option<(&'a CpuHint, &'a CpuHint)>) -> Self {
        Backoff {
            polls: 0,
            start: None,
            budget,
            cpus,
        }
    }

    /// One failed poll. `true`: poll again; `false`: the spin budget is spent, park.
    pub(crate) fn spin(&mut self) -> bool {
        #[cfg(loom)]
        {
            false
        }
        #[cfg(not(loom))]
        {
            if self.budget.is_zero() {
                return false;
            }
            let check = self.polls % 64 == 0;
            self.polls = self.polls.wrapping_add(1);
            if !check {
                std::hint::spin_loop();
                return true;
            }
            let now = Instant::now();
            let spun = now.duration_since(*self.start.get_or_insert(now));
            if spun >= self.budget {
                return false;
            }
            let shared_cpu = self.cpus.is_some_and(|(me, peer)| {
                let cpu = me.update();
                cpu != u32::MAX && peer.get() == cpu
            });
            if shared_cpu || spun >= YIELD_AFTER {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            true
        }
    }
}

/// A one-value mailbox between two threads: the producer [`Slot::post`]s, the consumer
/// takes; the consumer's doorbell is rung on post, so a parked consumer is woken and a
/// spinning one sees the `full` flag flip. At most one value is in flight (each protocol
/// using a slot posts only after the previous value was taken).
pub(crate) struct Slot<T> {
    full: AtomicBool,
    value: Mutex<Option<T>>,
    /// The consumer's doorbell.
    pub(crate) bell: Doorbell,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            full: AtomicBool::new(false),
            value: Mutex::new(None),
            bell: Doorbell::default(),
        }
    }
}

impl<T> Slot<T> {
    /// Stores `v` and wakes the consumer if it parked.
    pub(crate) fn post(&self, v: T) {
        {
            let mut g = self.value.lock().unwrap_or_else(|e| e.into_inner());
            *g = Some(v);
            self.full.store(true, Ordering::Release);
        }
        self.bell.ring();
    }

    /// Whether a value is waiting (one load; what a spinning consumer polls).
    pub(crate) fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// Takes the value, if any.
    pub(crate) fn take(&self) -> Option<T> {
        if !self.is_full() {
            return None;
        }
        let mut g = self.value.lock().unwrap_or_else(|e| e.into_inner());
        self.full.store(false, Ordering::Relaxed);
        g.take()
    }

    /// Waits for a value: spins for up to `spin` (yielding after [`YIELD_AFTER`], or at
    /// once while `cpus` — this thread's and the producer's hints — say the producer last
    /// ran on this CPU), then parks on the slot's doorbell in slices of `slice` (`None`:
    /// until rung). After each slice (or spurious wake-up) `keep_waiting` decides whether
    /// to go on; `None` once it says no and no value arrived.
    pub(crate) fn wait(
        &self,
        spin: Duration,
        cpus: Option<(&CpuHint, &CpuHint)>,
        slice: Option<Duration>,
        mut keep_waiting: impl FnMut() -> bool,
    ) -> Option<T> {
        if let Some(v) = self.take() {
            return Some(v);
        }
        let mut backoff = Backoff::new(spin, cpus);
        while backoff.spin() {
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
