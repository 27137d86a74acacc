//! The stall watchdog of a chip whose orchestrations run on the caller's thread
//! ([`OrchestratorPlacement::Caller`](crate::OrchestratorPlacement::Caller)).
//!
//! With its own orchestrator thread, a chip's `run` waits for the reply and gives up on an
//! orchestration that stopped making progress (the chip becomes unusable, `run`
//! returns). When the caller runs the orchestration itself nobody is left to give up, so
//! this thread watches instead: while a run is in flight it samples the orchestration's
//! heartbeat and the scheduler's progress every [`TICK`], and once neither moved for the
//! run's budget (counted in ticks it saw) it ends the process, the only way to stop a thread that does not return.
//! The parent that watches the process reports its end.

use crate::aicpu::sched::SchedShared;
use crate::config::EXIT_ORCHESTRATION_STALLED;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the watchdog looks (a budget is at least a second).
const TICK: Duration = Duration::from_millis(100);

/// What the caller of `run` tells the watchdog.
#[derive(Debug, Default)]
pub(crate) struct StallWatch {
    /// The run in flight (0: none).
    run: AtomicU64,
    /// Its budget, in milliseconds.
    budget_ms: AtomicU64,
    stop: AtomicBool,
}

impl StallWatch {
    /// A run starts on the caller's thread; the watch ends when the guard drops (also if
    /// the run unwinds).
    pub(crate) fn begin(&self, run: u64, budget: Duration) -> Armed<'_> {
        self.budget_ms
            .store(budget.as_millis() as u64, Ordering::Relaxed);
        self.run.store(run, Ordering::Release);
        Armed(self)
    }
}

/// A run being watched; dropping it ends the watch.
pub(crate) struct Armed<'a>(&'a StallWatch);

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.0.run.store(0, Ordering::Release);
    }
}

/// The watchdog thread, and how to stop it.
pub(crate) struct Watchdog {
    pub(crate) watch: Arc<StallWatch>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    pub(crate) fn spawn(
        chip_id: u32,
        heartbeat: Arc<AtomicU64>,
        shared: Arc<SchedShared>,
    ) -> std::io::Result<Watchdog> {
        let watch = Arc::new(StallWatch::default());
        let w = watch.clone();
        let thread = std::thread::Builder::new()
            .name(format!("chip{chip_id}-watch"))
            .spawn(move || watch_main(chip_id, &w, &heartbeat, &shared))?;
        Ok(Watchdog {
            watch,
            thread: Some(thread),
        })
    }

    /// Stops and joins the thread.
    pub(crate) fn stop(&mut self) {
        self.watch.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

fn watch_main(chip_id: u32, watch: &StallWatch, heartbeat: &AtomicU64, shared: &SchedShared) {
    // (run, heartbeat, scheduler progress) as last seen, and for how many ticks in a row
    // it stayed so. Ticks, not wall time: a watchdog that was not scheduled (a stopped or
    // starved process) saw nothing, so that time does not count against the run.
    let mut last = (0, 0, 0);
    let mut still = 0u64;
    while !watch.stop.load(Ordering::Acquire) {
        std::thread::park_timeout(TICK);
        let run = watch.run.load(Ordering::Acquire);
        if run == 0 {
            still = 0;
            continue;
        }
        let now = (
            run,
            heartbeat.load(Ordering::Relaxed),
            shared.progress_mark(),
        );
        if now != last {
            last = now;
            still = 0;
            continue;
        }
        still += 1;
        let budget = Duration::from_millis(watch.budget_ms.load(Ordering::Relaxed));
        if TICK * still as u32 >= budget && watch.run.load(Ordering::Acquire) == run {
            stalled(chip_id, budget);
        }
    }
}

fn stalled(chip_id: u32, budget: Duration) -> ! {
    eprintln!(
        "strata-chip: chip {chip_id}: the orchestration made no progress for {} ms (SCHEDULER_TIMEOUT, orchestrator-starvation); it runs on the thread that called run (OrchestratorPlacement::Caller), which cannot abandon it, so this process ends with status {EXIT_ORCHESTRATION_STALLED}",
        budget.as_millis()
    );
    // SAFETY: `_exit` ends the process at once without running destructors or atexit
    // handlers, which is what is wanted while another thread is stuck mid-orchestration.
    unsafe { libc::_exit(EXIT_ORCHESTRATION_STALLED) }
}
