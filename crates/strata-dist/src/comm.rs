//! Distributed memory for the chips of a level-3 worker (strata-comm, `docs/comm.md`): the
//! comm arena every chip child maps, the window buffers of a run and the rules for keeping
//! them ([`WindowLifetime`]), window tensors as task arguments, and the builtin chip
//! orchestrations behind the host-level collectives. The orchestration's window API
//! (`Orch::alloc_window_buffer`, `Orch::allreduce`, …) is in `orch/windows.rs`: it waits
//! for the run's turn and submits the builtins, and reaches this state only through
//! [`CommCtx::claim`], so the comm state knows nothing of the orchestration.
//!
//! A window is an ordinary tensor argument ([`WindowTensor`] is an `IntoTensorArg`: every
//! rank's copy, `[nranks, ...shape]`). The orchestration narrows it for a chip task to the
//! copy of the rank the task runs on (`Orch::submit_next_level*`); the chip child, whose
//! external memory is the comm arena, passes that copy in place, and the kernel opens it
//! with `strata_comm::KernelWindows::window` (`ctx.window(i)`), at the index the host gave.

use crate::config::WindowLifetime;
use crate::error::DistError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use strata_chip::{CoreArgs, KernelCtx, KernelError, OrchHandle};
use strata_comm::{
    AllreduceAlgo, BufferPlacement, CommAllocator, CommArena, CommError, CommStats,
    DistributedTensor, Domain, KernelWindows, ReduceOp, WindowBuffer,
};
use strata_graph::RunId;
use strata_types::{
    ArgTag, BufferDesc, BufferIdentity, BufferLocation, CallableDescriptor, CallableKind,
    CallbackResult, DataType, Element, IdentityMinter, IntoTensorArg, TensorArg, TensorView,
    TypesError,
};

impl From<CommError> for DistError {
    fn from(e: CommError) -> Self {
        DistError::Comm(e)
    }
}

/// The builtin chip orchestrations behind the host-level collectives and staging.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Builtins {
    pub(crate) allreduce: OrchHandle,
    pub(crate) broadcast: OrchHandle,
    pub(crate) allgather: OrchHandle,
    pub(crate) reduce_scatter: OrchHandle,
    pub(crate) all_to_all: OrchHandle,
    pub(crate) barrier: OrchHandle,
    pub(crate) stage_in: OrchHandle,
    pub(crate) stage_out: OrchHandle,
}

/// The comm side of a running level-3 worker with chips.
pub(crate) struct CommCtx {
    /// The arena's region in the process's shared memory.
    pub(crate) region: u64,
    builtins: Builtins,
    lifetime: WindowLifetime,
    state: Mutex<CommState>,
}

struct CommState {
    alloc: CommAllocator,
    /// The run whose window buffers are allocated (they are freed when a later run
    /// allocates, once this one has finished).
    owner: Option<RunId>,
    /// Window buffers the owner allocated so far (the key of persistent buffers).
    ordinal: usize,
    /// Persistent buffers by allocation ordinal: (domain members, bytes, buffer).
    kept: Vec<(Vec<u32>, u64, WindowBuffer)>,
    identities: HashMap<WindowBuffer, BufferIdentity>,
    /// The live buffers by identity (what a task argument's descriptor names).
    buffers: HashMap<BufferIdentity, WindowBuffer>,
}

/// A live window buffer a task argument names ([`CommCtx::geometry`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowGeometry {
    /// Where its ranks' copies are.
    pub(crate) placement: BufferPlacement,
    /// The domain rank of the worker the task runs on (`None`: not a member, or no
    /// worker asked about).
    pub(crate) rank: Option<u32>,
}

impl CommCtx {
    /// Initialises the arena (before the chips fork) and registers the builtins.
    ///
    /// # Safety
    /// `base..base + len` is a live, page-aligned `MAP_SHARED` mapping of zeroed memory
    /// that outlives the returned context and every chip child.
    pub(crate) unsafe fn init(
        base: *mut u8,
        len: usize,
        region: u64,
        world: u32,
        lifetime: WindowLifetime,
        registry: &mut strata_chip::Registry,
    ) -> Result<(CommCtx, Arc<CommArena>), DistError> {
        // SAFETY: the caller's contract.
        let arena = Arc::new(unsafe { CommArena::init(base, len, world) }?);
        let builtins = register_builtins(registry)?;
        Ok((
            CommCtx {
                region,
                builtins,
                lifetime,
                state: Mutex::new(CommState {
                    alloc: CommAllocator::new(arena.clone()),
                    owner: None,
                    ordinal: 0,
                    kept: Vec::new(),
                    identities: HashMap::new(),
                    buffers: HashMap::new(),
                }),
            },
            arena,
        ))
    }

    fn lock(&self) -> MutexGuard<'_, CommState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The builtin chip orchestrations.
    pub(crate) fn builtins(&self) -> Builtins {
        self.builtins
    }

    /// The run whose window buffers are allocated, if any.
    pub(crate) fn owner(&self) -> Option<RunId> {
        self.lock().owner
    }

    /// The window state for `run`. A run's first window operation frees the window
    /// buffers of the run that owned them (keeping persistent ones): the caller claims for
    /// a new run only once the [`owner`](CommCtx::owner) has finished, since that run's
    /// tasks may still be using its windows.
    pub(crate) fn claim(&self, run: RunId) -> RunWindows<'_> {
        let mut st = self.lock();
        if st.owner != Some(run) {
            if st.owner.is_some() {
                st.alloc.end_run();
                let kept: Vec<WindowBuffer> = st.kept.iter().map(|k| k.2).collect();
                st.identities.retain(|b, _| kept.contains(b));
                st.buffers.retain(|_, b| kept.contains(b));
            }
            st.owner = Some(run);
            st.ordinal = 0;
        }
        RunWindows { comm: self, st }
    }

    /// What the allocator did so far.
    pub(crate) fn stats(&self) -> CommStats {
        self.lock().alloc.stats()
    }

    /// The window buffer `desc` is exactly the descriptor of, if it is allocated now (by
    /// the run that owns the windows, or persistent), and the domain rank of `worker` in
    /// its domain.
    pub(crate) fn geometry(
        &self,
        desc: &BufferDesc,
        worker: Option<usize>,
    ) -> Option<WindowGeometry> {
        let st = self.lock();
        let BufferLocation::HostShared { offset, .. } = desc.location() else {
            return None;
        };
        let buf = st.buffers.get(&desc.identity())?;
        let placement = st.alloc.placement(buf).ok()?;
        let exact = placement.arena_offset == offset
            && Some(desc.nbytes())
                == placement
                    .rank_stride
                    .checked_mul(u64::from(placement.nranks));
        if !exact {
            return None;
        }
        let rank = worker.and_then(|w| {
            let members = st.alloc.members(&buf.domain()).ok()?;
            members
                .iter()
                .position(|&m| m as usize == w)
                .map(|d| d as u32)
        });
        Some(WindowGeometry { placement, rank })
    }

    /// The next-level workers of the domain of the window buffer `desc` names (for
    /// messages), in rank order.
    pub(crate) fn members_of(&self, desc: &BufferDesc) -> Vec<u32> {
        let st = self.lock();
        st.buffers
            .get(&desc.identity())
            .and_then(|b| st.alloc.members(&b.domain()).ok())
            .map(<[u32]>::to_vec)
            .unwrap_or_default()
    }

    /// Frees every window buffer, persistent ones included (at close).
    pub(crate) fn release_all(&self) {
        let mut st = self.lock();
        st.alloc.end_run();
        st.alloc.release_persistent();
        st.kept.clear();
        st.identities.clear();
        st.buffers.clear();
        st.owner = None;
    }
}

/// The comm state as one run holds it ([`CommCtx::claim`]): its domains, window buffers
/// and window tensors. Holds the state's lock; drop it before submitting tasks.
pub(crate) struct RunWindows<'a> {
    comm: &'a CommCtx,
    st: MutexGuard<'a, CommState>,
}

impl RunWindows<'_> {
    /// A domain over next-level workers `workers` (their order is its rank numbering).
    pub(crate) fn domain(&mut self, workers: &[usize]) -> Result<Domain, DistError> {
        let members: Vec<u32> = workers.iter().map(|&w| w as u32).collect();
        Ok(self.st.alloc.domain(&members)?)
    }

    /// The domain of every chip.
    pub(crate) fn world(&mut self) -> Result<Domain, DistError> {
        Ok(self.st.alloc.world()?)
    }

    /// The next-level worker ids of `domain`'s ranks, in rank order.
    pub(crate) fn workers(&self, domain: &Domain) -> Result<Vec<usize>, DistError> {
        Ok(self
            .st
            .alloc
            .members(domain)?
            .iter()
            .map(|&w| w as usize)
            .collect())
    }

    /// The run's next window buffer: a fresh one, or under
    /// [`WindowLifetime::Persistent`] the buffer the first run allocated at this position
    /// (which must have the same members and size).
    pub(crate) fn alloc_window_buffer(
        &mut self,
        domain: &Domain,
        bytes: u64,
        minter: &IdentityMinter,
    ) -> Result<WindowBuffer, DistError> {
        let st = &mut *self.st;
        let ordinal = st.ordinal;
        let members = st.alloc.members(domain)?.to_vec();
        let buf = match self.comm.lifetime {
            WindowLifetime::PerRun => st.alloc.alloc_window_buffer(domain, bytes)?,
            WindowLifetime::Persistent { zero_between_runs } => {
                match st.kept.get(ordinal).cloned() {
                    Some((m, b, kept)) => {
                        if m != members || b != bytes {
                            return Err(DistError::InvalidArgs(format!(
                                "persistent windows: window buffer {ordinal} of this run is {bytes} bytes over ranks {members:?}, but the first run allocated {b} bytes over ranks {m:?}; a worker that keeps its windows must allocate the same buffers in the same order every run"
                            )));
                        }
                        let _ = zero_between_runs; // zero-filled by the allocator's end_run
                        kept
                    }
                    None => {
                        let buf = st.alloc.alloc_window_buffer(domain, bytes)?;
                        st.alloc.make_persistent(&buf, zero_between_runs)?;
                        st.kept.push((members, bytes, buf));
                        buf
                    }
                }
            }
        };
        st.ordinal += 1;
        let id = *st.identities.entry(buf).or_insert_with(|| minter.mint());
        st.buffers.insert(id, buf);
        Ok(buf)
    }

    /// A typed, row-major view at byte `offset` of window buffer `buf` of this run.
    pub(crate) fn window(
        &self,
        buf: &WindowBuffer,
        offset: u64,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<WindowTensor, DistError> {
        if shape.len() >= strata_types::MAX_DIMS {
            return Err(DistError::InvalidArgs(format!(
                "a window has 1..={} dims, not {} ({shape:?}): as a task argument it covers every rank's copy, [nranks, ...shape], at most {} dims; merge dims",
                strata_types::MAX_DIMS - 1,
                shape.len(),
                strata_types::MAX_DIMS
            )));
        }
        let tensor = self.st.alloc.window(buf, offset, shape, dtype)?;
        let placement = self.st.alloc.placement(buf)?;
        let identity = *self.st.identities.get(buf).ok_or_else(|| {
            DistError::InvalidArgs("the window buffer is not one of this run's".into())
        })?;
        Ok(WindowTensor {
            tensor,
            domain: buf.domain(),
            identity,
            region: self.comm.region,
            placement,
        })
    }

    /// Writes `data` into domain rank `rank`'s copy of `w`, now.
    pub(crate) fn write<T: Element>(
        &self,
        w: &WindowTensor,
        rank: u32,
        data: &[T],
    ) -> Result<(), DistError> {
        Ok(self.st.alloc.host_write(&w.tensor, rank, 0, data)?)
    }
}

/// A window tensor as a host orchestration holds it ([`Orch::window`](crate::Orch::window)):
/// a typed view of a window buffer, the same on every rank of the buffer's domain. Pass it
/// to tasks like any tensor (`TaskArgs::new().inout(&data)`, tagged by how the task uses
/// it):
///
/// - a **chip task** on worker `w` receives domain rank `d`'s copy (`w`'s rank in the
///   window's domain) at the same argument index, in place — its kernel opens it with
///   `ctx.window(i)` (`strata_comm::KernelWindows`). Tasks of different ranks that name
///   the window are not ordered against each other (their kernels synchronise through
///   signals and collectives), so per-rank tasks submitted one by one run concurrently;
///   tasks of one rank that name any window of the same buffer run one at a time, in
///   submit order (a kernel may write the window and signal through the buffer's signal
///   area whatever its tag). A worker outside the window's domain is refused
///   ([`DistError::WindowOutsideDomain`]);
/// - a **sub-worker task** receives every rank's copy, a `[nranks, ...shape]` view
///   (strided: consecutive ranks' copies are `rank_stride` bytes apart), ordered after
///   every earlier task on any rank that touched the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowTensor {
    tensor: DistributedTensor,
    domain: Domain,
    identity: BufferIdentity,
    region: u64,
    placement: BufferPlacement,
}

impl WindowTensor {
    /// The comm-level tensor (what strata-comm's host side opens); the same on every rank.
    pub fn tensor(&self) -> DistributedTensor {
        self.tensor
    }

    /// Ranks of its domain.
    pub fn nranks(&self) -> u32 {
        self.placement.nranks
    }

    /// Its element type.
    pub fn dtype(&self) -> DataType {
        self.tensor.dtype()
    }

    /// Its shape (on each rank).
    pub fn shape(&self) -> &[u64] {
        self.tensor.shape()
    }

    /// The domain whose ranks hold it.
    pub(crate) fn domain(&self) -> Domain {
        self.domain
    }

    fn buffer(&self) -> BufferDesc {
        // SAFETY: the window buffer's bytes in the arena belong to it alone while it is
        // allocated, under this identity (`CommState::identities`); a task naming it is
        // admitted only while it is live (`CommCtx::geometry`).
        unsafe {
            BufferDesc::from_parts(
                self.identity,
                self.placement.rank_stride * u64::from(self.placement.nranks),
                BufferLocation::HostShared {
                    region: self.region,
                    offset: self.placement.arena_offset,
                },
            )
        }
    }

    /// The tensor on every rank as a task argument, `[nranks, ...shape]` (what
    /// `IntoTensorArg for &WindowTensor` gives): a chip task receives its own rank's copy
    /// of it, a sub-worker task all of them (see [`WindowTensor`]).
    pub fn arg(&self, tag: ArgTag) -> TensorArg {
        let esize = self.tensor.dtype().size_bytes() as u64;
        let shape = self.tensor.shape();
        let mut dims = vec![u64::from(self.placement.nranks)];
        dims.extend_from_slice(shape);
        let mut strides = vec![self.placement.rank_stride / esize];
        let mut acc = 1u64;
        let mut inner: Vec<u64> = shape
            .iter()
            .rev()
            .map(|&d| {
                let s = acc;
                acc *= d;
                s
            })
            .collect();
        inner.reverse();
        strides.extend(inner);
        let view = TensorView::new(
            self.tensor.dtype(),
            &dims,
            &strides,
            self.tensor.byte_offset(),
        )
        .unwrap_or_else(|_| unreachable!("a live window's geometry is valid"));
        TensorArg {
            buffer: self.buffer(),
            view,
            tag,
        }
    }

    /// Domain rank `rank`'s copy alone as a task argument (a `shape` view): for a
    /// sub-worker task that works on one rank's copy, or a chip task on that rank (which
    /// receives the same copy from [`WindowTensor::arg`]).
    ///
    /// # Errors
    /// A rank outside the domain.
    pub fn arg_rank(&self, rank: u32, tag: ArgTag) -> Result<TensorArg, DistError> {
        if rank >= self.placement.nranks {
            return Err(DistError::InvalidArgs(format!(
                "rank {rank} is outside the window's domain of {} ranks",
                self.placement.nranks
            )));
        }
        let c = TensorView::contiguous(self.tensor.dtype(), self.tensor.shape())?;
        let view = TensorView::new(
            self.tensor.dtype(),
            c.shape(),
            c.strides(),
            u64::from(rank) * self.placement.rank_stride + self.tensor.byte_offset(),
        )?;
        Ok(TensorArg {
            buffer: self.buffer(),
            view,
            tag,
        })
    }
}

/// The tensor on every rank ([`WindowTensor::arg`]), for [`strata_types::TaskArgs`]'
/// chaining methods: `TaskArgs::new().inout(&window)`.
impl IntoTensorArg for &WindowTensor {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError> {
        Ok(self.arg(tag))
    }
}

/// Narrows a window argument of a chip task on the worker of domain rank `rank` to that
/// rank's copy: the whole-window view `[nranks, ...shape]` ([`WindowTensor::arg`]) becomes
/// the rank's `shape` view; a view inside one rank's copy must be that rank's. `Err` says
/// why the view is refused.
pub(crate) fn narrow_view(
    view: &TensorView,
    placement: &BufferPlacement,
    rank: u32,
) -> Result<TensorView, String> {
    let esize = view.dtype().size_bytes() as u64;
    let stride = placement.rank_stride;
    let whole = view.ndims() >= 2
        && view.shape()[0] == u64::from(placement.nranks)
        && view.strides()[0] * esize == stride
        && view.byte_offset() < stride;
    if whole {
        return TensorView::new(
            view.dtype(),
            &view.shape()[1..],
            &view.strides()[1..],
            view.byte_offset() + u64::from(rank) * stride,
        )
        .map_err(|e| e.to_string());
    }
    let (lo, hi) = view.byte_span();
    let copy = lo / stride;
    if hi > (copy + 1) * stride {
        return Err(format!(
            "its view spans several ranks' copies without being the whole window ([{}, ...shape], as the WindowTensor gives it): pass the window itself",
            placement.nranks
        ));
    }
    if copy != u64::from(rank) {
        return Err(format!(
            "it names domain rank {copy}'s copy, but the task runs on domain rank {rank}: a chip task takes its own rank's copy (pass the window itself; the kernel reaches peers' copies through ctx.window)"
        ));
    }
    Ok(*view)
}

// ----- builtin chip orchestrations and kernels --------------------------------------------

/// A chip orchestration that runs `kernel` once with the task's tensors (tagged `tags`) and
/// scalars.
fn forward(
    registry: &mut strata_chip::Registry,
    name: &str,
    tags: &'static [ArgTag],
    kernel: impl Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static,
) -> Result<OrchHandle, DistError> {
    let k = registry.register_kernel(
        CallableDescriptor::new(CallableKind::Kernel, format!("strata.comm.{name}")),
        kernel,
    )?;
    Ok(registry.register_orchestration(
        CallableDescriptor::new(
            CallableKind::ChipOrchestration,
            format!("strata.comm.{name}"),
        ),
        move |o, a| {
            let mut core = CoreArgs::new();
            for (i, tag) in tags.iter().enumerate() {
                core.tensor(&a.tensor(i)?, *tag);
            }
            for i in 0..a.scalar_count() {
                core.scalar_bits(a.scalar::<u64>(i)?);
            }
            o.submit_aiv(k, &core)?;
            Ok(())
        },
    )?)
}

fn op_of(code: u64) -> Result<ReduceOp, KernelError> {
    ReduceOp::from_code(code)
        .ok_or_else(|| KernelError::new(format!("unknown reduce op code {code}")))
}

/// Copies between a kernel's host tensor (argument 0) and its window copy (argument 1) of
/// the same type and length.
fn stage_typed<T: Element>(
    ctx: &mut KernelCtx<'_>,
    w: &strata_comm::Window<'_>,
    into_window: bool,
) -> CallbackResult {
    if into_window {
        let data = ctx.input::<T>(0)?.to_vec();
        w.write(w.rank(), 0, &data)?;
    } else {
        let mut out = ctx.output::<T>(0)?;
        // SAFETY: `Element` types are plain old data: all-zero bytes are a valid value.
        let zero: T = unsafe { std::mem::zeroed() };
        let mut tmp = vec![zero; out.numel()];
        w.read(w.rank(), 0, &mut tmp)?;
        out.copy_from_slice(&tmp)?;
    }
    Ok(())
}

fn stage_kernel(ctx: &mut KernelCtx<'_>, into_window: bool) -> CallbackResult {
    let w = ctx.window(1)?;
    macro_rules! by_dtype {
        ($($t:ty => $d:ident),*) => {
            match w.dtype() {
                $(DataType::$d => stage_typed::<$t>(ctx, &w, into_window),)*
                other => Err(format!("staging {other} windows is not supported").into()),
            }
        };
    }
    by_dtype!(u8 => U8, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u32 => U32,
              u64 => U64, strata_types::f16 => F16, strata_types::bf16 => BF16, f32 => F32, f64 => F64)
}

const DATA: &[ArgTag] = &[ArgTag::InOut];
const STAGE_TARGET: &[ArgTag] = &[ArgTag::Input, ArgTag::InOut];

fn register_builtins(registry: &mut strata_chip::Registry) -> Result<Builtins, DistError> {
    Ok(Builtins {
        allreduce: forward(registry, "allreduce", DATA, |ctx| {
            let op = op_of(ctx.scalar::<u64>(0)?)?;
            let code = ctx.scalar::<u64>(1)?;
            let algo = AllreduceAlgo::from_code(code).ok_or_else(|| {
                KernelError::new(format!("unknown allreduce algorithm code {code}"))
            })?;
            ctx.window(0)?.allreduce(op, algo)?;
            Ok(())
        })?,
        broadcast: forward(registry, "broadcast", DATA, |ctx| {
            let root = ctx.scalar::<u64>(0)? as u32;
            ctx.window(0)?.broadcast(root)?;
            Ok(())
        })?,
        allgather: forward(registry, "allgather", STAGE_TARGET, |ctx| {
            ctx.window(0)?.allgather(&ctx.window(1)?)?;
            Ok(())
        })?,
        reduce_scatter: forward(registry, "reduce_scatter", DATA, |ctx| {
            let op = op_of(ctx.scalar::<u64>(0)?)?;
            ctx.window(0)?.reduce_scatter(op)?;
            Ok(())
        })?,
        all_to_all: forward(registry, "all_to_all", STAGE_TARGET, |ctx| {
            ctx.window(0)?.all_to_all(&ctx.window(1)?)?;
            Ok(())
        })?,
        barrier: forward(registry, "barrier", DATA, |ctx| {
            ctx.window(0)?.barrier()?;
            Ok(())
        })?,
        stage_in: forward(
            registry,
            "stage_in",
            &[ArgTag::Input, ArgTag::OutputExisting],
            |ctx| stage_kernel(ctx, true),
        )?,
        stage_out: forward(
            registry,
            "stage_out",
            &[ArgTag::OutputExisting, ArgTag::Input],
            |ctx| stage_kernel(ctx, false),
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(nranks: u32) -> BufferPlacement {
        BufferPlacement {
            arena_offset: 72 << 10,
            rank_stride: 2048,
            data_bytes: 256,
            nranks,
        }
    }

    #[test]
    fn a_whole_window_narrows_to_each_ranks_copy_and_other_views_are_checked() {
        let p = placement(3);
        // The whole window [3, 2, 4] f32 at byte 64 of each copy (rank stride 512 f32).
        let whole = TensorView::new(DataType::F32, &[3, 2, 4], &[512, 4, 1], 64).unwrap();
        for rank in 0..3u32 {
            let v = narrow_view(&whole, &p, rank).unwrap();
            assert_eq!(v.shape(), &[2, 4]);
            assert_eq!(v.strides(), &[4, 1]);
            assert_eq!(v.byte_offset(), 64 + 2048 * u64::from(rank));
        }
        // A rank's own copy passes as it is; another rank's copy is refused.
        let own = TensorView::new(DataType::F32, &[2, 4], &[4, 1], 2048 + 64).unwrap();
        assert_eq!(narrow_view(&own, &p, 1).unwrap(), own);
        let e = narrow_view(&own, &p, 2).unwrap_err();
        assert!(
            e.contains("domain rank 1's copy") && e.contains("domain rank 2"),
            "{e}"
        );
        // A view over two copies that is not the whole window.
        let two = TensorView::new(DataType::F32, &[2, 8], &[512, 1], 0).unwrap();
        assert!(narrow_view(&two, &p, 0)
            .unwrap_err()
            .contains("several ranks"));
        // One rank: the whole window [1, 1, 1] is not confused with a copy of shape
        // [1, 1]: a copy's leading stride never spans a whole rank stride (the signal area
        // follows the data).
        let p1 = placement(1);
        let whole1 = TensorView::new(DataType::I32, &[1, 1, 1], &[512, 1, 1], 0).unwrap();
        assert_eq!(narrow_view(&whole1, &p1, 0).unwrap().shape(), &[1, 1]);
        let copy1 = TensorView::contiguous(DataType::I32, &[1, 1]).unwrap();
        assert_eq!(narrow_view(&copy1, &p1, 0).unwrap().shape(), &[1, 1]);
    }
}
