//! A progress event: a sequence number that is bumped whenever the graph makes progress
//! (a task completes or is consumed, a run changes phase), and that waiters can sleep on.
//!
//! Bumping is one atomic increment plus a load; the kernel is entered only when a waiter
//! may be asleep. Waiters spin briefly before parking, so a busy hand-off costs no wake-up.

use std::time::{Duration, Instant};
use strata_sync::sync::{wait_timeout, AtomicU32, AtomicU64, Condvar, Mutex, Ordering};

/// Spin iterations before a waiter parks.
#[cfg(not(loom))]
const SPIN_ITERS: u32 = 2_000;
#[cfg(loom)]
const SPIN_ITERS: u32 = 1;

#[derive(Debug, Default)]
pub(crate) struct Progress {
    seq: AtomicU64,
    sleepers: AtomicU32,
    mu: Mutex<()>,
    cv: Condvar,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Progress::default()
    }

    /// The current sequence number; pass it to [`Progress::wait`].
    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Announces progress.
    pub(crate) fn bump(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            let _g = self.mu.lock();
            self.cv.notify_all();
        }
    }

    /// Waits until the sequence number differs from `seen` or `deadline` passes. Returns
    /// the new sequence number (equal to `seen` on timeout).
    pub(crate) fn wait(&self, seen: u64, deadline: Option<Instant>) -> u64 {
        let mut now = seen;
        if strata_sync::spin_polls(SPIN_ITERS, || {
            now = self.seq.load(Ordering::Acquire);
            now != seen
        }) {
            return now;
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut g = self.mu.lock();
        let result = loop {
            let s = self.seq.load(Ordering::SeqCst);
            if s != seen {
                break s;
            }
            let slice = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break s;
                    }
                    (d - now).min(Duration::from_millis(100))
                }
                None => Duration::from_millis(100),
            };
            g = wait_timeout(&self.cv, g, slice);
        };
        drop(g);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        result
    }
}
