//! Prepared workers: a worker tree forked once for one or more compiled programs, then
//! dispatched to many times — blocking (`call`, `run`) or asynchronously with at most two
//! dispatches in flight (`submit`) — with device memory that stays resident between
//! dispatches (`alloc_tensor`, `alloc_stacked_tensor`, explicit copies).

use crate::error::Error;
use crate::handle::{DispatchHandle, DispatchState};
use crate::program::args::{encode, Arg, HeldArg, IntoArgs, ProgramArgs};
use crate::program::signature::BoundParam;
use crate::program::{Compiled, Entry, TargetKind};
use crate::tensors::StackedDeviceTensor;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use strata_chip::{ChipWorker, CopyOffsets, DeviceTensor, OrchHandle, Registry, RunArgs};
use strata_dist::{DistWorker, HostOrchHandle, WindowLifetime};
use strata_host::SharedMemory;
use strata_types::CallbackResult;
use strata_types::{BufferIdentity, BufferLocation, CallConfig, DataType, Element, TensorView};

/// How a worker is prepared: more programs, window lifetime, callbacks, startup bound,
/// host memory to use in place.
///
/// ```
/// use strata::Prepare;
/// use std::time::Duration;
/// let options = Prepare::new()
///     .persistent_windows(true)
///     .startup_timeout(Duration::from_secs(30))
///     .callback("inspect", |_call| Ok(()));
/// # let _ = options;
/// ```
#[derive(Default)]
pub struct Prepare {
    extra: Vec<Compiled>,
    windows: Option<WindowLifetime>,
    callbacks: Vec<(String, strata_host::SubFn)>,
    startup_timeout: Option<Duration>,
    inherited: Vec<Inherited>,
    prewarm: Option<CallConfig>,
}

impl std::fmt::Debug for Prepare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepare")
            .field("extra", &self.extra)
            .field("windows", &self.windows)
            .field(
                "callbacks",
                &self.callbacks.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("startup_timeout", &self.startup_timeout)
            .field("inherited", &self.inherited.len())
            .field("prewarm", &self.prewarm)
            .finish()
    }
}

/// Host memory handed to a prepared worker to be copied from (and, if writable, into) in
/// place: children forked afterwards inherit the mapping at the same address.
struct Inherited {
    ptr: usize,
    len: usize,
    read_only: bool,
    /// Keeps a safe caller's mapping alive while the worker may use it.
    _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Prepare {
    /// Default options: the one program, windows per dispatch, no callbacks, the default
    /// startup bound.
    pub fn new() -> Prepare {
        Prepare::default()
    }

    /// Prepares `program` on the same worker too (multi-program mode: dispatch with
    /// [`PreparedWorker::run`] / [`PreparedWorker::submit`] naming the program). Every
    /// program must be compiled for the same target.
    pub fn program(mut self, program: &Compiled) -> Prepare {
        self.extra.push(program.clone());
        self
    }

    /// Keeps window buffers across dispatches (the `k`-th window buffer a dispatch
    /// allocates is the `k`-th of the first dispatch), zero-filling them before every
    /// dispatch after the first if `zero_between_dispatches`.
    pub fn persistent_windows(mut self, zero_between_dispatches: bool) -> Prepare {
        self.windows = Some(WindowLifetime::Persistent {
            zero_between_runs: zero_between_dispatches,
        });
        self
    }

    /// Binds callback `name` (declared by a program with
    /// [`Program::callback`](crate::Program::callback)) to `f`, run by a sub-worker.
    pub fn callback<F>(mut self, name: &str, f: F) -> Prepare
    where
        F: Fn(&mut strata_host::SubCall<'_>) -> CallbackResult + Send + Sync + 'static,
    {
        self.callbacks.push((name.to_owned(), Arc::new(f)));
        self
    }

    /// Builds every chip's run arenas for `config`'s ring sizing while the worker starts,
    /// so the first dispatch with that sizing does not (`ChipWorker::prewarm`).
    pub fn prewarm(mut self, config: &CallConfig) -> Prepare {
        self.prewarm = Some(config.clone());
        self
    }

    /// Bounds the worker tree's startup (default 120 s).
    pub fn startup_timeout(mut self, d: Duration) -> Prepare {
        self.startup_timeout = Some(d);
        self
    }

    /// Hands a read-only shared file mapping to the worker: explicit uploads
    /// ([`PreparedWorker::copy_to`], [`PreparedWorker::alloc_tensor_from`]) whose host
    /// bytes lie in it are read in place by the chips, with no staging copy.
    pub fn inherit_read_only(mut self, map: Arc<memmap2::Mmap>) -> Prepare {
        self.inherited.push(Inherited {
            ptr: map.as_ptr() as usize,
            len: map.len(),
            read_only: true,
            _keep: Some(map),
        });
        self
    }

    /// Hands `len` bytes at `ptr` — memory mapped `MAP_SHARED` (a shared file mapping,
    /// shared anonymous memory) — to the worker: uploads from it, and (unless
    /// `read_only`) downloads into it, happen in place. Views of one mapping collapse into
    /// one buffer; listing one range both read-only and writable is an error.
    ///
    /// # Safety
    /// The range must stay mapped until the prepared worker is closed (or dropped).
    pub unsafe fn inherit_raw(mut self, ptr: *mut u8, len: usize, read_only: bool) -> Prepare {
        self.inherited.push(Inherited {
            ptr: ptr as usize,
            len,
            read_only,
            _keep: None,
        });
        self
    }
}

/// One program as a prepared worker dispatches it.
struct PreparedProgram {
    compiled: Compiled,
    start: Start,
}

#[derive(Clone, Copy)]
enum Start {
    Host(HostOrchHandle),
    Chip(OrchHandle),
}

enum Backend {
    Chip(Box<ChipWorker>),
    Dist(Box<DistWorker>),
}

/// A level-3 child of a level-4 worker, whose chips hold resident tensors.
enum ChildChips {
    /// A child in this process tree: its worker id and chip count.
    Local { id: usize, chips: usize },
    /// A remote child: its device memory goes through its session.
    Remote(strata_net::RemoteWorker),
}

impl ChildChips {
    fn chips(&self) -> usize {
        match self {
            ChildChips::Local { chips, .. } => *chips,
            ChildChips::Remote(r) => r.chips(),
        }
    }
}

struct Core {
    backend: Backend,
    /// A level-4 worker's level-3 children, in worker-id order (empty below level 4).
    children: Vec<ChildChips>,
    /// Tensors on remote children's chips, by identity (their sessions' handles).
    remote_tensors: HashMap<BufferIdentity, strata_net::RemoteTensor>,
    programs: Vec<PreparedProgram>,
    /// Dispatches not yet finished, oldest first.
    inflight: VecDeque<Arc<DispatchState>>,
    /// Device tensors this worker allocated and not freed, by identity.
    owned: HashMap<BufferIdentity, DeviceTensor>,
    /// Shared-memory regions with ids up to this one existed when the children started.
    visible_regions: u64,
    /// Regions adopted from inherited host memory (released at close).
    adopted: Vec<u64>,
    _inherited: Vec<Inherited>,
    registrations: HashMap<u64, Arc<AtomicBool>>,
    next_dispatch: u64,
    closed: bool,
    close_error: Option<Error>,
}

struct Shared {
    id: u64,
    core: Mutex<Core>,
}

/// A worker tree prepared once for one or more compiled programs, dispatched to many times
/// (the reference's `DistributedWorker`). Closed by [`PreparedWorker::close`] or on drop.
///
/// - Dispatch: [`call`](PreparedWorker::call) (single-program worker),
///   [`run`](PreparedWorker::run) and [`submit`](PreparedWorker::submit) (at most two
///   dispatches in flight: a third waits for the oldest), each checking the arguments
///   against the program's signature before anything is published.
/// - Device memory: resident tensors ([`alloc_tensor`](PreparedWorker::alloc_tensor)),
///   stacked tensors sharded over chips
///   ([`alloc_stacked_tensor`](PreparedWorker::alloc_stacked_tensor)), explicit copies
///   with offsets from and into ordinary host memory, and the cards' accounting.
///
/// Every method takes `&self` and is safe to call from several threads (calls are
/// serialised; waiting on a [`DispatchHandle`] is not).
pub struct PreparedWorker {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PreparedWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedWorker")
            .field("id", &self.shared.id)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<Core>) -> MutexGuard<'_, Core> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The bytes of a slice of plain elements.
fn bytes_of<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: `Element` types are plain data without padding or invalid bit patterns
    // (the trait's contract), so their memory is `len * size_of::<T>()` initialised bytes.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

fn bytes_of_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as `bytes_of`; every byte pattern is a valid `T`, so writing bytes is sound.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}

impl Shared {
    fn core(&self, op: &'static str) -> Result<MutexGuard<'_, Core>, Error> {
        let core = lock(&self.core);
        if core.closed {
            return Err(Error::Closed(op));
        }
        Ok(core)
    }

    fn submit_with(
        &self,
        program: &Compiled,
        args: Vec<Arg<'_>>,
        config: &CallConfig,
    ) -> Result<DispatchHandle, Error> {
        let mut core = self.core("submit")?;
        let index = core.find(program)?;
        let held = core.check_args(index, &args)?;
        config.validate()?;
        let config = &crate::trace_out::config(config);
        // Back-pressure: at most two in flight. The oldest one's error stays with its
        // handle; it does not fail this submit.
        core.prune();
        while core.inflight.len() >= 2 {
            if let Some(oldest) = core.inflight.pop_front() {
                let _ = oldest.finish(None);
            }
        }
        let id = core.next_dispatch;
        core.next_dispatch += 1;
        let p = &core.programs[index];
        let (start, name, sig) = (
            p.start,
            p.compiled.name().to_owned(),
            p.compiled.inner.bound.clone(),
        );
        let state = match (&mut core.backend, start) {
            (Backend::Dist(d), Start::Host(h)) => {
                let targs = encode(&sig, &held)?;
                let run = d.submit_with(&h, &targs, config)?;
                DispatchState::running(id, name, run, held)
            }
            (Backend::Chip(chip), Start::Chip(h)) => {
                let (outcome, trace) = match run_on_chip(chip, h, &sig, &held, config) {
                    Ok(report) => {
                        if crate::trace_out::enabled() {
                            let mut t = strata_types::trace::Trace::default();
                            let pid = report.process_trace("").pid;
                            report.add_to(t.process_mut("chip (level 2)", pid, ""));
                            crate::trace_out::record(t);
                        }
                        let names = [(hid_of(&h), name.clone())].into_iter().collect();
                        (
                            Ok(()),
                            crate::bench::Invocation::from_spans(&report.spans(), &names),
                        )
                    }
                    Err(e) => (Err(e), Vec::new()),
                };
                DispatchState::finished_traced(id, name, outcome, held, trace)
            }
            _ => {
                return Err(Error::Internal(
                    "program entry and worker level agree".into(),
                ))
            }
        };
        let state = Arc::new(state);
        core.inflight.push_back(state.clone());
        Ok(DispatchHandle::new(state))
    }
}

impl PreparedWorker {
    pub(crate) fn new(primary: &Compiled, options: Prepare) -> Result<PreparedWorker, Error> {
        let mut programs = vec![primary.clone()];
        for p in options.extra {
            if !programs.contains(&p) {
                programs.push(p);
            }
        }
        let mut target = primary.target().clone();
        if let Some(p) = &options.prewarm {
            p.validate()?;
            target = target.configure_chips(|c| c.prewarm = Some(p.clone()));
        }
        let mut names = std::collections::HashSet::new();
        for p in &programs {
            if !names.insert(p.name().to_owned()) {
                return Err(Error::Program(format!(
                    "two programs named {} cannot be prepared on one worker (their callables would share names); rename one",
                    p.name()
                )));
            }
            if !same_target(p.target(), primary.target()) {
                return Err(Error::Program(format!(
                    "multi-program mode requires every program compiled for the same target: {} is compiled for {:?}, {} for {:?}",
                    p.name(),
                    p.target(),
                    primary.name(),
                    target
                )));
            }
        }
        // Callbacks: every bound name is declared by some program, every declared one is
        // bound.
        let declared: Vec<(&str, &str)> = programs
            .iter()
            .flat_map(|p| {
                p.inner
                    .subs
                    .iter()
                    .filter(|(_, f)| f.is_none())
                    .map(move |(n, _)| (n.as_str(), p.name()))
            })
            .collect();
        let mut bound: HashMap<&str, &strata_host::SubFn> = HashMap::new();
        for (n, f) in &options.callbacks {
            if !declared.iter().any(|(d, _)| d == n) {
                return Err(Error::Program(format!(
                    "callback {n:?} is not a callback of any prepared program (declared: {})",
                    list(declared.iter().map(|(d, _)| *d))
                )));
            }
            if bound.insert(n, f).is_some() {
                return Err(Error::Program(format!("callback {n:?} is bound twice")));
            }
        }
        for (n, p) in &declared {
            if !bound.contains_key(n) {
                return Err(Error::Program(format!(
                    "program {p} calls callback {n:?}, which must be supplied when preparing: Prepare::new().callback({n:?}, |call| ...)"
                )));
            }
        }
        if options.startup_timeout.is_some_and(|d| d.is_zero()) {
            return Err(Error::Config("startup_timeout must be positive".into()));
        }
        let inherited = merge_inherited(options.inherited)?;

        let mem = SharedMemory::process();
        let mut adopted = Vec::new();
        let adopt = |adopted: &mut Vec<u64>| -> Result<(), Error> {
            for (i, h) in inherited.iter().enumerate() {
                // SAFETY: the caller of `inherit_raw` promised the range stays mapped until
                // the worker closes; `inherit_read_only` keeps its mapping alive in
                // `Core::_inherited`; the region is released at close.
                let r = unsafe {
                    mem.adopt_region(
                        h.ptr as *mut u8,
                        h.len,
                        &format!("inherited {i}"),
                        h.read_only,
                    )
                }?;
                adopted.push(r);
            }
            Ok(())
        };
        let release = |adopted: &[u64]| {
            for &r in adopted {
                let _ = mem.release_region(r);
            }
        };
        if let Err(e) = adopt(&mut adopted) {
            release(&adopted);
            return Err(e);
        }

        let mut prepared = Vec::with_capacity(programs.len());
        let mut child_chips = Vec::new();
        let started = (|| -> Result<(Backend, u64), Error> {
            match target.kind() {
                TargetKind::Chip(config) => {
                    let mut registry = Registry::new();
                    for p in &programs {
                        registry.absorb(&p.inner.chip)?;
                        let Entry::Chip(h) = &p.inner.entry else {
                            return Err(Error::Internal("a chip program has a chip entry".into()));
                        };
                        prepared.push(PreparedProgram {
                            compiled: p.clone(),
                            start: Start::Chip(*h),
                        });
                    }
                    let mut chip = ChipWorker::with_registry((**config).clone(), registry)?;
                    let visible = mem.regions() as u64;
                    chip.init()?;
                    Ok((Backend::Chip(Box::new(chip)), visible))
                }
                TargetKind::Dist { config, children } => {
                    let mut config = config.clone();
                    if let Some(w) = options.windows {
                        config.windows = w;
                    }
                    if let Some(d) = options.startup_timeout {
                        config.startup_timeout = d;
                    }
                    let subs_needed = programs
                        .iter()
                        .map(|p| p.inner.subs.len())
                        .max()
                        .unwrap_or(0);
                    config.num_sub_workers = config.num_sub_workers.max(subs_needed);
                    let mut w = DistWorker::new(config)?;
                    for c in children {
                        match c.kind() {
                            TargetKind::Dist { config, .. } => {
                                let id = w.add_worker(DistWorker::new(config.clone())?)?;
                                child_chips.push(ChildChips::Local {
                                    id,
                                    chips: config.chips.len(),
                                });
                            }
                            TargetKind::Remote(spec) => {
                                let r = strata_net::add_remote_worker(&mut w, (**spec).clone())
                                    .map_err(|e| Error::Config(e.to_string()))?;
                                child_chips.push(ChildChips::Remote(r));
                            }
                            TargetKind::Chip(_) => {
                                return Err(Error::Internal("level-4 children are level 3".into()))
                            }
                        }
                    }
                    for p in &programs {
                        w.register_chip_callables(&p.inner.chip)?;
                        for (n, f) in &p.inner.subs {
                            let f = match f {
                                Some(f) => f.clone(),
                                None => bound[n.as_str()].clone(),
                            };
                            w.register_sub_fn(n, f);
                        }
                        for (n, f) in &p.inner.nested {
                            w.register_orchestration_fn(n, f.clone());
                        }
                        let Entry::Host(user) = &p.inner.entry else {
                            return Err(Error::Internal("a host program has a host entry".into()));
                        };
                        let (user, sig) = (user.clone(), p.inner.bound.clone());
                        let h = w.register_orchestration(
                            &format!("program:{}", p.name()),
                            move |o, a| {
                                let args = ProgramArgs::decode(&sig, a)?;
                                user(o, &args)
                            },
                        );
                        prepared.push(PreparedProgram {
                            compiled: p.clone(),
                            start: Start::Host(h),
                        });
                    }
                    let visible = mem.regions() as u64;
                    w.init()?;
                    Ok((Backend::Dist(Box::new(w)), visible))
                }
                TargetKind::Remote(_) => Err(Error::Config(
                    "a remote level-3 worker is a child of a level-4 target: Target::l4(vec![Target::remote(spec), ..])".into(),
                )),
            }
        })();
        let (backend, visible_regions) = match started {
            Ok(b) => b,
            Err(e) => {
                release(&adopted);
                return Err(e);
            }
        };
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Ok(PreparedWorker {
            shared: Arc::new(Shared {
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                core: Mutex::new(Core {
                    backend,
                    children: child_chips,
                    remote_tensors: HashMap::new(),
                    programs: prepared,
                    inflight: VecDeque::new(),
                    owned: HashMap::new(),
                    visible_regions,
                    adopted,
                    _inherited: inherited,
                    registrations: HashMap::new(),
                    next_dispatch: 1,
                    closed: false,
                    close_error: None,
                }),
            }),
        })
    }

    fn core(&self, op: &'static str) -> Result<MutexGuard<'_, Core>, Error> {
        self.shared.core(op)
    }

    /// The level of the worker (2, 3 or 4).
    pub fn level(&self) -> u8 {
        match &lock(&self.shared.core).backend {
            Backend::Chip(_) => 2,
            Backend::Dist(d) => d.level().number(),
        }
    }

    /// The programs prepared on this worker.
    pub fn programs(&self) -> Vec<Compiled> {
        lock(&self.shared.core)
            .programs
            .iter()
            .map(|p| p.compiled.clone())
            .collect()
    }

    // ----- dispatch --------------------------------------------------------------------

    /// Dispatches the worker's one program with `args` (one per parameter, fixed scalars
    /// left out) and waits for it.
    ///
    /// # Errors
    /// A worker prepared with several programs ([`Error::Program`] naming them: use
    /// [`PreparedWorker::run`]); every error of [`PreparedWorker::submit`] and of the
    /// dispatch.
    pub fn call<'a>(&self, args: impl IntoArgs<'a>) -> Result<(), Error> {
        let program = {
            let core = self.core("call")?;
            if core.programs.len() != 1 {
                return Err(Error::Program(format!(
                    "call() is ambiguous on a worker prepared with programs {}: use run(&program, args)",
                    list(core.programs.iter().map(|p| p.compiled.name()))
                )));
            }
            core.programs[0].compiled.clone()
        };
        self.run(&program, args)
    }

    /// Dispatches `program` with `args` and waits for it.
    ///
    /// # Errors
    /// As [`PreparedWorker::submit`], and the dispatch's error.
    pub fn run<'a>(&self, program: &Compiled, args: impl IntoArgs<'a>) -> Result<(), Error> {
        self.submit(program, args)?.result(None)
    }

    /// [`PreparedWorker::run`] with a call configuration.
    ///
    /// # Errors
    /// As `run`, and an invalid `config`.
    pub fn run_with<'a>(
        &self,
        program: &Compiled,
        args: impl IntoArgs<'a>,
        config: &CallConfig,
    ) -> Result<(), Error> {
        self.submit_with(program, args, config)?.result(None)
    }

    /// Dispatches `program` with `args` and returns at once with a handle (level 3 and 4;
    /// on a chip the dispatch runs before it returns). At most two dispatches are in
    /// flight: a third waits until the oldest has finished (its outcome stays with its
    /// handle). The handle keeps the arguments alive until the dispatch is done.
    ///
    /// # Errors
    /// After close ([`Error::Closed`]); a program not prepared on this worker
    /// ([`Error::Program`]); arguments that do not match the signature — count, dtype,
    /// shape, a private host buffer, a shared tensor created after prepare, a device
    /// tensor this worker does not own or already freed ([`Error::Argument`]) — all
    /// checked before anything is published.
    pub fn submit<'a>(
        &self,
        program: &Compiled,
        args: impl IntoArgs<'a>,
    ) -> Result<DispatchHandle, Error> {
        self.submit_with(program, args, &CallConfig::default())
    }

    /// [`PreparedWorker::submit`] with a call configuration.
    ///
    /// # Errors
    /// As `submit`, and an invalid `config`.
    pub fn submit_with<'a>(
        &self,
        program: &Compiled,
        args: impl IntoArgs<'a>,
        config: &CallConfig,
    ) -> Result<DispatchHandle, Error> {
        self.shared.submit_with(program, args.into_args(), config)
    }

    /// Returns a handle that dispatches `program` directly. Registering the same program
    /// again returns the same handle (equal, sharing its state); [`Registration::unregister`]
    /// releases it early.
    ///
    /// # Errors
    /// After close; a program not prepared on this worker.
    pub fn register(&self, program: &Compiled) -> Result<Registration, Error> {
        let mut core = self.core("register")?;
        let index = core.find(program)?;
        let flag = core
            .registrations
            .entry(program.inner.id)
            .or_insert_with(|| Arc::new(AtomicBool::new(false)))
            .clone();
        Ok(Registration {
            shared: self.shared.clone(),
            worker: self.shared.id,
            program: core.programs[index].compiled.clone(),
            closed: flag,
        })
    }

    // ----- device memory ----------------------------------------------------------------

    /// Allocates a zero-filled tensor of `shape` × `dtype` on chip `worker` (0 on a
    /// level-2 worker), owned by this worker: it stays resident across dispatches until
    /// [`PreparedWorker::free_tensor`] or `close`. Waits for dispatches in flight first.
    ///
    /// On a level-4 worker, `worker` counts the chips of its level-3 children in child
    /// order — local or remote (`Target::remote`): with children of 2 and 3 chips, chips
    /// 0–1 are the first child's and 2–4 the second's. The tensor's
    /// [`DeviceTensor::worker`] is then the child holding it: the level-4 orchestration
    /// passes it to a task of that child, whose orchestration sees it as its own chip
    /// tensor (`TensorArg::device_worker` names the chip).
    ///
    /// # Errors
    /// After close; a worker id that is not a chip; a bad shape; out of device memory.
    pub fn alloc_tensor(
        &self,
        shape: &[u64],
        dtype: DataType,
        worker: usize,
    ) -> Result<DeviceTensor, Error> {
        let mut core = self.core("alloc_tensor")?;
        core.drain();
        core.alloc(shape, dtype, worker, None)
    }

    /// Allocates a tensor on chip `worker` holding `init` (row-major): ordinary host
    /// memory, created any time — it is staged through runtime-owned shared memory, or
    /// read in place if it lies in inherited host memory.
    ///
    /// # Errors
    /// As [`PreparedWorker::alloc_tensor`]; `init` not one element per position of
    /// `shape`. Nothing stays allocated on error.
    pub fn alloc_tensor_from<T: Element>(
        &self,
        shape: &[u64],
        init: &[T],
        worker: usize,
    ) -> Result<DeviceTensor, Error> {
        let view = TensorView::contiguous(T::DTYPE, shape)?;
        if view.numel() != init.len() as u64 {
            return Err(Error::InvalidArgument(format!(
                "alloc_tensor_from: shape {shape:?} has {} elements but init has {}",
                view.numel(),
                init.len()
            )));
        }
        let mut core = self.core("alloc_tensor")?;
        core.drain();
        core.alloc(shape, T::DTYPE, worker, Some(bytes_of(init)))
    }

    /// Frees a tensor allocated by [`PreparedWorker::alloc_tensor`].
    ///
    /// # Errors
    /// A tensor this worker does not own: freed already, allocated by another worker, or
    /// stale (its address has since been given to a newer allocation, which stays valid)
    /// ([`Error::Memory`]).
    pub fn free_tensor(&self, t: &DeviceTensor) -> Result<(), Error> {
        let mut core = self.core("free_tensor")?;
        core.drain();
        core.free(t)
    }

    /// Copies `range.nbytes` bytes of `src` (from byte `range.host_offset`) into `dst`
    /// (from byte `range.device_offset`). `src` is ordinary host memory (staged), or lies
    /// in inherited host memory (read in place). Waits for dispatches in flight first.
    ///
    /// # Errors
    /// `dst` not owned by this worker; a range that leaves `dst` or `src` (checked without
    /// overflow).
    pub fn copy_to<T: Element>(
        &self,
        dst: &DeviceTensor,
        src: &[T],
        range: CopyRange,
    ) -> Result<(), Error> {
        let bytes = host_range(bytes_of(src), range)?;
        let mut core = self.core("copy_to")?;
        core.drain();
        core.check_owned(dst, "copy_to")?;
        core.copy_in(dst, range.device_offset, bytes)
    }

    /// Copies `range.nbytes` bytes of `src` (from byte `range.device_offset`) into `dst`
    /// (from byte `range.host_offset`): ordinary host memory, or writable inherited host
    /// memory (written in place; read-only inherited memory is refused).
    ///
    /// # Errors
    /// As [`PreparedWorker::copy_to`].
    pub fn copy_from<T: Element>(
        &self,
        dst: &mut [T],
        src: &DeviceTensor,
        range: CopyRange,
    ) -> Result<(), Error> {
        let bytes = host_range_mut(bytes_of_mut(dst), range)?;
        let mut core = self.core("copy_from")?;
        core.drain();
        core.check_owned(src, "copy_from")?;
        core.copy_out(src, range.device_offset, bytes)
    }

    /// Uploads `host` (shape `shape`, rank ≥ 2) sharded along dimension 0: shard `i` to
    /// chip `worker_ids[i]` (default `i`). Every check — rank, shard count, ids distinct
    /// and in range — happens before any upload; if an upload fails, the shards already
    /// uploaded are freed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for the checks above; allocation and copy errors.
    pub fn alloc_stacked_tensor<T: Element>(
        &self,
        shape: &[u64],
        host: &[T],
        worker_ids: Option<&[usize]>,
    ) -> Result<StackedDeviceTensor, Error> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("alloc_stacked_tensor: {m}")));
        if shape.len() < 2 {
            return bad(format!(
                "the host tensor has rank {} ({shape:?}); a stacked tensor needs rank >= 2 (dimension 0 counts the shards)",
                shape.len()
            ));
        }
        let view = TensorView::contiguous(T::DTYPE, shape)?;
        if view.numel() != host.len() as u64 {
            return bad(format!(
                "shape {shape:?} has {} elements but the host data has {}",
                view.numel(),
                host.len()
            ));
        }
        let b = shape[0] as usize;
        if b == 0 {
            return bad("dimension 0 is 0: a stacked tensor has at least one shard".into());
        }
        let ids: Vec<usize> = match worker_ids {
            Some(ids) => ids.to_vec(),
            None => (0..b).collect(),
        };
        let mut core = self.core("alloc_stacked_tensor")?;
        let world = core.chips();
        if ids.len() != b {
            return bad(format!(
                "{} worker ids for {b} shards (dimension 0 of {shape:?}); give one id per shard",
                ids.len()
            ));
        }
        for (i, &w) in ids.iter().enumerate() {
            if ids[..i].contains(&w) {
                return bad(format!(
                    "worker id {w} appears twice; shards go to distinct chips"
                ));
            }
            if w >= world {
                return bad(format!(
                    "worker id {w} is out of range: this worker has {world} chips (ids 0..{world})"
                ));
            }
        }
        core.drain();
        let tail = &shape[1..];
        let shard_bytes = bytes_of(host).len() / b;
        let mut shards: Vec<DeviceTensor> = Vec::with_capacity(b);
        for (i, &w) in ids.iter().enumerate() {
            let part = &bytes_of(host)[i * shard_bytes..(i + 1) * shard_bytes];
            match core.alloc(tail, T::DTYPE, w, Some(part)) {
                Ok(t) => shards.push(t),
                Err(e) => {
                    for s in &shards {
                        let _ = core.free(s);
                    }
                    return Err(e);
                }
            }
        }
        Ok(StackedDeviceTensor {
            shards,
            full_shape: shape.to_vec(),
            dtype: T::DTYPE,
            placement: ids,
        })
    }

    /// Frees every shard of a stacked tensor against its own chip.
    ///
    /// # Errors
    /// A shard this worker does not own (freed already, or another worker's).
    pub fn free_stacked_tensor(&self, t: &StackedDeviceTensor) -> Result<(), Error> {
        let mut core = self.core("free_stacked_tensor")?;
        core.drain();
        for s in &t.shards {
            core.check_owned(s, "free_stacked_tensor")?;
        }
        for s in &t.shards {
            core.free(s)?;
        }
        Ok(())
    }

    /// Reads every shard of `t` back into `host` (shape `shape`, which must be `t`'s full
    /// shape, and element type `t`'s).
    ///
    /// # Errors
    /// A shape or type mismatch; a shard this worker does not own.
    pub fn copy_stacked_from<T: Element>(
        &self,
        host: &mut [T],
        shape: &[u64],
        t: &StackedDeviceTensor,
    ) -> Result<(), Error> {
        if shape != t.full_shape.as_slice() {
            return Err(Error::InvalidArgument(format!(
                "copy_stacked_from: the host tensor has shape {shape:?} but the stacked tensor {:?}",
                t.full_shape
            )));
        }
        if T::DTYPE != t.dtype {
            return Err(Error::InvalidArgument(format!(
                "copy_stacked_from: the host tensor holds {:?} but the stacked tensor {:?}",
                T::DTYPE,
                t.dtype
            )));
        }
        let numel = TensorView::contiguous(T::DTYPE, shape)?.numel();
        if numel != host.len() as u64 {
            return Err(Error::InvalidArgument(format!(
                "copy_stacked_from: shape {shape:?} has {numel} elements but the host buffer {}",
                host.len()
            )));
        }
        let b = t.shards.len();
        let per = host.len() / b;
        for (i, s) in t.shards.iter().enumerate() {
            let part = &mut host[i * per..(i + 1) * per];
            let n = std::mem::size_of_val(part) as u64;
            self.copy_from(part, s, CopyRange::new(n, 0, 0))?;
        }
        Ok(())
    }

    /// Bytes chip `worker`'s allocator holds (tensors, ring heaps, staging).
    ///
    /// # Errors
    /// After close; a worker id that is not a chip.
    pub fn committed_device_memory(&self, worker: usize) -> Result<u64, Error> {
        let mut guard = self.core("committed_device_memory")?;
        let core = &mut *guard;
        core.drain();
        if !core.children.is_empty() {
            let (slot, chip) = core.locate(worker)?;
            let Backend::Dist(d) = &mut core.backend else {
                return Err(Error::Internal("level-4 workers are dist workers".into()));
            };
            return match &core.children[slot] {
                ChildChips::Local { id, .. } => Ok(d.nested_committed_device_memory(*id, chip)?),
                ChildChips::Remote(r) => Ok(r.committed_device_memory(d, chip)?),
            };
        }
        match &mut core.backend {
            Backend::Dist(d) => Ok(d.committed_device_memory(worker)?),
            Backend::Chip(c) => {
                check_chip_worker(worker)?;
                Ok(c.committed_device_memory()?)
            }
        }
    }

    /// `(free, total)` bytes of chip `worker`'s emulated card: `total` its configured
    /// capacity (`ChipConfig::device_memory_bytes`), `free` what is left to allocate.
    /// Emulated figures, not the host's memory.
    ///
    /// # Errors
    /// After close; a worker id that is not a chip.
    pub fn device_memory_info(&self, worker: usize) -> Result<(u64, u64), Error> {
        let mut guard = self.core("device_memory_info")?;
        let core = &mut *guard;
        core.drain();
        if !core.children.is_empty() {
            let (slot, chip) = core.locate(worker)?;
            let Backend::Dist(d) = &mut core.backend else {
                return Err(Error::Internal("level-4 workers are dist workers".into()));
            };
            return match &core.children[slot] {
                ChildChips::Local { id, .. } => Ok(d.nested_device_memory_info(*id, chip)?),
                ChildChips::Remote(r) => Ok(r.device_memory_info(d, chip)?),
            };
        }
        match &mut core.backend {
            Backend::Dist(d) => Ok(d.device_memory_info(worker)?),
            Backend::Chip(c) => {
                check_chip_worker(worker)?;
                Ok(c.device_memory_info()?)
            }
        }
    }

    /// What the worker's window allocator did so far: domains created, window buffers
    /// allocated and freed, persistent zero-fills. `None` for a level-2 worker (it has no
    /// windows) or a level-3 worker whose windows were never set up.
    ///
    /// With [`Prepare::persistent_windows`], a program that allocates its window buffer in
    /// every dispatch allocates it once: the counters show it. Without it, a dispatch's
    /// window buffers are freed when the next dispatch claims the windows (its tasks may
    /// run until then), the last ones at close.
    ///
    /// # Errors
    /// After close.
    pub fn comm_stats(&self) -> Result<Option<strata_comm::CommStats>, Error> {
        let mut core = self.core("comm_stats")?;
        core.drain();
        Ok(match &core.backend {
            Backend::Dist(d) => d.comm_stats(),
            Backend::Chip(_) => None,
        })
    }

    // ----- close -------------------------------------------------------------------------

    /// Drains the dispatches in flight (oldest first), frees the device tensors this
    /// worker still owns, closes every registration and shuts the worker tree down.
    /// Idempotent; later dispatches and memory calls fail with [`Error::Closed`].
    ///
    /// # Errors
    /// The first error of a drained dispatch whose handle never reported it, else the
    /// worker tree's close error.
    pub fn close(&self) -> Result<(), Error> {
        let mut core = lock(&self.shared.core);
        if core.closed {
            return core.close_error.take().map_or(Ok(()), Err);
        }
        core.closed = true;
        let mut first: Option<Error> = None;
        while let Some(d) = core.inflight.pop_front() {
            if let Err(e) = d.finish(None) {
                if !d.observed() {
                    first.get_or_insert(e);
                }
            }
        }
        let owned: Vec<DeviceTensor> = core.owned.values().copied().collect();
        for t in owned {
            let _ = core.free(&t);
        }
        for flag in core.registrations.values() {
            flag.store(true, Ordering::Release);
        }
        let closed = match &mut core.backend {
            Backend::Dist(d) => d.close().map_err(Error::from),
            Backend::Chip(c) => c.close().map_err(Error::from),
        };
        if let Err(e) = closed {
            first.get_or_insert(e);
        }
        let mem = SharedMemory::process();
        for r in core.adopted.drain(..) {
            let _ = mem.release_region(r);
        }
        crate::trace_out::flush();
        first.map_or(Ok(()), Err)
    }
}

impl Drop for PreparedWorker {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// The remote child that holds `t`.
fn remote_of<'c>(
    children: &'c [ChildChips],
    t: &strata_net::RemoteTensor,
) -> Result<&'c strata_net::RemoteWorker, Error> {
    children
        .iter()
        .find_map(|c| match c {
            ChildChips::Remote(r) if r.id() == t.worker() => Some(r),
            _ => None,
        })
        .ok_or_else(|| Error::Internal("a remote tensor's worker is a remote child".into()))
}

fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.collect::<Vec<_>>().join(", ")
}

fn check_chip_worker(worker: usize) -> Result<(), Error> {
    if worker != 0 {
        return Err(Error::InvalidArgument(format!(
            "worker id {worker} on a level-2 worker: a chip is worker 0"
        )));
    }
    Ok(())
}

fn same_target(a: &crate::Target, b: &crate::Target) -> bool {
    match (a.kind(), b.kind()) {
        (TargetKind::Chip(x), TargetKind::Chip(y)) => x == y,
        (
            TargetKind::Dist {
                config: x,
                children: cx,
            },
            TargetKind::Dist {
                config: y,
                children: cy,
            },
        ) => {
            x.level == y.level
                && x.chips == y.chips
                && x.exec_mode == y.exec_mode
                && cx.len() == cy.len()
                && cx.iter().zip(cy).all(|(p, q)| same_target(p, q))
        }
        (TargetKind::Remote(x), TargetKind::Remote(y)) => {
            format!("{x:?}") == format!("{y:?}")
                && x.level3_config().chips == y.level3_config().chips
        }
        _ => false,
    }
}

/// Merges inherited ranges that overlap or touch into one region each (views of one
/// mapping collapse); a range listed both read-only and writable is refused.
fn merge_inherited(mut list: Vec<Inherited>) -> Result<Vec<Inherited>, Error> {
    list.sort_by_key(|h| h.ptr);
    let mut out: Vec<Inherited> = Vec::new();
    for h in list {
        if h.len == 0 {
            return Err(Error::InvalidArgument(
                "inherited host memory of 0 bytes".into(),
            ));
        }
        if let Some(last) = out.last_mut() {
            if h.ptr < last.ptr + last.len {
                if h.read_only != last.read_only {
                    return Err(Error::InvalidArgument(format!(
                        "inherited host memory at {:#x} is listed both read-only and writable; list each mapping once, with one access",
                        h.ptr
                    )));
                }
                last.len = last.len.max(h.ptr + h.len - last.ptr);
                continue;
            }
        }
        out.push(h);
    }
    Ok(out)
}

/// Which bytes an explicit copy moves: `nbytes` from byte `host_offset` of the host slice,
/// to or from byte `device_offset` of the device tensor.
///
/// ```
/// use strata::CopyRange;
/// let r = CopyRange::new(64, 128, 16);
/// assert_eq!((r.nbytes, r.device_offset, r.host_offset), (64, 128, 16));
/// assert_eq!(CopyRange::bytes(64), CopyRange::new(64, 0, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyRange {
    /// Bytes to copy.
    pub nbytes: u64,
    /// Byte offset in the device tensor.
    pub device_offset: u64,
    /// Byte offset in the host slice.
    pub host_offset: u64,
}

impl CopyRange {
    /// `nbytes` from `host_offset` to or from `device_offset`.
    pub fn new(nbytes: u64, device_offset: u64, host_offset: u64) -> CopyRange {
        CopyRange {
            nbytes,
            device_offset,
            host_offset,
        }
    }

    /// The first `nbytes` of both.
    pub fn bytes(nbytes: u64) -> CopyRange {
        CopyRange::new(nbytes, 0, 0)
    }
}

fn host_bounds(len: usize, range: CopyRange) -> Result<std::ops::Range<usize>, Error> {
    let end = range.host_offset.checked_add(range.nbytes);
    match end {
        Some(end) if end <= len as u64 => Ok(range.host_offset as usize..end as usize),
        _ => Err(Error::InvalidArgument(format!(
            "the copy's host range ({} bytes from byte {}) leaves the {len}-byte host buffer",
            range.nbytes, range.host_offset
        ))),
    }
}

fn host_range(b: &[u8], range: CopyRange) -> Result<&[u8], Error> {
    Ok(&b[host_bounds(b.len(), range)?])
}

fn host_range_mut(b: &mut [u8], range: CopyRange) -> Result<&mut [u8], Error> {
    let r = host_bounds(b.len(), range)?;
    Ok(&mut b[r])
}

impl Core {
    fn find(&self, program: &Compiled) -> Result<usize, Error> {
        self.programs
            .iter()
            .position(|p| p.compiled == *program)
            .ok_or_else(|| {
                Error::Program(format!(
                    "program {} is not prepared on this worker (prepared: {}); prepare it with Prepare::program",
                    program.name(),
                    list(self.programs.iter().map(|p| p.compiled.name()))
                ))
            })
    }

    /// Chips a stacked tensor may be placed on.
    fn chips(&self) -> usize {
        match &self.backend {
            Backend::Chip(_) => 1,
            Backend::Dist(d) => match d.level() {
                strata_dist::Level::L3 => d.config().chips.len(),
                strata_dist::Level::L4 => self.children.iter().map(ChildChips::chips).sum(),
            },
        }
    }

    /// Drops finished dispatches from the front of the queue.
    fn prune(&mut self) {
        while self.inflight.front().is_some_and(|d| d.try_finish()) {
            self.inflight.pop_front();
        }
    }

    /// Waits for every dispatch in flight (their outcomes stay with their handles).
    fn drain(&mut self) {
        while let Some(d) = self.inflight.pop_front() {
            let _ = d.finish(None);
        }
    }

    fn alloc(
        &mut self,
        shape: &[u64],
        dtype: DataType,
        worker: usize,
        init: Option<&[u8]>,
    ) -> Result<DeviceTensor, Error> {
        if !self.children.is_empty() {
            return self.alloc_nested(shape, dtype, worker, init);
        }
        let t = match &mut self.backend {
            Backend::Dist(d) => {
                let t = d.alloc_child_tensor(worker, shape, dtype)?;
                if let Some(bytes) = init {
                    if let Err(e) = d.copy_bytes_to(&t, 0, bytes) {
                        let _ = d.free(t);
                        return Err(e.into());
                    }
                }
                t
            }
            Backend::Chip(c) => {
                check_chip_worker(worker)?;
                let t = c.alloc_tensor(shape, dtype, strata_chip::TensorInit::Zeros)?;
                if let Some(bytes) = init {
                    let n = bytes.len();
                    if let Err(e) = c.copy_to(t.ptr(), bytes, n, CopyOffsets::default()) {
                        let _ = c.free_tensor(t);
                        return Err(e.into());
                    }
                }
                t
            }
        };
        self.owned.insert(t.identity(), t);
        Ok(t)
    }

    /// Checks that `t` is a live tensor this worker allocated.
    fn check_owned(&self, t: &DeviceTensor, op: &str) -> Result<(), Error> {
        if self.owned.get(&t.identity()) == Some(t) {
            return Ok(());
        }
        // Handles carry their issuer: one of this worker's at the address of a live
        // allocation is stale; anything else is not this worker's at all.
        let reused = self.owned.values().any(|o| {
            o.worker() == t.worker()
                && o.ptr().addr() == t.ptr().addr()
                && o.ptr().chip() == t.ptr().chip()
        });
        Err(Error::Memory(if reused {
            format!(
                "{op}: stale DeviceTensor: the allocation at {:#x} on worker {} was freed and its address reused by a newer allocation (which stays valid)",
                t.ptr().addr(),
                t.worker()
            )
        } else {
            format!(
                "{op}: the DeviceTensor at {:#x} on worker {} is not a live allocation owned by this worker (freed, allocated by another worker, or not made by alloc_tensor)",
                t.ptr().addr(),
                t.worker()
            )
        }))
    }

    fn free(&mut self, t: &DeviceTensor) -> Result<(), Error> {
        self.check_owned(t, "free_tensor")?;
        match (&mut self.backend, self.remote_tensors.get(&t.identity())) {
            (Backend::Dist(d), Some(rt)) => {
                let rt = *rt;
                let r = remote_of(&self.children, &rt)?;
                if let Err(e) = r.free(d, rt) {
                    if r.is_live(&rt) {
                        // Refused before anything changed: the tensor stays this worker's.
                        return Err(e.into());
                    }
                    // Retired, then the session ended: its memory went with the node.
                    self.remote_tensors.remove(&t.identity());
                    self.owned.remove(&t.identity());
                    return Err(e.into());
                }
                self.remote_tensors.remove(&t.identity());
            }
            (Backend::Dist(d), None) => d.free(*t)?,
            (Backend::Chip(c), _) => c.free_tensor(*t)?,
        }
        self.owned.remove(&t.identity());
        Ok(())
    }

    /// Chip `worker` of a level-4 worker, numbered across its level-3 children in order:
    /// the child's slot and its own chip number.
    fn locate(&self, worker: usize) -> Result<(usize, usize), Error> {
        let mut first = 0;
        for (slot, c) in self.children.iter().enumerate() {
            if worker < first + c.chips() {
                return Ok((slot, worker - first));
            }
            first += c.chips();
        }
        Err(Error::InvalidArgument(format!(
            "chip {worker} is out of range: this level-4 worker's level-3 children have {first} chips in all (0..{first}, numbered child by child)"
        )))
    }

    /// [`Core::alloc`] on a level-4 worker: on chip `worker` counted across the
    /// children, through the child's own path (control requests to a local child, the
    /// session of a remote one).
    fn alloc_nested(
        &mut self,
        shape: &[u64],
        dtype: DataType,
        worker: usize,
        init: Option<&[u8]>,
    ) -> Result<DeviceTensor, Error> {
        let (slot, chip) = self.locate(worker)?;
        let Backend::Dist(d) = &mut self.backend else {
            return Err(Error::Internal("level-4 workers are dist workers".into()));
        };
        let t = match &self.children[slot] {
            ChildChips::Local { id, .. } => {
                let t = d.alloc_nested_tensor(*id, chip, shape, dtype)?;
                if let Some(bytes) = init {
                    if let Err(e) = d.copy_bytes_to(&t, 0, bytes) {
                        let _ = d.free(t);
                        return Err(e.into());
                    }
                }
                t
            }
            ChildChips::Remote(r) => {
                let rt = r.alloc(d, chip, shape, dtype)?;
                if let Some(bytes) = init {
                    if let Err(e) = r.copy_to(d, &rt, 0, bytes) {
                        let _ = r.free(d, rt);
                        return Err(e.into());
                    }
                }
                let desc = rt.arg(strata_types::ArgTag::Input).buffer;
                let BufferLocation::Device { addr, .. } = desc.location() else {
                    return Err(Error::Internal("remote tensors are device tensors".into()));
                };
                let id = desc.identity();
                // SAFETY: the level-4 engine admitted this allocation under exactly this
                // identity (owner nonce and buffer id), worker, handle and size
                // (`admit_remote_device`), and checks every task naming it against that
                // record; the handle is only ever resolved by the remote node.
                let t = unsafe {
                    DeviceTensor::from_raw_parts(
                        id.owner().0,
                        id.buffer_id(),
                        r.id() as u32,
                        addr,
                        desc.nbytes(),
                        rt.view(),
                    )
                };
                debug_assert_eq!(t.identity(), id);
                self.remote_tensors.insert(id, rt);
                t
            }
        };
        self.owned.insert(t.identity(), t);
        Ok(t)
    }

    /// Copies `bytes` into `t` from its byte `dev_offset` on (`t` checked owned).
    fn copy_in(&mut self, t: &DeviceTensor, dev_offset: u64, bytes: &[u8]) -> Result<(), Error> {
        match (&mut self.backend, self.remote_tensors.get(&t.identity())) {
            (Backend::Dist(d), Some(rt)) => {
                remote_of(&self.children, rt)?.copy_to(d, rt, dev_offset, bytes)?;
            }
            (Backend::Dist(d), None) => {
                d.copy_bytes_to(t, dev_offset, bytes)?;
            }
            (Backend::Chip(c), _) => c.copy_to(
                t.ptr(),
                bytes,
                bytes.len(),
                CopyOffsets {
                    device: dev_offset,
                    host: 0,
                },
            )?,
        }
        Ok(())
    }

    /// Copies `bytes.len()` bytes of `t` from its byte `dev_offset` on into `bytes`.
    fn copy_out(
        &mut self,
        t: &DeviceTensor,
        dev_offset: u64,
        bytes: &mut [u8],
    ) -> Result<(), Error> {
        match (&mut self.backend, self.remote_tensors.get(&t.identity())) {
            (Backend::Dist(d), Some(rt)) => {
                remote_of(&self.children, rt)?.copy_from(d, rt, dev_offset, bytes)?;
            }
            (Backend::Dist(d), None) => {
                d.copy_bytes_from(bytes, t, dev_offset)?;
            }
            (Backend::Chip(c), _) => {
                let n = bytes.len();
                c.copy_from(
                    bytes,
                    t.ptr(),
                    n,
                    CopyOffsets {
                        device: dev_offset,
                        host: 0,
                    },
                )?
            }
        }
        Ok(())
    }

    /// Checks the arguments of a dispatch of program `index` against its signature and
    /// this worker (count, kinds, dtypes, shapes, shared memory visible to the children,
    /// device tensors owned and live), and holds them for the dispatch.
    fn check_args(&self, index: usize, args: &[Arg<'_>]) -> Result<Vec<HeldArg>, Error> {
        let sig = &self.programs[index].compiled.inner.bound;
        let arity = sig.dispatch_arity();
        if args.len() != arity {
            return Err(Error::Program(format!(
                "program {} expects {arity} arguments (in place, one per parameter: {}), got {}",
                sig.program,
                sig.describe(),
                args.len()
            )));
        }
        let mut named = HashMap::new();
        let mut held = Vec::with_capacity(args.len());
        for (p, a) in sig.dispatch_params().zip(args) {
            let err = |m: String| sig.arg_error(p.name(), m);
            match (p, a) {
                (BoundParam::Tensor { .. }, Arg::Host(t)) => {
                    sig.check_tensor(p, t.view().dtype(), t.view().shape(), &mut named)?;
                    let BufferLocation::HostShared { region, .. } = t.buffer().location() else {
                        return Err(Error::Internal(
                            "shared tensors live in shared memory".into(),
                        ));
                    };
                    if region > self.visible_regions {
                        return Err(err(
                            "is shared memory created after prepare(): the worker's children cannot see it; allocate dispatch tensors (SharedTensor::zeroed / from_data) before prepare()".into(),
                        ));
                    }
                    held.push(HeldArg::Host((*t).clone()));
                }
                (BoundParam::Tensor { .. }, Arg::Device(t)) => {
                    sig.check_tensor(p, t.dtype(), t.shape(), &mut named)?;
                    self.check_owned(t, "dispatch")
                        .map_err(|e| err(e.to_string()))?;
                    held.push(HeldArg::Device(**t));
                }
                (BoundParam::Tensor { .. }, Arg::Stacked(s)) => {
                    sig.check_tensor(p, s.dtype(), s.shape(), &mut named)?;
                    if matches!(self.backend, Backend::Chip(_)) {
                        return Err(err("is a stacked tensor, which shards over the chips of a level-3 worker; a chip takes a DeviceTensor".into()));
                    }
                    for shard in s.shards() {
                        self.check_owned(shard, "dispatch")
                            .map_err(|e| err(e.to_string()))?;
                    }
                    held.push(HeldArg::Stacked((*s).clone()));
                }
                (BoundParam::Tensor { .. }, Arg::Private { what, len }) => {
                    return Err(err(format!(
                        "is private host memory ({len} × {what}), which the worker's child processes cannot see: dispatch arguments must be shared memory allocated before prepare() — SharedTensor::from_data(shape, data) (inherited host memory is only for explicit copies)"
                    )));
                }
                (BoundParam::Tensor { .. }, Arg::Scalar(_)) => {
                    return Err(err("is a tensor parameter, but a scalar was given".into()));
                }
                (BoundParam::Scalar { dtype, .. }, Arg::Scalar(v)) => {
                    if v.dtype() != *dtype {
                        return Err(err(format!(
                            "expects a {dtype:?} scalar, got {:?}",
                            v.dtype()
                        )));
                    }
                    held.push(HeldArg::Scalar(*v));
                }
                (BoundParam::Scalar { .. }, _) => {
                    return Err(err("is a scalar parameter, but a tensor was given".into()));
                }
            }
        }
        Ok(held)
    }
}

/// Runs a dispatch of a level-2 program on the chip, synchronously.
fn run_on_chip(
    chip: &mut ChipWorker,
    h: OrchHandle,
    sig: &crate::program::signature::BoundSignature,
    held: &[HeldArg],
    config: &CallConfig,
) -> Result<strata_chip::RunReport, Error> {
    let mem = SharedMemory::process();
    let mut run = RunArgs::new();
    let mut given = held.iter();
    for p in &sig.params {
        match p {
            BoundParam::Tensor { direction, .. } => match given.next() {
                Some(HeldArg::Host(t)) => {
                    let BufferLocation::HostShared { region, offset } = t.buffer().location()
                    else {
                        return Err(Error::Internal(
                            "shared tensors live in shared memory".into(),
                        ));
                    };
                    let base = mem.ptr(region, offset, t.nbytes())?;
                    // SAFETY: `ptr` checked the tensor's bytes against its region, which the
                    // tensor (held by the dispatch) keeps alive; the run is synchronous and
                    // this worker is locked meanwhile.
                    unsafe { run.host_raw(base, t.view(), direction.tag()) };
                }
                Some(HeldArg::Device(t)) => {
                    run.device(t, direction.tag());
                }
                _ => return Err(Error::Internal("argument kinds were checked".into())),
            },
            BoundParam::Scalar { fixed: Some(v), .. } => {
                run.scalar(v.bits());
            }
            BoundParam::Scalar { .. } => match given.next() {
                Some(HeldArg::Scalar(v)) => {
                    run.scalar(v.bits());
                }
                _ => return Err(Error::Internal("argument kinds were checked".into())),
            },
        }
    }
    Ok(chip.run(&h, &mut run, config)?)
}

/// The hash a chip's spans name an orchestration by: its digest's first 8 bytes, hex.
fn hid_of(h: &OrchHandle) -> String {
    h.id().as_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A program registered on a prepared worker: calling it dispatches the program
/// ([`PreparedWorker::register`]).
#[derive(Clone)]
pub struct Registration {
    shared: Arc<Shared>,
    worker: u64,
    program: Compiled,
    closed: Arc<AtomicBool>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("program", &self.program.name())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl PartialEq for Registration {
    fn eq(&self, other: &Registration) -> bool {
        self.worker == other.worker
            && self.program == other.program
            && Arc::ptr_eq(&self.closed, &other.closed)
    }
}

impl Eq for Registration {}

impl Registration {
    /// The program.
    pub fn program(&self) -> &Compiled {
        &self.program
    }

    /// Whether it was unregistered or its worker closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Dispatches the program and waits for it.
    ///
    /// # Errors
    /// An unregistered handle or a closed worker; the errors of [`PreparedWorker::run`].
    pub fn call<'a>(&self, args: impl IntoArgs<'a>) -> Result<(), Error> {
        if self.is_closed() {
            return Err(Error::Program(format!(
                "the registration of {} was released (unregister() or the worker's close()); register the program again",
                self.program.name()
            )));
        }
        self.shared
            .submit_with(&self.program, args.into_args(), &CallConfig::default())?
            .result(None)
    }

    /// Releases the registration now (idempotent); registering the program again gives a
    /// new handle.
    pub fn unregister(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let mut core = lock(&self.shared.core);
            if core
                .registrations
                .get(&self.program.inner.id)
                .is_some_and(|f| Arc::ptr_eq(f, &self.closed))
            {
                core.registrations.remove(&self.program.inner.id);
            }
        }
    }
}
