//! [`CommError`]: every way strata-comm can refuse or fail, each saying what and how to fix.

use crate::signal::WaitCmp;
use std::time::Duration;
use strata_types::DataType;

/// The error type of strata-comm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// The arena's memory is not a valid comm arena (too small, misaligned, wrong magic or
    /// version, inconsistent header).
    #[error("bad comm arena: {reason}")]
    BadArena {
        /// What was wrong and what to do.
        reason: String,
    },

    /// An operating-system call failed (mapping the anonymous arena).
    #[error("{op} failed: {source}")]
    Os {
        /// The call.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },

    /// A domain's member list is invalid.
    #[error("invalid comm domain members {members:?}: {reason}")]
    BadMembers {
        /// The members given.
        members: Vec<u32>,
        /// What is wrong with them.
        reason: String,
    },

    /// A [`crate::Domain`] handle that no longer names a live domain.
    #[error("stale comm domain (slot {slot}, generation {generation}): it was freed by end_run (or release_persistent); create domains in each run, or keep one alive with make_persistent on one of its buffers")]
    StaleDomain {
        /// The handle's slot.
        slot: u32,
        /// The handle's generation.
        generation: u32,
    },

    /// A [`crate::WindowBuffer`] or [`crate::DistributedTensor`] whose window buffer was freed
    /// (its domain-table slot was reused or cleared).
    #[error("stale distributed tensor or window buffer (table slot {slot}, generation {generation}, the slot now holds generation {current}): its window buffer was freed by end_run; allocate window buffers in each run, or make them persistent")]
    StaleTensor {
        /// The table slot.
        slot: u32,
        /// The generation the handle carries.
        generation: u32,
        /// The generation the slot holds now (0 = free).
        current: u32,
    },

    /// All domain-table slots hold live window buffers.
    #[error("the comm domain table is full: {slots} window buffers are live; free some (end_run, release_persistent) or allocate fewer, larger buffers and carve several windows from each")]
    TableFull {
        /// Number of slots.
        slots: usize,
    },

    /// The arena has no free range large enough.
    #[error("comm arena full: {requested} bytes requested ({per_rank} per rank x {nranks} ranks, 4 KiB-aligned), {in_use} of {capacity} data bytes in use, largest free range {largest_free}; create the L3 worker with a larger comm arena, or free windows (end_run, release_persistent)")]
    ArenaFull {
        /// Bytes needed for all ranks' slices.
        requested: u64,
        /// Bytes per rank (rounded to 64).
        per_rank: u64,
        /// Ranks of the domain.
        nranks: u32,
        /// Bytes held by live buffers.
        in_use: u64,
        /// Bytes of the data region.
        capacity: u64,
        /// Largest free range.
        largest_free: u64,
    },

    /// A tensor description that is not valid (shape, offset, alignment, encoding).
    #[error("bad distributed tensor: {reason}")]
    BadTensor {
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// The calling rank is not a member of the tensor's domain.
    #[error("world rank {world_rank} is not a member of the domain of this window (members {members:?}); only members may open it — dispatch the kernel to the domain's ranks only")]
    NotAMember {
        /// The caller's world rank.
        world_rank: u32,
        /// The domain's members (world ranks in domain-rank order).
        members: Vec<u32>,
    },

    /// A kernel asked for the comm context but its chip has none.
    #[error("this kernel's chip has no comm context: distributed kernels run on the chip children of an L3 worker with comm windows (ChipWorker::set_comm_context with a strata_comm::RankContext)")]
    NoCommContext,

    /// A peer (domain) rank outside `0..nranks`.
    #[error("peer {peer} is not a rank of this domain (it has {nranks} ranks, 0..{nranks})")]
    BadPeer {
        /// The peer given.
        peer: u32,
        /// Ranks in the domain.
        nranks: u32,
    },

    /// The Rust element type (or a second tensor's dtype) does not match the tensor's dtype.
    #[error("{what}: the tensor holds {expected} elements, not {got}")]
    DtypeMismatch {
        /// The operation.
        what: String,
        /// The tensor's dtype.
        expected: DataType,
        /// The dtype used.
        got: DataType,
    },

    /// An operation that does not support this dtype.
    #[error("{what} does not support {dtype} (supported: {supported})")]
    UnsupportedDtype {
        /// The operation.
        what: &'static str,
        /// The dtype given.
        dtype: DataType,
        /// The supported dtypes.
        supported: &'static str,
    },

    /// An element range, tile or cell outside the tensor, or arguments of the wrong length.
    #[error("{what}")]
    OutOfRange {
        /// What was out of range, with the bounds.
        what: String,
    },

    /// Any other invalid argument.
    #[error("{what}")]
    BadArgument {
        /// What was wrong and how to fix it.
        what: String,
    },

    /// A kernel's tensor argument that `ctx.window(i)` cannot open as this rank's window.
    #[error("tensor argument {index} is not this rank's copy of a window: {reason}")]
    NotAWindow {
        /// The argument's index.
        index: usize,
        /// What it is instead, and what to pass.
        reason: String,
    },

    /// A wait reached its deadline.
    #[error("world rank {rank} (domain rank {domain_rank}) waited {waited:?} for signal cell {cell:?} {cmp} {expected} ({what}) but saw {seen}: the rank that should notify it never did — it may have died, failed, or called a different collective or signal; raise the RankContext wait timeout only if it is merely slow")]
    WaitTimeout {
        /// The world rank that waited.
        rank: u32,
        /// Its domain rank.
        domain_rank: u32,
        /// The cell (offsets, one per dim of the signal tensor).
        cell: Vec<u64>,
        /// The value waited for.
        expected: i32,
        /// The comparison.
        cmp: WaitCmp,
        /// The last value seen.
        seen: i32,
        /// How long it waited.
        waited: Duration,
        /// What the wait was for (`"wait"`, `"barrier row of domain rank 1"`, ...).
        what: String,
    },

    /// Ranks called a collective with different arguments (shape, op, dtype, algorithm,
    /// root, windows), detected before any data moved.
    #[error("collective mismatch in {collective}: domain rank {domain_rank} (world rank {rank}) has descriptor {mine:#010x} but domain rank {peer} has {theirs:#010x}{detail}; every rank must call the same collective with the same windows, shape, dtype, op, algorithm and root")]
    CollectiveMismatch {
        /// The collective this rank called.
        collective: &'static str,
        /// This world rank.
        rank: u32,
        /// This domain rank.
        domain_rank: u32,
        /// The first peer (domain rank) whose descriptor differs.
        peer: u32,
        /// This rank's descriptor hash.
        mine: u32,
        /// The peer's descriptor hash.
        theirs: u32,
        /// Extra detail (e.g. that the peer rejected its own arguments).
        detail: String,
    },
}

impl From<CommError> for strata_chip::KernelError {
    fn from(e: CommError) -> Self {
        strata_chip::KernelError::new(e.to_string())
    }
}
