//! A stalled dispatch explains itself through the facade: `Error::wait_for()` and the
//! error's text carry what the run was waiting for, at level 2 (a kernel past its timeout,
//! blocked in a signal wait, with a task waiting for it) and at level 3 (a group waiting
//! for the worker a never-ending single runs on). Durations are never asserted.

use super::Mode;
use std::time::Duration;
use strata::prelude::*;
use strata::{Executor, PendingTask, RunningTask, SignalWait, WaitFor};
use strata_testkit::{check, Ctx, Outcome};

/// The running entries without their durations.
fn running(w: &WaitFor) -> Vec<RunningTask> {
    w.running
        .iter()
        .map(|r| RunningTask {
            for_ms: None,
            ..r.clone()
        })
        .collect()
}

/// A kernel that says it waits for signal cell 5 to reach 1 and never sees it; it stops
/// only when the chip cancels it.
fn stuck_kernel(p: &mut Program) -> strata::chip::KernelHandle {
    p.kernel("stuck", |ctx| {
        let note = ctx.signal_note();
        note.waiting(0, 5, ">=", 1, 0);
        while !ctx.cancelled() {
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(KernelError::new("cancelled").into())
    })
}

/// One AIV core and no AIC core: a chip's kernels run on its core 0.
fn one_core(c: &mut ChipConfig) {
    c.aic_cores = 0;
    c.aiv_cores = 1;
}

/// Level 2: the kernel past its timeout is shown running on core 0 with its signal wait,
/// and the task after it waiting for it.
pub fn a_stalled_level_2_dispatch_explains_itself<M: Mode>() -> Outcome {
    let mut p = Program::new("stall_l2", Signature::new());
    let stuck = stuck_kernel(&mut p);
    let after = p.kernel("after", |_| Ok(()));
    p.orchestrate_chip(move |o, _| {
        let t = o.submit_aiv(stuck, &CoreArgs::new())?;
        o.submit_aiv(after, CoreArgs::new().dep(t.task_id()))?;
        Ok(())
    });
    let mut cfg = ChipConfig::default();
    one_core(&mut cfg);
    cfg.kernel_timeout = Duration::from_millis(150);
    let e = p
        .compile(&Target::chip(cfg))
        .ctx("compile")?
        .run_once(())
        .err()
        .ok_or_else(|| "the dispatch fails".to_string())?;
    check!(
        matches!(
            e,
            Error::Chip {
                kind: strata::FailureKind::Timeout,
                ..
            }
        ),
        "{e:?}"
    );
    let w = e
        .wait_for()
        .ok_or_else(|| format!("no wait-for state: {e}"))?;
    check!(
        running(w)
            == vec![RunningTask {
                task: 1,
                name: "stall_l2/stuck".into(),
                on: Executor::Core(0),
                for_ms: None,
            }],
        "{w}"
    );
    check!(
        w.signals
            == vec![SignalWait {
                task: 1,
                core: 0,
                rank: 0,
                cell: 5,
                cmp: ">=".into(),
                expected: 1,
                value: 0,
                gave_up: false,
            }],
        "{w}"
    );
    check!(
        w.pending
            == vec![PendingTask {
                task: 2,
                name: "stall_l2/after".into(),
                ready: false,
                producers: vec![1],
                workers: vec![],
            }],
        "{w}"
    );
    let text = e.to_string();
    check!(
        text.contains("task 1 on core 0 (rank 0) waits for signal cell 5 >= 1, value 0")
            && text.lines().count() > 1
            && !text
                .lines()
                .next()
                .unwrap_or_default()
                .contains("wait-for state"),
        "the first line is the error, the state follows: {text}"
    );
    Ok(())
}

/// Level 3: a group over workers 0 and 1 queued behind a single on worker 1 that does not
/// end (until the chip's kernel timeout cancels it). A wait with a timeout says so.
pub fn a_group_waiting_for_a_stuck_worker_explains_the_timeout<M: Mode>() -> Outcome {
    let mut p = Program::new("stall_l3", Signature::new());
    let stuck = stuck_kernel(&mut p);
    let noop = p.kernel("noop", |_| Ok(()));
    let stuck_chip = p.chip_orchestration("stuck", move |o, _| {
        o.submit_aiv(stuck, &CoreArgs::new())?;
        Ok(())
    });
    let noop_chip = p.chip_orchestration("noop", move |o, _| {
        o.submit_aiv(noop, &CoreArgs::new())?;
        Ok(())
    });
    p.orchestrate(move |o, _| {
        o.submit_next_level(stuck_chip, &TaskArgs::new(), 1)?;
        o.submit_next_level_group(noop_chip, &[TaskArgs::new(), TaskArgs::new()], &[0, 1])?;
        Ok(())
    });
    let target = Target::l3(2)
        .configure(|c| c.exec_mode = M::VALUE)
        .configure_chips(|c| {
            one_core(c);
            c.kernel_timeout = Duration::from_secs(2);
        });
    let compiled = p.compile(&target).ctx("compile")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let h = rt.submit(&compiled, ()).ctx("submit")?;
    let e = h
        .result(Some(Duration::from_millis(200)))
        .err()
        .ok_or_else(|| "the wait times out".to_string())?;
    check!(matches!(e, Error::Timeout { .. }), "{e:?}");
    let w = e
        .wait_for()
        .ok_or_else(|| format!("no wait-for state: {e}"))?;
    check!(
        running(w)
            == vec![RunningTask {
                task: 1,
                name: String::new(),
                on: Executor::Worker(1),
                for_ms: None,
            }],
        "{w}"
    );
    check!(
        w.pending
            == vec![PendingTask {
                task: 2,
                name: String::new(),
                ready: true,
                producers: vec![],
                workers: vec![1],
            }],
        "{w}"
    );
    // The kernel timeout ends the single; its failure is the dispatch's.
    let e = h
        .result(None)
        .err()
        .ok_or_else(|| "the stuck single fails".to_string())?;
    check!(
        matches!(e, Error::Chip { worker: 1, .. }) && e.wait_for().is_some(),
        "{e}"
    );
    rt.close().ctx("close")
}
