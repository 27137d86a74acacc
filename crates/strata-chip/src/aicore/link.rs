//! The chip's scheduler ↔ core link.
//!
//! Each core has a [`CoreLink`]: a dispatch ring written only by the scheduler (the
//! emulated `DATA_MAIN_BASE` register, generalised to hold a *running* and a *pending*
//! descriptor), a completion ring written only by the core (the `COND` register's FIN), a
//! cancel word, and the core's bell. The scheduler never has more than two descriptors
//! outstanding on a core (running + pending), so neither ring ever fills. Popping a
//! descriptor is the core's ACK (the pending slot is free again); pushing a completion is
//! its FIN.
//!
//! The hand-off primitives themselves (the bounded [`Queue`], the [`ThreadBell`], the
//! spin-then-park policies and their loom models) are strata-sync's.

use crate::aicore::kernels::RunEnv;
use crate::aicore::signal::SignalSlot;
use crate::task::TaskDesc;
use std::sync::{Arc, Mutex};
use strata_sync::sync::{AtomicBool, AtomicU64};
use strata_sync::{Queue, ThreadBell};

/// One (task, block, subtask) handed to a core.
pub(crate) struct Dispatch {
    /// Sequence number of this dispatch on its core (starts at 1).
    pub(crate) seq: u64,
    pub(crate) task_id: u64,
    /// The run epoch (selects the run environment).
    pub(crate) epoch: u64,
    pub(crate) desc: Arc<TaskDesc>,
    pub(crate) block: u32,
    /// Kernel lane: 0 AIC, 1 AIV0, 2 AIV1.
    pub(crate) lane: u8,
    /// The lane's kernel (`func_id` in the run's registry).
    pub(crate) func: u32,
    pub(crate) sub_block_id: u32,
    /// Record start/end times (swimlane).
    pub(crate) timing: bool,
}

/// What the scheduler sends a core.
pub(crate) enum CoreMsg {
    /// Run one (task, block, subtask).
    Run(Dispatch),
    /// Leave the core loop.
    Exit,
}

/// What a core reports for one dispatch.
pub(crate) struct Completion {
    /// The dispatch's sequence number on this core.
    pub(crate) seq: u64,
    /// The task, handed back (moving the `Arc` touches no reference count).
    pub(crate) desc: Arc<TaskDesc>,
    /// `None` on success, else the kernel's error message.
    pub(crate) failure: Option<Box<str>>,
    /// Start and end (ns since the chip's epoch) when timing was requested.
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
}

/// Capacity of a core's dispatch ring: running + pending, plus room for EXIT.
pub(crate) const DISPATCH_RING: usize = 3;
/// Capacity of a core's completion ring.
pub(crate) const COMPLETION_RING: usize = 4;

/// The scheduler ↔ core link of one emulated core.
pub(crate) struct CoreLink {
    pub(crate) dispatch: Queue<CoreMsg>,
    pub(crate) completions: Queue<Completion>,
    pub(crate) bell: ThreadBell,
    /// Sequence number of the dispatch the scheduler asked to stop (0 = none).
    pub(crate) cancel: AtomicU64,
    /// Set when the core thread left its loop.
    pub(crate) exited: AtomicBool,
    /// The current run's environment (the core re-reads it when a dispatch carries a new
    /// epoch).
    pub(crate) env: Mutex<Arc<RunEnv>>,
    /// What the core's kernel waits on, if it is blocked in a signal wait.
    pub(crate) signal: SignalSlot,
}

impl CoreLink {
    /// A link whose core starts in `env` (the chip's environment before its first run;
    /// each run that changes it installs its own).
    pub(crate) fn new(env: Arc<RunEnv>) -> Self {
        CoreLink {
            dispatch: Queue::new(DISPATCH_RING),
            completions: Queue::new(COMPLETION_RING),
            bell: ThreadBell::default(),
            cancel: AtomicU64::new(0),
            exited: AtomicBool::new(false),
            env: Mutex::new(env),
            signal: SignalSlot::default(),
        }
    }
}
