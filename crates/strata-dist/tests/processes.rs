//! `ExecMode::Process`: strata-dist's contracts (`contracts/`, shared with `threads.rs`)
//! with real child processes, then what only processes have: children that die (killed,
//! crashed, a stalled chip process that ends itself), a stuck child killed at close, the
//! tree's children when the worker process itself is killed, and the fork-with-threads
//! guard.
//!
//! `harness = false`: a process that forks must be single-threaded at the fork, and the
//! libtest harness runs tests on threads. Every scenario runs inside strata-testkit's leak
//! check (descendant processes, `/dev/shm/strata-*`, threads of this process); this process
//! is a child subreaper, so orphans are counted too. Timing figures are printed, never
//! asserted; the idle-CPU bound is 10× the target so it cannot flake.

mod common;
mod contracts;
mod identity;

use common::*;
use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, CoreArgs, KernelError};
use strata_dist::*;
use strata_host::ExecMode;
use strata_types::{ArgTag, CallConfig, DataType, TaskArgs};

// -------------------------------------------------------------------------------------
// Children that die, a worker process that dies, the fork guard
// -------------------------------------------------------------------------------------

fn a_sub_child_killed_mid_task_fails_the_run_naming_it() -> Outcome {
    let mut w = DistWorker::new(l3_config(ExecMode::Process, 0, 2)).ctx("new")?;
    let started = w.shared_tensor(&[1], DataType::U64).ctx("flag")?;
    let downstream = w.shared_tensor(&[1], DataType::U64).ctx("downstream")?;
    let hang = w.register_sub("hang", |call| {
        call.tensor_mut::<u64>(0)?.set(&[0], 1)?;
        std::thread::sleep(Duration::from_secs(120));
        Ok(())
    });
    let mark = w.register_sub("mark", |call| {
        call.tensor_mut::<u64>(1)?.set(&[0], 1)?;
        Ok(())
    });
    let (sa, da) = (started.clone(), downstream.clone());
    let orch = w.register_orchestration("hang", move |o, _| {
        o.submit_sub(&hang, &args(&[sa.arg(ArgTag::OutputExisting)], &[]))?;
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
    let pids = w.child_pids();
    let handle = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    wait_flag(&started)?;
    // The hanging task runs on sub_worker 0 or 1; find which by killing both in turn
    // would be racy, so kill the one whose task it is: the other is idle, and killing an
    // idle child must also make the worker unusable. Kill both: the error must name one.
    let t0 = Instant::now();
    for &p in &pids {
        kill(p)?;
    }
    let err = match handle.result() {
        Ok(()) => return Err("the run succeeded although its child was killed".into()),
        Err(e) => e.to_string(),
    };
    println!("    death noticed and reported after {:.2?}", t0.elapsed());
    check!(
        err.contains("sub_worker 0") || err.contains("sub_worker 1"),
        "the error names the worker: {err}"
    );
    check!(
        err.contains("SIGKILL") || err.contains("signal"),
        "the error says how it died: {err}"
    );
    check!(
        downstream.to_vec::<u64>().ctx("read")?[0] == 0,
        "the dependent task was poisoned, not run"
    );
    wait_for("the worker to report itself unusable", || {
        w.unusable_reason().is_some()
    })?;
    match w.submit(&orch, &TaskArgs::new()) {
        Err(DistError::Unusable(why)) => check!(why.contains("sub_worker"), "{why}"),
        Err(e) => return Err(format!("expected Unusable, got {e}")),
        Ok(_) => return Err("an unusable worker accepted a run".into()),
    }
    w.close().ctx("close after a death")?;
    Ok(())
}

fn a_chip_child_killed_mid_kernel_fails_the_run_and_close_reaps_everything() -> Outcome {
    let mut w = DistWorker::new(l3_config(ExecMode::Process, 2, 1)).ctx("new")?;
    let started = w.shared_tensor(&[1], DataType::U64).ctx("flag")?;
    // A kernel sees device memory, which reaches the host only when the task ends; the
    // flag is written through the shared mapping the chip child inherited.
    let flag = started.clone();
    let stall = w
        .register_kernel("stall", move |_| {
            flag.write(&[1u64])
                .map_err(|e| KernelError::new(e.to_string()))?;
            std::thread::sleep(Duration::from_secs(120));
            Ok(())
        })
        .ctx("kernel")?;
    let chip_stall = w
        .register_chip_orchestration("stall", move |o, a| {
            o.submit_aiv(stall, CoreArgs::new().inout(&a.tensor(0)?))?;
            Ok(())
        })
        .ctx("chip orch")?;
    let sa = started.clone();
    let orch = w.register_orchestration("stall", move |o, _| {
        o.submit_next_level(chip_stall, &args(&[sa.arg(ArgTag::InOut)], &[]), 1)?;
        Ok(())
    });
    w.init().ctx("init")?;
    let chip1 = w.child_pids()[1];
    let handle = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    wait_flag(&started)?;
    kill(chip1)?;
    let err = handle
        .result()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    check!(
        err.starts_with("worker 1: chip_process dev=1 (pid") && err.contains("SIGKILL"),
        "the error names chip 1 and how it died: {err:?}"
    );
    check!(w.unusable_reason().is_some(), "the worker is unusable");
    let t0 = Instant::now();
    w.close().ctx("close")?;
    println!("    close after a chip death: {:.2?}", t0.elapsed());
    Ok(())
}

fn a_stalled_chip_orchestration_ends_its_process_and_fails_the_run_naming_it() -> Outcome {
    // Forked chip children run their orchestrations on the serving thread
    // (OrchestratorPlacement::Auto resolves to Caller); a stall ends the child.
    let chip = ChipConfig {
        tensor_wait_timeout: Duration::from_millis(50),
        ring_wait_timeout: Duration::from_millis(50),
        ..ChipConfig::default()
    };
    let mut w = DistWorker::new(DistConfig::l3(vec![chip; 2], 0)).ctx("new")?;
    let spin = w
        .register_chip_orchestration("spin", |_, _| loop {
            std::thread::sleep(Duration::from_millis(5));
        })
        .ctx("chip orch")?;
    let fine = w
        .register_chip_orchestration("fine", |_, _| Ok(()))
        .ctx("chip orch")?;
    let orch = w.register_orchestration("stall", move |o, a| {
        let target = a.scalar_at::<u64>(0).ok_or("scalar")? as usize;
        o.submit_next_level(fine, &TaskArgs::new(), 1 - target)?;
        o.submit_next_level(spin, &TaskArgs::new(), target)?;
        Ok(())
    });
    w.init().ctx("init")?;
    let cfg = CallConfig::default().with_timeout(Duration::from_millis(50));
    let t0 = Instant::now();
    let err = w
        .run_with(&orch, &args(&[], &[0]), &cfg)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    println!(
        "    stalled chip orchestration reported after {:.2?}",
        t0.elapsed()
    );
    check!(
        err.starts_with("worker 0: chip_process dev=0 (pid")
            && err.contains("exit")
            && err.contains("70")
            && err.contains("made no progress"),
        "the error names chip 0, its exit and why: {err:?}"
    );
    check!(w.unusable_reason().is_some(), "the worker is unusable");
    w.close().ctx("close")?;
    Ok(())
}

fn a_crashing_sub_child_is_reported() -> Outcome {
    let mut w = DistWorker::new(l3_config(ExecMode::Process, 0, 1)).ctx("new")?;
    let crash = w.register_sub("crash", |_| std::process::abort());
    let orch = w.register_orchestration("crash", move |o, _| {
        o.submit_sub(&crash, &TaskArgs::new())?;
        Ok(())
    });
    w.init().ctx("init")?;
    let err = w
        .run(&orch, &TaskArgs::new())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    check!(
        err.contains("sub_worker 0") && err.contains("SIGABRT"),
        "the error names the worker and the signal: {err:?}"
    );
    w.close().ctx("close")?;
    Ok(())
}

fn idle_children_die_when_the_worker_process_is_killed() -> Outcome {
    // A forked process builds a level-4 tree (two level-3 children, each with a chip and a
    // sub-worker: 6 processes below it), reports the pids, and waits to be killed.
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors.
    check!(unsafe { libc::pipe(fds.as_mut_ptr()) } == 0, "pipe");
    // SAFETY: this process is single-threaded here (the runner runs scenarios in order
    // and every earlier worker was closed); the child leaves through `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let mut top = DistWorker::new(DistConfig::l4(0)).expect("l4");
            for _ in 0..2 {
                top.add_worker(DistWorker::new(l3_config(ExecMode::Process, 1, 1)).expect("l3"))
                    .expect("add");
            }
            top.init().expect("init");
            let me = std::process::id() as i32;
            let below: Vec<i32> = descendants_of(me);
            let text = format!("{below:?}\n");
            // SAFETY: writing our own buffer to the pipe's write end.
            unsafe { libc::write(fds[1], text.as_ptr().cast(), text.len()) };
            std::thread::sleep(Duration::from_secs(300));
            0
        })
        .unwrap_or(101);
        // SAFETY: leave without running inherited destructors.
        unsafe { libc::_exit(code) }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut buf = vec![0u8; 4096];
    // SAFETY: reading into our own buffer.
    let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: closing the read end.
    unsafe { libc::close(fds[0]) };
    let text = String::from_utf8_lossy(&buf[..n.max(0) as usize]).to_string();
    let orphans: Vec<i32> = text
        .trim()
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    kill(pid)?;
    // SAFETY: reaping the process we forked.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    check!(orphans.len() == 6, "the tree below the worker: {text:?}");
    let t0 = Instant::now();
    // As subreaper we inherit the orphans: reap them as they exit.
    wait_for("every orphan to exit", || {
        orphans.iter().all(|&p| {
            // SAFETY: reaping a process that was reparented to us (or is gone: ECHILD).
            let r = unsafe { libc::waitpid(p, std::ptr::null_mut(), libc::WNOHANG) };
            r == p || r == -1
        })
    })?;
    println!("    6 idle orphans gone within {:.2?}", t0.elapsed());
    Ok(())
}

/// A level-4 worker (`grace` to close) with two level-3 children of one chip and one
/// sub-worker each, and a run that keeps both children's sub-workers spinning at 100 %
/// CPU (each bumps word 0 of the returned words when it starts). The level-3 children
/// are blocked waiting for them.
fn busy_level4_tree(grace: Duration) -> Result<(DistWorker, HostOrchHandle, SharedWords), String> {
    let mut cfg = DistConfig::l4(0).with_exec_mode(ExecMode::Process);
    cfg.close_grace = grace;
    let mut top = DistWorker::new(cfg).ctx("l4")?;
    let words = SharedWords::new(&top, 4);
    let w2 = words.clone();
    let spin = top.register_sub("spin", move |_| {
        w2.bump(0);
        loop {
            std::hint::spin_loop();
        }
    });
    let inner = top.register_orchestration("inner", move |o, _| {
        o.submit_sub(&spin, &TaskArgs::new())?;
        Ok(())
    });
    let mut level3 = Vec::new();
    for i in 0..2 {
        let child = DistWorker::new(l3_config(ExecMode::Process, 1, 1)).ctx("l3")?;
        level3.push(top.add_worker(child).ctx(&format!("add {i}"))?);
    }
    let outer = top.register_orchestration("outer", move |o, _| {
        for &w in &level3 {
            o.submit_next_level(inner, &TaskArgs::new(), w)?;
        }
        Ok(())
    });
    top.init().ctx("init")?;
    Ok((top, outer, words))
}

/// Reaps (as subreaper) each of `pids` as it ends until all ended or `within` passed;
/// SIGKILLs and reaps the survivors (cleanup) and returns them.
fn reap_within(pids: &[i32], within: Duration) -> Vec<i32> {
    let mut gone = vec![false; pids.len()];
    let end = Instant::now() + within;
    while gone.iter().any(|g| !g) && Instant::now() < end {
        for (i, &p) in pids.iter().enumerate() {
            if !gone[i] {
                // SAFETY: reaping a process that was reparented to us (or is not ours any
                // more: -1, and then a probe says whether it still exists).
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

fn a_killed_level4_worker_leaves_no_descendant_alive_even_busy_ones() -> Outcome {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors.
    check!(unsafe { libc::pipe(fds.as_mut_ptr()) } == 0, "pipe");
    // SAFETY: this process is single-threaded here (the runner runs scenarios in order
    // and every earlier worker was closed); the child leaves through `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let (mut top, outer, words) = busy_level4_tree(Duration::from_secs(10)).expect("tree");
            let _run = top.submit(&outer, &TaskArgs::new()).expect("submit");
            words.wait_at_least(0, 2, BOUND).expect("both subs spin");
            let below = descendants_of(std::process::id() as i32);
            let text = format!("{below:?}\n");
            // SAFETY: writing our own buffer to the pipe's write end.
            unsafe { libc::write(fds[1], text.as_ptr().cast(), text.len()) };
            std::thread::sleep(Duration::from_secs(300));
            0
        })
        .unwrap_or(101);
        // SAFETY: leave without running inherited destructors.
        unsafe { libc::_exit(code) }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut buf = vec![0u8; 4096];
    // SAFETY: reading into our own buffer (the child writes one short line, or dies and
    // closes the pipe).
    let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: closing the read end.
    unsafe { libc::close(fds[0]) };
    let text = String::from_utf8_lossy(&buf[..n.max(0) as usize]).to_string();
    let below: Vec<i32> = text
        .trim()
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    kill(pid)?;
    // SAFETY: reaping the process we forked.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    let t0 = Instant::now();
    let survivors = reap_within(&below, Duration::from_secs(1));
    check!(
        below.len() == 6,
        "2 level-3 children, each with a chip and a sub-worker: {text:?}"
    );
    check!(
        survivors.is_empty(),
        "alive 1 s after the level-4 worker was killed: {survivors:?} of {below:?}"
    );
    println!(
        "    6 descendants (2 spinning) gone {:.2?} after the level-4 worker was killed",
        t0.elapsed()
    );
    Ok(())
}

fn a_level3_child_killed_at_close_takes_its_own_children_with_it() -> Outcome {
    let (mut top, outer, words) = busy_level4_tree(Duration::from_millis(200))?;
    let handle = top.submit(&outer, &TaskArgs::new()).ctx("submit")?;
    words.wait_at_least(0, 2, BOUND)?;
    let below = descendants();
    check!(
        below.len() == 6,
        "2 level-3 children, each with a chip and a sub-worker: {below:?}"
    );
    let closed = top.close();
    let t0 = Instant::now();
    let survivors = reap_within(&below, BOUND);
    check!(
        survivors.is_empty(),
        "alive after close killed their level-3 parent: {survivors:?} of {below:?}"
    );
    println!(
        "    the killed level-3 children's chips and spinning subs gone {:.2?} after close returned",
        t0.elapsed()
    );
    match closed {
        Err(DistError::Close(why)) => check!(
            why.contains("child_worker") && why.contains("SIGKILL"),
            "close names the children it had to kill: {why}"
        ),
        other => return Err(format!("expected DistError::Close, got {other:?}")),
    }
    check!(handle.result().is_err(), "the run cannot have succeeded");
    Ok(())
}

fn close_cuts_off_a_stuck_task_after_the_grace_period() -> Outcome {
    let mut cfg = l3_config(ExecMode::Process, 0, 2);
    cfg.close_grace = Duration::from_millis(200);
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let started = w.shared_tensor(&[1], DataType::U64).ctx("flag")?;
    let stuck = w.register_sub("stuck", |call| {
        call.tensor_mut::<u64>(0)?.set(&[0], 1)?;
        std::thread::sleep(Duration::from_secs(300));
        Ok(())
    });
    let sa = started.clone();
    let orch = w.register_orchestration("stuck", move |o, _| {
        o.submit_sub(&stuck, &args(&[sa.arg(ArgTag::OutputExisting)], &[]))?;
        Ok(())
    });
    w.init().ctx("init")?;
    let handle = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    wait_flag(&started)?;
    let t0 = Instant::now();
    let closed = w.close();
    let took = t0.elapsed();
    println!("    close with a stuck task (grace 200 ms): {took:.2?}");
    match closed {
        Err(DistError::Close(why)) => check!(
            why.contains("sub_worker") && why.contains("SIGKILL"),
            "close names the child it had to kill: {why}"
        ),
        other => return Err(format!("expected DistError::Close, got {other:?}")),
    }
    let err = handle
        .result()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    check!(
        err.contains("closed before this task finished"),
        "the run failed: {err:?}"
    );
    Ok(())
}

fn init_refuses_to_fork_while_threads_run_unless_opted_in() -> Outcome {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let bystander = std::thread::spawn(move || rx.recv());
    let mut w = DistWorker::new(l3_config(ExecMode::Process, 0, 1)).ctx("new")?;
    let noop = w.register_sub("noop", |_| Ok(()));
    let orch = w.register_orchestration("noop", move |o, _| {
        o.submit_sub(&noop, &TaskArgs::new())?;
        Ok(())
    });
    let err = match w.init() {
        Ok(()) => return Err("init forked while another thread ran".into()),
        Err(e) => e.to_string(),
    };
    check!(
        err.contains("thread") && err.contains("allow_fork_with_threads"),
        "the error explains the refusal and the opt-in: {err}"
    );
    // Opting in (the bystander holds no lock) works.
    let mut cfg = l3_config(ExecMode::Process, 0, 1);
    cfg.allow_fork_with_threads = true;
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let noop = w.register_sub("noop", |_| Ok(()));
    let orch2 = w.register_orchestration("noop", move |o, _| {
        o.submit_sub(&noop, &TaskArgs::new())?;
        Ok(())
    });
    w.init().ctx("init with opt-in")?;
    w.run(&orch2, &TaskArgs::new()).ctx("run")?;
    w.close().ctx("close")?;
    drop(tx);
    let _ = bystander.join();
    let _ = orch;
    Ok(())
}

/// Whether `pid` names no process any more (it exited and was reaped: a zombie still
/// answers signal 0).
fn reaped(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) != 0 }
}

/// The scheduler thread panics outside a pass (injected through the hidden hook), while
/// the caller still holds a run handle: `close` reports the panic and still shuts down and
/// reaps every child. Before, it returned the error at once and left the children to the
/// loop still seated in the driver, which the run handle kept alive.
fn close_reaps_every_child_after_the_scheduler_thread_panicked() -> Outcome {
    let mut w = l3(ExecMode::Process, 2, 1);
    let noop = w.register_sub("noop", |_| Ok(()));
    let orch = w.register_orchestration("noop", move |o, _| {
        o.submit_sub(&noop, &TaskArgs::new())?;
        Ok(())
    });
    w.init().ctx("init")?;
    let pids = w.child_pids();
    let mut handle = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    handle
        .wait(Some(Duration::from_secs(10)))
        .ctx("the healthy run")?;
    w.inject_scheduler_thread_panic("deliberate scheduler thread panic")
        .ctx("inject")?;
    // The thread is gone once the worker refuses work naming it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match w.submit(&orch, &TaskArgs::new()) {
            Err(DistError::Unusable(why)) => {
                check!(why.contains("scheduler thread panicked"), "{why}");
                break;
            }
            Ok(mut h) => {
                let _ = h.wait(Some(Duration::from_secs(1)));
            }
            Err(e) => return Err(format!("unexpected submit error: {e}")),
        }
        check!(
            Instant::now() < deadline,
            "the scheduler thread never panicked"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let closed = w.close();
    match &closed {
        Err(DistError::Internal(why)) => check!(
            why.contains("deliberate scheduler thread panic"),
            "close names the panic: {why}"
        ),
        other => return Err(format!("expected DistError::Internal, got {other:?}")),
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pids.iter().all(|&p| reaped(p)) {
        check!(
            Instant::now() < deadline,
            "close returned with children not reaped: {:?} of {pids:?}",
            pids.iter().filter(|&&p| !reaped(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(handle);
    Ok(())
}

fn main() {
    become_subreaper();
    let process_only: &[Scenario] = &[
        (
            "close_reaps_every_child_after_the_scheduler_thread_panicked",
            close_reaps_every_child_after_the_scheduler_thread_panicked,
        ),
        (
            "a_sub_child_killed_mid_task_fails_the_run_naming_it",
            a_sub_child_killed_mid_task_fails_the_run_naming_it,
        ),
        (
            "a_chip_child_killed_mid_kernel_fails_the_run_and_close_reaps_everything",
            a_chip_child_killed_mid_kernel_fails_the_run_and_close_reaps_everything,
        ),
        (
            "a_stalled_chip_orchestration_ends_its_process_and_fails_the_run_naming_it",
            a_stalled_chip_orchestration_ends_its_process_and_fails_the_run_naming_it,
        ),
        (
            "a_crashing_sub_child_is_reported",
            a_crashing_sub_child_is_reported,
        ),
        (
            "idle_children_die_when_the_worker_process_is_killed",
            idle_children_die_when_the_worker_process_is_killed,
        ),
        (
            "a_killed_level4_worker_leaves_no_descendant_alive_even_busy_ones",
            a_killed_level4_worker_leaves_no_descendant_alive_even_busy_ones,
        ),
        (
            "a_level3_child_killed_at_close_takes_its_own_children_with_it",
            a_level3_child_killed_at_close_takes_its_own_children_with_it,
        ),
        (
            "close_cuts_off_a_stuck_task_after_the_grace_period",
            close_cuts_off_a_stuck_task_after_the_grace_period,
        ),
        (
            "init_refuses_to_fork_while_threads_run_unless_opted_in",
            init_refuses_to_fork_while_threads_run_unless_opted_in,
        ),
    ];
    run(&[
        contracts::suite::<Process>().as_slice(),
        identity::suite::<Process>().as_slice(),
        process_only,
    ]
    .concat());
}
