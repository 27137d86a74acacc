//! A chip whose orchestrations run on the caller's thread (`OrchestratorPlacement::Caller`)
//! ends its process when an orchestration stalls — the watchdog's exit status, within a
//! bound — but not while a long run makes progress block by block. The chip runs in a
//! forked child (the stall ends that process), so this binary has no test harness and is
//! single-threaded when it forks.

use std::time::{Duration, Instant};
use strata_chip::{
    ChipConfig, ChipWorker, CoreArgs, OrchestratorPlacement, RunArgs, EXIT_ORCHESTRATION_STALLED,
};
use strata_types::CallConfig;

/// The child: a chip whose first run is healthy but longer than the stall budget (a task
/// of 96 blocks of 40 ms on 2 cores, ≈ 1.9 s, against 1.2 s), reported by one byte on
/// `done`; then an orchestration that spins forever. Returns (exit status) only on a
/// failure: 2..6 before the stall, 7 if the stalled run returned.
fn child(done: i32) -> i32 {
    let t100 = Duration::from_millis(100);
    let cfg = ChipConfig {
        orchestrator: OrchestratorPlacement::Caller,
        device_memory_bytes: 1 << 30,
        kernel_timeout: t100,
        tensor_wait_timeout: t100,
        ring_wait_timeout: t100,
        ..ChipConfig::default()
    };
    let Ok(mut chip) = ChipWorker::new(cfg) else {
        return 2;
    };
    let Ok(k) = chip.register_kernel_fn("slow_block", |_| {
        std::thread::sleep(Duration::from_millis(40));
        Ok(())
    }) else {
        return 3;
    };
    let Ok(long) = chip.register_orchestration_fn("long", move |o, _| {
        o.submit_aiv(k, CoreArgs::new().block_num(96))?;
        Ok(())
    }) else {
        return 3;
    };
    let Ok(spins) = chip.register_orchestration_fn("spins", |_, _| loop {
        std::thread::sleep(Duration::from_millis(5));
    }) else {
        return 4;
    };
    if chip.init().is_err() {
        return 5;
    }
    if let Err(e) = chip.run(&long, &mut RunArgs::new(), &CallConfig::default()) {
        eprintln!("the long run failed: {e}");
        return 6;
    }
    // SAFETY: `done` is the write end of a pipe this process owns; one byte from a local.
    unsafe { libc::write(done, [1u8].as_ptr().cast(), 1) };
    // Budget: 2 × 100 ms + 1 s. The watchdog ends the process; returning is a failure.
    let _ = chip.run(&spins, &mut RunArgs::new(), &CallConfig::default());
    7
}

fn main() {
    if cfg!(loom) {
        // Under `--cfg loom` the chip's atomics are loom's, which work only inside a loom
        // model; this binary has none (a `harness = false` binary ignores the filter).
        return;
    }
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid two-element array for pipe(2).
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe failed");
    // SAFETY: this process is single-threaded here (no test harness, nothing spawned yet),
    // so the child may run arbitrary code after fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = child(fds[1]);
        // SAFETY: leave the forked child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: the parent's copy of the write end; closing it lets the read see EOF.
    unsafe { libc::close(fds[1]) };
    let t0 = Instant::now();
    let mut status = 0;
    let deadline = t0 + Duration::from_secs(30);
    loop {
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid failed");
        if r == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: `pid` is our child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the stalled chip process did not end within 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = t0.elapsed();
    let mut byte = [0u8; 1];
    // SAFETY: the read end of our pipe; the child has exited, so this returns at once.
    let got = unsafe { libc::read(fds[0], byte.as_mut_ptr().cast(), 1) };
    assert_eq!(
        got, 1,
        "the long but healthy run must finish before the stall (the watchdog fired early?)"
    );
    assert!(
        libc::WIFEXITED(status),
        "the chip process should exit, not be killed (status {status:#x})"
    );
    let code = libc::WEXITSTATUS(status);
    assert_eq!(
        code, EXIT_ORCHESTRATION_STALLED,
        "exit status (2..6: the child failed before the stall; 7: the stalled run returned)"
    );
    println!(
        "test a_long_run_passes_and_a_stalled_caller_orchestration_ends_its_process ... ok (exit {code} after {took:.2?})"
    );
}
