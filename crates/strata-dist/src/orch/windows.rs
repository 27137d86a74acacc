//! The orchestration's window API: comm domains, window buffers and tensors, and the
//! host-level collectives and staging (builtin chip orchestrations submitted as groups).
//! The comm state itself — the arena, the per-run and persistent window rules — is
//! `crate::comm`; what this adds is the ordering against earlier runs (a run's windows
//! are claimed only once the runs before it finished) and the submission of the builtins.

use super::Orch;
use crate::comm::{Builtins, CommCtx, RunWindows, WindowTensor};
use crate::error::DistError;
use strata_chip::OrchHandle;
use strata_comm::{AllreduceAlgo, Domain, ReduceOp, WindowBuffer};
use strata_types::{ArgTag, DataType, Element, TaskArgs, TensorArg};

impl<'w> Orch<'w> {
    fn comm(&self) -> Result<&'w CommCtx, DistError> {
        self.ctx.comm.as_ref().ok_or_else(|| {
            DistError::InvalidArgs(
                "this worker has no comm arena: window buffers are for the chips of a level-3 worker (configure chips)".into(),
            )
        })
    }

    /// The comm state for this run: a run's first window operation waits until the run
    /// that owns the allocated windows has finished, then claims them (freeing all but
    /// the persistent ones).
    fn windows(&mut self) -> Result<RunWindows<'w>, DistError> {
        let comm = self.comm()?;
        if comm.owner().is_some_and(|owner| owner != self.run) {
            self.flush();
            self.wait_until_oldest()?;
        }
        Ok(comm.claim(self.run))
    }

    /// The world: the next-level workers, ranks `0..n` (world rank = next-level worker
    /// id) — the chips of a level-3 worker, the level-3 children of a level-4 one.
    pub fn world_size(&self) -> usize {
        self.ctx.next.len()
    }

    /// A comm domain over chips `workers` (their order is the domain's rank numbering).
    ///
    /// # Errors
    /// No comm arena; workers repeated or out of range.
    pub fn comm_domain(&mut self, workers: &[usize]) -> Result<Domain, DistError> {
        self.windows()?.domain(workers)
    }

    /// A window buffer of `bytes` per chip over every chip (the world domain).
    ///
    /// # Errors
    /// As [`Orch::alloc_window_buffer_in`].
    pub fn alloc_window_buffer(&mut self, bytes: u64) -> Result<WindowBuffer, DistError> {
        let world = self.windows()?.world()?;
        self.alloc_window_buffer_in(&world, bytes)
    }

    /// A window buffer of `bytes` per rank (in bytes, not elements) on every rank of
    /// `domain`, zero-filled. It lives for this run (freed once a later run allocates
    /// windows) unless the worker keeps windows
    /// ([`WindowLifetime::Persistent`](crate::WindowLifetime::Persistent)): then the
    /// `k`-th buffer of every run is the `k`-th buffer of the first.
    ///
    /// # Errors
    /// No comm arena; the arena is full (`DistConfig::comm_arena_bytes`); a persistent
    /// run that allocates a different sequence of buffers.
    pub fn alloc_window_buffer_in(
        &mut self,
        domain: &Domain,
        bytes: u64,
    ) -> Result<WindowBuffer, DistError> {
        let minter = self.ctx.minter.clone();
        self.windows()?.alloc_window_buffer(domain, bytes, &minter)
    }

    /// A typed, row-major view at byte `offset` of a window buffer, the same on every rank.
    ///
    /// # Errors
    /// A freed buffer, a view that does not fit.
    pub fn window(
        &mut self,
        buf: &WindowBuffer,
        offset: u64,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<WindowTensor, DistError> {
        self.windows()?.window(buf, offset, shape, dtype)
    }

    /// Writes `data` into domain rank `rank`'s copy of `w` now (synchronously): stage
    /// every rank before submitting the tasks that use the window (submission is
    /// asynchronous; a write after a submit races with it).
    ///
    /// # Errors
    /// A freed window, a rank outside the domain, a type or length mismatch.
    pub fn window_write<T: Element>(
        &mut self,
        w: &WindowTensor,
        rank: u32,
        data: &[T],
    ) -> Result<(), DistError> {
        self.windows()?.write(w, rank, data)
    }

    /// Submits a builtin collective as a group over the windows' domain: every member
    /// gets the same arguments (the windows whole, then `extra` scalars), narrowed to its
    /// own rank's copies.
    fn collective(
        &mut self,
        which: fn(&Builtins) -> OrchHandle,
        windows: &[(&WindowTensor, ArgTag)],
        extra: &[u64],
    ) -> Result<(), DistError> {
        let builtins = self.comm()?.builtins();
        let first = windows[0].0;
        let members = self.windows()?.workers(&first.domain())?;
        let mut args = TaskArgs::new();
        for (w, tag) in windows {
            if w.domain() != first.domain() {
                return Err(DistError::InvalidArgs(
                    "the windows of a collective must belong to one domain".into(),
                ));
            }
            args.push_tensor(w.arg(*tag))?;
        }
        for &s in extra {
            args.push_scalar_bits(s)?;
        }
        let per_rank = vec![args; members.len()];
        self.submit_next_level_group(which(&builtins), &per_rank, &members)
    }

    /// Allreduce of `data` in place on every rank of its domain (synchronised through its
    /// buffer's signal area; reusable run after run): a group task of the builtin
    /// collective kernel over the domain, ordered after earlier tasks of each rank on the
    /// buffer. The host-level twin of `strata_comm::Window::allreduce`.
    ///
    /// # Errors
    /// No comm arena; the group's submit errors.
    pub fn allreduce(
        &mut self,
        data: &WindowTensor,
        op: ReduceOp,
        algo: AllreduceAlgo,
    ) -> Result<(), DistError> {
        self.collective(
            |b| b.allreduce,
            &[(data, ArgTag::InOut)],
            &[op.code(), algo.code()],
        )
    }

    /// Broadcast of domain rank `root`'s copy of `data` to every rank of its domain.
    ///
    /// # Errors
    /// As [`Orch::allreduce`].
    pub fn broadcast(&mut self, data: &WindowTensor, root: u32) -> Result<(), DistError> {
        self.collective(
            |b| b.broadcast,
            &[(data, ArgTag::InOut)],
            &[u64::from(root)],
        )
    }

    /// Allgather: `target[src, :]` = `stage` of rank `src`, on every rank (`stage` and
    /// `target` of one domain).
    ///
    /// # Errors
    /// As [`Orch::allreduce`]; windows of different domains.
    pub fn allgather(
        &mut self,
        stage: &WindowTensor,
        target: &WindowTensor,
    ) -> Result<(), DistError> {
        self.collective(
            |b| b.allgather,
            &[(stage, ArgTag::Input), (target, ArgTag::InOut)],
            &[],
        )
    }

    /// Reduce-scatter: rank `r` ends with the reduction of chunk `r` in `data[r, :]`.
    ///
    /// # Errors
    /// As [`Orch::allreduce`].
    pub fn reduce_scatter(&mut self, data: &WindowTensor, op: ReduceOp) -> Result<(), DistError> {
        self.collective(|b| b.reduce_scatter, &[(data, ArgTag::InOut)], &[op.code()])
    }

    /// All-to-all: `target[src, :]` = the chunk rank `src` prepared for this rank in its
    /// `stage`.
    ///
    /// # Errors
    /// As [`Orch::allgather`].
    pub fn all_to_all(
        &mut self,
        stage: &WindowTensor,
        target: &WindowTensor,
    ) -> Result<(), DistError> {
        self.collective(
            |b| b.all_to_all,
            &[(stage, ArgTag::Input), (target, ArgTag::InOut)],
            &[],
        )
    }

    /// A barrier of every rank of `window`'s domain, through its buffer's signal area
    /// (self-clearing; reusable).
    ///
    /// # Errors
    /// As [`Orch::allreduce`].
    pub fn barrier(&mut self, window: &WindowTensor) -> Result<(), DistError> {
        self.collective(|b| b.barrier, &[(window, ArgTag::InOut)], &[])
    }

    /// A task on chip `rank`'s worker that copies `src` (a shared tensor with as many
    /// elements and the same type) into domain rank `rank`'s copy of `dst`.
    ///
    /// # Errors
    /// A rank outside the domain; the submit's errors.
    pub fn copy_to_window(
        &mut self,
        src: TensorArg,
        dst: &WindowTensor,
        rank: u32,
    ) -> Result<(), DistError> {
        self.stage(
            src.with_tag(ArgTag::Input),
            dst,
            rank,
            ArgTag::OutputExisting,
            true,
        )
    }

    /// A task on chip `rank`'s worker that copies domain rank `rank`'s copy of `src` into
    /// `dst` (a shared tensor with as many elements and the same type).
    ///
    /// # Errors
    /// As [`Orch::copy_to_window`].
    pub fn copy_from_window(
        &mut self,
        src: &WindowTensor,
        rank: u32,
        dst: TensorArg,
    ) -> Result<(), DistError> {
        self.stage(
            dst.with_tag(ArgTag::OutputExisting),
            src,
            rank,
            ArgTag::Input,
            false,
        )
    }

    fn stage(
        &mut self,
        host: TensorArg,
        w: &WindowTensor,
        rank: u32,
        window_tag: ArgTag,
        into_window: bool,
    ) -> Result<(), DistError> {
        if host.view.dtype() != w.dtype() || host.view.numel() != w.tensor().numel() {
            return Err(DistError::InvalidArgs(format!(
                "staging between a {} tensor of {} elements and a {} window of {} elements; they must match",
                host.view.dtype(),
                host.view.numel(),
                w.dtype(),
                w.tensor().numel()
            )));
        }
        let builtins = self.comm()?.builtins();
        let members = self.windows()?.workers(&w.domain())?;
        let worker = *members.get(rank as usize).ok_or_else(|| {
            DistError::InvalidArgs(format!(
                "rank {rank} is outside the window's domain of {} ranks",
                members.len()
            ))
        })?;
        let mut args = TaskArgs::new();
        args.push_tensor(host)?;
        args.push_tensor(w.arg(window_tag))?;
        let which = if into_window {
            builtins.stage_in
        } else {
            builtins.stage_out
        };
        self.submit_next_level(which, &args, worker)
    }
}
