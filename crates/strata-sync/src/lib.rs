//! strata's building blocks, used by every crate above it (the role crossbeam-utils or
//! iceoryx2's building blocks play): nothing here knows about tasks, chips or mailboxes.
//!
//! * [`sync`] — the one loom shim: atomics, `Mutex`, `Condvar`, `Arc`, threads, the CPU
//!   pause hint. Under `--cfg loom` it is loom's, in every crate of the build at once.
//! * [`futex`] — the raw shared-futex calls; [`WaitWord`], [`wait_until`] and
//!   [`WakeCounter`] — the spin-then-park wait/wake protocol on top of them (across
//!   processes when the words live in shared memory).
//! * [`Spin`] — the one spin budget (pause, clock every 64 polls, yield after
//!   [`YIELD_AFTER`] or at once when the peer's [`CpuHint`] shares this CPU, then give up
//!   so the caller parks).
//! * In-process hand-offs: [`ThreadBell`], [`Idle`], [`Slot`], [`Queue`], and
//!   [`OwnerFirst`] (a resource its owner uses when idle, a helper while it is busy).
//! * [`DriverSeat`] — the caller-runs driver seat of a scheduler loop: a waiting caller
//!   drives the loop's passes; a panic in a pass breaks the loop for everyone.
//! * [`panic_message`] and the monotonic clock [`mono_ns`].

pub mod futex;
mod handoff;
mod kick_gate;
#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(loom)]
pub mod model;
mod owner_first;
mod seat;
mod spin;
pub mod sync;
mod wait;

pub use futex::FutexError;
pub use handoff::{Idle, Queue, Slot, ThreadBell};
pub use kick_gate::{EventFd, Inside, KickGate};
pub use owner_first::{Held, OwnerFirst, OwnerTurn};
pub use seat::{Broken, Driven, DriverSeat, SeatWaker, Turn};
pub use spin::{push_retry, spin_polls, CpuHint, Spin, SpinStep, POLLS_PER_CLOCK, YIELD_AFTER};
pub use wait::{wait_until, WaitOptions, WaitWord, WakeCounter};

/// The text of a panic payload (`panic!("...")` carries a `&str` or a `String`).
///
/// ```
/// let p = std::panic::catch_unwind(|| panic!("boom {}", 1)).unwrap_err();
/// assert_eq!(strata_sync::panic_message(&*p), "boom 1");
/// ```
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// The instant `timeout` from now, or `None` when that is past what an [`Instant`] can
/// hold (a timeout of centuries, e.g. `Duration::MAX`): every caller treats `None` as "no
/// deadline", which is what such a timeout means. `Instant::now() + timeout` would panic.
///
/// [`Instant`]: std::time::Instant
///
/// ```
/// use std::time::Duration;
/// assert!(strata_sync::deadline_after(Duration::MAX).is_none());
/// assert!(strata_sync::deadline_after(Duration::from_secs(1)).is_some());
/// ```
#[inline]
pub fn deadline_after(timeout: std::time::Duration) -> Option<std::time::Instant> {
    std::time::Instant::now().checked_add(timeout)
}

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for every thread and every process of the
/// machine (forked children included), so spans recorded anywhere line up.
#[inline]
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists (the
    // call cannot fail with these arguments).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
