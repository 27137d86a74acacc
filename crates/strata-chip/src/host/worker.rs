//! [`ChipWorker`]: the L2 chip — lifecycle, device memory, callable registration, runs.

use crate::aicore::core_loop::{core_main, CoreEnv};
use crate::aicore::kernel::KernelCtx;
use crate::aicore::kernels::{KernelHandle, KernelTable, RunEnv};
use crate::aicore::link::CoreLink;
use crate::aicpu::orch::{
    wait_reply, ChipArgs, ChipOrch, OrchLink, OrchMsg, OrchReply, OrchRequest,
};
use crate::aicpu::registry::{OrchHandle, Registry};
use crate::aicpu::sched::{RunCtl, Sched, SchedCell, SchedMsg, SchedReport, SchedShared, Topology};
use crate::aicpu::stall::Watchdog;
use crate::aicpu::tensor::ChipTensor;
use crate::config::{ChipConfig, CoreType, OrchestratorPlacement, RingSizing};
use crate::device::arena::{as_bytes, as_bytes_mut};
use crate::device::memory::{DeviceMemory, DevicePtr, DeviceTensor};
use crate::error::{codes, ChipError, KernelError};
use crate::trace::strace::{mono_ns, next_invocation, strace_text, thread_id, RunTiming, Span};
use crate::trace::swimlane::Swimlane;
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use strata_graph::{graph, BufferKey, GraphConfig, KeySpace, RingConfig};
use strata_types::{
    ArgTag, CallConfig, CallableDescriptor, CallableId, CallableKind, DataType, Element,
    IdentityMinter, OwnerNonce, ParamDirection, Scalar, TensorView, RING_COUNT,
};

/// Byte offsets of a host ↔ device copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyOffsets {
    /// Offset added to the device pointer.
    pub device: u64,
    /// Offset into the host slice, in bytes.
    pub host: usize,
}

/// How [`ChipWorker::alloc_tensor`] initialises a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorInit {
    /// Leave the contents undefined.
    Undefined,
    /// Fill with zero bytes.
    Zeros,
    /// Fill with one element value (its raw bits and type).
    Value(DataType, [u8; 8]),
}

impl TensorInit {
    /// Fill with `v` (the tensor's data type must be `T`'s).
    pub fn value<T: Element>(v: T) -> Self {
        let mut b = [0u8; 8];
        b[..std::mem::size_of::<T>()].copy_from_slice(as_bytes(std::slice::from_ref(&v)));
        TensorInit::Value(T::DTYPE, b)
    }
}

enum RunArg<'a> {
    HostIn {
        bytes: &'a [u8],
        view: TensorView,
    },
    HostOut {
        bytes: &'a mut [u8],
        view: TensorView,
        inout: bool,
    },
    Device {
        t: DeviceTensor,
        tag: ArgTag,
    },
    /// A host tensor given by a raw pointer and a (possibly strided) view of it: gathered
    /// into staging before the run, scattered back after a successful one.
    HostRaw {
        base: *mut u8,
        view: TensorView,
        tag: ArgTag,
    },
}

/// The arguments of one run: host tensors (staged into device memory: `IN`/`INOUT` copied
/// in before the run, `OUT`/`INOUT` copied back only if the run succeeded), device
/// tensors (passed in place), then scalars.
///
/// ```
/// use strata_chip::RunArgs;
/// let a = vec![1.0f32; 16];
/// let mut out = vec![0.0f32; 16];
/// let mut args = RunArgs::new();
/// args.input(&a, &[4, 4]).output(&mut out, &[4, 4]).scalar(3u32);
/// assert_eq!(args.len(), 3);
/// ```
#[derive(Default)]
pub struct RunArgs<'a> {
    tensors: Vec<RunArg<'a>>,
    scalars: Vec<u64>,
    error: Option<String>,
}

impl std::fmt::Debug for RunArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunArgs")
            .field("tensors", &self.tensors.len())
            .field("scalars", &self.scalars.len())
            .finish()
    }
}

impl<'a> RunArgs<'a> {
    /// No arguments.
    pub fn new() -> Self {
        RunArgs::default()
    }

    fn fail(&mut self, m: String) {
        if self.error.is_none() {
            self.error = Some(m);
        }
    }

    fn view_for<T: Element>(&mut self, len: usize, shape: &[u64]) -> Option<TensorView> {
        match TensorView::contiguous(T::DTYPE, shape) {
            Ok(v) if v.numel() == len as u64 => Some(v),
            Ok(v) => {
                self.fail(format!(
                    "host tensor {} has {len} elements but shape {shape:?} needs {}",
                    self.tensors.len(),
                    v.numel()
                ));
                None
            }
            Err(e) => {
                self.fail(format!("host tensor {}: {e}", self.tensors.len()));
                None
            }
        }
    }

    fn check_order(&mut self) -> bool {
        if !self.scalars.is_empty() {
            self.fail("tensor arguments must come before scalars".into());
            return false;
        }
        true
    }

    /// A host tensor the orchestration reads (copied to the device before the run).
    pub fn input<T: Element>(&mut self, data: &'a [T], shape: &[u64]) -> &mut Self {
        if self.check_order() {
            if let Some(view) = self.view_for::<T>(data.len(), shape) {
                self.tensors.push(RunArg::HostIn {
                    bytes: as_bytes(data),
                    view,
                });
            }
        }
        self
    }

    /// A host tensor the run writes (copied back after a successful run; its device copy
    /// starts undefined).
    pub fn output<T: Element>(&mut self, data: &'a mut [T], shape: &[u64]) -> &mut Self {
        if self.check_order() {
            if let Some(view) = self.view_for::<T>(data.len(), shape) {
                self.tensors.push(RunArg::HostOut {
                    bytes: as_bytes_mut(data),
                    view,
                    inout: false,
                });
            }
        }
        self
    }

    /// A host tensor the run reads and writes (copied in, and back after success).
    pub fn inout<T: Element>(&mut self, data: &'a mut [T], shape: &[u64]) -> &mut Self {
        if self.check_order() {
            if let Some(view) = self.view_for::<T>(data.len(), shape) {
                self.tensors.push(RunArg::HostOut {
                    bytes: as_bytes_mut(data),
                    view,
                    inout: true,
                });
            }
        }
        self
    }

    /// A tensor resident in device memory, passed in place (never copied). `tag` is its
    /// direction for the signature check (`Input`, `OutputExisting`/`Output`, `InOut`).
    pub fn device(&mut self, t: &DeviceTensor, tag: ArgTag) -> &mut Self {
        if self.check_order() {
            self.tensors.push(RunArg::Device { t: *t, tag });
        }
        self
    }

    /// A host tensor given by the base address of its buffer and a view of that buffer
    /// (strides and byte offset honoured): the view's elements are gathered into device
    /// memory before the run if `tag` reads, and scattered back after a successful run if
    /// `tag` writes. No Rust reference to the buffer is ever formed, so it may be memory
    /// another process maps too (a worker's shared memory).
    ///
    /// # Safety
    /// `base .. base + view.byte_span().1` must stay valid for reads (and, for a writing
    /// tag, for writes) until `run` returns, and nothing else may write the view's bytes
    /// meanwhile.
    pub unsafe fn host_raw(&mut self, base: *mut u8, view: TensorView, tag: ArgTag) -> &mut Self {
        if self.check_order() {
            self.tensors.push(RunArg::HostRaw { base, view, tag });
        }
        self
    }

    /// A scalar.
    pub fn scalar<S: Scalar>(&mut self, v: S) -> &mut Self {
        self.scalars.push(v.to_bits());
        self
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.tensors.len() + self.scalars.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a successful run reports.
///
/// The run's `[STRACE]` timing is recorded as a few raw timestamps; [`RunReport::spans`]
/// and [`RunReport::strace`] build the spans and their text only when asked for, so a run
/// whose trace nobody reads does not pay for formatting it.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    timing: Option<RunTiming>,
    /// The swimlane, when [`CallConfig::swimlane`] was 1.
    pub swimlane: Option<Swimlane>,
    /// Tasks the orchestration submitted (including dependency-only and allocation tasks).
    pub tasks: u64,
    /// Kernel invocations dispatched to cores.
    pub dispatches: u64,
    /// Notes about cores taken out of or returned to service.
    pub notes: Vec<String>,
}

impl RunReport {
    /// The run's `[STRACE]` spans, children first (empty for a default report).
    pub fn spans(&self) -> Vec<Span> {
        self.timing
            .as_ref()
            .map(RunTiming::spans)
            .unwrap_or_default()
    }

    /// The same spans as `[STRACE]` lines (what [`crate::parse_strace`] reads back).
    pub fn strace(&self) -> String {
        strace_text(&self.spans())
    }
}

struct Live {
    mem: Arc<DeviceMemory>,
    shared: Arc<SchedShared>,
    links: Vec<Arc<CoreLink>>,
    orch_link: Arc<OrchLink>,
    orch_thread: Option<JoinHandle<()>>,
    /// Under [`OrchestratorPlacement::Caller`]: the orchestrator `run` drives on its own
    /// thread, and the watchdog that ends the process if an orchestration stalls.
    inline: Option<(Box<ChipOrch>, Watchdog)>,
    sched: Arc<SchedCell>,
    sched_thread: Option<JoinHandle<()>>,
    core_threads: Vec<Option<JoinHandle<()>>>,
    heartbeat: Arc<AtomicU64>,
    rings_current: [RingSizing; RING_COUNT],
    ring_regions: [Option<(DevicePtr, u64)>; RING_COUNT],
    staging: Option<(DevicePtr, u64)>,
    staged_ids: IdentityMinter,
    /// The run environment the cores hold (rebuilt only when the registry or the comm
    /// context changed).
    env: Arc<RunEnv>,
    /// This process's id, for the trace (read once: `getpid` is a system call).
    pid: u32,
    /// `ChipConfig::print_strace`, or `STRATA_STRACE=1` when `init` ran.
    print_strace: bool,
}

/// One emulated chip (L2): device memory, registered kernels and chip orchestrations, an
/// AICPU orchestrator thread (or the caller's thread, see
/// [`OrchestratorPlacement`](crate::OrchestratorPlacement)), an AICPU scheduler thread and
/// one thread per AICore.
///
/// Lifecycle: [`ChipWorker::new`] → register callables → [`ChipWorker::init`] → any number
/// of [`ChipWorker::run`]s → [`ChipWorker::close`] (also on drop).
///
/// ```
/// use strata_chip::*;
/// use strata_types::{CallConfig, DataType};
///
/// let mut chip = ChipWorker::new(ChipConfig::default())?;
/// let add = chip.register_kernel_fn("add", |ctx: &mut KernelCtx| {
///     let (a, b) = (ctx.input::<f32>(0)?, ctx.input::<f32>(1)?);
///     let mut out = ctx.output::<f32>(2)?;
///     let (a, b) = (a.as_slice().unwrap(), b.as_slice().unwrap());
///     for (o, (x, y)) in out.as_mut_slice().unwrap().iter_mut().zip(a.iter().zip(b)) {
///         *o = x + y;
///     }
///     Ok(())
/// })?;
/// let orch = chip.register_orchestration_fn("vadd", move |o: &mut ChipOrch, args: &ChipArgs| {
///     let mut a = CoreArgs::new();
///     a.input(&args.tensor(0)?).input(&args.tensor(1)?).output(&args.tensor(2)?);
///     o.submit_aiv(add, &a)?;
///     Ok(())
/// })?;
/// chip.init()?;
/// let (x, y) = (vec![1.0f32; 64], vec![2.0f32; 64]);
/// let mut z = vec![0.0f32; 64];
/// let mut args = RunArgs::new();
/// args.input(&x, &[64]).input(&y, &[64]).output(&mut z, &[64]);
/// chip.run(&orch, &mut args, &CallConfig::default())?;
/// assert!(z.iter().all(|&v| v == 3.0));
/// chip.close()?;
/// # Ok::<(), ChipError>(())
/// ```
pub struct ChipWorker {
    config: ChipConfig,
    registry: Registry,
    /// The registry's kernels as the last run saw them (rebuilt after a registration
    /// change), shared with the cores through the run environment.
    kernels_snapshot: Option<Arc<KernelTable>>,
    nonce: u64,
    live: Option<Live>,
    closed: bool,
    unusable: Option<String>,
    comm: Option<Arc<dyn Any + Send + Sync>>,
    /// The run environment's epoch (bumped when the registry or comm context changes).
    epoch: u64,
    /// Runs started (tags the scheduler's report of a run).
    runs: u64,
}

impl std::fmt::Debug for ChipWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChipWorker")
            .field("chip_id", &self.config.chip_id)
            .field("initialized", &self.live.is_some())
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl ChipWorker {
    /// A chip with an empty registry. Nothing runs until [`ChipWorker::init`].
    ///
    /// # Errors
    /// [`ChipError::InvalidConfig`].
    pub fn new(config: ChipConfig) -> Result<Self, ChipError> {
        Self::with_registry(config, Registry::new())
    }

    /// A chip with a registry built elsewhere (e.g. cloned before forking chip children).
    ///
    /// # Errors
    /// [`ChipError::InvalidConfig`].
    pub fn with_registry(config: ChipConfig, registry: Registry) -> Result<Self, ChipError> {
        config.validate()?;
        Ok(ChipWorker {
            config,
            registry,
            kernels_snapshot: None,
            nonce: OwnerNonce::fresh().0,
            live: None,
            closed: false,
            unusable: None,
            comm: None,
            epoch: 0,
            runs: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ChipConfig {
        &self.config
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// This chip's nonce (device handles carry it).
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    fn before_init(&self, name: &str) -> Result<(), ChipError> {
        if self.closed {
            return Err(ChipError::Closed { op: "register" });
        }
        if self.live.is_some() {
            return Err(ChipError::RegisterAfterInit {
                name: name.to_owned(),
            });
        }
        Ok(())
    }

    /// Registers a kernel (before `init`). The same descriptor twice yields the same handle.
    ///
    /// # Errors
    /// [`ChipError::RegisterAfterInit`], and those of [`Registry::register_kernel`].
    pub fn register_kernel<F>(
        &mut self,
        desc: CallableDescriptor,
        f: F,
    ) -> Result<KernelHandle, ChipError>
    where
        F: Fn(&mut KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync + 'static,
    {
        self.before_init(desc.name())?;
        self.kernels_snapshot = None;
        self.registry.register_kernel(desc, f)
    }

    /// Registers a kernel under a descriptor with just a name.
    ///
    /// # Errors
    /// As [`ChipWorker::register_kernel`].
    pub fn register_kernel_fn<F>(&mut self, name: &str, f: F) -> Result<KernelHandle, ChipError>
    where
        F: Fn(&mut KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync + 'static,
    {
        self.register_kernel(CallableDescriptor::new(CallableKind::Kernel, name), f)
    }

    /// Registers a chip orchestration (before `init`).
    ///
    /// # Errors
    /// [`ChipError::RegisterAfterInit`], and those of [`Registry::register_orchestration`].
    pub fn register_orchestration<F>(
        &mut self,
        desc: CallableDescriptor,
        f: F,
    ) -> Result<OrchHandle, ChipError>
    where
        F: Fn(&mut ChipOrch, &ChipArgs) -> Result<(), ChipError> + Send + Sync + 'static,
    {
        self.before_init(desc.name())?;
        self.kernels_snapshot = None;
        self.registry.register_orchestration(desc, f)
    }

    /// Registers a chip orchestration under a descriptor with just a name (no signature
    /// check).
    ///
    /// # Errors
    /// As [`ChipWorker::register_orchestration`].
    pub fn register_orchestration_fn<F>(
        &mut self,
        name: &str,
        f: F,
    ) -> Result<OrchHandle, ChipError>
    where
        F: Fn(&mut ChipOrch, &ChipArgs) -> Result<(), ChipError> + Send + Sync + 'static,
    {
        self.register_orchestration(
            CallableDescriptor::new(CallableKind::ChipOrchestration, name),
            f,
        )
    }

    /// Removes a kernel or orchestration (allowed at any time between runs).
    ///
    /// # Errors
    /// [`ChipError::UnknownCallable`].
    pub fn unregister(&mut self, id: &CallableId) -> Result<(), ChipError> {
        self.kernels_snapshot = None;
        self.registry.unregister(id)
    }

    /// Gives kernels a communication context ([`KernelCtx::comm`]) for the following runs
    /// (strata-comm's hook for distributed kernels).
    pub fn set_comm_context(&mut self, ctx: Option<Arc<dyn Any + Send + Sync>>) {
        self.comm = ctx;
    }

    /// Whether `init` has run (and `close` has not).
    pub fn is_initialized(&self) -> bool {
        self.live.is_some()
    }

    /// Maps device memory and starts the threads: one per core, the scheduler and the
    /// orchestrator. Threads that wait spin briefly, then park: an idle chip uses no CPU.
    ///
    /// # Errors
    /// [`ChipError::AlreadyInitialized`], [`ChipError::Closed`], or a failure to map
    /// memory or start threads.
    pub fn init(&mut self) -> Result<(), ChipError> {
        if self.closed {
            return Err(ChipError::Closed { op: "init" });
        }
        if self.live.is_some() {
            return Err(ChipError::AlreadyInitialized);
        }
        let cfg = &self.config;
        let mem = Arc::new(DeviceMemory::new(cfg.device_memory_bytes, self.nonce)?);
        let rings: [RingConfig; RING_COUNT] = std::array::from_fn(|i| cfg.rings[i].graph());
        let (g_orch, g_sched) = graph(GraphConfig {
            rings,
            wait_timeout: cfg.ring_wait_timeout,
            pipeline_depth: 1,
        })
        .map_err(|e| ChipError::InvalidConfig(e.to_string()))?;
        let n = cfg.num_cores() as usize;
        let topo = Topology::new(cfg.aic_cores, cfg.aiv_cores);
        let shared = Arc::new(SchedShared::new(n));
        let env = Arc::new(RunEnv::empty());
        let links: Vec<Arc<CoreLink>> = (0..n)
            .map(|_| Arc::new(CoreLink::new(env.clone())))
            .collect();
        let spawn_err = |what: String, e: std::io::Error| {
            ChipError::Unusable(format!("could not start {what}: {e}"))
        };
        let mut core_threads: Vec<Option<JoinHandle<()>>> = Vec::with_capacity(n);
        for (i, link) in links.iter().enumerate() {
            let ty = topo.types[i];
            let env = CoreEnv {
                id: i as u32,
                ty,
                link: link.clone(),
                sched_bell: shared.bell.clone(),
                arena: mem.arena.clone(),
                idle_spin: cfg.idle_spin,
            };
            let name = format!("chip{}-{}{}", cfg.chip_id, ty.name().to_lowercase(), i);
            match std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || core_main(env))
            {
                Ok(h) => core_threads.push(Some(h)),
                Err(e) => {
                    stop_started(&links, core_threads, None);
                    return Err(spawn_err(name, e));
                }
            }
        }
        let sched = SchedCell::new(Sched::new(
            g_sched,
            shared.clone(),
            links.clone(),
            topo.clone(),
            cfg.kernel_timeout,
            env.clone(),
        ));
        let cell = sched.clone();
        let sched_thread = match std::thread::Builder::new()
            .name(format!("chip{}-sched", cfg.chip_id))
            .spawn(move || cell.thread_main())
        {
            Ok(h) => h,
            Err(e) => {
                stop_started(&links, core_threads, None);
                return Err(spawn_err("the scheduler".into(), e));
            }
        };
        let heartbeat = Arc::new(AtomicU64::new(0));
        let orch = ChipOrch::new(
            g_orch,
            mem.arena.clone(),
            shared.clone(),
            topo.clone(),
            cfg.chip_id,
            cfg.tensor_wait_timeout,
            heartbeat.clone(),
            sched.clone(),
        );
        let orch_link = Arc::new(OrchLink::default());
        let started = match cfg.orchestrator.resolve(false) {
            OrchestratorPlacement::Thread | OrchestratorPlacement::Auto => {
                let link = orch_link.clone();
                let idle_spin = cfg.idle_spin;
                std::thread::Builder::new()
                    .name(format!("chip{}-orch", cfg.chip_id))
                    .spawn(move || orch.main(link, idle_spin))
                    .map(|t| (Some(t), None))
                    .map_err(|e| spawn_err("the orchestrator".into(), e))
            }
            OrchestratorPlacement::Caller => {
                Watchdog::spawn(cfg.chip_id, heartbeat.clone(), shared.clone())
                    .map(|dog| (None, Some((Box::new(orch), dog))))
                    .map_err(|e| spawn_err("the stall watchdog".into(), e))
            }
        };
        let (orch_thread, inline) = match started {
            Ok(o) => o,
            Err(e) => {
                stop_started(&links, core_threads, Some((&shared, sched_thread)));
                return Err(e);
            }
        };
        let print_strace =
            cfg.print_strace || std::env::var("STRATA_STRACE").is_ok_and(|v| v == "1");
        self.live = Some(Live {
            mem,
            shared,
            links,
            orch_link,
            orch_thread,
            inline,
            sched,
            sched_thread: Some(sched_thread),
            core_threads,
            heartbeat,
            rings_current: cfg.rings,
            ring_regions: [None; RING_COUNT],
            staging: None,
            staged_ids: IdentityMinter::new(),
            env,
            pid: std::process::id(),
            print_strace,
        });
        Ok(())
    }

    fn live(&self, op: &'static str) -> Result<&Live, ChipError> {
        if self.closed {
            return Err(ChipError::Closed { op });
        }
        self.live.as_ref().ok_or(ChipError::NotInitialized { op })
    }

    // ----- device memory -----------------------------------------------------------------

    /// Allocates `bytes` of device memory (rounded up to 1024, 1024-aligned).
    ///
    /// # Errors
    /// [`ChipError::OutOfDeviceMemory`], [`ChipError::ZeroSizedAlloc`].
    pub fn malloc(&self, bytes: u64) -> Result<DevicePtr, ChipError> {
        Ok(self.live("malloc")?.mem.malloc(bytes)?.0)
    }

    /// Frees an allocation by its base pointer.
    ///
    /// # Errors
    /// [`ChipError::DoubleFree`], [`ChipError::StaleHandle`], [`ChipError::InteriorFree`],
    /// [`ChipError::ForeignHandle`].
    pub fn free(&self, ptr: DevicePtr) -> Result<(), ChipError> {
        self.live("free")?.mem.free(&ptr)
    }

    /// Copies `nbytes` from `src` (starting at byte `offsets.host`) to device memory at
    /// `dst + offsets.device`. The range must stay inside one live allocation.
    ///
    /// # Errors
    /// [`ChipError::OutOfRange`], [`ChipError::HostRange`], and the handle errors of
    /// [`ChipWorker::free`].
    pub fn copy_to<T: Element>(
        &self,
        dst: DevicePtr,
        src: &[T],
        nbytes: usize,
        offsets: CopyOffsets,
    ) -> Result<(), ChipError> {
        let live = self.live("copy_to")?;
        let bytes = as_bytes(src);
        let end = offsets
            .host
            .checked_add(nbytes)
            .filter(|&e| e <= bytes.len())
            .ok_or(ChipError::HostRange {
                have: bytes.len(),
                offset: offsets.host,
                end: offsets.host.saturating_add(nbytes),
            })?;
        let p = dst.offset(offsets.device);
        live.mem.check_range(&p, nbytes as u64, "device pointer")?;
        live.mem.arena.write(p.addr, &bytes[offsets.host..end])
    }

    /// Copies `nbytes` from device memory at `src + offsets.device` into `dst` (starting at
    /// byte `offsets.host`).
    ///
    /// # Errors
    /// As [`ChipWorker::copy_to`].
    pub fn copy_from<T: Element>(
        &self,
        dst: &mut [T],
        src: DevicePtr,
        nbytes: usize,
        offsets: CopyOffsets,
    ) -> Result<(), ChipError> {
        let live = self.live("copy_from")?;
        let bytes = as_bytes_mut(dst);
        let have = bytes.len();
        let end = offsets
            .host
            .checked_add(nbytes)
            .filter(|&e| e <= have)
            .ok_or(ChipError::HostRange {
                have,
                offset: offsets.host,
                end: offsets.host.saturating_add(nbytes),
            })?;
        let p = src.offset(offsets.device);
        live.mem.check_range(&p, nbytes as u64, "device pointer")?;
        live.mem.arena.read(p.addr, &mut bytes[offsets.host..end])
    }

    /// The device tensor whose allocation starts at `addr`, seen through `view` (for a
    /// process that received a device address from its parent, which tracks the
    /// allocation's provenance).
    ///
    /// # Errors
    /// [`ChipError::DoubleFree`] if no live allocation starts at `addr`;
    /// [`ChipError::Types`] if the view does not fit it.
    pub fn device_tensor_at(&self, addr: u64, view: TensorView) -> Result<DeviceTensor, ChipError> {
        let live = self.live("device_tensor_at")?;
        let (ptr, size) = live.mem.allocation_at(addr)?;
        view.check_fits(size)?;
        Ok(DeviceTensor { ptr, size, view })
    }

    /// Copies `nbytes` from raw host memory to device memory at `dst`.
    ///
    /// # Safety
    /// `src .. src + nbytes` must be readable, and not written concurrently.
    ///
    /// # Errors
    /// As [`ChipWorker::copy_to`].
    pub unsafe fn copy_to_raw(
        &self,
        dst: DevicePtr,
        src: *const u8,
        nbytes: u64,
    ) -> Result<(), ChipError> {
        let live = self.live("copy_to")?;
        live.mem.check_range(&dst, nbytes, "device pointer")?;
        // SAFETY: forwarded from this function's contract; the device range was checked.
        unsafe { live.mem.arena.write_raw(dst.addr, src, nbytes) }
    }

    /// Copies `nbytes` of device memory at `src` to raw host memory.
    ///
    /// # Safety
    /// `dst .. dst + nbytes` must be writable, and not accessed concurrently.
    ///
    /// # Errors
    /// As [`ChipWorker::copy_from`].
    pub unsafe fn copy_from_raw(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        nbytes: u64,
    ) -> Result<(), ChipError> {
        let live = self.live("copy_from")?;
        live.mem.check_range(&src, nbytes, "device pointer")?;
        // SAFETY: forwarded from this function's contract; the device range was checked.
        unsafe { live.mem.arena.read_raw(src.addr, dst, nbytes) }
    }

    /// Allocates a device-resident tensor of `shape` × `dtype`, initialised per `init`.
    /// It stays on the device across runs (never copied back implicitly).
    ///
    /// # Errors
    /// [`ChipError::Types`] for a bad shape, [`ChipError::DtypeMismatch`] for an initial
    /// value of another type, and allocation errors.
    pub fn alloc_tensor(
        &self,
        shape: &[u64],
        dtype: DataType,
        init: TensorInit,
    ) -> Result<DeviceTensor, ChipError> {
        let live = self.live("alloc_tensor")?;
        let view = TensorView::contiguous(dtype, shape)?;
        if let TensorInit::Value(d, _) = init {
            if d != dtype {
                return Err(ChipError::DtypeMismatch {
                    have: dtype,
                    want: d,
                });
            }
        }
        let (ptr, size) = live.mem.malloc(view.nbytes())?;
        match init {
            TensorInit::Undefined => {}
            TensorInit::Zeros => live.mem.arena.fill(ptr.addr, size, &[0])?,
            TensorInit::Value(_, b) => {
                live.mem
                    .arena
                    .fill(ptr.addr, view.nbytes(), &b[..dtype.size_bytes()])?
            }
        }
        Ok(DeviceTensor { ptr, size, view })
    }

    /// Frees a device tensor.
    ///
    /// # Errors
    /// As [`ChipWorker::free`].
    pub fn free_tensor(&self, t: DeviceTensor) -> Result<(), ChipError> {
        self.live("free_tensor")?.mem.free(&t.ptr)
    }

    fn check_tensor(&self, t: &DeviceTensor, op: &'static str) -> Result<&Live, ChipError> {
        let live = self.live(op)?;
        live.mem.check_range(&t.ptr, t.size, "device tensor")?;
        Ok(live)
    }

    /// Writes a device tensor's elements (row-major over its view).
    ///
    /// # Errors
    /// Handle errors, [`ChipError::DtypeMismatch`], or a length mismatch.
    pub fn write_tensor<T: Element>(&self, t: &DeviceTensor, data: &[T]) -> Result<(), ChipError> {
        let live = self.check_tensor(t, "write_tensor")?;
        if t.view.dtype() != T::DTYPE {
            return Err(ChipError::DtypeMismatch {
                have: t.view.dtype(),
                want: T::DTYPE,
            });
        }
        if data.len() as u64 != t.view.numel() {
            return Err(ChipError::InvalidRunArgs(format!(
                "write_tensor: {} values for a tensor of {} elements",
                data.len(),
                t.view.numel()
            )));
        }
        let bytes = as_bytes(data);
        let mut pos = 0usize;
        for (off, len) in t.view.contiguous_runs() {
            live.mem
                .arena
                .write(t.ptr.addr + off, &bytes[pos..pos + len as usize])?;
            pos += len as usize;
        }
        Ok(())
    }

    /// Reads a device tensor's elements (row-major over its view).
    ///
    /// # Errors
    /// Handle errors, [`ChipError::DtypeMismatch`].
    pub fn read_tensor<T: Element>(&self, t: &DeviceTensor) -> Result<Vec<T>, ChipError> {
        let live = self.check_tensor(t, "read_tensor")?;
        if t.view.dtype() != T::DTYPE {
            return Err(ChipError::DtypeMismatch {
                have: t.view.dtype(),
                want: T::DTYPE,
            });
        }
        let n = t.view.numel() as usize;
        let mut out: Vec<T> = Vec::with_capacity(n);
        // Fill from zeroed bytes first: every bit pattern is a valid `T`.
        out.resize(
            n,
            live.mem
                .arena
                .read_elem::<T>(t.ptr.addr + t.view.byte_offset())?,
        );
        let bytes = as_bytes_mut(&mut out);
        let mut pos = 0usize;
        for (off, len) in t.view.contiguous_runs() {
            live.mem
                .arena
                .read(t.ptr.addr + off, &mut bytes[pos..pos + len as usize])?;
            pos += len as usize;
        }
        Ok(out)
    }

    /// Bytes this chip's allocator holds: user allocations, ring heaps and the retained
    /// staging buffer.
    ///
    /// # Errors
    /// [`ChipError::NotInitialized`].
    pub fn committed_device_memory(&self) -> Result<u64, ChipError> {
        Ok(self.live("committed_device_memory")?.mem.committed())
    }

    /// Free/total device memory of the physical device: not available on the emulator.
    ///
    /// # Errors
    /// Always [`ChipError::DeviceMemoryInfoUnavailable`].
    pub fn device_memory_info(&self) -> Result<(u64, u64), ChipError> {
        Err(ChipError::DeviceMemoryInfoUnavailable)
    }

    /// Cores currently out of service (their kernel exceeded a timeout and has not
    /// returned yet).
    pub fn lost_cores(&self) -> Vec<u32> {
        self.live
            .as_ref()
            .map(|l| {
                (0..l.shared.lost.len() as u32)
                    .filter(|&c| l.shared.lost[c as usize].load(Ordering::Acquire))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The type of each core, by core id (AIC cores first).
    pub fn core_types(&self) -> Vec<CoreType> {
        Topology::new(self.config.aic_cores, self.config.aiv_cores).types
    }

    // ----- runs --------------------------------------------------------------------------

    fn check_signature(desc: &CallableDescriptor, args: &RunArgs<'_>) -> Result<(), ChipError> {
        let sig = desc.signature();
        if sig.is_empty() {
            return Ok(());
        }
        if sig.len() != args.len() {
            return Err(ChipError::InvalidRunArgs(format!(
                "orchestration {:?} takes {} arguments, the run passes {} ({} tensors, {} scalars)",
                desc.name(),
                sig.len(),
                args.len(),
                args.tensors.len(),
                args.scalars.len()
            )));
        }
        for (i, d) in sig.iter().enumerate() {
            let got = match args.tensors.get(i) {
                None => ParamDirection::Scalar,
                Some(RunArg::HostIn { .. }) => ParamDirection::In,
                Some(RunArg::HostOut { inout: false, .. }) => ParamDirection::Out,
                Some(RunArg::HostOut { inout: true, .. }) => ParamDirection::InOut,
                Some(RunArg::Device { tag, .. } | RunArg::HostRaw { tag, .. }) => match tag {
                    ArgTag::Input | ArgTag::NoDep => ParamDirection::In,
                    ArgTag::Output | ArgTag::OutputExisting => ParamDirection::Out,
                    ArgTag::InOut => ParamDirection::InOut,
                },
            };
            if got != *d {
                return Err(ChipError::InvalidRunArgs(format!(
                    "argument {i} of orchestration {:?} must be {d:?} but the run passes {got:?}",
                    desc.name()
                )));
            }
        }
        Ok(())
    }

    fn ensure_rings(
        &mut self,
        rings: &[RingSizing; RING_COUNT],
    ) -> Result<[u64; RING_COUNT], ChipError> {
        let live = self.live.as_mut().expect("checked by caller");
        let mut bases = [0u64; RING_COUNT];
        for r in 0..RING_COUNT {
            let need = rings[r].heap_bytes_aligned();
            match live.ring_regions[r] {
                Some((p, size)) if size == need => bases[r] = p.addr,
                old => {
                    if let Some((p, _)) = old {
                        live.mem.free(&p)?;
                        live.ring_regions[r] = None;
                    }
                    let (p, _) = live.mem.malloc(need).map_err(|e| match e {
                        ChipError::OutOfDeviceMemory { .. } => ChipError::InvalidConfig(format!(
                            "no device memory for ring {r}'s {need}-byte heap ({e}); lower the ring heaps or raise ChipConfig::device_memory_bytes"
                        )),
                        e => e,
                    })?;
                    live.ring_regions[r] = Some((p, need));
                    bases[r] = p.addr;
                }
            }
        }
        Ok(bases)
    }

    fn stage(&mut self, args: &RunArgs<'_>) -> Result<ChipArgs, ChipError> {
        let chip_id = self.config.chip_id;
        let live = self.live.as_mut().expect("checked by caller");
        let total: u64 = args
            .tensors
            .iter()
            .map(|a| match a {
                RunArg::HostIn { view, .. }
                | RunArg::HostOut { view, .. }
                | RunArg::HostRaw { view, .. } => view.nbytes().div_ceil(1024) * 1024,
                RunArg::Device { .. } => 0,
            })
            .sum();
        if total > 0 && live.staging.is_none_or(|(_, s)| s < total) {
            if let Some((p, _)) = live.staging.take() {
                live.mem.free(&p)?;
            }
            let (p, s) = live.mem.malloc(total)?;
            live.staging = Some((p, s));
        }
        let mut out = ChipArgs::default();
        let mut off = 0u64;
        for a in &args.tensors {
            match a {
                RunArg::HostIn { view, .. } | RunArg::HostOut { view, .. } => {
                    let (base, _) = live.staging.expect("allocated above");
                    let addr = base.addr + off;
                    let size = view.nbytes().div_ceil(1024) * 1024;
                    off += size;
                    match a {
                        RunArg::HostIn { bytes, .. } => live.mem.arena.write(addr, bytes)?,
                        RunArg::HostOut {
                            bytes, inout: true, ..
                        } => live.mem.arena.write(addr, bytes)?,
                        _ => {}
                    }
                    out.tensors.push(ChipTensor {
                        key: BufferKey::new(live.staged_ids.mint(), KeySpace::Device(chip_id)),
                        addr,
                        size,
                        view: *view,
                        manual_dep: false,
                    });
                }
                RunArg::HostRaw { base, view, tag } => {
                    let (staging, _) = live.staging.expect("allocated above");
                    let addr = staging.addr + off;
                    let size = view.nbytes().div_ceil(1024) * 1024;
                    off += size;
                    if tag.reads() || *tag == ArgTag::NoDep {
                        let mut dst = addr;
                        for (o, len) in view.contiguous_runs() {
                            // SAFETY: the caller of `host_raw` guarantees the view's bytes
                            // are readable for the duration of the run.
                            unsafe { live.mem.arena.write_raw(dst, base.add(o as usize), len)? };
                            dst += len;
                        }
                    }
                    let dense = TensorView::contiguous(view.dtype(), view.shape())?;
                    out.tensors.push(ChipTensor {
                        key: BufferKey::new(live.staged_ids.mint(), KeySpace::Device(chip_id)),
                        addr,
                        size,
                        view: dense,
                        manual_dep: false,
                    });
                }
                RunArg::Device { t, .. } => {
                    live.mem.check_range(&t.ptr, t.size, "device tensor")?;
                    t.view.check_fits(t.size)?;
                    out.tensors.push(ChipTensor {
                        key: BufferKey::new(t.identity(), KeySpace::Device(chip_id)),
                        addr: t.ptr.addr,
                        size: t.size,
                        view: t.view,
                        manual_dep: false,
                    });
                }
            }
        }
        out.scalars = args.scalars.clone();
        Ok(out)
    }

    /// Runs a registered chip orchestration on `args` and waits for it.
    ///
    /// Host tensors are staged into device memory (`IN`/`INOUT` copied in; `OUT`/`INOUT`
    /// copied back only if the run succeeded); device tensors are passed in place. The
    /// orchestration runs on the orchestrator thread (or, with
    /// [`OrchestratorPlacement::Caller`](crate::OrchestratorPlacement::Caller), on the
    /// calling thread); its tasks run on the cores.
    ///
    /// # Errors
    /// - [`ChipError::InvalidConfig`] for a bad `config` (with [`CallConfig::validate`]'s
    ///   message), [`ChipError::InvalidRunArgs`], [`ChipError::UnknownCallable`];
    /// - a latched [`ChipError::Fatal`] (codes 1–5, 7, 8, 9) naming what to fix;
    /// - [`ChipError::KernelFailed`] (the first failed kernel: name and message),
    ///   [`ChipError::KernelTimeout`] (SCHEDULER_TIMEOUT), [`ChipError::OrchestrationFailed`];
    /// - [`ChipError::Unusable`] if the orchestration itself stopped making progress (the
    ///   chip cannot run again).
    pub fn run(
        &mut self,
        orch: &OrchHandle,
        args: &mut RunArgs<'_>,
        config: &CallConfig,
    ) -> Result<RunReport, ChipError> {
        let t0 = mono_ns();
        self.live("run")?;
        if let Some(u) = &self.unusable {
            return Err(ChipError::Unusable(u.clone()));
        }
        let rings = self.config.effective_rings(config)?;
        if let Some(e) = &args.error {
            return Err(ChipError::InvalidRunArgs(e.clone()));
        }
        let limits = strata_types::ArgLimits::HOST;
        if args.tensors.len() > limits.max_tensors || args.scalars.len() > limits.max_scalars {
            return Err(ChipError::InvalidRunArgs(format!(
                "a run takes at most {} tensors and {} scalars (the reference's entry-argument limits); got {} and {}",
                limits.max_tensors,
                limits.max_scalars,
                args.tensors.len(),
                args.scalars.len()
            )));
        }
        let entry = self.registry.orch_entry(&orch.id())?;
        Self::check_signature(&entry.desc, args)?;
        let (f, name) = (entry.f.clone(), entry.name.clone());
        let kernels = self
            .kernels_snapshot
            .get_or_insert_with(|| Arc::new(self.registry.kernels().clone()))
            .clone();
        let mut timing = RunTiming {
            tid: thread_id(),
            inv: next_invocation(),
            t0,
            ..RunTiming::default()
        };
        timing.hid.copy_from_slice(&orch.id().as_bytes()[..8]);
        let timeout = if config.timeout_ms > 0 {
            Duration::from_millis(config.timeout_ms)
        } else {
            self.config.kernel_timeout
        };

        // bind
        timing.bind = mono_ns();
        let reconfigure = self.live.as_ref().expect("checked").rings_current != rings;
        let ring_bases = self.ensure_rings(&rings)?;
        timing.prebuilt = mono_ns();
        let chip_args = self.stage(args)?;
        timing.bind_end = mono_ns();

        // runner_run
        let live = self.live.as_mut().expect("checked");
        live.rings_current = rings;
        timing.pid = live.pid;
        let comm_changed = match (&live.env.comm, &self.comm) {
            (None, None) => false,
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
            _ => true,
        };
        if comm_changed || !Arc::ptr_eq(&live.env.kernels, &kernels) {
            // A new environment for the cores (they re-read it when a dispatch carries
            // a new epoch).
            self.epoch += 1;
            live.env = Arc::new(RunEnv::new(self.epoch, kernels.clone(), self.comm.clone()));
            for l in &live.links {
                *l.env.lock().unwrap_or_else(|e| e.into_inner()) = live.env.clone();
            }
        }
        self.runs += 1;
        let run_seq = self.runs;
        let req = OrchRequest {
            name,
            f,
            args: chip_args,
            kernels,
            rings,
            reconfigure,
            ring_bases,
            ctl: RunCtl {
                timing: config.swimlane == 1,
                timeout,
                env: live.env.clone(),
            },
        };
        let budget = 2 * timeout
            .max(self.config.tensor_wait_timeout)
            .max(self.config.ring_wait_timeout)
            + Duration::from_secs(1);
        let reply = if let Some((orch, dog)) = live.inline.as_mut() {
            // The scheduler wakes whoever orchestrates (ring and tensor waits park).
            live.shared.orch_bell.register_current();
            let _watched = dog.watch.begin(run_seq, budget);
            Some(orch.run_request(&req))
        } else {
            let orch_thread = live.orch_thread.as_ref();
            let orch_alive = || orch_thread.is_some_and(|h| !h.is_finished());
            if !orch_alive() {
                self.unusable = Some("the orchestrator thread is gone".into());
                return Err(ChipError::Unusable(
                    "the orchestrator thread is gone".into(),
                ));
            }
            live.orch_link.request.post(OrchMsg::Run(req));
            wait_reply(
                &live.orch_link,
                &live.heartbeat,
                &live.shared,
                self.config.idle_spin,
                budget,
                orch_alive,
            )
        };
        let Some(reply) = reply else {
            if live.inline.is_none() && live.orch_thread.as_ref().is_none_or(|h| h.is_finished()) {
                let msg = "the orchestrator thread is gone".to_owned();
                self.unusable = Some(msg.clone());
                return Err(ChipError::Unusable(msg));
            }
            let msg = format!(
                "the orchestration made no progress for {} ms (SCHEDULER_TIMEOUT, orchestrator-starvation): its thread is stuck and the chip cannot run again; close it",
                budget.as_millis()
            );
            self.unusable = Some(msg.clone());
            return Err(ChipError::fatal(codes::SCHEDULER_TIMEOUT, msg));
        };
        let sched = if reply.sched_used {
            // The scheduler ran tasks of this run, which is over: take its part of the
            // report (under the scheduler's lock, so after its last pass).
            live.sched.take_report(run_seq)
        } else {
            SchedReport::default()
        };
        timing.runner_end = mono_ns();

        // validate
        let result = Self::verdict(&reply, &sched);
        let copy_back = match &result {
            Ok(()) => self.copy_back(args),
            Err(_) => Ok(()),
        };
        timing.end = mono_ns();

        timing.origin = reply.t_thread_start;
        timing.orch_start = reply.t_orch_start;
        timing.orch_end = reply.t_orch_end;
        timing.dev_end = reply.t_done.max(sched.last_ns);
        timing.sched = (sched.dispatches > 0).then_some((sched.first_ns, sched.last_ns));
        let print_strace = self.live.as_ref().expect("checked").print_strace;
        if print_strace {
            timing.done = mono_ns();
            eprint!("{}", strace_text(&timing.spans()));
        }
        result?;
        copy_back?;
        let swimlane = (config.swimlane == 1).then(|| Swimlane {
            chip: self.config.chip_id,
            core_types: self.core_types(),
            records: sched.swimlane,
        });
        if let (Some(s), Some(prefix)) = (&swimlane, &config.output_prefix) {
            let dir = std::path::Path::new(prefix);
            std::fs::create_dir_all(dir)
                .and_then(|_| s.write_chrome_json(&dir.join("chip_swimlane.json")))
                .map_err(|e| {
                    ChipError::InvalidConfig(format!(
                        "writing the swimlane under output_prefix {prefix:?}: {e}"
                    ))
                })?;
        }
        if !print_strace {
            timing.done = mono_ns();
        }
        Ok(RunReport {
            timing: Some(timing),
            swimlane,
            tasks: reply.tasks,
            dispatches: sched.dispatches,
            notes: sched.notes,
        })
    }

    fn verdict(reply: &OrchReply, sched: &SchedReport) -> Result<(), ChipError> {
        if let Some(e) = &reply.setup_error {
            return Err(e.clone());
        }
        if let Some(e) = &reply.fatal {
            return Err(e.clone());
        }
        match &reply.graph {
            Ok(()) => match &reply.orch_error {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            },
            Err(f) => {
                if let Some((_, e)) = sched.errors.iter().find(|(g, _)| g == f) {
                    return Err(e.clone());
                }
                if let Some(e) = &reply.orch_error {
                    return Err(e.clone());
                }
                Err(ChipError::RunFailed {
                    code: f.code(),
                    message: f.message().to_owned(),
                })
            }
        }
    }

    fn copy_back(&mut self, args: &mut RunArgs<'_>) -> Result<(), ChipError> {
        let live = self.live.as_ref().expect("checked");
        let Some((base, _)) = live.staging else {
            return Ok(());
        };
        let mut off = 0u64;
        for a in args.tensors.iter_mut() {
            match a {
                RunArg::HostIn { view, .. } => off += view.nbytes().div_ceil(1024) * 1024,
                RunArg::HostOut { bytes, view, .. } => {
                    live.mem.arena.read(base.addr + off, bytes)?;
                    off += view.nbytes().div_ceil(1024) * 1024;
                }
                RunArg::HostRaw {
                    base: host,
                    view,
                    tag,
                } => {
                    if tag.writes() {
                        let mut src = base.addr + off;
                        for (o, len) in view.contiguous_runs() {
                            // SAFETY: the caller of `host_raw` guarantees the view's bytes
                            // are writable until `run` returns.
                            unsafe { live.mem.arena.read_raw(src, host.add(o as usize), len)? };
                            src += len;
                        }
                    }
                    off += view.nbytes().div_ceil(1024) * 1024;
                }
                RunArg::Device { .. } => {}
            }
        }
        Ok(())
    }

    /// Shuts the chip down: stops the orchestrator, the scheduler and every core, joins
    /// their threads and releases device memory. A core whose kernel ignored cancellation
    /// after a timeout cannot be joined: its thread is detached (and logged). Idempotent.
    ///
    /// # Errors
    /// None at present; the `Result` leaves room for reporting detached threads.
    pub fn close(&mut self) -> Result<(), ChipError> {
        self.closed = true;
        let Some(mut live) = self.live.take() else {
            return Ok(());
        };
        if let Some((orch, mut dog)) = live.inline.take() {
            dog.stop();
            orch.shutdown();
        }
        live.orch_link.request.post(OrchMsg::Exit);
        if let Some(h) = live.orch_thread.take() {
            if self.unusable.is_some() && !h.is_finished() {
                eprintln!("strata-chip: chip {}: the orchestrator thread is stuck in the orchestration; detaching it", self.config.chip_id);
            } else {
                let _ = h.join();
            }
        }
        live.shared.send(SchedMsg::Exit);
        if let Some(h) = live.sched_thread.take() {
            let _ = h.join();
        }
        if live.sched.broken().is_some() {
            // A broken scheduler loop (a pass panicked) never handled `Exit`, so it never
            // told the cores: tell them here.
            for l in &live.links {
                let _ = l.dispatch.push(crate::aicore::link::CoreMsg::Exit);
                l.bell.unpark();
            }
        }
        for (c, slot) in live.core_threads.iter_mut().enumerate() {
            let Some(h) = slot.take() else { continue };
            let lost = live.shared.lost[c].load(Ordering::Acquire);
            if lost {
                // Give a cancelled kernel a moment to notice; never block forever.
                let deadline = std::time::Instant::now() + Duration::from_millis(500);
                while !h.is_finished() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if !h.is_finished() {
                    eprintln!(
                        "strata-chip: chip {}: core {c} is stuck in a kernel that ignored cancellation; detaching its thread (it keeps the device memory mapped until it returns)",
                        self.config.chip_id
                    );
                    continue;
                }
            }
            let _ = h.join();
        }
        drop(live.links);
        Ok(())
    }
}

/// Stops and joins the threads `init` started before one of them failed to start: the
/// scheduler (which tells the cores to exit), then every core.
fn stop_started(
    links: &[Arc<CoreLink>],
    cores: Vec<Option<JoinHandle<()>>>,
    sched: Option<(&SchedShared, JoinHandle<()>)>,
) {
    if let Some((shared, h)) = sched {
        shared.send(SchedMsg::Exit);
        let _ = h.join();
    }
    for l in links {
        let _ = l.dispatch.push(crate::aicore::link::CoreMsg::Exit);
        l.bell.unpark();
    }
    for h in cores.into_iter().flatten() {
        let _ = h.join();
    }
}

impl Drop for ChipWorker {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
