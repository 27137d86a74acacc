//! # strata-comm
//!
//! Distributed memory for strata's emulated chips (DESIGN.md §7, the reference's symmetric
//! memory + signal model): window buffers that exist on every rank of a comm domain at the
//! same layout, signals (notify / wait) with release/acquire ordering and spin-then-park
//! waiting, one-sided put / get and tile load / store, and collectives composed from them.
//!
//! * [`CommArena`] — the one `MAP_SHARED` arena per L3 worker (header with per-rank wake
//!   counters, a domain table, window data; byte map in [`layout`] and `docs/comm.md`).
//!   Every rank process maps it; only offsets are meaningful across processes.
//! * [`CommAllocator`] — the parent side: [`Domain`]s over world ranks, zero-filled
//!   [`WindowBuffer`]s (each with its own signal area, [`signal_area_bytes`]), typed
//!   [`DistributedTensor`] views, per-run lifetime and persistence.
//! * [`RankContext`] — what a chip child installs (`ChipWorker::set_comm_context`, with
//!   the arena attached as the chip's external memory); [`KernelWindows`] —
//!   `ctx.window(i)`, a kernel's window argument opened as a [`Window`]: [`Window::read`]
//!   / [`Window::write`] (get / put), [`Window::load_tile`] / [`Window::store_tile`]
//!   (remote load / store, optionally atomic add), [`Window::notify`] / [`Window::wait`],
//!   and the collectives, one calling convention for all — a method of the window they
//!   work on: [`Window::allreduce`]`(op, algo)`, [`Window::broadcast`]`(root)`,
//!   [`Window::reduce_scatter`]`(op)`, `stage.`[`allgather`](Window::allgather)`(&target)`,
//!   `stage.`[`all_to_all`](Window::all_to_all)`(&target)`, [`Window::barrier`]`()`.
//!   [`Comm`] opens [`DistributedTensor`]s directly (host threads playing ranks, tests).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use strata_comm::*;
//! use strata_types::DataType;
//!
//! // Parent: the arena, a window buffer on both ranks, a view of it.
//! let arena = Arc::new(CommArena::anonymous(1 << 20, 2)?);
//! let mut alloc = CommAllocator::new(arena.clone());
//! let world = alloc.world()?;
//! let buf = alloc.alloc_window_buffer(&world, 64)?;
//! let data = alloc.window(&buf, 0, &[1, 3], DataType::F32)?;
//! alloc.host_write(&data, 0, 0, &[1.0f32, 2.0, 3.0])?;
//! alloc.host_write(&data, 1, 0, &[10.0f32, 20.0, 30.0])?;
//!
//! // Ranks (threads here; chip child processes under L3): the same tensor on each.
//! std::thread::scope(|s| {
//!     let ranks: Vec<_> = (0..2)
//!         .map(|rank| {
//!             let ctx = RankContext::new(arena.clone(), rank, Duration::from_secs(10));
//!             s.spawn(move || -> Result<(), CommError> {
//!                 let d = Comm::from_rank(&ctx).window(&data)?;
//!                 d.allreduce(ReduceOp::Sum, AllreduceAlgo::Mesh)
//!             })
//!         })
//!         .collect();
//!     ranks.into_iter().try_for_each(|r| r.join().unwrap())
//! })?;
//! let mut out = [0f32; 3];
//! alloc.host_read(&data, 1, 0, &mut out)?;
//! assert_eq!(out, [11.0, 22.0, 33.0]);
//! # Ok::<(), CommError>(())
//! ```
//!
//! The notify/wait hand-off and the credit barrier are model-checked with loom:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p strata-comm --lib loom`.

#![cfg_attr(loom, allow(dead_code, unused_imports))]

mod signal;

#[cfg(not(loom))]
mod alloc;
#[cfg(not(loom))]
mod arena;
#[cfg(not(loom))]
mod collective;
#[cfg(not(loom))]
mod comm;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
mod reduce;
#[cfg(not(loom))]
mod tensor;

#[cfg(all(test, loom))]
mod loom_tests;

pub use signal::{NotifyOp, WaitCmp};

#[cfg(not(loom))]
pub use alloc::{BufferPlacement, CommAllocator, CommStats, Domain, RankCopy, WindowBuffer};
#[cfg(not(loom))]
pub use arena::{layout, CommArena};
#[cfg(not(loom))]
pub use collective::{
    signal_area_bytes, AllreduceAlgo, AUTO_MESH_MAX_BYTES, SMALL_ALLREDUCE_BYTES,
};
#[cfg(not(loom))]
pub use comm::{Comm, KernelWindows, RankContext, StoreOp, Window};
#[cfg(not(loom))]
pub use error::CommError;
#[cfg(not(loom))]
pub use reduce::ReduceOp;
#[cfg(not(loom))]
pub use tensor::{DistributedTensor, MAX_DIMS};

/// Most ranks a world (and a domain) may have.
pub const MAX_RANKS: usize = 64;

/// What a distributed kernel uses: `ctx.window(i)` ([`KernelWindows`]), the collectives'
/// options and the signal operations. `use strata_comm::prelude::*;`
#[cfg(not(loom))]
pub mod prelude {
    pub use crate::{AllreduceAlgo, KernelWindows, NotifyOp, ReduceOp, StoreOp, WaitCmp, Window};
}
