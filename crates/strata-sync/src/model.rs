//! Scaffolding for loom models of protocols built on [`WaitWord`] (compiled only under
//! `--cfg loom`): a word that owns its two atomics, and a wait that parks at once and
//! never times out, so a lost wake-up shows up as a deadlock. Used by strata-sync's own
//! models and by the mailbox's.

use crate::sync::AtomicU32;
use crate::{wait_until, FutexError, WaitOptions, WaitWord};
use std::time::Duration;

/// A state word and its waiter count, owned (a protocol under test points into it).
#[derive(Debug)]
pub struct ModelWord {
    /// The state word.
    pub state: AtomicU32,
    /// The count of waiters parked (or about to park) on it.
    pub waiters: AtomicU32,
}

impl ModelWord {
    /// A word holding `v` with no waiter.
    pub fn new(v: u32) -> ModelWord {
        ModelWord {
            state: AtomicU32::new(v),
            waiters: AtomicU32::new(0),
        }
    }

    /// The word as the wait/wake protocol sees it.
    pub fn w(&self) -> WaitWord<'_> {
        WaitWord {
            state: &self.state,
            waiters: &self.waiters,
        }
    }
}

/// Waits until `ready` holds for the words' values, parking at once (spinning would only
/// add re-reads, and a zero budget keeps the model deterministic), never timing out.
pub fn park_until<const N: usize>(
    words: [WaitWord<'_>; N],
    mut ready: impl FnMut(&[u32; N]) -> bool,
) -> [u32; N] {
    let opts = WaitOptions::new().with_spin(Duration::ZERO);
    wait_until(
        words,
        &opts,
        Duration::from_secs(3600),
        |s| Ok::<_, FutexError>(ready(s).then_some(*s)),
        || Ok(()),
        |_| unreachable!("no deadline"),
    )
    .expect("a wait without deadline or liveness check cannot fail")
}
