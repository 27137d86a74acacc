//! The wait/wake protocol of the state words: strata-sync's [`WaitWord`] and
//! [`wait_until`](strata_sync::wait_until) (publication with conditional wake, and
//! spin-then-park waiting on shared futexes), with the mailbox's error type.
//!
//! Every state word has a *waiter count* next to it (in the same cache line). A waiter
//! spins for [`WaitOptions::spin`], then registers, fences, re-checks and sleeps on the
//! futex; a writer stores, fences, and wakes only if the count is non-zero. Why no
//! wake-up is lost, and the loom models, are in strata-sync (`wait.rs`,
//! `loom_tests.rs`); `loom_tests.rs` here models the mailbox's own transitions on top.

use crate::error::MailboxError;
use std::time::Duration;
pub(crate) use strata_sync::WaitWord;
pub use strata_sync::{WaitOptions, WakeCounter, YIELD_AFTER};

impl From<strata_sync::FutexError> for MailboxError {
    fn from(e: strata_sync::FutexError) -> Self {
        if e.op.starts_with("clock_gettime") {
            MailboxError::Os {
                op: e.op,
                source: e.source,
            }
        } else {
            MailboxError::Futex {
                op: e.op,
                source: e.source,
            }
        }
    }
}

/// Waits until `check(values of words)` returns `Some`, spinning first and then parking
/// (see [`strata_sync::wait_until`]). `what` names the awaited event for a
/// [`MailboxError::Timeout`].
#[inline]
pub(crate) fn wait_until<const N: usize, T>(
    words: [WaitWord<'_>; N],
    opts: &WaitOptions,
    tick: Duration,
    check: impl FnMut(&[u32; N]) -> Result<Option<T>, MailboxError>,
    on_tick: impl FnMut() -> Result<(), MailboxError>,
    what: impl FnOnce() -> String,
) -> Result<T, MailboxError> {
    strata_sync::wait_until(words, opts, tick, check, on_tick, |waited| {
        MailboxError::Timeout {
            what: what(),
            waited,
        }
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

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
