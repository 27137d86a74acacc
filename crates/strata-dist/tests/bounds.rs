//! Bounded waits (`ExecMode::Process`): a child that does not answer a control request
//! (stopped with `SIGSTOP`) is declared unresponsive within the control deadline and
//! `close()` still finishes; a sub task stuck in a loop fails with a timeout at its
//! deadline (also behind an orchestration that returned `Err`); and timeouts too large for
//! an `Instant` mean "no deadline" instead of an overflow panic.
//!
//! `harness = false`: the worker forks, which needs a single-threaded process. Every wait
//! on the engine runs under a watchdog: if the engine does not answer within `BOUND`, the
//! watchdog `SIGKILL`s the children (which ends the engine's wait with a death instead of
//! a hang), and the scenario fails on what it got. Only generous bounds are asserted,
//! never timings.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use strata_dist::*;
use strata_graph::FailureKind;
use strata_host::ExecMode;
use strata_types::{ArgTag, DataType, TaskArgs};

/// Lets Threads-mode callables that spin "forever" end (a thread cannot be killed).
static RELEASE_THREADS: AtomicBool = AtomicBool::new(false);

/// Kills `pids` unless disarmed within `after`: a hang of the engine becomes a failure of
/// the scenario, never a hang of the suite.
struct Watchdog {
    disarm: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<bool>,
}

impl Watchdog {
    fn arm(after: Duration, pids: Vec<i32>) -> Watchdog {
        let (disarm, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if rx.recv_timeout(after).is_ok() {
                return false;
            }
            for p in pids {
                let _ = kill(p);
            }
            // Thread children cannot be killed: let them out of their loops.
            RELEASE_THREADS.store(true, Ordering::SeqCst);
            true
        });
        Watchdog { disarm, thread }
    }

    /// Whether it fired.
    fn disarm(self) -> bool {
        let _ = self.disarm.send(());
        self.thread.join().unwrap_or(true)
    }
}

fn signal(pid: i32, sig: i32) -> Outcome {
    // SAFETY: signalling a child process this scenario started (not yet reaped).
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(format!("kill {pid}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// How much later than its deadline a bounded call may return here (generous: the
/// machine is shared).
const SLACK: Duration = Duration::from_secs(10);

fn a_stopped_chip_is_declared_unresponsive_and_close_finishes() -> Outcome {
    let mut cfg = l3_config(ExecMode::Process, 1, 1);
    cfg.control_timeout = Duration::from_millis(500);
    cfg.close_grace = Duration::from_millis(500);
    let (control_timeout, close_grace) = (cfg.control_timeout, cfg.close_grace);
    let mut w = DistWorker::new(cfg).ctx("new")?;
    w.init().ctx("init")?;
    let pids = w.child_pids();
    w.committed_device_memory(0)
        .ctx("a control request before the stop")?;
    signal(pids[0], libc::SIGSTOP)?;

    let dog = Watchdog::arm(BOUND, pids.clone());
    let t0 = Instant::now();
    let got = w.committed_device_memory(0);
    let took = t0.elapsed();
    let fired = dog.disarm();
    println!("    control request to a stopped chip answered after {took:.2?}");
    check!(
        !fired,
        "committed_device_memory hung until the watchdog killed the children"
    );
    match got {
        Err(DistError::Unresponsive {
            worker,
            message,
            after,
        }) => {
            check!(
                after == control_timeout,
                "the deadline it missed: {after:?}"
            );
            check!(worker.contains("chip_process"), "names the child: {worker}");
            check!(
                message.contains("worker 0")
                    && message.contains("unresponsive")
                    && message.contains("stopped"),
                "says the child is unresponsive and stopped: {message}"
            );
        }
        other => return Err(format!("expected DistError::Unresponsive, got {other:?}")),
    }
    check!(
        took < control_timeout + SLACK,
        "answered within its deadline: {took:?}"
    );
    check!(w.unusable_reason().is_some(), "the worker is unusable");

    let dog = Watchdog::arm(BOUND, pids);
    let t0 = Instant::now();
    let closed = w.close();
    let took = t0.elapsed();
    let fired = dog.disarm();
    println!("    close with a stopped chip (grace {close_grace:?}): {took:.2?}");
    check!(!fired, "close hung until the watchdog killed the children");
    match closed {
        Ok(()) | Err(DistError::Close(_)) => {}
        other => return Err(format!("close: {other:?}")),
    }
    check!(
        took < close_grace + SLACK,
        "close finished within its grace plus a bound: {took:?}"
    );
    Ok(())
}

/// A sub that marks `t[0]` and then spins forever.
fn spinning_sub(w: &mut DistWorker) -> SubHandle {
    w.register_sub("spin", |call| {
        call.tensor_mut::<u64>(0)?.set(&[0], 1)?;
        loop {
            std::hint::spin_loop();
        }
    })
}

fn a_sub_task_past_its_deadline_fails_with_a_timeout_and_poisons_downstream() -> Outcome {
    let mut cfg = l3_config(ExecMode::Process, 0, 2);
    cfg.task_timeout = Duration::from_millis(500);
    cfg.close_grace = Duration::from_millis(500);
    let task_timeout = cfg.task_timeout;
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let started = w.shared_tensor(&[1], DataType::U64).ctx("flag")?;
    let downstream = w.shared_tensor(&[1], DataType::U64).ctx("downstream")?;
    let spin = spinning_sub(&mut w);
    let mark = w.register_sub("mark", |call| {
        call.tensor_mut::<u64>(1)?.set(&[0], 1)?;
        Ok(())
    });
    let (sa, da) = (started.clone(), downstream.clone());
    let orch = w.register_orchestration("spin", move |o, _| {
        o.submit_sub(&spin, &args(&[sa.arg(ArgTag::OutputExisting)], &[]))?;
        o.submit_sub(
            &mark,
            &args(
                &[sa.arg(ArgTag::Input), da.arg(ArgTag::OutputExisting)],
                &[],
            ),
        )?;
        Ok(())
    });
    w.init().ctx("init")?;
    let dog = Watchdog::arm(BOUND, w.child_pids());
    let t0 = Instant::now();
    let got = w.run(&orch, &TaskArgs::new());
    let took = t0.elapsed();
    let fired = dog.disarm();
    println!("    a spinning sub task (deadline {task_timeout:?}) failed after {took:.2?}");
    check!(
        !fired,
        "the run hung until the watchdog killed the children"
    );
    match got {
        Err(DistError::TaskFailed(f)) => {
            check!(f.kind() == FailureKind::Timeout, "a timeout: {f:?}");
            check!(
                f.message().contains("sub_worker") && f.message().contains("deadline"),
                "names the child and its deadline: {}",
                f.message()
            );
        }
        other => return Err(format!("expected a timeout, got {other:?}")),
    }
    check!(
        took < task_timeout + SLACK,
        "failed at its deadline: {took:?}"
    );
    check!(
        downstream.to_vec::<u64>().ctx("read")?[0] == 0,
        "the dependent task was poisoned, not run"
    );
    let t0 = Instant::now();
    match w.close() {
        Ok(()) | Err(DistError::Close(_)) => {}
        other => return Err(format!("close: {other:?}")),
    }
    check!(t0.elapsed() < SLACK, "close finished: {:?}", t0.elapsed());
    Ok(())
}

fn the_fence_of_a_failed_orchestration_ends_at_the_stuck_tasks_deadline() -> Outcome {
    let mut cfg = l3_config(ExecMode::Process, 0, 1);
    cfg.close_grace = Duration::from_millis(500);
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let started = w.shared_tensor(&[1], DataType::U64).ctx("flag")?;
    let spin = spinning_sub(&mut w);
    let sa = started.clone();
    let orch = w.register_orchestration("spin then fail", move |o, _| {
        o.submit_sub(&spin, &args(&[sa.arg(ArgTag::OutputExisting)], &[]))?;
        // Let the stuck task start before failing: the fence then waits for it.
        let end = Instant::now() + SLACK;
        while sa.to_vec::<u64>().map(|v| v[0]).unwrap_or(1) == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        Err("deliberate orchestration error".into())
    });
    w.init().ctx("init")?;
    let dog = Watchdog::arm(BOUND, w.child_pids());
    let t0 = Instant::now();
    // A per-task deadline given by the call configuration (the worker's default is
    // minutes).
    let config = strata_types::CallConfig::default().with_timeout(Duration::from_millis(500));
    let got = w.submit_with(&orch, &TaskArgs::new(), &config);
    let took = t0.elapsed();
    let fired = dog.disarm();
    println!("    the fence behind a stuck task (deadline 500 ms) ended after {took:.2?}");
    check!(!fired, "submit hung until the watchdog killed the children");
    match got {
        Err(DistError::Orchestration(e)) => {
            check!(e.to_string().contains("deliberate"), "{e}")
        }
        other => return Err(format!("expected the orchestration's error, got {other:?}")),
    }
    check!(took < Duration::from_millis(500) + SLACK, "{took:?}");
    match w.close() {
        Ok(()) | Err(DistError::Close(_)) => {}
        other => return Err(format!("close: {other:?}")),
    }
    Ok(())
}

fn a_level_3_task_past_its_deadline_fails_with_a_timeout_naming_the_child() -> Outcome {
    let mut cfg = DistConfig::l4(0).with_exec_mode(ExecMode::Process);
    cfg.task_timeout = Duration::from_millis(500);
    cfg.close_grace = Duration::from_millis(500);
    let mut top = DistWorker::new(cfg).ctx("new")?;
    let spin = top.register_sub("spin forever", |_| loop {
        std::hint::spin_loop();
    });
    let inner = top.register_orchestration("inner", move |o, _| {
        o.submit_sub(&spin, &TaskArgs::new())?;
        Ok(())
    });
    // The level-3 child keeps the default deadlines (minutes): only the level-4 worker's
    // deadline on its task can end this run.
    let child = top
        .add_worker(DistWorker::new(l3_config(ExecMode::Process, 0, 1)).ctx("child")?)
        .ctx("add_worker")?;
    let outer = top.register_orchestration("outer", move |o, _| {
        o.submit_next_level(inner, &TaskArgs::new(), child)?;
        Ok(())
    });
    top.init().ctx("init")?;
    let grandchildren: Vec<i32> = {
        let children = top.child_pids();
        descendants()
            .into_iter()
            .filter(|p| !children.contains(p))
            .collect()
    };
    let mut pids = top.child_pids();
    pids.extend(&grandchildren);
    let dog = Watchdog::arm(BOUND, pids);
    let t0 = Instant::now();
    let got = top.run(&outer, &TaskArgs::new());
    let took = t0.elapsed();
    let fired = dog.disarm();
    println!("    a stuck level-3 task (deadline 500 ms) failed after {took:.2?}");
    check!(
        !fired,
        "the run hung until the watchdog killed the children"
    );
    match got {
        Err(DistError::TaskFailed(f)) => {
            check!(f.kind() == FailureKind::Timeout, "a timeout: {f:?}");
            check!(
                f.message().contains("child_worker") && f.message().contains("deadline"),
                "names the level-3 child and its deadline: {}",
                f.message()
            );
        }
        other => return Err(format!("expected a timeout, got {other:?}")),
    }
    let t0 = Instant::now();
    match top.close() {
        Ok(()) | Err(DistError::Close(_)) => {}
        other => return Err(format!("close: {other:?}")),
    }
    check!(t0.elapsed() < SLACK, "close finished: {:?}", t0.elapsed());
    // The killed child's own children die with it (its process group, or the parent-death
    // signal) and are reparented to this subreaper: reap them.
    let survivors = reap_within(&grandchildren, BOUND);
    check!(
        survivors.is_empty(),
        "the level-3 child's children outlived it: {survivors:?}"
    );
    Ok(())
}

/// Reaps (as subreaper) each of `pids` as it ends, until all ended or `within` passed;
/// `SIGKILL`s and reaps the survivors (cleanup) and returns them.
fn reap_within(pids: &[i32], within: Duration) -> Vec<i32> {
    let mut gone = vec![false; pids.len()];
    let end = Instant::now() + within;
    while gone.iter().any(|g| !g) && Instant::now() < end {
        for (i, &p) in pids.iter().enumerate() {
            if !gone[i] {
                // SAFETY: reaping a process reparented to us (or not ours: -1, and then
                // signal 0 probes whether it still exists).
                let r = unsafe { libc::waitpid(p, std::ptr::null_mut(), libc::WNOHANG) };
                // SAFETY: signal 0 only probes.
                gone[i] = r == p || (r == -1 && unsafe { libc::kill(p, 0) } == -1);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let survivors: Vec<i32> = pids
        .iter()
        .zip(&gone)
        .filter(|(_, g)| !**g)
        .map(|(p, _)| *p)
        .collect();
    for &p in &survivors {
        // SAFETY: an unreaped process reparented to us: kill and reap it.
        unsafe {
            libc::kill(p, libc::SIGKILL);
            libc::waitpid(p, std::ptr::null_mut(), 0);
        }
    }
    survivors
}

fn a_threads_mode_sub_past_its_deadline_is_abandoned_and_close_finishes() -> Outcome {
    let mut cfg = l3_config(ExecMode::Threads, 0, 1);
    cfg.task_timeout = Duration::from_millis(300);
    cfg.close_grace = Duration::from_millis(300);
    let mut w = DistWorker::new(cfg).ctx("new")?;
    RELEASE_THREADS.store(false, Ordering::SeqCst);
    let spin = w.register_sub("spin until released", |_| {
        while !RELEASE_THREADS.load(Ordering::SeqCst) {
            std::hint::spin_loop();
        }
        Ok(())
    });
    let orch = w.register_orchestration("spin", move |o, _| {
        o.submit_sub(&spin, &TaskArgs::new())?;
        Ok(())
    });
    w.init().ctx("init")?;
    let dog = Watchdog::arm(BOUND, Vec::new());
    let got = w.run(&orch, &TaskArgs::new());
    let fired = dog.disarm();
    check!(
        !fired,
        "the run hung until the watchdog released the thread"
    );
    let outcome = match got {
        Err(DistError::TaskFailed(f)) if f.kind() == FailureKind::Timeout => {
            if f.message().contains("sub_worker") && f.message().contains("abandoned") {
                Ok(())
            } else {
                Err(format!(
                    "names the child and that it was abandoned: {}",
                    f.message()
                ))
            }
        }
        other => Err(format!("expected a timeout, got {other:?}")),
    };
    let t0 = Instant::now();
    let closed = w.close();
    let took = t0.elapsed();
    // The abandoned thread may end now (the leak check counts threads).
    RELEASE_THREADS.store(true, Ordering::SeqCst);
    outcome?;
    match closed {
        Ok(()) | Err(DistError::Close(_)) => {}
        other => return Err(format!("close: {other:?}")),
    }
    check!(
        took < SLACK,
        "close finished with the thread still spinning: {took:?}"
    );
    Ok(())
}

fn timeouts_too_large_for_an_instant_mean_no_deadline() -> Outcome {
    let mut cfg = l3_config(ExecMode::Process, 1, 1);
    cfg.startup_timeout = Duration::MAX;
    cfg.close_grace = Duration::MAX;
    cfg.control_timeout = Duration::MAX;
    cfg.task_timeout = Duration::MAX;
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let noop = w.register_sub("noop", |_| Ok(()));
    let orch = w.register_orchestration("noop", move |o, _| {
        o.submit_sub(&noop, &TaskArgs::new())?;
        Ok(())
    });
    w.init().ctx("init with startup_timeout = Duration::MAX")?;
    w.committed_device_memory(0)
        .ctx("a control request with control_timeout = Duration::MAX")?;
    let mut h = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    h.wait(Some(Duration::MAX))
        .ctx("wait(Some(Duration::MAX))")?;
    w.run(&orch, &TaskArgs::new())
        .ctx("run with task_timeout = Duration::MAX")?;
    // Closed by Drop, with close_grace = Duration::MAX.
    drop(w);
    Ok(())
}

fn main() {
    become_subreaper();
    run(&[
        (
            "a_stopped_chip_is_declared_unresponsive_and_close_finishes",
            a_stopped_chip_is_declared_unresponsive_and_close_finishes,
        ),
        (
            "a_sub_task_past_its_deadline_fails_with_a_timeout_and_poisons_downstream",
            a_sub_task_past_its_deadline_fails_with_a_timeout_and_poisons_downstream,
        ),
        (
            "the_fence_of_a_failed_orchestration_ends_at_the_stuck_tasks_deadline",
            the_fence_of_a_failed_orchestration_ends_at_the_stuck_tasks_deadline,
        ),
        (
            "a_level_3_task_past_its_deadline_fails_with_a_timeout_naming_the_child",
            a_level_3_task_past_its_deadline_fails_with_a_timeout_naming_the_child,
        ),
        (
            "timeouts_too_large_for_an_instant_mean_no_deadline",
            timeouts_too_large_for_an_instant_mean_no_deadline,
        ),
        // Last: it leaves this process multi-threaded for a moment, and the scenarios
        // above fork.
        (
            "a_threads_mode_sub_past_its_deadline_is_abandoned_and_close_finishes",
            a_threads_mode_sub_past_its_deadline_is_abandoned_and_close_finishes,
        ),
    ]);
}
