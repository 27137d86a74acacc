//! The wait/wake protocol: publication with conditional wake, and spin-then-park waiting.
//!
//! Every state word has a *waiter count* next to it (in the same cache line).
//!
//! * A **waiter** first spins, re-reading the state words, for a bounded time
//!   ([`WaitOptions::spin`]). Then it parks: it increments the count of every word it
//!   watches (`SeqCst`), issues a `SeqCst` fence, re-reads the words and re-checks its
//!   condition, and only if the condition still does not hold sleeps on a futex with the
//!   values it just read as the expected values. When it returns it decrements the counts
//!   and re-checks. Each sleep is bounded ([`WaitOptions::park_slice`], 10 ms by default) so
//!   liveness checks keep running.
//! * A **writer** stores the new state (`Release`), issues a `SeqCst` fence, loads the
//!   count, and calls `FUTEX_WAKE` only if the count is non-zero. On the hot path (nobody
//!   parked) a publication is one store, one fence and one load of a line it already owns.
//!
//! Why no wake-up is lost: the two fences are totally ordered. If the writer's fence comes
//! first, the waiter's re-read (after its own fence) sees the new state and it does not
//! sleep. If the waiter's fence comes first, the writer's count load sees the increment
//! and it wakes; the futex compares the word with the value the waiter read under the
//! kernel's bucket lock, so a wake that races the enqueue is not lost either. This is
//! model-checked with loom (`loom_tests.rs`).

use crate::futex::{self, FutexError};
use crate::spin::{Spin, SpinStep};
use crate::sync::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A state word and its waiter count (keep both in one cache line).
#[derive(Debug, Clone, Copy)]
pub struct WaitWord<'a> {
    /// The state word (the futex word).
    pub state: &'a AtomicU32,
    /// How many waiters may be parked on `state`.
    pub waiters: &'a AtomicU32,
}

impl<'a> WaitWord<'a> {
    /// Acquire-loads the state word.
    #[inline(always)]
    pub fn load(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// Release-stores `value` and wakes parked waiters, if any.
    #[inline]
    pub fn publish(&self, value: u32) {
        self.state.store(value, Ordering::Release);
        self.notify();
    }

    /// Like [`WaitWord::publish`] but with an atomic exchange instead of a store, so
    /// the write is totally ordered with the peer's compare-exchanges on the same word
    /// (used for SHUTDOWN, which no child write may erase). Returns the previous value.
    #[inline]
    pub fn swap_publish(&self, value: u32) -> u32 {
        let prev = self.state.swap(value, Ordering::AcqRel);
        self.notify();
        prev
    }

    /// Release-stores `value` without waking anyone.
    ///
    /// Only for transitions no party waits for (the parent's reset to IDLE): a parked
    /// waiter whose futex value check sees the change returns early and re-checks, which
    /// is harmless; one that is already asleep keeps sleeping, which is correct because
    /// the new value is not one it waits for.
    #[inline(always)]
    pub fn store_silent(&self, value: u32) {
        self.state.store(value, Ordering::Release);
    }

    /// `compare_exchange(from → to)` (AcqRel/Acquire); wakes parked waiters on success.
    /// Returns the value found on failure.
    #[inline]
    pub fn compare_publish(&self, from: u32, to: u32) -> Result<u32, u32> {
        let r = self
            .state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire);
        if r.is_ok() {
            self.notify();
        }
        r
    }

    /// The writer's half of the protocol, after the state store.
    #[inline]
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) != 0 {
            futex::wake_all(self.state);
        }
    }
}

/// A counter that threads or processes wait on for a change — a doorbell: writers
/// [`WakeCounter::bump`] it, a waiter [`WakeCounter::wait_change`]s from the value it saw
/// before it last looked for work. Same protocol as the mailbox's state words (spin, then
/// park on a shared futex; a bump wakes only if somebody is parked), so no bump is lost.
/// The two atomics live wherever the caller puts them (e.g. shared memory inherited by
/// forked children).
///
/// ```
/// use std::sync::atomic::AtomicU32;
/// use std::time::Duration;
/// use strata_sync::WakeCounter;
/// let (word, waiters) = (AtomicU32::new(0), AtomicU32::new(0));
/// let bell = WakeCounter::new(&word, &waiters);
/// let seen = bell.load();
/// std::thread::scope(|s| {
///     s.spawn(|| bell.bump());
///     assert_ne!(bell.wait_change(seen, Duration::from_micros(50), Duration::from_secs(30)), seen);
/// });
/// // Nothing bumps: the wait times out and returns the unchanged value.
/// let now = bell.load();
/// assert_eq!(bell.wait_change(now, Duration::ZERO, Duration::from_millis(1)), now);
/// ```
#[derive(Clone, Copy)]
pub struct WakeCounter<'a> {
    word: WaitWord<'a>,
}

impl std::fmt::Debug for WakeCounter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WakeCounter")
            .field("value", &self.load())
            .field("waiters", &self.waiters())
            .finish()
    }
}

impl<'a> WakeCounter<'a> {
    /// The counter `value` with its waiter count `waiters` (both start at any value; keep
    /// them in one cache line, away from unrelated data).
    pub fn new(value: &'a AtomicU32, waiters: &'a AtomicU32) -> Self {
        WakeCounter {
            word: WaitWord {
                state: value,
                waiters,
            },
        }
    }

    /// The current value (an acquire load).
    #[inline(always)]
    pub fn load(&self) -> u32 {
        self.word.load()
    }

    /// Adds one (release) and wakes every parked waiter, if any.
    #[inline]
    pub fn bump(&self) {
        self.word.state.fetch_add(1, Ordering::Release);
        self.word.notify();
    }

    /// How many waiters are parked (or about to park) right now.
    pub fn waiters(&self) -> u32 {
        self.word.waiters.load(Ordering::Relaxed)
    }

    /// Waits until the value differs from `seen`, spinning for `spin` and then parking,
    /// at most `timeout` in all; returns the value (equal to `seen` after a timeout).
    pub fn wait_change(&self, seen: u32, spin: Duration, timeout: Duration) -> u32 {
        let opts = WaitOptions {
            spin: spin.min(timeout),
            park_slice: timeout,
            deadline: Instant::now().checked_add(timeout),
        };
        wait_until(
            [self.word],
            &opts,
            opts.slice(),
            |s| Ok::<_, Ended>((s[0] != seen).then_some(s[0])),
            || Ok(()),
            |_| Ended,
        )
        .unwrap_or_else(|Ended| self.load())
    }
}

/// How to wait for the peer: spin for a while, then park on a futex in bounded slices.
///
/// ```
/// use std::time::Duration;
/// use strata_sync::WaitOptions;
/// let o = WaitOptions::default().with_timeout(Duration::from_secs(5));
/// assert_eq!(o.spin, WaitOptions::DEFAULT_SPIN);
/// assert!(o.deadline.is_some());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitOptions {
    /// How long to spin (re-reading the state words with a CPU pause hint) before
    /// parking. Zero parks at once. Spinning keeps a hand-off at cache-line latency
    /// while the peer is busy; parking makes an idle wait cost no CPU.
    pub spin: Duration,
    /// Longest single sleep on the futex. Liveness checks and deadlines are evaluated
    /// between sleeps (and every `park_slice` while spinning), so this bounds how late a
    /// dead peer is noticed. Clamped to [`WaitOptions::MIN_PARK_SLICE`]..=
    /// [`WaitOptions::MAX_PARK_SLICE`].
    pub park_slice: Duration,
    /// Give up (a timeout) once this instant has passed.
    pub deadline: Option<Instant>,
}

impl WaitOptions {
    /// Default spin budget: 50 µs (a few hundred cache-line round trips).
    pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);
    /// Longest allowed (and default) park slice: 10 ms.
    pub const MAX_PARK_SLICE: Duration = Duration::from_secs(1);
    /// Default park slice: 10 ms.
    pub const DEFAULT_PARK_SLICE: Duration = Duration::from_millis(10);
    /// Shortest allowed park slice: 10 µs.
    pub const MIN_PARK_SLICE: Duration = Duration::from_micros(10);

    /// The defaults: spin 50 µs, park in 10 ms slices, no deadline.
    pub const fn new() -> Self {
        WaitOptions {
            spin: Self::DEFAULT_SPIN,
            park_slice: Self::DEFAULT_PARK_SLICE,
            deadline: None,
        }
    }

    /// Sets the spin budget.
    pub const fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// Sets the park slice (clamped when used).
    pub const fn with_park_slice(mut self, slice: Duration) -> Self {
        self.park_slice = slice;
        self
    }

    /// Sets an absolute deadline.
    pub const fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the deadline to `timeout` from now (none, if that is past what an
    /// [`Instant`] can hold: such a timeout never expires).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.deadline = Instant::now().checked_add(timeout);
        self
    }

    /// The park slice, clamped.
    pub fn slice(&self) -> Duration {
        self.park_slice
            .clamp(Self::MIN_PARK_SLICE, Self::MAX_PARK_SLICE)
    }
}

impl Default for WaitOptions {
    fn default() -> Self {
        Self::new()
    }
}

#[inline(always)]
fn load_all<const N: usize>(words: &[WaitWord<'_>; N]) -> [u32; N] {
    std::array::from_fn(|i| words[i].load())
}

/// The end of a [`WakeCounter::wait_change`] that found no change (a timeout or a futex
/// error: both return the current value).
struct Ended;

impl From<FutexError> for Ended {
    fn from(_: FutexError) -> Self {
        Ended
    }
}

/// Registers as a waiter on every word, re-checks, and sleeps for at most `timeout`
/// unless `check` is satisfied by the re-read values. Returns `Some` if it was.
fn park<const N: usize, T, E: From<FutexError>>(
    words: &[WaitWord<'_>; N],
    timeout: Duration,
    check: &mut impl FnMut(&[u32; N]) -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    for w in words {
        w.waiters.fetch_add(1, Ordering::SeqCst);
    }
    fence(Ordering::SeqCst);
    let snap = load_all(words);
    let r = match check(&snap) {
        Ok(None) => {
            let expected: [(&AtomicU32, u32); N] =
                std::array::from_fn(|i| (words[i].state, snap[i]));
            futex::wait_any(&expected, timeout)
                .map(|()| None)
                .map_err(E::from)
        }
        other => other,
    };
    for w in words {
        w.waiters.fetch_sub(1, Ordering::Relaxed);
    }
    r
}

/// How a wait ended without its condition.
enum End<E> {
    Failed(E),
    /// The deadline passed after waiting this long.
    Timeout(Duration),
}

/// Waits until `check(values of words)` returns `Some`: spins first (the [`Spin`]
/// budget `opts.spin`), then parks on the words' futexes in slices of `opts.park_slice`.
///
/// `on_tick` runs at least every `tick` (while spinning and between sleeps); an error
/// from it, from `check`, or the deadline (reported as `timeout(waited)`) ends the wait,
/// unless one last check then finds the condition met (a peer that published and then
/// died is reported by what it published).
pub fn wait_until<const N: usize, T, E: From<FutexError>>(
    words: [WaitWord<'_>; N],
    opts: &WaitOptions,
    tick: Duration,
    mut check: impl FnMut(&[u32; N]) -> Result<Option<T>, E>,
    mut on_tick: impl FnMut() -> Result<(), E>,
    timeout: impl FnOnce(Duration) -> E,
) -> Result<T, E> {
    // Fast path: no clock read when the answer is already there.
    if let Some(t) = check(&load_all(&words))? {
        return Ok(t);
    }
    let mut spin = Spin::new(opts.spin);
    let mut start = None;
    let mut last_tick = None;
    let slice = opts.slice();
    let result: Result<T, End<E>> = 'wait: {
        loop {
            match spin.step() {
                SpinStep::Spent => break,
                SpinStep::Spun => {}
                SpinStep::Checked(now) => {
                    let begun = *start.get_or_insert(now);
                    if opts.deadline.is_some_and(|d| now >= d) {
                        break 'wait Err(End::Timeout(now.saturating_duration_since(begun)));
                    }
                    let last = *last_tick.get_or_insert(now);
                    if now.duration_since(last) >= tick {
                        if let Err(e) = on_tick() {
                            break 'wait Err(End::Failed(e));
                        }
                        last_tick = Some(now);
                    }
                }
            }
            match check(&load_all(&words)) {
                Ok(Some(t)) => break 'wait Ok(t),
                Ok(None) => {}
                Err(e) => break 'wait Err(End::Failed(e)),
            }
        }
        let start = *start.get_or_insert_with(Instant::now);
        let mut last_tick = last_tick.unwrap_or(start);
        loop {
            let now = Instant::now();
            let mut nap = slice;
            if let Some(d) = opts.deadline {
                if now >= d {
                    break 'wait Err(End::Timeout(now.saturating_duration_since(start)));
                }
                nap = nap.min(d - now);
            }
            match park(&words, nap, &mut check) {
                Ok(Some(t)) => break 'wait Ok(t),
                Ok(None) => {}
                Err(e) => break 'wait Err(End::Failed(e)),
            }
            match check(&load_all(&words)) {
                Ok(Some(t)) => break 'wait Ok(t),
                Ok(None) => {}
                Err(e) => break 'wait Err(End::Failed(e)),
            }
            let now = Instant::now();
            if now.duration_since(last_tick) >= tick {
                if let Err(e) = on_tick() {
                    break 'wait Err(End::Failed(e));
                }
                last_tick = now;
            }
        }
    };
    match result {
        Ok(t) => Ok(t),
        Err(end) => {
            // The peer may have published and then died (or the deadline passed) between
            // the last check and the tick: what it published before wins.
            if let Ok(Some(t)) = check(&load_all(&words)) {
                return Ok(t);
            }
            Err(match end {
                End::Failed(e) => e,
                End::Timeout(waited) => timeout(waited),
            })
        }
    }
}
