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
use std::collections::{HashMap, VecDeque};
use std::sync::{mpsc, Arc, Mutex};
use strata_chip::DeviceTensor;
use strata_graph::RING_COUNT;
use strata_host::{SharedMemory, SharedTensor};
use strata_types::{BufferIdentity, BufferLocation, DataType, IdentityMinter, TensorView};

/// How a copy between host memory and a chip tensor went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPath {
    /// Straight between the host memory and the device: the host bytes lie in memory every
    /// child maps (an adopted shared mapping), or there were none.
    InPlace,
    /// Through the worker's staging memory, in chunks.
    Staged,
}

/// A control request on its way ([`Ctx::control_post`]).
pub(crate) struct PendingControl {
    lane: usize,
    rx: mpsc::Receiver<Result<u64, ControlFailure>>,
}

impl PendingControl {
    /// Waits for the reply word.
    pub(crate) fn wait(self, ctx: &Ctx) -> Result<u64, DistError> {
        let worker = || ctx.labels.get(self.lane).cloned().unwrap_or_default();
        // The scheduler answers every request it takes in (within the control deadline
        // once the child is idle). A loop that broke (a pass panicked) takes in nothing
        // more and leaves the worker unusable: stop waiting then, after one more slice for
        // a reply already on its way.
        let mut unusable_seen = false;
        let r = loop {
            match self.rx.recv_timeout(crate::sched::BROKEN_CHECK) {
                Ok(r) => break r,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(DistError::Control {
                        worker: worker(),
                        message: "the scheduler stopped before answering".into(),
                    })
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(why) = ctx.link.unusable() {
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
}

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
    /// The staging region for copies between ordinary host memory and chip tensors, and
    /// the size of each of its two halves (`None` if `DistConfig::staging_bytes` is 0).
    pub(crate) staging: Option<(u64, u64)>,
    /// Each next-level chip's device capacity (`ChipConfig::device_memory_bytes`).
    pub(crate) device_capacity: Vec<u64>,
    /// Each local level-3 worker child's chips' device capacities (level 4; by worker
    /// id): how many chips it has, and what each card holds.
    pub(crate) nested_capacity: HashMap<usize, Vec<u64>>,
    /// Live chip tensors: identity → (worker, device address, bytes). Under a level-4
    /// worker the worker is a level-3 child and the address the handle it gave.
    pub(crate) child_tensors: Mutex<HashMap<BufferIdentity, (usize, u64, u64)>>,
}

impl Ctx {
    pub(crate) fn region_visible(&self, region: u64) -> bool {
        (1..=self.visible_regions).contains(&region)
    }

    /// Runs a control request on lane `lane` through the scheduler; the reply word.
    pub(crate) fn control(&self, lane: usize, command: ControlCommand) -> Result<u64, DistError> {
        self.control_post(lane, command).wait(self)
    }

    /// Queues a control request on lane `lane` without waiting for its reply: the caller
    /// may prepare the next request meanwhile (a staged copy fills its other half while
    /// the child copies this one), then [`PendingControl::wait`]s.
    pub(crate) fn control_post(&self, lane: usize, command: ControlCommand) -> PendingControl {
        let (tx, rx) = mpsc::channel();
        self.link.push_control(ControlJob {
            lane,
            command,
            reply: tx,
        });
        PendingControl { lane, rx }
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

    /// The lane of a next-level child whose chips' memory this worker may name: a chip,
    /// or (level 4) a local level-3 worker child, which resolves the handles it gave. A
    /// remote level-3 child's memory goes through its session, never through here.
    fn memory_lane(&self, worker: usize) -> Result<usize, DistError> {
        match self.next.get(worker) {
            Some(ChildKind::Chip) => Ok(worker),
            Some(ChildKind::Worker) if self.nested_capacity.contains_key(&worker) => Ok(worker),
            Some(ChildKind::Worker) => Err(DistError::InvalidArgs(format!(
                "worker {worker} is a remote level-3 worker: its chips' memory goes through strata_net::RemoteWorker"
            ))),
            Some(ChildKind::Sub) => Err(DistError::InvalidArgs(format!(
                "worker {worker} is a sub-worker; device memory belongs to chips"
            ))),
            None => Err(DistError::UnknownWorker {
                id: worker,
                count: self.next.len(),
            }),
        }
    }

    /// Whether next-level child `worker` is a remote level-3 worker (level 4).
    pub(crate) fn is_remote_worker(&self, worker: usize) -> bool {
        matches!(self.next.get(worker), Some(ChildKind::Worker))
            && !self.nested_capacity.contains_key(&worker)
    }

    /// A local level-3 worker child's lane and its chip `chip` as the wire's number.
    fn nested_chip(&self, worker: usize, chip: usize) -> Result<(usize, u32), DistError> {
        let Some(capacity) = self.nested_capacity.get(&worker) else {
            return Err(match self.next.get(worker) {
                None => DistError::UnknownWorker {
                    id: worker,
                    count: self.next.len(),
                },
                Some(ChildKind::Worker) => DistError::InvalidArgs(format!(
                    "worker {worker} is a remote level-3 worker: its chips' memory goes through strata_net::RemoteWorker"
                )),
                Some(_) => DistError::InvalidArgs(format!(
                    "worker {worker} is not a level-3 worker child; name a chip of one (alloc_child_tensor takes this worker's own chips)"
                )),
            });
        };
        match u32::try_from(chip) {
            Ok(c) if chip < capacity.len() => Ok((worker, c)),
            _ => Err(DistError::InvalidArgs(format!(
                "level-3 worker {worker} has {} chips (0..{}); there is no chip {chip}",
                capacity.len(),
                capacity.len()
            ))),
        }
    }

    /// Allocates a tensor on chip `chip` of local level-3 worker child `worker` (level
    /// 4): the child allocates it and replies with a handle, which the returned tensor
    /// carries as its address (`worker()` is the child).
    pub(crate) fn alloc_nested_tensor(
        &self,
        worker: usize,
        chip: usize,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<DeviceTensor, DistError> {
        let (lane, chip) = self.nested_chip(worker, chip)?;
        let view = TensorView::contiguous(dtype, shape)?;
        let handle = self.control(
            lane,
            ControlCommand::AllocateOn {
                chip,
                bytes: view.nbytes(),
            },
        )?;
        Ok(self.admit(worker, handle, view))
    }

    /// Records a fresh allocation of next-level child `worker` at `addr` and returns its
    /// handle.
    fn admit(&self, worker: usize, addr: u64, view: TensorView) -> DeviceTensor {
        let identity = self.minter.mint();
        // SAFETY: the child just gave these bytes (`view.nbytes()` of them, at `addr` —
        // a device address, or the handle a level-3 child resolves) to this allocation
        // alone; the handle's identity is recorded with its extent, and tasks and copies
        // naming it are admitted only while it is live (`child_tensor_live`).
        let t = unsafe {
            DeviceTensor::from_raw_parts(
                identity.owner().0,
                identity.buffer_id(),
                worker as u32,
                addr,
                view.nbytes(),
                view,
            )
        };
        self.child_tensors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(t.identity(), (worker, addr, view.nbytes()));
        t
    }

    /// `(free, total)` bytes of chip `chip` of local level-3 worker child `worker`.
    pub(crate) fn nested_memory_info(
        &self,
        worker: usize,
        chip: usize,
    ) -> Result<(u64, u64), DistError> {
        let (lane, c) = self.nested_chip(worker, chip)?;
        let free = self.control(lane, ControlCommand::FreeBytesOn { chip: c })?;
        Ok((free, self.nested_capacity[&worker][chip]))
    }

    /// Bytes the allocator of chip `chip` of local level-3 worker child `worker` holds.
    pub(crate) fn nested_committed(&self, worker: usize, chip: usize) -> Result<u64, DistError> {
        let (lane, c) = self.nested_chip(worker, chip)?;
        self.control(lane, ControlCommand::CommittedBytesOn { chip: c })
    }

    pub(crate) fn alloc_child_tensor(
        &self,
        worker: usize,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<DeviceTensor, DistError> {
        let lane = self.chip_lane(worker)?;
        let view = TensorView::contiguous(dtype, shape)?;
        let addr = self.control(
            lane,
            ControlCommand::Allocate {
                bytes: view.nbytes(),
            },
        )?;
        Ok(self.admit(worker, addr, view))
    }

    pub(crate) fn free_child_tensor(&self, t: DeviceTensor) -> Result<(), DistError> {
        let (worker, addr) = (t.worker() as usize, t.ptr().addr());
        let lane = self.memory_lane(worker)?;
        let mut live = self.child_tensors.lock().unwrap_or_else(|e| e.into_inner());
        if live.get(&t.identity()) != Some(&(worker, addr, t.nbytes())) {
            return Err(DistError::InvalidArgs(format!(
                "the tensor at device address {addr:#x} of worker {worker} is not a live allocation of this worker (double free, or allocated elsewhere)"
            )));
        }
        live.remove(&t.identity());
        drop(live);
        self.control(lane, ControlCommand::Free { addr })?;
        Ok(())
    }

    /// Checks that `dev` is a live chip tensor of this worker and that `len` bytes from
    /// its byte `dev_offset` on stay inside it; returns its chip's lane.
    fn check_device_range(
        &self,
        dev: &DeviceTensor,
        dev_offset: u64,
        len: u64,
    ) -> Result<usize, DistError> {
        let (worker, addr) = (dev.worker() as usize, dev.ptr().addr());
        let lane = self.memory_lane(worker)?;
        if !self.child_tensor_live(&dev.identity(), worker, addr, dev.nbytes()) {
            return Err(DistError::StaleTensor {
                index: 0,
                reason: format!(
                    "device tensor {addr:#x} of worker {worker} is not a live allocation of this worker (freed, or allocated by another worker)"
                ),
            });
        }
        let size = dev.nbytes();
        if dev_offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(DistError::InvalidArgs(format!(
                "a copy of {len} bytes at device offset {dev_offset} leaves the {size}-byte tensor (offset + bytes must be at most {size})"
            )));
        }
        Ok(lane)
    }

    /// Copies between a whole chip tensor and a shared tensor of the same byte size.
    pub(crate) fn copy(
        &self,
        dev: &DeviceTensor,
        host: &SharedTensor,
        direction: CopyDirection,
    ) -> Result<(), DistError> {
        let n = dev.view().nbytes();
        let lane = self.check_device_range(dev, 0, n)?;
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
        if host.nbytes() != n {
            return Err(DistError::InvalidArgs(format!(
                "copy between tensors of different sizes: device {n} bytes, host {} bytes",
                host.nbytes()
            )));
        }
        self.control(
            lane,
            ControlCommand::Copy {
                direction,
                addr: dev.ptr().addr(),
                dev_offset: 0,
                region,
                offset,
                len: n,
            },
        )?;
        Ok(())
    }

    /// The shared-memory region a host byte range can be copied in place from (or into,
    /// if `write`): an adopted mapping every child inherited that holds all of it.
    fn in_place(
        &self,
        addr: usize,
        len: usize,
        write: bool,
    ) -> Result<Option<(u64, u64)>, DistError> {
        let Some((region, offset)) = self.shared.region_containing(addr, len) else {
            return Ok(None);
        };
        if !self.region_visible(region) {
            // Adopted after the children started: they do not map it.
            return Ok(None);
        }
        if write && self.shared.is_read_only(region) {
            let label = self.shared.region_label(region).unwrap_or_default();
            return Err(DistError::InvalidArgs(format!(
                "copy_from into {label}, which was handed to the worker read-only; copy into a writable buffer"
            )));
        }
        Ok(Some((region, offset)))
    }

    /// Copies `src` (ordinary host memory) into chip tensor `dev` from its byte
    /// `dev_offset` on: in place if `src` lies in an adopted mapping every child
    /// inherited, else through the staging region, in halves, so this thread fills one
    /// half while the child copies the other.
    pub(crate) fn copy_bytes_to_device(
        &self,
        dev: &DeviceTensor,
        dev_offset: u64,
        src: &[u8],
    ) -> Result<CopyPath, DistError> {
        let lane = self.check_device_range(dev, dev_offset, src.len() as u64)?;
        if src.is_empty() {
            return Ok(CopyPath::InPlace);
        }
        let copy = |region, offset, dev_offset, len| ControlCommand::Copy {
            direction: CopyDirection::ToDevice,
            addr: dev.ptr().addr(),
            dev_offset,
            region,
            offset,
            len,
        };
        if let Some((region, offset)) = self.in_place(src.as_ptr() as usize, src.len(), false)? {
            self.control(lane, copy(region, offset, dev_offset, src.len() as u64))?;
            return Ok(CopyPath::InPlace);
        }
        let (staging, half) = self.staging()?;
        let mut inflight: VecDeque<PendingControl> = VecDeque::with_capacity(2);
        let mut result = Ok(());
        for (i, chunk) in src.chunks(half as usize).enumerate() {
            // The half this chunk goes to was last used by request i - 2: wait for it.
            if inflight.len() == 2 {
                if let Err(e) = inflight.pop_front().map_or(Ok(0), |p| p.wait(self)) {
                    result = Err(e);
                    break;
                }
            }
            let at = (i as u64 % 2) * half;
            let dst = self.shared.ptr(staging, at, chunk.len() as u64)?;
            // SAFETY: `ptr` checked the range against the staging region; the one request
            // that may read this half was waited for above, and the other request in flight
            // reads the other half.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), dst, chunk.len()) };
            let dev_at = dev_offset + i as u64 * half;
            inflight
                .push_back(self.control_post(lane, copy(staging, at, dev_at, chunk.len() as u64)));
        }
        // Every request is waited for, even after an error: the next copy reuses the halves.
        for p in inflight {
            let r = p.wait(self);
            if result.is_ok() {
                result = r.map(drop);
            }
        }
        result.map(|()| CopyPath::Staged)
    }

    /// Copies chip tensor `dev`'s bytes from `dev_offset` on into `dst` (ordinary host
    /// memory): in place if `dst` lies in a writable adopted mapping every child
    /// inherited, else through the staging region in halves (this thread empties one
    /// half while the child fills the other).
    pub(crate) fn copy_bytes_from_device(
        &self,
        dev: &DeviceTensor,
        dev_offset: u64,
        dst: &mut [u8],
    ) -> Result<CopyPath, DistError> {
        let lane = self.check_device_range(dev, dev_offset, dst.len() as u64)?;
        if dst.is_empty() {
            return Ok(CopyPath::InPlace);
        }
        let copy = |region, offset, dev_offset, len| ControlCommand::Copy {
            direction: CopyDirection::FromDevice,
            addr: dev.ptr().addr(),
            dev_offset,
            region,
            offset,
            len,
        };
        if let Some((region, offset)) = self.in_place(dst.as_ptr() as usize, dst.len(), true)? {
            self.control(lane, copy(region, offset, dev_offset, dst.len() as u64))?;
            return Ok(CopyPath::InPlace);
        }
        let (staging, half) = self.staging()?;
        let total = dst.len();
        let mut inflight: VecDeque<(usize, PendingControl)> = VecDeque::with_capacity(2);
        let mut result = Ok(());
        let drain_one = |inflight: &mut VecDeque<(usize, PendingControl)>,
                         dst: &mut [u8],
                         result: &mut Result<(), DistError>| {
            let Some((j, p)) = inflight.pop_front() else {
                return;
            };
            let r = p.wait(self);
            if result.is_err() {
                return;
            }
            if let Err(e) = r {
                *result = Err(e);
                return;
            }
            let start = j * half as usize;
            let len = (total - start).min(half as usize);
            let at = (j as u64 % 2) * half;
            match self.shared.ptr(staging, at, len as u64) {
                // SAFETY: the request that filled this half was waited for; the request in
                // flight writes the other half.
                Ok(src) => unsafe {
                    std::ptr::copy_nonoverlapping(src, dst[start..].as_mut_ptr(), len)
                },
                Err(e) => *result = Err(e.into()),
            }
        };
        let chunks = total.div_ceil(half as usize);
        for i in 0..chunks {
            if inflight.len() == 2 {
                drain_one(&mut inflight, dst, &mut result);
            }
            if result.is_err() {
                break;
            }
            let start = i * half as usize;
            let len = (total - start).min(half as usize) as u64;
            let at = (i as u64 % 2) * half;
            let dev_at = dev_offset + start as u64;
            inflight.push_back((i, self.control_post(lane, copy(staging, at, dev_at, len))));
        }
        while !inflight.is_empty() {
            drain_one(&mut inflight, dst, &mut result);
        }
        result.map(|()| CopyPath::Staged)
    }

    /// The staging region and the size of each of its two halves.
    fn staging(&self) -> Result<(u64, u64), DistError> {
        self.staging.ok_or_else(|| {
            DistError::InvalidArgs(
                "this worker has no staging memory (DistConfig::staging_bytes = 0): copy from or into a SharedTensor, or an adopted shared mapping".into(),
            )
        })
    }

    /// `(free, total)` bytes of chip `worker`'s emulated card.
    pub(crate) fn device_memory_info(&self, worker: usize) -> Result<(u64, u64), DistError> {
        let lane = self.chip_lane(worker)?;
        let free = self.control(lane, ControlCommand::FreeBytes)?;
        Ok((free, self.device_capacity.get(worker).copied().unwrap_or(0)))
    }

    /// Copies `len` bytes between chip tensor `dev`, from its byte `dev_offset` on, and
    /// bytes `[offset, offset + len)` of shared-memory region `region` (which every child
    /// maps): one control request, the chip reads or writes the region in place.
    pub(crate) fn copy_range(
        &self,
        dev: &DeviceTensor,
        dev_offset: u64,
        region: u64,
        offset: u64,
        len: u64,
        direction: CopyDirection,
    ) -> Result<(), DistError> {
        let lane = self.check_device_range(dev, dev_offset, len)?;
        if !self.region_visible(region) {
            return Err(DistError::InvalidArgs(format!(
                "shared-memory region {region} was created after this worker started its children, which do not map it; create it before init()"
            )));
        }
        if direction == CopyDirection::FromDevice && self.shared.is_read_only(region) {
            return Err(DistError::InvalidArgs(format!(
                "copy from the device into shared-memory region {region}, which was handed to the worker read-only"
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
                addr: dev.ptr().addr(),
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
