//! # strata-dist
//!
//! The L3+ engine: a [`DistWorker`] runs host orchestrations that submit chip
//! orchestrations to chip children and closures to host sub-worker children, with
//! dependencies inferred by strata-graph from how the tasks tag their tensors. Every child
//! is a forked process (or a thread, [`strata_host::ExecMode::Threads`]) reached through a
//! shared-memory mailbox; tensors the children read or write live in shared memory
//! ([`strata_host::SharedTensor`]) and travel zero-copy.
//!
//! The engine is the same at every level from L3 up: a level-4 worker's next-level
//! children are level-3 workers ([`DistWorker::add_worker`]), each forked with its own
//! children.
//!
//! - The orchestration runs on the caller's thread ([`DistWorker::submit`]), against the
//!   graph's orchestrator; at most two runs are in flight.
//! - One scheduler thread routes ready tasks into FIFOs — one per next-level worker id, one
//!   for groups (whose head reserves its targets), one shared by the sub-workers — and
//!   dispatches them through the children's mailboxes; completions ready or poison their
//!   consumers; a run reports its first error.
//! - A child that dies fails its running task with an error naming it, poisons what
//!   depends on it, and makes the worker refuse new runs instead of hanging.
//!
//! - The scheduler reaches each child through an [`Endpoint`] (today a local mailbox lane;
//!   the seam a remote level-3 worker plugs into); device-memory control travels as a
//!   typed [`ControlCommand`].
//!
//! See `docs/dist.md` for the process tree, the lane state machine and the failure model.

mod chip_child;
mod comm;
mod config;
mod control;
mod ctx;
mod endpoint;
mod error;
mod orch;
mod registry;
mod sched;
mod task;
mod tensor;
mod worker;

pub use comm::WindowTensor;
pub use config::{
    DistConfig, Level, WindowLifetime, DEFAULT_CONTROL_TIMEOUT, DEFAULT_STAGING_BYTES,
    DEFAULT_TASK_TIMEOUT,
};
pub use control::{ControlCommand, ControlDecodeError, CopyDirection, COPY_PAYLOAD_BYTES};
pub use ctx::CopyPath;
pub use endpoint::{
    ChildKind, Endpoint, EndpointError, NodeContext, RemoteChild, RemoteContext, TaskOutcome,
};
pub use error::DistError;
pub use orch::Orch;
pub use registry::{HostOrchFn, HostOrchHandle, NextLevelCallable, SubHandle};
pub use strata_chip::DeviceTensor;
pub use strata_comm::{AllreduceAlgo, CommStats, Domain, ReduceOp, WindowBuffer};
pub use tensor::RunTensor;
pub use worker::{DistWorker, RunHandle};

/// Entry points for the fuzz harness (`fuzz/`): the exact code a child runs on bytes its
/// parent wrote. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::chip_child::serve_chip_control;
}
