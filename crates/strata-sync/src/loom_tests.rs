//! Loom models of the building blocks: the futex-based wait/wake protocol (`wait.rs`,
//! with the futex modelled in `futex.rs`, which ignores timeouts: a lost wake-up shows up
//! as a deadlock), the in-process hand-offs (`handoff.rs`: announce sleep, fence,
//! re-check, park / publish, fence, unpark if asleep), and the driver seat (`seat.rs`).
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p strata-sync --lib loom`

use crate::sync::{fence, AtomicU32, Ordering};
use crate::{Driven, DriverSeat, Idle, Queue, Slot, ThreadBell, Turn, WakeCounter};
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

const IDLE: u32 = 0;
const TASK_READY: u32 = 1;

use crate::model::{park_until as wait_for, ModelWord as Word};

#[test]
fn loom_parked_waiter_is_woken_by_a_publication() {
    loom::model(|| {
        let w = Arc::new(Word::new(IDLE));
        let w2 = w.clone();
        let waiter = thread::spawn(move || wait_for([w2.w()], |s| s[0] == TASK_READY)[0]);
        w.w().publish(TASK_READY);
        assert_eq!(waiter.join().unwrap(), TASK_READY);
        assert_eq!(w.waiters.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn loom_waiter_on_two_words_sees_a_publication_on_either() {
    loom::model(|| {
        let a = Arc::new(Word::new(IDLE));
        let b = Arc::new(Word::new(IDLE));
        let (a2, b2) = (a.clone(), b.clone());
        let waiter = thread::spawn(move || wait_for([a2.w(), b2.w()], |s| s[1] == TASK_READY));
        b.w().publish(TASK_READY);
        assert_eq!(waiter.join().unwrap(), [IDLE, TASK_READY]);
        assert_eq!(a.waiters.load(Ordering::SeqCst), 0);
        assert_eq!(b.waiters.load(Ordering::SeqCst), 0);
    });
}

/// The store-buffering core of the protocol, with the writer's fence (as in
/// `WaitWord::notify`) and the waiter's fence (as in `wait.rs::park`): it is impossible
/// that the waiter misses the new state *and* the writer misses the waiter.
#[test]
fn loom_fences_forbid_the_lost_wakeup_interleaving() {
    lost_wakeup_model(true);
}

/// The same without the writer's fence: loom must find the interleaving in which the
/// waiter goes to sleep on the old state and the writer skips the wake.
#[test]
#[should_panic(expected = "lost wake-up")]
fn loom_writer_without_fence_loses_wakeups() {
    lost_wakeup_model(false);
}

fn lost_wakeup_model(writer_fence: bool) {
    loom::model(move || {
        let w = Arc::new(Word::new(IDLE));
        let w2 = w.clone();
        let waiter = thread::spawn(move || {
            w2.waiters.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            w2.state.load(Ordering::Acquire)
        });
        w.state.store(TASK_READY, Ordering::Release);
        if writer_fence {
            fence(Ordering::SeqCst);
        }
        let count = w.waiters.load(Ordering::Relaxed);
        let waiter_saw = waiter.join().unwrap();
        assert!(
            waiter_saw == TASK_READY || count != 0,
            "lost wake-up: the waiter sleeps on IDLE and the writer skips the wake"
        );
    });
}

#[test]
fn loom_a_bump_wakes_a_parked_wake_counter_waiter() {
    loom::model(|| {
        let w = Arc::new(Word::new(7));
        let w2 = w.clone();
        let waiter = thread::spawn(move || {
            WakeCounter::new(&w2.state, &w2.waiters).wait_change(
                7,
                std::time::Duration::ZERO,
                std::time::Duration::from_secs(3600),
            )
        });
        WakeCounter::new(&w.state, &w.waiters).bump();
        assert_eq!(waiter.join().unwrap(), 8);
        assert_eq!(w.waiters.load(Ordering::SeqCst), 0);
    });
}

/// The scheduler posts a running and a pending dispatch; the core runs both and reports
/// each completion; the scheduler waits for both and then sends EXIT. Every interleaving
/// must deliver both completions in order and let both threads finish: a lost wake-up
/// would leave one parked forever, which loom reports as a deadlock.
#[test]
fn loom_dispatch_and_completion_never_lose_a_wakeup() {
    loom::model(|| {
        let dispatch = Arc::new(Queue::<u64>::new(3));
        let completions = Arc::new(Queue::<u64>::new(4));
        let core_bell = Arc::new(ThreadBell::default());
        let sched_bell = Arc::new(ThreadBell::default());
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
        let bell = Arc::new(ThreadBell::default());
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

/// A caller and the loop's thread contend for the seat while two units of work are done
/// (each pass does one). Whoever holds the seat does the pass; the loop's thread parks
/// while the caller drives and must be woken when the caller leaves: a lost wake-up would
/// leave it parked forever, which loom reports as a deadlock. Every unit is done once.
#[test]
fn loom_seat_caller_and_loop_thread_share_the_work_without_lost_wakeups() {
    loom::model(|| {
        let seat = Arc::new(DriverSeat::new(0u32));
        let done = Arc::new(AtomicU32::new(0));
        let lp = {
            let (seat, done) = (seat.clone(), done.clone());
            thread::spawn(move || {
                seat.register_loop_thread();
                loop {
                    if seat.park_while_driven(Duration::from_secs(3600)) {
                        continue;
                    }
                    let more = seat
                        .pass(|n| {
                            if *n < 2 {
                                *n += 1;
                                done.store(*n, Ordering::Release);
                            }
                            *n < 2
                        })
                        .expect("no pass panics");
                    if more != Some(true) {
                        return;
                    }
                }
            })
        };
        let caller = {
            let (seat, done) = (seat.clone(), done.clone());
            thread::spawn(move || {
                seat.drive(
                    || (done.load(Ordering::Acquire) >= 2).then_some(()),
                    |n| {
                        if *n < 2 {
                            *n += 1;
                            done.store(*n, Ordering::Release);
                        }
                        Turn::Again
                    },
                )
            })
        };
        assert_eq!(caller.join().unwrap(), Driven::Done(()));
        lp.join().unwrap();
        assert_eq!(seat.with(|n| *n), Ok(Some(2)), "each unit done once");
    });
}

/// A caller's pass panics while the loop's thread runs its own passes (parking on its
/// own, and while driven). The loop's thread must end with the panic's message (woken
/// when the caller leaves), and every later pass or drive must see it too.
#[test]
fn loom_seat_a_panicking_pass_is_seen_by_every_waiter() {
    loom::model(|| {
        let seat = Arc::new(DriverSeat::new(0u32));
        let lp = {
            let seat = seat.clone();
            thread::spawn(move || {
                seat.register_loop_thread();
                loop {
                    if seat.park_while_driven(Duration::from_secs(3600)) {
                        continue;
                    }
                    match seat.pass(|n| *n += 1) {
                        Err(b) => return b.message,
                        // Nothing to do: park until a caller leaves the seat.
                        Ok(_) => thread::park(),
                    }
                }
            })
        };
        let caller = {
            let seat = seat.clone();
            thread::spawn(move || seat.drive(|| None::<()>, |_| panic!("pass exploded")))
        };
        let Driven::Broken(b) = caller.join().unwrap() else {
            panic!("the caller's drive must report the broken loop")
        };
        assert_eq!(b.message, "pass exploded");
        assert_eq!(lp.join().unwrap(), "pass exploded");
        assert_eq!(
            seat.drive(|| None::<()>, |_| Turn::Again),
            Driven::Broken(b.clone())
        );
        assert_eq!(seat.pass(|n| *n), Err(b));
    });
}

/// A caller leaves the seat "quiet" (`drive_quiet`: the loop's thread stays parked,
/// dormant) while a producer hands the loop work and wakes it with `wake_dormant`; the
/// producer may still see the caller in the seat (then it skips the wake, and the
/// departing caller's `handed_over` re-check must see the work). The loop's thread waits
/// for work on a bell while nobody drives, as the engine's scheduler waits on its
/// doorbell. A lost wake-up leaves it parked forever (loom ignores park timeouts), which
/// loom reports as a deadlock.
#[test]
fn loom_seat_a_dormant_loop_thread_is_woken_by_a_hand_over() {
    dormant_hand_over_model(false);
}

/// The same, when the caller's wait is over before it drove at all (a run with nothing
/// to wait for): it leaves the loop dormant without having taken the seat.
#[test]
fn loom_seat_a_caller_done_at_entry_leaves_no_hand_over_behind() {
    dormant_hand_over_model(true);
}

fn dormant_hand_over_model(done_at_entry: bool) {
    loom::model(move || {
        let seat = Arc::new(DriverSeat::new(0u32));
        let pending = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let bell = Arc::new(Word::new(0));
        let lp = {
            let (seat, pending, bell) = (seat.clone(), pending.clone(), bell.clone());
            thread::spawn(move || {
                seat.register_loop_thread();
                loop {
                    if seat.park_while_driven(Duration::from_secs(3600)) {
                        continue;
                    }
                    let counter = WakeCounter::new(&bell.state, &bell.waiters);
                    let seen = counter.load();
                    if pending.load(Ordering::SeqCst) {
                        return;
                    }
                    counter.wait_change(seen, Duration::ZERO, Duration::from_secs(3600));
                }
            })
        };
        let caller = {
            let (seat, pending) = (seat.clone(), pending.clone());
            thread::spawn(move || {
                let turned = std::cell::Cell::new(false);
                seat.drive_quiet(
                    || (done_at_entry || turned.get()).then_some(()),
                    |_| {
                        turned.set(true);
                        Turn::Again
                    },
                    |_| true,
                    || pending.load(Ordering::SeqCst),
                )
            })
        };
        pending.store(true, Ordering::SeqCst);
        WakeCounter::new(&bell.state, &bell.waiters).bump();
        seat.wake_dormant();
        assert_eq!(caller.join().unwrap(), Driven::Done(()));
        lp.join().unwrap();
    });
}

/// [`crate::OwnerFirst`] as a network node uses it: the owner (this thread) runs jobs; the
/// resource yields one job per frame; the peer sends frame `k + 2` only once the owner
/// finished job `k` (a window of two, as a root waiting for replies), so a reader blocked
/// on a frame holds the resource until the owner makes progress. The helper starts asked
/// (the owner was busy), reads until it handed a job while the owner waited, gives the
/// resource back and wakes a waiting owner with a no-op; the owner asks it again whenever
/// it takes a job while frames wait unread. Every job must reach the owner: an owner
/// left waiting with nobody reading is a deadlock, which loom reports.
#[test]
fn loom_owner_first_never_leaves_a_waiting_owner_without_a_reader() {
    use crate::sync::Condvar;
    use crate::{OwnerFirst, OwnerTurn};
    use std::collections::VecDeque;
    const FRAMES: u32 = 3;
    /// Frames read so far.
    struct Source {
        read: u32,
    }
    /// Frames the peer has sent, and the jobs handed to the owner (`None`: a no-op).
    struct Shared {
        sent: crate::sync::Mutex<u32>,
        sent_cv: Condvar,
        jobs: crate::sync::Mutex<VecDeque<Option<u32>>>,
        jobs_cv: Condvar,
    }
    impl Shared {
        fn hand(&self, job: Option<u32>) {
            self.jobs.lock().push_back(job);
            self.jobs_cv.notify_one();
        }
        /// Reads the next frame (blocking until the peer sent it) and hands its job.
        fn read_one(&self, src: &mut Source) {
            let mut sent = self.sent.lock();
            while *sent <= src.read {
                sent = self.sent_cv.wait(sent).unwrap_or_else(|e| e.into_inner());
            }
            drop(sent);
            src.read += 1;
            self.hand(Some(src.read));
        }
    }
    loom::model(|| {
        let reader = Arc::new(OwnerFirst::new(Source { read: 0 }));
        let sh = Arc::new(Shared {
            sent: crate::sync::Mutex::new(2),
            sent_cv: Condvar::new(),
            jobs: crate::sync::Mutex::new(VecDeque::new()),
            jobs_cv: Condvar::new(),
        });
        reader.ask_helper();
        let helper = {
            let (reader, sh) = (reader.clone(), sh.clone());
            thread::spawn(move || {
                while reader.helper_wait_asked(Duration::from_secs(1)) {
                    let mut src = reader.helper_take();
                    while src.read < FRAMES {
                        sh.read_one(&mut src);
                        if reader.owner_waits() {
                            break;
                        }
                    }
                    if reader.helper_release(src) {
                        sh.hand(None);
                    }
                }
            })
        };
        let mut done = 0;
        while done < FRAMES {
            let job = sh.jobs.lock().pop_front();
            match job {
                Some(Some(k)) => {
                    assert_eq!(k, done + 1, "jobs in frame order");
                    done += 1;
                    if let Some(src) = reader.try_take() {
                        let waiting = *sh.sent.lock() > src.read;
                        drop(src);
                        if waiting {
                            reader.ask_helper();
                        }
                    }
                    // The job's reply lets the peer send one more frame.
                    *sh.sent.lock() = (done + 2).min(FRAMES);
                    sh.sent_cv.notify_all();
                }
                Some(None) => {}
                None => match reader.owner_turn() {
                    OwnerTurn::Use(mut src) => {
                        // A job the helper handed just before it let go comes first.
                        if src.read < FRAMES && sh.jobs.lock().is_empty() {
                            sh.read_one(&mut src);
                        }
                    }
                    OwnerTurn::Wait => {
                        let mut jobs = sh.jobs.lock();
                        while jobs.is_empty() {
                            jobs = sh.jobs_cv.wait(jobs).unwrap_or_else(|e| e.into_inner());
                        }
                        drop(jobs);
                        reader.owner_woken();
                    }
                },
            }
        }
        reader.close();
        helper.join().unwrap();
    });
}

/// [`crate::KickGate`]: a waiter that enters the gate, finds no event and sleeps (as in a
/// `poll` a ring cannot reach; here a park, the kick an unpark after setting a sticky flag,
/// as an eventfd stays readable) is kicked by the ringer that publishes the event: a
/// waiter left asleep is a deadlock, which loom reports.
#[test]
fn loom_kick_gate_a_waiter_that_sleeps_is_kicked() {
    use crate::sync::AtomicBool;
    use crate::KickGate;
    loom::model(|| {
        let gate = Arc::new(KickGate::new());
        let event = Arc::new(AtomicBool::new(false));
        let kicked = Arc::new(AtomicBool::new(false));
        let waiter = thread::current();
        let ringer = {
            let (gate, event, kicked) = (gate.clone(), event.clone(), kicked.clone());
            thread::spawn(move || {
                event.store(true, Ordering::Relaxed);
                if gate.should_kick() {
                    kicked.store(true, Ordering::Release);
                    waiter.unpark();
                }
            })
        };
        let inside = gate.enter();
        if !event.load(Ordering::Relaxed) {
            while !kicked.load(Ordering::Acquire) {
                thread::park();
            }
        }
        drop(inside);
        ringer.join().unwrap();
    });
}
