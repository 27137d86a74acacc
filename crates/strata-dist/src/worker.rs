//! The L3+ worker: lifecycle (register → init → submit/run → close), the run handle, and
//! device-memory control outside runs. `nested` is the child program that runs a whole
//! level-3 worker under a level-4 one.

mod nested;

use crate::chip_child::ChipChild;
use crate::config::{DistConfig, Level};
use crate::ctx::Ctx;
use crate::endpoint::{
    AnyEndpoint, ChildKind, Endpoint, LocalEndpoint, NodeContext, RemoteChild, RemoteContext,
};
use crate::error::DistError;
use crate::orch::Orch;
use crate::registry::{HostOrchHandle, Programs, SubHandle};
use crate::sched::{Driver, Link, PassFault, SchedExit, SchedLoop, BROKEN_CHECK};
use crate::task::DistTask;
use nested::NestedChild;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use strata_chip::DeviceTensor;
use strata_graph::{
    graph, Failure, FailureKind, GraphConfig, Orchestrator, RingConfig, RunId, RunPhase, RunWaiter,
    RING_COUNT,
};
use strata_host::{
    ChildProgram, Children, Doorbell, SharedMemory, SharedTensor, SpawnOptions, SubProgram,
};
use strata_mailbox::EncodedConfig;
use strata_types::{
    CallConfig, CallableDescriptor, CallableKind, CallbackResult, DataType, Element,
    IdentityMinter, TaskArgs,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    New,
    Ready,
    Failed,
    Closed,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::New => "new (not initialized)",
            State::Ready => "ready",
            State::Failed => "failed to start",
            State::Closed => "closed",
        }
    }
}

struct Runtime {
    graph: Orchestrator<DistTask>,
    waiter: RunWaiter,
    ctx: Arc<Ctx>,
    /// The registered callables the runs' orchestrations submit (a frozen copy: nothing
    /// registers after init).
    programs: Arc<Programs>,
    sched: Option<JoinHandle<SchedExit>>,
    driver: Arc<Driver>,
    config: Arc<EncodedConfig>,
    /// The default configuration with tracing on (a traced run with no configuration of
    /// its own reuses it, so its frames keep their config bytes).
    traced_config: Arc<EncodedConfig>,
    children_pids: Vec<i32>,
    /// Base address of each lane's mailbox mapping, for the test-only frame corruption
    /// hook ([`DistWorker::inject_frame_corruption`]); the mappings live in the lanes,
    /// which the scheduler loop owns until close.
    mailbox_bases: Vec<usize>,
    /// The heap rings' regions, returned (pages discarded, region pooled for the next
    /// worker) once the children are gone — or quarantined if a thread child was detached
    /// still running (it may still write them).
    heap_leases: Vec<strata_host::RegionLease>,
    /// The comm arena's region, returned (or quarantined) likewise.
    comm_lease: Option<strata_host::RegionLease>,
    /// The staging region's lease (copies between ordinary host memory and chips).
    _staging_lease: Option<strata_host::RegionLease>,
}

/// An L3 (or L4) worker: host orchestrations that dispatch chip orchestrations to chip
/// children and closures to sub-worker children, each child a forked process (or a thread
/// in [`ExecMode::Threads`](strata_host::ExecMode::Threads)) reached through a shared-memory mailbox.
///
/// ```no_run
/// use strata_dist::*;
/// use strata_types::{ArgTag, DataType, TaskArgs};
///
/// let mut w = DistWorker::new(DistConfig::l3(vec![], 2))?;
/// let x = w.shared_tensor_from(&[4], &[1.0f32, 2.0, 3.0, 4.0])?;
/// let double = w.register_sub("double", |call| {
///     let mut t = call.tensor_mut::<f32>(0)?;
///     for i in 0..4 { let v = t.get(&[i]).unwrap(); t.set(&[i], v * 2.0); }
///     Ok(())
/// });
/// let orch = w.register_orchestration("main", move |o, _args| {
///     let mut a = TaskArgs::new();
///     a.push_tensor(x.arg(ArgTag::InOut))?;
///     o.submit_sub(&double, &a)?;
///     Ok(())
/// });
/// w.init()?;
/// w.run(&orch, &TaskArgs::new())?;
/// w.close()?;
/// # Ok::<(), DistError>(())
/// ```
pub struct DistWorker {
    config: DistConfig,
    programs: Programs,
    children: Vec<NextChild>,
    shared: Arc<SharedMemory>,
    minter: Arc<IdentityMinter>,
    state: State,
    rt: Option<Runtime>,
    /// The name of this worker's track in traces (a nested level-3 worker takes its
    /// parent's name for it); `None`: `host (level N)`.
    trace_name: Option<String>,
}

/// A next-level child added before `init` (level 4), in worker-id order.
enum NextChild {
    /// A level-3 worker forked into this process tree (`add_worker`).
    Local(Box<DistWorker>),
    /// A level-3 worker reached through an endpoint of another crate (`add_remote_child`).
    Remote(Box<dyn RemoteChild>),
}

impl std::fmt::Debug for DistWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistWorker")
            .field("level", &self.config.level)
            .field("state", &self.state)
            .field("chips", &self.config.chips.len())
            .field("sub_workers", &self.config.num_sub_workers)
            .field("children", &self.children.len())
            .finish()
    }
}

impl DistWorker {
    /// A new worker (nothing started yet).
    ///
    /// # Errors
    /// [`DistError::InvalidConfig`].
    pub fn new(config: DistConfig) -> Result<Self, DistError> {
        config.validate()?;
        Ok(DistWorker {
            config,
            programs: Programs::default(),
            children: Vec::new(),
            shared: SharedMemory::process().clone(),
            minter: Arc::new(IdentityMinter::new()),
            state: State::New,
            rt: None,
            trace_name: None,
        })
    }

    /// Names this worker's track in the traces of its runs (before `init`).
    pub(crate) fn set_trace_name(&mut self, name: &str) {
        self.trace_name = Some(name.to_owned());
    }

    /// Sets the execution mode before init (a level-3 child of a level-4 worker running
    /// its children as threads runs its own children as threads too).
    fn set_exec_mode(&mut self, mode: strata_host::ExecMode) {
        self.config.exec_mode = mode;
    }

    /// The configuration.
    pub fn config(&self) -> &DistConfig {
        &self.config
    }

    /// The level.
    pub fn level(&self) -> Level {
        self.config.level
    }

    fn require(&self, op: &'static str, s: State) -> Result<(), DistError> {
        if self.state != s {
            return Err(DistError::State {
                op,
                expected: s.name(),
                actual: self.state.name(),
            });
        }
        Ok(())
    }

    // ----- registration (before init) -------------------------------------------------

    /// Registers a host orchestration.
    pub fn register_orchestration<F>(&mut self, name: &str, f: F) -> HostOrchHandle
    where
        F: Fn(&mut Orch<'_>, &TaskArgs) -> CallbackResult + Send + Sync + 'static,
    {
        self.programs.register_host(name, Arc::new(f))
    }

    /// [`DistWorker::register_orchestration`] for an already shared function.
    pub fn register_orchestration_fn(
        &mut self,
        name: &str,
        f: crate::HostOrchFn,
    ) -> HostOrchHandle {
        self.programs.register_host(name, f)
    }

    /// [`DistWorker::register_sub`] for an already shared function.
    pub fn register_sub_fn(&mut self, name: &str, f: strata_host::SubFn) -> SubHandle {
        SubHandle {
            id: self.programs.subs.register(name, f),
        }
    }

    /// Adds every kernel and chip orchestration of `registry` (one built apart, e.g. by a
    /// program) that this worker's chip registry lacks; a digest already registered keeps
    /// its function.
    ///
    /// # Errors
    /// Too many kernels or orchestrations for a chip.
    pub fn register_chip_callables(
        &mut self,
        registry: &strata_chip::Registry,
    ) -> Result<(), DistError> {
        Ok(self.programs.chip.absorb(registry)?)
    }

    /// Registers a sub-worker callable: a closure (it may capture state) run by a host
    /// sub-worker child. Children are forked after registration and find it by digest.
    pub fn register_sub<F>(&mut self, name: &str, f: F) -> SubHandle
    where
        F: Fn(&mut strata_host::SubCall<'_>) -> CallbackResult + Send + Sync + 'static,
    {
        SubHandle {
            id: self.programs.subs.register(name, Arc::new(f)),
        }
    }

    /// Registers a kernel for the chip children.
    ///
    /// # Errors
    /// A registration error of the chip registry.
    pub fn register_kernel<F>(
        &mut self,
        name: &str,
        f: F,
    ) -> Result<strata_chip::KernelHandle, DistError>
    where
        F: Fn(&mut strata_chip::KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static,
    {
        Ok(self
            .programs
            .chip
            .register_kernel(CallableDescriptor::new(CallableKind::Kernel, name), f)?)
    }

    /// Registers a chip orchestration for the chip children.
    ///
    /// # Errors
    /// A registration error of the chip registry.
    pub fn register_chip_orchestration<F>(
        &mut self,
        name: &str,
        f: F,
    ) -> Result<strata_chip::OrchHandle, DistError>
    where
        F: Fn(&mut strata_chip::ChipOrch, &strata_chip::ChipArgs) -> CallbackResult
            + Send
            + Sync
            + 'static,
    {
        Ok(self.programs.chip.register_orchestration(
            CallableDescriptor::new(CallableKind::ChipOrchestration, name),
            f,
        )?)
    }

    /// Adds a level-3 worker as a next-level child of this level-4 worker (before init).
    /// Returns its worker id. The child is started (forked, with its own children) at this
    /// worker's `init`, and inherits this worker's registrations.
    ///
    /// # Errors
    /// This worker is not level 4 or not new; the child is not a new level-3 worker.
    pub fn add_worker(&mut self, child: DistWorker) -> Result<usize, DistError> {
        self.require("add_worker", State::New)?;
        if self.config.level != Level::L4 {
            return Err(DistError::InvalidConfig(
                "add_worker requires a level-4 worker".into(),
            ));
        }
        if child.config.level != Level::L3 {
            return Err(DistError::InvalidConfig(
                "add_worker: the child must be a level-3 worker".into(),
            ));
        }
        if child.state != State::New {
            return Err(DistError::InvalidConfig(format!(
                "add_worker: the child must be new, but it is {}",
                child.state.name()
            )));
        }
        self.children.push(NextChild::Local(Box::new(child)));
        Ok(self.children.len() - 1)
    }

    /// Adds a level-3 worker that this crate does not reach itself — one on another host,
    /// through strata-net — as a next-level child of this level-4 worker (before init).
    /// Returns its worker id, drawn from the same counter as [`DistWorker::add_worker`]'s.
    /// See [`RemoteChild`] for how the remote side gets the registered callables (it runs
    /// the same program) and what `init` does in the process that serves it.
    ///
    /// # Errors
    /// This worker is not level 4 or not new; the child's configuration is not a valid
    /// level-3 one.
    pub fn add_remote_child(&mut self, child: Box<dyn RemoteChild>) -> Result<usize, DistError> {
        self.require("add_remote_child", State::New)?;
        if self.config.level != Level::L4 {
            return Err(DistError::InvalidConfig(
                "add_remote_child requires a level-4 worker".into(),
            ));
        }
        let config = child.node_config();
        if config.level != Level::L3 {
            return Err(DistError::InvalidConfig(format!(
                "add_remote_child: {} must be a level-3 worker",
                child.label()
            )));
        }
        config.validate()?;
        self.children.push(NextChild::Remote(child));
        Ok(self.children.len() - 1)
    }

    /// A digest of every callable registered so far (host orchestrations, sub-worker
    /// callables, kernels and chip orchestrations, by their identities): two processes
    /// with the same digest can run each other's tasks. A remote node is accepted only if
    /// its program's digest equals its parent's.
    pub fn registry_digest(&self) -> [u8; 32] {
        self.programs.digest()
    }

    /// A shared tensor (zeroed) every child can see, zero-copy. Create shared tensors
    /// before `init`.
    ///
    /// # Errors
    /// A bad shape, or a shared-memory error.
    pub fn shared_tensor(&self, shape: &[u64], dtype: DataType) -> Result<SharedTensor, DistError> {
        Ok(SharedTensor::new(&self.shared, &self.minter, shape, dtype)?)
    }

    /// A shared tensor initialised from `data`.
    ///
    /// # Errors
    /// As [`DistWorker::shared_tensor`], or a length that does not match `shape`.
    pub fn shared_tensor_from<T: Element>(
        &self,
        shape: &[u64],
        data: &[T],
    ) -> Result<SharedTensor, DistError> {
        Ok(SharedTensor::from_slice(
            &self.shared,
            &self.minter,
            shape,
            data,
        )?)
    }

    // ----- lifecycle ---------------------------------------------------------------------

    /// Starts the worker tree: forks every child (chips, sub-workers, level-3 children,
    /// which start their own) before starting any thread, waits until all report ready,
    /// then starts the scheduler thread.
    ///
    /// # Errors
    /// A child that fails to start (named, with its message); forking while other threads
    /// run without the opt-in; an invalid configuration. On error nothing is left running.
    pub fn init(&mut self) -> Result<(), DistError> {
        self.require("init", State::New)?;
        match self.start() {
            Ok(rt) => {
                self.rt = Some(rt);
                self.state = State::Ready;
                Ok(())
            }
            Err(e) => {
                self.state = State::Failed;
                Err(e)
            }
        }
    }

    fn start(&mut self) -> Result<Runtime, DistError> {
        let started = Instant::now();
        self.serve_if_node()?;
        let cfg = &self.config.clone();
        let mut heap_regions = [0u64; RING_COUNT];
        let mut heap_leases = Vec::with_capacity(RING_COUNT);
        for (i, r) in heap_regions.iter_mut().enumerate() {
            let lease = self
                .shared
                .lease_region(cfg.heap_ring_bytes as usize, &format!("heap ring {i}"))?;
            *r = lease.id();
            heap_leases.push(lease);
        }
        // The chips' comm arena: shared memory every chip child maps (created before the
        // fork); window buffers are carved from it at run time.
        let mut comm = None;
        let mut comm_lease = None;
        let mut arena = None;
        if cfg.level == Level::L3 && !cfg.chips.is_empty() {
            let len = cfg.comm_arena_bytes as usize;
            let lease = self.shared.lease_region(len, "comm arena")?;
            let base = self.shared.ptr(lease.id(), 0, len as u64)?;
            // SAFETY: `base..base + len` is the whole leased region: a page-aligned
            // MAP_SHARED mapping, zero (fresh, or discarded when its last lease returned),
            // that stays mapped while the lease lives — the lease lives in the runtime,
            // which outlives the children (dropped after they are reaped).
            let (ctx, a) = unsafe {
                crate::comm::CommCtx::init(
                    base,
                    len,
                    lease.id(),
                    cfg.chips.len() as u32,
                    cfg.windows,
                    &mut self.programs.chip,
                )
            }?;
            comm = Some(ctx);
            arena = Some(a);
            comm_lease = Some(lease);
        }
        // Staging for copies between ordinary host memory and chip memory: shared memory
        // every chip child maps (created before the fork), used in two halves. A level-4
        // worker stages copies into its local level-3 children's chips the same way (they
        // and their chips inherit the mapping).
        let mut staging_lease = None;
        let mut staging = None;
        let has_chips = match cfg.level {
            Level::L3 => !cfg.chips.is_empty(),
            Level::L4 => self
                .children
                .iter()
                .any(|c| matches!(c, NextChild::Local(_))),
        };
        if has_chips && cfg.staging_bytes > 0 {
            let lease = self
                .shared
                .lease_region(cfg.staging_bytes as usize, "staging")?;
            staging = Some((lease.id(), cfg.staging_bytes / 2));
            staging_lease = Some(lease);
        }
        let visible_regions = self.shared.regions() as u64;

        let mut programs: Vec<Box<dyn ChildProgram>> = Vec::new();
        // Remote next-level children (level 4): their endpoints are opened after the local
        // children are forked (opening one may start threads).
        let mut remote: Vec<(usize, Box<dyn RemoteChild>)> = Vec::new();
        // What each child is, in lane order: it travels with the child's endpoint.
        let mut kinds = Vec::new();
        // Each local level-3 child's chips' device capacities (by worker id).
        let mut nested_capacity: HashMap<usize, Vec<u64>> = HashMap::new();
        match cfg.level {
            Level::L3 => {
                for (i, c) in cfg.chips.iter().enumerate() {
                    let rank = arena.as_ref().zip(comm.as_ref()).map(|(a, c)| {
                        (
                            strata_comm::RankContext::new(
                                a.clone(),
                                i as u32,
                                cfg.comm_wait_timeout,
                            ),
                            c.region,
                        )
                    });
                    programs.push(Box::new(ChipChild::new(
                        i,
                        c.clone(),
                        self.programs.chip.clone(),
                        rank,
                    )));
                    kinds.push(ChildKind::Chip);
                }
            }
            Level::L4 => {
                for (i, child) in std::mem::take(&mut self.children).into_iter().enumerate() {
                    match child {
                        NextChild::Local(mut child) => {
                            nested_capacity.insert(
                                i,
                                child
                                    .config()
                                    .chips
                                    .iter()
                                    .map(|c| c.device_memory_bytes)
                                    .collect(),
                            );
                            child.programs.absorb(&self.programs)?;
                            programs.push(Box::new(NestedChild::new(i, *child)));
                            kinds.push(ChildKind::Worker);
                        }
                        NextChild::Remote(r) => remote.push((i, r)),
                    }
                }
            }
        }
        for i in 0..cfg.num_sub_workers {
            programs.push(Box::new(
                SubProgram::new(self.programs.subs.clone()).with_index(i),
            ));
            kinds.push(ChildKind::Sub);
        }
        let mut labels: Vec<String> = programs.iter().map(|p| p.label()).collect();
        // Labels in worker-id order: the remote children take their ids' places among
        // the local ones.
        for (id, r) in &remote {
            labels.insert(*id, r.label());
        }
        let doorbell = Doorbell::new()?;
        let mut children = Children::spawn(
            &self.shared,
            programs,
            SpawnOptions {
                mode: cfg.exec_mode,
                startup_timeout: cfg.startup_timeout,
                allow_fork_with_threads: cfg.allow_fork_with_threads,
                doorbell: Some(doorbell.clone()),
                wait: strata_mailbox::WaitOptions::default(),
                child_park_slice: SpawnOptions::DEFAULT_CHILD_PARK_SLICE,
            },
        )?;
        let children_pids = children.pids();
        let mut mailbox_bases: Vec<usize> = children
            .lanes_mut()
            .iter_mut()
            .map(|l| l.parent().mailbox().region().as_ptr() as usize)
            .collect();
        for (id, _) in &remote {
            // No mailbox behind a remote child.
            mailbox_bases.insert(*id, 0);
        }
        let mut remote_endpoints = if remote.is_empty() {
            Vec::new()
        } else {
            let ctx = RemoteContext {
                worker_id: 0,
                doorbell: doorbell.clone(),
                shared: self.shared.clone(),
                registry_digest: self.programs.digest(),
                deadline: started
                    .checked_add(cfg.startup_timeout)
                    .or_else(|| started.checked_add(FAR_FUTURE))
                    .unwrap_or(started),
            };
            // On error `children` drops here, shutting the local children down.
            connect_remotes(remote, &ctx)?
        };
        let (orch, sched) = graph::<DistTask>(GraphConfig {
            rings: [RingConfig {
                heap_bytes: cfg.heap_ring_bytes,
                task_window: None,
                dep_pool: None,
            }; RING_COUNT],
            wait_timeout: Duration::from_secs(10),
            pipeline_depth: cfg.pipeline_depth,
        })?;
        let link = Arc::new(Link::new(
            doorbell,
            kinds.iter().filter(|k| **k != ChildKind::Sub).count(),
            match cfg.level {
                Level::L3 => 3,
                Level::L4 => 4,
            },
            !remote_endpoints.is_empty(),
        ));
        link.trace.set_names(self.programs.callable_names());
        if let Some(n) = &self.trace_name {
            link.trace.set_name(n);
        }
        let mut endpoints: Vec<AnyEndpoint> = children
            .into_lanes()
            .into_iter()
            .zip(kinds)
            .map(|(lane, kind)| AnyEndpoint::Local(LocalEndpoint::new(lane, kind, cfg.exec_mode)))
            .collect();
        for (id, e) in remote_endpoints.drain(..) {
            endpoints.insert(id, AnyEndpoint::Remote(e));
        }
        let next: Vec<ChildKind> = endpoints
            .iter()
            .map(|e| e.kind())
            .take_while(|k| *k != ChildKind::Sub)
            .collect();
        let waiter = orch.run_waiter();
        let driver = Driver::new(
            SchedLoop::new(sched, endpoints, link.clone(), next.len())
                .with_shared(self.shared.clone())
                .with_deadlines(cfg.control_timeout, cfg.task_timeout),
        );
        let handle = driver
            .spawn()
            .map_err(|e| DistError::Internal(format!("cannot start the scheduler thread: {e}")))?;
        let ctx = Arc::new(Ctx {
            link,
            next,
            labels,
            n_subs: cfg.num_sub_workers,
            visible_regions,
            heap_regions,
            shared: self.shared.clone(),
            comm,
            minter: self.minter.clone(),
            staging,
            device_capacity: if cfg.level == Level::L3 {
                cfg.chips.iter().map(|c| c.device_memory_bytes).collect()
            } else {
                Vec::new()
            },
            nested_capacity,
            child_tensors: Mutex::new(HashMap::new()),
        });
        Ok(Runtime {
            graph: orch,
            waiter,
            ctx,
            programs: Arc::new(self.programs.clone()),
            sched: Some(handle),
            driver,
            config: Arc::new(EncodedConfig::new(&CallConfig::default())?),
            traced_config: Arc::new(EncodedConfig::new(&CallConfig::default().with_trace(true))?),
            children_pids,
            mailbox_bases,
            heap_leases,
            comm_lease,
            _staging_lease: staging_lease,
        })
    }

    /// In a process started to serve one of this level-4 worker's remote children
    /// ([`RemoteChild::serves_here`]): builds that level-3 worker with every registration
    /// of this one, serves the parent with it, and exits the process with the status the
    /// child's `serve` returns — `init` does not return there. Elsewhere does nothing.
    fn serve_if_node(&mut self) -> Result<(), DistError> {
        if self.config.level != Level::L4 {
            return Ok(());
        }
        let Some(id) = self
            .children
            .iter()
            .enumerate()
            .find_map(|(id, c)| match c {
                NextChild::Remote(r) if r.serves_here(id) => Some(id),
                _ => None,
            })
        else {
            return Ok(());
        };
        let NextChild::Remote(child) = self.children.swap_remove(id) else {
            unreachable!("found as a remote child above")
        };
        let mut worker = DistWorker::new(child.node_config())?;
        worker.programs.absorb(&self.programs)?;
        let node = NodeContext {
            worker_id: id,
            registry_digest: self.programs.digest(),
        };
        // The rest of this process's level-4 tree is never started here.
        self.children.clear();
        let status = child.serve(worker, node);
        std::process::exit(status)
    }

    fn runtime(&mut self, op: &'static str) -> Result<&mut Runtime, DistError> {
        self.require(op, State::Ready)?;
        let rt = self.rt.as_mut().ok_or(DistError::State {
            op,
            expected: State::Ready.name(),
            actual: "without a runtime",
        })?;
        if let Some(why) = rt.ctx.link.unusable() {
            return Err(DistError::Unusable(why));
        }
        Ok(rt)
    }

    /// Process ids of this worker's direct children (empty in Threads mode).
    pub fn child_pids(&self) -> Vec<i32> {
        self.rt
            .as_ref()
            .map(|r| r.children_pids.clone())
            .unwrap_or_default()
    }

    /// What the comm arena's allocator did so far (window buffers allocated, freed,
    /// zero-filled); `None` without chips or before `init`.
    pub fn comm_stats(&self) -> Option<strata_comm::CommStats> {
        self.rt.as_ref()?.ctx.comm.as_ref().map(|c| c.stats())
    }

    /// Why the worker is unusable (a child died), if it is.
    pub fn unusable_reason(&self) -> Option<String> {
        self.rt.as_ref().and_then(|r| r.ctx.link.unusable())
    }

    // ----- runs --------------------------------------------------------------------------

    /// Runs the host orchestration `orch` on this thread to build a run and returns a
    /// handle to it while its tasks execute. At most two runs are in flight; a third
    /// submit waits for the oldest.
    ///
    /// # Errors
    /// [`DistError::BadArgument`] for an argument `args`' builder recorded as invalid; the
    /// worker is not ready or unusable; an unregistered orchestration; the
    /// orchestration's own error ([`DistError::Orchestration`], after its started tasks
    /// finished and the rest were cancelled).
    pub fn submit(
        &mut self,
        orch: &HostOrchHandle,
        args: &TaskArgs,
    ) -> Result<RunHandle, DistError> {
        self.submit_with(orch, args, &CallConfig::default())
    }

    /// [`DistWorker::submit`] with a call configuration applied to every next-level task
    /// of the run (unless a task gives its own).
    ///
    /// # Errors
    /// As `submit`, plus an invalid `config`.
    pub fn submit_with(
        &mut self,
        orch: &HostOrchHandle,
        args: &TaskArgs,
        config: &CallConfig,
    ) -> Result<RunHandle, DistError> {
        self.submit_run(orch, args, config, false, false)
    }

    /// Builds a run. `waits`: the caller waits for it right away (`run`), so it drives the
    /// loop itself and a scheduler thread left dormant need not be woken for the run's
    /// first hand-over; otherwise the run is handed to a caller that may wait much later,
    /// and the scheduler thread is woken. `nested`: `args` come from a level-4 parent that
    /// admitted them (they may name its memory), so the run's tasks may name them too.
    fn submit_run(
        &mut self,
        orch: &HostOrchHandle,
        args: &TaskArgs,
        config: &CallConfig,
        waits: bool,
        nested: bool,
    ) -> Result<RunHandle, DistError> {
        crate::orch::check_args(args, None)?;
        let t0 = strata_sync::mono_ns();
        let level = self.config.level;
        let rt = self.runtime("submit")?;
        let f = rt
            .programs
            .host
            .get(&orch.id)
            .map(|(_, f)| f.clone())
            .ok_or_else(|| DistError::UnknownCallable(orch.id.to_string()))?;
        // Traced: asked for, or a `tracing` subscriber listens (one check otherwise).
        let traced = config.traced() || crate::trace::subscriber_listens();
        let encoded = if *config == CallConfig::default() {
            rt.config.clone()
        } else if *config == CallConfig::default().with_trace(true) {
            rt.traced_config.clone()
        } else {
            config.validate()?;
            Arc::new(EncodedConfig::new(config)?)
        };
        let encoded = if traced && !config.traced() {
            if *config == CallConfig::default() {
                rt.traced_config.clone()
            } else {
                Arc::new(EncodedConfig::new(&config.clone().with_trace(true))?)
            }
        } else {
            encoded
        };
        let run = rt.graph.begin_run()?;
        let ctx = rt.ctx.clone();
        if traced {
            ctx.link.trace.begin(run, &orch.id, t0);
        }
        let mut o = Orch {
            graph: &mut rt.graph,
            ctx: &ctx,
            programs: &rt.programs,
            run,
            ready: Vec::new(),
            submitted: false,
            config: encoded,
            traced,
            wake_deferred: false,
            handed_over: false,
            run_tensors: HashMap::new(),
            admitted: if nested {
                args.tensors()
                    .iter()
                    .map(|t| (t.buffer.identity(), t.buffer))
                    .collect()
            } else {
                HashMap::new()
            },
            held_workers: Vec::new(),
        };
        let span = match level {
            Level::L3 => tracing::info_span!(target: "strata", "l3.run.submit", run = run.0),
            Level::L4 => tracing::info_span!(target: "strata", "l4.run.submit", run = run.0),
        };
        let result = span.in_scope(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut o, args)))
                .unwrap_or_else(|p| {
                    Err(format!("panicked: {}", strata_sync::panic_message(&*p)).into())
                })
        });
        o.flush();
        if !waits || result.is_err() {
            o.wake_deferred();
        }
        match result {
            Ok(()) => {
                if let Err(e) = rt.graph.close_run() {
                    // Nobody waits for this run: the loop must not stay parked on it.
                    ctx.link.wake_dormant();
                    ctx.link.trace.discard(run);
                    return Err(e.into());
                }
                if traced {
                    ctx.link.trace.submitted(run, t0, strata_sync::mono_ns());
                }
                if !waits {
                    // (A caller that waits drives the loop itself: ringing here would
                    // only wake the parked scheduler thread.)
                    ctx.link.nudge();
                }
                Ok(RunHandle {
                    run,
                    waiter: rt.waiter.clone(),
                    driver: rt.driver.clone(),
                    outcome: None,
                    traced: traced.then(|| ctx.link.clone()),
                    trace: None,
                    emit: !nested,
                    level,
                })
            }
            Err(e) => {
                let failure = Failure::new(
                    FailureKind::Cancelled,
                    format!("orchestration: {}", strata_types::error_chain(&*e)),
                );
                ctx.link.trace.discard(run);
                rt.graph.fail_run(failure)?;
                ctx.link.nudge();
                // The run fence: tasks already running finish before the error returns.
                let _ = rt.waiter.wait(run, None);
                let _ = rt.waiter.release(run);
                Err(DistError::Orchestration(e))
            }
        }
    }

    /// [`DistWorker::submit`] then [`RunHandle::wait`].
    ///
    /// # Errors
    /// As `submit`, and the run's first task error.
    pub fn run(&mut self, orch: &HostOrchHandle, args: &TaskArgs) -> Result<(), DistError> {
        self.submit_run(orch, args, &CallConfig::default(), true, false)?
            .wait(None)
    }

    /// [`DistWorker::run`] with a call configuration.
    ///
    /// # Errors
    /// As `run`.
    pub fn run_with(
        &mut self,
        orch: &HostOrchHandle,
        args: &TaskArgs,
        config: &CallConfig,
    ) -> Result<(), DistError> {
        self.submit_run(orch, args, config, true, false)?.wait(None)
    }

    /// [`DistWorker::run_with`] for a level-3 worker that serves a level-4 parent in
    /// another process tree (strata-net's remote node): the task's tensor arguments were
    /// admitted by the parent and name memory the server set up for them — shared memory
    /// created before this worker's `init`, which the server owns and keeps alive until
    /// the run ends — so the run takes them as they are and may pass them on to its
    /// children. Device tensors of this worker's chips are still checked.
    ///
    /// # Errors
    /// As `run_with`; a tensor argument in shared memory its children cannot see.
    pub fn run_for_parent(
        &mut self,
        orch: &HostOrchHandle,
        args: &TaskArgs,
        config: &CallConfig,
    ) -> Result<(), DistError> {
        self.run_nested(orch, args, config).0
    }

    /// [`DistWorker::run_for_parent`] that also returns the run's trace when `config`
    /// asks for one ([`CallConfig::traced`]): what a level-3 worker serving a parent in
    /// another process tree sends back with the task's end.
    pub fn run_for_parent_traced(
        &mut self,
        orch: &HostOrchHandle,
        args: &TaskArgs,
        config: &CallConfig,
    ) -> (Result<(), DistError>, Option<strata_types::trace::Trace>) {
        self.run_nested(orch, args, config)
    }

    /// [`DistWorker::run_with`] for a level-3 worker serving its level-4 parent: the
    /// task's arguments were admitted by the parent, so the run may pass them on. Returns
    /// the run's trace too when it was traced.
    pub(crate) fn run_nested(
        &mut self,
        orch: &HostOrchHandle,
        args: &TaskArgs,
        config: &CallConfig,
    ) -> (Result<(), DistError>, Option<strata_types::trace::Trace>) {
        match self.submit_run(orch, args, config, true, true) {
            Ok(mut h) => {
                let r = h.wait(None);
                (r, h.take_trace())
            }
            Err(e) => (Err(e), None),
        }
    }

    // ----- device memory outside runs ---------------------------------------------------

    fn idle_control(&mut self, op: &'static str) -> Result<Arc<Ctx>, DistError> {
        let rt = self.runtime(op)?;
        if rt.graph.dispatchable_run().is_some() {
            return Err(DistError::InvalidArgs(format!(
                "{op}: a run is still in flight; wait for it, or do it from inside the run before its first submit"
            )));
        }
        Ok(rt.ctx.clone())
    }

    /// Allocates a tensor in chip `worker`'s device memory (outside any run).
    ///
    /// # Errors
    /// A run in flight, a worker that is not a chip, an allocation failure.
    pub fn alloc_child_tensor(
        &mut self,
        worker: usize,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<DeviceTensor, DistError> {
        self.idle_control("alloc_child_tensor")?
            .alloc_child_tensor(worker, shape, dtype)
    }

    /// Allocates a tensor on chip `chip` of local level-3 worker child `worker` (a level-4
    /// worker, outside any run). The tensor's [`DeviceTensor::worker`] is `worker`: pass
    /// it to that child's tasks, whose orchestrations see it as their own chip tensor on
    /// chip `chip` (`TensorArg::device_worker`). [`DistWorker::free`],
    /// [`DistWorker::copy_bytes_to`] and [`DistWorker::copy_bytes_from`] take it like a
    /// chip tensor; the bytes go through this worker's staging memory, which the child's
    /// chips map. A remote level-3 worker's chips go through `strata_net::RemoteWorker`.
    ///
    /// # Errors
    /// A run in flight; `worker` not a local level-3 worker child, or no chip `chip`
    /// there; the chip's allocator refused.
    pub fn alloc_nested_tensor(
        &mut self,
        worker: usize,
        chip: usize,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<DeviceTensor, DistError> {
        self.idle_control("alloc_nested_tensor")?
            .alloc_nested_tensor(worker, chip, shape, dtype)
    }

    /// `(free, total)` bytes of chip `chip` of local level-3 worker child `worker`'s
    /// emulated card (a level-4 worker; see [`DistWorker::device_memory_info`]).
    ///
    /// # Errors
    /// A run in flight; `worker` not a local level-3 worker child, or no chip `chip`.
    pub fn nested_device_memory_info(
        &mut self,
        worker: usize,
        chip: usize,
    ) -> Result<(u64, u64), DistError> {
        self.idle_control("nested_device_memory_info")?
            .nested_memory_info(worker, chip)
    }

    /// Bytes the allocator of chip `chip` of local level-3 worker child `worker` holds
    /// (a level-4 worker).
    ///
    /// # Errors
    /// As [`DistWorker::nested_device_memory_info`].
    pub fn nested_committed_device_memory(
        &mut self,
        worker: usize,
        chip: usize,
    ) -> Result<u64, DistError> {
        self.idle_control("nested_committed_device_memory")?
            .nested_committed(worker, chip)
    }

    /// Frees a chip tensor (or one of a level-3 worker child's chips, at level 4).
    ///
    /// # Errors
    /// A run in flight, a double free.
    pub fn free(&mut self, t: DeviceTensor) -> Result<(), DistError> {
        self.idle_control("free")?.free_child_tensor(t)
    }

    /// Copies a shared tensor into a chip tensor.
    ///
    /// # Errors
    /// A run in flight, size mismatch, a freed tensor.
    pub fn copy_to(&mut self, dst: &DeviceTensor, src: &SharedTensor) -> Result<(), DistError> {
        self.idle_control("copy_to")?
            .copy(dst, src, crate::control::CopyDirection::ToDevice)
    }

    /// Copies a chip tensor into a shared tensor.
    ///
    /// # Errors
    /// As [`DistWorker::copy_to`].
    pub fn copy_from(&mut self, dst: &SharedTensor, src: &DeviceTensor) -> Result<(), DistError> {
        self.idle_control("copy_from")?
            .copy(src, dst, crate::control::CopyDirection::FromDevice)
    }

    /// Copies `src` — ordinary host memory, created any time — into chip tensor `dst`
    /// from its byte `dst_offset` on (outside any run). The bytes go through the worker's
    /// staging memory in chunks ([`DistConfig::staging_bytes`]), or in place — no staging
    /// copy — if `src` lies in a shared mapping adopted before `init`
    /// ([`strata_host::SharedMemory::adopt_region`]). Returns which way they went.
    ///
    /// # Errors
    /// A run in flight; `dst` not a live chip tensor of this worker; `dst_offset +
    /// src.len()` past the end of `dst` (checked without overflow); no staging memory.
    pub fn copy_bytes_to(
        &mut self,
        dst: &DeviceTensor,
        dst_offset: u64,
        src: &[u8],
    ) -> Result<crate::CopyPath, DistError> {
        self.idle_control("copy_to")?
            .copy_bytes_to_device(dst, dst_offset, src)
    }

    /// Copies `dst.len()` bytes of chip tensor `src`, from its byte `src_offset` on, into
    /// `dst` — ordinary host memory (outside any run); staged, or in place into a writable
    /// adopted mapping (one adopted read-only is refused).
    ///
    /// # Errors
    /// As [`DistWorker::copy_bytes_to`]; a read-only adopted destination.
    pub fn copy_bytes_from(
        &mut self,
        dst: &mut [u8],
        src: &DeviceTensor,
        src_offset: u64,
    ) -> Result<crate::CopyPath, DistError> {
        self.idle_control("copy_from")?
            .copy_bytes_from_device(src, src_offset, dst)
    }

    /// `(free, total)` bytes of chip `worker`'s emulated card: `total` its configured
    /// capacity (`ChipConfig::device_memory_bytes`), `free` what its allocator could still
    /// hand out. Emulated figures (see `ChipWorker::device_memory_info`).
    ///
    /// # Errors
    /// A run in flight, a worker that is not a chip.
    pub fn device_memory_info(&mut self, worker: usize) -> Result<(u64, u64), DistError> {
        self.idle_control("device_memory_info")?
            .device_memory_info(worker)
    }

    /// Bytes chip `worker`'s allocator holds.
    ///
    /// # Errors
    /// A run in flight, a worker that is not a chip.
    pub fn committed_device_memory(&mut self, worker: usize) -> Result<u64, DistError> {
        self.idle_control("committed_device_memory")?
            .committed_device_memory(worker)
    }

    /// Copies `len` bytes between chip tensor `t`, from its byte `dev_offset` on, and bytes
    /// `[offset, offset + len)` of shared-memory region `region` (outside any run): the
    /// chip reads or writes the region in place, so bytes that already lie in shared
    /// memory (a remote node's staging area) are not staged again. The region must have
    /// existed before `init` (the chips map it).
    ///
    /// # Errors
    /// A run in flight; a freed tensor or one of another worker ([`DistError::StaleTensor`]);
    /// a range that leaves the tensor or the region; a worker that is not a chip.
    pub fn copy_range(
        &mut self,
        t: &DeviceTensor,
        dev_offset: u64,
        region: u64,
        offset: u64,
        len: u64,
        direction: crate::control::CopyDirection,
    ) -> Result<(), DistError> {
        self.idle_control("copy_range")?
            .copy_range(t, dev_offset, region, offset, len, direction)
    }

    // ----- device memory of remote next-level children ---------------------------------

    /// Admits device memory that a remote next-level child (a [`crate::RemoteChild`],
    /// level-4 only) allocated on one of its chips, so tasks of that child may name it:
    /// returns the descriptor (`BufferLocation::Device { worker, addr }`, a fresh identity,
    /// `nbytes`) that task arguments carry. `addr` is the child's own handle for the
    /// allocation; only the child interprets it. Tasks to any other worker that name it
    /// are refused, and so is every task once it is retired
    /// ([`DistWorker::retire_remote_device`]). Outside any run.
    ///
    /// # Errors
    /// A run in flight; `worker` is not a next-level worker child of this worker.
    pub fn admit_remote_device(
        &mut self,
        worker: usize,
        addr: u64,
        nbytes: u64,
    ) -> Result<strata_types::BufferDesc, DistError> {
        let ctx = self.idle_control("admit_remote_device")?;
        match ctx.next.get(worker) {
            Some(ChildKind::Worker) if ctx.is_remote_worker(worker) => {}
            Some(ChildKind::Worker) => {
                return Err(DistError::InvalidArgs(format!(
                    "worker {worker} is a local level-3 worker: its chips' memory is allocated with alloc_nested_tensor, not admitted"
                )))
            }
            Some(_) => {
                return Err(DistError::InvalidArgs(format!(
                "worker {worker} is a chip; remote device memory belongs to a level-3 worker child"
            )))
            }
            None => {
                return Err(DistError::UnknownWorker {
                    id: worker,
                    count: ctx.next.len(),
                })
            }
        }
        let identity = ctx.minter.mint();
        // SAFETY: the descriptor names device memory the child allocated for this
        // allocation alone (its handle `addr`, `nbytes` bytes); the engine never
        // dereferences a device address, it only checks tasks against the live set.
        let desc = unsafe {
            strata_types::BufferDesc::from_parts(
                identity,
                nbytes,
                strata_types::BufferLocation::Device {
                    worker: worker as u32,
                    addr,
                },
            )
        };
        ctx.child_tensors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(identity, (worker, addr, nbytes));
        Ok(desc)
    }

    /// Retires a descriptor from [`DistWorker::admit_remote_device`] (its child freed the
    /// allocation): later tasks naming it are refused ([`DistError::StaleTensor`]).
    /// Outside any run.
    ///
    /// # Errors
    /// A run in flight; a descriptor that is not admitted (retired twice, or not one of
    /// this worker's).
    pub fn retire_remote_device(
        &mut self,
        desc: &strata_types::BufferDesc,
    ) -> Result<(), DistError> {
        let ctx = self.idle_control("retire_remote_device")?;
        let strata_types::BufferLocation::Device { worker, addr } = desc.location() else {
            return Err(DistError::InvalidArgs(
                "retire_remote_device: not a device descriptor".into(),
            ));
        };
        if !ctx.is_remote_worker(worker as usize) {
            return Err(DistError::InvalidArgs(format!(
                "retire_remote_device: worker {worker} is not a remote level-3 worker; free its tensors with free()"
            )));
        }
        let mut live = ctx.child_tensors.lock().unwrap_or_else(|e| e.into_inner());
        if live.get(&desc.identity()) != Some(&(worker as usize, addr, desc.nbytes())) {
            return Err(DistError::InvalidArgs(format!(
                "remote device memory {addr:#x} of worker {worker} is not admitted by this worker (retired twice, or another worker's)"
            )));
        }
        live.remove(&desc.identity());
        Ok(())
    }

    /// Checks that device-memory work for remote next-level child `worker` may go ahead
    /// now: the worker is initialised and usable, and no run is in flight (so no task of
    /// the child runs while its memory is changed, as for local chips).
    ///
    /// # Errors
    /// Not initialised, unusable, a run in flight, or `worker` out of range.
    pub fn remote_device_idle(&mut self, worker: usize, op: &'static str) -> Result<(), DistError> {
        let ctx = self.idle_control(op)?;
        if worker >= ctx.next.len() {
            return Err(DistError::UnknownWorker {
                id: worker,
                count: ctx.next.len(),
            });
        }
        Ok(())
    }

    /// Records that remote next-level child `worker` was lost while the caller did
    /// device-memory work on it — its session ended, and that call's error told the
    /// caller (`why`, which names the child) —: the worker becomes unusable at once, as
    /// when the scheduler finds a child dead, so later calls say so and `close` does not
    /// report the same loss again (whether or not the scheduler had noticed it first).
    /// A worker not initialised, or unusable already, is left as it is.
    pub fn remote_child_lost(&mut self, worker: usize, why: &str) {
        if let Some(rt) = self.rt.as_ref() {
            if worker < rt.ctx.next.len() {
                rt.ctx.link.set_unusable(format!("worker {worker}: {why}"));
            }
        }
    }

    /// Test-only fault injection: a later pass of the scheduler loop panics with
    /// `message` (after its intake, so mid-pass) — on a caller's pass (a thread driving
    /// the loop while it waits for a run) if `on_caller`, else on the scheduler thread's.
    /// No user code runs inside a pass, so this is how the engine's handling of an
    /// internal panic there is tested. Not part of the API.
    ///
    /// # Errors
    /// A worker that is not initialised or already unusable.
    #[doc(hidden)]
    pub fn inject_pass_panic(&mut self, message: &str, on_caller: bool) -> Result<(), DistError> {
        self.runtime("inject_pass_panic")?
            .ctx
            .link
            .inject_pass_panic(PassFault {
                message: message.to_owned(),
                on_caller,
            });
        Ok(())
    }

    /// Test-only fault injection: flips bits of the identity (run id) stamped in both task
    /// frames of child `lane`'s mailbox (lane order: chips or level-3 children, then
    /// sub-workers), as a child scribbling on its frame would. The parent's next look at a
    /// busy frame sees an identity it never published, so the task fails as a protocol
    /// error naming the child. Not part of the API.
    ///
    /// # Errors
    /// A worker that is not initialised or already unusable; no such lane.
    #[doc(hidden)]
    pub fn inject_frame_corruption(&mut self, lane: usize) -> Result<(), DistError> {
        let rt = self.runtime("inject_frame_corruption")?;
        let base = *rt
            .mailbox_bases
            .get(lane)
            .ok_or_else(|| DistError::InvalidArgs(format!("no child lane {lane}")))?;
        for frame in 1..strata_mailbox::layout::FRAME_COUNT {
            let offset = frame * strata_mailbox::layout::FRAME_BYTES
                + std::mem::offset_of!(strata_mailbox::layout::Frame, run_id);
            // SAFETY: `base` is the start of lane `lane`'s mailbox mapping
            // (MAILBOX_BYTES long, page-aligned, so `offset` is in bounds and 8-aligned);
            // the lane owning it lives in the scheduler loop, which the runtime outlives
            // (and a loop that unwound left the worker unusable, refused above). The word
            // is an atomic shared with the child, so writing it is no data race.
            let word = unsafe { &*((base + offset) as *const std::sync::atomic::AtomicU64) };
            word.fetch_xor(0x5A5A_0000_0000_0001, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    /// Test-only fault injection: the scheduler thread panics with `message` outside any
    /// pass (the loop itself is not broken, the thread is gone). Not part of the API.
    ///
    /// # Errors
    /// A worker that is not initialised or already unusable.
    #[doc(hidden)]
    pub fn inject_scheduler_thread_panic(&mut self, message: &str) -> Result<(), DistError> {
        self.runtime("inject_scheduler_thread_panic")?
            .ctx
            .link
            .inject_thread_panic(message.to_owned());
        Ok(())
    }

    // ----- close -------------------------------------------------------------------------

    /// Waits for runs in flight (up to the close grace), stops the scheduler, shuts every
    /// child down and reaps it (killing what does not exit in time), and unlinks their
    /// shared memory. Idempotent; also runs on drop.
    ///
    /// Bounded: it returns within `close_grace` + 0.5 s (the children's least grace) +
    /// `control_timeout` (a control request the scheduler may be waiting on) + 10 s (the
    /// reap bound after `SIGKILL`), a stopped or stuck child included (`SIGKILL` ends a
    /// stopped process). A thread child that does not stop is detached, not waited for.
    ///
    /// # Errors
    /// Children that exited abnormally (the worker is closed regardless).
    pub fn close(&mut self) -> Result<(), DistError> {
        if self.state == State::Closed {
            return Ok(());
        }
        let Some(mut rt) = self.rt.take() else {
            self.state = State::Closed;
            return Ok(());
        };
        self.state = State::Closed;
        // A grace past what an `Instant` holds is clamped to a century (it waits as long as
        // the runs take, in practice) rather than overflow.
        let now = Instant::now();
        let deadline = now
            .checked_add(self.config.close_grace)
            .or_else(|| now.checked_add(FAR_FUTURE))
            .unwrap_or(now);
        while let Some(run) = rt.graph.dispatchable_run() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || rt.ctx.link.unusable().is_some() {
                break;
            }
            if rt.waiter.wait(run, Some(left)).is_err() {
                break;
            }
        }
        rt.graph.shutdown();
        rt.ctx.link.stop(deadline);
        let already_reported = rt.ctx.link.unusable().is_some();
        // A scheduler thread that panicked outside a pass left the loop in its seat,
        // children and all: take it out and shut them down all the same (a run handle
        // still holding the driver would otherwise keep them alive), then report it.
        let (exit, panicked) = match rt.sched.take().map(|h| h.join()) {
            None => (None, None),
            Some(Ok(exit)) => (Some(exit), None),
            Some(Err(p)) => (
                rt.driver.take_exit(),
                Some(DistError::Internal(format!(
                    "the scheduler thread panicked: {}",
                    strata_sync::panic_message(&*p)
                ))),
            ),
        };
        let Some(mut exit) = exit else {
            return panicked.map_or(Ok(()), Err);
        };
        // One grace for the whole close, so it ends within `close_grace` plus a bound: the
        // children get what the runs left of it, but at least a moment to exit cleanly.
        let grace = deadline
            .saturating_duration_since(Instant::now())
            .max(self.config.close_grace.min(SHUTDOWN_FLOOR));
        // Remote children are asked first and waited for after the local ones, so their
        // shutdowns overlap.
        for r in &mut exit.remotes {
            r.begin_shutdown();
        }
        let shutdown = exit.children.shutdown(grace);
        let remote_end = Instant::now().checked_add(grace);
        let mut remote_news = Vec::new();
        for mut r in exit.remotes.drain(..) {
            let until = remote_end.unwrap_or_else(Instant::now);
            if let Err(e) = r.finish_shutdown(until) {
                if !already_reported {
                    remote_news.push(e);
                }
            }
        }
        // A thread child that did not stop was detached still running its task: it may
        // go on writing into the heap rings, the comm arena and the shared tensors that
        // task names. That memory is quarantined — never handed to the next run or the
        // next worker — rather than reused under a live writer.
        let detached = shutdown.as_ref().map_or(true, |r| {
            r.children
                .iter()
                .any(|c| c.pid.is_none() && c.end.is_none())
        });
        if detached {
            for lease in rt.heap_leases.drain(..) {
                self.shared.quarantine(lease);
            }
            if let Some(lease) = rt.comm_lease.take() {
                self.shared.quarantine(lease);
            }
            // A control copy runs on the child's serving thread, never in a task, so a
            // detached task cannot be writing the staging region; it is returned as usual.
            // The abandoned tasks' tensors stay in use for good: host copies refuse and
            // their pages are never discarded.
        } else {
            for r in exit.abandoned_uses.drain(..) {
                exit.shared.release_task_use(r);
            }
            if let Some(comm) = &rt.ctx.comm {
                comm.release_all();
            }
        }
        if let Some(e) = panicked {
            return Err(e);
        }
        // Children left unreaped stay with `exit`: its drop retries them.
        let report = shutdown?;
        // A child that died before close was reported then (its run failed, the worker
        // became unusable); anything else abnormal is news.
        let mut news: Vec<String> = report
            .abnormal()
            .into_iter()
            .filter(|c| !(c.died_before_shutdown && already_reported))
            .map(|c| c.to_string())
            .collect();
        news.append(&mut remote_news);
        if news.is_empty() {
            Ok(())
        } else {
            Err(DistError::Close(news.join("; ")))
        }
    }
}

impl Drop for DistWorker {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// The mailbox failure code a level-3 child reports when the task failed because one of
/// its chips did, so the parent attributes it to a chip too
/// ([`strata_graph::WorkerClass::Chip`]).
pub(crate) const CHIP_FAILED_BELOW: i32 = 0x4348_4950; // "CHIP"

/// The least grace `close` gives the children to exit once the scheduler stopped (or
/// `close_grace`, if shorter), however much of `close_grace` the runs took.
const SHUTDOWN_FLOOR: Duration = Duration::from_millis(500);

/// What a grace too large for an [`Instant`] is clamped to: a century.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A run in flight (see [`DistWorker::submit`]).
pub struct RunHandle {
    run: RunId,
    waiter: RunWaiter,
    driver: Arc<Driver>,
    /// The outcome, once known (the graph forgets the run then).
    outcome: Option<Result<(), Failure>>,
    /// A traced run: the link whose trace book records it.
    traced: Option<Arc<Link>>,
    /// The run's trace, once its outcome was seen.
    trace: Option<strata_types::trace::Trace>,
    /// Emit the trace through `tracing` once complete (the root of a tree does; a
    /// nested worker's trace goes up to its parent instead).
    emit: bool,
    level: Level,
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle").field("run", &self.run).finish()
    }
}

impl RunHandle {
    /// The run id.
    pub fn id(&self) -> RunId {
        self.run
    }

    /// The run's trace — this worker's spans (`l3.run`, `.submit`, `.wait`; per task
    /// `.schedule` and `.dispatch` on its child's track) and everything its children sent
    /// back, on this process's clock — once [`RunHandle::wait`] saw the outcome; `None`
    /// before, or when the run was not traced ([`CallConfig::traced`], or a `tracing`
    /// subscriber listening to `strata::trace`). See `docs/tracing.md`.
    pub fn trace(&self) -> Option<&strata_types::trace::Trace> {
        self.trace.as_ref()
    }

    /// Takes the trace out of the handle (see [`RunHandle::trace`]).
    pub fn take_trace(&mut self) -> Option<strata_types::trace::Trace> {
        self.trace.take()
    }

    /// Whether the run finished.
    pub fn is_done(&self) -> bool {
        self.outcome.is_some()
            || matches!(
                self.waiter.phase(self.run),
                Some(RunPhase::Completed | RunPhase::Failed)
            )
    }

    /// Waits for the run (at most `timeout`, or forever). On success or failure the run is
    /// released; a timeout leaves it in flight (wait again later).
    ///
    /// # Errors
    /// [`DistError::TaskFailed`] with the run's first error (naming the worker and carrying
    /// the child's message); [`DistError::WaitTimeout`].
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<(), DistError> {
        if let Some(outcome) = &self.outcome {
            return outcome.clone().map_err(DistError::TaskFailed);
        }
        if let Some(l) = &self.traced {
            l.trace.wait_started(self.run, strata_sync::mono_ns());
        }
        let span = match self.level {
            Level::L3 => tracing::info_span!(target: "strata", "l3.run.wait", run = self.run.0),
            Level::L4 => tracing::info_span!(target: "strata", "l4.run.wait", run = self.run.0),
        };
        let _wait = span.enter();
        // Drive the scheduler loop on this thread while the run makes progress (a short
        // run's wait stays at cache-line speed, with no third party); park once it made
        // no progress for the spin budget.
        let (waiter, run) = (&self.waiter, self.run);
        // A timeout past what an `Instant` holds (e.g. `Duration::MAX`) is no deadline.
        let deadline = timeout.and_then(strata_sync::deadline_after);
        let broken = |b: strata_sync::Broken| DistError::Internal(b.to_string());
        self.driver
            .drive_until(deadline, || {
                matches!(
                    waiter.phase(run),
                    Some(RunPhase::Completed | RunPhase::Failed)
                )
            })
            .map_err(broken)?;
        // Block for the rest, in slices: a loop that breaks meanwhile (a pass panicked on
        // the scheduler thread) finishes nothing, and the run fails naming the panic.
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let slice = left.map_or(BROKEN_CHECK, |l| l.min(BROKEN_CHECK));
            match self.waiter.wait(self.run, Some(slice))? {
                Some(outcome) => {
                    let _ = self.waiter.release(self.run);
                    self.outcome = Some(outcome.clone());
                    if let Some(l) = self.traced.take() {
                        self.trace = l.trace.finish(self.run, strata_sync::mono_ns());
                        if let (true, Some(t)) = (self.emit, &self.trace) {
                            crate::trace::emit(t);
                        }
                    }
                    return outcome.map_err(DistError::TaskFailed);
                }
                None => {
                    if let Some(b) = self.driver.broken() {
                        return Err(broken(b));
                    }
                    if left.is_some_and(|l| l <= slice) {
                        let after = timeout.unwrap_or_default();
                        let stalled = format!("run {} did not finish within {after:?}", self.run.0);
                        let wait_for = self.driver.wait_for(stalled).map(Arc::new);
                        return Err(DistError::WaitTimeout { after, wait_for });
                    }
                }
            }
        }
    }

    /// [`RunHandle::wait`] without a timeout.
    ///
    /// # Errors
    /// As `wait`.
    pub fn result(mut self) -> Result<(), DistError> {
        self.wait(None)
    }
}

impl Drop for RunHandle {
    fn drop(&mut self) {
        if self.outcome.is_none() {
            self.waiter.release_when_done(self.run);
        }
        if let Some(l) = &self.traced {
            l.trace.discard(self.run);
        }
    }
}

/// A remote child's worker id and its open endpoint.
type Connected = (usize, Box<dyn Endpoint>);

/// Opens the endpoints of the remote children, concurrently (one thread each: a remote
/// child's `connect` blocks on its handshake), in worker-id order. On any failure the
/// endpoints already open are killed and the first error (in worker-id order) returned.
fn connect_remotes(
    remote: Vec<(usize, Box<dyn RemoteChild>)>,
    ctx: &RemoteContext,
) -> Result<Vec<Connected>, DistError> {
    /// A child's worker id, label, and its endpoint or why there is none.
    type Attempt = (usize, String, Result<Box<dyn Endpoint>, String>);
    let results: Vec<Attempt> = std::thread::scope(|scope| {
        let joins: Vec<_> = remote
            .into_iter()
            .map(|(id, child)| {
                let label = child.label();
                let ctx = RemoteContext {
                    worker_id: id,
                    ..ctx.clone()
                };
                let join = std::thread::Builder::new()
                    .name(format!("strata-connect-{id}"))
                    .spawn_scoped(scope, move || child.connect(ctx));
                (id, label, join)
            })
            .collect();
        joins
            .into_iter()
            .map(|(id, label, join)| {
                let r = match join {
                    Ok(j) => j.join().unwrap_or_else(|p| {
                        Err(format!(
                            "connecting panicked: {}",
                            strata_sync::panic_message(&*p)
                        ))
                    }),
                    Err(e) => Err(format!("cannot start a thread to connect: {e}")),
                };
                (id, label, r)
            })
            .collect()
    });
    let mut open = Vec::new();
    let mut first_error = None;
    for (id, label, r) in results {
        match r {
            Ok(e) => open.push((id, e)),
            Err(message) => {
                first_error.get_or_insert(DistError::RemoteStart(format!(
                    "worker {id} ({label}): {message}"
                )));
            }
        }
    }
    if let Some(e) = first_error {
        for (_, mut ep) in open {
            ep.kill();
        }
        return Err(e);
    }
    Ok(open)
}
