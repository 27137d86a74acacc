//! The synchronisation primitives the signal protocol (`signal.rs`) is written against.
//!
//! Normally these are `std`'s atomics and `std::hint::spin_loop`. Under `--cfg loom` they
//! are `loom`'s, so the same notify/wait/barrier code is model-checked (strata-mailbox's
//! `WakeCounter` switches to loom atomics under the same flag).

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicI32, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicI32, Ordering};

/// One iteration of a spin-wait: a CPU pause hint (a yield point under loom).
#[inline(always)]
pub(crate) fn spin_hint() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Lets another runnable thread of this CPU run (a spin-wait that has not succeeded within
/// [`strata_mailbox::YIELD_AFTER`] may be holding the CPU its peer needs). A no-op under
/// loom, which has no CPUs.
#[inline]
pub(crate) fn os_yield() {
    #[cfg(not(loom))]
    std::thread::yield_now();
}
