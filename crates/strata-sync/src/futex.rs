//! Futex wait/wake on state words in shared memory.
//!
//! The real implementation uses *shared* futexes (no `FUTEX_PRIVATE_FLAG`), keyed by the
//! physical page, so a wake in one process reaches a waiter in another process that maps
//! the same region. Waiting on several words at once uses `futex_waitv` (Linux ≥ 5.16);
//! where the kernel lacks it, the waiter sleeps on the first word only, in short slices,
//! so the other words are still noticed within [`FALLBACK_SLICE`].
//!
//! Under `--cfg loom` the futex is modelled with a loom `Mutex` + `Condvar` that keeps the
//! kernel's contract: the value check and the enqueue happen atomically with respect to
//! a wake, and a wake reaches exactly the waiters queued on that word. The model ignores
//! timeouts, so a lost wake-up shows up as a deadlock.
//!
//! These are the only futex calls of strata (strata-mailbox's state words, strata-comm's
//! signals and strata-host's doorbell all wait through [`crate::WakeCounter`] or
//! [`crate::wait_until`]).

use crate::sync::AtomicU32;
use std::time::Duration;

/// A futex call (or the clock read `futex_waitv` needs) failed in an unexpected way.
#[derive(Debug, thiserror::Error)]
#[error("futex {op} failed: {source}")]
pub struct FutexError {
    /// `wait`, `waitv`, or the clock call.
    pub op: &'static str,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// Longest sleep on one word when `futex_waitv` is unavailable and several words are
/// watched.
#[cfg_attr(loom, allow(dead_code))]
pub const FALLBACK_SLICE: Duration = Duration::from_millis(1);

#[cfg(not(loom))]
mod imp {
    use super::FutexError;
    use super::FALLBACK_SLICE;
    use std::io;
    use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
    use std::time::Duration;

    /// `futex_waitv` support: 0 = not probed yet, 1 = available, 2 = unavailable
    /// (missing, or refused by a seccomp filter). Inherited across `fork`: a child whose
    /// parent found it available still switches when its own filter refuses it.
    static WAITV: AtomicU8 = AtomicU8::new(0);

    /// `FUTEX2_SIZE_U32`: the word is 32 bits; no `FUTEX2_PRIVATE`, so the futex is shared.
    const FUTEX2_SIZE_U32: u32 = 0x02;

    /// The kernel's `struct futex_waitv`.
    #[repr(C)]
    struct FutexWaitv {
        val: u64,
        uaddr: u64,
        flags: u32,
        reserved: u32,
    }

    fn timespec(d: Duration) -> libc::timespec {
        libc::timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        }
    }

    /// Maps the outcome of a futex wait: success, value changed, timeout and signal are
    /// all normal returns (`Ok(true)`, the caller re-checks); an errno in `unavailable`
    /// means "this call cannot be used here" (`Ok(false)`); anything else is a bug worth
    /// reporting.
    fn wait_result(
        ret: libc::c_long,
        op: &'static str,
        unavailable: &[i32],
    ) -> Result<bool, FutexError> {
        if ret != -1 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::ETIMEDOUT) | Some(libc::EINTR) => Ok(true),
            Some(e) if unavailable.contains(&e) => Ok(false),
            _ => Err(FutexError { op, source: err }),
        }
    }

    /// The answers of `futex_waitv` that mean "not here": `ENOSYS` (kernel < 5.16, or a
    /// seccomp filter's default), `EPERM` (`SECCOMP_RET_ERRNO(EPERM)`), `EINVAL` (a
    /// filter's choice, or a kernel that lacks a flag or the clock). Our records are
    /// always well-formed (aligned words, zero reserved fields, at most 4 entries), so an
    /// `EINVAL` is not our bug; the single-word fallback then reports any real problem.
    const WAITV_UNAVAILABLE: [i32; 3] = [libc::ENOSYS, libc::EPERM, libc::EINVAL];

    fn wait_one(word: &AtomicU32, expected: u32, timeout: Duration) -> Result<(), FutexError> {
        let ts = timespec(timeout);
        // SAFETY: `word` is a live, 4-byte-aligned atomic (in a mapping that outlives
        // this call); FUTEX_WAIT only reads it, compares it with `expected` and sleeps for
        // at most `ts`. The unused `uaddr2`/`val3` arguments are ignored by FUTEX_WAIT.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            )
        };
        // As before `futex_waitv` existed: a refused FUTEX_WAIT (ENOSYS) returns at once
        // and the caller's loop re-checks (it spins rather than fails).
        wait_result(ret, "wait", &[libc::ENOSYS]).map(|_| ())
    }

    fn wait_v(words: &[(&AtomicU32, u32)], timeout: Duration) -> Result<bool, FutexError> {
        let mut v: [FutexWaitv; 4] = std::array::from_fn(|_| FutexWaitv {
            val: 0,
            uaddr: 0,
            flags: 0,
            reserved: 0,
        });
        let n = words.len().min(v.len());
        for (slot, (w, expected)) in v.iter_mut().zip(words) {
            slot.val = u64::from(*expected);
            slot.uaddr = w.as_ptr() as u64;
            slot.flags = FUTEX2_SIZE_U32;
        }
        // futex_waitv takes an absolute timeout on the given clock.
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) } != 0 {
            return Err(FutexError {
                op: "clock_gettime(CLOCK_MONOTONIC)",
                source: io::Error::last_os_error(),
            });
        }
        let abs = Duration::new(now.tv_sec as u64, now.tv_nsec as u32).saturating_add(timeout);
        let ts = timespec(abs);
        // SAFETY: `v[..n]` are initialised futex_waitv records pointing at live, aligned
        // atomics; the kernel only reads them and the words. `ts` is a valid timespec.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_futex_waitv,
                v.as_ptr(),
                n as libc::c_uint,
                0 as libc::c_uint,
                &ts as *const libc::timespec,
                libc::CLOCK_MONOTONIC,
            )
        };
        wait_result(ret, "waitv", &WAITV_UNAVAILABLE)
    }

    pub fn wait_any(words: &[(&AtomicU32, u32)], timeout: Duration) -> Result<(), FutexError> {
        match words {
            [] => Ok(()),
            [(w, v)] => wait_one(w, *v, timeout),
            _ => {
                if WAITV.load(Ordering::Relaxed) != 2 {
                    if wait_v(words, timeout)? {
                        WAITV.store(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    WAITV.store(2, Ordering::Relaxed);
                }
                let (w, v) = words[0];
                wait_one(w, v, timeout.min(FALLBACK_SLICE))
            }
        }
    }

    pub fn wake_all(word: &AtomicU32) {
        // SAFETY: `word` is a live, aligned atomic; FUTEX_WAKE only uses its address as
        // the futex key. The return value (number woken, or an error for an invalid
        // address) needs no handling: waiters sleep in bounded slices, so even a failed
        // wake costs latency, never progress.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

#[cfg(loom)]
mod imp {
    use super::FutexError;
    use crate::sync::{AtomicU32, Ordering};
    use loom::sync::{Condvar, Mutex};
    use std::time::Duration;

    struct Waiter {
        id: u64,
        words: Vec<usize>,
        woken: bool,
    }

    #[derive(Default)]
    struct Queue {
        next_id: u64,
        waiters: Vec<Waiter>,
    }

    loom::lazy_static! {
        static ref BUCKET: (Mutex<Queue>, Condvar) = (Mutex::new(Queue::default()), Condvar::new());
    }

    fn addr(w: &AtomicU32) -> usize {
        w as *const AtomicU32 as usize
    }

    pub fn wait_any(words: &[(&AtomicU32, u32)], _timeout: Duration) -> Result<(), FutexError> {
        let (lock, cv) = &*BUCKET;
        let mut q = lock.lock().unwrap();
        // The kernel compares the words with the expected values under the bucket lock.
        if words.iter().any(|(w, v)| w.load(Ordering::SeqCst) != *v) {
            return Ok(());
        }
        let id = q.next_id;
        q.next_id += 1;
        q.waiters.push(Waiter {
            id,
            words: words.iter().map(|(w, _)| addr(w)).collect(),
            woken: false,
        });
        loop {
            q = cv.wait(q).unwrap();
            if let Some(pos) = q.waiters.iter().position(|w| w.id == id && w.woken) {
                q.waiters.remove(pos);
                return Ok(());
            }
        }
    }

    pub fn wake_all(word: &AtomicU32) {
        let (lock, cv) = &*BUCKET;
        let mut q = lock.lock().unwrap();
        let a = addr(word);
        let mut any = false;
        for w in q.waiters.iter_mut().filter(|w| w.words.contains(&a)) {
            w.woken = true;
            any = true;
        }
        if any {
            cv.notify_all();
        }
    }
}

/// Sleeps until one of `words` is woken, or one of them no longer holds its expected
/// value, or `timeout` passes (or a signal arrives). The caller always re-checks.
pub fn wait_any(words: &[(&AtomicU32, u32)], timeout: Duration) -> Result<(), FutexError> {
    imp::wait_any(words, timeout)
}

/// Wakes every waiter sleeping on `word`.
pub fn wake_all(word: &AtomicU32) {
    imp::wake_all(word)
}
