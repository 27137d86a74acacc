//! The signal protocol core: notify, wait (spin, then park on the waiter's wake counter)
//! and the self-clearing credit barrier, written against plain cell and counter
//! references so the same code runs on arena memory and, under `--cfg loom`, on loom
//! atomics (`loom_tests.rs`).
//!
//! * **notify** applies its operation to the peer's cell with `Release` (a store for
//!   [`NotifyOp::Set`], a `fetch_add` for [`NotifyOp::AtomicAdd`]), then bumps the peer's
//!   wake counter ([`WakeCounter::bump`]: a release `fetch_add`, a `SeqCst` fence, and a
//!   futex wake only if the peer is parked).
//! * **wait** `Acquire`-loads its own cell. It spins (strata-sync's [`Spin`]: pause hint;
//!   yielding every 64 polls after `YIELD_AFTER`) for the spin budget, then loops: read its wake counter, re-check
//!   the cell, and [`WakeCounter::wait_change`] from the value read, until the deadline.
//!
//! No wake-up is lost: the notifier's cell operation is sequenced before its release bump.
//! If the waiter's acquire load of the counter reads that bump (or a later value), the cell
//! operation happens-before the waiter's re-check, which therefore sees it. Otherwise the
//! bump comes later in the counter's modification order, so the counter differs from the
//! value the waiter read and `wait_change` does not sleep through it (the mailbox's
//! fence-based no-lost-wake protocol, model-checked in strata-mailbox and here).

use std::fmt;
use std::time::{Duration, Instant};
use strata_sync::sync::{AtomicI32, Ordering};
use strata_sync::{Spin, SpinStep, WakeCounter};

/// How [`crate::Window::notify`] changes the peer's signal cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotifyOp {
    /// Overwrite the cell with the value (one writer per cell: pair with `Eq`/`Ge` waits).
    Set,
    /// Atomically add the value (negative values are legal; many writers: pair with `Ge`).
    AtomicAdd,
}

/// The condition [`crate::Window::wait`] waits for: `cell <cmp> expected` (signed 32-bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitCmp {
    /// `cell == expected`
    Eq,
    /// `cell != expected`
    Ne,
    /// `cell >= expected`
    Ge,
    /// `cell > expected`
    Gt,
    /// `cell <= expected`
    Le,
    /// `cell < expected`
    Lt,
}

impl WaitCmp {
    /// Whether `seen <cmp> expected` holds.
    ///
    /// ```
    /// use strata_comm::WaitCmp;
    /// assert!(WaitCmp::Ge.holds(3, 2));
    /// assert!(!WaitCmp::Lt.holds(3, 2));
    /// ```
    #[inline(always)]
    pub fn holds(self, seen: i32, expected: i32) -> bool {
        match self {
            WaitCmp::Eq => seen == expected,
            WaitCmp::Ne => seen != expected,
            WaitCmp::Ge => seen >= expected,
            WaitCmp::Gt => seen > expected,
            WaitCmp::Le => seen <= expected,
            WaitCmp::Lt => seen < expected,
        }
    }

    /// The operator as text (`"=="`, `">="`, ...).
    pub fn symbol(self) -> &'static str {
        match self {
            WaitCmp::Eq => "==",
            WaitCmp::Ne => "!=",
            WaitCmp::Ge => ">=",
            WaitCmp::Gt => ">",
            WaitCmp::Le => "<=",
            WaitCmp::Lt => "<",
        }
    }
}

impl fmt::Display for WaitCmp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

/// How long a wait spins before it parks, and how long it waits in all.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Patience {
    pub(crate) spin: Duration,
    pub(crate) timeout: Duration,
}

/// A wait that reached its deadline: the last value seen and how long it waited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stuck {
    pub(crate) seen: i32,
    pub(crate) waited: Duration,
}

/// Longest single sleep of a parked waiter (the deadline is checked between sleeps).
const PARK_SLICE: Duration = Duration::from_millis(100);

/// Applies `op` to the (peer's) `cell` with release ordering, then bumps the peer's wake
/// counter so a parked waiter re-checks.
#[inline]
pub(crate) fn notify_cell(cell: &AtomicI32, wake: WakeCounter<'_>, value: i32, op: NotifyOp) {
    match op {
        NotifyOp::Set => cell.store(value, Ordering::Release),
        NotifyOp::AtomicAdd => {
            cell.fetch_add(value, Ordering::Release);
        }
    }
    wake.bump();
}

/// The current value of a cell (acquire).
#[inline(always)]
pub(crate) fn load_cell(cell: &AtomicI32) -> i32 {
    cell.load(Ordering::Acquire)
}

/// Waits until `cell <cmp> expected`, spinning for `p.spin` and then parking on `wake`
/// (this rank's wake counter), at most `p.timeout` in all. Returns the value that satisfied
/// the condition, or what was last seen when the deadline passed.
pub(crate) fn wait_cell(
    cell: &AtomicI32,
    wake: WakeCounter<'_>,
    expected: i32,
    cmp: WaitCmp,
    p: Patience,
) -> Result<i32, Stuck> {
    wait_cell_noting(cell, wake, expected, cmp, p, |_| {})
}

/// [`wait_cell`], telling `seen` each value the parked phase reads (not the spin phase:
/// it stays a load and a compare), so a stall snapshot shows the cell's value.
pub(crate) fn wait_cell_noting(
    cell: &AtomicI32,
    wake: WakeCounter<'_>,
    expected: i32,
    cmp: WaitCmp,
    p: Patience,
    mut seen_value: impl FnMut(i32),
) -> Result<i32, Stuck> {
    let v = cell.load(Ordering::Acquire);
    if cmp.holds(v, expected) {
        return Ok(v);
    }
    // The clock is first read after 64 polls: a hand-off that completes sooner (the common
    // busy case) never pays for it.
    let mut spin = Spin::new(p.spin.min(p.timeout));
    loop {
        if let SpinStep::Spent = spin.step() {
            break;
        }
        let v = cell.load(Ordering::Acquire);
        if cmp.holds(v, expected) {
            return Ok(v);
        }
    }
    let start = spin.started().unwrap_or_else(Instant::now);
    let deadline = start.checked_add(p.timeout);
    loop {
        // Read the counter first, then the cell: a notify whose cell operation the
        // re-check misses bumps the counter after `seen`, so `wait_change` returns.
        let seen = wake.load();
        let v = cell.load(Ordering::Acquire);
        if cmp.holds(v, expected) {
            return Ok(v);
        }
        seen_value(v);
        let now = Instant::now();
        let nap = match deadline {
            Some(d) if now >= d => {
                return Err(Stuck {
                    seen: v,
                    waited: now.saturating_duration_since(start),
                })
            }
            Some(d) => (d - now).min(PARK_SLICE),
            None => PARK_SLICE,
        };
        wake.wait_change(seen, Duration::ZERO, nap);
    }
}

/// The self-clearing credit barrier over `n` ranks (reference §5.5): `+1` into row `me`
/// of every peer's copy, wait `>= 1` on every peer's row of the own copy, then `-1` on
/// each of those rows (not `Set 0`: a fast peer's `+1` for the next barrier may already
/// have arrived and must survive). `row(rank, r)` is row `r` of `rank`'s copy;
/// `wake(rank)` is `rank`'s wake counter. `wait(peer, cell, wake)` waits for `cell >= 1`
/// (the caller's [`wait_cell`], with its patience, and a kernel's signal note where there
/// is one, so a stalled barrier shows which peer's row it waits on). On a deadline,
/// returns the row that was stuck.
pub(crate) fn credit_barrier<'c>(
    me: usize,
    n: usize,
    row: impl Fn(usize, usize) -> &'c AtomicI32,
    wake: impl Fn(usize) -> WakeCounter<'c>,
    wait: impl Fn(usize, &'c AtomicI32, WakeCounter<'c>) -> Result<i32, Stuck>,
) -> Result<(), (usize, Stuck)> {
    for k in 1..n {
        let peer = (me + k) % n;
        notify_cell(row(peer, me), wake(peer), 1, NotifyOp::AtomicAdd);
    }
    for k in 1..n {
        let peer = (me + n - k) % n;
        wait(peer, row(me, peer), wake(me)).map_err(|s| (peer, s))?;
    }
    for k in 1..n {
        let peer = (me + k) % n;
        row(me, peer).fetch_add(-1, Ordering::Relaxed);
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_comparison() {
        let t = [
            (WaitCmp::Eq, 2, 2, true),
            (WaitCmp::Eq, 1, 2, false),
            (WaitCmp::Ne, 1, 2, true),
            (WaitCmp::Ge, 2, 2, true),
            (WaitCmp::Ge, 1, 2, false),
            (WaitCmp::Gt, 2, 2, false),
            (WaitCmp::Gt, 3, 2, true),
            (WaitCmp::Le, 2, 2, true),
            (WaitCmp::Le, 3, 2, false),
            (WaitCmp::Lt, 1, 2, true),
            (WaitCmp::Lt, 2, 2, false),
            (WaitCmp::Ge, -1, -2, true),
        ];
        for (c, s, e, want) in t {
            assert_eq!(c.holds(s, e), want, "{s} {c} {e}");
        }
        assert_eq!(WaitCmp::Ge.to_string(), ">=");
    }

    #[test]
    fn wait_times_out_with_the_value_seen() {
        let cell = AtomicI32::new(7);
        let (v, w) = (AtomicU32::new(0), AtomicU32::new(0));
        let wake = WakeCounter::new(&v, &w);
        let p = Patience {
            spin: Duration::from_micros(20),
            timeout: Duration::from_millis(30),
        };
        let stuck = wait_cell(&cell, wake, 8, WaitCmp::Ge, p).unwrap_err();
        assert_eq!(stuck.seen, 7);
        assert!(stuck.waited >= Duration::from_millis(30));
        assert_eq!(wait_cell(&cell, wake, 7, WaitCmp::Eq, p), Ok(7));
    }

    #[test]
    fn parked_waiter_is_woken_by_a_notify() {
        let cell = AtomicI32::new(0);
        let (v, w) = (AtomicU32::new(0), AtomicU32::new(0));
        let wake = WakeCounter::new(&v, &w);
        let p = Patience {
            spin: Duration::ZERO,
            timeout: Duration::from_secs(60),
        };
        std::thread::scope(|s| {
            let h = s.spawn(|| wait_cell(&cell, wake, 3, WaitCmp::Ge, p));
            while wake.waiters() == 0 {
                std::thread::yield_now();
            }
            notify_cell(&cell, wake, 1, NotifyOp::AtomicAdd);
            notify_cell(&cell, wake, 3, NotifyOp::Set);
            assert_eq!(h.join().unwrap(), Ok(3));
        });
    }
}
