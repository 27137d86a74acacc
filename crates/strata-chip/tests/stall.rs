//! A chip whose orchestrations run on the caller's thread (`OrchestratorPlacement::Caller`)
//! ends its process when an orchestration stalls: the watchdog's exit status, within a
//! bound, and nothing left running. The chip runs in a forked child (the stall ends that
//! process), so this binary has no test harness and is single-threaded when it forks.

use std::time::{Duration, Instant};
use strata_chip::{
    ChipConfig, ChipWorker, OrchestratorPlacement, RunArgs, EXIT_ORCHESTRATION_STALLED,
};
use strata_types::CallConfig;

/// The child: a chip whose orchestration first submits nothing and returns (one good
/// run), then spins forever.
fn child() -> i32 {
    let cfg = ChipConfig {
        orchestrator: OrchestratorPlacement::Caller,
        device_memory_bytes: 1 << 30,
        tensor_wait_timeout: Duration::from_millis(50),
        ring_wait_timeout: Duration::from_millis(50),
        ..ChipConfig::default()
    };
    let Ok(mut chip) = ChipWorker::new(cfg) else {
        return 2;
    };
    let Ok(fine) = chip.register_orchestration_fn("fine", |_, _| Ok(())) else {
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
    let c = CallConfig {
        timeout_ms: 50,
        ..CallConfig::default()
    };
    if let Err(e) = chip.run(&fine, &mut RunArgs::new(), &c) {
        eprintln!("the first run failed: {e}");
        return 6;
    }
    // Budget: 2 × 50 ms + 1 s. The watchdog ends the process; returning is a failure.
    let _ = chip.run(&spins, &mut RunArgs::new(), &c);
    7
}

fn main() {
    // SAFETY: this process is single-threaded here (no test harness, nothing spawned yet),
    // so the child may run arbitrary code after fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = child();
        // SAFETY: leave the forked child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
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
    assert!(
        libc::WIFEXITED(status),
        "the chip process should exit, not be killed (status {status:#x})"
    );
    let code = libc::WEXITSTATUS(status);
    assert_eq!(
        code, EXIT_ORCHESTRATION_STALLED,
        "exit status (2..7: the child failed before the stall; 7: run returned)"
    );
    println!(
        "test a_stalled_caller_orchestration_ends_its_process ... ok (exit {code} after {took:.2?})"
    );
}
