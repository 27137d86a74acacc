//! Scaffolding shared by strata-host's `harness = false` binaries: the execution modes as
//! suite variants, task helpers on top of the workspace's scenario runner
//! (`strata-testkit`), and the child programs the scenarios start.
//!
//! These fixtures stay here rather than in strata-testkit: they are built on strata-host's
//! own types (`Children`, `Lane`, `ChildProgram`), and strata-testkit sits below every
//! crate it tests.
#![allow(dead_code)]

use std::sync::atomic::AtomicU64;
use std::time::Duration;
use strata_host::*;
use strata_mailbox::{
    codes, encode_args_blob, ControlReply, ControlRequest, EncodedConfig, FailureReport,
    FrameIdentity, Handler, TaskCompletion, TaskPublication, TaskRequest, TaskSlot,
};
pub use strata_testkit::suite::Variant;
pub use strata_testkit::*;
use strata_types::{CallableId, TaskArgs, TensorArg};

/// An execution mode as a suite variant: the contracts are generic over it.
pub trait Mode: Variant<Value = ExecMode> {}
impl<V: Variant<Value = ExecMode>> Mode for V {}

/// Children as forked processes.
pub struct Process;
impl Variant for Process {
    type Value = ExecMode;
    const VALUE: ExecMode = ExecMode::Process;
    const NAME: &'static str = "process";
}

/// Children as threads of this process.
pub struct Threads;
impl Variant for Threads {
    type Value = ExecMode;
    const VALUE: ExecMode = ExecMode::Threads;
    const NAME: &'static str = "threads";
}

/// Spawn options for `mode` with the suite's startup bound.
pub fn opts(mode: ExecMode) -> SpawnOptions {
    SpawnOptions::new(mode).with_startup_timeout(BOUND)
}

/// How a child that was asked to shut down ends in `mode`.
pub fn clean_end(mode: ExecMode) -> ChildEnd {
    match mode {
        ExecMode::Process => ChildEnd::Process(strata_mailbox::ChildExit::Exited(exit_codes::OK)),
        ExecMode::Threads => ChildEnd::ThreadReturned(exit_codes::OK),
    }
}

/// Task arguments from tensors then scalars.
pub fn args_of(tensors: &[TensorArg], scalars: &[u64]) -> TaskArgs {
    suite::task_args(tensors, scalars)
}

/// `n` atomics at the start of region `region` (which must hold `8 n` bytes).
pub fn atomics(mem: &SharedMemory, region: u64, n: usize) -> Result<&[AtomicU64], String> {
    let p = mem.ptr(region, 0, 8 * n as u64).ctx("region")?;
    // SAFETY: the region holds 8n bytes from a page-aligned start; AtomicU64 is valid for
    // any bit pattern and is meant to be shared; the region lives as long as `mem`.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<AtomicU64>(), n) })
}

/// Builds task publications with fresh identities.
pub struct Tasks {
    pub config: EncodedConfig,
    next: u64,
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks {
            config: EncodedConfig::default(),
            next: 0,
        }
    }

    pub fn identity(&mut self, slot: TaskSlot) -> FrameIdentity {
        self.next += 1;
        FrameIdentity {
            run_id: 1,
            lease_slot: slot.index() as u32,
            lease_generation: 1,
            dispatch_id: self.next,
        }
    }

    /// Publishes, waits (liveness-checked, bounded) and resets.
    pub fn run(
        &mut self,
        lane: &mut Lane,
        slot: TaskSlot,
        callable: CallableId,
        args: &TaskArgs,
    ) -> Result<TaskCompletion, HostError> {
        let blob = encode_args_blob(args)?;
        let id = self.identity(slot);
        let task = TaskPublication::run(callable, id, &self.config, &blob);
        lane.run_task(slot, &task, Some(BOUND))
    }

    /// Publishes without waiting.
    pub fn publish(
        &mut self,
        lane: &mut Lane,
        slot: TaskSlot,
        callable: CallableId,
        args: &TaskArgs,
    ) -> Result<(), String> {
        let blob = encode_args_blob(args).ctx("encode")?;
        let id = self.identity(slot);
        let task = TaskPublication::run(callable, id, &self.config, &blob);
        lane.parent().publish(slot, &task).ctx("publish")
    }
}

/// Expects a successful completion.
pub fn ok(c: Result<TaskCompletion, HostError>) -> Outcome {
    match c {
        Ok(c) => c.outcome.map_err(|f| format!("task failed: {f}")),
        Err(e) => Err(format!("task error: {e}")),
    }
}

/// Expects a failed completion and returns its (code, message).
pub fn failed(c: Result<TaskCompletion, HostError>) -> Result<(i32, String), String> {
    match c {
        Ok(c) => match c.outcome {
            Ok(()) => Err("the task succeeded but was expected to fail".into()),
            Err(f) => Ok((f.code, f.message)),
        },
        Err(e) => Err(format!("task error: {e}")),
    }
}

pub fn subs(registry: &SubRegistry, n: usize) -> Vec<Box<dyn ChildProgram>> {
    (0..n)
        .map(|i| Box::new(SubProgram::new(registry.clone()).with_index(i)) as Box<dyn ChildProgram>)
        .collect()
}

// -------------------------------------------------------------------------------------
// Child programs
// -------------------------------------------------------------------------------------

/// How a [`BadProgram`] fails its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bad {
    Err,
    Panic,
    /// Exits the process (so only a forked child can do it).
    Exit,
    /// Sleeps for the given time (past the startup deadline), then fails.
    Hang(Duration),
}

/// A child program whose `start` fails in the given way.
pub struct BadProgram(pub Bad);

impl BadProgram {
    pub fn label_of(bad: Bad) -> String {
        let name = match bad {
            Bad::Err => "Err",
            Bad::Panic => "Panic",
            Bad::Exit => "Exit",
            Bad::Hang(_) => "Hang",
        };
        format!("bad_child {name}")
    }
}

impl ChildProgram for BadProgram {
    fn label(&self) -> String {
        BadProgram::label_of(self.0)
    }

    fn start(self: Box<Self>, _env: &ChildEnv) -> Result<Box<dyn Handler + Send>, String> {
        match self.0 {
            Bad::Err => Err("no device 7 (deliberate)".into()),
            Bad::Panic => panic!("deliberate start panic"),
            Bad::Exit => std::process::exit(7),
            Bad::Hang(d) => {
                std::thread::sleep(d);
                Err("woke up".into())
            }
        }
    }
}

/// The control command of a [`NestedProgram`] that replies with its children's pids.
pub const CTRL_INNER_PIDS: u64 = 1;

/// A nested worker: its `start` spawns its own two sub-worker children in `mode` (so
/// INIT_READY means the whole subtree is ready) and its handler forwards each task to
/// one of them.
pub struct NestedProgram {
    pub registry: SubRegistry,
    pub mode: ExecMode,
}

struct NestedHandler {
    inner: Children,
    tasks: Tasks,
    next: usize,
}

impl ChildProgram for NestedProgram {
    fn label(&self) -> String {
        "child_worker level=3 id=0".into()
    }

    fn start(self: Box<Self>, env: &ChildEnv) -> Result<Box<dyn Handler + Send>, String> {
        let inner = Children::spawn(&env.shared, subs(&self.registry, 2), opts(self.mode))
            .map_err(|e| e.to_string())?;
        env.set_ready_info(inner.len() as u64);
        Ok(Box::new(NestedHandler {
            inner,
            tasks: Tasks::new(),
            next: 0,
        }))
    }
}

impl Handler for NestedHandler {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        let i = self.next % self.inner.len();
        self.next += 1;
        let id = self.tasks.identity(TaskSlot::Slot0);
        let task = TaskPublication::run(req.callable, id, &self.tasks.config, req.args_blob);
        match self.inner.lane(i).run_task(TaskSlot::Slot0, &task, None) {
            Ok(c) => c
                .outcome
                .map_err(|f| FailureReport::new(f.code, format!("inner: {}", f.message))),
            Err(e) => Err(FailureReport::new(50, e.to_string())),
        }
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
        match req.command {
            CTRL_INNER_PIDS => Ok(ControlReply {
                result: self.inner.len() as u64,
                payload: self
                    .inner
                    .pids()
                    .iter()
                    .flat_map(|p| p.to_le_bytes())
                    .collect(),
            }),
            c => Err(FailureReport::new(
                codes::UNSUPPORTED,
                format!("no command {c}"),
            )),
        }
    }
}

/// The pids in a [`CTRL_INNER_PIDS`] reply.
pub fn pids_of(payload: &[u8]) -> Vec<i32> {
    payload
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Asks a [`NestedProgram`] lane for its inner children's pids (empty in Threads mode).
pub fn inner_pids(lane: &mut Lane) -> Result<(u64, Vec<i32>), String> {
    let reply = lane
        .control(
            &ControlRequest {
                command: CTRL_INNER_PIDS,
                arg0: 0,
                payload: &[],
            },
            Some(BOUND),
        )
        .ctx("control")?;
    Ok((reply.result, pids_of(&reply.payload)))
}
