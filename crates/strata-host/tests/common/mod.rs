//! Scaffolding shared by strata-host's `harness = false` binaries: task helpers on top
//! of the workspace's scenario runner (`strata-testkit`).
#![allow(dead_code)]

use strata_host::*;
use strata_mailbox::{
    encode_args_blob, EncodedConfig, FrameIdentity, TaskCompletion, TaskPublication, TaskSlot,
};
pub use strata_testkit::*;
use strata_types::{CallableId, TaskArgs};

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
        let blob = encode_args_blob(args);
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
        let blob = encode_args_blob(args);
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
