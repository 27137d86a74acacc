//! The orchestrator handle: builds runs, submits tasks, opens and closes scopes, allocates
//! runtime-owned buffers. Exactly one exists per graph; it owns the TensorMap, the rings
//! and the scope stack outright, so submission takes no lock of its own.

use crate::access::{Access, AddressDomain, BufferKey};
use crate::core::{Core, ReadyTask};
use crate::error::{DeadlockCause, Failure, FailureKind, GraphError};
use crate::free_list::FreeList;
use crate::ring::{align_up, ring_for_depth, HeapSlab, Ring, RingConfig, Shortage, RING_COUNT};
use crate::run::{run_word, RunId, RunPhase, MAX_PIPELINE_DEPTH};
use crate::scheduler::Scheduler;
use crate::scope::ScopeStack;
use crate::slot::{TaskRef, TaskState};
use crate::tensormap::{JournalEntry, TensorMap};
use crate::waitfor::Unfinished;
use std::time::{Duration, Instant};
use strata_sync::sync::{Arc, Ordering};

/// Configuration of a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphConfig {
    /// Sizing of the four scope-depth rings.
    pub rings: [RingConfig; RING_COUNT],
    /// How long a submit or allocation may wait for ring space, a dependency-pool entry,
    /// or a producer without any progress before failing.
    pub wait_timeout: Duration,
    /// Runs in flight at once (1 or 2).
    pub pipeline_depth: usize,
}

impl Default for GraphConfig {
    fn default() -> Self {
        GraphConfig {
            rings: [RingConfig::default(); RING_COUNT],
            wait_timeout: Duration::from_secs(10),
            pipeline_depth: MAX_PIPELINE_DEPTH,
        }
    }
}

impl GraphConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`GraphError::InvalidConfig`] naming the bad field.
    pub fn validate(&self) -> Result<(), GraphError> {
        if !(1..=MAX_PIPELINE_DEPTH).contains(&self.pipeline_depth) {
            return Err(GraphError::InvalidConfig(format!(
                "pipeline_depth = {} (must be 1 or 2)",
                self.pipeline_depth
            )));
        }
        for (i, r) in self.rings.iter().enumerate() {
            if r.heap_bytes % crate::ring::HEAP_ALIGN != 0 {
                return Err(GraphError::InvalidConfig(format!(
                    "ring {i} heap_bytes = {} (must be a multiple of 1024)",
                    r.heap_bytes
                )));
            }
            if matches!(r.task_window, Some(w) if w < 2) {
                return Err(GraphError::InvalidConfig(format!(
                    "ring {i} task_window = {:?} (must be at least 2: one slot always stays free)",
                    r.task_window
                )));
            }
            if matches!(r.dep_pool, Some(0)) {
                return Err(GraphError::InvalidConfig(format!(
                    "ring {i} dep_pool = 0 (must be at least 1, or None for unbounded)"
                )));
            }
        }
        Ok(())
    }
}

/// Creates a graph and returns its two handles: the orchestrator (submits) and the
/// scheduler (dispatches and completes). Each may live on its own thread.
///
/// ```
/// use strata_graph::*;
/// use strata_types::{ArgTag, IdentityMinter};
///
/// let (mut orch, mut sched) = graph::<&'static str>(GraphConfig::default()).unwrap();
/// let x = BufferKey::new(IdentityMinter::new().mint(), KeySpace::Host);
/// let run = orch.begin_run().unwrap();
/// let w = orch.submit(TaskSpec::new("write x", &[Access::new(x, Footprint::WHOLE, ArgTag::Output)])).unwrap();
/// let r = orch.submit(TaskSpec::new("read x", &[Access::new(x, Footprint::WHOLE, ArgTag::Input)])).unwrap();
/// assert!(w.ready && !r.ready); // the reader waits for the writer
/// orch.close_run().unwrap();
///
/// let mut ready = vec![];
/// let claimed = sched.claim(w.task).unwrap();
/// assert_eq!(claimed.payload, "write x");
/// sched.complete(w.task, Ok(()), &mut ready).unwrap();
/// assert_eq!(ready[0].task, r.task);
/// sched.claim(r.task).unwrap();
/// sched.complete(r.task, Ok(()), &mut ready).unwrap();
/// assert_eq!(orch.wait_run(run, None).unwrap(), Some(Ok(())));
/// ```
///
/// # Errors
/// [`GraphError::InvalidConfig`] for an invalid configuration.
pub fn graph<P: Send + 'static>(
    config: GraphConfig,
) -> Result<(Orchestrator<P>, Scheduler<P>), GraphError> {
    config.validate()?;
    let core = Arc::new(Core::new(config.pipeline_depth));
    let orch = Orchestrator {
        core: core.clone(),
        config,
        rings: std::array::from_fn(|i| Ring::new(config.rings[i])),
        map: TensorMap::default(),
        scopes: ScopeStack::default(),
        side: Vec::new(),
        free: FreeList::default(),
        next_id: 1,
        stamp: 0,
        building: None,
        lease_runs: [None; MAX_PIPELINE_DEPTH],
        producers: Vec::new(),
        heads: Vec::new(),
        retired: Vec::new(),
    };
    Ok((orch, Scheduler::new(core)))
}

/// A task to submit.
///
/// ```
/// use strata_graph::*;
/// use strata_types::{ArgTag, IdentityMinter};
/// let key = BufferKey::new(IdentityMinter::new().mint(), KeySpace::Host);
/// let accesses = [Access::new(key, Footprint::WHOLE, ArgTag::InOut)];
/// let spec = TaskSpec::new(42u32, &accesses).with_route(7);
/// assert_eq!(spec.route, 7);
/// ```
#[derive(Debug)]
pub struct TaskSpec<'a, P> {
    /// What the scheduler gets back when it claims the task.
    pub payload: P,
    /// A caller-defined tag returned with the task when it becomes ready (e.g. a target
    /// worker id).
    pub route: u64,
    /// The accesses of a single task.
    pub accesses: &'a [Access],
    /// For a group task: the accesses of each member (then `accesses` is ignored). A group
    /// is one node of the graph whose members launch together.
    pub members: Option<&'a [&'a [Access]]>,
    /// Explicit extra producers (tasks already consumed are skipped).
    pub deps: &'a [TaskRef],
    /// Heap bytes to reserve for the task in its scope's ring (rounded up to 1024).
    pub heap_bytes: u64,
    /// Buffers the task allocates in that heap slab: later accesses to them retain this
    /// task, and any access after it was consumed is an error.
    pub creates: &'a [BufferKey],
}

impl<'a, P> TaskSpec<'a, P> {
    /// A single task with the given accesses.
    pub fn new(payload: P, accesses: &'a [Access]) -> Self {
        TaskSpec {
            payload,
            route: 0,
            accesses,
            members: None,
            deps: &[],
            heap_bytes: 0,
            creates: &[],
        }
    }

    /// A group task with one access list per member.
    pub fn group(payload: P, members: &'a [&'a [Access]]) -> Self {
        TaskSpec {
            members: Some(members),
            ..TaskSpec::new(payload, &[])
        }
    }

    /// Sets the route.
    pub fn with_route(mut self, route: u64) -> Self {
        self.route = route;
        self
    }

    /// Sets explicit extra producers.
    pub fn with_deps(mut self, deps: &'a [TaskRef]) -> Self {
        self.deps = deps;
        self
    }

    /// Reserves a heap slab for buffers the task creates.
    pub fn with_heap(mut self, bytes: u64, creates: &'a [BufferKey]) -> Self {
        self.heap_bytes = bytes;
        self.creates = creates;
        self
    }

    fn member_lists(&self) -> MemberIter<'_, 'a> {
        MemberIter {
            single: self.members.is_none().then_some(self.accesses),
            group: self.members.unwrap_or(&[]).iter(),
        }
    }

    fn group_size(&self) -> usize {
        self.members.map_or(1, |m| m.len())
    }
}

struct MemberIter<'s, 'a> {
    single: Option<&'a [Access]>,
    group: std::slice::Iter<'s, &'a [Access]>,
}

impl<'a> Iterator for MemberIter<'_, 'a> {
    type Item = &'a [Access];
    fn next(&mut self) -> Option<&'a [Access]> {
        self.single.take().or_else(|| self.group.next().copied())
    }
}

/// The result of a submit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submitted {
    /// The task.
    pub task: TaskRef,
    /// Whether it is ready to dispatch now (no live producer).
    pub ready: bool,
    /// Whether it was poisoned at submit (a producer had already failed); it will never
    /// be dispatched and the run has failed.
    pub poisoned: bool,
    /// Its heap slab, if it asked for one.
    pub heap: Option<HeapSlab>,
    /// The run it belongs to.
    pub run: RunId,
}

const NO_HEAD: u32 = u32::MAX;

/// Orchestrator-only bookkeeping per slot.
#[derive(Debug, Default)]
struct Side {
    /// TensorMap entries this task recorded, retired when it is consumed.
    journal: Vec<JournalEntry>,
    stamp: u64,
    scope: Option<u64>,
    /// The task owns runtime memory (a heap slab or allocated buffers): its consumers
    /// must retain it even after it completed.
    owns_memory: bool,
}

/// The orchestrator handle of a graph (see [`graph`]).
pub struct Orchestrator<P> {
    core: Arc<Core<P>>,
    config: GraphConfig,
    rings: [Ring; RING_COUNT],
    map: TensorMap,
    scopes: ScopeStack,
    side: Vec<Side>,
    free: FreeList,
    next_id: u64,
    stamp: u64,
    building: Option<(RunId, usize)>,
    /// The run that last held each pipeline lease (its TensorMap partition is dropped
    /// when the lease is reused, by which time every one of its tasks was consumed).
    lease_runs: [Option<u64>; MAX_PIPELINE_DEPTH],
    producers: Vec<TaskRef>,
    /// TensorMap heads of the accesses of the task being submitted, in member order.
    heads: Vec<u32>,
    /// Slots consumed on this side (or handed over by the scheduler) awaiting recycling.
    retired: Vec<u32>,
}

impl<P> std::fmt::Debug for Orchestrator<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator")
            .field("building", &self.building)
            .field("scope_depth", &self.scopes.depth())
            .finish_non_exhaustive()
    }
}

impl<P: Send + 'static> Orchestrator<P> {
    // ----- runs -------------------------------------------------------------------------

    /// Begins a run (waiting while `pipeline_depth` runs are in flight) and opens its outer
    /// scope.
    ///
    /// # Errors
    /// [`GraphError::RunAlreadyBuilding`] if a run is being built; [`GraphError::Shutdown`].
    pub fn begin_run(&mut self) -> Result<RunId, GraphError> {
        self.begin_run_timeout(None)
    }

    /// [`Orchestrator::begin_run`] with a bound on the wait for a pipeline lease.
    ///
    /// # Errors
    /// As `begin_run`, plus [`GraphError::Timeout`].
    pub fn begin_run_timeout(&mut self, timeout: Option<Duration>) -> Result<RunId, GraphError> {
        if let Some((r, _)) = self.building {
            return Err(GraphError::RunAlreadyBuilding { building: r.0 });
        }
        self.recycle();
        let (run, lease) = self.core.runs.begin(timeout)?;
        if let Some(old) = self.lease_runs[lease].replace(run.0) {
            self.map.forget_run(old);
        }
        self.map.sweep(run.0);
        self.free.tidy();
        self.building = Some((run, lease));
        self.scopes.begin()?;
        Ok(run)
    }

    fn building(&self, op: &'static str) -> Result<(RunId, usize), GraphError> {
        self.building.ok_or(GraphError::NoBuildingRun { op })
    }

    /// Closes the building run's submission (closing any scope left open). The run
    /// completes once all its tasks are consumed.
    ///
    /// # Errors
    /// [`GraphError::NoBuildingRun`].
    pub fn close_run(&mut self) -> Result<RunId, GraphError> {
        let (run, _) = self.building("close_run")?;
        while self.scopes.depth() > 0 {
            self.scope_end()?;
        }
        self.building = None;
        if self.core.runs.close(run.0)? {
            self.core.progress.bump();
        }
        Ok(run)
    }

    /// Fails the building run's construction (its orchestration returned an error):
    /// closes its scopes, records `failure` as its first error unless a task failed
    /// first, and cancels every task that has not started. Running tasks finish.
    ///
    /// # Errors
    /// [`GraphError::NoBuildingRun`].
    pub fn fail_run(&mut self, failure: Failure) -> Result<RunId, GraphError> {
        let (run, lease) = self.building("fail_run")?;
        while self.scopes.depth() > 0 {
            self.scope_end()?;
        }
        self.building = None;
        self.core.runs.fail_submission(run.0, &failure)?;
        self.core
            .cancel_run(run_word(run.0, lease), &failure, &mut self.retired);
        if self.core.runs.settle(run.0) {
            self.core.progress.bump();
        }
        Ok(run)
    }

    /// The building run, if any.
    pub fn current_run(&self) -> Option<RunId> {
        self.building.map(|b| b.0)
    }

    /// Waits for run `run` to finish. `Ok(None)` if `timeout` elapsed first (the run goes
    /// on); `Ok(Some(Err(f)))` carries the run's first error.
    ///
    /// # Errors
    /// [`GraphError::UnknownRun`] for a run that was released or never existed.
    pub fn wait_run(
        &self,
        run: RunId,
        timeout: Option<Duration>,
    ) -> Result<Option<Result<(), Failure>>, GraphError> {
        self.core.runs.wait(run.0, timeout)
    }

    /// The phase of a run (`None` once released).
    pub fn run_phase(&self, run: RunId) -> Option<RunPhase> {
        self.core.runs.phase(run.0)
    }

    /// Forgets a finished run's outcome.
    ///
    /// # Errors
    /// If the run is still in flight or unknown.
    pub fn release_run(&mut self, run: RunId) -> Result<(), GraphError> {
        self.core.runs.release(run.0)
    }

    /// A cloneable handle that can wait for runs from any thread.
    pub fn run_waiter(&self) -> RunWaiter {
        RunWaiter(Box::new(self.core.clone()))
    }

    /// The run whose tasks may be dispatched now.
    pub fn dispatchable_run(&self) -> Option<RunId> {
        self.core.runs.dispatchable()
    }

    /// The first error of the building run, if a task of it has failed.
    pub fn run_error(&self) -> Option<Failure> {
        let (run, lease) = self.building?;
        if self.core.runs.has_failed(run_word(run.0, lease)) {
            self.core.runs.first_error(run.0)
        } else {
            None
        }
    }

    // ----- scopes -----------------------------------------------------------------------

    /// Opens a nested scope. Tasks submitted in it are retained until it ends, and
    /// allocations in it come from the ring of its depth.
    ///
    /// # Errors
    /// [`GraphError::NoBuildingRun`], [`GraphError::ScopeDepthExceeded`] (64 including the
    /// run's outer scope).
    pub fn scope_begin(&mut self) -> Result<(), GraphError> {
        self.building("scope_begin")?;
        self.scopes.begin()
    }

    /// Ends the innermost scope, releasing its reference on each of its tasks. Never blocks.
    ///
    /// # Errors
    /// [`GraphError::NoOpenScope`].
    pub fn scope_end(&mut self) -> Result<(), GraphError> {
        let core = &self.core;
        let retired = &mut self.retired;
        self.scopes.end(|t| core.release(t, retired))?;
        Ok(())
    }

    /// Open scopes, including the run's outer scope.
    pub fn scope_depth(&self) -> usize {
        self.scopes.depth()
    }

    // ----- submission -------------------------------------------------------------------

    /// Submits a task: infers its producers from the TensorMap (read-after-write,
    /// write-after-write, write-after-read on overlapping footprints), reserves its slot
    /// (and heap slab) in the ring of the current scope depth, wires it, and publishes it
    /// PENDING or READY.
    ///
    /// A task that depends on a task that already failed is published FAILED
    /// (`poisoned`): it never runs and the run reports the producer's error.
    ///
    /// # Errors
    /// - [`GraphError::RunFailed`] if a task of the run already failed (fail-fast);
    /// - [`GraphError::InvalidArgs`] for an empty group, a write that overlaps a later
    ///   argument of the same task, or an unknown explicit dependency;
    /// - [`GraphError::BufferReclaimed`] for a runtime-allocated buffer whose scope ended;
    /// - ring errors: [`GraphError::ScopeDeadlock`], [`GraphError::FlowControlDeadlock`],
    ///   [`GraphError::HeapDeadlock`], [`GraphError::HeapRequestTooLarge`],
    ///   [`GraphError::HeapDisabled`], [`GraphError::DepPoolOverflow`].
    pub fn submit(&mut self, spec: TaskSpec<'_, P>) -> Result<Submitted, GraphError> {
        let (run, lease) = self.building("submit")?;
        let word = run_word(run.0, lease);
        self.check_fail_fast(word)?;
        Self::validate(&spec)?;
        // Recycle before dependency lookup: recycling may free TensorMap heads, so it
        // must never run between a submit's lookups and its records.
        if self.free.is_empty() {
            self.recycle();
        }

        // Producers: explicit deps, allocators of runtime-owned buffers, TensorMap hits.
        self.stamp += 1;
        let stamp = self.stamp;
        let mut producers = std::mem::take(&mut self.producers);
        producers.clear();
        let result = self.collect_producers(&spec, run.0, stamp, &mut producers);
        if let Err(e) = result {
            self.producers = producers;
            return Err(e);
        }

        let ring_idx = ring_for_depth(self.scopes.current_depth());
        let aligned = self.check_heap_request(ring_idx, spec.heap_bytes)?;
        if let Err(e) = self.reserve_edges(ring_idx, producers.len() as u64) {
            self.producers = producers;
            return Err(e);
        }
        let offset = match self.reserve_slot(ring_idx, aligned) {
            Ok(o) => o,
            Err(e) => {
                self.producers = producers;
                return Err(e);
            }
        };
        if aligned > 0 {
            if let Err(e) = self.check_fail_fast(word) {
                // The run failed while this submit waited for heap: the room may be a
                // failed task's slab, which a kernel abandoned after its timeout can still
                // be writing. Nothing was committed yet.
                self.producers = producers;
                return Err(e);
            }
        }

        // Past this point nothing fails.
        let group_size = spec.group_size();
        let task = self.new_slot(word, spec.route, group_size);
        self.rings[ring_idx].commit(task, offset, aligned);
        self.core.runs.add_task(lease);
        let slot = self.core.arena.get(task.index);
        // Only a task that owns runtime memory is retained by its scope: a task without
        // any is reclaimed as soon as it and its consumers finish (a completed producer
        // imposes no wait, so keeping it would only keep memory).
        if aligned > 0 || !spec.creates.is_empty() {
            self.side[task.index as usize].owns_memory = true;
            if let Some(serial) = self.scopes.register(task) {
                slot.add_ref();
                self.side[task.index as usize].scope = Some(serial);
            }
        }
        // Record this task's accesses (and the buffers it creates) in the TensorMap.
        {
            let core = &self.core;
            let live = |t: &TaskRef| core.is_live(t);
            let side = &mut self.side[task.index as usize];
            let mut i = 0;
            for member in spec.member_lists() {
                for a in member {
                    let h = self.heads[i];
                    i += 1;
                    if h != NO_HEAD {
                        if let Some(j) = self.map.record(h, run.0, a, task, &live) {
                            side.journal.push(j);
                        }
                    }
                }
            }
            for key in spec.creates {
                if let Some(h) = self.map.head(*key, run.0, true) {
                    side.journal.push(self.map.register_owned(h, run.0, task));
                }
            }
        }
        // Wire onto each producer.
        let mut live_fanin = 0u32;
        let mut poisoned_by: Option<Failure> = None;
        producers.retain(|p| {
            let ps = self.core.arena.get(p.index);
            let pin = ps.inner.lock();
            let Some(state) = ps.state_of(p.id) else {
                return false;
            };
            if state == TaskState::Consumed || !ps.add_ref() {
                return false;
            }
            let mut pin = pin;
            match state {
                TaskState::Failed => {
                    if poisoned_by.is_none() {
                        poisoned_by = pin.failure.clone();
                    }
                }
                TaskState::Completed => {}
                _ => {
                    pin.consumers.push(task);
                    live_fanin += 1;
                }
            }
            true
        });
        let edges = producers.len() as u64;
        if edges > 0 && self.rings[ring_idx].cfg.dep_pool.is_some() {
            self.core.deps.charge(ring_idx, edges);
            slot.dep_charge
                .store(((ring_idx as u64) << 32) | edges, Ordering::Release);
        }
        if poisoned_by.is_none() && self.core.runs.has_failed(word) {
            poisoned_by = self.core.runs.first_error(run.0);
        }

        // Publish.
        let mut inner = slot.inner.lock();
        inner.payload = Some(spec.payload);
        std::mem::swap(&mut inner.producers, &mut producers);
        self.producers = producers;
        let mut ready = false;
        let mut poisoned = true;
        if let Some(f) = poisoned_by {
            if slot.claim_failure(task.id).is_some() {
                inner.failure = Some(f);
                inner.skip_undispatched();
            }
        } else if slot.transition(task.id, TaskState::Building, TaskState::Pending) {
            poisoned = false;
            inner.fanin_count = Some(live_fanin);
            if inner.fanin_released >= live_fanin {
                ready = slot.transition(task.id, TaskState::Pending, TaskState::Ready);
            }
        }
        // Otherwise a producer failed while this task was being wired and claimed it.
        if poisoned {
            // This submit owns the propagation of its own failure (a producer that claimed
            // it mid-wiring left the debt to us).
            slot.debt.store(false, Ordering::Release);
            let mut prods = std::mem::take(&mut inner.producers);
            let f = inner
                .failure
                .clone()
                .unwrap_or_else(|| Failure::new(FailureKind::Task, "producer task failed"));
            drop(inner);
            self.core.runs.record_error(word, &f);
            self.core.release(task, &mut self.retired);
            self.core
                .release_producers(task, &mut prods, &mut self.retired);
        } else {
            drop(inner);
        }
        Ok(Submitted {
            task,
            ready,
            poisoned,
            heap: (spec.heap_bytes > 0).then_some(HeapSlab {
                ring: ring_idx,
                offset,
                len: aligned,
            }),
            run,
        })
    }

    /// Allocates a runtime-owned buffer of `bytes` (rounded up to 1024) from the current
    /// scope's heap ring. It is owned by a synthetic, already completed task that the
    /// current scope retains: any task that names `key` depends on and retains it, and the
    /// bytes are reclaimed (FIFO) once the scope has ended and every such task finished.
    ///
    /// # Errors
    /// [`GraphError::NoBuildingRun`], and the heap/window errors of [`Orchestrator::submit`].
    pub fn alloc(&mut self, key: BufferKey, bytes: u64) -> Result<(TaskRef, HeapSlab), GraphError> {
        let (run, lease) = self.building("alloc")?;
        let word = run_word(run.0, lease);
        self.check_fail_fast(word)?;
        if self.free.is_empty() {
            self.recycle();
        }
        let ring_idx = ring_for_depth(self.scopes.current_depth());
        let aligned = self.check_heap_request(ring_idx, bytes.max(1))?;
        let offset = self.reserve_slot(ring_idx, aligned)?;
        // As in `submit`: heap freed by a failure is not handed to a failed run.
        self.check_fail_fast(word)?;
        let task = self.new_slot(word, 0, 1);
        self.rings[ring_idx].commit(task, offset, aligned);
        self.core.runs.add_task(lease);
        let slot = self.core.arena.get(task.index);
        self.side[task.index as usize].owns_memory = true;
        if let Some(serial) = self.scopes.register(task) {
            slot.add_ref();
            self.side[task.index as usize].scope = Some(serial);
        }
        if let Some(h) = self.map.head(key, run.0, true) {
            let j = self.map.register_owned(h, run.0, task);
            self.side[task.index as usize].journal.push(j);
        }
        slot.store(task.id, TaskState::Completed);
        self.core.release(task, &mut self.retired); // the self-release of a complete task
        Ok((
            task,
            HeapSlab {
                ring: ring_idx,
                offset,
                len: aligned,
            },
        ))
    }

    /// Waits until every task that an access like `access` would depend on has finished
    /// (for reading: earlier writers; for writing: earlier writers and readers). Lets the
    /// orchestration read or write tensor data directly.
    ///
    /// # Errors
    /// [`GraphError::RunFailed`] if one of them failed, [`GraphError::Timeout`] after
    /// `timeout` (default: the graph's wait timeout).
    pub fn wait_for_access(
        &mut self,
        access: &Access,
        timeout: Option<Duration>,
    ) -> Result<(), GraphError> {
        let (run, _) = self.building("wait_for_access")?;
        let mut waits = Vec::new();
        {
            let core = &self.core;
            let live = |t: &TaskRef| core.is_live(t);
            if let Some(h) = self.map.head(access.key, run.0, false) {
                self.map.collect(h, run.0, access, &live, |t| waits.push(t));
                if let Some(owner) = self.map.owner(h, run.0) {
                    waits.push(owner);
                }
            }
        }
        let timeout = timeout.unwrap_or(self.config.wait_timeout);
        // A timeout past what an `Instant` holds never expires.
        let deadline = Instant::now().checked_add(timeout);
        for t in waits {
            loop {
                let seen = self.core.progress.seq();
                let slot = self.core.arena.get(t.index);
                match slot.state_of(t.id) {
                    None | Some(TaskState::Completed) | Some(TaskState::Consumed) => break,
                    Some(TaskState::Failed) => {
                        let f = slot.inner.lock().failure.clone().unwrap_or_else(|| {
                            Failure::new(FailureKind::Task, "producer task failed")
                        });
                        return Err(GraphError::RunFailed(f));
                    }
                    _ => {}
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(GraphError::Timeout {
                        what: format!("producer {t} of buffer {}", access.key.identity),
                        after: timeout,
                    });
                }
                self.core.progress.wait(seen, deadline);
            }
        }
        Ok(())
    }

    /// The state of a task, or `None` once it was consumed and its slot recycled.
    pub fn task_state(&self, t: TaskRef) -> Option<TaskState> {
        self.core.arena.get(t.index).state_of(t.id)
    }

    /// Live (not consumed) tasks of the building run.
    pub fn live_tasks(&self) -> u64 {
        self.building
            .map_or(0, |(_, lease)| self.core.runs.active(lease))
    }

    /// Live TensorMap entries (diagnostics).
    pub fn tensormap_entries(&self) -> usize {
        let core = &self.core;
        self.map.live_entries(&|t: &TaskRef| core.is_live(t))
    }

    /// TensorMap entries examined by dependency inference so far: by lookups and by the
    /// writes that supersede covered entries (diagnostics; the candidate scan of an access
    /// visits only entries whose byte ranges can overlap it).
    pub fn tensormap_visits(&self) -> u64 {
        self.map.visits()
    }

    /// Live writers of `key` in the building run, oldest first (diagnostics and tests).
    pub fn writers_of(&self, key: &BufferKey) -> Vec<TaskRef> {
        let Some((run, _)) = self.building else {
            return vec![];
        };
        let core = &self.core;
        self.map.writers(run.0, key, &|t: &TaskRef| core.is_live(t))
    }

    /// As [`Scheduler::unfinished`](crate::Scheduler::unfinished), from the orchestrator's
    /// side.
    pub fn unfinished(&self, max: usize) -> (Vec<Unfinished>, usize) {
        self.core.unfinished(max)
    }

    /// The live tasks whose allocations hold heap ring `ring`'s bytes, oldest first (the
    /// ring reclaims in that order, so the first is what an allocation that does not fit
    /// waits for), at most `max`; empty for a ring index out of range.
    pub fn ring_holders(&mut self, ring: usize, max: usize) -> Vec<TaskRef> {
        let core = &self.core;
        let Some(r) = self.rings.get_mut(ring) else {
            return Vec::new();
        };
        r.advance(|t| !core.is_live(t));
        r.holders(max)
    }

    /// Live slots in each ring (oldest unreclaimed to newest).
    pub fn ring_live(&mut self) -> [usize; RING_COUNT] {
        self.recycle();
        let core = &self.core;
        for r in &mut self.rings {
            r.advance(|t| !core.is_live(t));
        }
        std::array::from_fn(|i| self.rings[i].live())
    }

    /// Replaces the ring sizing. Only allowed while no run is in flight and every ring is
    /// drained.
    ///
    /// # Errors
    /// [`GraphError::NotQuiescent`], [`GraphError::InvalidConfig`].
    pub fn configure_rings(&mut self, rings: [RingConfig; RING_COUNT]) -> Result<(), GraphError> {
        GraphConfig {
            rings,
            ..self.config
        }
        .validate()?;
        let live: usize = self.ring_live().iter().sum();
        let in_flight = self.core.runs.in_flight();
        if live > 0 || in_flight > 0 {
            return Err(GraphError::NotQuiescent {
                op: "configure_rings",
                live: live as u64 + in_flight as u64,
            });
        }
        self.config.rings = rings;
        self.rings = std::array::from_fn(|i| Ring::new(rings[i]));
        Ok(())
    }

    /// The current configuration.
    pub fn config(&self) -> &GraphConfig {
        &self.config
    }

    /// Waits until some progress happens (a task completes or is consumed, a run ends),
    /// or `timeout` passes.
    pub fn wait_progress(&self, timeout: Duration) {
        let seen = self.core.progress.seq();
        self.core
            .progress
            .wait(seen, Instant::now().checked_add(timeout));
    }

    /// Shuts the graph down: pending `begin_run` waits return [`GraphError::Shutdown`].
    pub fn shutdown(&self) {
        self.core.shutdown.store(true, Ordering::Release);
        self.core.runs.shutdown();
    }

    /// A task's route and run, in the form the scheduler receives for tasks that become
    /// ready (convenient for routing a task that [`Orchestrator::submit`] found ready).
    pub fn ready_task(&self, t: TaskRef) -> ReadyTask {
        self.core.ready_task(t)
    }

    // ----- internals --------------------------------------------------------------------

    fn check_fail_fast(&self, word: u64) -> Result<(), GraphError> {
        if self.core.runs.has_failed(word) {
            if let Some(f) = self.core.runs.first_error(word >> 1) {
                return Err(GraphError::RunFailed(f));
            }
        }
        Ok(())
    }

    fn validate(spec: &TaskSpec<'_, P>) -> Result<(), GraphError> {
        if let Some(m) = spec.members {
            if m.is_empty() {
                return Err(GraphError::InvalidArgs(
                    "a group task needs at least one member".into(),
                ));
            }
        }
        for (mi, member) in spec.member_lists().enumerate() {
            Self::check_aliasing(mi, member)?;
        }
        if spec.heap_bytes == 0 && !spec.creates.is_empty() {
            return Err(GraphError::InvalidArgs(
                "a task that creates buffers needs heap_bytes > 0".into(),
            ));
        }
        Ok(())
    }

    /// Rejects a written view that provably overlaps a later argument of the same task,
    /// judged by bytes: arguments of the same buffer by their footprints, and arguments
    /// of different keys whose placements are in one address domain by the addresses
    /// they touch (a stale or forged key over live bytes is the same memory). Up to 16
    /// arguments are compared pairwise without allocating; beyond that arguments are
    /// grouped by key and swept by address, so a task with a thousand distinct buffers
    /// costs two sorts, not a million checks.
    fn check_aliasing(member_index: usize, member: &[Access]) -> Result<(), GraphError> {
        let conflict = |i: usize, j: usize| {
            let (a, b) = (&member[i], &member[j]);
            a.tag.writes() && Self::same_bytes(a, b)
        };
        let error = |i: usize, j: usize| {
            GraphError::InvalidArgs(format!(
                "member {member_index}: argument {i} ({}) overlaps argument {j} ({}) in memory; a written view must not alias a later argument — tag one INOUT instead",
                member[i].tag, member[j].tag
            ))
        };
        if member.len() <= 16 {
            for i in 0..member.len() {
                for j in i + 1..member.len() {
                    if conflict(i, j) {
                        return Err(error(i, j));
                    }
                }
            }
            return Ok(());
        }
        let mut order: Vec<usize> = (0..member.len()).collect();
        order.sort_by(|&x, &y| member[x].key.cmp(&member[y].key).then(x.cmp(&y)));
        for group in order.chunk_by(|&x, &y| member[x].key == member[y].key) {
            for (gi, &i) in group.iter().enumerate() {
                for &j in &group[gi + 1..] {
                    if conflict(i, j) {
                        return Err(error(i, j));
                    }
                }
            }
        }
        // Different keys over the same addresses: sweep the placed accesses by start.
        let mut placed: Vec<(AddressDomain, u64, u64, usize)> = member
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.absolute_span().map(|(d, s, e)| (d, s, e, i)))
            .collect();
        placed.sort_unstable();
        for (k, &(d, _, end, i)) in placed.iter().enumerate() {
            for &(d2, s2, _, j) in &placed[k + 1..] {
                if d2 != d || s2 >= end {
                    break;
                }
                let (lo, hi) = (i.min(j), i.max(j));
                if member[lo].key != member[hi].key && conflict(lo, hi) {
                    return Err(error(lo, hi));
                }
            }
        }
        Ok(())
    }

    /// Whether two accesses provably touch a common byte: the same buffer with
    /// intersecting footprints, or buffers placed in one address domain whose bytes
    /// intersect (compared by footprint over a common base, by dense byte range
    /// otherwise).
    fn same_bytes(a: &Access, b: &Access) -> bool {
        if a.key == b.key {
            return a.footprint.certainly_intersects(&b.footprint);
        }
        let (Some(pa), Some(pb)) = (a.placement, b.placement) else {
            return false;
        };
        if pa.domain != pb.domain {
            return false;
        }
        if pa.base == pb.base {
            return a.footprint.certainly_intersects(&b.footprint);
        }
        match (a.absolute_span(), b.absolute_span()) {
            (Some((_, s1, e1)), Some((_, s2, e2))) => {
                a.footprint.is_dense() && b.footprint.is_dense() && s1 < e2 && s2 < e1
            }
            _ => false,
        }
    }

    fn collect_producers(
        &mut self,
        spec: &TaskSpec<'_, P>,
        run: u64,
        stamp: u64,
        producers: &mut Vec<TaskRef>,
    ) -> Result<(), GraphError> {
        let core = &self.core;
        let created = self.side.len();
        let side = &mut self.side;
        let mut add = |t: TaskRef| {
            let s = &mut side[t.index as usize];
            if s.stamp == stamp {
                return;
            }
            s.stamp = stamp;
            // A producer that already completed and owns no memory needs neither a wait
            // nor a retaining edge: skip the wiring (the common case when the scheduler
            // keeps up with the orchestrator).
            if !s.owns_memory
                && core.arena.get(t.index).state_of(t.id) == Some(TaskState::Completed)
            {
                return;
            }
            producers.push(t);
        };
        for d in spec.deps {
            if d.id == 0 || d.id >= self.next_id || (d.index as usize) >= created {
                return Err(GraphError::InvalidArgs(format!(
                    "explicit dependency {d} was not issued by this graph"
                )));
            }
            if core.is_live(d) {
                add(*d);
            }
        }
        let live = |t: &TaskRef| core.is_live(t);
        let heads = &mut self.heads;
        heads.clear();
        for member in spec.member_lists() {
            for a in member {
                let Some(h) = self.map.head(a.key, run, a.tag.tracked()) else {
                    heads.push(NO_HEAD);
                    continue;
                };
                heads.push(h);
                match self.map.owner(h, run) {
                    Some(owner) if live(&owner) => add(owner),
                    Some(_) => {
                        return Err(GraphError::BufferReclaimed {
                            arg: heads.len() - 1,
                            buffer: a.key.identity.to_string(),
                        })
                    }
                    None => {}
                }
                self.map.collect(h, run, a, &live, &mut add);
            }
        }
        Ok(())
    }

    fn check_heap_request(&self, ring: usize, bytes: u64) -> Result<u64, GraphError> {
        if bytes == 0 {
            return Ok(0);
        }
        let size = self.rings[ring].cfg.heap_bytes;
        if size == 0 {
            return Err(GraphError::HeapDisabled {
                ring,
                request: bytes,
            });
        }
        let aligned = align_up(bytes).unwrap_or(u64::MAX);
        if aligned > size {
            return Err(GraphError::HeapRequestTooLarge {
                ring,
                ring_bytes: size,
                request: aligned,
            });
        }
        Ok(aligned)
    }

    /// Recycles consumed slots: retires their TensorMap entries (marking reclaimed the
    /// buffers they allocated) and frees their indices.
    ///
    /// Never call it between a submit's TensorMap lookups and its records: retiring may
    /// free a head the submit has looked up.
    fn recycle(&mut self) {
        self.core.take_retired(&mut self.retired);
        for index in self.retired.drain(..) {
            let side = &mut self.side[index as usize];
            side.scope = None;
            for j in side.journal.drain(..) {
                self.map.retire(j);
            }
            self.free.push(index);
        }
    }

    fn new_slot(&mut self, word: u64, route: u64, group_size: usize) -> TaskRef {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.side.len() as u32;
                self.core.arena.ensure(i);
                self.side.push(Side::default());
                self.core.created.store(i + 1, Ordering::Release);
                i
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let side = &mut self.side[index as usize];
        side.scope = None;
        side.owns_memory = false;
        side.journal.clear();
        self.core
            .arena
            .get(index)
            .reset(id, word, route, group_size);
        TaskRef { index, id }
    }

    /// Whether the oldest live task of `ring` is held by a scope still open on our stack.
    fn front_held_by_open_scope(&self, ring: usize) -> bool {
        self.rings[ring].front().is_some_and(|t| {
            self.side[t.index as usize]
                .scope
                .is_some_and(|s| self.scopes.is_open(s))
        })
    }

    /// Finds room for one slot (and `aligned` heap bytes) in `ring`, waiting for
    /// reclamation while it progresses. Returns the heap offset.
    fn reserve_slot(&mut self, ring: usize, aligned: u64) -> Result<u64, GraphError> {
        if let Some(w) = self.rings[ring].cfg.task_window {
            let in_scope = self.scopes.innermost_len();
            if in_scope as u64 + 1 >= w {
                return Err(GraphError::ScopeDeadlock {
                    ring,
                    window: w,
                    in_scope,
                });
            }
        }
        // Fast path: room now (reclaiming what the ring already knows is free).
        let core = &self.core;
        self.rings[ring].advance_lazily(|t| !core.is_live(t));
        if let Ok(offset) = self.rings[ring].check(aligned) {
            return Ok(offset);
        }
        let timeout = self.config.wait_timeout;
        let mut last_progress = Instant::now();
        loop {
            let seen = self.core.progress.seq();
            let core = &self.core;
            let before = self.rings[ring].live();
            self.rings[ring].advance(|t| !core.is_live(t));
            if self.rings[ring].live() < before {
                last_progress = Instant::now();
            }
            let shortage = match self.rings[ring].check(aligned) {
                Ok(offset) => return Ok(offset),
                Err(s) => s,
            };
            let waited = last_progress.elapsed();
            let cause = if self.front_held_by_open_scope(ring) {
                Some(DeadlockCause::ScopeHeld)
            } else if waited >= timeout {
                Some(DeadlockCause::NoProgress(waited))
            } else {
                None
            };
            if let Some(cause) = cause {
                let cfg = self.rings[ring].cfg;
                return Err(match shortage {
                    Shortage::Window => GraphError::FlowControlDeadlock {
                        ring,
                        window: cfg.task_window.unwrap_or(0),
                        cause,
                    },
                    Shortage::Heap { free } => GraphError::HeapDeadlock {
                        ring,
                        ring_bytes: cfg.heap_bytes,
                        request: aligned,
                        free,
                        cause,
                    },
                });
            }
            self.core.progress.wait(seen, Some(last_progress + timeout));
        }
    }

    /// Waits until `ring`'s dependency pool can hold `edges` more edges.
    fn reserve_edges(&mut self, ring: usize, edges: u64) -> Result<(), GraphError> {
        let Some(pool) = self.rings[ring].cfg.dep_pool else {
            return Ok(());
        };
        if edges == 0 {
            return Ok(());
        }
        if edges > pool {
            return Err(GraphError::DepPoolOverflow {
                ring,
                pool,
                free: pool.saturating_sub(self.core.deps.used(ring)),
                needed: edges,
                cause: DeadlockCause::NoProgress(Duration::ZERO),
            });
        }
        let timeout = self.config.wait_timeout;
        let mut last_progress = Instant::now();
        let mut last_used = self.core.deps.used(ring);
        loop {
            let seen = self.core.progress.seq();
            let used = self.core.deps.used(ring);
            if used + edges <= pool {
                return Ok(());
            }
            if used < last_used {
                last_progress = Instant::now();
            }
            last_used = used;
            let waited = last_progress.elapsed();
            if waited >= timeout {
                return Err(GraphError::DepPoolOverflow {
                    ring,
                    pool,
                    free: pool.saturating_sub(used),
                    needed: edges,
                    cause: DeadlockCause::NoProgress(waited),
                });
            }
            self.core.progress.wait(seen, Some(last_progress + timeout));
        }
    }
}

impl<P> Drop for Orchestrator<P> {
    fn drop(&mut self) {
        self.core.shutdown.store(true, Ordering::Release);
        self.core.runs.shutdown();
    }
}

#[cfg(test)]
impl<P: Send + 'static> Orchestrator<P> {
    pub(crate) fn core(&self) -> &Core<P> {
        &self.core
    }

    /// Slot indices consumed and not yet recycled (draining them).
    #[cfg(loom)]
    pub(crate) fn take_unrecycled(&mut self) -> Vec<u32> {
        self.core.take_retired(&mut self.retired);
        std::mem::take(&mut self.retired)
    }
}

/// The run table seen from outside the orchestrator: waits for runs, reads their phase and
/// releases them, from any thread (see [`Orchestrator::run_waiter`]).
pub struct RunWaiter(Box<dyn RunTable>);

trait RunTable: Send + Sync {
    fn table_wait(
        &self,
        run: u64,
        timeout: Option<Duration>,
    ) -> Result<Option<Result<(), Failure>>, GraphError>;
    fn table_phase(&self, run: u64) -> Option<RunPhase>;
    fn table_release(&self, run: u64) -> Result<(), GraphError>;
    fn table_release_when_done(&self, run: u64);
    fn clone_box(&self) -> Box<dyn RunTable>;
}

impl<P: Send + 'static> RunTable for Arc<Core<P>> {
    fn table_wait(
        &self,
        run: u64,
        timeout: Option<Duration>,
    ) -> Result<Option<Result<(), Failure>>, GraphError> {
        self.runs.wait(run, timeout)
    }
    fn table_phase(&self, run: u64) -> Option<RunPhase> {
        self.runs.phase(run)
    }
    fn table_release(&self, run: u64) -> Result<(), GraphError> {
        self.runs.release(run)
    }
    fn table_release_when_done(&self, run: u64) {
        self.runs.release_when_done(run)
    }
    fn clone_box(&self) -> Box<dyn RunTable> {
        Box::new(self.clone())
    }
}

impl Clone for RunWaiter {
    fn clone(&self) -> Self {
        RunWaiter(self.0.clone_box())
    }
}

impl std::fmt::Debug for RunWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunWaiter")
    }
}

impl RunWaiter {
    /// Waits for `run` to finish; `Ok(None)` if `timeout` elapsed first (the run goes on).
    ///
    /// # Errors
    /// [`GraphError::UnknownRun`] for a released or unknown run.
    pub fn wait(
        &self,
        run: RunId,
        timeout: Option<Duration>,
    ) -> Result<Option<Result<(), Failure>>, GraphError> {
        self.0.table_wait(run.0, timeout)
    }

    /// The phase of `run` (`None` once released).
    pub fn phase(&self, run: RunId) -> Option<RunPhase> {
        self.0.table_phase(run.0)
    }

    /// Forgets a finished run's outcome.
    ///
    /// # Errors
    /// If the run is still in flight or unknown.
    pub fn release(&self, run: RunId) -> Result<(), GraphError> {
        self.0.table_release(run.0)
    }

    /// Forgets `run`'s outcome as soon as it finishes (for a handle dropped unwaited).
    pub fn release_when_done(&self, run: RunId) {
        self.0.table_release_when_done(run.0)
    }
}
