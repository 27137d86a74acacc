//! A panic inside a pass of the scheduler loop (an internal error of the engine: no user
//! code runs in a pass, so it is injected through the hidden `inject_pass_panic` hook)
//! breaks the loop: the run being waited for and every later run fail with an error
//! naming the panic, and nobody steps the half-updated loop again. Before the shared
//! driver seat, a panic in a pass driven by a waiting caller unwound out of
//! `RunHandle::wait`, and the scheduler thread recovered the poisoned lock and went on
//! stepping the loop (so later runs "succeeded" on half-updated state).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use strata_dist::*;
use strata_host::ExecMode;
use strata_types::TaskArgs;

/// Long enough that the waiting caller is driving the loop when its task is still running.
const TASK: Duration = Duration::from_millis(300);
const PATIENCE: Option<Duration> = Some(Duration::from_secs(30));

fn worker() -> (DistWorker, HostOrchHandle) {
    let mut w =
        DistWorker::new(DistConfig::l3(Vec::new(), 1).with_exec_mode(ExecMode::Threads)).unwrap();
    let slow = w.register_sub("slow", |_| {
        std::thread::sleep(TASK);
        Ok(())
    });
    let orch = w.register_orchestration("one slow task", move |o, _| {
        o.submit_sub(&slow, &TaskArgs::new())?;
        Ok(())
    });
    w.init().unwrap();
    // A healthy run first: the loop works before the fault.
    w.run(&orch, &TaskArgs::new()).unwrap();
    (w, orch)
}

/// Waits on `h`, turning a panic out of `wait` into a test failure that says so.
fn wait_err(h: &mut RunHandle, what: &str) -> String {
    let r = catch_unwind(AssertUnwindSafe(|| h.wait(PATIENCE)))
        .unwrap_or_else(|_| panic!("{what}: RunHandle::wait panicked instead of failing the run"));
    match r {
        Ok(()) => panic!("{what}: the run succeeded on a broken scheduler loop"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_panic_in_a_callers_pass_fails_every_waiting_run_and_breaks_the_loop() {
    let (mut w, orch) = worker();
    w.inject_pass_panic("injected fault in a caller's pass", true)
        .unwrap();
    let mut first = w.submit(&orch, &TaskArgs::new()).unwrap();
    let mut second = w.submit(&orch, &TaskArgs::new()).unwrap();
    // This thread drives the loop while it waits: the fault fires in its pass.
    let e = wait_err(&mut first, "the run whose caller drove the faulty pass");
    assert!(e.contains("injected fault in a caller's pass"), "{e}");
    // The other run in flight can never finish: it fails naming the panic too.
    let e = wait_err(&mut second, "the other run in flight");
    assert!(e.contains("injected fault in a caller's pass"), "{e}");
    // Nothing more is admitted, with the panic as the reason.
    let later = w
        .submit(&orch, &TaskArgs::new())
        .and_then(|mut h| h.wait(PATIENCE));
    let e = later.expect_err("a later run on a broken loop").to_string();
    assert!(e.contains("injected fault in a caller's pass"), "{e}");
    drop((first, second));
    // Teardown still reaps the children (the worker may report the cut-short task).
    let _ = w.close();
}

#[test]
fn a_panic_in_the_scheduler_threads_pass_fails_the_waiting_run() {
    let (mut w, orch) = worker();
    let mut run = w.submit(&orch, &TaskArgs::new()).unwrap();
    w.inject_pass_panic("injected fault on the scheduler thread", false)
        .unwrap();
    let e = wait_err(&mut run, "the run in flight");
    assert!(e.contains("injected fault on the scheduler thread"), "{e}");
    let later = w
        .submit(&orch, &TaskArgs::new())
        .and_then(|mut h| h.wait(PATIENCE));
    let e = later.expect_err("a later run on a broken loop").to_string();
    assert!(e.contains("injected fault on the scheduler thread"), "{e}");
    drop(run);
    let _ = w.close();
}
