//! The kernel side: [`RankContext`] (what a chip child installs), [`Comm`] (what a kernel
//! holds) and [`Window`] (one distributed tensor opened on this rank: one-sided data
//! movement and signals).

use crate::arena::layout::MAX_RANKS;
use crate::arena::CommArena;
use crate::error::CommError;
use crate::signal::{self, NotifyOp, Patience, WaitCmp};
use crate::tensor::DistributedTensor;
use std::sync::atomic::{AtomicI16, AtomicI8, AtomicU16, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_chip::SignalNote;
use strata_sync::sync::AtomicI32;
use strata_sync::WakeCounter;
use strata_types::{bf16, f16, DataType, Element, TensorView};

/// What a chip child installs for its kernels:
/// `chip.set_comm_context(Some(Arc::new(RankContext::new(arena, rank, timeout))))`.
/// Kernels reach it through [`Comm::from_kernel`] and open their window arguments with
/// [`KernelWindows::window`] (`ctx.window(i)`).
pub struct RankContext {
    arena: Arc<CommArena>,
    world_rank: u32,
    wait_timeout: Duration,
    spin: Duration,
}

impl std::fmt::Debug for RankContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankContext")
            .field("world_rank", &self.world_rank)
            .field("wait_timeout", &self.wait_timeout)
            .field("spin", &self.spin)
            .finish()
    }
}

impl RankContext {
    /// Default spin budget of a wait before it parks: 50 µs (as the mailbox's waits).
    pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

    /// The context of world rank `world_rank` over `arena`; every signal wait gives up
    /// after `wait_timeout` with [`CommError::WaitTimeout`]. (A rank outside the world is
    /// a member of no domain, so every [`Comm::window`] refuses it.)
    pub fn new(arena: Arc<CommArena>, world_rank: u32, wait_timeout: Duration) -> Self {
        RankContext {
            arena,
            world_rank,
            wait_timeout,
            spin: Self::DEFAULT_SPIN,
        }
    }

    /// Sets how long a wait spins before it parks (zero parks at once). Spin-waits yield
    /// the CPU every 64 polls after `strata_sync::YIELD_AFTER`.
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// This rank in the world.
    pub fn world_rank(&self) -> u32 {
        self.world_rank
    }

    /// The deadline of every wait.
    pub fn wait_timeout(&self) -> Duration {
        self.wait_timeout
    }

    /// The spin budget of every wait.
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// The arena.
    pub fn arena(&self) -> &Arc<CommArena> {
        &self.arena
    }

    pub(crate) fn patience(&self) -> Patience {
        Patience {
            spin: self.spin,
            timeout: self.wait_timeout,
        }
    }
}

/// A rank's handle on distributed memory: its world rank and size, and [`Comm::window`]
/// to open a [`DistributedTensor`] on this rank (host threads playing ranks, tests). A
/// kernel opens the windows it was given as tensor arguments with
/// [`KernelWindows::window`] (`ctx.window(i)`).
#[derive(Clone, Copy, Debug)]
pub struct Comm<'a> {
    ctx: &'a RankContext,
    /// The kernel's signal-wait note (none for a host thread playing a rank).
    note: Option<SignalNote<'a>>,
}

impl<'a> Comm<'a> {
    /// The comm context of the kernel's chip (`ctx.comm::<RankContext>()`).
    ///
    /// # Errors
    /// [`CommError::NoCommContext`] if the chip has none.
    pub fn from_kernel(ctx: &strata_chip::KernelCtx<'a>) -> Result<Comm<'a>, CommError> {
        let note = Some(ctx.signal_note());
        ctx.comm::<RankContext>()
            .map(|ctx| Comm { ctx, note })
            .ok_or(CommError::NoCommContext)
    }

    /// A handle over a context (tests, host threads playing ranks).
    pub fn from_rank(ctx: &'a RankContext) -> Comm<'a> {
        Comm { ctx, note: None }
    }

    /// This rank in the world.
    pub fn world_rank(&self) -> u32 {
        self.ctx.world_rank
    }

    /// Ranks in the world.
    pub fn world_size(&self) -> u32 {
        self.ctx.arena.world_size()
    }

    /// The context.
    pub fn context(&self) -> &'a RankContext {
        self.ctx
    }

    /// Opens `t` on this rank: checks that its buffer is live (the table slot still holds
    /// its generation) and that this rank is a member of its domain.
    ///
    /// # Errors
    /// [`CommError::StaleTensor`], [`CommError::BadTensor`], [`CommError::NotAMember`].
    pub fn window(&self, t: &DistributedTensor) -> Result<Window<'a>, CommError> {
        let g = Geom::open(&self.ctx.arena, t)?;
        let me = self.ctx.world_rank;
        let rank = g.members[..g.nranks as usize]
            .iter()
            .position(|&m| u32::from(m) == me)
            .ok_or_else(|| CommError::NotAMember {
                world_rank: me,
                members: g.members().collect(),
            })?;
        Ok(Window {
            ctx: self.ctx,
            g,
            rank: rank as u32,
            note: self.note,
        })
    }

    /// Opens the window a kernel's tensor argument `index` names: `buffer_offset` is the
    /// argument's buffer in the arena (its external-memory offset), `view` the argument's
    /// view of it. The view must be one contiguous tensor inside one rank's copy of a
    /// live window buffer — this rank's own copy.
    pub(crate) fn window_of_arg(
        &self,
        index: usize,
        buffer_offset: u64,
        view: &TensorView,
    ) -> Result<Window<'a>, CommError> {
        let not = |reason: String| CommError::NotAWindow { index, reason };
        let arena = &self.ctx.arena;
        let first = buffer_offset
            .checked_add(view.byte_offset())
            .filter(|&o| o < arena.len() as u64)
            .ok_or_else(|| {
                not(format!(
                    "its address (external offset {buffer_offset:#x} + {}) is outside the comm arena of {} bytes: the chip's external memory is not this rank's comm arena",
                    view.byte_offset(),
                    arena.len()
                ))
            })?;
        let (slot, generation, info) = arena.find_slot(first).ok_or_else(|| {
            not("it lies in no live window buffer (the buffer was freed, or the argument is not a window)".into())
        })?;
        let rel = first - info.base;
        let (copy, in_copy) = (rel / info.window_bytes, rel % info.window_bytes);
        if !view.is_contiguous() {
            return Err(not(format!(
                "its view {:?} with strides {:?} is not one rank's copy but a strided view (a sub-worker sees a window as [nranks, ...]); pass the window itself to a chip task, which receives its own rank's copy",
                view.shape(),
                view.strides()
            )));
        }
        if in_copy + view.nbytes() > info.data_bytes {
            return Err(not(format!(
                "its {} bytes at byte {in_copy} of a rank's copy leave the window buffer's {} bytes per rank",
                view.nbytes(),
                info.data_bytes
            )));
        }
        let me = self.ctx.world_rank;
        let owner = u32::from(info.members[copy as usize]);
        if owner != me {
            let members: Vec<u32> = info.members[..info.nranks as usize]
                .iter()
                .map(|&m| u32::from(m))
                .collect();
            return Err(if members.contains(&me) {
                not(format!(
                    "it is the copy of domain rank {copy} (world rank {owner}), but this kernel runs on world rank {me}: a chip task receives its own rank's copy of a window (the engine narrows it) and reaches peers' copies through the window"
                ))
            } else {
                CommError::NotAMember {
                    world_rank: me,
                    members,
                }
            });
        }
        let t = DistributedTensor::new(slot, generation, in_copy, view.shape(), view.dtype())?;
        self.window(&t)
    }
}

/// `ctx.window(i)`: a kernel's window arguments as [`Window`]s (bring it into scope with
/// `use strata_comm::KernelWindows;` or `use strata_comm::prelude::*;`).
///
/// A window reaches a kernel as an ordinary tensor argument: the host orchestration passes
/// the window tensor (`TaskArgs::new().inout(&data)`) and a chip task on worker `r` receives
/// domain rank `r`'s copy of it, in place — at the same index as the host's argument. The
/// kernel cannot borrow it as a slice (`ctx.input` / `ctx.output` refuse it: a peer may
/// write it while the kernel runs); it opens it here, getting this rank's [`Window`]:
/// one-sided reads and writes of every rank's copy, signals, and the collectives.
///
/// ```no_run
/// use strata_chip::KernelCtx;
/// use strata_comm::prelude::*;
/// use strata_types::CallbackResult;
/// // Tensor 0: this rank's input row; 1: its output row; 2: the data window.
/// fn allreduce_kernel(ctx: &mut KernelCtx) -> CallbackResult {
///     let data = ctx.window(2)?;
///     data.write(data.rank(), 0, &ctx.input::<f32>(0)?.to_vec())?;
///     data.allreduce(ReduceOp::Sum, AllreduceAlgo::Auto)?;
///     let mut out = ctx.output::<f32>(1)?;
///     data.read(data.rank(), 0, out.as_mut_slice().ok_or("contiguous output")?)?;
///     Ok(())
/// }
/// ```
pub trait KernelWindows<'a> {
    /// The window tensor argument `i` names, opened on this rank: its rank is this chip's
    /// domain rank, its shape and dtype the argument's.
    ///
    /// # Errors
    /// [`CommError::NoCommContext`] on a chip without comm context,
    /// [`CommError::NotAWindow`] for an argument that is not this rank's copy of a live
    /// window (naming the argument and why), [`CommError::NotAMember`].
    fn window(&self, i: usize) -> Result<Window<'a>, CommError>;
}

impl<'a> KernelWindows<'a> for strata_chip::KernelCtx<'a> {
    fn window(&self, i: usize) -> Result<Window<'a>, CommError> {
        let comm = Comm::from_kernel(self)?;
        let arg = self.external_arg(i).map_err(|e| CommError::NotAWindow {
            index: i,
            reason: e.to_string(),
        })?;
        comm.window_of_arg(i, arg.offset, &arg.view)
    }
}

/// Where one distributed tensor lives in this process: rank 0's copy, the distance between
/// two ranks' copies, the domain.
#[derive(Clone, Copy)]
pub(crate) struct Geom {
    /// Domain rank 0's first element, in this process.
    pub(crate) first: *mut u8,
    /// Bytes between two ranks' copies (the buffer's per-rank window size).
    pub(crate) stride: u64,
    pub(crate) nranks: u32,
    pub(crate) members: [u8; MAX_RANKS],
    /// `(domain id, domain generation)`.
    pub(crate) domain: (u32, u32),
    /// Bytes of each rank's copy that windows view; the buffer's signal area follows.
    pub(crate) data_bytes: u64,
    pub(crate) t: DistributedTensor,
}

impl Geom {
    pub(crate) fn open(arena: &CommArena, t: &DistributedTensor) -> Result<Geom, CommError> {
        let info = arena.read_slot(t.slot, t.generation)?;
        let end = t.offset.checked_add(t.nbytes());
        if end.is_none_or(|e| e > info.data_bytes) {
            return Err(CommError::BadTensor {
                reason: format!(
                    "a {:?} {} view at byte offset {} does not fit its window buffer's {} bytes per rank",
                    t.shape(),
                    t.dtype,
                    t.offset,
                    info.data_bytes
                ),
            });
        }
        Ok(Geom {
            first: arena.ptr(info.base + t.offset),
            stride: info.window_bytes,
            nranks: info.nranks,
            members: info.members,
            domain: info.domain,
            data_bytes: info.data_bytes,
            t: *t,
        })
    }

    /// The buffer's signal area: `signal_area_bytes(nranks) / 4` i32 cells after the
    /// data bytes of every rank's copy (at the next multiple of 128).
    pub(crate) fn signal(&self) -> Geom {
        let cells = crate::collective::signal_area_bytes(self.nranks) / 4;
        let t = DistributedTensor {
            offset: crate::collective::signal_offset(self.data_bytes),
            dtype: DataType::I32,
            ndim: 1,
            dims: [cells, 0, 0, 0, 0],
            ..self.t
        };
        Geom {
            // SAFETY: `first` is the tensor's first byte in rank 0's copy, `t.offset` bytes
            // into it; the signal area starts `data_bytes` into the same copy, inside the
            // buffer (`open` checked the slot: data_bytes + signal area <= stride).
            first: unsafe {
                self.first
                    .sub(self.t.offset as usize)
                    .add(crate::collective::signal_offset(self.data_bytes) as usize)
            },
            t,
            ..*self
        }
    }

    pub(crate) fn members(&self) -> impl Iterator<Item = u32> + '_ {
        self.members[..self.nranks as usize]
            .iter()
            .map(|&m| u32::from(m))
    }

    pub(crate) fn check_peer(&self, peer: u32) -> Result<(), CommError> {
        if peer < self.nranks {
            Ok(())
        } else {
            Err(CommError::BadPeer {
                peer,
                nranks: self.nranks,
            })
        }
    }

    /// Domain rank `peer`'s first element (`peer < nranks`).
    #[inline(always)]
    pub(crate) fn rank_ptr(&self, peer: u32) -> *mut u8 {
        debug_assert!(peer < self.nranks);
        // SAFETY: `Geom::open` checked `base + nranks * stride <= arena len` and
        // `offset + nbytes <= stride`, so every rank's copy lies inside the mapping.
        unsafe { self.first.add(peer as usize * self.stride as usize) }
    }

    pub(crate) fn esize(&self) -> u64 {
        self.t.dtype.size_bytes() as u64
    }

    pub(crate) fn check_dtype(&self, got: DataType, what: &str) -> Result<(), CommError> {
        if got == self.t.dtype {
            Ok(())
        } else {
            Err(CommError::DtypeMismatch {
                what: what.to_owned(),
                expected: self.t.dtype,
                got,
            })
        }
    }

    fn check_range(&self, elem_offset: u64, len: usize, what: &str) -> Result<(), CommError> {
        let numel = self.t.numel();
        if elem_offset
            .checked_add(len as u64)
            .is_none_or(|e| e > numel)
        {
            return Err(CommError::OutOfRange {
                what: format!(
                    "{what}: elements {elem_offset}..{} are outside the tensor's {numel} elements",
                    elem_offset.saturating_add(len as u64)
                ),
            });
        }
        Ok(())
    }

    pub(crate) fn copy_in<T: Element>(
        &self,
        peer: u32,
        elem_offset: u64,
        data: &[T],
        what: &str,
    ) -> Result<(), CommError> {
        self.check_peer(peer)?;
        self.check_dtype(T::DTYPE, what)?;
        self.check_range(elem_offset, data.len(), what)?;
        // SAFETY: the range was checked against the tensor, which lies inside the peer's
        // copy; `data` is a distinct local slice. Concurrent conflicting access by another
        // rank is a protocol error of the program (as on hardware), not memory unsafety of
        // this process: the bytes are plain data of an `Element` type.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr().cast::<u8>(),
                self.rank_ptr(peer)
                    .add((elem_offset * self.esize()) as usize),
                std::mem::size_of_val(data),
            )
        };
        Ok(())
    }

    pub(crate) fn copy_out<T: Element>(
        &self,
        peer: u32,
        elem_offset: u64,
        out: &mut [T],
        what: &str,
    ) -> Result<(), CommError> {
        self.check_peer(peer)?;
        self.check_dtype(T::DTYPE, what)?;
        self.check_range(elem_offset, out.len(), what)?;
        // SAFETY: as `copy_in`; every bit pattern is a valid `T` (`Element` contract).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.rank_ptr(peer)
                    .add((elem_offset * self.esize()) as usize),
                out.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(out),
            )
        };
        Ok(())
    }

    /// Cell `flat` of `peer`'s copy (an i32 tensor; `peer < nranks`, `flat < numel`).
    #[inline(always)]
    pub(crate) fn cell(&self, peer: u32, flat: u64) -> &AtomicI32 {
        debug_assert!(peer < self.nranks && flat < self.t.numel());
        // SAFETY: the cell lies inside the peer's copy of the tensor (see `rank_ptr`); i32
        // views have 4-aligned offsets in 64-aligned rank windows of a page-aligned arena.
        unsafe { &*(self.rank_ptr(peer).add(flat as usize * 4) as *const AtomicI32) }
    }

    /// The flat index of the cell at `offsets` (one per dim).
    pub(crate) fn flat(&self, offsets: &[u64], what: &str) -> Result<u64, CommError> {
        let shape = self.t.shape();
        if offsets.len() != shape.len() {
            return Err(CommError::OutOfRange {
                what: format!(
                    "{what}: {} offsets given for a {}-dim signal tensor {shape:?} (one per dim)",
                    offsets.len(),
                    shape.len()
                ),
            });
        }
        let mut flat = 0u64;
        for (&o, &d) in offsets.iter().zip(shape) {
            if o >= d {
                return Err(CommError::OutOfRange {
                    what: format!(
                        "{what}: cell {offsets:?} is outside the signal tensor {shape:?}"
                    ),
                });
            }
            flat = flat * d + o;
        }
        Ok(flat)
    }

    /// The offsets (one per dim) of flat cell `flat`.
    pub(crate) fn unravel(&self, mut flat: u64) -> Vec<u64> {
        let shape = self.t.shape();
        let mut out = vec![0; shape.len()];
        for (o, &d) in out.iter_mut().zip(shape).rev() {
            if d > 0 {
                *o = flat % d;
                flat /= d;
            }
        }
        out
    }

    pub(crate) fn check_signal(&self, what: &str) -> Result<(), CommError> {
        self.check_dtype(DataType::I32, what)
    }

    /// Whether two views share bytes of the same buffer.
    pub(crate) fn overlaps(&self, o: &Geom) -> bool {
        self.t.slot == o.t.slot
            && self.t.offset < o.t.offset + o.t.nbytes()
            && o.t.offset < self.t.offset + self.t.nbytes()
    }
}

/// How [`Window::store_tile`] writes into the peer's copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// Plain copy.
    Overwrite,
    /// Atomic accumulate, element by element (f32, f16, bf16 via compare-exchange loops;
    /// i32, i16, i8 via `fetch_add`, wrapping).
    Add,
}

/// One distributed tensor opened on this rank ([`Comm::window`]): this rank's copy and,
/// by domain rank, every peer's.
///
/// Data movement copies between local slices and a rank's copy, bounds- and
/// dtype-checked. Ordering between ranks is what signals establish: a `notify` releases
/// the notifier's earlier writes, a satisfied `wait` acquires them (reference §5.4: push →
/// store, notify / barrier, then the receiver reads; pull → stage, barrier, load).
/// Unordered conflicting accesses from two ranks give unspecified values, as on hardware.
pub struct Window<'a> {
    ctx: &'a RankContext,
    pub(crate) g: Geom,
    rank: u32,
    /// Where a wait says what it waits on (a kernel's core slot), if anywhere.
    note: Option<SignalNote<'a>>,
}

// SAFETY: a window is a description of shared memory (addresses into the arena, which is
// Send + Sync and outlives 'a); all its accesses are atomics or bounds-checked copies.
unsafe impl Send for Window<'_> {}
// SAFETY: as above.
unsafe impl Sync for Window<'_> {}

impl std::fmt::Debug for Window<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("rank", &self.rank)
            .field("nranks", &self.g.nranks)
            .field("tensor", &self.g.t)
            .finish()
    }
}

/// Calls `f(tensor_elem, tile_elem, len)` for each contiguous run of a row-major tile.
fn for_each_run(dims: &[u64], offsets: &[u64], shape: &[u64], mut f: impl FnMut(u64, u64, u64)) {
    let nd = dims.len();
    if shape.contains(&0) {
        return;
    }
    let inner = shape[nd - 1];
    let mut idx = vec![0u64; nd - 1];
    let mut tile = 0u64;
    loop {
        let mut t = 0u64;
        for d in 0..nd {
            let i = if d < nd - 1 { idx[d] } else { 0 };
            t = t * dims[d] + offsets[d] + i;
        }
        f(t, tile, inner);
        tile += inner;
        // Odometer over the outer dims.
        let mut d = nd - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Whether [`StoreOp::Add`] supports `dtype`.
fn add_supported(dtype: DataType) -> Result<(), CommError> {
    match dtype {
        DataType::F32
        | DataType::F16
        | DataType::BF16
        | DataType::I32
        | DataType::I16
        | DataType::I8 => Ok(()),
        other => Err(CommError::UnsupportedDtype {
            what: "store_tile(StoreOp::Add)",
            dtype: other,
            supported: "f32, f16, bf16, i32, i16, i8",
        }),
    }
}

/// Atomically adds `n` elements at `src` into `n` elements at `dst`.
///
/// # Safety
/// `dst` points at `n` naturally aligned elements of `dtype` inside a rank's copy, `src`
/// at `n` readable elements; `dtype` passed [`add_supported`].
unsafe fn add_elems(dtype: DataType, dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: (all arms) per the function contract; window offsets are multiples of the
    // element size in 64-aligned rank windows, so the atomics are aligned.
    unsafe {
        match dtype {
            DataType::F32 => {
                for i in 0..n {
                    let v = (src as *const f32).add(i).read_unaligned();
                    let a = &*(dst as *const AtomicU32).add(i);
                    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                        Some((f32::from_bits(c) + v).to_bits())
                    });
                }
            }
            DataType::F16 => {
                for i in 0..n {
                    let v = (src as *const f16).add(i).read_unaligned().to_f32();
                    let a = &*(dst as *const AtomicU16).add(i);
                    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                        Some(f16::from_f32(f16::from_bits(c).to_f32() + v).to_bits())
                    });
                }
            }
            DataType::BF16 => {
                for i in 0..n {
                    let v = (src as *const bf16).add(i).read_unaligned().to_f32();
                    let a = &*(dst as *const AtomicU16).add(i);
                    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                        Some(bf16::from_f32(bf16::from_bits(c).to_f32() + v).to_bits())
                    });
                }
            }
            DataType::I32 => {
                for i in 0..n {
                    let v = (src as *const i32).add(i).read_unaligned();
                    (*(dst as *const AtomicI32).add(i)).fetch_add(v, Ordering::Relaxed);
                }
            }
            DataType::I16 => {
                for i in 0..n {
                    let v = (src as *const i16).add(i).read_unaligned();
                    (*(dst as *const AtomicI16).add(i)).fetch_add(v, Ordering::Relaxed);
                }
            }
            DataType::I8 => {
                for i in 0..n {
                    let v = (src as *const i8).add(i).read_unaligned();
                    (*(dst as *const AtomicI8).add(i)).fetch_add(v, Ordering::Relaxed);
                }
            }
            _ => unreachable!("add_elems on {dtype}"),
        }
    }
}

impl<'a> Window<'a> {
    /// This rank's domain rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Ranks of the domain.
    pub fn nranks(&self) -> u32 {
        self.g.nranks
    }

    /// The tensor this window opens.
    pub fn tensor(&self) -> &DistributedTensor {
        &self.g.t
    }

    /// The window's shape (on each rank).
    pub fn shape(&self) -> &[u64] {
        self.g.t.shape()
    }

    /// The window's element type.
    pub fn dtype(&self) -> DataType {
        self.g.t.dtype
    }

    /// The signal area of this window's buffer, as an i32 window (what its collectives
    /// and barriers synchronise through).
    pub(crate) fn signal(&self) -> Window<'a> {
        Window {
            ctx: self.ctx,
            g: self.g.signal(),
            rank: self.rank,
            note: self.note,
        }
    }

    /// The world rank of domain rank `peer`.
    ///
    /// # Errors
    /// [`CommError::BadPeer`].
    pub fn world_rank_of(&self, peer: u32) -> Result<u32, CommError> {
        self.g.check_peer(peer)?;
        Ok(u32::from(self.g.members[peer as usize]))
    }

    /// The rank context.
    pub fn context(&self) -> &'a RankContext {
        self.ctx
    }

    pub(crate) fn wake(&self, peer: u32) -> WakeCounter<'a> {
        self.ctx
            .arena
            .wake(u32::from(self.g.members[peer as usize]))
    }

    /// `get`: copies elements `elem_offset..elem_offset + out.len()` of domain rank
    /// `peer`'s copy (`peer` may be this rank) into `out`.
    ///
    /// # Errors
    /// [`CommError::BadPeer`], [`CommError::DtypeMismatch`], [`CommError::OutOfRange`].
    pub fn read<T: Element>(
        &self,
        peer: u32,
        elem_offset: u64,
        out: &mut [T],
    ) -> Result<(), CommError> {
        self.g.copy_out(peer, elem_offset, out, "read")
    }

    /// `put`: copies `data` into elements `elem_offset..` of domain rank `peer`'s copy.
    /// Fire-and-forget: pair it with a `notify` (or a barrier) the receiver waits on.
    ///
    /// # Errors
    /// As [`Window::read`].
    pub fn write<T: Element>(
        &self,
        peer: u32,
        elem_offset: u64,
        data: &[T],
    ) -> Result<(), CommError> {
        self.g.copy_in(peer, elem_offset, data, "write")
    }

    fn check_tile(
        &self,
        offsets: &[u64],
        shape: &[u64],
        len: usize,
        what: &str,
    ) -> Result<(), CommError> {
        let dims = self.g.t.shape();
        if offsets.len() != dims.len() || shape.len() != dims.len() {
            return Err(CommError::OutOfRange {
                what: format!(
                    "{what}: a tile of a {}-dim tensor needs {} offsets and {} extents, got {} and {}",
                    dims.len(),
                    dims.len(),
                    dims.len(),
                    offsets.len(),
                    shape.len()
                ),
            });
        }
        for d in 0..dims.len() {
            if offsets[d].checked_add(shape[d]).is_none_or(|e| e > dims[d]) {
                return Err(CommError::OutOfRange {
                    what: format!(
                        "{what}: tile at {offsets:?} of shape {shape:?} leaves the tensor {dims:?} in dim {d}"
                    ),
                });
            }
        }
        let n: u64 = shape.iter().product();
        if n != len as u64 {
            return Err(CommError::OutOfRange {
                what: format!(
                    "{what}: a tile of shape {shape:?} has {n} elements but the local buffer has {len}"
                ),
            });
        }
        Ok(())
    }

    /// `remote_load`: copies the row-major tile at `offsets` of extent `shape` from domain
    /// rank `peer`'s copy into `out` (`out.len()` = product of `shape`).
    ///
    /// # Errors
    /// [`CommError::BadPeer`], [`CommError::DtypeMismatch`], [`CommError::OutOfRange`].
    pub fn load_tile<T: Element>(
        &self,
        peer: u32,
        offsets: &[u64],
        shape: &[u64],
        out: &mut [T],
    ) -> Result<(), CommError> {
        self.g.check_peer(peer)?;
        self.g.check_dtype(T::DTYPE, "load_tile")?;
        self.check_tile(offsets, shape, out.len(), "load_tile")?;
        let src = self.g.rank_ptr(peer);
        let es = self.g.esize() as usize;
        let dst = out.as_mut_ptr().cast::<u8>();
        for_each_run(self.g.t.shape(), offsets, shape, |t, l, n| {
            // SAFETY: the tile was checked against the tensor and `out`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.add(t as usize * es),
                    dst.add(l as usize * es),
                    n as usize * es,
                )
            }
        });
        Ok(())
    }

    /// `remote_store`: writes `data` (row-major, extent `shape`) into the tile at `offsets`
    /// of domain rank `peer`'s copy, overwriting or atomically adding ([`StoreOp`]).
    ///
    /// # Errors
    /// As [`Window::load_tile`]; [`CommError::UnsupportedDtype`] for `Add` on other dtypes
    /// than f32, f16, bf16, i32, i16, i8.
    pub fn store_tile<T: Element>(
        &self,
        peer: u32,
        offsets: &[u64],
        shape: &[u64],
        data: &[T],
        op: StoreOp,
    ) -> Result<(), CommError> {
        self.g.check_peer(peer)?;
        self.g.check_dtype(T::DTYPE, "store_tile")?;
        self.check_tile(offsets, shape, data.len(), "store_tile")?;
        let dst = self.g.rank_ptr(peer);
        let es = self.g.esize() as usize;
        let src = data.as_ptr().cast::<u8>();
        if op == StoreOp::Add {
            // Refuse unsupported dtypes before touching anything.
            add_supported(T::DTYPE)?;
        }
        for_each_run(self.g.t.shape(), offsets, shape, |t, l, n| {
            // SAFETY: the tile was checked against the tensor and `data`.
            unsafe {
                let (d, s) = (dst.add(t as usize * es), src.add(l as usize * es));
                match op {
                    StoreOp::Overwrite => std::ptr::copy_nonoverlapping(s, d, n as usize * es),
                    StoreOp::Add => add_elems(T::DTYPE, d, s, n as usize),
                }
            }
        });
        Ok(())
    }

    /// This rank's copy of the tensor (its first byte), for kernels that want to compute
    /// on it in place.
    ///
    /// # Safety
    /// The pointer is valid for `tensor().nbytes()` bytes while the window's buffer is
    /// live (until the run ends). Peers may read or write these bytes at any time the
    /// program's signals allow: the caller must not create references that overlap with
    /// such accesses, and must order its own accesses with notify/wait or barriers.
    pub unsafe fn local_ptr(&self) -> *mut u8 {
        self.g.rank_ptr(self.rank)
    }

    /// Domain rank `peer`'s copy of the tensor, with the same caveats as
    /// [`Window::local_ptr`].
    ///
    /// # Safety
    /// As [`Window::local_ptr`].
    ///
    /// # Errors
    /// [`CommError::BadPeer`].
    pub unsafe fn peer_ptr(&self, peer: u32) -> Result<*mut u8, CommError> {
        self.g.check_peer(peer)?;
        Ok(self.g.rank_ptr(peer))
    }

    /// Applies `op` with `value` to the cell at `offsets` of domain rank `peer`'s copy
    /// (`peer` may be this rank; negative adds are legal), with release ordering: every
    /// write this rank made before is visible to a rank whose wait sees the change. Wakes
    /// the peer if it is parked. The tensor must be I32.
    ///
    /// # Errors
    /// [`CommError::DtypeMismatch`], [`CommError::BadPeer`], [`CommError::OutOfRange`].
    pub fn notify(
        &self,
        peer: u32,
        offsets: &[u64],
        value: i32,
        op: NotifyOp,
    ) -> Result<(), CommError> {
        self.g.check_signal("notify")?;
        self.g.check_peer(peer)?;
        let flat = self.g.flat(offsets, "notify")?;
        signal::notify_cell(self.g.cell(peer, flat), self.wake(peer), value, op);
        Ok(())
    }

    /// Waits until this rank's cell at `offsets` satisfies `cell <cmp> expected`, with
    /// acquire ordering; returns the value seen. Spins for the context's spin budget, then
    /// parks until a notify wakes it, at most the context's wait timeout.
    ///
    /// # Errors
    /// [`CommError::WaitTimeout`] (naming the rank, the cell and the value seen) at the
    /// deadline — also when the peer's process died; [`CommError::DtypeMismatch`],
    /// [`CommError::OutOfRange`].
    pub fn wait(&self, offsets: &[u64], expected: i32, cmp: WaitCmp) -> Result<i32, CommError> {
        self.g.check_signal("wait")?;
        let flat = self.g.flat(offsets, "wait")?;
        self.wait_flat(flat, expected, cmp, || "wait".to_owned())
    }

    /// The current value of this rank's cell at `offsets` (acquire).
    ///
    /// # Errors
    /// [`CommError::DtypeMismatch`], [`CommError::OutOfRange`].
    pub fn load_signal(&self, offsets: &[u64]) -> Result<i32, CommError> {
        self.g.check_signal("load_signal")?;
        let flat = self.g.flat(offsets, "load_signal")?;
        Ok(signal::load_cell(self.g.cell(self.rank, flat)))
    }

    /// The current value of domain rank `peer`'s cell at `offsets` (acquire).
    ///
    /// # Errors
    /// As [`Window::load_signal`]; [`CommError::BadPeer`].
    pub fn load_peer_signal(&self, peer: u32, offsets: &[u64]) -> Result<i32, CommError> {
        self.g.check_signal("load_peer_signal")?;
        self.g.check_peer(peer)?;
        let flat = self.g.flat(offsets, "load_peer_signal")?;
        Ok(signal::load_cell(self.g.cell(peer, flat)))
    }

    pub(crate) fn wait_flat(
        &self,
        flat: u64,
        expected: i32,
        cmp: WaitCmp,
        what: impl FnOnce() -> String,
    ) -> Result<i32, CommError> {
        let cell = self.g.cell(self.rank, flat);
        self.wait_noted(flat, cell, self.wake(self.rank), expected, cmp)
            .map_err(|s| self.wait_timeout(flat, expected, cmp, s, what))
    }

    /// Waits until `cell` (cell `flat` of this rank's copy) compares `cmp` with
    /// `expected`. A wait whose condition holds publishes nothing; one that blocks tells
    /// the kernel's signal note what it waits on first (and what it last saw, and whether
    /// it gave up), so a stalled run's error can show it.
    fn wait_noted(
        &self,
        flat: u64,
        cell: &AtomicI32,
        wake: WakeCounter<'_>,
        expected: i32,
        cmp: WaitCmp,
    ) -> Result<i32, signal::Stuck> {
        let Some(note) = self.note else {
            return signal::wait_cell(cell, wake, expected, cmp, self.ctx.patience());
        };
        let v = signal::load_cell(cell);
        if cmp.holds(v, expected) {
            return Ok(v);
        }
        note.waiting(self.ctx.world_rank, flat, cmp.symbol(), expected, v);
        match signal::wait_cell_noting(cell, wake, expected, cmp, self.ctx.patience(), |v| {
            note.seen(v)
        }) {
            Ok(v) => {
                note.done();
                Ok(v)
            }
            Err(s) => {
                note.gave_up(s.seen);
                Err(s)
            }
        }
    }

    fn wait_timeout(
        &self,
        flat: u64,
        expected: i32,
        cmp: WaitCmp,
        s: signal::Stuck,
        what: impl FnOnce() -> String,
    ) -> CommError {
        CommError::WaitTimeout {
            rank: self.ctx.world_rank,
            domain_rank: self.rank,
            cell: self.g.unravel(flat),
            expected,
            cmp,
            seen: s.seen,
            waited: s.waited,
            what: what(),
        }
    }

    /// A barrier of every rank of the window's domain: the builtin self-clearing credit
    /// barrier, on the barrier rows of the buffer's signal area (the first `nranks`
    /// cells): `+1` into row `my_rank` of every peer's copy, wait `>= 1` on every peer's
    /// row of the own copy, then `-1` on each of them. Leaves every row as it found it, so
    /// a buffer serves any number of barriers and collectives, run after run. Any window
    /// of the buffer gives the same barrier; every rank of the domain must call it.
    ///
    /// # Errors
    /// [`CommError::WaitTimeout`].
    pub fn barrier(&self) -> Result<(), CommError> {
        self.signal().rows_barrier("barrier")
    }

    /// This rank's barrier rows of the window's buffer (the first `nranks` cells of its
    /// signal area, acquire-loaded): row `s` counts domain rank `s`'s barrier arrivals this
    /// rank has not consumed — 0 everywhere between barriers and collectives, since they
    /// are self-clearing. A diagnostic (a program that checks its barriers left no tally).
    pub fn barrier_rows(&self) -> Vec<i32> {
        let sig = self.signal();
        (0..u64::from(sig.g.nranks))
            .map(|row| signal::load_cell(sig.g.cell(self.rank, row)))
            .collect()
    }

    /// The credit barrier on cells `0..nranks` of a signal-area window.
    pub(crate) fn rows_barrier(&self, what: &str) -> Result<(), CommError> {
        let g = &self.g;
        signal::credit_barrier(
            self.rank as usize,
            g.nranks as usize,
            |rank, row| g.cell(rank as u32, row as u64),
            |rank| self.wake(rank as u32),
            // Row `peer` of this rank's copy: a stalled barrier names the missing peer.
            |peer, cell, wake| self.wait_noted(peer as u64, cell, wake, 1, WaitCmp::Ge),
        )
        .map_err(|(row, s)| CommError::WaitTimeout {
            rank: self.ctx.world_rank,
            domain_rank: self.rank,
            cell: g.unravel(row as u64),
            expected: 1,
            cmp: WaitCmp::Ge,
            seen: s.seen,
            waited: s.waited,
            what: format!("{what}: barrier row of domain rank {row}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::for_each_run;

    #[test]
    fn tile_runs_are_row_major() {
        let mut runs = Vec::new();
        for_each_run(&[4, 5], &[1, 2], &[2, 3], |t, l, n| runs.push((t, l, n)));
        assert_eq!(runs, vec![(7, 0, 3), (12, 3, 3)]);
        runs.clear();
        for_each_run(&[10], &[4], &[3], |t, l, n| runs.push((t, l, n)));
        assert_eq!(runs, vec![(4, 0, 3)]);
        runs.clear();
        for_each_run(&[2, 3, 4], &[1, 0, 1], &[1, 2, 2], |t, l, n| {
            runs.push((t, l, n))
        });
        assert_eq!(runs, vec![(13, 0, 2), (17, 2, 2)]);
        runs.clear();
        for_each_run(&[2, 3], &[0, 0], &[0, 3], |t, l, n| runs.push((t, l, n)));
        assert!(runs.is_empty());
    }
}
