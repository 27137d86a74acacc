//! # strata-graph
//!
//! The graph core shared by every level of strata: dependency inference from tagged
//! tensor accesses (the TensorMap), task slots and their state machine, reference counting,
//! scopes, scoped heap rings with FIFO reclamation, runs, groups, failure poisoning and
//! cancellation. It has no threads of its own and does no I/O: a chip emulator and the host
//! engine each drive it from one orchestrator thread and one scheduler thread.
//!
//! ## Semantics
//! strata guarantees the result of a **sequential execution** in submit order. A read
//! waits for earlier overlapping writes (RAW); a write waits for earlier overlapping
//! writes (WAW) *and* reads (WAR). Overlap is judged on byte ranges and, for regular
//! views, per axis; anything not modellable counts as overlapping (a false edge, never a
//! missed one). [`strata_types::ArgTag::NoDep`] opts out.
//!
//! ## Threads
//! [`graph`] returns two handles. The [`Orchestrator`] builds runs (submits tasks, opens
//! scopes, allocates runtime-owned buffers); it owns the TensorMap, the rings and the
//! scope stack, so submission takes no shared lock. The [`Scheduler`] claims ready tasks
//! and completes them. Both handles are `Send`; use each from one thread at a time.
//!
//! ```
//! use strata_graph::*;
//! use strata_types::{ArgTag, DataType, IdentityMinter, TensorView};
//!
//! let (mut orch, mut sched) = graph::<u32>(GraphConfig::default())?;
//! let m = TensorView::contiguous(DataType::F32, &[2, 64])?;
//! let key = BufferKey::new(IdentityMinter::new().mint(), KeySpace::Host);
//! let row = |r| Access::new(key, Footprint::of_view(&m.slice(0, r, r + 1).unwrap()), ArgTag::InOut);
//! let whole = Access::new(key, Footprint::of_view(&m), ArgTag::Input);
//!
//! let run = orch.begin_run()?;
//! let a = orch.submit(TaskSpec::new(0, &[row(0)]))?;
//! let b = orch.submit(TaskSpec::new(1, &[row(1)]))?; // disjoint rows: independent
//! let c = orch.submit(TaskSpec::new(2, &[whole]))?; // reads both rows: waits for a and b
//! assert!(a.ready && b.ready && !c.ready);
//! orch.close_run()?;
//!
//! let mut ready = Vec::new();
//! for t in [a.task, b.task] {
//!     sched.claim(t).unwrap();
//!     sched.complete(t, Ok(()), &mut ready)?;
//! }
//! assert_eq!(ready.len(), 1);
//! sched.claim(c.task).unwrap();
//! sched.complete(c.task, Ok(()), &mut ready)?;
//! assert_eq!(orch.wait_run(run, None)?, Some(Ok(())));
//! # Ok::<(), GraphError>(())
//! ```

mod access;
mod core;
mod error;
mod event;
mod footprint;
mod free_list;
mod interval;
mod orchestrator;
mod ring;
mod run;
mod scheduler;
mod scope;
mod slot;
mod tensormap;
mod waitfor;

#[cfg(test)]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;

pub use access::{Access, AddressDomain, BufferKey, KeySpace, Placement};
pub use core::ReadyTask;
pub use error::{DeadlockCause, Failure, FailureKind, GraphError, Origin, WorkerClass};
pub use footprint::{Footprint, Overlap};
pub use orchestrator::{graph, GraphConfig, Orchestrator, RunWaiter, Submitted, TaskSpec};
pub use ring::{ring_for_depth, HeapSlab, RingConfig, HEAP_ALIGN, RING_COUNT};
pub use run::{RunId, RunPhase, MAX_PIPELINE_DEPTH};
pub use scheduler::{Claimed, Scheduler};
pub use scope::MAX_SCOPE_DEPTH;
pub use slot::{MemberState, TaskId, TaskRef, TaskState};
pub use waitfor::Unfinished;
