//! Loom models of the mailbox's own transitions (round trips, the ACTIVATE compare-exchange,
//! SHUTDOWN racing a control completion). They drive strata-sync's real `wait_until`,
//! `publish`, `compare_publish` and `store_silent` with loom's atomics and strata-sync's
//! loom model of the futex, which ignores timeouts: a lost wake-up shows up as a deadlock.
//! The generic wait/wake models (a parked waiter is woken, the fences) are in strata-sync.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p strata-mailbox --lib loom`

use crate::state::MailboxState;
use crate::wait::{wait_until, WaitOptions, WaitWord};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;
use strata_sync::sync::{AtomicU32, Ordering};

const IDLE: u32 = MailboxState::Idle as u32;
const TASK_READY: u32 = MailboxState::TaskReady as u32;
const TASK_DONE: u32 = MailboxState::TaskDone as u32;
const SHUTDOWN: u32 = MailboxState::Shutdown as u32;
const CONTROL_REQUEST: u32 = MailboxState::ControlRequest as u32;
const CONTROL_DONE: u32 = MailboxState::ControlDone as u32;
const FRAME_STAGED: u32 = MailboxState::FrameStaged as u32;
const TASK_FAILED: u32 = MailboxState::TaskFailed as u32;
const ACTIVATE: u32 = MailboxState::Activate as u32;

use strata_sync::model::{park_until as wait_for, ModelWord as Word};

/// A task frame: the state word plus payload the protocol hands back and forth.
struct TaskFrame {
    word: Word,
    request: UnsafeCell<u64>,
    response: UnsafeCell<u64>,
}

// SAFETY: (test only) access to the cells is serialized by the protocol under test; loom
// checks that claim and reports any unsynchronized access as a data race.
unsafe impl Sync for TaskFrame {}

#[test]
fn loom_round_trips_hand_over_payload_without_races_or_lost_wakeups() {
    loom::model(|| {
        let f = Arc::new(TaskFrame {
            word: Word::new(IDLE),
            request: UnsafeCell::new(0),
            response: UnsafeCell::new(0),
        });
        let c = f.clone();
        let child = thread::spawn(move || {
            for _ in 0..2 {
                wait_for([c.word.w()], |s| s[0] == TASK_READY);
                // SAFETY: the child owns the frame between TASK_READY and TASK_DONE.
                let v = c.request.with(|p| unsafe { *p });
                // SAFETY: as above.
                c.response.with_mut(|p| unsafe { *p = v + 1 });
                c.word.w().publish(TASK_DONE);
            }
        });
        for round in 1..=2u64 {
            // SAFETY: the parent owns the frame while it is IDLE.
            f.request.with_mut(|p| unsafe { *p = 10 * round });
            f.word.w().publish(TASK_READY);
            wait_for([f.word.w()], |s| s[0] == TASK_DONE);
            // SAFETY: TASK_DONE hands the frame back to the parent.
            let r = f.response.with(|p| unsafe { *p });
            assert_eq!(r, 10 * round + 1);
            // The silent reset: nobody waits for IDLE.
            f.word.w().store_silent(IDLE);
        }
        child.join().unwrap();
    });
}

#[test]
fn loom_activate_cas_never_overwrites_a_terminal_state() {
    loom::model(|| {
        let w = Arc::new(Word::new(FRAME_STAGED));
        let child_w = w.clone();
        // The child gives up on the staged frame (shutdown path): CAS from what it sees.
        let child = thread::spawn(move || loop {
            let seen = child_w.w().load();
            if child_w.w().compare_publish(seen, TASK_FAILED).is_ok() {
                break;
            }
        });
        // The parent saw FRAME_STAGED earlier and activates it.
        if w.w().load() == FRAME_STAGED {
            let _ = w.w().compare_publish(FRAME_STAGED, ACTIVATE);
        }
        child.join().unwrap();
        assert_eq!(w.w().load(), TASK_FAILED);
    });
}

/// The same race with a plain store: loom must find the overwrite.
#[test]
#[should_panic]
fn loom_plain_store_activation_is_caught() {
    loom::model(|| {
        let w = Arc::new(Word::new(FRAME_STAGED));
        let child_w = w.clone();
        let child = thread::spawn(move || child_w.w().publish(TASK_FAILED));
        if w.w().load() == FRAME_STAGED {
            w.w().publish(ACTIVATE); // the bug: not a CAS
        }
        child.join().unwrap();
        assert_eq!(w.w().load(), TASK_FAILED);
    });
}

#[test]
fn loom_shutdown_racing_a_control_completion_is_not_lost() {
    loom::model(|| {
        let ctrl = Arc::new(Word::new(CONTROL_REQUEST));
        let sticky = Arc::new(AtomicU32::new(0));
        let (c2, s2) = (ctrl.clone(), sticky.clone());
        let child = thread::spawn(move || {
            // The child finishes the command by CAS, then serves until shutdown.
            if c2
                .w()
                .compare_publish(CONTROL_REQUEST, CONTROL_DONE)
                .is_ok()
            {
                wait_for([c2.w()], |s| {
                    s[0] == SHUTDOWN || s2.load(Ordering::Acquire) != 0
                });
            }
        });
        // Parent::request_shutdown: sticky word, then an exchange to SHUTDOWN.
        sticky.store(1, Ordering::Release);
        ctrl.w().swap_publish(SHUTDOWN);
        child.join().unwrap();
        assert_eq!(ctrl.w().load(), SHUTDOWN, "no child write erases SHUTDOWN");
    });
}
