//! The emulated AICores: what runs on a core thread and what it shares with the
//! scheduler.
//!
//! - [`core_loop`]: the core thread (pop a dispatch, run its kernel, push the completion;
//!   spin, yield, park when idle);
//! - [`link`]: the scheduler ↔ core link (dispatch and completion rings, cancel word, bell)
//!   and the messages on it;
//! - [`signal`]: each core's signal-wait slot, where a kernel blocked in a signal wait
//!   says what it waits on (for stall snapshots);
//! - [`kernel`]: what a kernel sees ([`KernelCtx`](crate::KernelCtx)) and the kernel type;
//! - [`kernels`]: the kernel table (by `func_id` and digest) and the run environment the
//!   cores run kernels in.

pub(crate) mod core_loop;
pub(crate) mod kernel;
pub(crate) mod kernels;
pub(crate) mod link;
pub(crate) mod signal;
