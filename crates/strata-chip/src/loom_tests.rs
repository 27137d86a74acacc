//! Loom models of the scheduler ↔ core hand-off: the dispatch ring, the completion ring and
//! the doorbells (announce sleep, fence, re-check, park / publish, fence, unpark if asleep).
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p strata-chip --lib loom`.

use crate::link::{Doorbell, Idle, Queue};
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

/// The scheduler posts a running and a pending dispatch; the core runs both and reports
/// each completion; the scheduler waits for both and then sends EXIT. Every interleaving
/// must deliver both completions in order and let both threads finish: a lost wake-up
/// would leave one parked forever, which loom reports as a deadlock.
#[test]
fn loom_dispatch_and_completion_never_lose_a_wakeup() {
    loom::model(|| {
        let dispatch = Arc::new(Queue::<u64>::new(3));
        let completions = Arc::new(Queue::<u64>::new(4));
        let core_bell = Arc::new(Doorbell::default());
        let sched_bell = Arc::new(Doorbell::default());
        let core = {
            let (dispatch, completions) = (dispatch.clone(), completions.clone());
            let (core_bell, sched_bell) = (core_bell.clone(), sched_bell.clone());
            thread::spawn(move || {
                core_bell.register_current();
                let mut idle = Idle::new(Duration::ZERO);
                loop {
                    match dispatch.pop() {
                        Some(0) => break, // EXIT
                        Some(seq) => {
                            completions
                                .push(seq)
                                .expect("never more than two outstanding");
                            sched_bell.ring();
                        }
                        None => idle.step(&core_bell, None, || !dispatch.is_empty()),
                    }
                }
            })
        };
        // The scheduler runs on its own thread too: loom's `join` must not be entered by a
        // thread that may still hold an unpark token from a doorbell.
        let sched = thread::spawn(move || {
            sched_bell.register_current();
            // Running + pending.
            dispatch.push(1).unwrap();
            core_bell.ring();
            dispatch.push(2).unwrap();
            core_bell.ring();
            let mut got = Vec::new();
            let mut idle = Idle::new(Duration::ZERO);
            while got.len() < 2 {
                match completions.pop() {
                    Some(seq) => got.push(seq),
                    None => idle.step(&sched_bell, None, || !completions.is_empty()),
                }
            }
            assert_eq!(got, vec![1, 2]);
            dispatch.push(0).unwrap();
            core_bell.ring();
        });
        sched.join().unwrap();
        core.join().unwrap();
    });
}

/// A producer that publishes while the consumer is between its re-check and its park
/// still wakes it (park/unpark carry a token).
#[test]
fn loom_doorbell_wakes_a_thread_that_is_about_to_park() {
    loom::model(|| {
        let q = Arc::new(Queue::<u64>::new(1));
        let bell = Arc::new(Doorbell::default());
        let consumer = {
            let (q, bell) = (q.clone(), bell.clone());
            thread::spawn(move || {
                bell.register_current();
                loop {
                    if q.pop().is_some() {
                        return;
                    }
                    bell.sleep(None, || !q.is_empty());
                }
            })
        };
        let producer = thread::spawn(move || {
            q.push(7).unwrap();
            bell.ring();
        });
        producer.join().unwrap();
        consumer.join().unwrap();
    });
}
