//! The one loom shim: the synchronisation primitives every strata crate is written
//! against.
//!
//! Normally these are `std`'s. Under `--cfg loom` (a global `RUSTFLAGS` cfg, so it flips
//! every crate of the build at once) they are `loom`'s, so the same protocol code is
//! model-checked. Crates never name `std::sync` atomics for anything a loom model should
//! see; they import from here.

#[cfg(not(loom))]
pub use std::sync::atomic::{
    fence, AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub use std::sync::{Arc, Condvar};

#[cfg(loom)]
pub use loom::sync::atomic::{
    fence, AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub use loom::sync::{Arc, Condvar};

/// Threads: `current`, `park`, `park_timeout` (a plain `park` under loom, which has no
/// time), `yield_now` and the `Thread` handle.
pub mod thread {
    #[cfg(not(loom))]
    pub use std::thread::{current, park, park_timeout, yield_now, Thread};

    #[cfg(loom)]
    pub use loom::thread::{current, park, yield_now, Thread};

    /// Under loom there is no time: a timed park is a plain park (models never rely on
    /// timeouts).
    #[cfg(loom)]
    pub fn park_timeout(_timeout: std::time::Duration) {
        loom::thread::park();
    }
}

/// A mutex whose `lock` never reports poisoning.
///
/// Every critical section written against it leaves its data consistent before anything
/// that can panic, so a lock released by an unwinding thread is still safe to use. State
/// that a panic *can* leave half-updated (a scheduler loop) lives in a
/// [`crate::DriverSeat`] instead, which records the panic and refuses to hand the state
/// out again — it does not rely on poisoning.
#[derive(Debug, Default)]
pub struct Mutex<T> {
    #[cfg(not(loom))]
    inner: std::sync::Mutex<T>,
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
}

/// The guard of a [`Mutex`].
#[cfg(not(loom))]
pub type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;
/// The guard of a [`Mutex`].
#[cfg(loom)]
pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    /// A mutex holding `value`.
    pub fn new(value: T) -> Self {
        Mutex {
            #[cfg(not(loom))]
            inner: std::sync::Mutex::new(value),
            #[cfg(loom)]
            inner: loom::sync::Mutex::new(value),
        }
    }

    /// Locks, blocking while another thread holds the lock.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks if nobody holds the lock.
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        use std::sync::TryLockError;
        match self.inner.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// Waits on `cv` for at most `timeout`, ignoring poisoning.
#[cfg(not(loom))]
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    match cv.wait_timeout(guard, timeout) {
        Ok((g, _)) => g,
        Err(e) => e.into_inner().0,
    }
}

/// Under loom there is no time: a timed wait is a plain wait (models never rely on
/// timeouts).
#[cfg(loom)]
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    _timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|e| e.into_inner())
}

/// One iteration of a spin-wait: a CPU pause hint (a yield point under loom, so a model
/// that spins lets the other threads run).
#[inline(always)]
pub fn spin_hint() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Lets another runnable thread of this CPU run (a spin-wait that has not succeeded
/// within [`crate::YIELD_AFTER`] may be holding the CPU its peer needs). A no-op under
/// loom, which has no CPUs.
#[inline]
pub fn os_yield() {
    #[cfg(not(loom))]
    std::thread::yield_now();
}
