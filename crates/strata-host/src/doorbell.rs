//! A doorbell: a counter word in shared memory that a scheduler thread parks on and
//! that children (and the engine itself) ring.

use crate::error::HostError;
use crate::shm::Mapping;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_mailbox::WakeCounter;

/// The shared words, alone in their cache lines.
#[repr(C, align(256))]
struct Bell {
    /// Bumped (wrapping) by every ring; the futex word.
    seq: AtomicU32,
    /// How many waiters may be asleep on `seq`.
    waiters: AtomicU32,
}

/// A doorbell the engine's scheduler thread parks on: children ring it after they
/// publish a terminal task state (or `CONTROL_DONE`, `FRAME_STAGED`, `INIT_*`), and the
/// engine rings it when it has new work.
///
/// It is a [`WakeCounter`] (the mailbox's spin-then-park protocol, model-checked with
/// loom) whose counter word and waiter count live in shared memory (a memfd mapping
/// inherited by forked children): a ring is one atomic add, one fence and one load while
/// nobody sleeps, and is never lost (see `docs/mailbox.md` §5).
///
/// Usage by a scheduler loop: `let seen = bell.seq();` → poll every lane → if nothing
/// happened, `bell.wait(seen, spin, timeout)`. A ring after the `seq()` read makes the
/// wait return at once; a ring before it is covered by the poll (the ring follows the
/// child's releasing state store, and `seq()` is an acquire load).
///
/// ```
/// use std::time::Duration;
/// use strata_host::Doorbell;
/// let bell = Doorbell::new()?;
/// let seen = bell.seq();
/// let other = bell.clone();
/// let t = std::thread::spawn(move || other.ring());
/// let now = bell.wait(seen, Duration::from_micros(50), Duration::from_secs(30));
/// assert_ne!(now, seen);
/// t.join().unwrap();
/// // Nothing rings: the wait times out and returns the unchanged value.
/// assert_eq!(bell.wait(now, Duration::ZERO, Duration::from_millis(1)), now);
/// # Ok::<(), strata_host::HostError>(())
/// ```
#[derive(Clone)]
pub struct Doorbell {
    map: Arc<Mapping>,
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell")
            .field("seq", &self.seq())
            .field("waiters", &self.bell().waiters.load(Ordering::Relaxed))
            .finish()
    }
}

impl Doorbell {
    /// A doorbell in a fresh shared mapping. Create it before the children start so
    /// they inherit it.
    ///
    /// # Errors
    /// [`HostError::RegionCreate`] if the memory cannot be created.
    pub fn new() -> Result<Doorbell, HostError> {
        const LEN: usize = 4096;
        let map = Mapping::new(LEN, "doorbell").map_err(|source| HostError::RegionCreate {
            label: "doorbell".into(),
            bytes: LEN,
            source,
        })?;
        Ok(Doorbell { map: Arc::new(map) })
    }

    #[inline(always)]
    fn bell(&self) -> &Bell {
        // SAFETY: the mapping is 4096 bytes, page-aligned (so aligned for `Bell`, 256 B
        // of atomics), zero-initialised (a valid `Bell`), and lives as long as `self`.
        // Atomics may be shared and mutated through `&` by any process mapping it.
        unsafe { &*self.map.ptr().cast::<Bell>() }
    }

    #[inline(always)]
    fn counter(&self) -> WakeCounter<'_> {
        let b = self.bell();
        WakeCounter::new(&b.seq, &b.waiters)
    }

    /// Rings: bumps the counter and wakes every sleeping waiter.
    #[inline]
    pub fn ring(&self) {
        self.counter().bump();
    }

    /// The current counter (an acquire load).
    #[inline]
    pub fn seq(&self) -> u32 {
        self.counter().load()
    }

    /// Waits until the counter differs from `seen` or `timeout` passes, and returns the
    /// counter: spins for `spin` (re-reading one word, with a pause hint, yielding after
    /// a few µs), then parks on the futex. A return value equal to `seen` means the
    /// timeout passed.
    pub fn wait(&self, seen: u32, spin: Duration, timeout: Duration) -> u32 {
        self.counter().wait_change(seen, spin, timeout)
    }

    /// How many waiters are registered right now (for diagnostics and tests).
    pub fn waiters(&self) -> u32 {
        self.counter().waiters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    #[test]
    fn a_parked_waiter_is_woken_by_a_ring() {
        let bell = Doorbell::new().unwrap();
        let seen = bell.seq();
        let b = bell.clone();
        let t = std::thread::spawn(move || b.wait(seen, Duration::ZERO, Duration::from_secs(60)));
        while bell.waiters() == 0 {
            std::thread::yield_now();
        }
        bell.ring();
        assert_eq!(t.join().unwrap(), seen.wrapping_add(1));
        assert_eq!(bell.waiters(), 0);
    }

    #[test]
    fn no_ring_is_lost_under_many_short_waits() {
        // A ringer and a waiter hand a token back and forth 2000 times with no spin, so
        // almost every hand-off goes through the park path. A lost wake-up would stall a
        // round for the full (long) timeout and fail the round check.
        let ping = Doorbell::new().unwrap();
        let pong = Doorbell::new().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (p2, q2, s2) = (ping.clone(), pong.clone(), stop.clone());
        // Read both counters before the other side can ring.
        let seen_ping = ping.seq();
        let mut seen = pong.seq();
        let t = std::thread::spawn(move || {
            let mut seen = seen_ping;
            while !s2.load(Ordering::Acquire) {
                let now = p2.wait(seen, Duration::ZERO, Duration::from_secs(60));
                if now != seen {
                    seen = now;
                    q2.ring();
                }
            }
        });
        for round in 0..2000 {
            ping.ring();
            let now = pong.wait(seen, Duration::ZERO, Duration::from_secs(60));
            assert_ne!(now, seen, "round {round}: a ring was lost");
            seen = now;
        }
        stop.store(true, Ordering::Release);
        ping.ring();
        t.join().unwrap();
    }

    #[test]
    fn a_wait_times_out_and_counters_wrap() {
        let bell = Doorbell::new().unwrap();
        let s = bell.seq();
        let t0 = Instant::now();
        assert_eq!(
            bell.wait(s, Duration::from_micros(20), Duration::from_millis(5)),
            s
        );
        assert!(t0.elapsed() >= Duration::from_millis(5));
        bell.bell().seq.store(u32::MAX, Ordering::Relaxed);
        bell.ring();
        assert_eq!(bell.seq(), 0);
        assert_eq!(bell.wait(u32::MAX, Duration::ZERO, Duration::ZERO), 0);
        assert!(format!("{bell:?}").contains("seq"));
    }
}
