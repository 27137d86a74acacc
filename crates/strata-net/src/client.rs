//! The root's side of a session: [`RemoteEndpoint`], the [`Endpoint`] through which the
//! level-4 scheduler reaches a remote level-3 worker.
//!
//! The scheduler's calls never block on the network: `publish` writes the TASK frame
//! without blocking (or queues it, and its bulk inputs, for the session's writer thread),
//! `poll` looks at a flag the reader thread sets, `check_alive` compares the time of the
//! last frame with the heartbeat timeout. The reader writes a task's outputs into the
//! root's shared memory as their chunks arrive (they precede DONE on the stream), then
//! rings the doorbell. (Over TCP, `tcp.rs` runs the reader and the writer.)

use crate::error::NetError;
use crate::io::runtime;
use crate::tcp::{DataError, Incoming, Payload};
use crate::wire::{
    self, Cancel, ControlAnswer, Data, Done, ErrorBody, FrameType, Segment, ShutdownAck, Task,
    CHUNK_BYTES,
};
use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use strata_dist::{ChildKind, ChildTrace, ControlCommand, Endpoint, EndpointError, TaskOutcome};
use strata_host::{Doorbell, SharedMemory};
use strata_mailbox::{codes, FailureReport, TaskPublication, TaskSlot};
use strata_types::trace::ClockSync;
use strata_types::wire::decode_args;
use strata_types::{ArgLimits, ArgTag, BufferLocation};

/// How often each side sends a heartbeat.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(200);

/// Frames for the session's writer.
pub(crate) enum Out {
    /// A whole frame.
    Frame(Vec<u8>),
    /// Bulk data to stream in chunks, read from shared memory as the socket takes it.
    Bulk {
        owner: u64,
        /// (segment index, region, first byte, bytes)
        parts: Vec<(u32, u64, u64, u64)>,
    },
    /// Runs once everything queued before it on its lane was written (e.g. frees the
    /// staging bytes a bulk transfer read).
    Then(Box<dyn FnOnce() + Send>),
}

/// Which of the writer's lanes an item goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Heartbeats and ERROR: between any two items of the ordered lane.
    Prio,
    /// Tasks, their bulk data, completions, device-memory requests, in order.
    Main,
}

/// The sending side of a session: every frame goes through it, whatever the transport.
pub(crate) enum Tx {
    /// A TCP socket and the session's writer thread ([`crate::tcp`]).
    Tcp(crate::tcp::TcpTx),
    /// The MPI progress thread's queues for one peer rank.
    #[cfg(feature = "mpi")]
    Mpi(Arc<crate::mpi_link::Peer>),
}

/// How a session ends its link from this side: over TCP the socket is shut down (the
/// peer reads EOF); over MPI the progress thread sends the peer a close message and
/// drops whatever else was queued.
pub(crate) enum Cut {
    /// A clone of the session's socket.
    Tcp(TcpStream),
    /// The peer rank.
    #[cfg(feature = "mpi")]
    Mpi(Arc<crate::mpi_link::Peer>),
}

impl Cut {
    /// Ends the link (idempotent).
    pub(crate) fn cut(&self) {
        match self {
            Cut::Tcp(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            #[cfg(feature = "mpi")]
            Cut::Mpi(p) => p.cut(),
        }
    }
}

/// An established link a session starts on: the socket of a handshaken TCP connection,
/// or a handshaken MPI peer.
pub(crate) enum Link {
    /// The connection's socket.
    Tcp(TcpStream),
    /// The peer rank.
    #[cfg(feature = "mpi")]
    Mpi(Arc<crate::mpi_link::Peer>),
}

/// A handshaken start-up connection that becomes a session's [`Link`].
pub(crate) trait IntoLink: crate::io::FrameConn {
    /// The link the session runs on.
    fn into_link(self) -> Link;
}

impl IntoLink for crate::io::SyncConn {
    fn into_link(self) -> Link {
        Link::Tcp(self.stream)
    }
}

#[cfg(feature = "mpi")]
impl IntoLink for crate::mpi_link::MpiConn {
    fn into_link(self) -> Link {
        Link::Mpi(self.peer)
    }
}

impl Tx {
    /// Sends `out` on `lane`; `Err` once the writer is gone (the session was cut).
    pub(crate) fn send(&self, lane: Lane, out: Out) -> Result<(), ()> {
        match self {
            Tx::Tcp(t) => t.send(lane, out),
            #[cfg(feature = "mpi")]
            Tx::Mpi(p) => p.send(lane, out),
        }
    }

    /// No frame is taken any more (the session was cut): over TCP the writer drains
    /// what is queued — its writes fail on the cut socket — and ends.
    pub(crate) fn close(&self) {
        match self {
            Tx::Tcp(t) => t.close(),
            #[cfg(feature = "mpi")]
            Tx::Mpi(_) => {}
        }
    }
}

/// One task in flight on the session.
struct InFlight {
    seq: u64,
    segments: Vec<Segment>,
    /// For each segment the task writes: the byte runs (absolute region offsets, sorted)
    /// its write-tagged views touch — only those are written back.
    runs: Vec<Vec<(u64, u64)>>,
    outcome: Option<TaskOutcome>,
    /// When the TASK frame was queued (ns, this host's `CLOCK_MONOTONIC`).
    sent_ns: u64,
    /// A traced task's trace bytes and the clock estimate its round trip gave.
    trace: Option<(Vec<u8>, Option<ClockSync>)>,
}

/// A device-memory request waiting for its reply (`memory.rs`).
struct ControlWait {
    reply: Option<Result<u64, String>>,
    /// Where a copy-from's bytes go (they precede the reply on the stream).
    sink: Option<Sink>,
    /// Bytes that arrived so far.
    have: u64,
}

/// A piece of the caller's buffer that the reader fills with a copy-from's bytes, in
/// place (no staging copy on the root). Written only under the session's state lock
/// while its request is registered; the request's [`Pending`] borrows the buffer and
/// unregisters it before the borrow ends, whatever happens (drop), so the reader never
/// writes into a buffer its owner got back.
struct Sink {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is used only under the state lock, while the `Pending` that holds
// the exclusive borrow of the buffer is alive (see `Sink`).
unsafe impl Send for Sink {}

/// Bytes of DATA frames a device-memory copy may have queued for the writer and not yet
/// written: the copying thread encodes frames straight from the caller's buffer and waits
/// above this, so a large copy costs a bounded amount of memory.
const COPY_WINDOW: u64 = 4 << 20;

#[derive(Default)]
struct State {
    slots: [Option<InFlight>; 2],
    dead: Option<String>,
    controls: HashMap<u64, ControlWait>,
    ack: Option<ShutdownAck>,
    /// The reader is landing a DATA payload — read from the socket outside this lock —
    /// in a registered request's buffer or a task's outputs: neither may be given back
    /// meanwhile ([`Session::unregister`], [`Session::die`] wait for it).
    landing: bool,
}

/// What the endpoint, the reader, the writer and the heartbeat share.
pub(crate) struct Session {
    pub(crate) label: String,
    pub(crate) session: u64,
    doorbell: Doorbell,
    shared: Arc<SharedMemory>,
    state: Mutex<State>,
    changed: Condvar,
    /// Bit `slot` set: that slot's outcome is waiting (a lock-free look for `poll`).
    done_mask: AtomicU32,
    dead_flag: AtomicBool,
    last_rx: AtomicU64,
    seq: AtomicU64,
    epoch: Instant,
    heartbeat_timeout: Duration,
    /// The node's staging area (from READY): device-memory copies go in pieces that fit it.
    pub(crate) staging_bytes: u64,
    /// DATA bytes queued by a device-memory copy and not yet written (see [`COPY_WINDOW`]).
    out_pending: AtomicU64,
    /// The writer's lanes (and direct writes).
    tx: Tx,
    /// Cuts the link from any thread.
    sock: Cut,
    /// Who reads a TCP session's socket (`None` over MPI): the reader thread, or a
    /// caller waiting for this node's answer ([`crate::tcp::ReadRole`]).
    read_role: Option<crate::tcp::ReadRole>,
}

impl Session {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The session ends with `why` (first reason kept); the socket is cut so both tasks
    /// and the node see it. Once it returns, no payload lands any more: a landing in
    /// progress ended (the cut ends the read it waits in), and the reader starts none
    /// after `dead` is set.
    pub(crate) fn die(&self, why: String) {
        {
            // (The reader never holds the lock while it reads from the socket.)
            let mut st = self.lock();
            if st.dead.is_none() {
                st.dead = Some(why);
            }
        }
        self.sock.cut();
        self.tx.close();
        drop(self.settled());
        self.dead_flag.store(true, Ordering::Release);
        self.changed.notify_all();
        self.doorbell.ring();
    }

    /// The state once no payload is landing.
    fn settled(&self) -> std::sync::MutexGuard<'_, State> {
        let mut st = self.lock();
        while st.landing {
            st = self
                .changed
                .wait_timeout(st, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st
    }

    /// Unregisters request `seq`: its buffer is never written after this returns.
    fn unregister(&self, seq: u64) {
        self.settled().controls.remove(&seq);
    }

    fn send_prio(&self, frame: Vec<u8>) {
        let _ = self.tx.send(Lane::Prio, Out::Frame(frame));
    }

    /// Why the session ended, if it did.
    pub(crate) fn dead_reason(&self) -> Option<String> {
        if !self.dead_flag.load(Ordering::Acquire) {
            return None;
        }
        Some(self.lock().dead.clone().unwrap_or_default())
    }

    /// Sends device-memory request `control` on the ordered lane (after every task
    /// already published, so the node serves it after them), followed by `payload` as
    /// DATA frames owned by it; the bytes a reply brings back land in `dst` (at most its
    /// length). Returns the request, to [`Pending::wait`] for.
    ///
    /// # Errors
    /// The session ended (its reason), or the frame could not be encoded.
    pub(crate) fn post_control<'a>(
        self: &'a Arc<Self>,
        control: &wire::Control,
        payload: &[u8],
        dst: Option<&'a mut [u8]>,
    ) -> Result<Pending<'a>, String> {
        if let Some(why) = self.dead_reason() {
            return Err(why);
        }
        let seq = self.next_seq();
        let frame = wire::encode(FrameType::Control, self.session, seq, control)
            .map_err(|e| e.to_string())?;
        self.lock().controls.insert(
            seq,
            ControlWait {
                reply: None,
                sink: dst.map(|d| Sink {
                    ptr: d.as_mut_ptr(),
                    len: d.len(),
                }),
                have: 0,
            },
        );
        // From here on the guard unregisters the request on every path.
        let pending = Pending {
            s: self,
            seq,
            _dst: std::marker::PhantomData,
        };
        let gone = || "the session's writer is gone".to_owned();
        self.tx
            .send(Lane::Main, Out::Frame(frame))
            .map_err(|_| gone())?;
        for (k, chunk) in payload.chunks(CHUNK_BYTES).enumerate() {
            self.wait_window()?;
            let mut f = Vec::new();
            let head = wire::DataHead {
                owner: seq,
                segment: 0,
                offset: (k * CHUNK_BYTES) as u64,
            };
            wire::encode_data_copy(&mut f, self.session, seq, head, chunk);
            let n = chunk.len() as u64;
            self.out_pending.fetch_add(n, Ordering::AcqRel);
            self.tx
                .send(Lane::Main, Out::Frame(f))
                .map_err(|_| gone())?;
            let s = self.clone();
            self.tx
                .send(
                    Lane::Main,
                    Out::Then(Box::new(move || {
                        s.out_pending.fetch_sub(n, Ordering::AcqRel);
                        s.changed.notify_all();
                    })),
                )
                .map_err(|_| gone())?;
        }
        Ok(pending)
    }

    /// Waits until the writer has fewer than [`COPY_WINDOW`] queued copy bytes (or the
    /// session ended, or went silent past the heartbeat timeout).
    fn wait_window(&self) -> Result<(), String> {
        let mut st = self.lock();
        while self.out_pending.load(Ordering::Acquire) >= COPY_WINDOW {
            if let Some(d) = &st.dead {
                return Err(d.clone());
            }
            drop(st);
            self.check_silence();
            st = self.lock();
            st = self
                .changed
                .wait_timeout(st, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// Ends the session if the node has been silent past the heartbeat timeout (what
    /// `check_alive` does for the scheduler; a device-memory wait runs while the scheduler
    /// may be parked).
    fn check_silence(&self) {
        let last = self.last_rx.load(Ordering::Acquire);
        let silent = Duration::from_millis(self.now_ms().saturating_sub(last));
        if silent > self.heartbeat_timeout && !self.dead_flag.load(Ordering::Acquire) {
            self.die(format!(
                "{}: no frame from the node for {silent:?} (heartbeat timeout {:?}): the link is partitioned, or the node is stopped or overloaded; the session was cut",
                self.label, self.heartbeat_timeout
            ));
        }
    }

    /// Waits for the reply to request `seq` until `deadline`: its result word and how
    /// many bytes it brought back.
    fn wait_control(&self, seq: u64, deadline: Instant) -> Result<(u64, u64), ControlWaitError> {
        let mut st = self.lock();
        loop {
            if let Some(c) = st.controls.remove(&seq) {
                match c.reply {
                    Some(Ok(v)) => return Ok((v, c.have)),
                    Some(Err(why)) => return Err(ControlWaitError::Refused(why)),
                    None => {
                        st.controls.insert(seq, c);
                    }
                }
            }
            if let Some(d) = &st.dead {
                let why = d.clone();
                drop(st);
                self.unregister(seq);
                return Err(ControlWaitError::Lost(why));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(st);
                // The node may still be working on it: a later reply would find no
                // request, and the chip's memory is in an unknown state. End the session,
                // as the engine stops a child that missed a control deadline.
                self.die(format!(
                    "{}: no answer to a device-memory request in time; the session was cut",
                    self.label
                ));
                self.unregister(seq);
                return Err(ControlWaitError::Timeout);
            }
            drop(st);
            self.check_silence();
            st = self.lock();
            st = self
                .changed
                .wait_timeout(st, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A device-memory request on its way ([`Session::post_control`]); dropping it
/// unregisters the request (its buffer is then never written).
pub(crate) struct Pending<'a> {
    s: &'a Session,
    seq: u64,
    /// The buffer the reply's bytes land in stays borrowed while the request may write it.
    _dst: std::marker::PhantomData<&'a mut [u8]>,
}

impl Pending<'_> {
    /// Waits for the reply until `deadline`: the result word and how many bytes it
    /// brought back.
    ///
    /// # Errors
    /// [`ControlWaitError`]: the node's refusal, the session's end, or the deadline.
    pub(crate) fn wait(self, deadline: Instant) -> Result<(u64, u64), ControlWaitError> {
        self.s.wait_control(self.seq, deadline)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.s.unregister(self.seq);
    }
}

/// Why a device-memory request got no result.
#[derive(Debug)]
pub(crate) enum ControlWaitError {
    /// The node answered with this refusal.
    Refused(String),
    /// The session ended (the reason).
    Lost(String),
    /// No answer by the deadline.
    Timeout,
}

/// The endpoint of one remote level-3 worker (see the module docs).
pub struct RemoteEndpoint {
    pub(crate) s: Arc<Session>,
    /// Per task frame: the trace of the task last polled from it, until taken.
    traces: [Option<ChildTrace>; 2],
    /// The most precise estimate of the node's clock so far (smallest error bound).
    clock: Option<ClockSync>,
    /// The node's host name and pid (its track in traces).
    node_host: String,
    node_pid: u32,
    /// Frame buffers of a caller that reads the session's socket itself.
    bufs: (Vec<u8>, Vec<u8>),
}

impl std::fmt::Debug for RemoteEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEndpoint")
            .field("label", &self.s.label)
            .finish()
    }
}

impl RemoteEndpoint {
    /// Starts the session over an authenticated, ready link: over TCP its reader, writer
    /// and heartbeat on this crate's runtime; over MPI its heartbeat there, its frames
    /// through the MPI progress thread.
    ///
    /// # Errors
    /// The socket cannot be handed to the runtime.
    // One caller (spec.rs), which has each of these at hand: a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        link: Link,
        session: u64,
        label: String,
        doorbell: Doorbell,
        shared: Arc<SharedMemory>,
        heartbeat_timeout: Duration,
        staging_bytes: u64,
        node: (String, u32),
    ) -> Result<RemoteEndpoint, NetError> {
        let writer_shared = shared.clone();
        let new = |tx: Tx, sock: Cut, read_role: Option<crate::tcp::ReadRole>| {
            Arc::new(Session {
                label,
                session,
                doorbell,
                shared,
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                done_mask: AtomicU32::new(0),
                dead_flag: AtomicBool::new(false),
                last_rx: AtomicU64::new(0),
                seq: AtomicU64::new(1 << 32),
                epoch: Instant::now(),
                heartbeat_timeout,
                staging_bytes,
                out_pending: AtomicU64::new(0),
                tx,
                sock,
                read_role,
            })
        };
        // (One arm without the `mpi` feature.)
        #[allow(clippy::infallible_destructuring_match)]
        let stream = match link {
            Link::Tcp(stream) => stream,
            #[cfg(feature = "mpi")]
            Link::Mpi(peer) => {
                let s = new(Tx::Mpi(peer.clone()), Cut::Mpi(peer.clone()), None);
                peer.attach(mpi_receiver(&s), s.shared.clone(), session);
                runtime().spawn(heartbeat(s.clone()));
                return Ok(RemoteEndpoint {
                    s,
                    traces: [None, None],
                    bufs: (Vec::new(), Vec::new()),
                    clock: None,
                    node_host: node.0,
                    node_pid: node.1,
                });
            }
        };
        let sock = stream
            .try_clone()
            .map_err(|e| NetError::io("cloning the session socket", e))?;
        let died = Arc::new(std::sync::OnceLock::<std::sync::Weak<Session>>::new());
        let on_error = {
            let died = died.clone();
            move |e: std::io::Error| {
                if let Some(s) = died.get().and_then(std::sync::Weak::upgrade) {
                    if !s.dead_flag.load(Ordering::Acquire) {
                        s.die(format!("{}: sending to the node failed ({e})", s.label));
                    }
                }
            }
        };
        let (tx, _writer, rd) = crate::tcp::start(stream, writer_shared, session, on_error)?;
        let s = new(
            Tx::Tcp(tx),
            Cut::Tcp(sock),
            Some(crate::tcp::ReadRole::new(rd)?),
        );
        let _ = died.set(Arc::downgrade(&s));
        let rs = s.clone();
        crate::tcp::spawn_reader(move || reader(rs))?;
        let rt = runtime();
        rt.spawn(heartbeat(s.clone()));
        Ok(RemoteEndpoint {
            s,
            traces: [None, None],
            bufs: (Vec::new(), Vec::new()),
            clock: None,
            node_host: node.0,
            node_pid: node.1,
        })
    }

    /// The message a failed publish gives.
    fn publish_error(&self, what: String) -> EndpointError {
        EndpointError::Remote(format!("{}: {what}", self.s.label))
    }
}

/// The segments a task's tensors name, and the write-back runs of each.
type Plan = (Vec<Segment>, Vec<Vec<(u64, u64)>>);

/// Plans the bulk data of a task: one segment per buffer its tensors name (the union of
/// their byte spans), shipped before the task if any view reads it (or does not cover
/// it), written back after it where write-tagged views touch it.
fn plan(blob: &[u8]) -> Result<Plan, String> {
    let args = decode_args(blob, ArgLimits::HOST)
        .map_err(|e| format!("cannot decode the task's arguments: {e}"))?;
    // identity → (segment index)
    let mut by_buffer: HashMap<strata_types::BufferIdentity, usize> = HashMap::new();
    let mut segs: Vec<Segment> = Vec::new();
    let mut whole_output: Vec<bool> = Vec::new();
    let mut runs: Vec<Vec<(u64, u64)>> = Vec::new();
    for (i, t) in args.tensors().iter().enumerate() {
        let (region, base) = match t.buffer.location() {
            BufferLocation::HostShared { region, offset } => (region, offset),
            // Device memory of this remote worker's chips (a `RemoteTensor`; the engine
            // admitted it for this worker only): nothing to ship, the node maps the handle.
            BufferLocation::Device { .. } => continue,
            BufferLocation::HostLocal { .. } => {
                return Err(format!(
                    "tensor argument {i} is in private host memory; use a SharedTensor"
                ))
            }
        };
        let (lo, hi) = t.view.byte_span();
        let (lo, hi) = (base + lo, base + hi);
        let writes = matches!(
            t.tag,
            ArgTag::Output | ArgTag::OutputExisting | ArgTag::InOut | ArgTag::NoDep
        );
        let only_writes = matches!(t.tag, ArgTag::Output | ArgTag::OutputExisting);
        let k = *by_buffer.entry(t.buffer.identity()).or_insert_with(|| {
            segs.push(Segment {
                region,
                start: lo,
                len: 0,
                send: false,
                recv: false,
            });
            whole_output.push(true);
            runs.push(Vec::new());
            segs.len() - 1
        });
        let s = &mut segs[k];
        let (old_lo, old_hi) = (s.start, s.start + s.len);
        let (new_lo, new_hi) = if s.len == 0 {
            (lo, hi)
        } else {
            (old_lo.min(lo), old_hi.max(hi))
        };
        s.start = new_lo;
        s.len = new_hi - new_lo;
        s.recv |= writes;
        // A view that only writes, densely, spares sending the segment only if it covers
        // all of it (checked once the segment is final, below).
        if !(only_writes && t.view.is_contiguous()) {
            whole_output[k] = false;
        }
        if writes {
            runs[k].extend(t.view.contiguous_runs().map(|(o, n)| (base + o, n)));
        }
    }
    for (k, s) in segs.iter_mut().enumerate() {
        let covered = whole_output[k] && runs[k].iter().any(|&(o, n)| o == s.start && n == s.len);
        s.send = !covered;
        let r = &mut runs[k];
        r.sort_unstable();
        // Merge touching runs so a dense view is one copy.
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(r.len());
        for &(o, n) in r.iter() {
            match merged.last_mut() {
                Some((mo, mn)) if *mo + *mn >= o => *mn = (*mn).max(o + n - *mo),
                _ => merged.push((o, n)),
            }
        }
        *r = merged;
    }
    Ok((segs, runs))
}

impl Endpoint for RemoteEndpoint {
    fn label(&self) -> &str {
        &self.s.label
    }

    fn kind(&self) -> ChildKind {
        ChildKind::Worker
    }

    fn publish(&mut self, slot: TaskSlot, task: &TaskPublication<'_>) -> Result<(), EndpointError> {
        if self.s.dead_flag.load(Ordering::Acquire) {
            let why = self.s.lock().dead.clone().unwrap_or_default();
            return Err(EndpointError::Gone { message: why });
        }
        let (segments, runs) = plan(task.args).map_err(|e| self.publish_error(e))?;
        let config = task.config.as_bytes();
        let used = config.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        let seq = self.s.next_seq();
        let body = Task {
            callable: task.callable.0,
            config: config[..used].to_vec(),
            args: task.args.to_vec(),
            segments: segments.clone(),
        };
        let frame = wire::encode(FrameType::Task, self.s.session, seq, &body)
            .map_err(|e| self.publish_error(e.to_string()))?;
        let parts: Vec<(u32, u64, u64, u64)> = segments
            .iter()
            .enumerate()
            .filter(|(_, s)| s.send && s.len > 0)
            .map(|(i, s)| (i as u32, s.region, s.start, s.len))
            .collect();
        self.s.lock().slots[slot.index()] = Some(InFlight {
            seq,
            segments,
            runs,
            outcome: None,
            sent_ns: strata_sync::mono_ns(),
            trace: None,
        });
        // TASK first, then its inputs, on the ordered lane (never overtaken by a later
        // task's frames).
        let sent = self.s.tx.send(Lane::Main, Out::Frame(frame)).is_ok()
            && (parts.is_empty()
                || self
                    .s
                    .tx
                    .send(Lane::Main, Out::Bulk { owner: seq, parts })
                    .is_ok());
        if !sent {
            self.s.lock().slots[slot.index()] = None;
            return Err(self.publish_error("the session's writer is gone".into()));
        }
        Ok(())
    }

    #[inline]
    fn poll(&mut self, slot: TaskSlot) -> Result<Option<TaskOutcome>, EndpointError> {
        let bit = 1u32 << slot.index();
        if self.s.done_mask.load(Ordering::Acquire) & bit == 0 {
            return Ok(None);
        }
        let mut st = self.s.lock();
        self.s.done_mask.fetch_and(!bit, Ordering::AcqRel);
        let Some(mut f) = st.slots[slot.index()].take() else {
            return Ok(None);
        };
        drop(st);
        self.traces[slot.index()] = f.trace.take().map(|(bytes, measured)| {
            // The most precise estimate wins: the one whose round trip spent least time
            // on the network.
            if let Some(m) = measured {
                if self.clock.is_none_or(|c| m.error_ns < c.error_ns) {
                    self.clock = Some(m);
                }
            }
            ChildTrace {
                bytes,
                clock: self.clock.unwrap_or(ClockSync {
                    offset_ns: 0,
                    error_ns: u64::MAX,
                }),
                host: self.node_host.clone(),
            }
        });
        Ok(f.outcome)
    }

    fn take_trace(&mut self, slot: TaskSlot) -> Option<ChildTrace> {
        self.traces[slot.index()].take()
    }

    fn pid(&self) -> Option<u32> {
        Some(self.node_pid)
    }

    fn control(
        &mut self,
        request: &ControlCommand,
        _deadline: Option<Instant>,
    ) -> Result<u64, EndpointError> {
        Err(EndpointError::Remote(format!(
            "{}: a remote level-3 worker does not take control command `{}` through the scheduler; use strata_net::RemoteWorker for its chips' memory",
            self.s.label,
            request.name()
        )))
    }

    fn check_alive(&mut self) -> Result<(), EndpointError> {
        if !self.s.dead_flag.load(Ordering::Acquire) {
            let last = self.s.last_rx.load(Ordering::Acquire);
            let silent = Duration::from_millis(self.s.now_ms().saturating_sub(last));
            if silent <= self.s.heartbeat_timeout {
                return Ok(());
            }
            self.s.die(format!(
                "{}: no frame from the node for {silent:?} (heartbeat timeout {:?}): the link is partitioned, or the node is stopped or overloaded; the session was cut",
                self.s.label, self.s.heartbeat_timeout
            ));
        }
        let message = self.s.lock().dead.clone().unwrap_or_default();
        Err(EndpointError::Gone { message })
    }

    fn kill(&mut self) -> bool {
        self.s.die(format!(
            "{}: the session was cut (the node stops its level-3 tree when it sees the connection close)",
            self.s.label
        ));
        true
    }

    fn wait_answer(&mut self, kick: &strata_sync::EventFd, timeout: Duration) -> bool {
        let s = &self.s;
        let Some(role) = s.read_role.as_ref() else {
            return false;
        };
        if s.dead_flag.load(Ordering::Acquire) {
            return false;
        }
        let (body, scratch) = &mut self.bufs;
        role.wait(kick, timeout, |sock| read_one(s, sock, body, scratch))
    }

    fn release_read(&mut self) {
        if let Some(role) = &self.s.read_role {
            role.release();
        }
    }

    fn answers_soon(&self) -> bool {
        // An answer needs a network round trip: the scheduler parks instead of spinning.
        false
    }

    fn state_note(&self) -> Option<String> {
        let last = self.s.last_rx.load(Ordering::Acquire);
        Some(format!(
            "last frame from the node {:?} ago",
            Duration::from_millis(self.s.now_ms().saturating_sub(last))
        ))
    }

    fn abandon(endpoints: Vec<Self>) {
        for mut e in endpoints {
            e.kill();
        }
    }

    fn begin_shutdown(&mut self) {
        if self.s.dead_flag.load(Ordering::Acquire) {
            return;
        }
        // Tasks still queued at the node are dropped; the one it runs finishes first.
        let in_flight: Vec<u64> = self
            .s
            .lock()
            .slots
            .iter()
            .flatten()
            .map(|f| f.seq)
            .collect();
        for task in in_flight {
            if let Ok(f) = wire::encode(
                FrameType::Cancel,
                self.s.session,
                self.s.next_seq(),
                &Cancel { task },
            ) {
                let _ = self.s.tx.send(Lane::Main, Out::Frame(f));
            }
        }
        if let Ok(f) = wire::encode(FrameType::Shutdown, self.s.session, self.s.next_seq(), &()) {
            let _ = self.s.tx.send(Lane::Main, Out::Frame(f));
        }
    }

    fn finish_shutdown(&mut self, deadline: Instant) -> Result<(), String> {
        let mut st = self.s.lock();
        loop {
            if let Some(ack) = st.ack.take() {
                drop(st);
                self.s.sock.cut();
                return if ack.reaped && ack.report.is_empty() {
                    Ok(())
                } else if ack.reaped {
                    Err(format!("{}: {}", self.s.label, ack.report))
                } else {
                    Err(format!(
                        "{}: the node could not reap its whole subtree: {}",
                        self.s.label, ack.report
                    ))
                };
            }
            if let Some(d) = &st.dead {
                return Err(format!("{d} (before it confirmed its shutdown)"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(st);
                self.s.die(format!(
                    "{}: no shutdown confirmation in time",
                    self.s.label
                ));
                return Err(format!(
                    "{}: the node did not confirm its shutdown in time; the session was cut (the node stops its tree when it sees the connection close)",
                    self.s.label
                ));
            }
            st = self
                .s
                .changed
                .wait_timeout(st, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for RemoteEndpoint {
    fn drop(&mut self) {
        // Whatever happened, the session ends with the endpoint.
        self.s.sock.cut();
    }
}

/// Copies the part of chunk `bytes` (at absolute region offset `at`) that lies in the
/// write-back runs into the root's shared memory.
fn write_back(
    shared: &SharedMemory,
    region: u64,
    at: u64,
    bytes: &[u8],
    runs: &[(u64, u64)],
) -> Result<(), String> {
    let end = at + bytes.len() as u64;
    let first = runs.partition_point(|&(o, n)| o + n <= at);
    for &(o, n) in &runs[first..] {
        if o >= end {
            break;
        }
        let lo = o.max(at);
        let hi = (o + n).min(end);
        let dst = shared
            .ptr(region, lo, hi - lo)
            .map_err(|e| format!("writing a task's output back: {e}"))?;
        let src = &bytes[(lo - at) as usize..(hi - at) as usize];
        // SAFETY: `ptr` checked `[lo, hi)` lies in the region; the task that writes these
        // bytes holds the region in use (the engine's in-use marks) and no other task may
        // touch them while it runs (dependency tracking); `src` is a private buffer.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    }
    Ok(())
}

/// Handles a DATA frame from the node: a copy-from's bytes go into the caller's buffer, a
/// task's outputs into the root's shared memory — read from the socket straight to their
/// place when one write-back run holds the whole chunk. `scratch` holds a payload that
/// must be split up. The payload is read outside the session's lock, under the `landing`
/// mark, so the scheduler and the callers never wait for the network behind it.
fn on_data(
    s: &Session,
    d: wire::DataHead,
    payload: Payload<'_, '_>,
    scratch: &mut Vec<u8>,
) -> Result<(), DataError> {
    let n = payload.len();
    let mut st = s.lock();
    if let Some(why) = &st.dead {
        // The session ended: nothing lands any more (`die`).
        return Err(DataError::Protocol(why.clone()));
    }
    if let Some(c) = st.controls.get_mut(&d.owner) {
        let fits = c
            .sink
            .as_ref()
            .is_some_and(|k| d.segment == 0 && d.offset == c.have && c.have as usize + n <= k.len);
        let Some(sink) = c.sink.as_ref().filter(|_| fits) else {
            return Err(DataError::Protocol(format!(
                "the node sent data for control request {} outside what it asked for (offset {}, {n} bytes)",
                d.owner, d.offset
            )));
        };
        // SAFETY: the sink is a live exclusive borrow of the caller's buffer while its
        // request is registered; `Session::unregister` (the only way out, before the
        // borrow ends) waits while a payload lands, and `have + n <= len` was checked.
        let dst = unsafe { std::slice::from_raw_parts_mut(sink.ptr.add(c.have as usize), n) };
        let landing = Landing::begin(s, st);
        payload.land(dst)?;
        let mut st = landing.end();
        if let Some(c) = st.controls.get_mut(&d.owner) {
            c.have += n as u64;
        }
        return Ok(());
    }
    let f = st
        .slots
        .iter()
        .flatten()
        .find(|f| f.seq == d.owner)
        .ok_or_else(|| {
            format!(
                "the node sent data for task {} which is not in flight",
                d.owner
            )
        })?;
    let seg = f
        .segments
        .get(d.segment as usize)
        .filter(|g| g.recv && d.offset.checked_add(n as u64).is_some_and(|e| e <= g.len))
        .ok_or_else(|| {
            format!(
                "the node sent data outside the outputs of task {} (segment {}, offset {})",
                d.owner, d.segment, d.offset
            )
        })?;
    let (region, at) = (seg.region, seg.start + d.offset);
    let runs = &f.runs[d.segment as usize];
    let whole = runs
        .iter()
        .any(|&(o, len)| o <= at && at + n as u64 <= o + len);
    let runs = if whole { Vec::new() } else { runs.clone() };
    // The task holds its output regions until its lane learns of its end — which the
    // scheduler does not before DONE, or before `die`, which waits for this landing.
    let landing = Landing::begin(s, st);
    if whole {
        let dst = s
            .shared
            .ptr(region, at, n as u64)
            .map_err(|e| format!("writing a task's output back: {e}"))?;
        // SAFETY: `ptr` checked `[at, at + n)` lies in the region; the task that writes
        // these bytes holds the region in use (the engine's in-use marks), and no other
        // task may touch them while it runs (dependency tracking).
        payload.land(unsafe { std::slice::from_raw_parts_mut(dst, n) })?;
    } else {
        write_back(&s.shared, region, at, payload.bytes(scratch)?, &runs)?;
    }
    drop(landing.end());
    Ok(())
}

/// A DATA payload being read outside the session's lock (`State::landing`); ended on
/// every path, also by an error's early return.
struct Landing<'a> {
    s: &'a Session,
    ended: bool,
}

impl<'a> Landing<'a> {
    fn begin(s: &'a Session, mut st: std::sync::MutexGuard<'a, State>) -> Landing<'a> {
        st.landing = true;
        Landing { s, ended: false }
    }

    /// Ends the landing; the state, locked.
    fn end(mut self) -> std::sync::MutexGuard<'a, State> {
        self.ended = true;
        let mut st = self.s.lock();
        st.landing = false;
        self.s.changed.notify_all();
        st
    }
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.s.lock().landing = false;
            self.s.changed.notify_all();
        }
    }
}

/// A frame of another session on this one ends it.
fn check_session(s: &Session, h: &wire::Header) -> Result<(), String> {
    if h.session != s.session {
        return Err(format!(
            "the node sent a frame of session {:#x} on session {:#x}",
            h.session, s.session
        ));
    }
    Ok(())
}

/// Handles one frame from the node; `Err` ends the session with that reason.
fn on_frame(s: &Session, h: &wire::Header, body: &[u8]) -> Result<(), String> {
    check_session(s, h)?;
    match h.kind {
        FrameType::Heartbeat => Ok(()),
        FrameType::Data => {
            let d: Data<'_> = wire::decode_body(h.kind, body).map_err(|e| e.to_string())?;
            let head = wire::DataHead {
                owner: d.owner,
                segment: d.segment,
                offset: d.offset,
            };
            on_data(s, head, Payload::Bytes(d.bytes), &mut Vec::new()).map_err(|e| e.to_string())
        }
        FrameType::Done => {
            let received_ns = strata_sync::mono_ns();
            let d: Done = wire::decode_body(h.kind, body).map_err(|e| e.to_string())?;
            if d.trace.len() > wire::MAX_TRACE_BYTES {
                return Err(format!(
                    "the node sent {} trace bytes with task {} (at most {})",
                    d.trace.len(),
                    h.sequence,
                    wire::MAX_TRACE_BYTES
                ));
            }
            let mut st = s.lock();
            let slot = st
                .slots
                .iter()
                .position(|f| {
                    f.as_ref()
                        .is_some_and(|f| f.seq == h.sequence && f.outcome.is_none())
                })
                .ok_or_else(|| {
                    format!(
                        "the node completed task {} which is not in flight",
                        h.sequence
                    )
                })?;
            if d.wait_for.len() > strata_types::WAIT_FOR_MAX_BYTES {
                return Err(format!(
                    "the node sent {} wait-for bytes with task {} (at most {})",
                    d.wait_for.len(),
                    h.sequence,
                    strata_types::WAIT_FOR_MAX_BYTES
                ));
            }
            let outcome = match d.failure {
                None => Ok(()),
                Some((code, message)) => Err(FailureReport::new(code, message).with_wait_for(
                    (!d.wait_for.is_empty())
                        .then(|| strata_types::WaitFor::decode(&d.wait_for).ok())
                        .flatten(),
                )),
            };
            if let Some(f) = st.slots[slot].as_mut() {
                f.outcome = Some(outcome);
                if !d.trace.is_empty() {
                    let clock = ClockSync::from_round_trip(
                        f.sent_ns,
                        d.node_recv_ns,
                        d.node_send_ns,
                        received_ns,
                    );
                    f.trace = Some((d.trace, clock));
                }
            }
            s.done_mask.fetch_or(1 << slot, Ordering::AcqRel);
            drop(st);
            s.doorbell.ring();
            Ok(())
        }
        FrameType::ControlReply => {
            let r: ControlAnswer = wire::decode_body(h.kind, body).map_err(|e| e.to_string())?;
            let mut st = s.lock();
            let c = st.controls.get_mut(&h.sequence).ok_or_else(|| {
                format!(
                    "the node answered control request {} which was not sent",
                    h.sequence
                )
            })?;
            c.reply = Some(r.result);
            drop(st);
            s.changed.notify_all();
            Ok(())
        }
        FrameType::ShutdownAck => {
            let a: ShutdownAck = wire::decode_body(h.kind, body).map_err(|e| e.to_string())?;
            s.lock().ack = Some(a);
            s.changed.notify_all();
            Ok(())
        }
        FrameType::Error => {
            let e: ErrorBody = wire::decode_body(h.kind, body).map_err(|e| e.to_string())?;
            Err(format!("the node ended the session: {}", e.message))
        }
        other => Err(format!("the node sent an unexpected {other:?} frame")),
    }
}

/// The session's receiver over MPI, run by the progress thread: what [`reader`] does
/// for a socket. It holds the session weakly (the session holds the peer, which holds
/// this receiver).
#[cfg(feature = "mpi")]
fn mpi_receiver(s: &Arc<Session>) -> crate::mpi_link::Handler {
    use crate::mpi_link::{decode_message, Incoming};
    let weak = Arc::downgrade(s);
    let mut scratch = Vec::new();
    Box::new(move |inc| {
        let Some(s) = weak.upgrade() else {
            return;
        };
        let acked = || s.lock().ack.is_some();
        match inc {
            Incoming::Frame(buf, tag) => match decode_message(buf, tag) {
                Ok((h, body)) => {
                    s.last_rx.store(s.now_ms(), Ordering::Release);
                    if let Err(why) = on_frame(&s, &h, body) {
                        s.die(format!("{}: {why}", s.label));
                    }
                }
                Err(e) => s.die(format!(
                    "{}: the node sent a bad frame ({e}); the session was cut",
                    s.label
                )),
            },
            Incoming::Data(h, head, p) => {
                s.last_rx.store(s.now_ms(), Ordering::Release);
                let handled = check_session(&s, &h)
                    .map_err(DataError::Protocol)
                    .and_then(|()| on_data(&s, head, Payload::Mpi(p), &mut scratch));
                match handled {
                    Ok(()) => {}
                    Err(DataError::Link(e)) => s.die(format!(
                        "{}: MPI failed on the link to the node ({e}): the node died, or the fabric failed",
                        s.label
                    )),
                    Err(DataError::Protocol(why)) => s.die(format!("{}: {why}", s.label)),
                }
            }
            Incoming::Closed if !acked() => s.die(format!(
                "{}: the node ended the session before it confirmed a shutdown (its process ended?)",
                s.label
            )),
            Incoming::Broken(why) if !acked() => s.die(format!(
                "{}: MPI failed on the link to the node ({why}): the node died, or the fabric failed",
                s.label
            )),
            Incoming::Closed | Incoming::Broken(_) => {}
        }
    })
}

/// The session's reader thread: each frame from the node that no waiting caller reads
/// ([`crate::tcp::ReadRole`]), until the session ends.
fn reader(s: Arc<Session>) {
    let Some(role) = s.read_role.as_ref() else {
        return;
    };
    let (mut body, mut scratch) = (Vec::new(), Vec::new());
    role.run_reader(
        || !s.dead_flag.load(Ordering::Acquire),
        |sock| read_one(&s, sock, &mut body, &mut scratch),
    );
}

/// One frame from the node, handled; `false` once the session ended.
fn read_one(
    s: &Session,
    rd: &mut crate::tcp::FrameReader,
    body: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> bool {
    // The link failed (unless the session had been shut down): the session ends.
    let broke = |e: &NetError| {
        if s.lock().ack.is_none() {
            let why = match e {
                NetError::Wire(w) => format!(
                    "{}: the node sent a bad frame ({w}); the session was cut",
                    s.label
                ),
                _ => format!(
                    "{}: the connection to the node broke ({e}): the node died, or the link failed",
                    s.label
                ),
            };
            s.die(why);
        }
        false
    };
    if s.dead_flag.load(Ordering::Acquire) {
        return false;
    }
    let next = match crate::tcp::read_next(rd, body) {
        Ok(n) => n,
        Err(e) => return broke(&e),
    };
    s.last_rx.store(s.now_ms(), Ordering::Release);
    let handled = match next {
        Incoming::Whole(h) => on_frame(s, &h, body).map_err(DataError::Protocol),
        Incoming::Data(h, head, p) => check_session(s, &h)
            .map_err(DataError::Protocol)
            .and_then(|()| on_data(s, head, Payload::Socket(p), scratch)),
    };
    match handled {
        Ok(()) => true,
        Err(DataError::Link(e)) => broke(&e),
        Err(DataError::Protocol(why)) => {
            s.die(format!("{}: {why}", s.label));
            false
        }
    }
}

async fn heartbeat(s: Arc<Session>) {
    let mut tick = tokio::time::interval(HEARTBEAT_INTERVAL);
    loop {
        tick.tick().await;
        if s.dead_flag.load(Ordering::Acquire) {
            return;
        }
        if let Ok(f) = wire::encode(FrameType::Heartbeat, s.session, 0, &()) {
            s.send_prio(f);
        }
        // Wake the scheduler now and then so its liveness check runs even when idle.
        let last = s.last_rx.load(Ordering::Acquire);
        if Duration::from_millis(s.now_ms().saturating_sub(last)) > s.heartbeat_timeout {
            s.doorbell.ring();
        }
    }
}

/// The code a task dropped by a CANCEL fails with.
pub const CANCELLED: i32 = codes::SHUT_DOWN;

#[cfg(test)]
mod tests {
    use super::*;
    use strata_types::{DataType, IdentityMinter, TaskArgs, TensorView};

    fn desc(region: u64, offset: u64, n: u64, m: &IdentityMinter) -> strata_types::BufferDesc {
        // SAFETY: a test descriptor that is only planned, never given to a task.
        unsafe {
            strata_types::BufferDesc::from_parts(
                m.mint(),
                n,
                BufferLocation::HostShared { region, offset },
            )
        }
    }

    #[test]
    fn plans_one_segment_per_buffer_and_ships_what_is_read() {
        let m = IdentityMinter::new();
        let a = desc(1, 0, 64, &m);
        let out = desc(2, 128, 64, &m);
        let mut args = TaskArgs::new();
        let v = TensorView::contiguous(DataType::F32, &[16]).unwrap();
        args.push_tensor(strata_types::TensorArg {
            buffer: a,
            view: v,
            tag: ArgTag::Input,
        })
        .unwrap();
        let half = v.slice(0, 8, 16).unwrap();
        args.push_tensor(strata_types::TensorArg {
            buffer: out,
            view: half,
            tag: ArgTag::OutputExisting,
        })
        .unwrap();
        let blob = strata_mailbox::encode_args_blob(&args);
        let (segs, runs) = plan(&blob.unwrap()).unwrap();
        assert_eq!(segs.len(), 2);
        assert_eq!(
            segs[0],
            Segment {
                region: 1,
                start: 0,
                len: 64,
                send: true,
                recv: false
            }
        );
        // The output slice: bytes 32..64 of a buffer at offset 128, never sent.
        assert_eq!(
            segs[1],
            Segment {
                region: 2,
                start: 160,
                len: 32,
                send: false,
                recv: true
            }
        );
        assert_eq!(runs[1], vec![(160, 32)]);
    }

    #[test]
    fn a_strided_output_is_sent_so_the_gaps_survive_and_only_its_elements_come_back() {
        let m = IdentityMinter::new();
        let b = desc(3, 0, 4 * 4 * 4, &m);
        let mut args = TaskArgs::new();
        let grid = TensorView::contiguous(DataType::F32, &[4, 4]).unwrap();
        let col = grid.window(&[0, 1], &[4, 1]).unwrap();
        args.push_tensor(strata_types::TensorArg {
            buffer: b,
            view: col,
            tag: ArgTag::OutputExisting,
        })
        .unwrap();
        let (segs, runs) = plan(&strata_mailbox::encode_args_blob(&args).unwrap()).unwrap();
        assert!(segs[0].send && segs[0].recv);
        assert_eq!(runs[0], vec![(4, 4), (20, 4), (36, 4), (52, 4)]);
    }
}
