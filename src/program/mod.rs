//! Programs: what a user hands the runtime — an orchestration with a signature, and the
//! kernels, chip orchestrations and sub-worker callbacks it uses — compiled for a target
//! (a chip, or a level-3 / level-4 worker), then run once or prepared and dispatched many
//! times.
//!
//! ```no_run
//! use strata::prelude::*;
//!
//! // y[r] = x[r] + 1 on every chip r.
//! let mut p = Program::new(
//!     "add_one",
//!     Signature::new()
//!         .input("x", DataType::F32, [Dim::World, Dim::Fixed(4)])
//!         .output("y", DataType::F32, [Dim::World, Dim::Fixed(4)]),
//! );
//! let add = p.kernel("add", |ctx| {
//!     let x = ctx.input::<f32>(0)?.to_vec();
//!     let mut y = ctx.output::<f32>(1)?;
//!     for (i, v) in x.iter().enumerate() {
//!         y.set_flat(i as u64, v + 1.0)?;
//!     }
//!     Ok(())
//! });
//! let per_chip = p.chip_orchestration("add_on_chip", move |o, a| {
//!     o.submit_aiv(add, CoreArgs::new().input(&a.tensor(0)?).output(&a.tensor(1)?))?;
//!     Ok(())
//! });
//! p.orchestrate(move |o, args| {
//!     let (x, y) = (args.tensor("x")?, args.tensor("y")?);
//!     for r in 0..o.world_size() {
//!         let a = TaskArgs::new().input(x.row(r)).output_existing(y.row(r));
//!         o.submit_next_level(per_chip, &a, r)?;
//!     }
//!     Ok(())
//! });
//! let compiled = p.compile(&Target::l3(2))?;
//! let x = SharedTensor::from_data(&[2, 4], &[0f32, 1., 2., 3., 4., 5., 6., 7.])?;
//! let y = SharedTensor::zeroed(&[2, 4], DataType::F32)?;
//! compiled.run_once((&x, &y))?;
//! assert_eq!(y.to_vec::<f32>()?, vec![1., 2., 3., 4., 5., 6., 7., 8.]);
//! # Ok::<(), strata::Error>(())
//! ```

pub mod args;
pub mod signature;

use crate::error::Error;
use signature::BoundSignature;
pub use signature::{Dim, Direction, Param, ScalarParam, ScalarValue, Signature, TensorParam};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_chip::{ChipConfig, KernelHandle, OrchHandle, Registry};
use strata_dist::{DistConfig, HostOrchHandle, Level, SubHandle};
use strata_net::RemoteSpec;
use strata_types::CallbackResult;
use strata_types::{CallableDescriptor, CallableKind};

/// A host orchestration of a program: builds one dispatch from its arguments.
pub type ProgramFn =
    Arc<dyn Fn(&mut strata_dist::Orch<'_>, &args::ProgramArgs) -> CallbackResult + Send + Sync>;

/// What a program is compiled for.
///
/// ```
/// use strata::Target;
/// use strata::chip::ChipConfig;
/// assert_eq!(Target::chip(ChipConfig::default()).level(), 2);
/// let t = Target::l3(4).sub_workers(2);
/// assert_eq!((t.level(), t.world_size()), (3, 4));
/// assert_eq!(Target::l4(vec![Target::l3(2), Target::l3(2)]).level(), 4);
/// ```
#[derive(Debug, Clone)]
pub struct Target {
    kind: TargetKind,
}

#[derive(Debug, Clone)]
pub(crate) enum TargetKind {
    Chip(Box<ChipConfig>),
    Dist {
        config: DistConfig,
        children: Vec<Target>,
    },
    /// A level-3 worker on another host (a child of a level-4 target).
    Remote(Box<RemoteSpec>),
}

impl Target {
    /// One chip (a level-2 worker).
    pub fn chip(config: ChipConfig) -> Target {
        Target {
            kind: TargetKind::Chip(Box::new(config)),
        }
    }

    /// A level-3 worker with `chips` chips of the default configuration (world ranks
    /// `0..chips`) and no sub-workers.
    pub fn l3(chips: usize) -> Target {
        Target::l3_chips(vec![ChipConfig::default(); chips])
    }

    /// A level-3 worker with these chips.
    pub fn l3_chips(chips: Vec<ChipConfig>) -> Target {
        Target {
            kind: TargetKind::Dist {
                config: DistConfig::l3(chips, 0),
                children: Vec::new(),
            },
        }
    }

    /// A level-4 worker whose next-level workers are these level-3 targets.
    pub fn l4(children: Vec<Target>) -> Target {
        Target {
            kind: TargetKind::Dist {
                config: DistConfig::l4(0),
                children,
            },
        }
    }

    /// A level-3 worker on another host, served by the `strata-node` daemon (or the
    /// launched rank) `spec` names — a child of a level-4 target beside local ones, with
    /// worker ids from one counter in the order of [`Target::l4`]'s list. Its chips are
    /// `spec`'s.
    ///
    /// At prepare, the level-4 worker connects to the node, which starts this same program
    /// (same build-id, same arguments): that process compiles and prepares the same
    /// programs, and its `prepare` serves as the remote worker instead of returning — so
    /// the program must reach `prepare` with the same programs on every host. See
    /// `docs/net.md` §1.
    ///
    /// ```
    /// use strata::net::RemoteSpec;
    /// use strata::Target;
    /// let t = Target::l4(vec![
    ///     Target::l3(2),
    ///     Target::remote(RemoteSpec::new("hostb:7070").chips(4).secret_file("/etc/strata/secret")),
    /// ]);
    /// assert_eq!((t.level(), t.world_size()), (4, 2));
    /// ```
    pub fn remote(spec: RemoteSpec) -> Target {
        Target {
            kind: TargetKind::Remote(Box::new(spec)),
        }
    }

    /// With `n` host sub-workers (level 3 and 4).
    pub fn sub_workers(mut self, n: usize) -> Target {
        match &mut self.kind {
            TargetKind::Dist { config, .. } => config.num_sub_workers = n,
            TargetKind::Remote(spec) => **spec = spec.as_ref().clone().sub_workers(n),
            TargetKind::Chip(_) => {}
        }
        self
    }

    /// With the engine's settings changed by `f` (exec mode, timeouts, heap rings, comm
    /// arena, ...; level 3 and 4).
    pub fn configure(mut self, f: impl FnOnce(&mut DistConfig)) -> Target {
        match &mut self.kind {
            TargetKind::Dist { config, .. } => f(config),
            TargetKind::Remote(spec) => **spec = spec.as_ref().clone().configure(f),
            TargetKind::Chip(_) => {}
        }
        self
    }

    /// With the chip's settings changed by `f` (level 2), or every chip's (level 3).
    pub fn configure_chips(self, f: impl Fn(&mut ChipConfig)) -> Target {
        self.each_chip(&f)
    }

    fn each_chip(mut self, f: &dyn Fn(&mut ChipConfig)) -> Target {
        match &mut self.kind {
            TargetKind::Chip(c) => f(c),
            TargetKind::Dist { config, children } => {
                config.chips.iter_mut().for_each(f);
                for c in children.iter_mut() {
                    *c = c.clone().each_chip(f);
                }
            }
            TargetKind::Remote(spec) => {
                **spec = spec
                    .as_ref()
                    .clone()
                    .configure(|c| c.chips.iter_mut().for_each(f));
            }
        }
        self
    }

    /// 2, 3 or 4.
    pub fn level(&self) -> u8 {
        match &self.kind {
            TargetKind::Chip(_) => 2,
            TargetKind::Dist { config, .. } => config.level.number(),
            TargetKind::Remote(_) => 3,
        }
    }

    /// The number of next-level workers a program's orchestration dispatches to: 1 on a
    /// chip (itself), the chips of a level-3 worker, the level-3 children of a level-4
    /// one. [`Dim::World`] binds to it.
    pub fn world_size(&self) -> usize {
        match &self.kind {
            TargetKind::Chip(_) => 1,
            TargetKind::Dist { config, children } => match config.level {
                Level::L3 => config.chips.len(),
                Level::L4 => children.len(),
            },
            TargetKind::Remote(spec) => spec.level3_config().chips.len(),
        }
    }

    pub(crate) fn kind(&self) -> &TargetKind {
        &self.kind
    }

    fn validate(&self) -> Result<(), Error> {
        match &self.kind {
            TargetKind::Chip(c) => c.validate().map_err(|e| Error::Config(e.to_string())),
            TargetKind::Dist { config, children } => {
                config
                    .validate()
                    .map_err(|e| Error::Config(e.to_string()))?;
                if config.level == Level::L3 && !children.is_empty() {
                    return Err(Error::Config(
                        "a level-3 target has chips, not level-3 children".into(),
                    ));
                }
                for (i, c) in children.iter().enumerate() {
                    if c.level() != 3 {
                        return Err(Error::Config(format!(
                            "child {i} of a level-4 target is a level-{} target; level-4 children are level-3 targets",
                            c.level()
                        )));
                    }
                    c.validate_as_child()?;
                }
                Ok(())
            }
            TargetKind::Remote(_) => Err(Error::Config(
                "a remote level-3 worker is a child of a level-4 target: Target::l4(vec![Target::remote(spec), ..])".into(),
            )),
        }
    }

    fn validate_as_child(&self) -> Result<(), Error> {
        match &self.kind {
            TargetKind::Remote(spec) => spec
                .level3_config()
                .validate()
                .map_err(|e| Error::Config(format!("remote level-3 worker: {e}"))),
            _ => self.validate(),
        }
    }
}

/// How a program starts a dispatch.
#[derive(Clone)]
pub(crate) enum Entry {
    /// A host orchestration (level 3 and 4).
    Host(ProgramFn),
    /// A chip orchestration (level 2), registered in the program's chip registry.
    Chip(OrchHandle),
}

/// A program being built: a signature, an orchestration, and the callables it uses.
/// Everything is registered with the worker when it is prepared (before its children are
/// forked, so they find each callable by its digest).
///
/// Kernels, chip orchestrations and sub-worker callables are named within the program
/// (two programs prepared on one worker may each have a kernel `"add"`); callbacks —
/// sub-worker callables bound at prepare time — are named across programs.
pub struct Program {
    name: String,
    signature: Signature,
    chip: Registry,
    subs: Vec<(String, Option<strata_host::SubFn>)>,
    nested: Vec<(String, strata_dist::HostOrchFn)>,
    entry: Option<Entry>,
    errors: Vec<String>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.name)
            .field("signature", &self.signature)
            .finish_non_exhaustive()
    }
}

impl Program {
    /// A program named `name` with `signature`; give it an orchestration with
    /// [`Program::orchestrate`] (level 3 and 4) or [`Program::orchestrate_chip`] (level 2).
    pub fn new(name: impl Into<String>, signature: Signature) -> Program {
        Program {
            name: name.into(),
            signature,
            chip: Registry::new(),
            subs: Vec::new(),
            nested: Vec::new(),
            entry: None,
            errors: Vec::new(),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn scoped(&self, name: &str) -> String {
        format!("{}/{name}", self.name)
    }

    /// Adds a kernel (runs on an emulated core) and returns the handle its chip
    /// orchestrations submit it by. A registration problem (too many kernels) is reported
    /// by [`Program::compile`].
    pub fn kernel<F>(&mut self, name: &str, f: F) -> KernelHandle
    where
        F: Fn(&mut strata_chip::KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static,
    {
        let desc = CallableDescriptor::new(CallableKind::Kernel, self.scoped(name));
        match self.chip.register_kernel(desc.clone(), f) {
            Ok(h) => h,
            Err(e) => {
                self.errors.push(format!("kernel {name:?}: {e}"));
                KernelHandle::from_id(desc.digest())
            }
        }
    }

    /// Adds a chip orchestration (runs on a chip's AICPU and submits kernels) and returns
    /// the handle a host orchestration submits it to a chip by.
    pub fn chip_orchestration<F>(&mut self, name: &str, f: F) -> OrchHandle
    where
        F: Fn(&mut strata_chip::ChipOrch, &strata_chip::ChipArgs) -> CallbackResult
            + Send
            + Sync
            + 'static,
    {
        let desc = CallableDescriptor::new(CallableKind::ChipOrchestration, self.scoped(name));
        let id = desc.digest();
        if let Err(e) = self.chip.register_orchestration(desc, f) {
            self.errors
                .push(format!("chip orchestration {name:?}: {e}"));
        }
        OrchHandle::from_id(id)
    }

    /// Adds a host sub-worker callable (a closure run by a sub-worker process) and returns
    /// the handle the orchestration submits it by.
    pub fn sub<F>(&mut self, name: &str, f: F) -> SubHandle
    where
        F: Fn(&mut strata_host::SubCall<'_>) -> CallbackResult + Send + Sync + 'static,
    {
        let scoped = self.scoped(name);
        self.subs.push((scoped.clone(), Some(Arc::new(f))));
        SubHandle::named(&scoped)
    }

    /// Declares a callback: a sub-worker callable this program calls by `name` but does
    /// not define — it must be supplied when the program is prepared
    /// ([`Prepare::callback`](crate::Prepare::callback)); preparing without it is an
    /// error, and so is a callback name no prepared program declares.
    pub fn callback(&mut self, name: &str) -> SubHandle {
        self.subs.push((name.to_owned(), None));
        SubHandle::named(name)
    }

    /// Adds a host orchestration the level-3 children of a level-4 program run (the
    /// program's orchestration submits it with `submit_next_level`).
    pub fn worker_orchestration<F>(&mut self, name: &str, f: F) -> HostOrchHandle
    where
        F: Fn(&mut strata_dist::Orch<'_>, &strata_types::TaskArgs) -> CallbackResult
            + Send
            + Sync
            + 'static,
    {
        let scoped = self.scoped(name);
        self.nested.push((scoped.clone(), Arc::new(f)));
        HostOrchHandle::named(&scoped)
    }

    /// Sets the program's host orchestration (a level-3 or level-4 program): it runs on
    /// the host for every dispatch and submits tasks to chips, sub-workers (or level-3
    /// workers), with the dispatch's arguments by parameter name.
    pub fn orchestrate<F>(&mut self, f: F)
    where
        F: Fn(&mut strata_dist::Orch<'_>, &args::ProgramArgs) -> CallbackResult
            + Send
            + Sync
            + 'static,
    {
        self.entry = Some(Entry::Host(Arc::new(f)));
    }

    /// Sets the program's chip orchestration (a level-2 program): it runs on the chip for
    /// every dispatch; its arguments are the dispatch's, tensors and scalars each in
    /// parameter order (a fixed scalar in its place).
    pub fn orchestrate_chip<F>(&mut self, f: F)
    where
        F: Fn(&mut strata_chip::ChipOrch, &strata_chip::ChipArgs) -> CallbackResult
            + Send
            + Sync
            + 'static,
    {
        let h = self.chip_orchestration("entry", f);
        self.entry = Some(Entry::Chip(h));
    }

    /// Checks the program for `target` and fixes its shapes: the signature (names, ranks,
    /// the world dimension bound to the target's world size, fixed scalars' types), the
    /// orchestration's level against the target's, the registrations, the callbacks'
    /// names, and the target's configuration. Errors name the parameter or callable and
    /// say what is wrong.
    ///
    /// # Errors
    /// [`Error::Signature`], [`Error::Program`], [`Error::Config`].
    pub fn compile(&self, target: &Target) -> Result<Compiled, Error> {
        let name = &self.name;
        if name.is_empty() || name.contains('/') || name.chars().any(char::is_whitespace) {
            return Err(Error::Program(format!(
                "program name {name:?}: use a non-empty name without '/' or spaces"
            )));
        }
        if let Some(e) = self.errors.first() {
            return Err(Error::Program(format!("program {name}: {e}")));
        }
        target.validate()?;
        let entry = self.entry.clone().ok_or_else(|| {
            Error::Program(format!(
                "program {name} has no orchestration: call orchestrate (level 3 and 4) or orchestrate_chip (level 2)"
            ))
        })?;
        match (&entry, target.level()) {
            (Entry::Chip(_), 2) | (Entry::Host(_), 3 | 4) => {}
            (Entry::Chip(_), l) => {
                return Err(Error::Program(format!(
                    "program {name} has a chip orchestration (a level-2 program) but the target is level {l}; compile it for Target::chip, or give it a host orchestration"
                )))
            }
            (Entry::Host(_), _) => {
                return Err(Error::Program(format!(
                    "program {name} has a host orchestration (level 3 and 4) but the target is a chip; compile it for Target::l3, or give it a chip orchestration"
                )))
            }
        }
        if target.level() == 2 && !self.subs.is_empty() {
            return Err(Error::Program(format!(
                "program {name} uses sub-worker callables, but a chip has no sub-workers; compile it for a level-3 target"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for (n, f) in &self.subs {
            if !seen.insert(n) {
                let what = if f.is_some() {
                    "sub callable"
                } else {
                    "callback"
                };
                return Err(Error::Program(format!(
                    "program {name}: {what} {n:?} is declared twice"
                )));
            }
        }
        let sig = self.signature.bind(name, target.world_size())?;
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Ok(Compiled {
            inner: Arc::new(CompiledInner {
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                name: name.clone(),
                signature: self.signature.clone(),
                bound: sig,
                target: target.clone(),
                entry,
                chip: self.chip.clone(),
                subs: self.subs.clone(),
                nested: self.nested.clone(),
            }),
        })
    }
}

/// A compiled program: checked and bound to a target; run it once
/// ([`Compiled::run_once`]) or prepare a worker for it ([`Compiled::prepare`]). Cheap to
/// clone (clones are the same program).
#[derive(Clone)]
pub struct Compiled {
    pub(crate) inner: Arc<CompiledInner>,
}

pub(crate) struct CompiledInner {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) signature: Signature,
    pub(crate) bound: BoundSignature,
    pub(crate) target: Target,
    pub(crate) entry: Entry,
    pub(crate) chip: Registry,
    pub(crate) subs: Vec<(String, Option<strata_host::SubFn>)>,
    pub(crate) nested: Vec<(String, strata_dist::HostOrchFn)>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("name", &self.inner.name)
            .field("level", &self.inner.target.level())
            .field("signature", &self.inner.bound.describe())
            .finish()
    }
}

impl PartialEq for Compiled {
    fn eq(&self, other: &Compiled) -> bool {
        self.inner.id == other.inner.id
    }
}

impl Eq for Compiled {}

impl Compiled {
    /// The program's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The target it was compiled for.
    pub fn target(&self) -> &Target {
        &self.inner.target
    }

    /// The signature it was written with.
    pub fn signature(&self) -> &Signature {
        &self.inner.signature
    }

    /// The signature with its shapes fixed, as text (`x: in F32[2, 1024], ...`).
    pub fn describe(&self) -> String {
        self.inner.bound.describe()
    }

    /// Sets up a worker for this program, dispatches it once with `args` and tears the
    /// worker down. Takes host tensors and scalars only: resident and stacked tensors
    /// belong to a prepared worker ([`Compiled::prepare`]).
    ///
    /// # Errors
    /// A resident or stacked tensor argument ([`Error::Argument`], saying to prepare);
    /// every error of [`Compiled::prepare`] and of the dispatch.
    pub fn run_once<'a>(&self, args: impl args::IntoArgs<'a>) -> Result<(), Error> {
        let args = args.into_args();
        for (i, a) in args.iter().enumerate() {
            if matches!(a, args::Arg::Device(_) | args::Arg::Stacked(_)) {
                let param = self
                    .inner
                    .bound
                    .dispatch_params()
                    .nth(i)
                    .map(|p| p.name().to_owned())
                    .unwrap_or_else(|| format!("#{i}"));
                return Err(Error::Argument {
                    program: self.inner.name.clone(),
                    param,
                    message: "is a resident device tensor: a one-shot run cannot accept resident or stacked tensors (they belong to a prepared worker); prepare() the program and dispatch with call() or run()".into(),
                });
            }
        }
        let rt = self.prepare(crate::Prepare::new())?;
        let outcome = rt.call(args);
        let closed = rt.close();
        outcome.and(closed)
    }

    /// Prepares a worker for this program (and the options' extra programs): registers
    /// every callable, forks the worker tree once, and returns the worker to dispatch to
    /// many times.
    ///
    /// # Errors
    /// See [`PreparedWorker`](crate::PreparedWorker).
    pub fn prepare(&self, options: crate::Prepare) -> Result<crate::PreparedWorker, Error> {
        crate::PreparedWorker::new(self, options)
    }
}
