//! The run's clock: the host stages of a run report their boundaries here, and the device
//! phases come from the orchestrator's reply and the scheduler's report. Nothing else in a
//! run reads the clock, and nothing here computes a duration: the raw timestamps become
//! `[STRACE]` spans only when someone asks for them ([`RunTiming::spans`]).

use crate::aicpu::orch::OrchReply;
use crate::aicpu::sched::SchedReport;
use crate::trace::strace::{mono_ns, next_invocation, thread_id, RunTiming};
use strata_types::CallableId;

/// A boundary between two host stages of a run, in the order a run passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mark {
    /// Validation is over; binding (ring heaps, then argument staging) starts.
    StageIn,
    /// The ring heap regions are in place; the arguments are staged next.
    RingsReady,
    /// The arguments are in device memory; the request goes to the orchestrator.
    Staged,
    /// The orchestrator's reply (and the scheduler's report) are in.
    Replied,
    /// The verdict is known and `OUT`/`INOUT` tensors are copied back.
    CopiedBack,
    /// The report is complete (the end of `chip.run`).
    Done,
}

/// Records one run's timing as raw timestamps.
pub(super) struct RunTimer {
    timing: RunTiming,
}

impl RunTimer {
    /// Starts the clock of a run (the start of `chip.run`).
    #[inline]
    pub(super) fn start() -> Self {
        RunTimer {
            timing: RunTiming {
                t0: mono_ns(),
                ..RunTiming::default()
            },
        }
    }

    /// Names the run once it passed validation: its process, thread, invocation number and
    /// orchestration (a run refused by validation uses no invocation number), and whether
    /// its device-domain spans are recorded.
    #[inline]
    pub(super) fn identify(&mut self, pid: u32, orch: &CallableId, device: bool) {
        self.timing.pid = pid;
        self.timing.device = device;
        self.timing.tid = thread_id();
        self.timing.inv = next_invocation();
        self.timing.hid.copy_from_slice(&orch.as_bytes()[..8]);
    }

    /// A stage boundary was reached now.
    #[inline]
    pub(super) fn mark(&mut self, m: Mark) {
        let now = mono_ns();
        let t = &mut self.timing;
        match m {
            Mark::StageIn => t.bind = now,
            Mark::RingsReady => t.prebuilt = now,
            Mark::Staged => t.bind_end = now,
            Mark::Replied => t.runner_end = now,
            Mark::CopiedBack => t.end = now,
            Mark::Done => t.done = now,
        }
    }

    /// The device phases, as the orchestrator and the scheduler stamped them.
    #[inline]
    pub(super) fn device(&mut self, reply: &OrchReply, sched: &SchedReport) {
        let t = &mut self.timing;
        t.origin = reply.t_thread_start;
        t.orch_start = reply.t_orch_start;
        t.orch_end = reply.t_orch_end;
        t.dev_end = reply.t_done.max(sched.last_ns);
        t.sched = (sched.dispatches > 0).then_some((sched.first_ns, sched.last_ns));
    }

    /// What was recorded so far.
    pub(super) fn timing(&self) -> &RunTiming {
        &self.timing
    }

    /// The finished record.
    pub(super) fn finish(self) -> RunTiming {
        self.timing
    }
}
