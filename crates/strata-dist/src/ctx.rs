//! What the orchestration facade and the device-memory control paths need of a running
//! worker, on the caller's side of the scheduler: the children's kinds and labels, the
//! shared memory, the comm state, and the chip tensors allocated so far.
//!
//! The registered callables are not here: a host orchestration is a callable that takes
//! an `Orch`, so holding them would tie this module into the orchestration ↔ registry
//! knot; the worker hands them to each `Orch` beside this context.

use crate::control::{ControlCommand, CopyDirection};
use crate::endpoint::ChildKind;
use crate::error::DistError;
use crate::sched::{ControlFailure, ControlJob, Link};
use crate::tensor::ChildTensor;
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use strata_graph::RING_COUNT;
use strata_host::{SharedMemory, SharedTensor};
use strata_types::{
    BufferDesc, BufferIdentity, BufferLocation, DataType, IdentityMinter, TensorView,
};

/// A running worker, as its orchestrations and control calls see it.
pub(crate) struct Ctx {
    pub(crate) link: Arc<Link>,
    /// The next-level children's kinds (index = worker id), as their endpoints carry them.
    pub(crate) next: Vec<ChildKind>,
    pub(crate) labels: Vec<String>,
    pub(crate) n_subs: usize,
    /// Shared-memory regions with ids up to this one (ids start at 1) existed when the
    /// children started, so every child maps them.
    pub(crate) visible_regions: u64,
    pub(crate) heap_regions: [u64; RING_COUNT],
    pub(crate) shared: Arc<SharedMemory>,
    /// The chips' comm arena (level 3 with chips).
    pub(crate) comm: Option<crate::comm::CommCtx>,
    pub(crate) minter: Arc<IdentityMinter>,
    /// Live chip tensors: identity → (worker, device address, bytes).
    pub(crate) child_tensors: Mutex<HashMap<BufferIdentity, (usize, u64, u64)>>,
}

impl Ctx {
    pub(crate) fn region_visible(&self, region: u64) -> bool {
        (1..=self.visible_regions).contains(&region)
    }

    /// Runs a control request on lane `lane` through the scheduler; the reply word.
    pub(crate) fn control(&self, lane: usize, command: ControlCommand) -> Result<u64, DistError> {
        let (tx, rx) = mpsc::channel();
        self.link.push_control(ControlJob {
            lane,
            command,
            reply: tx,
        });
        let worker = || self.labels.get(lane).cloned().unwrap_or_default();
        // The scheduler answers every request it takes in (within the control deadline
        // once the child is idle). A loop that broke (a pass panicked) takes in nothing
        // more and leaves the worker unusable: stop waiting then, after one more slice for
        // a reply already on its way.
        let mut unusable_seen = false;
        let r = loop {
            match rx.recv_timeout(crate::sched::BROKEN_CHECK) {
                Ok(r) => break r,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(DistError::Control {
                        worker: worker(),
                        message: "the scheduler stopped before answering".into(),
                    })
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(why) = self.link.unusable() {
                        if unusable_seen {
                            return Err(DistError::Unusable(why));
                        }
                        unusable_seen = true;
                    }
                }
            }
        };
        r.map_err(|e| match e {
            ControlFailure::Failed(message) => DistError::Control {
                worker: worker(),
                message,
            },
            ControlFailure::Unresponsive { message, after } => DistError::Unresponsive {
                worker: worker(),
                message,
                after,
            },
        })
    }

    fn chip_lane(&self, worker: usize) -> Result<usize, DistError> {
        match self.next.get(worker) {
            Some(ChildKind::Chip) => Ok(worker),
            Some(ChildKind::Worker | ChildKind::Sub) => Err(DistError::InvalidArgs(format!(
                "worker {worker} is a level-3 worker, not a chip; device memory belongs to chips"
            ))),
            None => Err(DistError::UnknownWorker {
                id: worker,
                count: self.next.len(),
            }),
        }
    }

    pub(crate) fn alloc_child_tensor(
        &self,
        worker: usize,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<ChildTensor, DistError> {
        let lane = self.chip_lane(worker)?;
        let view = TensorView::contiguous(dtype, shape)?;
        let addr = self.control(
            lane,
            ControlCommand::Allocate {
                bytes: view.nbytes(),
            },
        )?;
        let identity = self.minter.mint();
        // SAFETY: the chip's allocator just gave these bytes to this allocation alone; the
        // fresh identity is recorded with its extent, and tasks naming it are admitted only
        // while it is live (`child_tensor_live`).
        let buffer = unsafe {
            BufferDesc::from_parts(
                identity,
                view.nbytes(),
                BufferLocation::Device {
                    worker: worker as u32,
                    addr,
                },
            )
        };
        let t = ChildTensor {
            worker,
            addr,
            buffer,
            view,
        };
        self.child_tensors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(identity, (worker, addr, view.nbytes()));
        Ok(t)
    }

    pub(crate) fn free_child_tensor(&self, t: ChildTensor) -> Result<(), DistError> {
        let lane = self.chip_lane(t.worker)?;
        let removed = self
            .child_tensors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&t.buffer.identity());
        if removed != Some((t.worker, t.addr, t.buffer.nbytes())) {
            return Err(DistError::InvalidArgs(format!(
                "the tensor at device address {:#x} of worker {} is not a live allocation of this worker (double free, or allocated elsewhere)",
                t.addr, t.worker
            )));
        }
        self.control(lane, ControlCommand::Free { addr: t.addr })?;
        Ok(())
    }

    pub(crate) fn copy(
        &self,
        dev: &ChildTensor,
        host: &SharedTensor,
        direction: CopyDirection,
    ) -> Result<(), DistError> {
        let lane = self.chip_lane(dev.worker)?;
        if !self.child_tensor_live(
            &dev.buffer.identity(),
            dev.worker,
            dev.addr,
            dev.buffer.nbytes(),
        ) {
            return Err(DistError::InvalidArgs(format!(
                "device tensor {:#x} of worker {} was freed",
                dev.addr, dev.worker
            )));
        }
        let hb = host.buffer();
        let BufferLocation::HostShared { region, offset } = hb.location() else {
            return Err(DistError::InvalidArgs(
                "the host end must be a SharedTensor".into(),
            ));
        };
        if !self.region_visible(region) {
            return Err(DistError::InvalidArgs(
                "the shared tensor was created after this worker started its children; create it before init()".into(),
            ));
        }
        self.shared.ptr(region, offset, host.nbytes())?;
        let n = dev.view.nbytes();
        if host.nbytes() != n {
            return Err(DistError::InvalidArgs(format!(
                "copy between tensors of different sizes: device {n} bytes, host {} bytes",
                host.nbytes()
            )));
        }
        let command = ControlCommand::Copy {
            direction,
            addr: dev.addr,
            dev_offset: 0,
            region,
            offset,
            len: n,
        };
        self.control(lane, command)?;
        Ok(())
    }

    /// Copies `len` bytes between chip tensor `dev`, from its byte `dev_offset` on, and
    /// bytes `[offset, offset + len)` of shared-memory region `region` (which every child
    /// maps): one control request, the chip reads or writes the region in place.
    pub(crate) fn copy_range(
        &self,
        dev: &ChildTensor,
        dev_offset: u64,
        region: u64,
        offset: u64,
        len: u64,
        direction: CopyDirection,
    ) -> Result<(), DistError> {
        let lane = self.chip_lane(dev.worker)?;
        if !self.child_tensor_live(
            &dev.buffer.identity(),
            dev.worker,
            dev.addr,
            dev.buffer.nbytes(),
        ) {
            return Err(DistError::StaleTensor {
                index: 0,
                reason: format!(
                    "device tensor {:#x} of worker {} is not a live allocation of this worker (freed, or allocated by another worker)",
                    dev.addr, dev.worker
                ),
            });
        }
        let size = dev.buffer.nbytes();
        if dev_offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(DistError::InvalidArgs(format!(
                "a copy of {len} bytes at device offset {dev_offset} leaves the {size}-byte tensor (offset + bytes must be at most {size})"
            )));
        }
        if !self.region_visible(region) {
            return Err(DistError::InvalidArgs(format!(
                "shared-memory region {region} was created after this worker started its children, which do not map it; create it before init()"
            )));
        }
        self.shared.ptr(region, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.control(
            lane,
            ControlCommand::Copy {
                direction,
                addr: dev.addr,
                dev_offset,
                region,
                offset,
                len,
            },
        )?;
        Ok(())
    }

    pub(crate) fn committed_device_memory(&self, worker: usize) -> Result<u64, DistError> {
        let lane = self.chip_lane(worker)?;
        self.control(lane, ControlCommand::CommittedBytes)
    }

    pub(crate) fn child_tensor_live(
        &self,
        identity: &BufferIdentity,
        worker: usize,
        addr: u64,
        nbytes: u64,
    ) -> bool {
        self.child_tensors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(identity)
            .is_some_and(|&(w, base, n)| w == worker && addr == base && n == nbytes)
    }
}
