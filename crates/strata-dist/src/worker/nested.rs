//! The nested level-3 worker: the `ChildProgram` a level-4 worker gives strata-host for
//! each added level-3 worker — the whole `DistWorker` (with its own children, forked inside
//! this child) serving host orchestrations for its parent. It lives with the worker it runs
//! because it drives that worker's lifecycle (`init`, `run_with`, `close`).

use super::{DistWorker, CHIP_FAILED_BELOW};
use crate::control::{ControlCommand, ControlDecodeError};
use crate::error::DistError;
use crate::registry::HostOrchHandle;
use std::collections::HashMap;
use strata_chip::DeviceTensor;
use strata_graph::WorkerClass;
use strata_host::{ChildEnv, ChildProgram};
use strata_mailbox::{
    codes, ControlReply, ControlRequest, FailureReport, Handler, TaskRequest, TaskSlot,
};
use strata_types::{BufferLocation, DataType, TaskArgs};

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
        // Its track in traces carries the name its parent knows it by.
        worker.set_trace_name(&format!("child_worker level=3 id={}", self.index));
        if env.mode == strata_host::ExecMode::Threads {
            // Forking from a thread of a multi-threaded process is refused; a thread child
            // runs its own children as threads too.
            worker.set_exec_mode(strata_host::ExecMode::Threads);
        }
        worker.init().map_err(|e| e.to_string())?;
        Ok(Box::new(NestedHandler {
            index: self.index,
            worker,
            trace: None,
            reply: Vec::new(),
            tensors: HashMap::new(),
            next_handle: 1,
        }))
    }
}

struct NestedHandler {
    /// This child's worker id in its parent.
    index: usize,
    worker: DistWorker,
    /// The trace of the run just served, if it was traced (sent with its completion).
    trace: Option<strata_types::trace::Trace>,
    /// Its encoding, bounded by the frame's room.
    reply: Vec<u8>,
    /// Tensors the parent had allocated on this worker's chips, by the handle it was
    /// given: the parent's task arguments and requests name them by that handle.
    tensors: HashMap<u64, DeviceTensor>,
    next_handle: u64,
}

impl NestedHandler {
    /// The parent's arguments with every device tensor (named by its handle) replaced by
    /// this worker's own chip tensor, under the parent's view and tag.
    fn rewrite(&self, args: &TaskArgs) -> Result<Option<TaskArgs>, String> {
        let named = |t: &strata_types::TensorArg| {
            matches!(t.buffer.location(), BufferLocation::Device { .. })
        };
        if !args.tensors().iter().any(named) {
            return Ok(None);
        }
        let mut local = args.clone();
        for (i, t) in local.tensors_mut().iter_mut().enumerate() {
            let BufferLocation::Device { worker, addr } = t.buffer.location() else {
                continue;
            };
            if worker as usize != self.index {
                return Err(format!(
                    "tensor argument {i} is in the device memory of worker {worker}, not of this level-3 worker ({})",
                    self.index
                ));
            }
            let own = self.tensors.get(&addr).ok_or_else(|| {
                format!("tensor argument {i} names device allocation {addr} of this level-3 worker, which is not live (freed)")
            })?;
            if own.nbytes() != t.buffer.nbytes() {
                return Err(format!(
                    "tensor argument {i} names device allocation {addr} with {} bytes; it has {}",
                    t.buffer.nbytes(),
                    own.nbytes()
                ));
            }
            *t = own
                .arg_view(t.view, t.tag)
                .map_err(|e| format!("tensor argument {i}: {e}"))?;
        }
        Ok(Some(local))
    }

    fn tensor(&self, handle: u64) -> Result<&DeviceTensor, FailureReport> {
        self.tensors.get(&handle).ok_or_else(|| {
            FailureReport::new(
                codes::BAD_REQUEST,
                format!("no live device allocation with handle {handle} on this level-3 worker"),
            )
        })
    }
}

impl Handler for NestedHandler {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        let handle = HostOrchHandle { id: req.callable };
        let rewritten = self
            .rewrite(req.args)
            .map_err(|m| FailureReport::new(codes::FAILED, m))?;
        let args = rewritten.as_ref().unwrap_or(req.args);
        let (result, trace) = self.worker.run_nested(&handle, args, req.config);
        self.trace = trace;
        result.map_err(|e| {
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
                DistError::WaitTimeout { wait_for, .. } => wait_for.as_ref().map(|w| (**w).clone()),
                _ => None,
            };
            let message = match &e {
                DistError::TaskFailed(f) => f.message().to_owned(),
                e => e.to_string(),
            };
            FailureReport::new(code, message).with_wait_for(wait_for)
        })
    }

    fn reply(&mut self, _slot: TaskSlot, room: usize) -> &[u8] {
        self.reply = match self.trace.take() {
            Some(t) => t.encode_bounded(room),
            None => Vec::new(),
        };
        &self.reply
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
        let command = ControlCommand::from_request(req).map_err(|e| match e {
            ControlDecodeError::UnknownCommand(c) => FailureReport::new(
                codes::UNSUPPORTED,
                format!("a level-3 worker child does not take control command {c}"),
            ),
            malformed => FailureReport::new(codes::BAD_REQUEST, malformed.to_string()),
        })?;
        let fail = |e: DistError| FailureReport::new(codes::FAILED, e.to_string());
        match command {
            ControlCommand::AllocateOn { chip, bytes } => {
                let t = self
                    .worker
                    .alloc_child_tensor(chip as usize, &[bytes], DataType::U8)
                    .map_err(fail)?;
                let handle = self.next_handle;
                self.next_handle += 1;
                self.tensors.insert(handle, t);
                Ok(ControlReply::new(handle))
            }
            ControlCommand::Free { addr } => {
                let t = *self.tensor(addr)?;
                self.worker.free(t).map_err(fail)?;
                self.tensors.remove(&addr);
                Ok(ControlReply::new(0))
            }
            ControlCommand::Copy {
                direction,
                addr,
                dev_offset,
                region,
                offset,
                len,
            } => {
                let t = *self.tensor(addr)?;
                self.worker
                    .copy_range(&t, dev_offset, region, offset, len, direction)
                    .map_err(|e| match e {
                        // The request itself is wrong (a range, a region).
                        DistError::InvalidArgs(_) | DistError::StaleTensor { .. } => {
                            FailureReport::new(codes::BAD_REQUEST, e.to_string())
                        }
                        e => fail(e),
                    })?;
                Ok(ControlReply::new(0))
            }
            ControlCommand::CommittedBytesOn { chip } => Ok(ControlReply::new(
                self.worker
                    .committed_device_memory(chip as usize)
                    .map_err(fail)?,
            )),
            ControlCommand::FreeBytesOn { chip } => Ok(ControlReply::new(
                self.worker
                    .device_memory_info(chip as usize)
                    .map_err(fail)?
                    .0,
            )),
            ControlCommand::Allocate { .. }
            | ControlCommand::CommittedBytes
            | ControlCommand::FreeBytes => Err(FailureReport::new(
                codes::UNSUPPORTED,
                format!(
                    "a level-3 worker child does not take control command {} ({}): device memory belongs to its chips; name one",
                    req.command,
                    command.name()
                ),
            )),
        }
    }
}

impl Drop for NestedHandler {
    fn drop(&mut self) {
        let _ = self.worker.close();
    }
}
