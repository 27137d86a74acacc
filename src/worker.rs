//! The `Worker` facade: one type for every level — a chip (L2), a host with chips and
//! sub-workers (L3), a host whose children are level-3 workers (L4) — with the same
//! register / init / submit / run / close lifecycle.

use std::sync::Arc;
use strata_chip::{ChipConfig, ChipWorker, KernelHandle, OrchHandle, RunArgs, TaskArgsError};
use strata_dist::{
    ChildTensor, DistConfig, DistError, DistWorker, HostOrchHandle, Orch, SubHandle,
};
use strata_host::{SharedMemory, SharedTensor};
use strata_types::{CallConfig, CallbackResult, DataType, Element, IdentityMinter, TaskArgs};
use thiserror::Error;

/// Errors of the facade.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// An error of a level-3/4 worker.
    #[error(transparent)]
    Dist(#[from] DistError),
    /// An error of a chip (level-2 worker).
    #[error(transparent)]
    Chip(#[from] strata_chip::ChipError),
    /// An error of shared memory.
    #[error(transparent)]
    Host(#[from] strata_host::HostError),
    /// Bad task arguments (too many, a view outside its buffer, ...).
    #[error(transparent)]
    Types(#[from] strata_types::TypesError),
    /// An operation this level does not have (and which level does).
    #[error("{op} is not available on a level-{level} worker: {hint}")]
    Level {
        /// The operation.
        op: &'static str,
        /// The worker's level.
        level: u8,
        /// Where it is available.
        hint: &'static str,
    },
    /// Bad arguments.
    #[error("{0}")]
    InvalidArgs(String),
}

/// Configuration of a [`Worker`] of any level.
#[derive(Debug, Clone)]
pub enum WorkerConfig {
    /// A chip.
    Chip(ChipConfig),
    /// A level-3 or level-4 worker.
    Dist(DistConfig),
}

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
/// use strata::{Worker, WorkerConfig};
/// use strata::dist::DistConfig;
/// use strata::types::{ArgTag, TaskArgs};
///
/// let mut w = Worker::new(3, WorkerConfig::Dist(DistConfig::l3(vec![], 1)))?;
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
    level: u8,
    inner: Inner,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("level", &self.level)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker of `level` (2, 3 or 4) with a matching configuration.
    ///
    /// # Errors
    /// A level that does not match the configuration, or an invalid configuration.
    pub fn new(level: u8, config: WorkerConfig) -> Result<Self, Error> {
        let inner = match (level, config) {
            (2, WorkerConfig::Chip(c)) => Inner::Chip {
                chip: Box::new(ChipWorker::new(c)?),
                shared: SharedMemory::process().clone(),
                minter: IdentityMinter::new(),
            },
            (3 | 4, WorkerConfig::Dist(c)) => {
                if c.level.number() != level {
                    return Err(Error::InvalidArgs(format!(
                        "Worker::new({level}, ..) was given a level-{} configuration",
                        c.level.number()
                    )));
                }
                Inner::Dist(Box::new(DistWorker::new(c)?))
            }
            (2, _) => {
                return Err(Error::InvalidArgs(
                    "a level-2 worker is a chip: pass WorkerConfig::Chip".into(),
                ))
            }
            (3 | 4, _) => {
                return Err(Error::InvalidArgs(format!(
                    "a level-{level} worker needs WorkerConfig::Dist"
                )))
            }
            (l, _) => {
                return Err(Error::InvalidArgs(format!(
                    "level {l} does not exist: use 2 (chip), 3 (host) or 4 (hosts of hosts)"
                )))
            }
        };
        Ok(Worker { level, inner })
    }

    /// The level (2, 3 or 4).
    pub fn level(&self) -> u8 {
        self.level
    }

    fn dist(&mut self, op: &'static str) -> Result<&mut DistWorker, Error> {
        match &mut self.inner {
            Inner::Dist(d) => Ok(d),
            Inner::Chip { .. } => Err(Error::Level {
                op,
                level: 2,
                hint: "it is a level-3/4 operation",
            }),
        }
    }

    /// Registers a kernel (for this chip, or for the chip children of a level-3 worker).
    ///
    /// # Errors
    /// A registration error. (On a level-4 worker, registrations cascade to its level-3
    /// children.)
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

    /// Adds a level-3 worker as a child of this level-4 worker (before init).
    ///
    /// # Errors
    /// Not a level-4 worker, or a child that is not a new level-3 worker.
    pub fn add_worker(&mut self, child: Worker) -> Result<usize, Error> {
        let Inner::Dist(c) = child.into_inner() else {
            return Err(Error::InvalidArgs(
                "add_worker: the child must be a level-3 worker, not a chip".into(),
            ));
        };
        Ok(self.dist("add_worker")?.add_worker(*c)?)
    }

    fn into_inner(self) -> Inner {
        // `Worker` has no Drop of its own; moving the field out is fine.
        self.inner
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
    /// See `ChipWorker::init` and `DistWorker::init`.
    pub fn init(&mut self) -> Result<(), Error> {
        match &mut self.inner {
            Inner::Chip { chip, .. } => Ok(chip.init()?),
            Inner::Dist(d) => Ok(d.init()?),
        }
    }

    /// Starts a run and returns its handle. On a chip the run executes synchronously (the
    /// handle is already complete); on level 3 and up the orchestration builds the run on
    /// this thread and the handle completes when its tasks have.
    ///
    /// # Errors
    /// A callable of the wrong kind for the level, and the level's submit errors.
    pub fn submit(
        &mut self,
        callable: impl Into<Callable>,
        args: &TaskArgs,
    ) -> Result<PendingRun, Error> {
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
    ) -> Result<PendingRun, Error> {
        match (&mut self.inner, callable.into()) {
            (Inner::Chip { chip, shared, .. }, Callable::Chip(h)) => {
                let result = run_on_chip(chip, shared, &h, args, config);
                Ok(PendingRun(HandleInner::Done(result)))
            }
            (Inner::Dist(d), Callable::Host(h)) => {
                Ok(PendingRun(HandleInner::Dist(d.submit_with(&h, args, config)?)))
            }
            (Inner::Chip { .. }, Callable::Host(_)) => Err(Error::InvalidArgs(
                "a level-2 worker (a chip) runs chip orchestrations, not host orchestrations".into(),
            )),
            (Inner::Dist(_), Callable::Chip(_)) => Err(Error::InvalidArgs(
                "a level-3/4 worker runs host orchestrations; submit chip orchestrations to its chips from inside one (Orch::submit_next_level)".into(),
            )),
        }
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
            (_, callable) => self.submit(callable, args)?.wait(None),
        }
    }

    /// Allocates a tensor in the device memory of chip `worker` of a level-3 worker (a
    /// level-2 worker's device memory is managed through [`Worker::chip`]).
    ///
    /// # Errors
    /// A worker id that is not a chip, an allocation failure, a run in flight.
    pub fn alloc_child_tensor(
        &mut self,
        worker: usize,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<ChildTensor, Error> {
        Ok(self
            .dist("alloc_child_tensor")?
            .alloc_child_tensor(worker, shape, dtype)?)
    }

    /// Frees a chip tensor.
    ///
    /// # Errors
    /// A double free, a run in flight.
    pub fn free(&mut self, t: ChildTensor) -> Result<(), Error> {
        Ok(self.dist("free")?.free(t)?)
    }

    /// Copies a shared tensor into a chip tensor.
    ///
    /// # Errors
    /// Size mismatch, a freed tensor, a run in flight.
    pub fn copy_to(&mut self, dst: &ChildTensor, src: &SharedTensor) -> Result<(), Error> {
        Ok(self.dist("copy_to")?.copy_to(dst, src)?)
    }

    /// Copies a chip tensor into a shared tensor.
    ///
    /// # Errors
    /// As [`Worker::copy_to`].
    pub fn copy_from(&mut self, dst: &SharedTensor, src: &ChildTensor) -> Result<(), Error> {
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

    /// The chip of a level-2 worker (its full API: device memory, swimlanes, ...).
    pub fn chip(&mut self) -> Option<&mut ChipWorker> {
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
    /// See `ChipWorker::close` and `DistWorker::close`.
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
            Error::InvalidArgs(format!("tensor argument {index}: {message}"))
        }
        TaskArgsError::Device { source, .. } => source.into(),
        TaskArgsError::HostLocal { index } => Error::InvalidArgs(format!(
            "tensor argument {index}: use a SharedTensor (Worker::shared_tensor) for host data"
        )),
        TaskArgsError::Invalid(e) => Error::Types(e),
        other => Error::InvalidArgs(other.to_string()),
    })?;
    chip.run(h, &mut run, config)?;
    Ok(())
}

/// The same error again, for a second wait on a finished level-2 run (whose errors are
/// only ever chip, argument and type errors).
fn replay(e: &Error) -> Error {
    match e {
        Error::Chip(c) => Error::Chip(c.clone()),
        Error::Types(t) => Error::Types(t.clone()),
        other => Error::InvalidArgs(other.to_string()),
    }
}

enum HandleInner {
    Done(Result<(), Error>),
    Dist(strata_dist::RunHandle),
}

/// A run of any level (see [`Worker::submit`]).
pub struct PendingRun(HandleInner);

impl std::fmt::Debug for PendingRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingRun")
    }
}

impl PendingRun {
    /// Whether the run finished.
    pub fn is_done(&self) -> bool {
        match &self.0 {
            HandleInner::Done(_) => true,
            HandleInner::Dist(h) => h.is_done(),
        }
    }

    /// Waits for the run (at most `timeout`, or forever).
    ///
    /// # Errors
    /// The run's first error; a timeout (the run goes on; wait again).
    pub fn wait(&mut self, timeout: Option<std::time::Duration>) -> Result<(), Error> {
        match &mut self.0 {
            HandleInner::Done(r) => r.as_ref().map(|_| ()).map_err(replay),
            HandleInner::Dist(h) => Ok(h.wait(timeout)?),
        }
    }

    /// Waits for the run without a timeout.
    ///
    /// # Errors
    /// The run's first error.
    pub fn result(mut self) -> Result<(), Error> {
        self.wait(None)
    }
}
