//! The orchestration facade: what a host orchestration function uses to build its run.

use crate::error::{DistError, OrchError};
use crate::registry::{NextLevelCallable, SubHandle};
use crate::sched::ControlJob;
use crate::task::{DistTask, Member, Target, ROUTE_GROUP, ROUTE_SUB};
use crate::worker::{ChildKind, Ctx};
use std::sync::{mpsc, Arc};
use strata_graph::{Access, BufferKey, KeySpace, Orchestrator, ReadyTask, RunId, TaskSpec};
use strata_host::SharedTensor;
use strata_mailbox::{ControlReply, EncodedConfig};
use strata_types::wire::encode_args;
use strata_types::{
    ArgTag, BufferDesc, BufferIdentity, BufferLocation, CallConfig, DataType, TaskArgs, TensorArg,
    TensorView,
};

/// Control commands understood by chip children.
pub(crate) mod ctrl {
    /// `arg0` = bytes → `result` = device address.
    pub const MALLOC: u64 = 1;
    /// `arg0` = device address (an allocation base).
    pub const FREE: u64 = 2;
    /// Payload `[device addr, region, offset, nbytes]` (u64 LE): shared memory → device.
    pub const COPY_TO: u64 = 3;
    /// Payload as `COPY_TO`: device → shared memory.
    pub const COPY_FROM: u64 = 4;
    /// → `result` = bytes the chip's allocator holds.
    pub const COMMITTED: u64 = 5;
}

/// A tensor in the device memory of one chip child, allocated with
/// [`Orch::alloc_child_tensor`] or [`crate::DistWorker::alloc_child_tensor`]. It stays
/// resident across runs until freed; pass it to tasks of *that* chip only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChildTensor {
    pub(crate) worker: usize,
    pub(crate) addr: u64,
    pub(crate) buffer: BufferDesc,
    pub(crate) view: TensorView,
}

impl ChildTensor {
    /// The chip (next-level worker id) whose memory holds it.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Its view.
    pub fn view(&self) -> TensorView {
        self.view
    }

    /// The whole tensor as a task argument.
    pub fn arg(&self, tag: ArgTag) -> TensorArg {
        TensorArg {
            buffer: self.buffer,
            view: self.view,
            tag,
        }
    }

    /// A sub-view of the tensor as a task argument.
    ///
    /// # Errors
    /// If the view does not fit the tensor's buffer.
    pub fn arg_view(&self, view: TensorView, tag: ArgTag) -> Result<TensorArg, DistError> {
        Ok(TensorArg::new(self.buffer, view, tag)?)
    }
}

/// A runtime-owned intermediate in shared memory, allocated with [`Orch::alloc`] from the
/// current scope's heap ring. It lives until its scope ends and every task that uses it
/// finished; every child can see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunTensor {
    buffer: BufferDesc,
    view: TensorView,
}

impl RunTensor {
    /// Its view.
    pub fn view(&self) -> TensorView {
        self.view
    }

    /// The whole tensor as a task argument.
    pub fn arg(&self, tag: ArgTag) -> TensorArg {
        TensorArg {
            buffer: self.buffer,
            view: self.view,
            tag,
        }
    }
}

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
    pub(crate) run: RunId,
    pub(crate) ready: Vec<ReadyTask>,
    pub(crate) submitted: bool,
    pub(crate) config: Arc<EncodedConfig>,
}

impl std::fmt::Debug for Orch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orch")
            .field("run", &self.run)
            .finish_non_exhaustive()
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
        self.ctx.link.push_ready(&mut self.ready);
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
                if self.ctx.programs.chip.orchestration(&h.id()).is_none() {
                    return Err(DistError::UnknownCallable(h.id().to_string()));
                }
                true
            }
            (ChildKind::Worker, NextLevelCallable::Host(h)) => {
                if self.ctx.programs.host_name(&h.id).is_none() {
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
                },
                got: callable.kind_name(),
            });
        }
        Ok(())
    }

    /// Checks that every tensor argument is visible to `target` and builds the accesses.
    fn accesses(
        &self,
        args: &TaskArgs,
        target: Target,
        out: &mut Vec<Access>,
    ) -> Result<(), DistError> {
        for (i, t) in args.tensors().iter().enumerate() {
            match t.buffer.location {
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
                    if !self.ctx.shared.is_live(region) {
                        return Err(DistError::InvalidArgs(format!(
                            "tensor argument {i}: shared-memory region {region} was released (its SharedTensor was dropped); keep the tensor alive while tasks use it"
                        )));
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
                    if !self.ctx.child_tensor_live(&t.buffer.identity, w, addr) {
                        return Err(DistError::InvalidArgs(format!(
                            "tensor argument {i} names device memory of worker {w} that is not a live allocation of this worker (freed, or never allocated with alloc_child_tensor)"
                        )));
                    }
                }
            }
            out.push(Access::of_arg(t));
        }
        Ok(())
    }

    /// The blob of a next-level task: window tensors (the comm arena's memory) order the
    /// task but are not sent as kernel tensors — kernels reach windows in place, by the
    /// scalars that name them.
    fn next_level_blob(&self, args: &TaskArgs) -> Result<Vec<u8>, DistError> {
        let Some(comm) = &self.ctx.comm else {
            return Self::blob(args);
        };
        let in_arena = |t: &TensorArg| matches!(t.buffer.location, BufferLocation::HostShared { region, .. } if region == comm.region);
        if !args.tensors().iter().any(in_arena) {
            return Self::blob(args);
        }
        let mut kept = TaskArgs::with_limits(args.limits());
        for t in args.tensors().iter().filter(|t| !in_arena(t)) {
            kept.push_tensor(*t)?;
        }
        for &s in args.scalars() {
            kept.push_scalar_bits(s)?;
        }
        Self::blob(&kept)
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
        route: u64,
        members: &[Vec<Access>],
    ) -> Result<(), DistError> {
        self.submitted = true;
        let spec = if members.len() == 1 {
            TaskSpec::new(task, &members[0]).with_route(route)
        } else {
            let lists: Vec<&[Access]> = members.iter().map(|m| &m[..]).collect();
            let s = self
                .graph
                .submit(TaskSpec::group(task, &lists).with_route(route))?;
            return self.after_submit(s);
        };
        let s = self.graph.submit(spec)?;
        self.after_submit(s)
    }

    fn after_submit(&mut self, s: strata_graph::Submitted) -> Result<(), DistError> {
        if s.ready {
            self.ready.push(self.graph.ready_task(s.task));
            if self.ready.len() >= READY_BATCH || self.ctx.link.is_hungry() {
                self.flush();
            }
        }
        Ok(())
    }

    /// Submits `callable` to next-level worker `worker`: a chip orchestration to a chip, a
    /// host orchestration to a level-3 child of a level-4 worker.
    ///
    /// # Errors
    /// An unknown worker id, a callable of the wrong kind or not registered, a tensor the
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
        let callable = callable.into();
        self.check_next(worker, &callable, "submit_next_level")?;
        let mut acc = Vec::with_capacity(args.tensors().len());
        self.accesses(args, Target::Worker(worker), &mut acc)?;
        let task = DistTask {
            callable: callable.id(),
            config: self.config_for(config)?,
            members: vec![Member {
                target: Target::Worker(worker),
                blob: self.next_level_blob(args)?,
            }],
        };
        self.submit_task(task, worker as u64, &[acc])
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
        for (a, &w) in args.iter().zip(workers) {
            let mut acc = Vec::new();
            self.accesses(a, Target::Worker(w), &mut acc)?;
            accesses.push(acc);
            members.push(Member {
                target: Target::Worker(w),
                blob: self.next_level_blob(a)?,
            });
        }
        let route = if members.len() == 1 {
            workers[0] as u64
        } else {
            ROUTE_GROUP
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
        if self.ctx.programs.subs.get(&h.id).is_none() {
            return Err(DistError::UnknownCallable(h.id.to_string()));
        }
        Ok(())
    }

    /// Submits a sub-worker task: `callable` runs on any idle sub-worker with `args`.
    ///
    /// # Errors
    /// No sub-workers, an unregistered callable, a tensor a sub-worker cannot see, and the
    /// graph's errors (fail-fast included).
    pub fn submit_sub(&mut self, callable: &SubHandle, args: &TaskArgs) -> Result<(), DistError> {
        self.check_sub(callable)?;
        let mut acc = Vec::with_capacity(args.tensors().len());
        self.accesses(args, Target::Sub, &mut acc)?;
        let task = DistTask {
            callable: callable.id,
            config: self.config.clone(),
            members: vec![Member {
                target: Target::Sub,
                blob: Self::blob(args)?,
            }],
        };
        self.submit_task(task, ROUTE_SUB, &[acc])
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
            self.accesses(a, Target::Sub, &mut acc)?;
            accesses.push(acc);
            members.push(Member {
                target: Target::Sub,
                blob: Self::blob(a)?,
            });
        }
        let task = DistTask {
            callable: callable.id,
            config: self.config.clone(),
            members,
        };
        self.submit_task(task, ROUTE_SUB, &accesses)
    }

    /// Opens a nested scope (runtime-owned intermediates allocated in it are reclaimed
    /// once it ends and every task using them finished).
    ///
    /// # Errors
    /// Past 64 nested scopes (counting the run's own).
    pub fn scope_begin(&mut self) -> Result<(), DistError> {
        Ok(self.graph.scope_begin()?)
    }

    /// Ends the innermost scope (never blocks).
    ///
    /// # Errors
    /// Without a matching `scope_begin`.
    pub fn scope_end(&mut self) -> Result<(), DistError> {
        Ok(self.graph.scope_end()?)
    }

    /// Runs `f` inside a nested scope.
    ///
    /// # Errors
    /// `f`'s error, or a scope error.
    pub fn scope<R>(
        &mut self,
        f: impl FnOnce(&mut Orch<'w>) -> Result<R, OrchError>,
    ) -> Result<R, OrchError> {
        self.scope_begin()?;
        let r = f(self);
        self.scope_end()?;
        r
    }

    /// Allocates a runtime-owned intermediate of `shape` and `dtype` in shared memory from
    /// the current scope's heap ring (may wait for older intermediates of that ring to be
    /// reclaimed; a heap that can never fit it is an error naming the ring and its size).
    ///
    /// # Errors
    /// A bad shape, or a heap-ring error.
    pub fn alloc(&mut self, shape: &[u64], dtype: DataType) -> Result<RunTensor, DistError> {
        let view = TensorView::contiguous(dtype, shape)?;
        let identity = self.ctx.minter.mint();
        let key = BufferKey::new(identity, KeySpace::Host);
        // The space may only come back once tasks still in the hand-over batch have run.
        self.flush();
        let (_, slab) = self.graph.alloc(key, view.nbytes())?;
        let buffer = BufferDesc {
            identity,
            nbytes: slab.len,
            location: BufferLocation::HostShared {
                region: self.ctx.heap_regions[slab.ring],
                offset: slab.offset,
            },
        };
        Ok(RunTensor { buffer, view })
    }

    /// Device-memory control from inside a run must come before the run's first task
    /// (the reference's rule: control commands do not interleave with task dispatch), and
    /// waits until this run is the one executing.
    fn control_gate(&mut self, op: &str) -> Result<(), DistError> {
        if self.submitted {
            return Err(DistError::InvalidArgs(format!(
                "{op} cannot follow a task submission in the same run; do device-memory control before submitting"
            )));
        }
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
    ) -> Result<ChildTensor, DistError> {
        self.control_gate("alloc_child_tensor")?;
        self.ctx.alloc_child_tensor(worker, shape, dtype)
    }

    /// Frees a tensor allocated with `alloc_child_tensor`.
    ///
    /// # Errors
    /// A tensor already freed or of another worker, or control after a submit.
    pub fn free(&mut self, t: ChildTensor) -> Result<(), DistError> {
        self.control_gate("free")?;
        self.ctx.free_child_tensor(t)
    }

    /// Copies a shared tensor into a chip tensor (same byte size).
    ///
    /// # Errors
    /// Size mismatch, a dead allocation, or control after a submit.
    pub fn copy_to(&mut self, dst: &ChildTensor, src: &SharedTensor) -> Result<(), DistError> {
        self.control_gate("copy_to")?;
        self.ctx.copy(dst, src, true)
    }

    /// Copies a chip tensor into a shared tensor (same byte size).
    ///
    /// # Errors
    /// As [`Orch::copy_to`].
    pub fn copy_from(&mut self, dst: &SharedTensor, src: &ChildTensor) -> Result<(), DistError> {
        self.control_gate("copy_from")?;
        self.ctx.copy(src, dst, false)
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

impl Ctx {
    /// Runs a control command on lane `lane` through the scheduler thread.
    pub(crate) fn control(
        &self,
        lane: usize,
        command: u64,
        arg0: u64,
        payload: Vec<u8>,
    ) -> Result<ControlReply, DistError> {
        let (tx, rx) = mpsc::channel();
        self.link.push_control(ControlJob {
            lane,
            command,
            arg0,
            payload,
            reply: tx,
        });
        let r = rx.recv().map_err(|_| DistError::Control {
            worker: self.labels.get(lane).cloned().unwrap_or_default(),
            message: "the scheduler stopped before answering".into(),
        })?;
        r.map_err(|message| DistError::Control {
            worker: self.labels.get(lane).cloned().unwrap_or_default(),
            message,
        })
    }

    fn chip_lane(&self, worker: usize) -> Result<usize, DistError> {
        match self.next.get(worker) {
            Some(ChildKind::Chip) => Ok(worker),
            Some(ChildKind::Worker) => Err(DistError::InvalidArgs(format!(
                "worker {worker} is a level-3 worker, not a chip; device memory belongs to chips"
            ))),
            None => Err(DistError::UnknownWorker {
                id: worker,
                count: self.next.len(),
            }),
        }
    }

    pub(crate) fn alloc_child_tensor(
        &self,
        worker: usize,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<ChildTensor, DistError> {
        let lane = self.chip_lane(worker)?;
        let view = TensorView::contiguous(dtype, shape)?;
        let reply = self.control(lane, ctrl::MALLOC, view.nbytes(), Vec::new())?;
        let identity = self.minter.mint();
        let t = ChildTensor {
            worker,
            addr: reply.result,
            buffer: BufferDesc {
                identity,
                nbytes: view.nbytes(),
                location: BufferLocation::Device {
                    worker: worker as u32,
                    addr: reply.result,
                },
            },
            view,
        };
        self.child_tensors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(identity, (worker, reply.result));
        Ok(t)
    }

    pub(crate) fn free_child_tensor(&self, t: ChildTensor) -> Result<(), DistError> {
        let lane = self.chip_lane(t.worker)?;
        let removed = self
            .child_tensors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&t.buffer.identity);
        if removed != Some((t.worker, t.addr)) {
            return Err(DistError::InvalidArgs(format!(
                "the tensor at device address {:#x} of worker {} is not a live allocation of this worker (double free, or allocated elsewhere)",
                t.addr, t.worker
            )));
        }
        self.control(lane, ctrl::FREE, t.addr, Vec::new())?;
        Ok(())
    }

    pub(crate) fn copy(
        &self,
        dev: &ChildTensor,
        host: &SharedTensor,
        to_device: bool,
    ) -> Result<(), DistError> {
        let lane = self.chip_lane(dev.worker)?;
        if !self.child_tensor_live(&dev.buffer.identity, dev.worker, dev.addr) {
            return Err(DistError::InvalidArgs(format!(
                "device tensor {:#x} of worker {} was freed",
                dev.addr, dev.worker
            )));
        }
        let hb = host.buffer();
        let BufferLocation::HostShared { region, offset } = hb.location else {
            return Err(DistError::InvalidArgs(
                "the host end must be a SharedTensor".into(),
            ));
        };
        if !self.region_visible(region) {
            return Err(DistError::InvalidArgs(
                "the shared tensor was created after this worker started its children; create it before init()".into(),
            ));
        }
        self.shared.ptr(region, offset, host.nbytes())?;
        let n = dev.view.nbytes();
        if host.nbytes() != n {
            return Err(DistError::InvalidArgs(format!(
                "copy between tensors of different sizes: device {n} bytes, host {} bytes",
                host.nbytes()
            )));
        }
        let mut payload = Vec::with_capacity(32);
        for v in [dev.addr, region, offset, n] {
            payload.extend_from_slice(&v.to_le_bytes());
        }
        let cmd = if to_device {
            ctrl::COPY_TO
        } else {
            ctrl::COPY_FROM
        };
        self.control(lane, cmd, 0, payload)?;
        Ok(())
    }

    pub(crate) fn committed_device_memory(&self, worker: usize) -> Result<u64, DistError> {
        let lane = self.chip_lane(worker)?;
        Ok(self.control(lane, ctrl::COMMITTED, 0, Vec::new())?.result)
    }

    pub(crate) fn child_tensor_live(
        &self,
        identity: &BufferIdentity,
        worker: usize,
        addr: u64,
    ) -> bool {
        self.child_tensors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(identity)
            .is_some_and(|&(w, base)| w == worker && addr == base)
    }
}
