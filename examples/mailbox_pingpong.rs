//! A parent and a forked child talking through a strata mailbox: 10 000 tasks whose
//! arguments the child sums into a shared-memory accumulator, a control command that reads
//! the child's own tally, an orderly shutdown, and a reaped child — checked against the sum
//! the parent computes itself.
//!
//! The process forks before it starts any thread (fork in a threaded process can deadlock
//! the child).
//!
//! strata-mailbox on its own (`strata::mailbox`): the IPC ABI without the engine above it.
//!
//! Run with `cargo run --release --example mailbox_pingpong` (or `cargo xtask sim`). Prints
//! a final line starting with `ok:` and exits non-zero if the child's sum or tally differs
//! from the parent's, or the child does not exit cleanly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use strata::mailbox::*;
use strata::types::{CallableId, TaskArgs};

const ROUNDS: u64 = 10_000;
const TALLY: u64 = 1;

/// The child: adds each task's scalars into word 0 of a shared region, counts tasks.
struct Summer {
    shared: SharedRegion,
    tasks: u64,
}

impl Summer {
    fn accumulator(&self) -> &AtomicU64 {
        // SAFETY: the region is at least 8 bytes, page-aligned, mapped for the life of
        // `self`, and only ever accessed atomically by both processes.
        unsafe { &*(self.shared.as_ptr() as *const AtomicU64) }
    }
}

impl Handler for Summer {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        let sum: u64 = req.args.scalars().iter().sum();
        self.accumulator().fetch_add(sum, Ordering::Relaxed);
        self.tasks += 1;
        Ok(())
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
        match req.command {
            TALLY => Ok(ControlReply::new(self.tasks)),
            c => Err(FailureReport::new(
                codes::UNSUPPORTED,
                format!("no command {c}"),
            )),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mailbox = Mailbox::create()?;
    let shared = SharedRegion::anonymous(4096)?;
    let child_side = mailbox.try_clone()?;
    let child_shared = shared.try_clone()?;
    let parent_pid = std::process::id();

    // SAFETY: the process is single-threaded here; the child only serves its mailbox and
    // leaves through `_exit`, never returning into the parent's stack frames.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if pid == 0 {
        let mut child = Child::with_parent(child_side, parent_pid);
        let code = match child.init_ready(0).and_then(|()| {
            child.serve(&mut Summer {
                shared: child_shared,
                tasks: 0,
            })
        }) {
            Ok(_) => 0,
            Err(_) => 1,
        };
        // SAFETY: `_exit` ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }

    let mut liveness = ChildProcess::new(pid);
    let mut parent = Parent::new(mailbox);
    let wait = WaitOptions::default();
    parent.wait_init(&wait, &mut liveness)?;

    let config = EncodedConfig::default();
    let started = Instant::now();
    let mut expected = 0u64;
    for round in 1..=ROUNDS {
        let args = TaskArgs::new().scalar(round).scalar(round * 3);
        expected += round * 4;
        let blob = encode_args_blob(&args)?;
        let slot = if round % 2 == 0 {
            TaskSlot::Slot0
        } else {
            TaskSlot::Slot1
        };
        let identity = FrameIdentity {
            run_id: 1,
            lease_slot: slot as u32,
            lease_generation: 1,
            dispatch_id: round,
        };
        let task = TaskPublication::run(CallableId([1; 32]), identity, &config, &blob);
        let done = parent.run_task(slot, &task, &wait, &mut liveness)?;
        done.outcome
            .map_err(|f| format!("task {round} failed: {f}"))?;
    }
    let per_task = started.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64;

    let tally = parent.control(
        &ControlRequest {
            command: TALLY,
            arg0: 0,
            payload: &[],
        },
        &wait,
        &mut liveness,
    )?;
    // SAFETY: as in the child: 8 aligned bytes of a live mapping, accessed atomically.
    let sum = unsafe { &*(shared.as_ptr() as *const AtomicU64) }.load(Ordering::Relaxed);

    parent.request_shutdown();
    let exit = loop {
        if let Some(exit) = liveness.try_wait()? {
            break exit;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    if sum != expected || tally.result != ROUNDS || exit != ChildExit::Exited(0) {
        return Err(format!(
            "sum {sum} (expected {expected}), tally {} (expected {ROUNDS}), child {exit:?}",
            tally.result
        )
        .into());
    }
    println!("ok: {ROUNDS} tasks through a mailbox to a forked child, {per_task:.2} µs per round trip, child exited cleanly");
    Ok(())
}
