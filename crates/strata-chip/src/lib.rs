//! # strata-chip
//!
//! The L2 chip emulator: one accelerator with private device memory, registered kernels
//! and chip orchestrations, an emulated AICPU (an orchestrator thread running the
//! orchestration against strata-graph, and a scheduler thread), and N emulated AICores
//! (one thread each) fed through single-producer dispatch rings.
//!
//! ```text
//!  host thread           orchestrator thread        scheduler thread          core threads
//!  ChipWorker::run ──req──► ChipOrch (graph   ──ready──► Sched (graph    ──dispatch──► AIC/AIV
//!   stage args             Orchestrator)      queue      Scheduler)        ring (2)    kernels
//!   ◄──reply── wait_run ◄────────────────── complete ◄─────────────────── completion ring
//! ```
//!
//! - [`ChipWorker`]: lifecycle (`new` → register → `init` → `run`s → `close`), device
//!   memory (`malloc`, `free`, `copy_to`, `copy_from`, `alloc_tensor`, ...), runs.
//! - [`ChipOrch`]: the chip orchestration API (submit AIC / AIV / MIX / dependency-only
//!   tasks, SPMD blocks, scopes, runtime-created tensors, tensor data access, fatal).
//! - [`KernelCtx`]: what a kernel sees (typed tensor views, scalars, block index).
//! - [`parse_strace`] / [`span_tree`]: the `[STRACE]` timing spans of a run;
//!   [`Swimlane`]: per-core task records as Chrome trace JSON.
//!
//! Dependencies between tasks come from strata-graph: the result is that of a sequential
//! execution in submit order (read-after-write, write-after-read, write-after-write).
//! Errors are typed ([`ChipError`]) and carry the reference runtime's fatal codes
//! ([`codes`]).
//!
//! See `docs/chip.md` for the threads, rings and the core handshake.

mod aicore;
mod aicpu;
mod config;
mod device;
mod error;
mod host;
mod task;
mod trace;

pub use aicore::kernel::{ExternalArg, KernelCtx, KernelFn};
pub use aicore::kernels::{KernelHandle, KernelRef, MAX_KERNELS};
pub use aicore::signal::SignalNote;
pub use aicpu::orch::{ChipArgs, ChipOrch, OrchestrationFn};
pub use aicpu::registry::{OrchHandle, Registry, MAX_ORCHESTRATIONS};
pub use aicpu::tensor::{
    ChipTaskId, ChipTensor, CoreArgs, MixedKernels, TaskOutputs, TensorCreateInfo,
};
pub use config::{
    ChipConfig, CoreType, OrchestratorPlacement, RingSizing, DEFAULT_RING_HEAP_BYTES,
    EXIT_ORCHESTRATION_STALLED, MAX_AIC_CORES, MAX_AIV_CORES, MAX_DEVICE_MEMORY_BYTES,
    REFERENCE_DEP_POOL, REFERENCE_RING_HEAP_BYTES, REFERENCE_TASK_WINDOW,
};
pub use device::arena::{AtomicView, ExternalMemory, EXTERNAL_BASE};
pub use device::memory::{DevicePtr, DeviceTensor, DEVICE_ALIGN};
pub use error::{codes, ChipError, KernelError};
pub use host::args::{CopyOffsets, RunArgs, TensorInit};
pub use host::run::RunReport;
pub use host::task_args::TaskArgsError;
pub use host::worker::ChipWorker;
pub use trace::strace::{parse_strace, span_tree, Span, SpanTree};
pub use trace::swimlane::{SwimRecord, Swimlane};
