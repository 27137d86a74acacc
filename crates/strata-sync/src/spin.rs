//! The one spin budget: spin (a CPU pause between polls), check the clock every 64 polls,
//! yield the CPU after [`YIELD_AFTER`] — or at once while the awaited peer's [`CpuHint`]
//! says it last ran on this CPU — and give up once the budget is spent (the caller then
//! parks: on a futex, on a [`crate::ThreadBell`], on a condition variable).
//!
//! Why not crossbeam-utils' `Backoff` for the budget: its `spin` issues `2^step` pause
//! instructions between polls (up to 64), so a hand-off would be noticed up to 64 pauses
//! late (about a microsecond on CPUs whose pause costs ~140 cycles) where strata polls
//! after every pause; and its `snooze` moves to yielding after a fixed number of steps,
//! not after a time, so it can express neither "yield after 5 µs" nor the CPU-hint rule,
//! and it never reads the clock, so it cannot bound a spin in time. It does fit a retry
//! loop where nobody waits on the latency of one poll: [`push_retry`] uses it.

#[cfg(not(loom))]
use crate::sync::os_yield;
use crate::sync::spin_hint;
use std::time::{Duration, Instant};

/// A spin-wait that has not succeeded after this long yields the CPU every 64 polls: on a
/// machine with fewer CPUs than runnable threads, the peer it waits for may be queued
/// behind it on the same CPU, and would otherwise wait for the whole spin budget.
pub const YIELD_AFTER: Duration = Duration::from_micros(5);

/// Polls between two clock reads: a hand-off that completes sooner (the common busy case)
/// never pays for one.
pub const POLLS_PER_CLOCK: u32 = 64;

/// The CPU a thread last reported running on, so that a peer spinning for it can tell
/// whether it is queued behind that spin on the same CPU (then spinning only delays it: the
/// spinner yields at once instead of after [`YIELD_AFTER`]). A hint, never a guarantee.
#[derive(Debug)]
pub struct CpuHint(std::sync::atomic::AtomicU32);

impl Default for CpuHint {
    fn default() -> Self {
        CpuHint(std::sync::atomic::AtomicU32::new(u32::MAX))
    }
}

impl CpuHint {
    /// Records the calling thread's current CPU and returns it (`u32::MAX` if unknown).
    #[inline]
    pub fn update(&self) -> u32 {
        let cpu = current_cpu();
        self.0.store(cpu, std::sync::atomic::Ordering::Relaxed);
        cpu
    }

    /// The CPU last recorded (`u32::MAX` if unknown).
    #[inline]
    pub fn get(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The CPU the calling thread runs on (`u32::MAX` if unknown).
#[inline]
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

/// What one [`Spin::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpinStep {
    /// Paused (or yielded): poll again.
    Spun,
    /// Read the clock (this is the instant read) and paused or yielded: poll again. A
    /// caller with a deadline or a periodic check does it here.
    Checked(Instant),
    /// The budget is spent: park.
    Spent,
}

/// The spinning half of a spin-then-park wait; call [`Spin::spin`] (or [`Spin::step`])
/// after each failed poll.
///
/// Between polls it pauses the CPU; every [`POLLS_PER_CLOCK`] polls it reads the clock
/// (the first read starts the budget), and yields the CPU instead of pausing once
/// [`YIELD_AFTER`] has passed, or at once while the awaited peer's [`CpuHint`] says it
/// last ran on this CPU; once the budget has passed it gives up. Without CPU hints the
/// first clock read is after 64 polls; with them it is at the first poll (a peer queued
/// on this CPU should get it back at once, not after 64 pauses). Under loom it gives up
/// at once (models park directly; spinning only adds re-reads).
///
/// ```
/// use std::time::Duration;
/// use strata_sync::Spin;
/// let mut spin = Spin::new(Duration::from_micros(20));
/// let mut polls = 0;
/// while spin.spin() {
///     polls += 1; // poll the awaited word here
/// }
/// assert!(polls >= 64);
/// assert!(!Spin::new(Duration::ZERO).spin(), "a zero budget parks at once");
/// ```
#[derive(Debug)]
#[cfg_attr(loom, allow(dead_code))]
pub struct Spin<'a> {
    polls: u32,
    start: Option<Instant>,
    budget: Duration,
    yield_after: Duration,
    /// This thread's hint and the awaited peer's.
    cpus: Option<(&'a CpuHint, &'a CpuHint)>,
}

impl<'a> Spin<'a> {
    /// A budget of `budget` that yields after [`YIELD_AFTER`].
    #[inline]
    pub fn new(budget: Duration) -> Self {
        Spin {
            polls: 0,
            start: None,
            budget,
            yield_after: YIELD_AFTER,
            cpus: None,
        }
    }

    /// Also yields at once while `peer` last ran on the CPU this thread (`me`) runs on.
    #[inline]
    pub fn with_cpus(mut self, cpus: Option<(&'a CpuHint, &'a CpuHint)>) -> Self {
        self.cpus = cpus;
        self
    }

    /// Never yields: only pauses (for a spinner that would otherwise take a CPU from the
    /// work it waits for, such as a caller driving a loop while kernels run).
    #[inline]
    pub fn without_yield(mut self) -> Self {
        self.yield_after = Duration::MAX;
        self
    }

    /// Progress was made: the next failed poll starts a fresh budget.
    #[inline]
    pub fn reset(&mut self) {
        self.polls = 0;
        self.start = None;
    }

    /// When the budget started (the first clock read), if it did.
    #[inline]
    pub fn started(&self) -> Option<Instant> {
        self.start
    }

    /// One failed poll. `true`: poll again; `false`: the budget is spent, park.
    #[inline]
    pub fn spin(&mut self) -> bool {
        !matches!(self.step(), SpinStep::Spent)
    }

    /// One failed poll, telling when the clock was read.
    #[inline]
    pub fn step(&mut self) -> SpinStep {
        #[cfg(loom)]
        {
            SpinStep::Spent
        }
        #[cfg(not(loom))]
        {
            if self.budget.is_zero() {
                return SpinStep::Spent;
            }
            let k = self.polls;
            self.polls = self.polls.wrapping_add(1);
            let check = k % POLLS_PER_CLOCK == 0 && (k != 0 || self.cpus.is_some());
            if !check {
                spin_hint();
                return SpinStep::Spun;
            }
            self.check()
        }
    }

    #[cfg(not(loom))]
    #[cold]
    fn check(&mut self) -> SpinStep {
        let now = Instant::now();
        let spun = now.duration_since(*self.start.get_or_insert(now));
        if spun >= self.budget {
            return SpinStep::Spent;
        }
        let shared_cpu = self.cpus.is_some_and(|(me, peer)| {
            let cpu = me.update();
            cpu != u32::MAX && peer.get() == cpu
        });
        if shared_cpu || spun >= self.yield_after {
            os_yield();
        } else {
            spin_hint();
        }
        SpinStep::Checked(now)
    }
}

/// Polls `ready` up to `polls` times with a pause between polls (no clock, no yield): the
/// short fixed spin before a condition-variable wait. `true` once `ready` held.
#[inline]
pub fn spin_polls(polls: u32, mut ready: impl FnMut() -> bool) -> bool {
    for _ in 0..polls {
        if ready() {
            return true;
        }
        spin_hint();
    }
    false
}

/// Offers `value` to `push` until it is accepted, calling `on_full` after each refusal
/// (e.g. to wake the consumer) and backing off with crossbeam-utils' `Backoff` (a few
/// growing spins, then yields) — for a bounded queue that is only full when its consumer
/// lags, where no latency of a single poll matters.
pub fn push_retry<T>(
    mut value: T,
    mut push: impl FnMut(T) -> Result<(), T>,
    mut on_full: impl FnMut(),
) {
    let backoff = crossbeam_utils::Backoff::new();
    loop {
        match push(value) {
            Ok(()) => return,
            Err(back) => {
                value = back;
                on_full();
                #[cfg(not(loom))]
                backoff.snooze();
                #[cfg(loom)]
                {
                    let _ = &backoff;
                    loom::thread::yield_now();
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn without_hints_the_clock_is_first_read_after_64_polls() {
        let mut s = Spin::new(Duration::from_secs(60));
        for _ in 0..64 {
            assert_eq!(s.step(), SpinStep::Spun);
        }
        assert!(s.started().is_none());
        assert!(matches!(s.step(), SpinStep::Checked(_)));
        assert!(s.started().is_some());
        s.reset();
        assert!(s.started().is_none());
    }

    #[test]
    fn with_hints_the_clock_is_read_at_the_first_poll() {
        let (a, b) = (CpuHint::default(), CpuHint::default());
        let mut s = Spin::new(Duration::from_secs(60)).with_cpus(Some((&a, &b)));
        assert!(matches!(s.step(), SpinStep::Checked(_)));
        assert_eq!(s.step(), SpinStep::Spun);
    }

    #[test]
    fn the_budget_ends_the_spin() {
        let mut s = Spin::new(Duration::from_micros(50)).without_yield();
        let t = Instant::now();
        while s.spin() {}
        assert!(t.elapsed() >= Duration::from_micros(50));
    }

    #[test]
    fn push_retry_waits_for_room() {
        let q = crossbeam_queue::ArrayQueue::new(1);
        q.push(1).unwrap();
        let mut refusals = 0;
        push_retry(
            2,
            |v| q.push(v),
            || {
                refusals += 1;
                if refusals == 3 {
                    q.pop();
                }
            },
        );
        assert_eq!(refusals, 3);
        assert_eq!(q.pop(), Some(2));
    }

    #[test]
    fn spin_polls_stops_when_ready() {
        let mut n = 0;
        assert!(spin_polls(10, || {
            n += 1;
            n == 3
        }));
        assert!(!spin_polls(5, || false));
    }
}
