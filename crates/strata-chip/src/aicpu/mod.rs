//! The emulated AICPU: the orchestrator and the scheduler.
//!
//! - [`orch`]: the chip orchestration API ([`ChipOrch`](crate::ChipOrch)) and the
//!   orchestrator thread's loop;
//! - [`tensor`]: the tensors and task arguments an orchestration submits;
//! - [`registry`]: the callables an orchestration is looked up in (kernels and chip
//!   orchestrations by digest);
//! - [`sched`]: the scheduler loop (placement on cores, completions, kernel timeouts and
//!   the cores' health), driven by its thread or by the waiting orchestrator;
//! - [`stall`]: the watchdog of an orchestration that runs on the caller's thread.

pub(crate) mod orch;
pub(crate) mod registry;
pub(crate) mod sched;
pub(crate) mod stall;
pub(crate) mod tensor;
