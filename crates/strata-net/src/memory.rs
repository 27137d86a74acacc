//! Device memory of a remote level-3 worker's chips, from the root: [`RemoteWorker`]
//! (what [`crate::add_remote_worker`] returns) allocates, frees and copies, and a
//! [`RemoteTensor`] is passed to that worker's tasks like a local chip tensor.
//!
//! The requests travel as CONTROL frames on the session's ordered lane, so the node serves
//! them after every task the root already sent, on the thread that runs tasks; they are
//! only issued while the level-4 worker has no run in flight (as for local chips), so no
//! task of the worker runs while its memory changes. Copies go in pieces that fit the
//! node's staging area, two in flight: the root streams one piece while the node's chip
//! copies the previous one from the staging area into device memory in place (one
//! control request of the level-3 engine, `DistWorker::copy_range`), so the node stages
//! the bytes once.

use crate::client::{ControlWaitError, Pending, Session};
use crate::error::{MemoryFault, NetError};
use crate::wire::Control;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use strata_dist::DistWorker;
use strata_types::{ArgTag, BufferDesc, DataType, TensorArg, TensorView};

/// How long one device-memory request may take before the session is cut.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest piece of a copy: big enough that per-request costs vanish, small enough
/// that two pieces in flight pipeline the network with the chip's copy.
const MAX_PIECE: u64 = 8 << 20;

/// What a [`RemoteWorker`] and the engine's remote child share.
#[derive(Debug, Default)]
pub(crate) struct RemoteLink {
    /// The session, once `init` connected it (weak: the scheduler's endpoint owns it, so
    /// it ends with the level-4 worker whatever handles are left).
    session: Mutex<Weak<Session>>,
    /// The worker's label in messages (address, then pid and host once connected).
    label: Mutex<String>,
    /// Live allocations: the node's handle → (chip, the engine's descriptor).
    live: Mutex<HashMap<u64, (usize, BufferDesc)>>,
    /// Chips of the remote level-3 worker.
    chips: usize,
}

impl RemoteLink {
    pub(crate) fn new(label: String, chips: usize) -> Arc<RemoteLink> {
        let l = RemoteLink {
            chips,
            ..RemoteLink::default()
        };
        *l.label.lock().unwrap_or_else(|e| e.into_inner()) = label;
        Arc::new(l)
    }

    /// The session connected: device-memory requests may go.
    pub(crate) fn connected(&self, s: &Arc<Session>) {
        *self.session.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(s);
        *self.label.lock().unwrap_or_else(|e| e.into_inner()) = s.label.clone();
    }

    fn label(&self) -> String {
        self.label.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A remote level-3 worker, as [`crate::add_remote_worker`] returns it: its worker id
/// (what `submit_next_level` names) and the device memory of its chips.
///
/// Device-memory calls take the level-4 worker (`&mut`): they run only while it is
/// initialised and has no run in flight.
#[derive(Debug, Clone)]
pub struct RemoteWorker {
    id: usize,
    link: Arc<RemoteLink>,
}

/// A tensor in the device memory of one chip of a remote level-3 worker
/// ([`RemoteWorker::alloc`]). Pass it (whole or as a view) to tasks of that worker only;
/// its orchestrations see it as their own chip tensor, on the same chip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteTensor {
    worker: usize,
    chip: usize,
    handle: u64,
    desc: BufferDesc,
    view: TensorView,
}

impl RemoteTensor {
    /// The remote worker (its worker id in the level-4 worker).
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// The chip of that worker whose memory holds it.
    pub fn chip(&self) -> usize {
        self.chip
    }

    /// Its view.
    pub fn view(&self) -> TensorView {
        self.view
    }

    /// Its bytes.
    pub fn nbytes(&self) -> u64 {
        self.desc.nbytes()
    }

    /// The whole tensor as a task argument (for tasks of its worker).
    pub fn arg(&self, tag: ArgTag) -> TensorArg {
        TensorArg {
            buffer: self.desc,
            view: self.view,
            tag,
        }
    }

    /// A view of the tensor as a task argument.
    ///
    /// # Errors
    /// The view does not fit the tensor.
    pub fn arg_view(&self, view: TensorView, tag: ArgTag) -> Result<TensorArg, NetError> {
        TensorArg::new(self.desc, view, tag)
            .map_err(|e| NetError::Dist(strata_dist::DistError::Types(e)))
    }
}

impl RemoteWorker {
    pub(crate) fn new(id: usize, link: Arc<RemoteLink>) -> RemoteWorker {
        RemoteWorker { id, link }
    }

    /// Its worker id in the level-4 worker.
    pub fn id(&self) -> usize {
        self.id
    }

    fn fault(&self, fault: MemoryFault, message: impl Into<String>) -> NetError {
        let label = self.link.label();
        // A session's end reason starts with its label, which `worker` already gives.
        let message = message.into().replacen(&format!("{label}: "), "", 1);
        NetError::DeviceMemory {
            worker: format!("worker {}: {label}", self.id),
            fault,
            message,
        }
    }

    /// `chip` as the wire's chip number, if the worker has it.
    fn chip(&self, chip: usize) -> Result<u32, NetError> {
        match u32::try_from(chip) {
            Ok(c) if chip < self.link.chips => Ok(c),
            _ => Err(self.fault(
                MemoryFault::NoSuchChip,
                format!(
                    "there is no chip {chip}: this remote worker has {} (RemoteSpec::chips)",
                    self.link.chips
                ),
            )),
        }
    }

    /// The session, after checking that `top` may do device-memory work now.
    fn ready(&self, top: &mut DistWorker, op: &'static str) -> Result<Arc<Session>, NetError> {
        top.remote_device_idle(self.id, op)?;
        let s = self
            .link
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .upgrade()
            .ok_or_else(|| {
                self.fault(
                    MemoryFault::NotConnected,
                    format!("{op}: the remote worker is not connected; call init() on the level-4 worker first"),
                )
            })?;
        if let Some(why) = s.dead_reason() {
            return Err(self.fault(
                MemoryFault::SessionLost,
                format!("{op}: the session has ended: {why}"),
            ));
        }
        Ok(s)
    }

    /// Runs device-memory operation `op` against `top`; a loss of the session that it
    /// reports to the caller also makes `top` unusable
    /// ([`DistWorker::remote_child_lost`]), as the scheduler does when it finds a child
    /// dead — so later calls say so, and `close` does not report the loss again, whether
    /// or not the scheduler had seen it first.
    fn settle<T>(
        &self,
        top: &mut DistWorker,
        op: impl FnOnce(&mut DistWorker) -> Result<T, NetError>,
    ) -> Result<T, NetError> {
        let r = op(top);
        if let Err(NetError::DeviceMemory {
            fault: MemoryFault::SessionLost | MemoryFault::Timeout,
            message,
            ..
        }) = &r
        {
            top.remote_child_lost(self.id, &format!("{}: {message}", self.link.label()));
        }
        r
    }

    /// One request without bytes either way, and its result word.
    fn call(&self, s: &Arc<Session>, control: &Control) -> Result<u64, NetError> {
        let p = s
            .post_control(control, &[], None)
            .map_err(|why| self.fault(MemoryFault::SessionLost, why))?;
        Ok(self.wait(p)?.0)
    }

    /// Waits for a request's reply: the result word and how many bytes it brought back.
    fn wait(&self, p: Pending<'_>) -> Result<(u64, u64), NetError> {
        p.wait(Instant::now() + CONTROL_TIMEOUT)
            .map_err(|e| match e {
                ControlWaitError::Refused(why) => self.fault(MemoryFault::Node, why),
                ControlWaitError::Lost(why) => self.fault(
                    MemoryFault::SessionLost,
                    format!("the session ended before the node answered: {why}"),
                ),
                ControlWaitError::Timeout => self.fault(
                    MemoryFault::Timeout,
                    format!("no answer to a device-memory request within {CONTROL_TIMEOUT:?}; the session was cut"),
                ),
            })
    }

    /// Allocates a `shape` × `dtype` tensor in the device memory of chip `chip` of this
    /// remote worker (outside any run).
    ///
    /// # Errors
    /// A run in flight or a worker not initialised; no such chip; the chip's allocator
    /// refused; the session ended.
    pub fn alloc(
        &self,
        top: &mut DistWorker,
        chip: usize,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<RemoteTensor, NetError> {
        self.settle(top, |top| {
            let s = self.ready(top, "alloc")?;
            let view = TensorView::contiguous(dtype, shape)
                .map_err(|e| NetError::Dist(strata_dist::DistError::Types(e)))?;
            let chip32 = self.chip(chip)?;
            let handle = self.call(
                &s,
                &Control::Alloc {
                    chip: chip32,
                    bytes: view.nbytes(),
                },
            )?;
            let desc = match top.admit_remote_device(self.id, handle, view.nbytes()) {
                Ok(d) => d,
                Err(e) => {
                    // Do not leak the node's allocation.
                    let _ = self.call(&s, &Control::Free { id: handle });
                    return Err(e.into());
                }
            };
            self.link
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(handle, (chip, desc));
            Ok(RemoteTensor {
                worker: self.id,
                chip,
                handle,
                desc,
                view,
            })
        })
    }

    /// Checks that `t` is a live tensor of this worker and `[offset, offset + len)` lies
    /// in it.
    fn check(&self, t: &RemoteTensor, offset: u64, len: u64, op: &str) -> Result<(), NetError> {
        if t.worker != self.id {
            return Err(self.fault(
                MemoryFault::OtherWorker,
                format!(
                    "{op}: the tensor is in the memory of remote worker {}, not of this one; use that worker's handle",
                    t.worker
                ),
            ));
        }
        let live = self.link.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.get(&t.handle).map(|(_, d)| d) != Some(&t.desc) {
            return Err(self.fault(
                MemoryFault::Freed,
                format!(
                    "{op}: the tensor on chip {} was freed (or never allocated by this worker)",
                    t.chip
                ),
            ));
        }
        if offset.checked_add(len).is_none_or(|end| end > t.nbytes()) {
            return Err(self.fault(
                MemoryFault::OutOfRange,
                format!(
                    "{op}: {len} bytes at device offset {offset} leave the {}-byte tensor on chip {} (offset + bytes must be at most {})",
                    t.nbytes(),
                    t.chip,
                    t.nbytes()
                ),
            ));
        }
        Ok(())
    }

    /// Frees a tensor of this worker (outside any run). Tasks naming it are refused from
    /// then on.
    ///
    /// # Errors
    /// A run in flight; a tensor of another worker, or already freed; the session ended.
    pub fn free(&self, top: &mut DistWorker, t: RemoteTensor) -> Result<(), NetError> {
        self.settle(top, |top| {
            let s = self.ready(top, "free")?;
            self.check(&t, 0, 0, "free")?;
            top.retire_remote_device(&t.desc)?;
            self.link
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&t.handle);
            self.call(&s, &Control::Free { id: t.handle })?;
            Ok(())
        })
    }

    /// The size of each piece a copy is cut into.
    fn piece(s: &Session) -> u64 {
        // Two pieces in flight use at most half of the staging area.
        (s.staging_bytes / 4).clamp(64 << 10, MAX_PIECE)
    }

    /// Copies `src` into `dst` from its byte `dev_offset` on (outside any run).
    ///
    /// # Errors
    /// A run in flight; a tensor of another worker, freed, or a range that leaves it
    /// (checked here, and again by the node); the session ended.
    pub fn copy_to(
        &self,
        top: &mut DistWorker,
        dst: &RemoteTensor,
        dev_offset: u64,
        src: &[u8],
    ) -> Result<(), NetError> {
        self.settle(top, |top| {
            let s = self.ready(top, "copy_to")?;
            self.check(dst, dev_offset, src.len() as u64, "copy_to")?;
            let piece = Self::piece(&s) as usize;
            let mut inflight: VecDeque<Pending<'_>> = VecDeque::with_capacity(2);
            let mut result = Ok(());
            for (k, chunk) in src.chunks(piece).enumerate() {
                if inflight.len() == 2 {
                    if let Some(p) = inflight.pop_front() {
                        if let Err(e) = self.wait(p) {
                            result = Err(e);
                            break;
                        }
                    }
                }
                let control = Control::CopyTo {
                    id: dst.handle,
                    offset: dev_offset + (k * piece) as u64,
                    len: chunk.len() as u64,
                };
                match s.post_control(&control, chunk, None) {
                    Ok(p) => inflight.push_back(p),
                    Err(why) => {
                        result = Err(self.fault(MemoryFault::SessionLost, why));
                        break;
                    }
                }
            }
            // Every request posted is waited for, even after an error.
            for p in inflight {
                let r = self.wait(p);
                if result.is_ok() {
                    result = r.map(drop);
                }
            }
            result
        })
    }

    /// Copies `dst.len()` bytes of `src` from its byte `dev_offset` on into `dst`
    /// (outside any run).
    ///
    /// # Errors
    /// As [`RemoteWorker::copy_to`].
    pub fn copy_from(
        &self,
        top: &mut DistWorker,
        src: &RemoteTensor,
        dev_offset: u64,
        dst: &mut [u8],
    ) -> Result<(), NetError> {
        self.settle(top, |top| {
            let s = self.ready(top, "copy_from")?;
            self.check(src, dev_offset, dst.len() as u64, "copy_from")?;
            let piece = Self::piece(&s) as usize;
            // Each piece's bytes land straight in its part of `dst` (the reader writes them
            // there as they arrive); two pieces in flight.
            let mut inflight: VecDeque<(usize, Pending<'_>)> = VecDeque::with_capacity(2);
            let mut result = Ok(());
            let land = |want: usize, p: Pending<'_>, result: &mut Result<(), NetError>| {
                let r = self.wait(p);
                if result.is_err() {
                    return;
                }
                match r {
                    Ok((_, got)) if got == want as u64 => {}
                    Ok((_, got)) => {
                        *result = Err(self.fault(
                            MemoryFault::Node,
                            format!("copy_from: the node sent {got} bytes for a piece of {want}"),
                        ))
                    }
                    Err(e) => *result = Err(e),
                }
            };
            for (k, part) in dst.chunks_mut(piece).enumerate() {
                if inflight.len() == 2 {
                    if let Some((want, p)) = inflight.pop_front() {
                        land(want, p, &mut result);
                    }
                }
                if result.is_err() {
                    break;
                }
                let len = part.len();
                let control = Control::CopyFrom {
                    id: src.handle,
                    offset: dev_offset + (k * piece) as u64,
                    len: len as u64,
                };
                match s.post_control(&control, &[], Some(part)) {
                    Ok(p) => inflight.push_back((len, p)),
                    Err(why) => {
                        result = Err(self.fault(MemoryFault::SessionLost, why));
                        break;
                    }
                }
            }
            while let Some((want, p)) = inflight.pop_front() {
                land(want, p, &mut result);
            }
            result
        })
    }

    /// Bytes chip `chip`'s device allocator holds (outside any run).
    ///
    /// # Errors
    /// A run in flight; no such chip; the session ended.
    pub fn committed_device_memory(
        &self,
        top: &mut DistWorker,
        chip: usize,
    ) -> Result<u64, NetError> {
        self.settle(top, |top| {
            let s = self.ready(top, "committed_device_memory")?;
            let chip32 = self.chip(chip)?;
            self.call(&s, &Control::Committed { chip: chip32 })
        })
    }

    /// `(free, total)` bytes of chip `chip`'s emulated card on the node (outside any
    /// run): `total` the capacity the node's chip was configured with.
    ///
    /// # Errors
    /// A run in flight; no such chip; the session ended.
    pub fn device_memory_info(
        &self,
        top: &mut DistWorker,
        chip: usize,
    ) -> Result<(u64, u64), NetError> {
        self.settle(top, |top| {
            let s = self.ready(top, "device_memory_info")?;
            let chip = self.chip(chip)?;
            let free = self.call(&s, &Control::FreeBytes { chip })?;
            let total = self.call(&s, &Control::Capacity { chip })?;
            Ok((free, total))
        })
    }

    /// Whether `t` is a live allocation of this worker (allocated here, not freed: a
    /// `free` that failed after the tensor was retired — the session ended — leaves it
    /// not live).
    pub fn is_live(&self, t: &RemoteTensor) -> bool {
        t.worker == self.id
            && self
                .link
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&t.handle)
                .map(|(_, d)| d)
                == Some(&t.desc)
    }

    /// How many chips the remote level-3 worker has ([`crate::RemoteSpec::chips`]).
    pub fn chips(&self) -> usize {
        self.link.chips
    }
}
