//! [`ChipWorker`]: the L2 chip's lifecycle — `new` → register callables → `init` (map
//! device memory, start the threads) → runs → `close` (also on drop). The device API is
//! in `device_api.rs`, the run pipeline in `run.rs`.

use crate::aicore::core_loop::{core_main, CoreEnv};
use crate::aicore::kernel::KernelCtx;
use crate::aicore::kernels::{KernelHandle, KernelTable, RunEnv};
use crate::aicore::link::CoreLink;
use crate::aicpu::orch::{ChipArgs, ChipOrch, OrchLink, OrchMsg};
use crate::aicpu::registry::{OrchHandle, Registry};
use crate::aicpu::sched::{Sched, SchedCell, SchedMsg, SchedShared, Topology};
use crate::aicpu::stall::Watchdog;
use crate::config::{ChipConfig, CoreType, OrchestratorPlacement, RingSizing};
use crate::device::arena::ExternalMemory;
use crate::device::memory::{DeviceMemory, DevicePtr};
use crate::error::ChipError;
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use strata_graph::{graph, GraphConfig, RingConfig};
use strata_types::{
    CallableDescriptor, CallableId, CallableKind, CallbackResult, IdentityMinter, OwnerNonce,
    RING_COUNT,
};

pub(super) struct Live {
    pub(super) mem: Arc<DeviceMemory>,
    pub(super) shared: Arc<SchedShared>,
    pub(super) links: Vec<Arc<CoreLink>>,
    pub(super) orch_link: Arc<OrchLink>,
    pub(super) orch_thread: Option<JoinHandle<()>>,
    /// Under [`OrchestratorPlacement::Caller`]: the orchestrator `run` drives on its own
    /// thread, and the watchdog that ends the process if an orchestration stalls.
    pub(super) inline: Option<(Box<ChipOrch>, Watchdog)>,
    pub(super) sched: Arc<SchedCell>,
    pub(super) sched_thread: Option<JoinHandle<()>>,
    pub(super) core_threads: Vec<Option<JoinHandle<()>>>,
    pub(super) heartbeat: Arc<AtomicU64>,
    pub(super) rings_current: [RingSizing; RING_COUNT],
    pub(super) ring_regions: [Option<(DevicePtr, u64)>; RING_COUNT],
    pub(super) staging: Option<(DevicePtr, u64)>,
    pub(super) staged_ids: IdentityMinter,
    /// [`SchedShared::abandoned`] when this chip last quarantined a run's memory.
    pub(super) abandoned_seen: u64,
    /// The run environment the cores hold (rebuilt only when the registry or the comm
    /// context changed).
    pub(super) env: Arc<RunEnv>,
    /// This process's id, for the trace (read once: `getpid` is a system call).
    pub(super) pid: u32,
    /// `ChipConfig::print_strace`, or `STRATA_STRACE=1` when `init` ran.
    pub(super) print_strace: bool,
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
    pub(super) config: ChipConfig,
    pub(super) registry: Registry,
    /// The registry's kernels as the last run saw them (rebuilt after a registration
    /// change), shared with the cores through the run environment.
    pub(super) kernels_snapshot: Option<Arc<KernelTable>>,
    pub(super) nonce: u64,
    pub(super) live: Option<Live>,
    pub(super) closed: bool,
    pub(super) unusable: Option<String>,
    pub(super) comm: Option<Arc<dyn Any + Send + Sync>>,
    /// External memory attached before `init` (the device arena holds it from there on).
    pub(super) external: Option<ExternalMemory>,
    /// The shared-memory region and length of the attached external memory.
    pub(super) external_region: Option<(u64, u64)>,
    /// The run environment's epoch (bumped when the registry or comm context changes).
    pub(super) epoch: u64,
    /// Runs started (tags the scheduler's report of a run).
    pub(super) runs: u64,
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
            external: None,
            external_region: None,
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
        F: Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static,
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
        F: Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static,
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
        F: Fn(&mut ChipOrch, &ChipArgs) -> CallbackResult + Send + Sync + 'static,
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
        F: Fn(&mut ChipOrch, &ChipArgs) -> CallbackResult + Send + Sync + 'static,
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

    /// Attaches external memory (distributed windows, `docs/chip.md`): from `init` on,
    /// its bytes are device addresses [`EXTERNAL_BASE`](crate::EXTERNAL_BASE)`..`, and a
    /// run argument in the shared-memory region it stands for
    /// ([`ExternalMemory::region`]) is passed in place ([`RunArgs::external`](crate::RunArgs::external)).
    ///
    /// # Errors
    /// [`ChipError::AlreadyInitialized`] after `init` (attach before it),
    /// [`ChipError::InvalidConfig`] if external memory is attached already.
    pub fn attach_external_memory(&mut self, memory: ExternalMemory) -> Result<(), ChipError> {
        if self.live.is_some() || self.closed {
            return Err(ChipError::AlreadyInitialized);
        }
        if self.external_region.is_some() {
            return Err(ChipError::InvalidConfig(
                "this chip has external memory attached already (one region per chip)".into(),
            ));
        }
        self.external_region = Some((memory.region(), memory.len()));
        self.external = Some(memory);
        Ok(())
    }

    /// The shared-memory region whose tensors the chip passes in place (its attached
    /// [`ExternalMemory`]), and its length.
    pub fn external_region(&self) -> Option<(u64, u64)> {
        self.external_region
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
        let mem = Arc::new(DeviceMemory::new(
            cfg.device_memory_bytes,
            self.nonce,
            self.external.clone(),
        )?);
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
            (cfg.chip_id, self.nonce),
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
            abandoned_seen: 0,
            env,
            pid: std::process::id(),
            print_strace,
        });
        if let Some(sizing) = self.config.prewarm.clone() {
            if let Err(e) = self.prewarm(&sizing) {
                let _ = self.close();
                return Err(e);
            }
        }
        Ok(())
    }

    pub(super) fn live(&self, op: &'static str) -> Result<&Live, ChipError> {
        if self.closed {
            return Err(ChipError::Closed { op });
        }
        let live = self.live.as_ref().ok_or(ChipError::NotInitialized { op })?;
        if live.mem.has_quarantine() && !live.shared.abandoned_kernels_may_run() {
            // Every abandoned kernel has returned: its memory can be reused.
            live.mem.end_quarantine();
        }
        Ok(live)
    }

    /// After a run in which a kernel was abandoned after its timeout: the device memory
    /// its task's arguments cover is quarantined until the kernel has returned. A ring
    /// heap or the staging buffer that holds such bytes is given up (held, still
    /// committed) and the next run gets a fresh one; a user allocation is refused in
    /// copies and runs ([`ChipError::Quarantined`]) and held if freed. Costs nothing in
    /// a run that abandoned no kernel (one atomic load).
    pub(super) fn quarantine_abandoned(&mut self) {
        let Some(live) = self.live.as_mut() else {
            return;
        };
        let abandoned = live.shared.abandoned.load(Ordering::Acquire);
        if abandoned == live.abandoned_seen {
            return;
        }
        live.abandoned_seen = abandoned;
        let ranges: Vec<(u64, u64)> = live
            .shared
            .abandoned_ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|&(_, s, e)| (s, e))
            .collect();
        let owned: Vec<u64> = live
            .ring_regions
            .iter()
            .chain(std::iter::once(&live.staging))
            .flatten()
            .map(|(p, _)| p.addr)
            .collect();
        let held = live.mem.quarantine_ranges(&ranges, &owned);
        for slot in live
            .ring_regions
            .iter_mut()
            .chain(std::iter::once(&mut live.staging))
        {
            if slot.is_some_and(|(p, _)| held.contains(&p.addr)) {
                *slot = None;
            }
        }
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
