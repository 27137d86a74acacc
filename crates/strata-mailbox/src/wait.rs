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

use crate::error::MailboxError;
use crate::futex;
use crate::sync::{fence, os_yield, spin_hint, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A state word and its waiter count.
#[derive(Clone, Copy)]
pub(crate) struct WaitWord<'a> {
    pub(crate) state: &'a AtomicU32,
    pub(crate) waiters: &'a AtomicU32,
}

impl<'a> WaitWord<'a> {
    /// Acquire-loads the state word.
    #[inline(always)]
    pub(crate) fn load(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// Release-stores `value` and wakes parked waiters, if any.
    #[inline]
    pub(crate) fn publish(&self, value: u32) {
        self.state.store(value, Ordering::Release);
        self.notify();
    }

    /// Like [`WaitWord::publish`] but with an atomic exchange instead of a store, so
    /// the write is totally ordered with the peer's compare-exchanges on the same word
    /// (used for SHUTDOWN, which no child write may erase). Returns the previous value.
    #[inline]
    pub(crate) fn swap_publish(&self, value: u32) -> u32 {
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
    pub(crate) fn store_silent(&self, value: u32) {
        self.state.store(value, Ordering::Release);
    }

    /// `compare_exchange(from → to)` (AcqRel/Acquire); wakes parked waiters on success.
    /// Returns the value found on failure.
    #[inline]
    pub(crate) fn compare_publish(&self, from: u32, to: u32) -> Result<u32, u32> {
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
    pub(crate) fn notify(&self) {
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
/// use strata_mailbox::WakeCounter;
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
            |s| Ok((s[0] != seen).then_some(s[0])),
            || Ok(()),
            String::new,
        )
        .unwrap_or_else(|_| self.load())
    }
}

/// How to wait for the peer: spin for a while, then park on a futex in bounded slices.
///
/// ```
/// use std::time::Duration;
/// use strata_mailbox::WaitOptions;
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
    /// Give up with [`MailboxError::Timeout`] once this instant has passed.
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

    /// Sets the deadline to `timeout` from now.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        self.with_deadline(Instant::now() + timeout)
    }

    pub(crate) fn slice(&self) -> Duration {
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

/// Registers as a waiter on every word, re-checks, and sleeps for at most `timeout`
/// unless `check` is satisfied by the re-read values. Returns `Some` if it was.
fn park<const N: usize, T>(
    words: &[WaitWord<'_>; N],
    timeout: Duration,
    check: &mut impl FnMut(&[u32; N]) -> Result<Option<T>, MailboxError>,
) -> Result<Option<T>, MailboxError> {
    for w in words {
        w.waiters.fetch_add(1, Ordering::SeqCst);
    }
    fence(Ordering::SeqCst);
    let snap = load_all(words);
    let r = match check(&snap) {
        Ok(None) => {
            let expected: [(&AtomicU32, u32); N] =
                std::array::from_fn(|i| (words[i].state, snap[i]));
            futex::wait_any(&expected, timeout).map(|()| None)
        }
        other => other,
    };
    for w in words {
        w.waiters.fetch_sub(1, Ordering::Relaxed);
    }
    r
}

/// A spin-wait that has not succeeded after this long yields the CPU every 64 polls:
/// when there are more spinning threads than CPUs, the peer it waits for may be queued
/// behind it on the same CPU, and would otherwise wait for the whole spin budget.
pub const YIELD_AFTER: Duration = Duration::from_micros(5);

/// Waits until `check(values of words)` returns `Some`, spinning first and then parking.
///
/// `on_tick` runs at least every `tick` (while spinning and between sleeps); an error
/// from it, from `check`, or the deadline ends the wait, unless one last check then
/// finds the condition met (a peer that published and then died is reported by what it
/// published). `what` names the awaited event for a timeout error.
pub(crate) fn wait_until<const N: usize, T>(
    words: [WaitWord<'_>; N],
    opts: &WaitOptions,
    tick: Duration,
    mut check: impl FnMut(&[u32; N]) -> Result<Option<T>, MailboxError>,
    mut on_tick: impl FnMut() -> Result<(), MailboxError>,
    what: impl FnOnce() -> String,
) -> Result<T, MailboxError> {
    // Fast path: no clock read when the answer is already there.
    if let Some(t) = check(&load_all(&words))? {
        return Ok(t);
    }
    // The clock is first read after 64 spins: a hand-off that completes sooner (the
    // common busy case) never pays for a clock read.
    let start = if opts.spin.is_zero() {
        Instant::now()
    } else {
        let mut i: u32 = 0;
        loop {
            spin_hint();
            if let Some(t) = check(&load_all(&words))? {
                return Ok(t);
            }
            i += 1;
            if i == 64 {
                break Instant::now();
            }
        }
    };
    let mut last_tick = start;
    let timeout = |now: Instant| -> MailboxError {
        MailboxError::Timeout {
            what: String::new(),
            waited: now.saturating_duration_since(start),
        }
    };
    let slice = opts.slice();
    let mut result: Result<T, MailboxError> = 'wait: {
        if !opts.spin.is_zero() {
            let mut i: u32 = 0;
            loop {
                spin_hint();
                match check(&load_all(&words)) {
                    Ok(Some(t)) => break 'wait Ok(t),
                    Ok(None) => {}
                    Err(e) => break 'wait Err(e),
                }
                i = i.wrapping_add(1);
                if i % 64 == 0 {
                    let now = Instant::now();
                    if opts.deadline.is_some_and(|d| now >= d) {
                        break 'wait Err(timeout(now));
                    }
                    if now.duration_since(last_tick) >= tick {
                        if let Err(e) = on_tick() {
                            break 'wait Err(e);
                        }
                        last_tick = now;
                    }
                    let spun = now.duration_since(start);
                    if spun >= opts.spin {
                        break;
                    }
                    if spun >= YIELD_AFTER {
                        os_yield();
                    }
                }
            }
        }
        loop {
            let now = Instant::now();
            let mut nap = slice;
            if let Some(d) = opts.deadline {
                if now >= d {
                    break 'wait Err(timeout(now));
                }
                nap = nap.min(d - now);
            }
            match park(&words, nap, &mut check) {
                Ok(Some(t)) => break 'wait Ok(t),
                Ok(None) => {}
                Err(e) => break 'wait Err(e),
            }
            match check(&load_all(&words)) {
                Ok(Some(t)) => break 'wait Ok(t),
                Ok(None) => {}
                Err(e) => break 'wait Err(e),
            }
            let now = Instant::now();
            if now.duration_since(last_tick) >= tick {
                if let Err(e) = on_tick() {
                    break 'wait Err(e);
                }
                last_tick = now;
            }
        }
    };
    if result.is_err() {
        // The peer may have published and then died (or the deadline passed) between
        // the last check and the tick: what it published before wins.
        if let Ok(Some(t)) = check(&load_all(&words)) {
            return Ok(t);
        }
    }
    if let Err(MailboxError::Timeout { what: w, .. }) = &mut result {
        *w = what();
    }
    result
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Pair {
        state: AtomicU32,
        waiters: AtomicU32,
    }

    impl Pair {
        fn new() -> Arc<Pair> {
            Arc::new(Pair {
                state: AtomicU32::new(0),
                waiters: AtomicU32::new(0),
            })
        }
        fn word(&self) -> WaitWord<'_> {
            WaitWord {
                state: &self.state,
                waiters: &self.waiters,
            }
        }
    }

    #[test]
    fn deadline_gives_a_timeout_naming_the_event() {
        let p = Pair::new();
        let opts = WaitOptions::new()
            .with_spin(Duration::from_micros(20))
            .with_park_slice(Duration::from_millis(1))
            .with_timeout(Duration::from_millis(5));
        let r: Result<(), _> = wait_until(
            [p.word()],
            &opts,
            Duration::from_millis(1),
            |s| Ok((s[0] == 1).then_some(())),
            || Ok(()),
            || "state 1".to_string(),
        );
        match r {
            Err(MailboxError::Timeout { what, .. }) => assert_eq!(what, "state 1"),
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert_eq!(p.waiters.load(Ordering::SeqCst), 0, "waiter count restored");
    }

    #[test]
    fn tick_errors_end_the_wait() {
        let p = Pair::new();
        let opts = WaitOptions::new().with_spin(Duration::ZERO);
        let mut ticks = 0;
        let r: Result<(), _> = wait_until(
            [p.word()],
            &opts,
            Duration::ZERO,
            |_| Ok(None),
            || {
                ticks += 1;
                if ticks == 3 {
                    Err(MailboxError::PeerGone("gone".into()))
                } else {
                    Ok(())
                }
            },
            String::new,
        );
        assert!(matches!(r, Err(MailboxError::PeerGone(m)) if m == "gone"));
        assert_eq!(ticks, 3);
    }

    #[test]
    fn a_parked_thread_is_woken_by_a_publication() {
        let p = Pair::new();
        let q = p.clone();
        let t = std::thread::spawn(move || {
            let opts = WaitOptions::new().with_spin(Duration::ZERO);
            wait_until(
                [q.word()],
                &opts,
                Duration::from_secs(3600),
                |s| Ok((s[0] == 7).then_some(s[0])),
                || Ok(()),
                String::new,
            )
        });
        // Wait until the thread is registered as a waiter, then publish.
        while p.waiters.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        p.word().publish(7);
        assert_eq!(t.join().unwrap().unwrap(), 7);
        assert_eq!(p.waiters.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn wait_on_several_words_sees_the_second() {
        let a = Pair::new();
        let b = Pair::new();
        let (a2, b2) = (a.clone(), b.clone());
        let t = std::thread::spawn(move || {
            let opts = WaitOptions::new().with_spin(Duration::ZERO);
            wait_until(
                [a2.word(), b2.word()],
                &opts,
                Duration::from_secs(3600),
                |s| Ok((s[1] == 3).then_some(*s)),
                || Ok(()),
                String::new,
            )
        });
        while b.waiters.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        b.word().publish(3);
        assert_eq!(t.join().unwrap().unwrap(), [0, 3]);
        assert_eq!(a.waiters.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn compare_publish_only_moves_from_the_expected_value() {
        let p = Pair::new();
        p.word().publish(8);
        assert_eq!(p.word().compare_publish(8, 11), Ok(8));
        assert_eq!(p.word().compare_publish(8, 11), Err(11));
        p.word().store_silent(0);
        assert_eq!(p.word().load(), 0);
    }

    #[test]
    fn park_slice_is_clamped() {
        let o = WaitOptions::new().with_park_slice(Duration::from_secs(1));
        assert_eq!(o.slice(), WaitOptions::MAX_PARK_SLICE);
        let o = WaitOptions::new().with_park_slice(Duration::ZERO);
        assert_eq!(o.slice(), WaitOptions::MIN_PARK_SLICE);
    }
}
