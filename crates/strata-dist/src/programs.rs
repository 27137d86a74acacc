//! The child programs strata-dist supplies to strata-host: a chip child (a `ChipWorker`
//! serving chip orchestrations and device-memory control) and a nested level-3 worker
//! (serving host orchestrations for a level-4 parent).

use crate::orch::ctrl;
use crate::registry::HostOrchHandle;
use crate::worker::DistWorker;
use std::sync::Arc;
use strata_chip::{ChipConfig, ChipWorker, OrchHandle, RunArgs};
use strata_host::{ChildEnv, ChildProgram, SharedMemory};
use strata_mailbox::{codes, ControlReply, ControlRequest, Failure, Handler, TaskRequest};
use strata_types::{BufferLocation, TaskArgs};

/// A chip child: hosts one `ChipWorker` (created and started inside the child, after the
/// fork).
pub(crate) struct ChipChild {
    index: usize,
    config: ChipConfig,
    registry: strata_chip::Registry,
    /// This chip's rank in the comm arena, installed as its kernels' comm context.
    rank: Option<strata_comm::RankContext>,
}

impl ChipChild {
    pub(crate) fn new(
        index: usize,
        config: ChipConfig,
        registry: strata_chip::Registry,
        rank: Option<strata_comm::RankContext>,
    ) -> Self {
        ChipChild {
            index,
            config,
            registry,
            rank,
        }
    }
}

/// How a chip child's label starts.
pub(crate) const CHIP_LABEL: &str = "chip_process";

impl ChildProgram for ChipChild {
    fn label(&self) -> String {
        format!("{CHIP_LABEL} dev={}", self.index)
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
        if let Some(rank) = self.rank {
            chip.set_comm_context(Some(Arc::new(rank)));
        }
        chip.init().map_err(|e| e.to_string())?;
        Ok(Box::new(ChipHandler {
            chip,
            shared: env.shared.clone(),
            worker: self.index as u32,
        }))
    }
}

struct ChipHandler {
    chip: ChipWorker,
    shared: Arc<SharedMemory>,
    worker: u32,
}

fn bad(msg: impl Into<String>) -> Failure {
    Failure::new(codes::BAD_REQUEST, msg)
}

impl ChipHandler {
    fn run_args(&self, args: &TaskArgs) -> Result<RunArgs<'static>, Failure> {
        let mut run = RunArgs::new();
        for (i, t) in args.tensors().iter().enumerate() {
            match t.buffer.location {
                BufferLocation::HostShared { region, offset } => {
                    let span = t.view.byte_span().1;
                    let base = self
                        .shared
                        .ptr(region, offset, span)
                        .map_err(|e| bad(format!("tensor {i}: {e}")))?;
                    // SAFETY: `ptr` checked that the view's whole span lies in the mapped
                    // region; the engine dispatched this task only after every conflicting
                    // task finished, so nothing writes these bytes during the run.
                    unsafe { run.host_raw(base, t.view, t.tag) };
                }
                BufferLocation::Device { worker, addr } => {
                    if worker != self.worker {
                        return Err(bad(format!(
                            "tensor {i} is in the device memory of worker {worker}, not this chip ({})",
                            self.worker
                        )));
                    }
                    let dt = self
                        .chip
                        .device_tensor_at(addr, t.view)
                        .map_err(|e| bad(format!("tensor {i}: {e}")))?;
                    run.device(&dt, t.tag);
                }
                BufferLocation::HostLocal { .. } => {
                    return Err(bad(format!(
                    "tensor {i} is in the parent's private memory, which this process cannot see"
                )))
                }
            }
        }
        for &s in args.scalars() {
            run.scalar(s);
        }
        Ok(run)
    }
}

impl Handler for ChipHandler {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), Failure> {
        let mut run = self.run_args(req.args)?;
        self.chip
            .run(&OrchHandle::from_id(req.callable), &mut run, req.config)
            .map(|_| ())
            .map_err(|e| Failure::new(e.code().unwrap_or(codes::FAILED), e.to_string()))
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, Failure> {
        let fail = |e: strata_chip::ChipError| Failure::new(codes::FAILED, e.to_string());
        let words = |p: &[u8]| -> Result<[u64; 4], Failure> {
            if p.len() != 32 {
                return Err(bad(format!(
                    "copy payload is {} bytes, expected 32",
                    p.len()
                )));
            }
            let mut w = [0u64; 4];
            for (i, c) in p.chunks_exact(8).enumerate() {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                w[i] = u64::from_le_bytes(b);
            }
            Ok(w)
        };
        match req.command {
            ctrl::MALLOC => Ok(ControlReply::new(
                self.chip.malloc(req.arg0).map_err(fail)?.addr(),
            )),
            ctrl::FREE => {
                let (ptr, _) = self.allocation(req.arg0)?;
                self.chip.free(ptr).map_err(fail)?;
                Ok(ControlReply::new(0))
            }
            ctrl::COPY_TO | ctrl::COPY_FROM => {
                let [addr, region, offset, n] = words(req.payload)?;
                let (base, size) = self.allocation(addr)?;
                if n > size {
                    return Err(bad(format!(
                        "copy of {n} bytes into a {size}-byte allocation at {addr:#x}"
                    )));
                }
                let host = self
                    .shared
                    .ptr(region, offset, n)
                    .map_err(|e| bad(e.to_string()))?;
                // SAFETY: `ptr` checked the host range against the mapped region; the
                // parent issues control commands only while no task of this worker runs,
                // so nothing else touches either range.
                unsafe {
                    if req.command == ctrl::COPY_TO {
                        self.chip.copy_to_raw(base, host, n).map_err(fail)?;
                    } else {
                        self.chip.copy_from_raw(host, base, n).map_err(fail)?;
                    }
                }
                Ok(ControlReply::new(0))
            }
            ctrl::COMMITTED => Ok(ControlReply::new(
                self.chip.committed_device_memory().map_err(fail)?,
            )),
            c => Err(Failure::new(
                codes::UNSUPPORTED,
                format!("chip children do not support control command {c}"),
            )),
        }
    }
}

impl ChipHandler {
    fn allocation(&self, addr: u64) -> Result<(strata_chip::DevicePtr, u64), Failure> {
        let view = strata_types::TensorView::contiguous(strata_types::DataType::U8, &[1])
            .map_err(|e| bad(e.to_string()))?;
        let t = self
            .chip
            .device_tensor_at(addr, view)
            .map_err(|e| bad(e.to_string()))?;
        Ok((t.ptr(), t.nbytes()))
    }
}

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
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), Failure> {
        let handle = HostOrchHandle { id: req.callable };
        self.worker
            .run_with(&handle, req.args, req.config)
            .map_err(|e| Failure::new(codes::FAILED, e.to_string()))
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, Failure> {
        Err(Failure::new(
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
