//! The engine's own facade: one `Worker` type for every level — a chip (L2), a host with
//! chips and sub-workers (L3), a host whose children are level-3 workers (L4) — with the
//! register → init → submit / run → close lifecycle. Programs and prepared workers
//! (`crate::program`, `crate::PreparedWorker`) are built on the same engine; this is the
//! layer beneath them, for users who register callables themselves.

use crate::error::Error;
use crate::handle::{DispatchHandle, DispatchState};
use std::sync::Arc;
use strata_chip::TaskArgsError;
use strata_chip::{ChipConfig, ChipWorker, DeviceTensor, KernelHandle, OrchHandle, RunArgs};
use strata_dist::{DistConfig, DistWorker, HostOrchHandle, Orch, SubHandle};
use strata_host::{SharedMemory, SharedTensor};
use strata_types::CallbackResult;
use strata_types::{CallConfig, DataType, Element, IdentityMinter, TaskArgs};

/// What a run executes: a chip orchestration (on a level-2 worker) or a host orchestration
/// (on level 3 and up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Callable {
    /// A chip orchestration.
    Chip(OrchHandle),
    /// A host orchestration.
    Host(HostOrchHandle),
}

impl From<OrchHandle> for Callable {
    fn from(h: OrchHandle) -> Self {
        Callable::Chip(h)
    }
}
impl From<&OrchHandle> for Callable {
    fn from(h: &OrchHandle) -> Self {
        Callable::Chip(*h)
    }
}
impl From<HostOrchHandle> for Callable {
    fn from(h: HostOrchHandle) -> Self {
        Callable::Host(h)
    }
}
impl From<&HostOrchHandle> for Callable {
    fn from(h: &HostOrchHandle) -> Self {
        Callable::Host(*h)
    }
}

enum Inner {
    Chip {
        chip: Box<ChipWorker>,
        shared: Arc<SharedMemory>,
        minter: IdentityMinter,
    },
    Dist(Box<DistWorker>),
}

/// A worker of any level with one lifecycle: register callables → [`Worker::init`] →
/// [`Worker::submit`] / [`Worker::run`] many times → [`Worker::close`] (also on drop).
///
/// ```no_run
/// use strata::Worker;
/// use strata::types::{ArgTag, TaskArgs};
///
/// let mut w = Worker::l3(vec![], 1)?; // no chips, one sub-worker
/// let x = w.shared_tensor_from(&[3], &[1i32, 2, 3])?;
/// let inc = w.register_sub("inc", |call| {
///     let mut t = call.tensor_mut::<i32>(0)?;
///     t.update(|v| v + 1);
///     Ok(())
/// })?;
/// let main = w.register_orchestration("main", move |o, _| {
///     let mut a = TaskArgs::new();
///     a.push_tensor(x.arg(ArgTag::InOut))?;
///     o.submit_sub(&inc, &a)?;
///     Ok(())
/// })?;
/// w.init()?;
/// w.run(main, &TaskArgs::new())?;
/// w.close()?;
/// # Ok::<(), strata::Error>(())
/// ```
pub struct Worker {
    inner: Inner,
    runs: u64,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("level", &self.level())
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A level-2 worker: one chip in this process.
    ///
    /// # Errors
    /// An invalid configuration.
    pub fn chip(config: ChipConfig) -> Result<Worker, Error> {
        Ok(Worker {
            inner: Inner::Chip {
                chip: Box::new(ChipWorker::new(config)?),
                shared: SharedMemory::process().clone(),
                minter: IdentityMinter::new(),
            },
            runs: 0,
        })
    }

    /// A level-3 worker with these chips (worker ids `0..chips.len()`) and
    /// `sub_workers` host sub-workers, with the engine's default settings.
    ///
    /// # Errors
    /// An invalid configuration.
    pub fn l3(chips: Vec<ChipConfig>, sub_workers: usize) -> Result<Worker, Error> {
        Worker::with_config(DistConfig::l3(chips, sub_workers))
    }

    /// A level-4 worker with `sub_workers` host sub-workers; add its level-3 children with
    /// [`Worker::add_worker`].
    ///
    /// # Errors
    /// An invalid configuration.
    pub fn l4(sub_workers: usize) -> Result<Worker, Error> {
        Worker::with_config(DistConfig::l4(sub_workers))
    }

    /// A level-3 or level-4 worker with every engine setting given (the level is the
    /// configuration's: `DistConfig::l3` or `DistConfig::l4`).
    ///
    /// # Errors
    /// An invalid configuration.
    pub fn with_config(config: DistConfig) -> Result<Worker, Error> {
        Ok(Worker {
            inner: Inner::Dist(Box::new(DistWorker::new(config)?)),
            runs: 0,
        })
    }

    /// The level (2, 3 or 4).
    pub fn level(&self) -> u8 {
        match &self.inner {
            Inner::Chip { .. } => 2,
            Inner::Dist(d) => d.level().number(),
        }
    }

    fn dist(&mut self, op: &'static str) -> Result<&mut DistWorker, Error> {
        match &mut self.inner {
            Inner::Dist(d) => Ok(d),
            Inner::Chip { .. } => Err(Error::InvalidArgument(format!(
                "{op} is not available on a level-2 worker (a chip): it is a level-3/4 operation"
            ))),
        }
    }

    /// Registers a kernel (for this chip, or for the chip children of a level-3 worker;
    /// on a level-4 worker, for its level-3 children's chips).
    ///
    /// # Errors
    /// A registration error.
    pub fn register_kernel<F>(&mut self, name: &str, f: F) -> Result<KernelHandle, Error>
    where
        F: Fn(&mut strata_chip::KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static,
    {
        match &mut self.inner {
            Inner::Chip { chip, .. } => Ok(chip.register_kernel_fn(name, f)?),
            Inner::Dist(d) => Ok(d.register_kernel(name, f)?),
        }
    }

    /// Registers a chip orchestration (for this chip, or for chip children).
    ///
    /// # Errors
    /// A registration error.
    pub fn register_chip_orchestration<F>(&mut self, name: &str, f: F) -> Result<OrchHandle, Error>
    where
        F: Fn(&mut strata_chip::ChipOrch, &strata_chip::ChipArgs) -> CallbackResult
            + Send
            + Sync
            + 'static,
    {
        match &mut self.inner {
            Inner::Chip { chip, .. } => Ok(chip.register_orchestration_fn(name, f)?),
            Inner::Dist(d) => Ok(d.register_chip_orchestration(name, f)?),
        }
    }

    /// Registers a host orchestration (level 3 and up).
    ///
    /// # Errors
    /// On a level-2 worker.
    pub fn register_orchestration<F>(&mut self, name: &str, f: F) -> Result<HostOrchHandle, Error>
    where
        F: Fn(&mut Orch<'_>, &TaskArgs) -> CallbackResult + Send + Sync + 'static,
    {
        Ok(self
            .dist("register_orchestration")?
            .register_orchestration(name, f))
    }

    /// Registers a sub-worker callable (level 3 and up).
    ///
    /// # Errors
    /// On a level-2 worker.
    pub fn register_sub<F>(&mut self, name: &str, f: F) -> Result<SubHandle, Error>
    where
        F: Fn(&mut strata_host::SubCall<'_>) -> CallbackResult + Send + Sync + 'static,
    {
        Ok(self.dist("register_sub")?.register_sub(name, f))
    }

    /// Adds a level-3 worker as a child of this level-4 worker (before init); returns its
    /// worker id.
    ///
    /// # Errors
    /// Not a level-4 worker, or a child that is not a new level-3 worker.
    pub fn add_worker(&mut self, child: Worker) -> Result<usize, Error> {
        let Inner::Dist(c) = child.inner else {
            return Err(Error::InvalidArgument(
                "add_worker: the child must be a level-3 worker, not a chip".into(),
            ));
        };
        Ok(self.dist("add_worker")?.add_worker(*c)?)
    }

    /// A zeroed shared tensor every child (and this process) can see, zero-copy. Create
    /// shared tensors before `init`.
    ///
    /// # Errors
    /// A bad shape.
    pub fn shared_tensor(&self, shape: &[u64], dtype: DataType) -> Result<SharedTensor, Error> {
        match &self.inner {
            Inner::Chip { shared, minter, .. } => {
                Ok(SharedTensor::new(shared, minter, shape, dtype)?)
            }
            Inner::Dist(d) => Ok(d.shared_tensor(shape, dtype)?),
        }
    }

    /// A shared tensor initialised from `data`.
    ///
    /// # Errors
    /// A bad shape or a length mismatch.
    pub fn shared_tensor_from<T: Element>(
        &self,
        shape: &[u64],
        data: &[T],
    ) -> Result<SharedTensor, Error> {
        match &self.inner {
            Inner::Chip { shared, minter, .. } => {
                Ok(SharedTensor::from_slice(shared, minter, shape, data)?)
            }
            Inner::Dist(d) => Ok(d.shared_tensor_from(shape, data)?),
        }
    }

    /// Starts the worker (a chip's threads; a host's child processes, then its scheduler).
    ///
    /// # Errors
    /// A child that fails to start, a fork refused beside other threads, ...
    pub fn init(&mut self) -> Result<(), Error> {
        match &mut self.inner {
            Inner::Chip { chip, .. } => Ok(chip.init()?),
            Inner::Dist(d) => Ok(d.init()?),
        }
    }

    /// Starts a run and returns its handle. On a chip the run executes before this returns
    /// (the handle is complete); on level 3 and up the orchestration builds the run on this
    /// thread and the handle completes when its tasks have.
    ///
    /// # Errors
    /// A callable of the wrong kind for the level, and the level's submit errors.
    pub fn submit(
        &mut self,
        callable: impl Into<Callable>,
        args: &TaskArgs,
    ) -> Result<DispatchHandle, Error> {
        self.submit_with(callable, args, &CallConfig::default())
    }

    /// [`Worker::submit`] with a call configuration.
    ///
    /// # Errors
    /// As `submit`.
    pub fn submit_with(
        &mut self,
        callable: impl Into<Callable>,
        args: &TaskArgs,
        config: &CallConfig,
    ) -> Result<DispatchHandle, Error> {
        self.runs += 1;
        let id = self.runs;
        let state = match (&mut self.inner, callable.into()) {
            (Inner::Chip { chip, shared, .. }, Callable::Chip(h)) => {
                let outcome = run_on_chip(chip, shared, &h, args, config);
                DispatchState::finished(id, "chip run".into(), outcome, Vec::new())
            }
            (Inner::Dist(d), Callable::Host(h)) => {
                let run = d.submit_with(&h, args, config)?;
                DispatchState::running(id, "run".into(), run, Vec::new())
            }
            (Inner::Chip { .. }, Callable::Host(_)) => {
                return Err(Error::InvalidArgument(
                    "a level-2 worker (a chip) runs chip orchestrations, not host orchestrations"
                        .into(),
                ))
            }
            (Inner::Dist(_), Callable::Chip(_)) => return Err(Error::InvalidArgument(
                "a level-3/4 worker runs host orchestrations; submit chip orchestrations to its chips from inside one (Orch::submit_next_level)".into(),
            )),
        };
        Ok(DispatchHandle::new(Arc::new(state)))
    }

    /// [`Worker::submit`] and wait.
    ///
    /// # Errors
    /// As `submit`, and the run's first error.
    pub fn run(&mut self, callable: impl Into<Callable>, args: &TaskArgs) -> Result<(), Error> {
        match (&mut self.inner, callable.into()) {
            // The engine's own `run` waits at once, so its caller drives the scheduler loop
            // and the run's first hand-over wakes nobody.
            (Inner::Dist(d), Callable::Host(h)) => Ok(d.run(&h, args)?),
            (_, callable) => self.submit(callable, args)?.result(None),
        }
    }

    /// Allocates a tensor in the device memory of chip `worker` of a level-3 worker (a
    /// level-2 worker's device memory is managed through [`Worker::chip_worker`]).
    ///
    /// # Errors
    /// A worker id that is not a chip, an allocation failure, a run in flight.
    pub fn alloc_child_tensor(
        &mut self,
        worker: usize,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<DeviceTensor, Error> {
        Ok(self
            .dist("alloc_child_tensor")?
            .alloc_child_tensor(worker, shape, dtype)?)
    }

    /// Frees a chip tensor.
    ///
    /// # Errors
    /// A double free, a run in flight.
    pub fn free(&mut self, t: DeviceTensor) -> Result<(), Error> {
        Ok(self.dist("free")?.free(t)?)
    }

    /// Copies a shared tensor into a chip tensor.
    ///
    /// # Errors
    /// Size mismatch, a freed tensor, a run in flight.
    pub fn copy_to(&mut self, dst: &DeviceTensor, src: &SharedTensor) -> Result<(), Error> {
        Ok(self.dist("copy_to")?.copy_to(dst, src)?)
    }

    /// Copies a chip tensor into a shared tensor.
    ///
    /// # Errors
    /// As [`Worker::copy_to`].
    pub fn copy_from(&mut self, dst: &SharedTensor, src: &DeviceTensor) -> Result<(), Error> {
        Ok(self.dist("copy_from")?.copy_from(dst, src)?)
    }

    /// Bytes the device allocator of chip `worker` holds (on a chip: its own).
    ///
    /// # Errors
    /// A worker that is not a chip, a run in flight.
    pub fn committed_device_memory(&mut self, worker: usize) -> Result<u64, Error> {
        match &mut self.inner {
            Inner::Chip { chip, .. } => Ok(chip.committed_device_memory()?),
            Inner::Dist(d) => Ok(d.committed_device_memory(worker)?),
        }
    }

    /// `(free, total)` bytes of chip `worker`'s emulated card (on a chip: its own).
    ///
    /// # Errors
    /// A worker that is not a chip, a run in flight.
    pub fn device_memory_info(&mut self, worker: usize) -> Result<(u64, u64), Error> {
        match &mut self.inner {
            Inner::Chip { chip, .. } => Ok(chip.device_memory_info()?),
            Inner::Dist(d) => Ok(d.device_memory_info(worker)?),
        }
    }

    /// The chip of a level-2 worker (its full API: device memory, swimlanes, ...).
    pub fn chip_worker(&mut self) -> Option<&mut ChipWorker> {
        match &mut self.inner {
            Inner::Chip { chip, .. } => Some(chip),
            Inner::Dist(_) => None,
        }
    }

    /// The engine of a level-3/4 worker.
    pub fn dist_worker(&mut self) -> Option<&mut DistWorker> {
        match &mut self.inner {
            Inner::Dist(d) => Some(d),
            Inner::Chip { .. } => None,
        }
    }

    /// Shuts the worker down (idempotent; also on drop).
    ///
    /// # Errors
    /// Children that ended abnormally, a chip that failed to stop.
    pub fn close(&mut self) -> Result<(), Error> {
        match &mut self.inner {
            Inner::Chip { chip, .. } => Ok(chip.close()?),
            Inner::Dist(d) => Ok(d.close()?),
        }
    }
}

/// Runs a chip orchestration on a level-2 worker with `TaskArgs` whose tensors live in
/// shared memory (this process's) or in the chip's device memory.
fn run_on_chip(
    chip: &mut ChipWorker,
    shared: &Arc<SharedMemory>,
    h: &OrchHandle,
    args: &TaskArgs,
    config: &CallConfig,
) -> Result<(), Error> {
    // SAFETY: `ptr` checks each view's span against a region mapped in this process, and
    // the run is synchronous: the caller holds the worker mutably, so nothing else runs
    // against these bytes until `run` returns.
    let converted = unsafe {
        RunArgs::from_task_args(args, chip, None, |region, offset, len| {
            shared.ptr(region, offset, len).map_err(|e| e.to_string())
        })
    };
    let mut run = converted.map_err(|e| match e {
        TaskArgsError::Shared { index, message } => {
            Error::InvalidArgument(format!("tensor argument {index}: {message}"))
        }
        TaskArgsError::Device { source, .. } => source.into(),
        TaskArgsError::HostLocal { index } => Error::InvalidArgument(format!(
            "tensor argument {index}: use a SharedTensor (Worker::shared_tensor) for host data"
        )),
        other => Error::InvalidArgument(other.to_string()),
    })?;
    chip.run(h, &mut run, config)?;
    Ok(())
}
