//! The host side: what runs on the thread that owns a [`ChipWorker`](crate::ChipWorker).
//!
//! - [`worker`]: the worker's lifecycle (register → init → run → close) and the run;
//! - [`task_args`]: the one conversion of a level-independent `TaskArgs` into run
//!   arguments.

pub(crate) mod task_args;
pub(crate) mod worker;
