//! `ExecMode::Threads`: the same children as threads over the same mailbox protocol.
//!
//! `harness = false` like `processes.rs`, so the leak check can count this process's
//! threads exactly: every scenario must leave as many threads as it found.

mod common;

use common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_host::*;
use strata_mailbox::{Handler, TaskSlot};
use strata_types::{ArgTag, IdentityMinter, TaskArgs, TensorArg};

fn threads_opts() -> SpawnOptions {
    SpawnOptions::new(ExecMode::Threads).with_startup_timeout(BOUND)
}

fn args_of(tensors: &[TensorArg], scalars: &[u64]) -> TaskArgs {
    let mut a = TaskArgs::new();
    for t in tensors {
        a.push_tensor(*t).unwrap();
    }
    for s in scalars {
        a.push_scalar(*s).unwrap();
    }
    a
}

fn round_trips_on_both_frames() -> Outcome {
    const N: u64 = 10_000;
    let mem = SharedMemory::new();
    let minter = IdentityMinter::new();
    let count = SharedTensor::zeros::<u64>(&mem, &minter, &[1]).ctx("count")?;
    let mut reg = SubRegistry::new();
    let inc = reg.register_fn("inc", |call| {
        call.tensor_mut::<u64>(0)?.update(|x| x + 1);
        Ok(())
    });
    let noop = reg.register_fn("noop", |_| Ok(()));
    let mut children = Children::spawn(&mem, subs(&reg, 1), threads_opts()).ctx("spawn")?;
    check!(children.pids().is_empty(), "threads have no pids");
    let lane = children.lane(0);
    check!(lane.pid().is_none(), "pid");
    let mut tasks = Tasks::new();
    let args = args_of(&[count.arg(ArgTag::InOut)], &[]);
    for i in 0..N {
        ok(tasks.run(lane, TaskSlot::ALL[(i % 2) as usize], inc, &args))?;
    }
    check!(count.to_vec::<u64>().ctx("read")? == vec![N], "count");
    let none = TaskArgs::new();
    let t0 = Instant::now();
    for i in 0..N {
        ok(tasks.run(lane, TaskSlot::ALL[(i % 2) as usize], noop, &none))?;
    }
    println!(
        "    sub round trip (thread): {:.2} µs/task one in flight ({N} tasks)",
        t0.elapsed().as_secs_f64() * 1e6 / N as f64
    );
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(report.is_clean(), "{report}");
    check!(
        report.children[0].end == Some(ChildEnd::ThreadReturned(exit_codes::OK)),
        "{report}"
    );
    Ok(())
}

fn closures_share_state_and_failures_are_task_failures() -> Outcome {
    let mem = SharedMemory::new();
    let minter = IdentityMinter::new();
    let out = SharedTensor::zeros::<u64>(&mem, &minter, &[2]).ctx("out")?;
    let table: Vec<u64> = vec![5, 6, 7];
    let counter = Arc::new(AtomicU64::new(0));
    const OFFSET: u64 = 10;
    let mut reg = SubRegistry::new();
    let c2 = counter.clone();
    let lookup = reg.register_fn("lookup", move |call| {
        let i: usize = call.scalar(0).ok_or("missing scalar")?;
        let n = c2.fetch_add(1, Ordering::SeqCst) + 1;
        let mut o = call.tensor_mut::<u64>(0)?;
        o.copy_from_slice(&[table[i] + OFFSET, n])?;
        Ok(())
    });
    let panics = reg.register_fn("panics", |_| panic!("deliberate closure panic"));
    let mut children = Children::spawn(&mem, subs(&reg, 2), threads_opts()).ctx("spawn")?;
    let mut tasks = Tasks::new();
    for i in 0..3u64 {
        let lane = children.lane(i as usize % 2);
        ok(tasks.run(
            lane,
            TaskSlot::Slot0,
            lookup,
            &args_of(&[out.arg(ArgTag::Output)], &[i]),
        ))?;
        check!(
            out.to_vec::<u64>().ctx("read")? == vec![table_value(i) + OFFSET, i + 1],
            "call {i}"
        );
    }
    // Threads share the process: the parent sees the count the children kept.
    check!(counter.load(Ordering::SeqCst) == 3, "shared counter");
    // A panicking closure is a task failure; the thread keeps serving.
    let lane = children.lane(1);
    let (code, msg) = failed(tasks.run(lane, TaskSlot::Slot1, panics, &TaskArgs::new()))?;
    check!(
        code == sub_codes::PANICKED
            && msg == "sub_worker 1: panics: panicked: deliberate closure panic",
        "{code} {msg}"
    );
    lane.check_alive().ctx("the thread died")?;
    check!(!lane.is_dead(), "is_dead");
    let unknown = SubRegistry::id_of("nobody");
    let (code, msg) = failed(tasks.run(lane, TaskSlot::Slot0, unknown, &TaskArgs::new()))?;
    check!(
        code == sub_codes::NOT_REGISTERED && msg.contains("not registered"),
        "{msg}"
    );
    ok(tasks.run(
        lane,
        TaskSlot::Slot0,
        lookup,
        &args_of(&[out.arg(ArgTag::Output)], &[2]),
    ))?;
    children.shutdown(BOUND).ctx("shutdown")?;
    Ok(())
}

fn table_value(i: u64) -> u64 {
    [5, 6, 7][i as usize]
}

struct Failing(&'static str);

impl ChildProgram for Failing {
    fn label(&self) -> String {
        format!("failing {}", self.0)
    }

    fn start(self: Box<Self>, _env: &ChildEnv) -> Result<Box<dyn Handler + Send>, String> {
        match self.0 {
            "err" => Err("no device (deliberate)".into()),
            "panic" => panic!("deliberate start panic"),
            _ => {
                std::thread::sleep(Duration::from_millis(600));
                Err("too late".into())
            }
        }
    }
}

fn startup_failures_name_the_thread_and_join_everything() -> Outcome {
    let reg = SubRegistry::new();
    for (kind, want) in [
        ("err", "failing err (thread) failed during init: no device (deliberate)"),
        (
            "panic",
            "failing panic (thread) failed during init: panicked: deliberate start panic",
        ),
        (
            "slow",
            "failing slow (thread) failed during init: did not become ready within 100ms (startup deadline exceeded)",
        ),
    ] {
        let mem = SharedMemory::new();
        let programs: Vec<Box<dyn ChildProgram>> = vec![
            Box::new(SubProgram::new(reg.clone())),
            Box::new(Failing(kind)),
        ];
        let r = Children::spawn(
            &mem,
            programs,
            SpawnOptions::new(ExecMode::Threads).with_startup_timeout(Duration::from_millis(100)),
        );
        match r {
            Err(e @ HostError::StartupFailed { pid: None, .. }) => {
                check!(e.to_string() == want, "{kind}: {e}");
            }
            other => return Err(format!("{kind}: expected StartupFailed, got {other:?}")),
        }
        check!(
            strata_host::other_threads().ctx("threads")? == 0,
            "{kind}: threads left running"
        );
    }
    Ok(())
}

fn a_thread_that_ends_is_reported_dead() -> Outcome {
    let mem = SharedMemory::new();
    let reg = SubRegistry::new();
    let mut children = Children::spawn(&mem, subs(&reg, 1), threads_opts()).ctx("spawn")?;
    let lane = children.lane(0);
    // Break the protocol under the child: garbage in task frame 1's state word. Its
    // serve loop fails (at its next park-slice wake-up) and the thread returns.
    let p = lane.parent().mailbox().region().as_ptr();
    // SAFETY: the mailbox region is 3 × 64 KiB; byte 65 536 is task frame 1's (aligned)
    // state word, which is an atomic in the layout.
    unsafe {
        (*p.add(65_536).cast::<std::sync::atomic::AtomicU32>()).store(77, Ordering::Release);
    }
    let end = Instant::now() + BOUND;
    let err = loop {
        match lane.check_alive() {
            Ok(()) if Instant::now() < end => std::thread::sleep(Duration::from_millis(1)),
            Ok(()) => return Err("the thread's end was never noticed".into()),
            Err(e) => break e,
        }
    };
    match &err {
        HostError::ChildDied {
            label,
            pid: None,
            exit: ChildEnd::ThreadReturned(exit_codes::PROTOCOL_ERROR),
        } if label == "sub_worker 0" => {}
        other => return Err(format!("unexpected: {other:?}")),
    }
    check!(
        err.to_string()
            .starts_with("sub_worker 0 (thread) died: thread returned with code 3"),
        "{err}"
    );
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(
        report.children[0].died_before_shutdown && !report.is_clean(),
        "{report}"
    );
    Ok(())
}

fn a_thread_stuck_in_a_task_is_detached_at_shutdown() -> Outcome {
    let mem = SharedMemory::new();
    let mut reg = SubRegistry::new();
    let slow = reg.register_fn("slow", |_| {
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    });
    let mut children = Children::spawn(&mem, subs(&reg, 2), threads_opts()).ctx("spawn")?;
    Tasks::new().publish(children.lane(0), TaskSlot::Slot0, slow, &TaskArgs::new())?;
    std::thread::sleep(Duration::from_millis(20));
    let report = children
        .shutdown(Duration::from_millis(50))
        .ctx("shutdown")?;
    check!(
        report.children[0].end.is_none() && report.children[0].is_abnormal(),
        "{report}"
    );
    check!(
        report.children[1].end == Some(ChildEnd::ThreadReturned(0)),
        "{report}"
    );
    check!(report.to_string().contains("thread detached"), "{report}");
    // The detached thread leaves once its task returns (the runner waits for it).
    Ok(())
}

fn the_doorbell_works_with_threads() -> Outcome {
    let mem = SharedMemory::new();
    let mut reg = SubRegistry::new();
    let noop = reg.register_fn("noop", |_| Ok(()));
    let bell = Doorbell::new().ctx("bell")?;
    let mut children = Children::spawn(
        &mem,
        subs(&reg, 1),
        threads_opts().with_doorbell(bell.clone()),
    )
    .ctx("spawn")?;
    let mut tasks = Tasks::new();
    for _ in 0..100 {
        let mut seen = bell.seq();
        tasks.publish(children.lane(0), TaskSlot::Slot1, noop, &TaskArgs::new())?;
        let end = Instant::now() + BOUND;
        while children
            .lane(0)
            .parent()
            .poll(TaskSlot::Slot1)
            .ctx("poll")?
            .completion
            .is_none()
        {
            check!(Instant::now() < end, "no completion");
            seen = bell.wait(seen, Duration::from_micros(20), Duration::from_secs(5));
        }
        children
            .lane(0)
            .parent()
            .reset(TaskSlot::Slot1)
            .ctx("reset")?;
    }
    children.shutdown(BOUND).ctx("shutdown")?;
    Ok(())
}

fn main() {
    common::run(&[
        ("round_trips_on_both_frames", round_trips_on_both_frames),
        (
            "closures_share_state_and_failures_are_task_failures",
            closures_share_state_and_failures_are_task_failures,
        ),
        (
            "startup_failures_name_the_thread_and_join_everything",
            startup_failures_name_the_thread_and_join_everything,
        ),
        (
            "a_thread_that_ends_is_reported_dead",
            a_thread_that_ends_is_reported_dead,
        ),
        (
            "a_thread_stuck_in_a_task_is_detached_at_shutdown",
            a_thread_stuck_in_a_task_is_detached_at_shutdown,
        ),
        (
            "the_doorbell_works_with_threads",
            the_doorbell_works_with_threads,
        ),
    ]);
}
