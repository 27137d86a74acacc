//! The nested level-3 worker: the `ChildProgram` a level-4 worker gives strata-host for
//! each added level-3 worker — the whole `DistWorker` (with its own children, forked inside
//! this child) serving host orchestrations for its parent. It lives with the worker it runs
//! because it drives that worker's lifecycle (`init`, `run_with`, `close`).

use super::{DistWorker, CHIP_FAILED_BELOW};
use crate::error::DistError;
use crate::registry::HostOrchHandle;
use strata_graph::WorkerClass;
use strata_host::{ChildEnv, ChildProgram};
use strata_mailbox::{codes, ControlReply, ControlRequest, FailureReport, Handler, TaskRequest};

/// A level-3 worker child of a level-4 worker: the whole level-3 worker (with its own
/// children, forked inside this child) serving host orchestrations.
pub(crate) struct NestedChild {
    index: usize,
    worker: DistWorker,
}

impl NestedChild {
    pub(crate) fn new(index: usize, worker: DistWorker) -> Self {
        NestedChild { index, worker }
    }
}

impl ChildProgram for NestedChild {
    fn label(&self) -> String {
        format!("child_worker level=3 id={}", self.index)
    }

    fn start(self: Box<Self>, env: &ChildEnv) -> Result<Box<dyn Handler + Send>, String> {
        let mut worker = self.worker;
        if env.mode == strata_host::ExecMode::Threads {
            // Forking from a thread of a multi-threaded process is refused; a thread child
            // runs its own children as threads too.
            worker.set_exec_mode(strata_host::ExecMode::Threads);
        }
        worker.init().map_err(|e| e.to_string())?;
        Ok(Box::new(NestedHandler { worker }))
    }
}

struct NestedHandler {
    worker: DistWorker,
}

impl Handler for NestedHandler {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        let handle = HostOrchHandle { id: req.callable };
        self.worker
            .run_nested(&handle, req.args, req.config)
            .map_err(|e| {
                // A chip's failure stays a chip's failure one level up.
                let code = match &e {
                    DistError::TaskFailed(f)
                        if f.origin().map(|o| o.class) == Some(WorkerClass::Chip) =>
                    {
                        CHIP_FAILED_BELOW
                    }
                    _ => codes::FAILED,
                };
                // A stall below (a chip's, or this worker's own) travels up as data.
                let wait_for = match &e {
                    DistError::TaskFailed(f) => f.wait_for().map(|w| (**w).clone()),
                    DistError::WaitTimeout { wait_for, .. } => {
                        wait_for.as_ref().map(|w| (**w).clone())
                    }
                    _ => None,
                };
                let message = match &e {
                    DistError::TaskFailed(f) => f.message().to_owned(),
                    e => e.to_string(),
                };
                FailureReport::new(code, message).with_wait_for(wait_for)
            })
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
        Err(FailureReport::new(
            codes::UNSUPPORTED,
            format!(
                "a level-3 worker child does not take control command {}; device memory belongs to its chips",
                req.command
            ),
        ))
    }
}

impl Drop for NestedHandler {
    fn drop(&mut self) {
        let _ = self.worker.close();
    }
}
