//! Loom models of the chip's hand-offs: the scheduler ↔ core dispatch and completion rings,
//! the host ↔ orchestrator run slots, and the doorbells behind both (announce sleep, fence,
//! re-check, park / publish, fence, unpark if asleep).
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p strata-chip --lib loom`.

use crate::link::{Doorbell, Idle, Queue, Slot};
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

/// A run's hand-off: the host posts a request into one slot and waits for the reply in
/// another; the orchestrator thread waits for requests and then for EXIT. The two runs
/// come from two different host threads (the caller of `ChipWorker::run` may change, so
/// the host registers itself on the reply slot's doorbell before each park). Every
/// interleaving must deliver each reply to its run and let every thread finish: a lost
/// wake-up would leave one parked forever, which loom reports as a deadlock.
#[test]
fn loom_run_request_and_reply_never_lose_a_wakeup() {
    loom::model(|| {
        let request = Arc::new(Slot::<u64>::default());
        let reply = Arc::new(Slot::<u64>::default());
        let orch = {
            let (request, reply) = (request.clone(), reply.clone());
            thread::spawn(move || {
                request.bell.register_current();
                loop {
                    let Some(m) = request.wait(Duration::ZERO, None, None, || true) else {
                        continue;
                    };
                    if m == 0 {
                        break; // EXIT
                    }
                    reply.post(m * 10);
                }
            })
        };
        for run in 1..=2u64 {
            let (request, reply) = (request.clone(), reply.clone());
            let host = thread::spawn(move || {
                request.post(run);
                let got = reply.wait(Duration::ZERO, None, None, || true);
                assert_eq!(got, Some(run * 10));
            });
            host.join().unwrap();
        }
        request.post(0);
        orch.join().unwrap();
    });
}
