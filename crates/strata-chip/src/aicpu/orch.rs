//! The chip orchestration API ([`ChipOrch`], running on the emulated AICPU's orchestrator
//! thread) and the orchestrator thread's loop.

use crate::aicore::kernels::{KernelRef, KernelTable};
use crate::aicpu::sched::{RunCtl, SchedCell, SchedMsg, SchedShared, Topology, BROKEN_CHECK};
use crate::aicpu::tensor::{
    ArgTensor, ChipTensor, CoreArgs, MixedKernels, TaskOutputs, TensorCreateInfo,
};
use crate::config::RingSizing;
use crate::device::arena::{external_order_identity, is_external, Arena};
use crate::error::{codes, ChipError};
use crate::task::{KTensor, Meta, Shape, TaskDesc};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_graph::{
    Access, BufferKey, Failure, FailureKind, Footprint, GraphError, KeySpace, Orchestrator,
    Overlap, RingConfig, TaskRef, TaskSpec,
};
use strata_sync::{CpuHint, Driven, Slot};
use strata_types::{
    error_chain, ArgTag, CallbackResult, DataType, Element, IdentityMinter, Scalar, RING_COUNT,
};

/// A chip orchestration: runs on the emulated AICPU and submits kernel tasks. Its error
/// (any error, boxed) fails the run with [`ChipError::OrchestrationFailed`] carrying the
/// error's message ([`strata_types::error_chain`]); a fatal error it latched
/// ([`ChipOrch::report_fatal`], or one the API latched) fails the run with that code.
pub type OrchestrationFn = Arc<dyn Fn(&mut ChipOrch, &ChipArgs) -> CallbackResult + Send + Sync>;

/// A registered orchestration as a run request carries it: its name (for messages) and
/// its function, in one allocation, so handing it to the orchestrator costs one
/// reference count.
pub(crate) struct OrchCallable {
    pub(crate) name: Box<str>,
    pub(crate) f: OrchestrationFn,
}

/// The arguments of a run as the orchestration sees them: entry tensors (already in device
/// memory) and scalars.
#[derive(Debug, Clone, Default)]
pub struct ChipArgs {
    pub(crate) tensors: Vec<ChipTensor>,
    pub(crate) scalars: Vec<u64>,
}

impl ChipArgs {
    /// Entry tensor `i`.
    ///
    /// # Errors
    /// [`ChipError::InvalidRunArgs`] if there is no tensor `i`.
    pub fn tensor(&self, i: usize) -> Result<ChipTensor, ChipError> {
        self.tensors.get(i).copied().ok_or_else(|| {
            ChipError::InvalidRunArgs(format!(
                "the run has {} tensor arguments; there is no tensor {i}",
                self.tensors.len()
            ))
        })
    }

    /// Scalar `i` reinterpreted as `S`.
    ///
    /// # Errors
    /// [`ChipError::InvalidRunArgs`] if there is no scalar `i`.
    pub fn scalar<S: Scalar>(&self, i: usize) -> Result<S, ChipError> {
        self.scalars
            .get(i)
            .map(|&b| S::from_bits(b))
            .ok_or_else(|| {
                ChipError::InvalidRunArgs(format!(
                    "the run has {} scalar arguments; there is no scalar {i}",
                    self.scalars.len()
                ))
            })
    }

    /// Number of tensors.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Number of scalars.
    pub fn scalar_count(&self) -> usize {
        self.scalars.len()
    }
}

/// How many submits pass between two checks of the live-task count.
const THROTTLE_CHECK_EVERY: u32 = 32;
/// Most live tasks the orchestrator lets a run have before it waits for completions.
const THROTTLE_MAX_AHEAD: u64 = 4096;

/// One run request for the orchestrator thread.
pub(crate) struct OrchRequest {
    /// The orchestration.
    pub(crate) callable: Arc<OrchCallable>,
    pub(crate) args: ChipArgs,
    /// The run's kernel table snapshot (what kernel references resolve in).
    pub(crate) kernels: Arc<KernelTable>,
    pub(crate) rings: [RingSizing; RING_COUNT],
    pub(crate) reconfigure: bool,
    pub(crate) ring_bases: [u64; RING_COUNT],
    /// The run's epoch on this chip: the handles it produces carry it.
    pub(crate) run: u64,
    /// The scheduler's settings for the run, sent to it just before the run's first task.
    pub(crate) ctl: RunCtl,
}

/// What the orchestrator thread reports for a run.
pub(crate) struct OrchReply {
    /// The latched fatal error, if any.
    pub(crate) fatal: Option<ChipError>,
    /// The orchestration's own error (returned or panicked), if not a fatal.
    pub(crate) orch_error: Option<ChipError>,
    /// The graph's verdict: the run's first error.
    pub(crate) graph: Result<(), Failure>,
    /// Setup errors (ring reconfiguration) that prevented the run.
    pub(crate) setup_error: Option<ChipError>,
    pub(crate) t_thread_start: u64,
    pub(crate) t_orch_start: u64,
    pub(crate) t_orch_end: u64,
    pub(crate) t_done: u64,
    pub(crate) tasks: u64,
    /// Whether the scheduler took part in the run (was sent its `Begin`): only then does
    /// it have a report to collect.
    pub(crate) sched_used: bool,
}

/// What the host posts to the orchestrator thread.
// The request moves through the slot once per run; boxing it would cost an allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum OrchMsg {
    Run(OrchRequest),
    Exit,
}

/// The host ↔ orchestrator thread hand-off: the host posts a request and waits for the
/// reply; the orchestrator thread waits for requests. Both waits spin (yielding after a
/// few µs) for up to `ChipConfig::idle_spin`, then park, so back-to-back runs hand over
/// at cache-line latency and an idle chip's orchestrator uses no CPU.
#[derive(Default)]
pub(crate) struct OrchLink {
    /// Host → orchestrator thread (whose doorbell it rings).
    pub(crate) request: Slot<OrchMsg>,
    /// Orchestrator thread → host (whose doorbell it rings).
    pub(crate) reply: Slot<OrchReply>,
    /// Where the orchestrator thread and the host last ran (see [`CpuHint`]).
    pub(crate) orch_cpu: CpuHint,
    pub(crate) host_cpu: CpuHint,
}

/// The chip orchestration API: what a chip orchestration gets (`&mut ChipOrch`) while it
/// runs on the emulated AICPU. It submits kernel tasks (dependencies are inferred from the
/// argument tags with sequential semantics), opens scopes, allocates intermediate
/// tensors, reads and writes tensor data, and reports fatal errors.
///
/// Once a fatal error is latched (a ring deadlock, invalid arguments, an explicit
/// [`ChipOrch::report_fatal`], ...), every later call does nothing and returns that
/// error; the run fails with its code.
pub struct ChipOrch {
    graph: Orchestrator<Arc<TaskDesc>>,
    kernels: Arc<KernelTable>,
    arena: Arc<Arena>,
    shared: Arc<SchedShared>,
    /// The scheduler, which the orchestrator drives itself while it waits for a run.
    sched: Arc<SchedCell>,
    topo: Topology,
    chip_id: u32,
    /// This chip's nonce and the current run's epoch: every handle the run hands out
    /// carries both, and every handle it is given is checked against both.
    nonce: u64,
    run_epoch: u64,
    minter: IdentityMinter,
    rings: [RingSizing; RING_COUNT],
    ring_bases: [u64; RING_COUNT],
    tensor_wait: Duration,
    fatal: Option<ChipError>,
    heartbeat: Arc<AtomicU64>,
    tasks: u64,
    throttle: Option<(u64, u64)>,
    since_check: u32,
    /// The run's scheduler settings until they are sent (before its first task).
    pending_begin: Option<RunCtl>,
    free_descs: Vec<Arc<TaskDesc>>,
    accesses: Vec<Access>,
    created: Vec<BufferKey>,
    deps: Vec<TaskRef>,
}

impl std::fmt::Debug for ChipOrch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChipOrch")
            .field("chip_id", &self.chip_id)
            .field("tasks", &self.tasks)
            .field("fatal", &self.fatal)
            .finish_non_exhaustive()
    }
}

fn knob(ring: usize, field: &str, rings: &[RingSizing; RING_COUNT]) -> String {
    let v = match field {
        "task_window" => rings[ring].task_window,
        "heap_bytes" => rings[ring].heap_bytes_aligned(),
        _ => rings[ring].dep_pool,
    };
    format!(
        " [ring {ring} {field} = {v}: raise ChipConfig::rings[{ring}].{field}, or CallConfig::rings[{ring}].{field} for one run]"
    )
}

impl ChipOrch {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        graph: Orchestrator<Arc<TaskDesc>>,
        arena: Arc<Arena>,
        shared: Arc<SchedShared>,
        topo: Topology,
        (chip_id, nonce): (u32, u64),
        tensor_wait: Duration,
        heartbeat: Arc<AtomicU64>,
        sched: Arc<SchedCell>,
    ) -> Self {
        ChipOrch {
            sched,
            graph,
            kernels: Arc::new(KernelTable::default()),
            arena,
            shared,
            topo,
            chip_id,
            nonce,
            run_epoch: 0,
            minter: IdentityMinter::new(),
            rings: [RingSizing::default(); RING_COUNT],
            ring_bases: [0; RING_COUNT],
            tensor_wait,
            fatal: None,
            heartbeat,
            tasks: 0,
            throttle: None,
            since_check: 0,
            pending_begin: None,
            free_descs: Vec::new(),
            accesses: Vec::new(),
            created: Vec::new(),
            deps: Vec::new(),
        }
    }

    // ----- fatal latch -------------------------------------------------------------------

    fn enter(&mut self) -> Result<(), ChipError> {
        self.heartbeat.fetch_add(1, Ordering::Relaxed);
        match &self.fatal {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn latch(&mut self, code: i32, message: impl Into<String>) -> ChipError {
        if self.fatal.is_none() {
            self.fatal = Some(ChipError::fatal(code, message));
        }
        self.fatal.clone().expect("just latched")
    }

    /// Latches a typed error as the run's fatal one (the run fails with its code).
    fn latch_typed(&mut self, e: ChipError) -> ChipError {
        if self.fatal.is_none() {
            self.fatal = Some(e);
        }
        self.fatal.clone().expect("just latched")
    }

    /// Refuses a handle from another chip or another run: its address may name another
    /// buffer's bytes now. Two integer compares on the hot path.
    #[inline]
    fn check_handle(&mut self, t: &ChipTensor) -> Result<(), ChipError> {
        if t.run == self.run_epoch && t.chip == self.nonce {
            return Ok(());
        }
        Err(self.handle_error(t))
    }

    #[cold]
    fn handle_error(&mut self, t: &ChipTensor) -> ChipError {
        let e = if t.chip != self.nonce {
            ChipError::ForeignTensor {
                handle_chip: t.chip,
                this_chip: self.nonce,
            }
        } else {
            ChipError::StaleTensor {
                handle_run: t.run,
                current_run: self.run_epoch,
            }
        };
        self.latch_typed(e)
    }

    /// Latches a fatal error (the reference's `rt_report_fatal`; code 9,
    /// [`codes::EXPLICIT_ORCH_FATAL`], is the conventional one). Every later API call does
    /// nothing and returns it; the run fails with this code. Returns the error, so an
    /// orchestration can `return Err(orch.report_fatal(9, "..."))`.
    pub fn report_fatal(&mut self, code: i32, message: impl Into<String>) -> ChipError {
        self.heartbeat.fetch_add(1, Ordering::Relaxed);
        self.latch(code, message)
    }

    /// Whether a fatal error is latched.
    pub fn is_fatal(&self) -> bool {
        self.fatal.is_some()
    }

    fn graph_error(&mut self, e: GraphError) -> ChipError {
        match e {
            GraphError::RunFailed(f) => ChipError::RunFailed {
                code: f.code(),
                message: f.message().to_owned(),
            },
            GraphError::Timeout { what, after } => {
                let stalled = format!("waited {} ms for {what}", after.as_millis());
                let wait_for = self.sched.wait_for(stalled).map(Box::new);
                self.latch_typed(ChipError::Fatal {
                    code: codes::TENSOR_WAIT_TIMEOUT,
                    message: format!(
                        "waited {} ms for {what}; raise ChipConfig::tensor_wait_timeout if the producer is just slow",
                        after.as_millis()
                    ),
                    wait_for,
                })
            }
            GraphError::HeapDeadlock {
                ring,
                ring_bytes,
                request,
                free,
                cause,
            } if self.fatal.is_none() => {
                let message = format!("{e}{}", knob(ring, "heap_bytes", &self.rings));
                let stalled = format!(
                    "heap ring {ring} ({ring_bytes} bytes) cannot make room for {request} bytes: {cause}"
                );
                let held_by = self
                    .graph
                    .ring_holders(ring, strata_types::WAIT_FOR_MAX_IDS)
                    .iter()
                    .map(|t| t.id().0)
                    .collect();
                let mut wait_for =
                    self.sched
                        .wait_for(stalled.clone())
                        .unwrap_or_else(|| strata_types::WaitFor {
                            place: "chip".into(),
                            stalled,
                            ..Default::default()
                        });
                wait_for.rings.push(strata_types::RingWait {
                    ring: ring as u32,
                    heap_bytes: ring_bytes,
                    requested: request,
                    free,
                    held_by,
                });
                self.latch_typed(ChipError::Fatal {
                    code: codes::HEAP_RING_DEADLOCK,
                    message,
                    wait_for: Some(Box::new(wait_for)),
                })
            }
            e => match e.fatal_code() {
                Some(code) => {
                    let hint = match &e {
                        GraphError::ScopeDeadlock { ring, .. }
                        | GraphError::FlowControlDeadlock { ring, .. } => {
                            knob(*ring, "task_window", &self.rings)
                        }
                        GraphError::HeapDeadlock { ring, .. }
                        | GraphError::HeapRequestTooLarge { ring, .. }
                        | GraphError::HeapDisabled { ring, .. } => {
                            knob(*ring, "heap_bytes", &self.rings)
                        }
                        GraphError::DepPoolOverflow { ring, .. } => {
                            knob(*ring, "dep_pool", &self.rings)
                        }
                        _ => String::new(),
                    };
                    self.latch(code, format!("{e}{hint}"))
                }
                None => self.latch(codes::INVALID_ARGS, format!("graph error: {e}")),
            },
        }
    }

    // ----- topology ----------------------------------------------------------------------

    fn healthy(&self, c: u32) -> bool {
        !self.shared.lost[c as usize].load(Ordering::Acquire)
    }

    /// MIX clusters in service (the reference's `rt_available_cluster_count`): clusters
    /// whose AIC and both AIV cores are in service.
    pub fn available_cluster_count(&self) -> u32 {
        self.topo.capacity(Shape::Mix(7), 7, |c| self.healthy(c))
    }

    /// AIV cores in service (the reference's `rt_available_aiv_count`).
    pub fn available_aiv_count(&self) -> u32 {
        self.topo.capacity(Shape::Aiv, 2, |c| self.healthy(c))
    }

    /// AIC cores in service.
    pub fn available_aic_count(&self) -> u32 {
        self.topo.capacity(Shape::Aic, 1, |c| self.healthy(c))
    }

    /// Tasks submitted in this run so far (including dependency-only tasks).
    pub fn submitted_tasks(&self) -> u64 {
        self.tasks
    }

    // ----- submission --------------------------------------------------------------------

    /// Submits a task running `kernels` (any non-empty mix of AIC, AIV0 and AIV1 kernels,
    /// or none for a dependency-only task) on `args`.
    ///
    /// # Errors
    /// A latched fatal: INVALID_ARGS (5) for bad arguments or kernels, REQUIRE_SYNC_START_INVALID
    /// (7), ring errors 1–4 with the ring, its size and the knob to raise; or
    /// [`ChipError::RunFailed`] if a task of the run already failed (fail-fast, not latched).
    pub fn submit(
        &mut self,
        kernels: MixedKernels,
        args: &CoreArgs,
    ) -> Result<TaskOutputs, ChipError> {
        self.enter()?;
        self.submit_inner(kernels, args)
    }

    /// Submits an AIC-only task.
    ///
    /// # Errors
    /// As [`ChipOrch::submit`].
    pub fn submit_aic(
        &mut self,
        kernel: impl Into<KernelRef>,
        args: &CoreArgs,
    ) -> Result<TaskOutputs, ChipError> {
        self.submit(MixedKernels::none().with_aic(kernel), args)
    }

    /// Submits an AIV-only task (placed on any AIV core).
    ///
    /// # Errors
    /// As [`ChipOrch::submit`].
    pub fn submit_aiv(
        &mut self,
        kernel: impl Into<KernelRef>,
        args: &CoreArgs,
    ) -> Result<TaskOutputs, ChipError> {
        self.submit(MixedKernels::none().with_aiv0(kernel), args)
    }

    /// Submits a dependency-only task: it takes part in dependency inference like any
    /// task, runs no kernel, and is completed by the scheduler.
    ///
    /// # Errors
    /// As [`ChipOrch::submit`].
    pub fn submit_dummy(&mut self, args: &CoreArgs) -> Result<TaskOutputs, ChipError> {
        self.submit(MixedKernels::none(), args)
    }

    fn resolve(&mut self, k: Option<KernelRef>) -> Result<Option<u32>, ChipError> {
        match k {
            None => Ok(None),
            Some(k) => match self.kernels.resolve_func(k) {
                Ok(f) => Ok(Some(f)),
                Err(e) => Err(self.latch(codes::INVALID_ARGS, e.to_string())),
            },
        }
    }

    /// Keeps the orchestrator from running into the graph's window back-pressure one task
    /// at a time: when the run's live tasks approach the task window, sleep until the
    /// scheduler has completed a good batch of them (one wake-up per batch instead of one
    /// per task). The graph's own back-pressure and deadlock detection stay the backstop.
    fn throttle(&mut self) {
        let Some((high, low)) = self.throttle else {
            return;
        };
        self.since_check += 1;
        if self.since_check < THROTTLE_CHECK_EVERY {
            return;
        }
        self.since_check = 0;
        if self.graph.live_tasks() < high {
            return;
        }
        loop {
            let live = self.graph.live_tasks();
            if live <= low {
                break;
            }
            let done = self.shared.completed.load(Ordering::SeqCst);
            let target = done + (live - low);
            self.shared.orch_wake_at.store(target, Ordering::SeqCst);
            let shared = &self.shared;
            shared.orch_bell.sleep(Some(Duration::from_millis(2)), || {
                shared.completed.load(Ordering::SeqCst) >= target
            });
            if self.shared.completed.load(Ordering::SeqCst) == done {
                // Nothing completed: live tasks are held by scopes or waiting on something
                // slow; leave it to the graph's back-pressure.
                break;
            }
        }
        self.shared.orch_wake_at.store(u64::MAX, Ordering::SeqCst);
    }

    fn submit_inner(
        &mut self,
        kernels: MixedKernels,
        args: &CoreArgs,
    ) -> Result<TaskOutputs, ChipError> {
        self.throttle();
        if let Some(e) = &args.error {
            let e = e.clone();
            return Err(self.latch(codes::INVALID_ARGS, e));
        }
        let mut entries = [
            self.resolve(kernels.aic)?,
            self.resolve(kernels.aiv0)?,
            self.resolve(kernels.aiv1)?,
        ];
        let mask = kernels.mask();
        let shape = match mask {
            0 => Shape::Dummy,
            1 => Shape::Aic,
            2 => Shape::Aiv,
            4 => {
                entries.swap(1, 2); // an AIV1-only task is an AIV task
                Shape::Aiv
            }
            m => Shape::Mix(m),
        };
        if shape != Shape::Dummy {
            let total = self.topo.capacity(shape, mask, |_| true);
            if total == 0 {
                let what = match shape {
                    Shape::Aic => "an AIC core (ChipConfig::aic_cores)".to_owned(),
                    Shape::Aiv => "an AIV core (ChipConfig::aiv_cores)".to_owned(),
                    _ => format!("a cluster with every lane of mask {mask:#05b} (ChipConfig::aic_cores / aiv_cores)"),
                };
                return Err(self.latch(
                    codes::INVALID_ARGS,
                    format!("the task needs {what}, and this chip has none"),
                ));
            }
            if args.sync_start && args.block_num > 1 {
                let avail = self.topo.capacity(shape, mask, |c| self.healthy(c));
                if args.block_num > avail {
                    return Err(self.latch(
                        codes::REQUIRE_SYNC_START_INVALID,
                        format!(
                            "require_sync_start with block_num = {} but only {avail} {} are available; lower block_num or configure more cores",
                            args.block_num,
                            match shape {
                                Shape::Aic => "AIC cores",
                                Shape::Aiv => "AIV cores",
                                _ => "clusters",
                            }
                        ),
                    ));
                }
            }
        }

        // The payload: a recycled one (its vectors keep their capacity) or a new one.
        let mut desc = self.fresh_desc();
        let d = Arc::get_mut(&mut desc).expect("fresh payloads are unique");
        d.kernels = entries;
        d.shape = shape;
        d.block_num = args.block_num;
        d.sync_start = args.sync_start;
        d.scalars.clear();
        d.scalars.extend_from_slice(&args.scalars);
        *d.slab_base.get_mut() = 0;
        let mut ktensors = std::mem::take(&mut d.tensors);
        ktensors.clear();

        // Tensors.
        let mut accesses = std::mem::take(&mut self.accesses);
        let mut created = std::mem::take(&mut self.created);
        accesses.clear();
        created.clear();
        let result = self.build_tensors(args, &mut accesses, &mut created, &mut ktensors);
        let (inits, heap) = match result {
            Ok(x) => x,
            Err(e) => {
                self.accesses = accesses;
                self.created = created;
                return Err(e);
            }
        };
        let mut deps = std::mem::take(&mut self.deps);
        deps.clear();
        for dep in &args.deps {
            match dep.0 {
                Some(t) => deps.push(t),
                None => {
                    self.accesses = accesses;
                    self.created = created;
                    self.deps = deps;
                    return Err(self.latch(
                        codes::INVALID_ARGS,
                        "explicit dependency on an invalid task id (ChipTaskId::INVALID): pass the id of a task submitted earlier in this run",
                    ));
                }
            }
        }
        let d = Arc::get_mut(&mut desc).expect("fresh payloads are unique");
        d.claims.reset(ktensors.len());
        d.tensors = ktensors;
        *d.armed.get_mut() = heap == 0;
        let meta = Meta {
            shape,
            block_num: args.block_num,
            sync_start: args.sync_start,
            needs_arm: heap > 0,
            funcs: entries,
        };
        // Tasks that create tensors keep a handle to arm them after the submit.
        let keep = (heap > 0).then(|| desc.clone());
        let mut spec = TaskSpec::new(desc, &accesses)
            .with_deps(&deps)
            .with_route(meta.encode());
        if heap > 0 {
            spec = spec.with_heap(heap, &created);
        }
        if let Some(ctl) = self.pending_begin.take() {
            // The run's first task: tell the scheduler (no wake-up: the task's `Ready`, or
            // the completion that readies it, follows in the same queue).
            self.shared.post_quiet(SchedMsg::Begin(ctl));
        }
        let submitted = self.graph.submit(spec);
        self.deps = deps;
        let s = match submitted {
            Ok(s) => s,
            Err(e) => {
                self.accesses = accesses;
                self.created = created;
                return Err(self.graph_error(e));
            }
        };
        self.tasks += 1;
        let mut outputs = Vec::new();
        if let Some(desc) = keep {
            let slab = s.heap.expect("a task with heap bytes has a slab");
            let base = self.ring_bases[slab.ring] + slab.offset;
            desc.slab_base.store(base, Ordering::Relaxed);
            for (k, t) in desc.tensors.iter().enumerate().filter(|(_, t)| t.created) {
                if let Some((_, bytes)) = inits.iter().find(|(i, _)| *i == k) {
                    let n = t.view.dtype().size_bytes();
                    // Fill before arming: the task (and its consumers) start only after.
                    let _ = self.arena.fill(base + t.addr, t.size, &bytes[..n]);
                }
                outputs.push(ChipTensor {
                    key: created[outputs.len()],
                    addr: base + t.addr,
                    size: t.size,
                    view: t.view,
                    manual_dep: !t.tracked,
                    chip: self.nonce,
                    run: self.run_epoch,
                });
            }
            desc.armed.store(true, Ordering::Release);
        }
        self.accesses = accesses;
        self.created = created;
        if s.ready {
            self.shared.send(SchedMsg::Ready(s.task));
        }
        Ok(TaskOutputs {
            task: Some(s.task),
            outputs,
        })
    }

    #[allow(clippy::type_complexity)]
    fn build_tensors(
        &mut self,
        args: &CoreArgs,
        accesses: &mut Vec<Access>,
        created: &mut Vec<BufferKey>,
        kt: &mut Vec<KTensor>,
    ) -> Result<(Vec<(usize, [u8; 8])>, u64), ChipError> {
        let mut inits = Vec::new();
        let mut heap = 0u64;
        for (i, a) in args.tensors.iter().enumerate() {
            match a {
                ArgTensor::Existing(t, tag) => {
                    self.check_handle(t)?;
                    if t.key.space != KeySpace::Device(self.chip_id) {
                        return Err(self.latch(
                            codes::INVALID_ARGS,
                            format!(
                                "tensor argument {i} lives in {:?}, not on this chip (device {})",
                                t.key.space, self.chip_id
                            ),
                        ));
                    }
                    let tracked = !t.manual_dep && *tag != ArgTag::NoDep;
                    // A zero-size tensor has no byte to order (the reference skips it).
                    let dep_tag = if tracked && !t.view.is_empty() {
                        *tag
                    } else {
                        ArgTag::NoDep
                    };
                    accesses.push(Access::new(t.key, Footprint::of_view(&t.view), dep_tag));
                    kt.push(KTensor {
                        addr: t.addr,
                        created: false,
                        size: t.size,
                        view: t.view,
                        tag: *tag,
                        tracked,
                    });
                }
                ArgTensor::Create(ci) => {
                    let view = match self.create_view(ci) {
                        Ok(v) => v,
                        Err(e) => {
                            return Err(self.latch(codes::INVALID_ARGS, format!("output {i}: {e}")))
                        }
                    };
                    let Some(bytes) = view.nbytes().checked_next_multiple_of(1024) else {
                        return Err(self.latch(
                            codes::INVALID_ARGS,
                            format!(
                                "output {i}: {} bytes rounded up to 1024 overflow a u64",
                                view.nbytes()
                            ),
                        ));
                    };
                    created.push(BufferKey::new(
                        self.minter.mint(),
                        KeySpace::Device(self.chip_id),
                    ));
                    if let Some((_, b)) = ci.init {
                        inits.push((i, b));
                    }
                    kt.push(KTensor {
                        addr: heap,
                        created: true,
                        size: bytes,
                        view,
                        tag: ArgTag::Output,
                        tracked: !ci.manual_dep,
                    });
                    heap += bytes;
                }
            }
        }
        // External memory (windows): a kernel holding any view of a buffer may write it
        // and signal through it, so the task also writes the buffer's ordering key, once
        // per buffer: tasks that name the buffer run one at a time, in submit order.
        for (i, t) in kt.iter().enumerate() {
            if t.created || !t.tracked || !is_external(t.addr) {
                continue;
            }
            if kt[..i]
                .iter()
                .any(|u| !u.created && u.tracked && u.addr == t.addr)
            {
                continue;
            }
            let whole = Footprint::bytes(0, t.size.max(1)).map_err(|e| {
                self.latch(codes::INVALID_ARGS, format!("tensor argument {i}: {e}"))
            })?;
            let key = BufferKey::new(
                external_order_identity(t.addr),
                KeySpace::Device(self.chip_id),
            );
            accesses.push(Access::new(key, whole, ArgTag::InOut));
        }
        if let Some((i, j)) = aliasing_pair(kt) {
            return Err(self.latch(
                codes::INVALID_ARGS,
                format!(
                    "argument {i} ({}) and argument {j} ({}) may overlap in device memory and one of them is written; pass the data once (tag it INOUT) or use disjoint views",
                    kt[i].tag, kt[j].tag
                ),
            ));
        }
        Ok((inits, heap))
    }

    /// A unique payload to fill: reused from the scheduler's returns when possible.
    fn fresh_desc(&mut self) -> Arc<TaskDesc> {
        loop {
            if self.free_descs.is_empty()
                && self.shared.recycled_pending.swap(false, Ordering::AcqRel)
            {
                let mut pool = self
                    .shared
                    .recycled
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                std::mem::swap(&mut *pool, &mut self.free_descs);
            }
            match self.free_descs.pop() {
                Some(d) if Arc::strong_count(&d) == 1 => return d,
                Some(_) => continue, // another block still holds it; dropped here
                None => {
                    return Arc::new(TaskDesc {
                        kernels: [None; 3],
                        shape: Shape::Dummy,
                        block_num: 1,
                        sync_start: false,
                        tensors: Vec::new(),
                        scalars: Vec::new(),
                        claims: Default::default(),
                        slab_base: AtomicU64::new(0),
                        armed: AtomicBool::new(true),
                    })
                }
            }
        }
    }

    fn create_view(&self, ci: &TensorCreateInfo) -> Result<strata_types::TensorView, ChipError> {
        ci.view()
    }

    /// Allocates runtime-owned tensors in the current scope's heap ring without a kernel
    /// (the reference's `alloc_tensors`): each is a hidden task that completes at once;
    /// its id can be used as an explicit dependency. Tensors with an initial value are
    /// filled now.
    ///
    /// # Errors
    /// INVALID_ARGS for a bad shape or empty list; ring errors as for a submit.
    pub fn alloc_tensors(&mut self, infos: &[TensorCreateInfo]) -> Result<TaskOutputs, ChipError> {
        self.enter()?;
        if infos.is_empty() {
            return Err(self.latch(
                codes::INVALID_ARGS,
                "alloc_tensors needs at least one TensorCreateInfo",
            ));
        }
        let mut out = TaskOutputs::default();
        for (i, ci) in infos.iter().enumerate() {
            let view = match ci.view() {
                Ok(v) => v,
                Err(e) => {
                    return Err(self.latch(codes::INVALID_ARGS, format!("alloc_tensors[{i}]: {e}")))
                }
            };
            let key = BufferKey::new(self.minter.mint(), KeySpace::Device(self.chip_id));
            let (task, slab) = match self.graph.alloc(key, view.nbytes()) {
                Ok(x) => x,
                Err(e) => return Err(self.graph_error(e)),
            };
            self.tasks += 1;
            let addr = self.ring_bases[slab.ring] + slab.offset;
            if let Some((_, bytes)) = ci.init {
                let _ = self
                    .arena
                    .fill(addr, slab.len, &bytes[..view.dtype().size_bytes()]);
            }
            out.task.get_or_insert(task);
            out.outputs.push(ChipTensor {
                key,
                addr,
                size: slab.len,
                view,
                manual_dep: ci.manual_dep,
                chip: self.nonce,
                run: self.run_epoch,
            });
        }
        Ok(out)
    }

    // ----- scopes ------------------------------------------------------------------------

    /// Opens a nested scope: tasks that own runtime-created tensors are retained until it
    /// ends, and its allocations come from the heap ring of its depth (clamped at 3).
    ///
    /// # Errors
    /// INVALID_ARGS past 64 nested scopes.
    pub fn scope_begin(&mut self) -> Result<(), ChipError> {
        self.enter()?;
        self.graph.scope_begin().map_err(|e| self.graph_error(e))
    }

    /// Ends the innermost scope. Never blocks.
    ///
    /// # Errors
    /// INVALID_ARGS without a matching `scope_begin`.
    pub fn scope_end(&mut self) -> Result<(), ChipError> {
        self.enter()?;
        if self.graph.scope_depth() <= 1 {
            return Err(self.latch(
                codes::INVALID_ARGS,
                "scope_end without a matching scope_begin",
            ));
        }
        self.graph.scope_end().map_err(|e| self.graph_error(e))
    }

    /// Runs `f` inside a nested scope (the scope ends even if `f` fails). Like the
    /// orchestration itself, `f` returns a [`CallbackResult`], so `?` works on any error.
    ///
    /// # Errors
    /// `f`'s error, or the scope's (a boxed [`ChipError`]).
    pub fn scope<R>(
        &mut self,
        f: impl FnOnce(&mut ChipOrch) -> CallbackResult<R>,
    ) -> CallbackResult<R> {
        self.scope_begin()?;
        let r = f(self);
        let end = if self.fatal.is_none() {
            self.scope_end()
        } else {
            Ok(())
        };
        let r = r?;
        end?;
        Ok(r)
    }

    /// Open scopes, counting the run's implicit outer scope.
    pub fn scope_depth(&self) -> usize {
        self.graph.scope_depth()
    }

    // ----- data access -------------------------------------------------------------------

    fn element_access(
        &mut self,
        t: &ChipTensor,
        index: &[u64],
        dtype: DataType,
        tag: ArgTag,
    ) -> Result<(u64, Access), ChipError> {
        if t.view.dtype() != dtype {
            return Err(ChipError::DtypeMismatch {
                have: t.view.dtype(),
                want: dtype,
            });
        }
        self.check_handle(t)?;
        if t.key.space != KeySpace::Device(self.chip_id) {
            return Err(self.latch(codes::INVALID_ARGS, "tensor of another chip"));
        }
        self.check_not_external(t)?;
        let off = t.view.element_byte_offset(index)?;
        let fp = Footprint::bytes(off, off + dtype.size_bytes() as u64)?;
        Ok((t.addr + off, Access::new(t.key, fp, tag)))
    }

    /// Orchestration data access does not reach external memory (a window peers may
    /// write at any time; the orchestration cannot wait for them).
    fn check_not_external(&mut self, t: &ChipTensor) -> Result<(), ChipError> {
        if is_external(t.addr) {
            return Err(self.latch(
                codes::INVALID_ARGS,
                "the tensor is in external memory (a window of distributed memory that peers may write at any time): an orchestration cannot read or write it; do that in a kernel, through the window (ctx.window(i)) or ctx.shared(i)",
            ));
        }
        Ok(())
    }

    fn wait_access(&mut self, access: &Access) -> Result<(), ChipError> {
        let r = self.graph.wait_for_access(access, Some(self.tensor_wait));
        r.map_err(|e| self.graph_error(e))
    }

    /// Reads one element, after every earlier task that writes it has finished.
    ///
    /// # Errors
    /// [`ChipError::DtypeMismatch`], [`ChipError::Types`] for a bad index;
    /// TENSOR_WAIT_TIMEOUT (8) if the producers take longer than
    /// [`crate::ChipConfig::tensor_wait_timeout`]; the producer's failure.
    pub fn get_tensor_data<T: Element>(
        &mut self,
        t: &ChipTensor,
        index: &[u64],
    ) -> Result<T, ChipError> {
        self.enter()?;
        let (addr, access) = self.element_access(t, index, T::DTYPE, ArgTag::Input)?;
        if !t.manual_dep {
            self.wait_access(&access)?;
        }
        self.arena.read_elem::<T>(addr)
    }

    /// Writes one element, after every earlier task that reads or writes it has finished.
    ///
    /// # Errors
    /// As [`ChipOrch::get_tensor_data`].
    pub fn set_tensor_data<T: Element>(
        &mut self,
        t: &ChipTensor,
        index: &[u64],
        value: T,
    ) -> Result<(), ChipError> {
        self.enter()?;
        let (addr, access) = self.element_access(t, index, T::DTYPE, ArgTag::OutputExisting)?;
        if !t.manual_dep {
            self.wait_access(&access)?;
        }
        self.arena.write_elem(addr, value)
    }

    /// Reads a whole tensor (row-major), after its producers finished.
    ///
    /// # Errors
    /// As [`ChipOrch::get_tensor_data`].
    pub fn read_tensor<T: Element>(&mut self, t: &ChipTensor) -> Result<Vec<T>, ChipError> {
        self.enter()?;
        self.check_handle(t)?;
        self.check_not_external(t)?;
        if t.view.dtype() != T::DTYPE {
            return Err(ChipError::DtypeMismatch {
                have: t.view.dtype(),
                want: T::DTYPE,
            });
        }
        if !t.manual_dep && !t.view.is_empty() {
            let a = Access::new(t.key, Footprint::of_view(&t.view), ArgTag::Input);
            self.wait_access(&a)?;
        }
        let mut out = Vec::with_capacity(t.view.numel() as usize);
        for off in t.view.element_offsets() {
            out.push(self.arena.read_elem::<T>(t.addr + off)?);
        }
        Ok(out)
    }

    /// Writes a whole tensor (row-major), after its readers and writers finished.
    ///
    /// # Errors
    /// As [`ChipOrch::get_tensor_data`], plus [`ChipError::InvalidRunArgs`] if `data` has
    /// the wrong length.
    pub fn write_tensor<T: Element>(
        &mut self,
        t: &ChipTensor,
        data: &[T],
    ) -> Result<(), ChipError> {
        self.enter()?;
        self.check_handle(t)?;
        self.check_not_external(t)?;
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
        if !t.manual_dep && !t.view.is_empty() {
            let a = Access::new(t.key, Footprint::of_view(&t.view), ArgTag::OutputExisting);
            self.wait_access(&a)?;
        }
        for (off, v) in t.view.element_offsets().zip(data) {
            self.arena.write_elem(t.addr + off, *v)?;
        }
        Ok(())
    }

    // ----- the orchestrator thread -------------------------------------------------------

    pub(crate) fn run_request(&mut self, req: &OrchRequest) -> OrchReply {
        let t_thread_start = strata_sync::mono_ns();
        let mut reply = OrchReply {
            fatal: None,
            orch_error: None,
            graph: Ok(()),
            setup_error: None,
            t_thread_start,
            t_orch_start: t_thread_start,
            t_orch_end: t_thread_start,
            t_done: t_thread_start,
            tasks: 0,
            sched_used: false,
        };
        if req.reconfigure {
            let rings: [RingConfig; RING_COUNT] = std::array::from_fn(|i| req.rings[i].graph());
            if let Err(e) = self.graph.configure_rings(rings) {
                reply.setup_error = Some(ChipError::Internal(format!("configure_rings: {e}")));
                return reply;
            }
        }
        self.rings = req.rings;
        self.ring_bases = req.ring_bases;
        self.run_epoch = req.run;
        self.kernels = req.kernels.clone();
        self.fatal = None;
        self.tasks = 0;
        self.pending_begin = Some(req.ctl.clone());
        let window = req.rings.iter().map(|r| r.task_window).min().unwrap_or(0);
        // Stay a few thousand tasks ahead of execution: enough to keep the cores fed,
        // few enough that the dependency pools rarely fill.
        let high = (window * 3 / 4).min(THROTTLE_MAX_AHEAD);
        self.throttle = (window >= 256).then_some((high, high / 2));
        let run = match self.graph.begin_run() {
            Ok(r) => r,
            Err(e) => {
                reply.setup_error = Some(ChipError::Internal(format!("begin_run: {e}")));
                return reply;
            }
        };
        reply.t_orch_start = strata_sync::mono_ns();
        let f = &req.callable.f;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self, &req.args)));
        reply.t_orch_end = strata_sync::mono_ns();
        let name = || req.callable.name.to_string();
        let ended = match (&self.fatal, result) {
            (Some(e), _) => {
                let code = e.code().unwrap_or(codes::EXPLICIT_ORCH_FATAL);
                self.graph
                    .fail_run(Failure::with_code(FailureKind::Fatal, code, e.to_string()))
            }
            (None, Ok(Ok(()))) => self.graph.close_run(),
            (None, Ok(Err(e))) => {
                // A run failure the API returned (a task of the run failed) is the graph's
                // verdict already; anything else is the orchestration's own error.
                let failed_run = matches!(
                    e.downcast_ref::<ChipError>(),
                    Some(ChipError::RunFailed { .. })
                );
                let message = error_chain(&*e);
                if !failed_run {
                    reply.orch_error = Some(ChipError::OrchestrationFailed {
                        orchestration: name(),
                        message: message.clone(),
                    });
                }
                self.graph.fail_run(Failure::with_code(
                    FailureKind::Fatal,
                    codes::ORCHESTRATION_FAILED,
                    message,
                ))
            }
            (None, Err(p)) => {
                let msg = strata_sync::panic_message(&*p);
                let e = ChipError::OrchestrationFailed {
                    orchestration: name(),
                    message: format!("panicked: {msg}"),
                };
                reply.orch_error = Some(e.clone());
                self.graph.fail_run(Failure::with_code(
                    FailureKind::Fatal,
                    codes::ORCHESTRATION_FAILED,
                    e.to_string(),
                ))
            }
        };
        if let Err(e) = ended {
            reply.setup_error = Some(ChipError::Internal(format!("ending the run: {e}")));
        }
        reply.fatal = self.fatal.clone();
        reply.tasks = self.tasks;
        reply.sched_used = self.pending_begin.take().is_none();
        // Drive the scheduler while the run's last tasks finish (a short run completes
        // between this thread and the cores alone), then block if it takes longer.
        let graph = &self.graph;
        let driven = if reply.sched_used {
            self.sched
                .drive(|| graph.wait_run(run, Some(Duration::ZERO)).transpose())
        } else {
            Driven::HandedBack
        };
        let outcome = match driven {
            Driven::Done(o) => Ok(o),
            Driven::HandedBack => self.wait_handed_back(run),
            Driven::Over => Err(None),
            Driven::Broken(b) => Err(Some(b)),
        };
        reply.graph = match outcome {
            Ok(Ok(r)) => r,
            Err(None) => Err(Failure::new(
                FailureKind::Fatal,
                "the chip's scheduler stopped before the run finished (the chip is closing)",
            )),
            Err(Some(b)) => Err(Failure::new(
                FailureKind::Fatal,
                format!("the chip's scheduler failed (an internal error): {b}"),
            )),
            Ok(Err(e)) => Err(Failure::new(FailureKind::Fatal, e.to_string())),
        };
        let _ = self.graph.release_run(run);
        reply.t_done = strata_sync::mono_ns();
        reply
    }

    /// Waits for run `run` once the scheduler thread drives it again, checking every
    /// [`BROKEN_CHECK`] whether the loop broke (then nothing will finish the run).
    #[allow(clippy::type_complexity)]
    fn wait_handed_back(
        &self,
        run: strata_graph::RunId,
    ) -> Result<Result<Result<(), Failure>, GraphError>, Option<strata_sync::Broken>> {
        loop {
            match self.graph.wait_run(run, Some(BROKEN_CHECK)) {
                Ok(Some(o)) => return Ok(Ok(o)),
                Err(e) => return Ok(Err(e)),
                Ok(None) => {
                    if let Some(b) = self.sched.broken() {
                        return Err(Some(b));
                    }
                }
            }
        }
    }

    /// The orchestrator thread's loop: wait for a request (spin up to `idle_spin`, then
    /// park), run it, post the reply.
    pub(crate) fn main(mut self, link: Arc<OrchLink>, idle_spin: Duration) {
        self.shared.orch_bell.register_current();
        link.request.bell.register_current();
        loop {
            let cpus = Some((&link.orch_cpu, &link.host_cpu));
            let Some(m) = link.request.wait(idle_spin, cpus, None, || true) else {
                continue;
            };
            link.orch_cpu.update();
            match m {
                OrchMsg::Run(req) => {
                    let reply = self.run_request(&req);
                    drop(req);
                    link.reply.post(reply);
                }
                OrchMsg::Exit => break,
            }
        }
        self.shutdown();
    }

    /// Ends the orchestrator's side of the graph (the chip is closing).
    pub(crate) fn shutdown(self) {
        self.graph.shutdown();
    }
}

/// The first pair of a task's existing, tracked arguments that may share device bytes
/// while one of them is written: kernels get slices of their arguments, so such a pair
/// would give a kernel a `&mut` and a `&` over the same bytes. Judged by device address,
/// not by buffer key, so a handle whose key differs but whose bytes are the same (a stale
/// or forged one) is caught too. Views of the same buffer base are compared exactly by
/// footprint (disjoint interleaved views are fine); views of different bases by their
/// byte spans. Untracked arguments are reached only through `unsafe` accessors, and
/// created outputs live in a fresh slab. A task has at most 32 tensors: the pairwise
/// scan allocates nothing and footprints are built only for the rare overlapping spans.
fn aliasing_pair(kt: &[KTensor]) -> Option<(usize, usize)> {
    let span = |t: &KTensor| {
        let (s, e) = t.view.byte_span();
        (t.addr.saturating_add(s), t.addr.saturating_add(e))
    };
    for i in 0..kt.len() {
        let a = &kt[i];
        if a.created || !a.tracked {
            continue;
        }
        let (sa, ea) = span(a);
        for (j, b) in kt.iter().enumerate().skip(i + 1) {
            if b.created || !b.tracked || !(a.tag.writes() || b.tag.writes()) {
                continue;
            }
            let (sb, eb) = span(b);
            if sa >= eb || sb >= ea {
                continue;
            }
            if a.addr == b.addr
                && Footprint::of_view(&a.view).overlap(&Footprint::of_view(&b.view))
                    == Overlap::None
            {
                continue;
            }
            return Some((i, j));
        }
    }
    None
}

/// Waits for the orchestrator's reply while the orchestration and the scheduler make
/// progress: spins up to `spin` (the reply of a short run arrives within microseconds),
/// then parks in slices of at most 200 ms; `None` if neither made progress for `budget`,
/// or if the orchestrator thread is gone (`alive` turned false).
pub(crate) fn wait_reply(
    link: &OrchLink,
    heartbeat: &AtomicU64,
    shared: &SchedShared,
    spin: Duration,
    budget: Duration,
    alive: impl Fn() -> bool,
) -> Option<OrchReply> {
    let sched_progress = || shared.progress_mark();
    let mut last = (heartbeat.load(Ordering::Relaxed), sched_progress());
    let mut since = Instant::now();
    let slice = budget.min(Duration::from_millis(200));
    let cpus = Some((&link.host_cpu, &link.orch_cpu));
    link.reply.wait(spin, cpus, Some(slice), || {
        if !alive() {
            return false;
        }
        let now = (heartbeat.load(Ordering::Relaxed), sched_progress());
        if now != last {
            last = now;
            since = Instant::now();
            true
        } else {
            since.elapsed() < budget
        }
    })
}
