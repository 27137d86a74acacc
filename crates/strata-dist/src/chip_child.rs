//! The chip child: the `ChildProgram` strata-dist gives strata-host for each chip of a
//! level-3 worker — a `ChipWorker` serving chip orchestrations and device-memory control.
//! (The other child program of the engine, a nested level-3 worker, runs a `DistWorker`
//! and lives with it, in `worker/nested.rs`.)

use crate::control::{ControlCommand, ControlDecodeError, CopyDirection};
use std::sync::Arc;
use strata_chip::{ChipConfig, ChipWorker, ExternalMemory, OrchHandle, RunArgs};
use strata_host::{ChildEnv, ChildProgram, SharedMemory};
use strata_mailbox::{
    codes, ControlReply, ControlRequest, FailureReport, Handler, TaskRequest, TaskSlot,
};
use strata_types::trace::Trace;
use strata_types::TaskArgs;

/// A chip child: hosts one `ChipWorker` (created and started inside the child, after the
/// fork).
pub(crate) struct ChipChild {
    index: usize,
    config: ChipConfig,
    registry: strata_chip::Registry,
    /// This chip's rank in the comm arena, installed as its kernels' comm context, and
    /// the arena's shared-memory region (attached as the chip's external memory).
    rank: Option<(strata_comm::RankContext, u64)>,
}

impl ChipChild {
    pub(crate) fn new(
        index: usize,
        config: ChipConfig,
        registry: strata_chip::Registry,
        rank: Option<(strata_comm::RankContext, u64)>,
    ) -> Self {
        ChipChild {
            index,
            config,
            registry,
            rank,
        }
    }
}

impl ChildProgram for ChipChild {
    fn label(&self) -> String {
        format!("chip_process dev={}", self.index)
    }

    fn start(self: Box<Self>, env: &ChildEnv) -> Result<Box<dyn Handler + Send>, String> {
        let mut config = self.config;
        config.chip_id = self.index as u32;
        // A forked chip process is watched by this engine (it reports the process's end),
        // so its orchestrations can run on the serving thread: one hand-off less per run.
        // In Threads mode the chip shares the user's process, which a stall must not end:
        // it keeps its orchestrator thread whatever the configuration says.
        config.orchestrator = match env.mode {
            strata_host::ExecMode::Process => config.orchestrator.resolve(true),
            strata_host::ExecMode::Threads => strata_chip::OrchestratorPlacement::Thread,
        };
        let mut chip =
            ChipWorker::with_registry(config, self.registry).map_err(|e| e.to_string())?;
        if let Some((rank, region)) = self.rank {
            // The comm arena is the chip's external memory: a window argument (a tensor in
            // the arena's region) reaches its kernels in place, at device address
            // EXTERNAL_BASE + its arena offset.
            let arena = rank.arena().clone();
            // SAFETY: the arena is a page-aligned MAP_SHARED mapping of the worker's shared
            // memory, mapped in this process for its whole life (the `Arc` keeps the
            // description alive too); peers touch it only through atomics and raw copies,
            // as the kernels here do (strata-comm).
            let ext =
                unsafe { ExternalMemory::new(region, arena.base_ptr(), arena.len() as u64, arena) }
                    .map_err(|e| e.to_string())?;
            chip.attach_external_memory(ext)
                .map_err(|e| e.to_string())?;
            chip.set_comm_context(Some(Arc::new(rank)));
        }
        if env.mode == strata_host::ExecMode::Threads {
            // A thread that stands for a process: its spans carry its thread id, so the
            // chips of one process stay apart (ranks are told apart by pid).
            // SAFETY: gettid has no preconditions and cannot fail.
            let tid = unsafe { libc::gettid() };
            chip.set_trace_pid(tid as u32);
        }
        chip.init().map_err(|e| e.to_string())?;
        Ok(Box::new(ChipHandler {
            chip,
            shared: env.shared.clone(),
            worker: self.index as u32,
            label: format!("chip_process dev={}", self.index),
            trace: None,
            reply: Vec::new(),
        }))
    }
}

struct ChipHandler {
    chip: ChipWorker,
    shared: Arc<SharedMemory>,
    worker: u32,
    /// This chip's name in traces (its label).
    label: String,
    /// The trace of the task just run, if it was traced (sent with its completion).
    trace: Option<Trace>,
    /// Its encoding, bounded by the frame's room.
    reply: Vec<u8>,
}

fn bad(msg: impl Into<String>) -> FailureReport {
    FailureReport::new(codes::BAD_REQUEST, msg)
}

impl ChipHandler {
    fn run_args(&self, args: &TaskArgs) -> Result<RunArgs<'static>, FailureReport> {
        let shared = &self.shared;
        // SAFETY: `ptr` checks that each view's whole span lies in a region mapped in this
        // process (mappings live as long as the process); the engine dispatched this task
        // only after every conflicting task finished, so nothing writes these bytes
        // during the run. (Windows — the comm arena's region — are not mapped this way:
        // the chip passes them in place as its external memory, never as slices.)
        unsafe {
            RunArgs::from_task_args(
                args,
                &self.chip,
                Some(self.worker),
                |region, offset, len| shared.ptr(region, offset, len).map_err(|e| e.to_string()),
            )
        }
        .map_err(|e| bad(e.to_string()))
    }
}

impl Handler for ChipHandler {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        self.trace = None;
        let mut run = self.run_args(req.args)?;
        let report = self
            .chip
            .run(&OrchHandle::from_id(req.callable), &mut run, req.config)
            .map_err(|e| {
                // The wait-for state travels as data beside the one-line message.
                FailureReport::new(e.code().unwrap_or(codes::FAILED), e.headline())
                    .with_wait_for(e.wait_for().cloned())
            })?;
        if req.config.traced() {
            let mut t = Trace::default();
            let p = t.process_mut(&self.label, 0, "");
            report.add_to(p);
            if let Some(s) = p.spans.first() {
                p.pid = s.pid;
                let tid = s.tid;
                p.name_thread(tid, "chip host thread (chip.run)");
            }
            self.trace = Some(t);
        }
        Ok(())
    }

    fn reply(&mut self, _slot: TaskSlot, room: usize) -> &[u8] {
        self.reply = match self.trace.take() {
            Some(t) => t.encode_bounded(room),
            None => Vec::new(),
        };
        &self.reply
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
        serve_chip_control(&self.chip, &self.shared, req)
    }
}

/// What a chip child does with a control frame its parent wrote: decode the request
/// ([`ControlCommand::from_request`]), bounds-check its device address and shared-memory
/// range, and carry it out on `chip`. The chip child's handler is exactly this; it is
/// public (hidden) so the fuzz harness (`fuzz/`) drives the same code with hostile bytes.
///
/// # Errors
/// The [`FailureReport`] the child reports: [`codes::UNSUPPORTED`] for an unknown command,
/// [`codes::BAD_REQUEST`] for a malformed or out-of-bounds one, [`codes::FAILED`] for a
/// chip error.
#[doc(hidden)]
pub fn serve_chip_control(
    chip: &ChipWorker,
    shared: &SharedMemory,
    req: &ControlRequest<'_>,
) -> Result<ControlReply, FailureReport> {
    let fail = |e: strata_chip::ChipError| FailureReport::new(codes::FAILED, e.to_string());
    let command = ControlCommand::from_request(req).map_err(|e| match e {
        ControlDecodeError::UnknownCommand(c) => FailureReport::new(
            codes::UNSUPPORTED,
            format!("chip children do not support control command {c}"),
        ),
        malformed => bad(malformed.to_string()),
    })?;
    match command {
        ControlCommand::Allocate { bytes } => {
            Ok(ControlReply::new(chip.malloc(bytes).map_err(fail)?.addr()))
        }
        ControlCommand::Free { addr } => {
            let (ptr, _) = chip_allocation(chip, addr)?;
            chip.free(ptr).map_err(fail)?;
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
            let (base, size) = chip_allocation(chip, addr)?;
            if dev_offset.checked_add(len).is_none_or(|end| end > size) {
                return Err(bad(format!(
                    "copy of {len} bytes at byte {dev_offset} of a {size}-byte allocation at {addr:#x} leaves the allocation"
                )));
            }
            if direction == CopyDirection::FromDevice && shared.is_read_only(region) {
                return Err(bad(format!(
                    "copy from the device into shared-memory region {region}, which was handed over read-only"
                )));
            }
            let host = shared
                .ptr(region, offset, len)
                .map_err(|e| bad(e.to_string()))?;
            let base = base.offset(dev_offset);
            // SAFETY: `ptr` checked the host range against the mapped region; the
            // parent issues control commands only while no task of this worker runs,
            // so nothing else touches either range.
            unsafe {
                match direction {
                    CopyDirection::ToDevice => chip.copy_to_raw(base, host, len).map_err(fail)?,
                    CopyDirection::FromDevice => {
                        chip.copy_from_raw(host, base, len).map_err(fail)?
                    }
                }
            }
            Ok(ControlReply::new(0))
        }
        ControlCommand::CommittedBytes => Ok(ControlReply::new(
            chip.committed_device_memory().map_err(fail)?,
        )),
        ControlCommand::FreeBytes => Ok(ControlReply::new(
            chip.device_memory_info().map_err(fail)?.0,
        )),
        ControlCommand::AllocateOn { .. }
        | ControlCommand::CommittedBytesOn { .. }
        | ControlCommand::FreeBytesOn { .. } => Err(FailureReport::new(
            codes::UNSUPPORTED,
            format!(
                "a chip child does not take control command {} ({}): it names a chip of a level-3 worker",
                req.command,
                command.name()
            ),
        )),
    }
}

/// The allocation that starts at device address `addr`: its pointer and size.
fn chip_allocation(
    chip: &ChipWorker,
    addr: u64,
) -> Result<(strata_chip::DevicePtr, u64), FailureReport> {
    let view = strata_types::TensorView::contiguous(strata_types::DataType::U8, &[1])
        .map_err(|e| bad(e.to_string()))?;
    let t = chip
        .device_tensor_at(addr, view)
        .map_err(|e| bad(e.to_string()))?;
    Ok((t.ptr(), t.nbytes()))
}
