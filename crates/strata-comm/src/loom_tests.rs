//! Loom models of the signal hand-off. They drive the real `notify_cell`, `wait_cell` and
//! `credit_barrier` (see `signal.rs`) over loom atomics, with strata-sync's
//! `WakeCounter` (loom atomics and loom's futex model under `--cfg loom`, which ignores
//! timeouts: a lost wake-up shows up as a deadlock). Waits park at once (zero spin).
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p strata-comm --lib loom`

use crate::signal::{credit_barrier, notify_cell, wait_cell, NotifyOp, Patience, WaitCmp};
use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU32;
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;
use strata_sync::sync::{AtomicI32, Ordering};
use strata_sync::WakeCounter;

/// One rank's wake counter.
struct Wake {
    value: AtomicU32,
    waiters: AtomicU32,
}

impl Wake {
    fn new() -> Wake {
        Wake {
            value: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
        }
    }
    fn counter(&self) -> WakeCounter<'_> {
        WakeCounter::new(&self.value, &self.waiters)
    }
}

/// Park at once, never time out.
const PATIENT: Patience = Patience {
    spin: Duration::ZERO,
    timeout: Duration::from_secs(3600),
};

/// Rank A waits on its cell; rank B writes a payload, then notifies A with `op`.
fn handoff(op: NotifyOp) {
    loom::model(move || {
        let cell = Arc::new(AtomicI32::new(0));
        let wake_a = Arc::new(Wake::new());
        let payload = Arc::new(UnsafeCell::new(0u32));
        let (c2, w2, p2) = (cell.clone(), wake_a.clone(), payload.clone());
        let a = thread::spawn(move || {
            let v = wait_cell(&c2, w2.counter(), 1, WaitCmp::Ge, PATIENT).expect("no deadline");
            // The acquire wait makes B's payload write visible (loom reports a race else).
            let p = p2.with(|p| unsafe { *p });
            (v, p)
        });
        payload.with_mut(|p| unsafe { *p = 42 });
        notify_cell(&cell, wake_a.counter(), 1, op);
        let (v, p) = a.join().unwrap();
        assert_eq!((v, p), (1, 42));
        assert_eq!(wake_a.waiters.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn loom_notify_atomic_add_wakes_a_parked_waiter() {
    handoff(NotifyOp::AtomicAdd);
}

#[test]
fn loom_notify_set_wakes_a_parked_waiter() {
    handoff(NotifyOp::Set);
}

/// Two notifiers add into one cell; the waiter needs both (`>= 2`).
#[test]
fn loom_two_notifiers_one_waiter() {
    loom::model(|| {
        let cell = Arc::new(AtomicI32::new(0));
        let wake = Arc::new(Wake::new());
        let (c2, w2) = (cell.clone(), wake.clone());
        let b = thread::spawn(move || notify_cell(&c2, w2.counter(), 1, NotifyOp::AtomicAdd));
        notify_cell(&cell, wake.counter(), 1, NotifyOp::AtomicAdd);
        let v = wait_cell(&cell, wake.counter(), 2, WaitCmp::Ge, PATIENT).unwrap();
        b.join().unwrap();
        assert_eq!(v, 2);
    });
}

/// Two ranks, two rounds of the credit barrier on the same rows; each round publishes a
/// payload before the barrier and reads the peer's after it. The rows end at zero.
#[test]
fn loom_credit_barrier_reused_two_ranks_two_rounds() {
    struct Shared {
        /// rows[rank][row]
        rows: [[AtomicI32; 2]; 2],
        wake: [Wake; 2],
        /// data[round][rank]
        data: [[UnsafeCell<u32>; 2]; 2],
    }
    loom::model(|| {
        let s = Arc::new(Shared {
            rows: std::array::from_fn(|_| std::array::from_fn(|_| AtomicI32::new(0))),
            wake: [Wake::new(), Wake::new()],
            data: std::array::from_fn(|_| std::array::from_fn(|_| UnsafeCell::new(0))),
        });
        let rank = |s: Arc<Shared>, me: usize| {
            move || {
                let peer = 1 - me;
                for round in 0..2 {
                    s.data[round][me].with_mut(|p| unsafe { *p = (10 * round + me) as u32 });
                    credit_barrier(
                        me,
                        2,
                        |r, row| &s.rows[r][row],
                        |r| s.wake[r].counter(),
                        |_, cell, wake| wait_cell(cell, wake, 1, WaitCmp::Ge, PATIENT),
                    )
                    .expect("no deadline");
                    let got = s.data[round][peer].with(|p| unsafe { *p });
                    assert_eq!(got, (10 * round + peer) as u32);
                }
            }
        };
        let t = thread::spawn(rank(s.clone(), 1));
        rank(s.clone(), 0)();
        t.join().unwrap();
        for r in 0..2 {
            for row in 0..2 {
                assert_eq!(
                    s.rows[r][row].load(Ordering::SeqCst),
                    0,
                    "rank {r} row {row}"
                );
            }
        }
    });
}

/// The self-notify credit reset (S10): a peer adds +2, the owner waits `>= 2`, then
/// subtracts 2 from its own cell through a notify to itself; the cell ends at 0.
#[test]
fn loom_self_notify_credit_reset() {
    loom::model(|| {
        let cell = Arc::new(AtomicI32::new(0));
        let wake = Arc::new(Wake::new());
        let (c2, w2) = (cell.clone(), wake.clone());
        let b = thread::spawn(move || {
            notify_cell(&c2, w2.counter(), 1, NotifyOp::AtomicAdd);
            notify_cell(&c2, w2.counter(), 1, NotifyOp::AtomicAdd);
        });
        wait_cell(&cell, wake.counter(), 2, WaitCmp::Ge, PATIENT).unwrap();
        notify_cell(&cell, wake.counter(), -2, NotifyOp::AtomicAdd);
        b.join().unwrap();
        assert_eq!(cell.load(Ordering::SeqCst), 0);
    });
}

/// The waiter's read order, isolated: it reads its wake counter, then its cell (as
/// `wait_cell` does before every park); a notify lands anywhere. The wake-up is lost only
/// if the waiter saw the old cell value *and* the counter it would sleep on already holds
/// the notify's bump. With the counter read first that cannot happen; the negative model
/// reads the cell first and loom finds the interleaving that loses the wake-up.
fn read_order_model(counter_first: bool) {
    loom::model(move || {
        let cell = Arc::new(AtomicI32::new(0));
        let wake = Arc::new(Wake::new());
        let (c2, w2) = (cell.clone(), wake.clone());
        let a = thread::spawn(move || {
            if counter_first {
                let seen = w2.counter().load();
                (c2.load(Ordering::Acquire), seen)
            } else {
                let v = c2.load(Ordering::Acquire);
                (v, w2.counter().load())
            }
        });
        notify_cell(&cell, wake.counter(), 1, NotifyOp::AtomicAdd);
        let (v, seen) = a.join().unwrap();
        let now = wake.counter().load();
        assert!(
            v >= 1 || seen != now,
            "lost wake-up: the waiter saw the old cell and would sleep on the bumped counter"
        );
    });
}

#[test]
fn loom_counter_before_cell_never_loses_the_wake() {
    read_order_model(true);
}

#[test]
#[should_panic(expected = "lost wake-up")]
fn loom_negative_cell_before_counter_loses_the_wake() {
    read_order_model(false);
}
