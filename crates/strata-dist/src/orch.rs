//! The orchestration facade: what a host orchestration function uses to build its run.
//! The window-buffer and collective part of its API is in [`windows`].

use crate::ctx::Ctx;
use crate::endpoint::ChildKind;
use crate::error::DistError;
use crate::registry::{NextLevelCallable, Programs, SubHandle};
use crate::task::{DistTask, Member, Route, Target};
use crate::tensor::RunTensor;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use strata_chip::DeviceTensor;
use strata_graph::{
    Access, BufferKey, Footprint, KeySpace, Orchestrator, ReadyTask, RunId, TaskSpec,
};
use strata_host::SharedTensor;
use strata_mailbox::EncodedConfig;
use strata_types::wire::encode_args;
use strata_types::{
    ArgTag, BufferDesc, BufferIdentity, BufferLocation, CallConfig, CallbackResult, DataType,
    TaskArgs, TensorArg, TensorView,
};

mod windows;

/// The facade an orchestration function gets: submit tasks to next-level workers (chips,
/// or level-3 workers under a level-4 worker) and to sub-workers, open scopes, allocate
/// runtime-owned intermediates, and manage chip device memory.
///
/// Dependencies between the tasks are inferred from how their tensor arguments are tagged
/// (read, write, read-write): any order the engine runs them in gives the result of
/// running them one by one in submit order.
pub struct Orch<'w> {
    pub(crate) graph: &'w mut Orchestrator<DistTask>,
    pub(crate) ctx: &'w Ctx,
    /// The worker tree's registered callables (tasks are checked against them at submit).
    pub(crate) programs: &'w Programs,
    pub(crate) run: RunId,
    pub(crate) ready: Vec<ReadyTask>,
    pub(crate) submitted: bool,
    pub(crate) config: Arc<EncodedConfig>,
    /// The run's first hand-over left a dormant scheduler thread parked (the caller may be
    /// about to drive the loop itself, `Link::push_ready`); anything that may wait for the
    /// loop wakes it first ([`Orch::wake_deferred`]).
    pub(crate) wake_deferred: bool,
    /// Ready tasks were handed to the scheduler in this run.
    pub(crate) handed_over: bool,
    /// The intermediates this run allocated ([`Orch::alloc`]) that are still live, with
    /// the scope depth they were allocated at: a task may name only these in the heap
    /// rings (a [`RunTensor`] kept from another run, or from a scope that ended, names
    /// bytes the ring may have handed to someone else).
    pub(crate) run_tensors: HashMap<BufferIdentity, (BufferDesc, usize)>,
    /// Descriptors this run received from its parent (a nested level-3 worker's run: the
    /// level-4 worker admitted them), which may name the parent's memory.
    pub(crate) admitted: HashMap<BufferIdentity, BufferDesc>,
    /// The next-level workers for which `ready` holds a task (their holds are set in
    /// the link until the batch is handed over).
    pub(crate) held_workers: Vec<usize>,
}

impl std::fmt::Debug for Orch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orch")
            .field("run", &self.run)
            .finish_non_exhaustive()
    }
}

/// The argument a [`TaskArgs`] chaining method recorded as invalid, as the submit's error
/// (before anything is published).
pub(crate) fn check_args(args: &TaskArgs, member: Option<usize>) -> Result<(), DistError> {
    args.check()
        .map_err(|error| DistError::BadArgument { member, error })
}

fn check_group_args(args: &[TaskArgs]) -> Result<(), DistError> {
    for (m, a) in args.iter().enumerate() {
        check_args(a, Some(m))?;
    }
    Ok(())
}

/// The ordering key of a window buffer ([`Orch::window_order`]): its identity at
/// generation `u32::MAX`, which no buffer of this worker has (its minter hands out
/// generation 1, and window buffers are never re-generated).
fn window_order_key(buffer: &BufferDesc) -> BufferKey {
    let id = buffer.identity();
    let order = BufferIdentity::new(id.owner(), id.buffer_id(), u32::MAX)
        .unwrap_or_else(|_| unreachable!("u32::MAX is not zero"));
    BufferKey::new(order, KeySpace::Host)
}

/// The error of a window argument whose buffer is not live.
fn window_stale(index: usize) -> DistError {
    DistError::StaleTensor {
        index,
        reason: "it names the comm arena but no live window buffer of this run (a window tensor kept from an earlier run, whose buffer was freed)".into(),
    }
}

/// A group member's error, naming the member where the error has room for it.
fn in_member(e: DistError, member: usize) -> DistError {
    match e {
        DistError::WindowOutsideDomain {
            index,
            worker,
            members,
            ..
        } => DistError::WindowOutsideDomain {
            index,
            worker,
            members,
            member: Some(member),
        },
        DistError::InvalidArgs(m) => DistError::InvalidArgs(format!("group member {member}: {m}")),
        e => e,
    }
}

/// Ready tasks are handed to the scheduler in batches of this many (or at once when it is
/// idle).
const READY_BATCH: usize = 16;

impl<'w> Orch<'w> {
    /// The run being built.
    pub fn run_id(&self) -> RunId {
        self.run
    }

    /// Number of next-level workers (ids `0..n`).
    pub fn next_level_workers(&self) -> usize {
        self.ctx.next.len()
    }

    /// Number of sub-workers.
    pub fn sub_workers(&self) -> usize {
        self.ctx.n_subs
    }

    pub(crate) fn flush(&mut self) {
        if self.ready.is_empty() {
            return;
        }
        // The run's first hand-over does not wake a dormant scheduler thread: a one-task
        // run whose caller drives the loop in `RunHandle::wait` then involves no wake-up
        // at all. Every later hand-over wakes it (the loop must run while this
        // orchestration goes on), and so does anything that may wait for the loop.
        let first = !self.handed_over;
        self.handed_over = true;
        self.ctx.link.push_ready(&mut self.ready, !first);
        if !self.held_workers.is_empty() {
            self.ctx.link.release_holds(&self.held_workers);
            self.held_workers.clear();
        }
        self.wake_deferred |= first;
    }

    /// Wakes the scheduler thread if the run's first hand-over left it dormant: called
    /// before anything that may wait for the loop (a graph submit or allocation that may
    /// block on ring space, a control gate), and when the run is handed to a caller that
    /// may not wait for it.
    pub(crate) fn wake_deferred(&mut self) {
        if self.wake_deferred {
            self.wake_deferred = false;
            self.ctx.link.wake_dormant();
        }
    }

    fn check_next(
        &self,
        worker: usize,
        callable: &NextLevelCallable,
        what: &'static str,
    ) -> Result<(), DistError> {
        let kind = self.ctx.next.get(worker).ok_or(DistError::UnknownWorker {
            id: worker,
            count: self.ctx.next.len(),
        })?;
        let ok = match (kind, callable) {
            (ChildKind::Chip, NextLevelCallable::Chip(h)) => {
                if self.programs.chip.orchestration(&h.id()).is_none() {
                    return Err(DistError::UnknownCallable(h.id().to_string()));
                }
                true
            }
            (ChildKind::Worker, NextLevelCallable::Host(h)) => {
                if self.programs.host_name(&h.id).is_none() {
                    return Err(DistError::UnknownCallable(h.id.to_string()));
                }
                true
            }
            _ => false,
        };
        if !ok {
            return Err(DistError::WrongCallable {
                what,
                target: self.ctx.labels[worker].clone(),
                expected: match kind {
                    ChildKind::Chip => "a chip orchestration",
                    ChildKind::Worker => "a host orchestration",
                    ChildKind::Sub => "a sub-worker callable",
                },
                got: callable.kind_name(),
            });
        }
        Ok(())
    }

    /// The arguments of a chip task on `worker` as the chip receives them: every window
    /// tensor (the comm arena's memory) narrowed to the copy of `worker`'s rank in the
    /// window's domain; everything else as given, at the same index. Borrows `args` when
    /// it names no window.
    ///
    /// # Errors
    /// [`DistError::StaleTensor`] for a window whose buffer was freed,
    /// [`DistError::WindowOutsideDomain`] for a worker outside the window's domain,
    /// [`DistError::InvalidArgs`] for a view that is neither the whole window nor the
    /// worker's own copy.
    fn narrow<'a>(
        &self,
        args: &'a TaskArgs,
        worker: usize,
    ) -> Result<Cow<'a, TaskArgs>, DistError> {
        let Some(comm) = &self.ctx.comm else {
            return Ok(Cow::Borrowed(args));
        };
        let in_arena = |t: &TensorArg| matches!(t.buffer.location(), BufferLocation::HostShared { region, .. } if region == comm.region);
        if !args.tensors().iter().any(in_arena) {
            return Ok(Cow::Borrowed(args));
        }
        let mut out = TaskArgs::with_limits(args.limits());
        for (i, t) in args.tensors().iter().enumerate() {
            if !in_arena(t) {
                out.push_tensor(*t)?;
                continue;
            }
            let geo = comm
                .geometry(&t.buffer, Some(worker))
                .ok_or_else(|| window_stale(i))?;
            let rank = geo.rank.ok_or_else(|| DistError::WindowOutsideDomain {
                index: i,
                worker,
                members: comm.members_of(&t.buffer),
                member: None,
            })?;
            let view = crate::comm::narrow_view(&t.view, &geo.placement, rank).map_err(|why| {
                DistError::InvalidArgs(format!(
                    "tensor argument {i} is a window of the comm arena: {why}"
                ))
            })?;
            out.push_tensor(TensorArg { view, ..*t })?;
        }
        for &s in args.scalars() {
            out.push_scalar_bits(s)?;
        }
        Ok(Cow::Owned(out))
    }

    /// Checks that every tensor argument is a live buffer of this worker that `target`
    /// can see, builds the accesses, and collects the shared-tensor regions the task will
    /// hold in use while it runs (`uses`, each once). A chip task's `args` are already
    /// narrowed ([`Orch::narrow`]).
    fn accesses(
        &self,
        args: &TaskArgs,
        target: Target,
        out: &mut Vec<Access>,
        uses: &mut Vec<u64>,
    ) -> Result<(), DistError> {
        let first = out.len();
        for (i, t) in args.tensors().iter().enumerate() {
            let b = t.buffer;
            t.view.check_fits(b.nbytes())?;
            if self.window_order(i, t, target, args, out, first)? {
                out.push(Access::of_arg(t));
                continue;
            }
            match b.location() {
                BufferLocation::HostLocal { .. } => {
                    return Err(DistError::InvalidArgs(format!(
                        "tensor argument {i} is in private host memory, which a child process cannot see; allocate it with SharedTensor (before init) or Orch::alloc"
                    )))
                }
                BufferLocation::HostShared { region, .. } => {
                    if !self.ctx.region_visible(region) {
                        return Err(DistError::InvalidArgs(format!(
                            "tensor argument {i} lives in shared-memory region {region}, created after this worker started its children; create shared tensors before init()"
                        )));
                    }
                    if let Some(region) = self.check_shared(i, &b, region)? {
                        if !uses.contains(&region) {
                            uses.push(region);
                        }
                    }
                }
                BufferLocation::Device { worker, addr } => {
                    let Target::Worker(w) = target else {
                        return Err(DistError::InvalidArgs(format!(
                            "tensor argument {i} is in the device memory of worker {worker}; sub-workers run on the host and cannot take DEVICE-space tensors (copy it to a SharedTensor first)"
                        )));
                    };
                    if worker as usize != w {
                        return Err(DistError::InvalidArgs(format!(
                            "tensor argument {i} is in the device memory of worker {worker} but the task runs on worker {w}; device addresses mean nothing on another chip"
                        )));
                    }
                    if !self.ctx.child_tensor_live(&b.identity(), w, addr, b.nbytes()) {
                        return Err(DistError::StaleTensor {
                            index: i,
                            reason: format!("it names device memory of worker {w} that is not a live allocation of this worker (freed, never allocated with alloc_child_tensor, or a descriptor that does not match its allocation)"),
                        });
                    }
                }
            }
            out.push(Access::of_arg(t));
        }
        Ok(())
    }

    /// For a window argument (`false` for any other tensor): checks that its buffer is
    /// live and adds the buffer's **ordering access** to `out` (once per buffer and task;
    /// the argument's own access, its view with its tag, is added by the caller).
    ///
    /// The ordering access is on a key of its own (the buffer's identity at a generation
    /// no buffer has), so it adds edges without disturbing the aliasing check of the
    /// views. A chip task's counts as writing its rank's whole copy, signal area included:
    /// its kernel may write the window and signal through the buffer whatever the tag,
    /// and peers reach the other copies — so tasks of one rank on one buffer are ordered
    /// in submit order, tasks of different ranks are not. A sub-worker task's covers
    /// every rank's copy (any rank's kernel may write any copy), reading or writing as
    /// its arguments of the buffer do.
    fn window_order(
        &self,
        i: usize,
        t: &TensorArg,
        target: Target,
        args: &TaskArgs,
        out: &mut Vec<Access>,
        first: usize,
    ) -> Result<bool, DistError> {
        let Some(comm) = &self.ctx.comm else {
            return Ok(false);
        };
        let in_arena = |t: &TensorArg| matches!(t.buffer.location(), BufferLocation::HostShared { region, .. } if region == comm.region);
        if !in_arena(t) {
            return Ok(false);
        }
        let geo = comm
            .geometry(&t.buffer, None)
            .ok_or_else(|| window_stale(i))?;
        let key = window_order_key(&t.buffer);
        if out[first..].iter().any(|a| a.key == key) {
            return Ok(true);
        }
        let same = || {
            args.tensors()
                .iter()
                .filter(|u| in_arena(u) && u.buffer.identity() == t.buffer.identity())
        };
        let p = geo.placement;
        let (footprint, tag) = match target {
            Target::Worker(_) => {
                let copy = t.view.byte_offset() / p.rank_stride;
                let tag = if same().all(|u| u.tag == ArgTag::NoDep) {
                    ArgTag::NoDep
                } else {
                    ArgTag::InOut
                };
                (
                    Footprint::bytes(copy * p.rank_stride, (copy + 1) * p.rank_stride)?,
                    tag,
                )
            }
            Target::Sub => {
                let tag = if same().any(|u| u.tag.writes()) {
                    ArgTag::InOut
                } else if same().any(|u| u.tag.reads()) {
                    ArgTag::Input
                } else {
                    ArgTag::NoDep
                };
                (Footprint::bytes(0, t.buffer.nbytes())?, tag)
            }
        };
        out.push(Access::new(key, footprint, tag));
        Ok(true)
    }

    /// Checks a shared-memory descriptor against the buffers this worker owns there: its
    /// comm arena's live windows, this run's live intermediates, a live shared tensor
    /// (exactly its descriptor), or a descriptor the parent admitted. Returns the region a
    /// shared tensor lives in (the task holds it in use while it runs).
    fn check_shared(
        &self,
        i: usize,
        b: &BufferDesc,
        region: u64,
    ) -> Result<Option<u64>, DistError> {
        let stale = |reason: String| DistError::StaleTensor { index: i, reason };
        if self.ctx.comm.as_ref().is_some_and(|c| c.region == region) {
            let live = self
                .ctx
                .comm
                .as_ref()
                .is_some_and(|c| c.geometry(b, None).is_some());
            return if live { Ok(None) } else { Err(window_stale(i)) };
        }
        if self.ctx.heap_regions.contains(&region) {
            return match self.run_tensors.get(&b.identity()) {
                Some((live, _)) if live == b => Ok(None),
                _ => Err(stale(format!("it names heap ring region {region} but no live intermediate of run {:?} (a RunTensor kept from another run, or from a scope that ended, or a forged descriptor)", self.run))),
            };
        }
        if let Some(owner) = self.ctx.shared.tensor_identity(region) {
            let whole = self.ctx.shared.region_len(region).map(|l| l as u64);
            let exact = owner == b.identity()
                && b.location() == (BufferLocation::HostShared { region, offset: 0 })
                && Some(b.nbytes()) == whole;
            if !exact {
                return Err(stale(format!("it names shared-tensor region {region} under a descriptor that is not its SharedTensor's (forged)")));
            }
            if !self.ctx.shared.is_live(region) {
                return Err(DistError::InvalidArgs(format!(
                    "tensor argument {i}: shared-memory region {region} was released (its SharedTensor was dropped); keep the tensor alive while tasks use it"
                )));
            }
            return Ok(Some(region));
        }
        if self.admitted.get(&b.identity()) == Some(b) {
            return Ok(None);
        }
        Err(stale(format!(
            "shared-memory region {region} holds no buffer of this worker that matches it"
        )))
    }

    fn blob(args: &TaskArgs) -> Result<Vec<u8>, DistError> {
        let mut blob = vec![0u8; strata_types::wire::args_wire_len(args)];
        encode_args(args, &mut blob)?;
        if blob.len() > strata_mailbox::layout::ARGS_CAPACITY {
            return Err(DistError::InvalidArgs(format!(
                "the task's arguments encode to {} bytes; a mailbox frame holds {}",
                blob.len(),
                strata_mailbox::layout::ARGS_CAPACITY
            )));
        }
        Ok(blob)
    }

    fn config_for(&self, config: Option<&CallConfig>) -> Result<Arc<EncodedConfig>, DistError> {
        match config {
            None => Ok(self.config.clone()),
            Some(c) => {
                c.validate()?;
                Ok(Arc::new(EncodedConfig::new(c)?))
            }
        }
    }

    fn submit_task(
        &mut self,
        task: DistTask,
        route: Route,
        members: &[Vec<Access>],
    ) -> Result<(), DistError> {
        self.wake_deferred();
        self.submitted = true;
        // The next-level workers the task runs on (per-worker submit order); no
        // allocation for a single.
        let single: [usize; 1];
        let group: Vec<usize>;
        let workers: &[usize] = match route {
            Route::Worker(w) => {
                single = [w];
                &single
            }
            Route::Group => {
                group = task.worker_targets();
                &group
            }
            Route::Sub => &[],
        };
        let route = route.word();
        let s = if members.len() == 1 {
            self.graph
                .submit(TaskSpec::new(task, &members[0]).with_route(route))?
        } else {
            let lists: Vec<&[Access]> = members.iter().map(|m| &m[..]).collect();
            self.graph
                .submit(TaskSpec::group(task, &lists).with_route(route))?
        };
        self.after_submit(s, workers)
    }

    fn after_submit(
        &mut self,
        s: strata_graph::Submitted,
        workers: &[usize],
    ) -> Result<(), DistError> {
        if s.ready {
            self.ready.push(self.graph.ready_task(s.task));
            if self.ready.len() >= READY_BATCH || self.ctx.link.is_hungry() {
                self.flush();
            } else {
                for &w in workers {
                    if !self.held_workers.contains(&w) {
                        self.held_workers.push(w);
                        self.ctx.link.hold(w, s.task.id().0);
                    }
                }
            }
        } else if workers.iter().any(|w| self.held_workers.contains(w)) {
            // A completion may make this task ready at any moment, behind a ready task
            // of the same worker still in the batch: hand the batch over now (until then
            // the scheduler keeps this task back, `Link::hold`).
            self.flush();
        }
        Ok(())
    }

    /// Submits `callable` to next-level worker `worker`: a chip orchestration to a chip, a
    /// host orchestration to a level-3 child of a level-4 worker.
    ///
    /// # Errors
    /// [`DistError::BadArgument`] for an argument `args`' builder recorded as invalid; an
    /// unknown worker id, a callable of the wrong kind or not registered, a tensor the
    /// worker cannot see (private host memory, another chip's device memory, a freed
    /// device tensor), and every error of the graph (fail-fast: a task of the run already
    /// failed → [`DistError::TaskFailed`] with the run's first error).
    pub fn submit_next_level(
        &mut self,
        callable: impl Into<NextLevelCallable>,
        args: &TaskArgs,
        worker: usize,
    ) -> Result<(), DistError> {
        self.submit_next_level_with(callable, args, worker, None)
    }

    /// [`Orch::submit_next_level`] with a per-task call configuration.
    ///
    /// # Errors
    /// As `submit_next_level`, plus an invalid `config`.
    pub fn submit_next_level_with(
        &mut self,
        callable: impl Into<NextLevelCallable>,
        args: &TaskArgs,
        worker: usize,
        config: Option<&CallConfig>,
    ) -> Result<(), DistError> {
        check_args(args, None)?;
        let callable = callable.into();
        self.check_next(worker, &callable, "submit_next_level")?;
        let args = self.narrow(args, worker)?;
        let mut acc = Vec::with_capacity(args.tensors().len());
        let mut uses = Vec::new();
        self.accesses(&args, Target::Worker(worker), &mut acc, &mut uses)?;
        let task = DistTask {
            callable: callable.id(),
            config: self.config_for(config)?,
            members: vec![Member {
                target: Target::Worker(worker),
                blob: Self::blob(&args)?,
                uses,
            }],
        };
        self.submit_task(task, Route::Worker(worker), &[acc])
    }

    /// Submits a group: member `i` runs `callable` with `args[i]` on `workers[i]`, all
    /// launched together (use it for tasks that must run concurrently, e.g. ranks of a
    /// collective). The group is one node of the graph.
    ///
    /// # Errors
    /// Mismatched lengths, duplicate workers, an empty group, and the errors of
    /// [`Orch::submit_next_level`].
    pub fn submit_next_level_group(
        &mut self,
        callable: impl Into<NextLevelCallable>,
        args: &[TaskArgs],
        workers: &[usize],
    ) -> Result<(), DistError> {
        check_group_args(args)?;
        let callable = callable.into();
        if args.len() != workers.len() || args.is_empty() {
            return Err(DistError::InvalidArgs(format!(
                "a group needs one worker per argument list and at least one member ({} argument lists, {} workers)",
                args.len(),
                workers.len()
            )));
        }
        for (i, w) in workers.iter().enumerate() {
            if workers[..i].contains(w) {
                return Err(DistError::InvalidArgs(format!(
                    "worker {w} appears twice in the group; members of a group run on distinct workers"
                )));
            }
            self.check_next(*w, &callable, "submit_next_level_group")?;
        }
        let mut members = Vec::with_capacity(args.len());
        let mut accesses = Vec::with_capacity(args.len());
        for (m, (a, &w)) in args.iter().zip(workers).enumerate() {
            let a = self.narrow(a, w).map_err(|e| in_member(e, m))?;
            let mut acc = Vec::new();
            let mut uses = Vec::new();
            self.accesses(&a, Target::Worker(w), &mut acc, &mut uses)?;
            accesses.push(acc);
            members.push(Member {
                target: Target::Worker(w),
                blob: Self::blob(&a)?,
                uses,
            });
        }
        let route = if members.len() == 1 {
            Route::Worker(workers[0])
        } else {
            Route::Group
        };
        let task = DistTask {
            callable: callable.id(),
            config: self.config.clone(),
            members,
        };
        self.submit_task(task, route, &accesses)
    }

    fn check_sub(&self, h: &SubHandle) -> Result<(), DistError> {
        if self.ctx.n_subs == 0 {
            return Err(DistError::InvalidArgs(
                "this worker has no sub-workers; configure num_sub_workers".into(),
            ));
        }
        if self.programs.subs.get(&h.id).is_none() {
            return Err(DistError::UnknownCallable(h.id.to_string()));
        }
        Ok(())
    }

    /// Submits a sub-worker task: `callable` runs on any idle sub-worker with `args`.
    ///
    /// # Errors
    /// [`DistError::BadArgument`] for an argument `args`' builder recorded as invalid; no
    /// sub-workers, an unregistered callable, a tensor a sub-worker cannot see, and the
    /// graph's errors (fail-fast included).
    pub fn submit_sub(&mut self, callable: &SubHandle, args: &TaskArgs) -> Result<(), DistError> {
        check_args(args, None)?;
        self.check_sub(callable)?;
        let mut acc = Vec::with_capacity(args.tensors().len());
        let mut uses = Vec::new();
        self.accesses(args, Target::Sub, &mut acc, &mut uses)?;
        let task = DistTask {
            callable: callable.id,
            config: self.config.clone(),
            members: vec![Member {
                target: Target::Sub,
                blob: Self::blob(args)?,
                uses,
            }],
        };
        self.submit_task(task, Route::Sub, &[acc])
    }

    /// Submits a group of sub-worker tasks launched together on distinct sub-workers.
    ///
    /// # Errors
    /// More members than sub-workers, an empty group, and the errors of
    /// [`Orch::submit_sub`].
    pub fn submit_sub_group(
        &mut self,
        callable: &SubHandle,
        args: &[TaskArgs],
    ) -> Result<(), DistError> {
        check_group_args(args)?;
        self.check_sub(callable)?;
        if args.is_empty() || args.len() > self.ctx.n_subs {
            return Err(DistError::InvalidArgs(format!(
                "a sub group needs 1..={} members (one per sub-worker), got {}",
                self.ctx.n_subs,
                args.len()
            )));
        }
        let mut members = Vec::with_capacity(args.len());
        let mut accesses = Vec::with_capacity(args.len());
        for a in args {
            let mut acc = Vec::new();
            let mut uses = Vec::new();
            self.accesses(a, Target::Sub, &mut acc, &mut uses)?;
            accesses.push(acc);
            members.push(Member {
                target: Target::Sub,
                blob: Self::blob(a)?,
                uses,
            });
        }
        let task = DistTask {
            callable: callable.id,
            config: self.config.clone(),
            members,
        };
        self.submit_task(task, Route::Sub, &accesses)
    }

    /// Opens a nested scope (runtime-owned intermediates allocated in it are reclaimed
    /// once it ends and every task using them finished).
    ///
    /// # Errors
    /// Past 64 nested scopes (counting the run's own).
    pub fn scope_begin(&mut self) -> Result<(), DistError> {
        self.wake_deferred();
        Ok(self.graph.scope_begin()?)
    }

    /// Ends the innermost scope (never blocks).
    ///
    /// # Errors
    /// Without a matching `scope_begin`.
    pub fn scope_end(&mut self) -> Result<(), DistError> {
        self.wake_deferred();
        self.graph.scope_end()?;
        // The ended scope's intermediates go back to their ring once their tasks finish:
        // from now on no task may name them.
        let depth = self.graph.scope_depth();
        self.run_tensors.retain(|_, (_, d)| *d <= depth);
        Ok(())
    }

    /// Runs `f` inside a nested scope. Like the orchestration itself, `f` returns a
    /// [`CallbackResult`], so `?` works on any error.
    ///
    /// # Errors
    /// `f`'s error, or a scope error (a boxed [`DistError`]).
    pub fn scope<R>(
        &mut self,
        f: impl FnOnce(&mut Orch<'w>) -> CallbackResult<R>,
    ) -> CallbackResult<R> {
        self.scope_begin()?;
        let r = f(self);
        self.scope_end()?;
        r
    }

    /// Allocates a runtime-owned intermediate of `shape` and `dtype` in shared memory from
    /// the current scope's heap ring (may wait for older intermediates of that ring to be
    /// reclaimed; a heap that can never fit it is an error naming the ring and its size).
    ///
    /// The tensor belongs to this run and scope: a task of another run, or one submitted
    /// after its scope ended, that names it is refused with [`DistError::StaleTensor`]
    /// (its bytes may belong to another intermediate by then).
    ///
    /// # Errors
    /// A bad shape, or a heap-ring error.
    pub fn alloc(&mut self, shape: &[u64], dtype: DataType) -> Result<RunTensor, DistError> {
        let view = TensorView::contiguous(dtype, shape)?;
        let identity = self.ctx.minter.mint();
        let key = BufferKey::new(identity, KeySpace::Host);
        // The space may only come back once tasks still in the hand-over batch have run.
        self.flush();
        self.wake_deferred();
        let (_, slab) = self.graph.alloc(key, view.nbytes())?;
        // SAFETY: the slab was just allocated to this identity alone; it is reclaimed only
        // after its scope ended and every task naming it finished, and from the scope's end
        // on this run refuses the descriptor (`run_tensors`); other runs never accept it.
        let buffer = unsafe {
            BufferDesc::from_parts(
                identity,
                slab.len,
                BufferLocation::HostShared {
                    region: self.ctx.heap_regions[slab.ring],
                    offset: slab.offset,
                },
            )
        };
        self.run_tensors
            .insert(identity, (buffer, self.graph.scope_depth()));
        Ok(RunTensor {
            buffer,
            view,
            run: self.run,
        })
    }

    /// Device-memory control from inside a run must come before the run's first task
    /// (the reference's rule: control commands do not interleave with task dispatch), and
    /// waits until this run is the one executing.
    fn control_gate(&mut self, op: &str) -> Result<(), DistError> {
        self.wake_deferred();
        if self.submitted {
            return Err(DistError::InvalidArgs(format!(
                "{op} cannot follow a task submission in the same run; do device-memory control before submitting"
            )));
        }
        self.wait_until_oldest()
    }

    /// Waits until this run is the one executing: runs finish in order, so every earlier
    /// run is done then.
    fn wait_until_oldest(&mut self) -> Result<(), DistError> {
        while self.graph.dispatchable_run() != Some(self.run) {
            if let Some(why) = self.ctx.link.unusable() {
                return Err(DistError::Unusable(why));
            }
            self.graph
                .wait_progress(std::time::Duration::from_millis(5));
        }
        Ok(())
    }

    /// Allocates a tensor in the device memory of chip `worker`.
    ///
    /// # Errors
    /// A worker that is not a chip, a bad shape, an allocation failure, or control after a
    /// submit in the same run.
    pub fn alloc_child_tensor(
        &mut self,
        worker: usize,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<DeviceTensor, DistError> {
        self.control_gate("alloc_child_tensor")?;
        self.ctx.alloc_child_tensor(worker, shape, dtype)
    }

    /// Frees a tensor allocated with `alloc_child_tensor`.
    ///
    /// # Errors
    /// A tensor already freed or of another worker, or control after a submit.
    pub fn free(&mut self, t: DeviceTensor) -> Result<(), DistError> {
        self.control_gate("free")?;
        self.ctx.free_child_tensor(t)
    }

    /// Copies a shared tensor into a chip tensor (same byte size).
    ///
    /// # Errors
    /// Size mismatch, a dead allocation, or control after a submit.
    pub fn copy_to(&mut self, dst: &DeviceTensor, src: &SharedTensor) -> Result<(), DistError> {
        self.control_gate("copy_to")?;
        self.ctx
            .copy(dst, src, crate::control::CopyDirection::ToDevice)
    }

    /// Copies a chip tensor into a shared tensor (same byte size).
    ///
    /// # Errors
    /// As [`Orch::copy_to`].
    pub fn copy_from(&mut self, dst: &SharedTensor, src: &DeviceTensor) -> Result<(), DistError> {
        self.control_gate("copy_from")?;
        self.ctx
            .copy(src, dst, crate::control::CopyDirection::FromDevice)
    }

    /// Bytes chip `worker`'s device allocator holds.
    ///
    /// # Errors
    /// A worker that is not a chip, or control after a submit.
    pub fn committed_device_memory(&mut self, worker: usize) -> Result<u64, DistError> {
        self.control_gate("committed_device_memory")?;
        self.ctx.committed_device_memory(worker)
    }
}
