//! The host side: what runs on the thread that owns a [`ChipWorker`](crate::ChipWorker).
//!
//! - [`worker`]: the worker's lifecycle (register → init → run → close);
//! - [`args`]: the run arguments ([`RunArgs`](crate::RunArgs)) and the device API's small
//!   types;
//! - [`device_api`]: device memory and resident tensors (alloc, free, copy) between runs;
//! - [`run`]: one run as a pipeline of stages (validate → stage in → dispatch → verdict →
//!   copy back → report) and its [`RunReport`](crate::RunReport);
//! - [`timer`]: the run's clock, which the stages report their boundaries to;
//! - [`task_args`]: the one conversion of a level-independent `TaskArgs` into run
//!   arguments.

pub(crate) mod args;
pub(crate) mod device_api;
pub(crate) mod run;
pub(crate) mod task_args;
pub(crate) mod timer;
pub(crate) mod worker;
