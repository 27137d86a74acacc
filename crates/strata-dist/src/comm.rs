//! Distributed memory for the chips of a level-3 worker (strata-comm, `docs/comm.md`): the
//! comm arena every chip child maps, the window buffers of a run and the rules for keeping
//! them ([`WindowLifetime`]), window tensors as task arguments, and the builtin chip
//! orchestrations behind the host-level collectives. The orchestration's window API
//! (`Orch::alloc_window_buffer`, `Orch::allreduce`, …) is in `orch/windows.rs`: it waits
//! for the run's turn and submits the builtins, and reaches this state only through
//! [`CommCtx::claim`], so the comm state knows nothing of the orchestration.
//!
//! Windows reach kernels by name: a [`WindowTensor`] pushes the four scalars of its
//! [`DistributedTensor`] into a task's arguments, and the kernel opens it with
//! `strata_comm::Comm::from_kernel(ctx)?.window(&DistributedTensor::from_scalars(..)?)`.
//! As a *tensor* argument ([`WindowTensor::arg`]) a window only orders tasks (it is the
//! comm arena's shared memory, tracked like any other); next-level tasks do not receive it
//! as a kernel tensor — the kernel reaches the window in place, which is what lets peers
//! write into it while the kernel runs.

use crate::config::WindowLifetime;
use crate::error::DistError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use strata_chip::{CoreArgs, KernelCtx, KernelError, OrchHandle};
use strata_comm::{
    AllreduceAlgo, BufferPlacement, Comm, CommAllocator, CommArena, CommError, CommStats,
    DistributedTensor, Domain, ReduceOp, WindowBuffer,
};
use strata_graph::RunId;
use strata_types::{
    ArgTag, BufferDesc, BufferIdentity, BufferLocation, CallableDescriptor, CallableKind,
    CallbackResult, DataType, Element, IdentityMinter, IntoTensorArg, TaskArgs, TensorArg,
    TensorView, TypesError,
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

    /// Whether `desc` is exactly the descriptor of a window buffer allocated now (of the
    /// run that owns the windows, or persistent).
    pub(crate) fn window_live(&self, desc: &BufferDesc) -> bool {
        let st = self.lock();
        let BufferLocation::HostShared { offset, .. } = desc.location() else {
            return false;
        };
        st.identities.iter().any(|(buf, id)| {
            *id == desc.identity()
                && st.alloc.placement(buf).is_ok_and(|p| {
                    p.arena_offset == offset
                        && Some(desc.nbytes()) == p.rank_stride.checked_mul(u64::from(p.nranks))
                })
        })
    }

    /// Frees every window buffer, persistent ones included (at close).
    pub(crate) fn release_all(&self) {
        let mut st = self.lock();
        st.alloc.end_run();
        st.alloc.release_persistent();
        st.kept.clear();
        st.identities.clear();
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
        st.identities.entry(buf).or_insert_with(|| minter.mint());
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

/// A window tensor as a host orchestration holds it: the [`DistributedTensor`] kernels open
/// on every rank, and what the engine needs to order tasks that touch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowTensor {
    tensor: DistributedTensor,
    domain: Domain,
    identity: BufferIdentity,
    region: u64,
    placement: BufferPlacement,
}

impl WindowTensor {
    /// The tensor kernels open (`Comm::window`); the same on every rank.
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
        // admitted only while it is live (`CommCtx::window_live`).
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

    /// The tensor on every rank as a task argument: a task that names it is ordered
    /// against every other task touching those bytes (`tag` says how it touches them). A
    /// next-level task does not receive it as a kernel tensor (push the tensor's scalars
    /// with [`WindowTensor::push_to`] so the kernel can open the window); a sub-worker
    /// sees it as a `[nranks, numel]` view.
    pub fn arg(&self, tag: ArgTag) -> TensorArg {
        let esize = self.tensor.dtype().size_bytes() as u64;
        let view = TensorView::new(
            self.tensor.dtype(),
            &[u64::from(self.placement.nranks), self.tensor.numel()],
            &[self.placement.rank_stride / esize, 1],
            self.tensor.byte_offset(),
        )
        .unwrap_or_else(|_| unreachable!("a live window's geometry is valid"));
        TensorArg {
            buffer: self.buffer(),
            view,
            tag,
        }
    }

    /// Domain rank `rank`'s copy as a task argument (see [`WindowTensor::arg`]).
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
        let view = TensorView::new(
            self.tensor.dtype(),
            &[self.tensor.numel()],
            &[1],
            u64::from(rank) * self.placement.rank_stride + self.tensor.byte_offset(),
        )?;
        Ok(TensorArg {
            buffer: self.buffer(),
            view,
            tag,
        })
    }

    /// Appends the tensor's scalars ([`DistributedTensor::SCALARS`] of them) to `args`.
    ///
    /// # Errors
    /// Too many scalars.
    pub fn push_to(&self, args: &mut TaskArgs) -> Result<(), DistError> {
        Ok(self.tensor.push_to(args)?)
    }
}

/// The tensor on every rank ([`WindowTensor::arg`]), for [`strata_types::TaskArgs`]'
/// chaining methods.
impl IntoTensorArg for &WindowTensor {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError> {
        Ok(self.arg(tag))
    }
}

// ----- builtin chip orchestrations and kernels --------------------------------------------

fn tensor_at(ctx: &KernelCtx<'_>, i: usize) -> Result<DistributedTensor, KernelError> {
    let s = ctx.scalars();
    let start = i * DistributedTensor::SCALARS;
    let cells = s.get(start..).unwrap_or(&[]);
    Ok(DistributedTensor::from_scalars(cells)?)
}

fn extra(ctx: &KernelCtx<'_>, windows: usize, i: usize) -> Result<u64, KernelError> {
    ctx.scalar::<u64>(windows * DistributedTensor::SCALARS + i)
}

/// A chip orchestration that runs `kernel` once with the task's scalars.
fn forward(
    registry: &mut strata_chip::Registry,
    name: &str,
    tensor_tag: Option<ArgTag>,
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
            if let Some(tag) = tensor_tag {
                core.tensor(&a.tensor(0)?, tag);
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

/// Copies between a kernel tensor and a window copy of the same type and length.
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
    let t = tensor_at(ctx, 0)?;
    let comm = Comm::from_kernel(ctx)?;
    let w = comm.window(&t)?;
    macro_rules! by_dtype {
        ($($t:ty => $d:ident),*) => {
            match t.dtype() {
                $(DataType::$d => stage_typed::<$t>(ctx, &w, into_window),)*
                other => Err(format!("staging {other} windows is not supported").into()),
            }
        };
    }
    by_dtype!(u8 => U8, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u32 => U32,
              u64 => U64, strata_types::f16 => F16, strata_types::bf16 => BF16, f32 => F32, f64 => F64)
}

fn register_builtins(registry: &mut strata_chip::Registry) -> Result<Builtins, DistError> {
    Ok(Builtins {
        allreduce: forward(registry, "allreduce", None, |ctx| {
            let (d, s) = (tensor_at(ctx, 0)?, tensor_at(ctx, 1)?);
            let op = op_of(extra(ctx, 2, 0)?)?;
            let code = extra(ctx, 2, 1)?;
            let algo = AllreduceAlgo::from_code(code).ok_or_else(|| {
                KernelError::new(format!("unknown allreduce algorithm code {code}"))
            })?;
            let comm = Comm::from_kernel(ctx)?;
            comm.window(&d)?.allreduce(&comm.window(&s)?, op, algo)?;
            Ok(())
        })?,
        broadcast: forward(registry, "broadcast", None, |ctx| {
            let (d, s) = (tensor_at(ctx, 0)?, tensor_at(ctx, 1)?);
            let root = extra(ctx, 2, 0)? as u32;
            let comm = Comm::from_kernel(ctx)?;
            comm.window(&d)?.broadcast(&comm.window(&s)?, root)?;
            Ok(())
        })?,
        allgather: forward(registry, "allgather", None, |ctx| {
            let (st, tg, sg) = (tensor_at(ctx, 0)?, tensor_at(ctx, 1)?, tensor_at(ctx, 2)?);
            let comm = Comm::from_kernel(ctx)?;
            strata_comm::Window::allgather(
                &comm.window(&st)?,
                &comm.window(&tg)?,
                &comm.window(&sg)?,
            )?;
            Ok(())
        })?,
        reduce_scatter: forward(registry, "reduce_scatter", None, |ctx| {
            let (d, s) = (tensor_at(ctx, 0)?, tensor_at(ctx, 1)?);
            let op = op_of(extra(ctx, 2, 0)?)?;
            let comm = Comm::from_kernel(ctx)?;
            comm.window(&d)?.reduce_scatter(&comm.window(&s)?, op)?;
            Ok(())
        })?,
        all_to_all: forward(registry, "all_to_all", None, |ctx| {
            let (st, tg, sg) = (tensor_at(ctx, 0)?, tensor_at(ctx, 1)?, tensor_at(ctx, 2)?);
            let comm = Comm::from_kernel(ctx)?;
            strata_comm::Window::all_to_all(
                &comm.window(&st)?,
                &comm.window(&tg)?,
                &comm.window(&sg)?,
            )?;
            Ok(())
        })?,
        barrier: forward(registry, "barrier", None, |ctx| {
            let s = tensor_at(ctx, 0)?;
            Comm::from_kernel(ctx)?.window(&s)?.barrier()?;
            Ok(())
        })?,
        stage_in: forward(registry, "stage_in", Some(ArgTag::Input), |ctx| {
            stage_kernel(ctx, true)
        })?,
        stage_out: forward(registry, "stage_out", Some(ArgTag::OutputExisting), |ctx| {
            stage_kernel(ctx, false)
        })?,
    })
}
