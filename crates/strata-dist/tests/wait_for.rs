//! A stalled level-3 run explains itself: the error carries the wait-for state, checked
//! against what each scenario set up (task ids are a fresh worker's submission order,
//! from 1; chip task ids are the chip's own, also from 1).
//!
//! `harness = false`: the first scenario forks chip children (the chip's snapshot crosses
//! the mailbox); every scenario runs inside strata-testkit's leak check.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_chip::{ChipConfig, CoreArgs};
use strata_comm::{KernelWindows, WaitCmp};
use strata_dist::*;
use strata_graph::{FailureKind, WorkerClass};
use strata_host::ExecMode;
use strata_types::{
    ArgTag, DataType, Executor, PendingTask, RunningTask, SignalWait, TaskArgs, WaitFor,
};

/// One AIV core and no AIC core: the chip's kernels run on its core 0.
fn one_core_chips(n: usize, mode: ExecMode) -> DistConfig {
    let chip = ChipConfig {
        aic_cores: 0,
        aiv_cores: 1,
        ..ChipConfig::default()
    };
    let mut c = DistConfig::l3(vec![chip; n], 0).with_exec_mode(mode);
    c.comm_arena_bytes = 1 << 20;
    c
}

/// The running entries without their durations (timings are never asserted).
fn running(w: &WaitFor) -> Vec<RunningTask> {
    w.running
        .iter()
        .map(|r| RunningTask {
            for_ms: None,
            ..r.clone()
        })
        .collect()
}

/// A missing notify inside a chip child process: the chip's kernel waits for signal cell
/// 3 of its window, which nobody increments. The wait gives up at the comm deadline and
/// the chip's wait-for state (the cell, its value, the chip task waiting for the kernel)
/// reaches the level-3 error through the mailbox.
fn a_chip_childs_missing_notify_reaches_the_level3_error() -> Outcome {
    let mut cfg = one_core_chips(1, ExecMode::Process);
    cfg.comm_wait_timeout = Duration::from_millis(200);
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let waiter = w
        .register_kernel("wait_flag", |ctx| {
            ctx.window(0)?.wait(&[3], 1, WaitCmp::Ge)?;
            Ok(())
        })
        .ctx("kernel")?;
    let consumer = w.register_kernel("consumer", |_| Ok(())).ctx("kernel")?;
    let chip_orch = w
        .register_chip_orchestration("waits", move |o, a| {
            let t = o.submit_aiv(waiter, CoreArgs::new().tensor(&a.tensor(0)?, ArgTag::InOut))?;
            o.submit_aiv(consumer, CoreArgs::new().dep(t.task_id()))?;
            Ok(())
        })
        .ctx("chip orchestration")?;
    let orch = w.register_orchestration("host", move |o, _| {
        let buf = o.alloc_window_buffer(64)?;
        let sig = o.window(&buf, 0, &[8], DataType::I32)?;
        o.submit_next_level(chip_orch, &TaskArgs::new().inout(&sig), 0)?;
        Ok(())
    });
    w.init().ctx("init")?;
    let e = w
        .run(&orch, &TaskArgs::new())
        .err()
        .ok_or_else(|| "the run fails".to_string())?;
    let DistError::TaskFailed(f) = &e else {
        return Err(format!("not a task failure: {e}"));
    };
    check!(
        f.origin().map(|o| (o.class, o.index)) == Some((WorkerClass::Chip, 0)),
        "{f:?}"
    );
    let wf = f.wait_for().ok_or_else(|| "a wait-for state".to_string())?;
    println!("    {}", wf.to_string().replace('\n', "\n    "));
    check!(wf.place == "chip", "{wf}");
    check!(
        wf.signals
            == vec![SignalWait {
                task: 1,
                core: 0,
                rank: 0,
                cell: 3,
                cmp: ">=".into(),
                expected: 1,
                value: 0,
                gave_up: true,
            }],
        "{wf}"
    );
    check!(
        wf.pending
            == vec![PendingTask {
                task: 2,
                name: "consumer".into(),
                ready: false,
                producers: vec![1],
                workers: vec![],
            }],
        "{wf}"
    );
    check!(wf.running.is_empty() && wf.rings.is_empty(), "{wf}");
    check!(
        !f.message().contains("wait-for state"),
        "the message stays one line; the state travels as data: {}",
        f.message()
    );
    w.close().ctx("close")?;
    Ok(())
}

/// A group blocked by a stuck single: worker 1 runs a chip task that does not end, and a
/// group over workers 0 and 1 waits for it. A wait with a timeout returns the engine's
/// wait-for state: the single running on worker 1, the ready group waiting for worker 1.
fn a_group_blocked_by_a_stuck_single_shows_both() -> Outcome {
    let mut w = DistWorker::new(one_core_chips(2, ExecMode::Threads)).ctx("new")?;
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    let stuck = w
        .register_kernel("stuck", move |ctx| {
            while !r.load(Ordering::SeqCst) && !ctx.cancelled() {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        })
        .ctx("kernel")?;
    let noop = w.register_kernel("noop", |_| Ok(())).ctx("kernel")?;
    let one = |w: &mut DistWorker, name: &str, k| {
        w.register_chip_orchestration(name, move |o, _| {
            o.submit_aiv(k, &CoreArgs::new())?;
            Ok(())
        })
    };
    let stuck_orch = one(&mut w, "stuck", stuck).ctx("orch")?;
    let noop_orch = one(&mut w, "noop", noop).ctx("orch")?;
    let orch = w.register_orchestration("host", move |o, _| {
        o.submit_next_level(stuck_orch, &TaskArgs::new(), 1)?;
        o.submit_next_level_group(noop_orch, &[TaskArgs::new(), TaskArgs::new()], &[0, 1])?;
        Ok(())
    });
    w.init().ctx("init")?;
    let mut run = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    let e = run
        .wait(Some(Duration::from_millis(200)))
        .err()
        .ok_or_else(|| "the wait times out".to_string())?;
    let outcome = (|| -> Outcome {
        let DistError::WaitTimeout { wait_for, .. } = &e else {
            return Err(format!("not a wait timeout: {e}"));
        };
        let wf = wait_for
            .as_ref()
            .ok_or_else(|| "a wait-for state".to_string())?;
        check!(wf.place == "level-3 worker", "{wf}");
        check!(
            running(wf)
                == vec![RunningTask {
                    task: 1,
                    name: String::new(),
                    on: Executor::Worker(1),
                    for_ms: None,
                }],
            "{wf}"
        );
        check!(
            wf.pending
                == vec![PendingTask {
                    task: 2,
                    name: String::new(),
                    ready: true,
                    producers: vec![],
                    workers: vec![1],
                }],
            "{wf}"
        );
        let text = e.to_string();
        println!("    {}", text.replace('\n', "\n    "));
        check!(
            text.contains("task 1 running on worker 1")
                && text.contains("task 2 ready, waits for workers [1]"),
            "{text}"
        );
        Ok(())
    })();
    release.store(true, Ordering::SeqCst);
    run.wait(None).ctx("the run ends once released")?;
    w.close().ctx("close")?;
    outcome
}

/// A stuck single past its deadline (a sub-worker's callback with a task budget): the
/// timeout failure carries the engine's wait-for state, with the task that waits for it.
fn a_task_past_its_deadline_carries_the_engines_wait_for_state() -> Outcome {
    let mut cfg = l3_config(ExecMode::Process, 0, 1);
    cfg.task_timeout = Duration::from_millis(200);
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let spin = w.register_sub("spin", |_| loop {
        std::thread::sleep(Duration::from_millis(5));
    });
    let after = w.register_sub("after", |_| Ok(()));
    let x = w.shared_tensor(&[1], DataType::U64).ctx("x")?;
    let orch = w.register_orchestration("host", move |o, _| {
        o.submit_sub(&spin, &args(&[x.arg(ArgTag::Output)], &[]))?;
        o.submit_sub(&after, &args(&[x.arg(ArgTag::Input)], &[]))?;
        Ok(())
    });
    w.init().ctx("init")?;
    let e = w
        .run(&orch, &TaskArgs::new())
        .err()
        .ok_or_else(|| "the run fails".to_string())?;
    let DistError::TaskFailed(f) = &e else {
        return Err(format!("not a task failure: {e}"));
    };
    check!(f.kind() == FailureKind::Timeout, "{f:?}");
    let wf = f.wait_for().ok_or_else(|| "a wait-for state".to_string())?;
    check!(
        running(wf)
            == vec![RunningTask {
                task: 1,
                name: String::new(),
                on: Executor::SubWorker(0),
                for_ms: None,
            }],
        "{wf}"
    );
    check!(
        wf.pending
            == vec![PendingTask {
                task: 2,
                name: String::new(),
                ready: false,
                producers: vec![1],
                workers: vec![],
            }],
        "{wf}"
    );
    let _ = w.close();
    Ok(())
}

fn main() {
    become_subreaper();
    run(&[
        (
            "a_chip_childs_missing_notify_reaches_the_level3_error",
            a_chip_childs_missing_notify_reaches_the_level3_error,
        ),
        (
            "a_group_blocked_by_a_stuck_single_shows_both",
            a_group_blocked_by_a_stuck_single_shows_both,
        ),
        (
            "a_task_past_its_deadline_carries_the_engines_wait_for_state",
            a_task_past_its_deadline_carries_the_engines_wait_for_state,
        ),
    ]);
}
