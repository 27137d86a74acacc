//! The MPI transport (feature `mpi`): a session's frames as MPI messages between the
//! ranks of an `mpirun` job, for clusters whose fabric MPI drives (InfiniBand, RoCE,
//! shared memory between ranks of one host).
//!
//! **One thread owns MPI.** Every MPI call of the process is made by one progress thread
//! (`strata-mpi`), started on first use — after the engine forked its children, so no
//! fork ever happens in a process that runs MPI's own threads — and it asks MPI for
//! `MPI_THREAD_FUNNELED` only. Debian's Open MPI offers `MPI_THREAD_MULTIPLE`, but
//! funnelling keeps the transport correct on an MPI built without it and avoids the
//! locks `MULTIPLE` takes inside MPI on every call. The sessions hand it frames through
//! per-peer queues (and unpark it); it hands them received frames through a handler each
//! session installs.
//!
//! **Channels are tags.** Each frame is one MPI message on a private duplicate of
//! `MPI_COMM_WORLD`, tagged by channel: [`TAG_CONTROL`] (handshake, device-memory
//! requests, errors, shutdown), [`TAG_TASK`] (TASK, DONE), [`TAG_HEARTBEAT`], [`TAG_BULK`]
//! (DATA) and [`TAG_CLOSE`] (the sender ended the session) — but a DATA frame with a
//! payload, which is two: its head (header and body prefix, [`TAG_BULK`]), then the
//! payload ([`TAG_BULK_PAYLOAD`]), which the receiving session takes with `MPI_Mrecv`
//! straight into its destination (the staging area, the caller's buffer, a task's
//! output) and checksums there. The receiver matches any tag
//! from any source, so MPI's non-overtaking rule keeps each sender's frames in the order
//! they were sent — the session protocol relies on it (outputs before DONE) —, and
//! checks each frame's tag against its type.
//!
//! **Back-pressure.** Per peer at most [`WINDOW_BYTES`] of sends are outstanding; bulk
//! data is read from shared memory one chunk at a time, only when the window has room,
//! and heartbeats and errors overtake queued task traffic between two chunks. Received
//! frames are handed to the session on the progress thread as they are matched
//! (`MPI_Improbe` + `MPI_Mrecv`), so nothing buffers them here beyond the frames of a
//! handshake not yet read.
//!
//! **Failures.** `MPI_COMM_WORLD`'s default handler aborts the job; the communicator used
//! here returns errors instead (`MPI_ERRORS_RETURN`), and an error fails the peer's
//! session with a typed error. A rank that dies without a word is found by the
//! sessions' heartbeat timeout, as over TCP; sends to it are abandoned, never waited
//! for. At exit the progress thread finalizes MPI within a bound.

use crate::client::{Lane, Out};
use crate::error::NetError;
use crate::io::{FrameConn, RawFrame};
use crate::tcp::DataError;
use crate::wire::{self, FrameType, Header, CHUNK_BYTES, HEADER_BYTES, MAX_BODY};
use mpi::ffi;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};
use strata_host::SharedMemory;

/// Tag of handshake, device-memory, error and shutdown frames.
pub const TAG_CONTROL: i32 = 1;
/// Tag of TASK and DONE frames.
pub const TAG_TASK: i32 = 2;
/// Tag of heartbeats.
pub const TAG_HEARTBEAT: i32 = 3;
/// Tag of a DATA frame's head: its header and body prefix, without the payload, which
/// follows as its own message ([`TAG_BULK_PAYLOAD`]) so the receiver can take it straight
/// into its destination.
pub const TAG_BULK: i32 = 4;
/// Tag of a DATA frame's payload, sent right after its head ([`TAG_BULK`]).
pub const TAG_BULK_PAYLOAD: i32 = 7;
/// Tag of the empty message that ends a session (what a closed socket says over TCP).
pub const TAG_CLOSE: i32 = 5;

/// Tag of the raw MPI measurements ([`raw`]): plain `MPI_Send` / `MPI_Recv` between two
/// progress threads, the floor the transport is measured against.
pub const TAG_RAW: i32 = 6;

/// Bytes of sends a peer may have outstanding (eight bulk chunks: enough to keep the
/// fabric busy while the receiver drains, little enough to bound memory per peer).
pub const WINDOW_BYTES: usize = 8 * (CHUNK_BYTES + 64);

/// Frames a peer may have sent before its session reads them (the handshake needs a
/// handful); more is a protocol error.
const INBOX_LIMIT: usize = 256;

/// Outstanding sends past which a peer that never completes them is declared gone (its
/// heartbeats would otherwise pile up).
const MAX_INFLIGHT: usize = 4096;

/// How long the progress thread spins (yielding) after the last traffic before it parks:
/// a task's round trip stays on the fast path, an idle job costs no CPU.
const SPIN: Duration = Duration::from_millis(5);

/// The longest park of an idle progress thread (incoming messages cannot wake it: it
/// polls MPI at least this often).
const MAX_PARK: Duration = Duration::from_millis(1);

/// How long the exit handler waits for MPI to finalize before the process ends anyway.
const FINALIZE_BOUND: Duration = Duration::from_secs(10);

/// The tag of a frame, by its type byte.
pub fn tag_of(kind: FrameType) -> i32 {
    match kind {
        FrameType::Task | FrameType::Done => TAG_TASK,
        FrameType::Heartbeat => TAG_HEARTBEAT,
        FrameType::Data => TAG_BULK,
        _ => TAG_CONTROL,
    }
}

/// A whole frame received as one message: its header and body, checked.
///
/// # Errors
/// Any malformed frame ([`crate::WireError`]), or a frame whose tag is not its channel's.
pub fn decode_message(buf: &[u8], tag: i32) -> Result<(Header, &[u8]), NetError> {
    let raw: &[u8; HEADER_BYTES] = buf
        .get(..HEADER_BYTES)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| {
            NetError::Protocol(format!(
                "an MPI message of {} bytes is shorter than a frame header",
                buf.len()
            ))
        })?;
    let header = wire::decode_header(raw)?;
    let body = &buf[HEADER_BYTES..];
    if body.len() != header.length as usize {
        return Err(NetError::Protocol(format!(
            "an MPI message carries {} body bytes; its header says {}",
            body.len(),
            header.length
        )));
    }
    wire::check_body(raw, &header, body)?;
    if tag_of(header.kind) != tag {
        return Err(NetError::Protocol(format!(
            "a {:?} frame arrived with tag {tag} (its channel's tag is {})",
            header.kind,
            tag_of(header.kind)
        )));
    }
    Ok((header, body))
}

/// What the progress thread hands a session.
pub(crate) enum Incoming<'a> {
    /// One message's bytes (a frame, not yet decoded) and its tag.
    Frame(&'a [u8], i32),
    /// A DATA frame's header (checked but for the checksum, which covers the payload) and
    /// head, and its payload, matched but not yet received: the session lands it.
    Data(Header, wire::DataHead, MpiPayload),
    /// The peer ended the session ([`TAG_CLOSE`]).
    Closed,
    /// MPI failed on this peer (the message says how).
    Broken(String),
}

/// A session's receiver: runs on the progress thread.
pub(crate) type Handler = Box<dyn FnMut(Incoming<'_>) + Send>;

/// What the sessions and the progress thread share about one peer rank.
pub(crate) struct Peer {
    rank: i32,
    q: Mutex<PeerQueues>,
    changed: Condvar,
    /// The progress thread, unparked when there is something to send.
    thread: Thread,
}

#[derive(Default)]
struct PeerQueues {
    prio: VecDeque<Out>,
    main: VecDeque<Out>,
    /// Frames received with no handler installed yet (the handshake reads them).
    inbox: VecDeque<(Vec<u8>, i32)>,
    /// The peer sent [`TAG_CLOSE`] (`None`), or MPI failed on it (`Some(why)`).
    closed: Option<Option<String>>,
    /// The handler was told of `closed`.
    closed_told: bool,
    /// Nothing queued, nothing being streamed, no send outstanding.
    idle: bool,
    handler: Option<Handler>,
    /// Shared memory and session id for streaming bulk items.
    shared: Option<Arc<SharedMemory>>,
    session: u64,
    /// This side ended the session: queues dropped, a close message sent, everything
    /// from the peer discarded.
    cut: bool,
}

impl Peer {
    fn lock(&self) -> std::sync::MutexGuard<'_, PeerQueues> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `out` on `lane` for the progress thread; `Err` once the session was cut.
    pub(crate) fn send(&self, lane: Lane, out: Out) -> Result<(), ()> {
        {
            let mut q = self.lock();
            if q.cut {
                return Err(());
            }
            q.idle = false;
            match lane {
                Lane::Prio => q.prio.push_back(out),
                Lane::Main => q.main.push_back(out),
            }
        }
        self.thread.unpark();
        Ok(())
    }

    /// Installs the session's receiver: frames still unread from the handshake go to it
    /// first, then every later one, on the progress thread. `shared` and `session` are
    /// what bulk items are streamed from and stamped with.
    pub(crate) fn attach(&self, handler: Handler, shared: Arc<SharedMemory>, session: u64) {
        {
            let mut q = self.lock();
            q.handler = Some(handler);
            q.shared = Some(shared);
            q.session = session;
        }
        self.thread.unpark();
    }

    /// Ends the session from this side: nothing more is sent but one close message,
    /// nothing more is received. Idempotent.
    pub(crate) fn cut(&self) {
        {
            let mut q = self.lock();
            q.cut = true;
        }
        self.thread.unpark();
    }

    /// Waits until everything queued was handed to MPI and every send completed, or
    /// `deadline`.
    pub(crate) fn flush(&self, deadline: Instant) {
        let mut q = self.lock();
        while !q.idle && !q.cut && q.closed.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            q = self
                .changed
                .wait_timeout(q, left.min(Duration::from_millis(10)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A blocking frame connection to one peer over MPI, for the handshake and the start-up
/// frames (NODE_HELLO, READY) before the session's handler takes over.
pub struct MpiConn {
    pub(crate) peer: Arc<Peer>,
    session: u64,
    seq: u64,
}

impl MpiConn {
    /// A connection to rank `rank` of the job (the progress thread starts on first use).
    ///
    /// # Errors
    /// MPI did not start ([`Hub::get`]), or there is no such rank (or it is this one).
    pub fn to(rank: u32, session: u64) -> Result<MpiConn, NetError> {
        let hub = Hub::get()?;
        if rank == hub.rank || rank >= hub.size {
            return Err(NetError::Config(format!(
                "MPI rank {rank} is not a peer of rank {} in a job of {} ranks",
                hub.rank, hub.size
            )));
        }
        Ok(MpiConn {
            peer: hub.peers[rank as usize].clone(),
            session,
            seq: 0,
        })
    }
}

impl FrameConn for MpiConn {
    fn session(&self) -> u64 {
        self.session
    }

    fn set_session(&mut self, session: u64) {
        self.session = session;
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn send_frame(
        &mut self,
        kind: FrameType,
        frame: Vec<u8>,
        _deadline: Instant,
    ) -> Result<(), NetError> {
        // The progress thread sends it; a peer that never takes it is found by the
        // receive that follows (its deadline), as a full socket buffer would be. On the
        // priority lane: the session's first heartbeat (also a priority frame) must not
        // overtake the start-up frames queued before it, and nothing of the session's
        // ordered lane exists yet.
        self.peer.send(Lane::Prio, Out::Frame(frame)).map_err(|()| {
            NetError::Protocol(format!(
                "sending {kind:?} to MPI rank {}: the session was closed",
                self.peer.rank
            ))
        })
    }

    fn recv(&mut self, what: &str, deadline: Instant) -> Result<RawFrame, NetError> {
        let start = Instant::now();
        let mut q = self.peer.lock();
        loop {
            if let Some((buf, tag)) = q.inbox.pop_front() {
                drop(q);
                let (header, body) = decode_message(&buf, tag)?;
                return Ok(RawFrame {
                    header,
                    body: body.to_vec(),
                });
            }
            if let Some(how) = &q.closed {
                let why = match how {
                    None => format!("MPI rank {} ended the session", self.peer.rank),
                    Some(why) => format!("MPI failed on rank {}: {why}", self.peer.rank),
                };
                return Err(NetError::io(
                    what.to_owned(),
                    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, why),
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NetError::Timeout {
                    what: format!("{what} from MPI rank {}", self.peer.rank),
                    after: deadline.saturating_duration_since(start),
                });
            }
            q = self
                .peer
                .changed
                .wait_timeout(q, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The process's MPI progress thread and its peers.
pub struct Hub {
    /// This process's rank in `MPI_COMM_WORLD`.
    pub rank: u32,
    /// The job's number of ranks.
    pub size: u32,
    peers: Vec<Arc<Peer>>,
    thread: Thread,
    /// The exit handler asks the progress thread to finalize MPI.
    stop: AtomicBool,
    stopped: Mutex<bool>,
    stopped_cv: Condvar,
    pid: u32,
    /// A raw measurement asked of the progress thread ([`raw`]) and where its result goes.
    raw: Mutex<Option<RawJob>>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

/// A send MPI has not completed: its request, the bytes it counts against the window,
/// and the buffer it reads (a DATA frame's payload is the tail of its frame's buffer).
struct InFlight {
    req: ffi::MPI_Request,
    len: usize,
    _buf: Vec<u8>,
}

// SAFETY: an MPI request handle is an opaque pointer only the progress thread uses.
unsafe impl Send for InFlight {}

/// A bulk item being cut into chunks: (segment, region, first byte, bytes) parts.
struct Cursor {
    owner: u64,
    parts: Vec<(u32, u64, u64, u64)>,
    part: usize,
    off: u64,
}

/// A DATA frame's head whose payload message is still to be matched.
struct PendingHead {
    header: Header,
    head: wire::DataHead,
    raw: [u8; HEADER_BYTES],
    prefix: [u8; wire::DATA_PREFIX_MAX],
    used: usize,
    len: usize,
}

/// A DATA payload MPI matched but has not received: [`MpiPayload::land`] receives it
/// straight into its destination and checks the frame's checksum. Dropped unlanded, it is
/// received and discarded (a matched message must be received).
pub(crate) struct MpiPayload {
    msg: ffi::MPI_Message,
    received: bool,
    /// The head that announced it (its length, the bytes its checksum covers).
    head: PendingHead,
}

impl MpiPayload {
    /// The payload's length.
    pub(crate) fn len(&self) -> usize {
        self.head.len
    }

    /// Receives the message into `dst` (exactly `len` bytes).
    fn receive(&mut self, dst: &mut [u8]) -> Result<(), String> {
        debug_assert_eq!(dst.len(), self.len());
        self.received = true;
        mrecv(&mut self.msg, dst)
    }

    /// Receives the payload into `dst` (exactly its length) and checks the frame's
    /// checksum. On an error `dst` holds unspecified bytes and the session must end.
    pub(crate) fn land(mut self, dst: &mut [u8]) -> Result<(), DataError> {
        DataError::check_destination(self.len(), dst)?;
        self.receive(dst).map_err(|why| {
            DataError::Link(NetError::io(
                "receiving a DATA frame's payload over MPI",
                std::io::Error::other(why),
            ))
        })?;
        let h = &self.head;
        crate::tcp::check_landed(&h.raw, &h.prefix[..h.used], dst)
    }

    /// The whole frame (header, prefix, payload), as one buffer, checksum unchecked.
    fn into_frame(mut self) -> Result<Vec<u8>, String> {
        let h = &self.head;
        let at = HEADER_BYTES + h.used;
        let mut f = Vec::with_capacity(at + h.len);
        f.extend_from_slice(&h.raw);
        f.extend_from_slice(&h.prefix[..h.used]);
        f.resize(at + h.len, 0);
        self.receive(&mut f[at..])?;
        Ok(f)
    }
}

impl Drop for MpiPayload {
    fn drop(&mut self) {
        if !self.received {
            let _ = self.receive(&mut vec![0; self.len()]);
        }
    }
}

/// Receives the matched message `msg` into `dst`, which holds all of it.
fn mrecv(msg: &mut ffi::MPI_Message, dst: &mut [u8]) -> Result<(), String> {
    let count = i32::try_from(dst.len()).map_err(|_| "a message past 2 GiB".to_owned())?;
    // SAFETY: a plain C struct MPI fills in.
    let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
    // SAFETY: `msg` came from a probe on the progress thread (where this runs) and is
    // received once; `dst` holds `count` bytes.
    let rc = unsafe {
        ffi::MPI_Mrecv(
            dst.as_mut_ptr().cast(),
            count,
            ffi::RSMPI_UINT8_T,
            msg,
            &mut status,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(error_string(rc))
    }
}

/// Receives and drops a matched message of `count` bytes.
fn discard(mut msg: ffi::MPI_Message, count: usize) {
    let _ = mrecv(&mut msg, &mut vec![0; count]);
}

/// A DATA frame's head, if `msg` (a [`TAG_BULK`] message) is one; `None` for anything
/// else — a whole frame, or bytes the frame decoder refuses.
///
/// # Errors
/// A DATA header followed by bytes that are neither its whole body nor its prefix.
fn data_head(msg: &[u8]) -> Result<Option<PendingHead>, String> {
    let Some(raw) = msg
        .get(..HEADER_BYTES)
        .and_then(|r| <[u8; HEADER_BYTES]>::try_from(r).ok())
    else {
        return Ok(None);
    };
    let Ok(header) = wire::decode_header(&raw) else {
        return Ok(None);
    };
    let body = &msg[HEADER_BYTES..];
    if header.kind != FrameType::Data || body.len() == header.length as usize {
        return Ok(None);
    }
    let parsed = (body.len() <= wire::DATA_PREFIX_MAX)
        .then(|| wire::parse_data_prefix(body, header.length as usize))
        .flatten()
        .filter(|&(_, _, at)| at == body.len());
    let Some((head, len, used)) = parsed else {
        return Err(format!(
            "a DATA head message of {} bytes is neither its frame ({} body bytes) nor the frame's head",
            msg.len(),
            header.length
        ));
    };
    let mut prefix = [0; wire::DATA_PREFIX_MAX];
    prefix[..used].copy_from_slice(body);
    Ok(Some(PendingHead {
        header,
        head,
        raw,
        prefix,
        used,
        len,
    }))
}

/// The progress thread's own state for one peer.
#[derive(Default)]
struct Wire {
    /// A DATA head received, its payload next.
    head: Option<PendingHead>,
    inflight: VecDeque<InFlight>,
    bytes: usize,
    bulk: Option<Cursor>,
    close_sent: bool,
    /// Sends that failed: MPI may still own their buffers, so they are never freed.
    failed: Vec<InFlight>,
}

impl Hub {
    /// The progress thread, started (and MPI initialized) on first use.
    ///
    /// # Errors
    /// MPI could not be initialized, or did not answer within a minute.
    pub fn get() -> Result<&'static Hub, NetError> {
        HUB.get_or_init(start)
            .as_ref()
            .copied()
            .map_err(|e| NetError::Config(e.clone()))
    }
}

static HUB: OnceLock<Result<&'static Hub, String>> = OnceLock::new();

fn start() -> Result<&'static Hub, String> {
    let (tx, rx) = std::sync::mpsc::channel::<Result<&'static Hub, String>>();
    // FUNNELED: the thread that initializes MPI is the one allowed to call it, so it
    // becomes the progress thread.
    std::thread::Builder::new()
        .name("strata-mpi".into())
        .spawn(move || {
            let Some((universe, _level)) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            else {
                let _ = tx.send(Err(
                    "MPI was already initialized in this process by someone else".into(),
                ));
                return;
            };
            // SAFETY: reading one of MPI's constant handles.
            let mut comm: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
            // SAFETY: MPI is initialized on this thread; the handles are MPI's own
            // constants and an out-pointer to a local.
            let rc = unsafe {
                ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN);
                let rc = ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut comm);
                if rc == 0 {
                    ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN);
                }
                rc
            };
            let (mut rank, mut size) = (0, 0);
            if rc == 0 {
                // SAFETY: as above, out-pointers to locals.
                unsafe {
                    ffi::MPI_Comm_rank(comm, &mut rank);
                    ffi::MPI_Comm_size(comm, &mut size);
                }
            }
            if rc != 0 || size < 1 || rank < 0 || rank >= size {
                let _ = tx.send(Err(format!(
                    "MPI_Comm_dup failed ({}), or rank {rank} of {size} is not valid",
                    error_string(rc)
                )));
                return;
            }
            let me = std::thread::current();
            let peers = (0..size)
                .map(|r| {
                    Arc::new(Peer {
                        rank: r,
                        q: Mutex::new(PeerQueues {
                            idle: true,
                            ..PeerQueues::default()
                        }),
                        changed: Condvar::new(),
                        thread: me.clone(),
                    })
                })
                .collect();
            let hub: &'static Hub = Box::leak(Box::new(Hub {
                rank: rank as u32,
                size: size as u32,
                peers,
                thread: me,
                stop: AtomicBool::new(false),
                stopped: Mutex::new(false),
                stopped_cv: Condvar::new(),
                pid: std::process::id(),
                raw: Mutex::new(None),
            }));
            // SAFETY: registers a plain `extern "C" fn` with the C library.
            unsafe { libc::atexit(at_exit) };
            let _ = tx.send(Ok(hub));
            progress(hub, comm);
            // SAFETY: the communicator this thread duplicated; no send or receive of it is
            // waited for any more.
            unsafe { ffi::MPI_Comm_free(&mut comm) };
            // MPI_Finalize.
            drop(universe);
            *hub.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
            hub.stopped_cv.notify_all();
        })
        .map_err(|e| format!("cannot start the MPI progress thread: {e}"))?;
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => r,
        Err(_) => {
            Err("MPI_Init did not finish within 60 s (is this process started by mpirun?)".into())
        }
    }
}

/// MPI's text for error code `rc`.
fn error_string(rc: i32) -> String {
    if rc == 0 {
        return "success".into();
    }
    let mut buf = vec![0 as std::os::raw::c_char; 512];
    let mut len = 0;
    // SAFETY: a buffer of MPI_MAX_ERROR_STRING (≤ 512 in Open MPI and MPICH) characters
    // and an out-pointer for its length.
    let ok = unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr(), &mut len) } == 0;
    if !ok {
        return format!("MPI error {rc}");
    }
    let bytes: Vec<u8> = buf[..len.clamp(0, 512) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    format!("{} (MPI error {rc})", String::from_utf8_lossy(&bytes))
}

/// Runs at `exit`: has the progress thread flush what is queued (bounded) and finalize
/// MPI — an MPI job whose process ends without `MPI_Finalize` is reported as failed by
/// `mpirun` —, and ends the process at once if MPI does not finalize within
/// [`FINALIZE_BOUND`] (a dead peer can keep it from doing so).
extern "C" fn at_exit() {
    let Some(Ok(hub)) = HUB.get() else {
        return;
    };
    // A child forked after MPI started has the handler but not the thread.
    if std::process::id() != hub.pid {
        return;
    }
    hub.stop.store(true, Ordering::Release);
    hub.thread.unpark();
    let deadline = Instant::now() + FINALIZE_BOUND;
    let mut done = hub.stopped.lock().unwrap_or_else(|e| e.into_inner());
    while !*done {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            eprintln!(
                "strata-net: MPI did not finalize within {FINALIZE_BOUND:?} (a rank died?); exiting without it"
            );
            // SAFETY: ends the process now; nothing of it is needed any more.
            unsafe { libc::_exit(4) };
        }
        done = hub
            .stopped_cv
            .wait_timeout(done, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// The progress loop: sends what the sessions queued, completes sends, receives and
/// hands out frames; spins (yielding) while there is traffic, parks when idle. Returns
/// when the exit handler asks, once everything queued went out (bounded).
fn progress(hub: &'static Hub, comm: ffi::MPI_Comm) {
    let mut wires: Vec<Wire> = hub.peers.iter().map(|_| Wire::default()).collect();
    let mut buf = vec![0u8; HEADER_BYTES + MAX_BODY];
    let mut last_active = Instant::now();
    let mut stop_by: Option<Instant> = None;
    loop {
        let mut active = false;
        for (p, w) in hub.peers.iter().zip(wires.iter_mut()) {
            if p.rank as u32 != hub.rank {
                active |= pump(p, w, comm);
            }
        }
        active |= receive(hub, comm, &mut buf, &mut wires);
        active |= deliver(hub);
        let job = hub.raw.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(job) = job {
            let r = run_raw(comm, &job.op);
            let _ = job.done.send(r);
            active = true;
        }
        if hub.stop.load(Ordering::Acquire) {
            let by = *stop_by.get_or_insert_with(|| Instant::now() + Duration::from_secs(2));
            let idle = hub.peers.iter().all(|p| {
                let q = p.lock();
                q.idle || q.cut || q.closed.is_some()
            });
            if idle || Instant::now() >= by {
                // Sessions still open (the program ended without closing its level-4
                // worker): their peers are told now, rather than finding out by their
                // heartbeat timeout while this rank waits in MPI_Finalize.
                for (p, w) in hub.peers.iter().zip(wires.iter_mut()) {
                    let open = {
                        let q = p.lock();
                        q.handler.is_some() && !q.cut && q.closed.is_none()
                    };
                    if open {
                        p.cut();
                        pump(p, w, comm);
                    }
                }
                let until = Instant::now() + Duration::from_millis(200);
                while Instant::now() < until
                    && wires.iter_mut().zip(&hub.peers).any(|(w, p)| {
                        pump(p, w, comm);
                        !w.inflight.is_empty()
                    })
                {
                    std::thread::yield_now();
                }
                return;
            }
        }
        if active {
            last_active = Instant::now();
        } else if last_active.elapsed() < SPIN {
            std::thread::yield_now();
        } else {
            std::thread::park_timeout(MAX_PARK);
        }
    }
}

/// Starts a send of `frame` to `p` with `tag`.
fn isend(
    p: &Peer,
    w: &mut Wire,
    comm: ffi::MPI_Comm,
    frame: Vec<u8>,
    tag: i32,
) -> Result<(), String> {
    isend_part(p, w, comm, frame, 0, tag)
}

/// Starts a send of `buf[from..]` to `p` with `tag`.
fn isend_part(
    p: &Peer,
    w: &mut Wire,
    comm: ffi::MPI_Comm,
    buf: Vec<u8>,
    from: usize,
    tag: i32,
) -> Result<(), String> {
    let part = buf.get(from..).unwrap_or_default();
    let (at, len) = (part.as_ptr(), part.len());
    let count = i32::try_from(len).map_err(|_| "a message past 2 GiB".to_owned())?;
    // SAFETY: reading one of MPI's constant handles.
    let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: the buffer stays alive and unmoved (a heap block does not move with its
    // `Vec`) in `inflight` until MPI reports the send complete, or for good in `failed`;
    // the handles are MPI's.
    let rc = unsafe {
        ffi::MPI_Isend(
            at.cast(),
            count,
            ffi::RSMPI_UINT8_T,
            p.rank,
            tag,
            comm,
            &mut req,
        )
    };
    if rc != 0 {
        w.failed.push(InFlight {
            req,
            len,
            _buf: buf,
        });
        return Err(format!(
            "MPI_Isend to rank {}: {}",
            p.rank,
            error_string(rc)
        ));
    }
    w.bytes += len;
    w.inflight.push_back(InFlight {
        req,
        len,
        _buf: buf,
    });
    Ok(())
}

/// Sends a whole DATA frame as its head, then its payload from the frame's own buffer:
/// the receiver takes the payload straight into its destination. A frame without payload
/// (or one that does not parse, for the receiver to refuse) goes whole.
fn send_data_frame(
    p: &Peer,
    w: &mut Wire,
    comm: ffi::MPI_Comm,
    frame: Vec<u8>,
) -> Result<(), String> {
    match payload_start(&frame) {
        Some(at) => {
            isend(p, w, comm, frame[..at].to_vec(), TAG_BULK)?;
            isend_part(p, w, comm, frame, at, TAG_BULK_PAYLOAD)
        }
        None => isend(p, w, comm, frame, TAG_BULK),
    }
}

/// Where the payload of DATA frame `frame` starts, if it has one (and parses).
fn payload_start(frame: &[u8]) -> Option<usize> {
    let body = frame.get(HEADER_BYTES..)?;
    let start = &body[..body.len().min(wire::DATA_PREFIX_MAX)];
    match wire::parse_data_prefix(start, body.len()) {
        Some((_, len, at)) if len > 0 => Some(HEADER_BYTES + at),
        _ => None,
    }
}

/// MPI failed on `p`: its session is told (by [`deliver`]), nothing more is sent.
fn broken(p: &Peer, q: &mut PeerQueues, why: String) {
    if q.closed.is_none() {
        q.closed = Some(Some(why));
    }
    q.prio.clear();
    q.main.clear();
    p.changed.notify_all();
}

/// One peer's sends: completes finished ones, then starts queued ones while the window
/// has room (priority frames first, between any two chunks). Whether anything moved.
fn pump(p: &Peer, w: &mut Wire, comm: ffi::MPI_Comm) -> bool {
    let mut active = false;
    while let Some(f) = w.inflight.front_mut() {
        let mut flag = 0;
        // SAFETY: a request this thread started and has not completed.
        let rc = unsafe { ffi::MPI_Test(&mut f.req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        if rc != 0 {
            let why = format!("a send to rank {} failed: {}", p.rank, error_string(rc));
            w.failed.extend(w.inflight.drain(..));
            w.bytes = 0;
            w.bulk = None;
            broken(p, &mut p.lock(), why);
            return true;
        }
        if flag == 0 {
            break;
        }
        if let Some(f) = w.inflight.pop_front() {
            w.bytes -= f.len;
        }
        active = true;
    }
    let mut q = p.lock();
    if q.cut {
        q.prio.clear();
        q.main.clear();
        q.inbox.clear();
        w.bulk = None;
        let h = q.handler.take();
        let was_closed = q.closed.is_some();
        drop(q);
        // (The handler holds its session: dropped outside the lock.)
        drop(h);
        if !w.close_sent && !was_closed {
            w.close_sent = true;
            let _ = isend(p, w, comm, Vec::new(), TAG_CLOSE);
        }
        return active;
    }
    if q.closed.is_some() {
        q.prio.clear();
        q.main.clear();
        w.bulk = None;
        return active;
    }
    loop {
        if w.inflight.len() > MAX_INFLIGHT {
            broken(
                p,
                &mut q,
                format!("rank {} took none of {MAX_INFLIGHT} messages", p.rank),
            );
            return true;
        }
        let out = if let Some(o) = q.prio.pop_front() {
            Some(o)
        } else if w.bytes >= WINDOW_BYTES && !w.inflight.is_empty() {
            break;
        } else if w.bulk.is_some() {
            None
        } else if let Some(o) = q.main.pop_front() {
            Some(o)
        } else {
            break;
        };
        active = true;
        let r = match out {
            Some(Out::Frame(f)) => {
                let tag = f
                    .get(6)
                    .and_then(|&b| FrameType::from_u8(b))
                    .map_or(TAG_CONTROL, tag_of);
                if tag == TAG_BULK {
                    send_data_frame(p, w, comm, f)
                } else {
                    isend(p, w, comm, f, tag)
                }
            }
            Some(Out::Bulk { owner, parts }) => {
                w.bulk = Some(Cursor {
                    owner,
                    parts,
                    part: 0,
                    off: 0,
                });
                Ok(())
            }
            Some(Out::Then(f)) => {
                drop(q);
                f();
                q = p.lock();
                Ok(())
            }
            None => {
                let (session, shared) = (q.session, q.shared.clone());
                next_chunk(p, w, comm, session, shared.as_deref())
            }
        };
        if let Err(why) = r {
            broken(p, &mut q, why);
            return true;
        }
    }
    let idle = q.prio.is_empty() && q.main.is_empty() && w.bulk.is_none() && w.inflight.is_empty();
    if idle && !q.idle {
        q.idle = true;
        p.changed.notify_all();
    }
    active
}

/// Sends the next chunk of the bulk item being streamed, copied from shared memory into a
/// frame now (the window paces the reads). Copied, not sent in place: measured, sending
/// straight from the staging area made `copy_from` a third slower — the receiver's
/// single-copy read (CMA) of pages another process wrote costs more than this copy.
fn next_chunk(
    p: &Peer,
    w: &mut Wire,
    comm: ffi::MPI_Comm,
    session: u64,
    shared: Option<&SharedMemory>,
) -> Result<(), String> {
    let Some(c) = w.bulk.as_mut() else {
        return Ok(());
    };
    let Some(&(segment, region, start, len)) = c.parts.get(c.part) else {
        w.bulk = None;
        return Ok(());
    };
    let shared = shared.ok_or("bulk data queued before the session started")?;
    let n = (len - c.off).min(CHUNK_BYTES as u64) as usize;
    let offset = c.off;
    let owner = c.owner;
    c.off += n as u64;
    if c.off >= len {
        c.part += 1;
        c.off = 0;
        if c.part >= c.parts.len() {
            w.bulk = None;
        }
    }
    if n == 0 {
        return Ok(());
    }
    let src = shared
        .ptr(region, start + offset, n as u64)
        .map_err(|e| e.to_string())?;
    let head = wire::DataHead {
        owner,
        segment,
        offset,
    };
    let mut f = Vec::with_capacity(n + 64);
    wire::encode_data(&mut f, session, owner, head, n, |dst| {
        // SAFETY: `ptr` checked the range lies in the region; the task (or request) that
        // queued the item holds the bytes until its `Then` after it ran.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), n) }
    });
    send_data_frame(p, w, comm, f)
}

/// Matches and receives what arrived (up to a batch), handing each frame to its peer's
/// session, or to its inbox while none is installed; a DATA payload is handed over
/// matched, not received (the session receives it at its destination). Whether anything
/// arrived.
fn receive(hub: &'static Hub, comm: ffi::MPI_Comm, buf: &mut [u8], wires: &mut [Wire]) -> bool {
    let mut any = false;
    for _ in 0..64 {
        let mut flag = 0;
        // SAFETY: reading one of MPI's constant handles.
        let mut msg: ffi::MPI_Message = unsafe { ffi::RSMPI_MESSAGE_NULL };
        // SAFETY: a plain C struct MPI fills in.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: out-pointers to locals; the communicator is this thread's.
        let rc = unsafe {
            ffi::MPI_Improbe(
                ffi::RSMPI_ANY_SOURCE,
                ffi::RSMPI_ANY_TAG,
                comm,
                &mut flag,
                &mut msg,
                &mut status,
            )
        };
        if rc != 0 || flag == 0 {
            break;
        }
        any = true;
        let mut count = 0;
        // SAFETY: the status MPI just filled in.
        unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
        let (src, tag) = (status.MPI_SOURCE, status.MPI_TAG);
        let from = usize::try_from(src)
            .ok()
            .and_then(|i| Some((hub.peers.get(i)?, wires.get_mut(i)?)));
        if tag == TAG_BULK_PAYLOAD {
            match from {
                Some((p, w)) => payload_arrived(p, w, msg, count.max(0) as usize),
                None => discard(msg, count.max(0) as usize),
            }
            continue;
        }
        let n = (count.max(0) as usize).min(buf.len());
        // SAFETY: `buf` holds at least `n` bytes; the message handle came from the probe.
        // A message longer than `buf` is cut (MPI_ERR_TRUNCATE) and refused below.
        let rc = unsafe {
            ffi::MPI_Mrecv(
                buf.as_mut_ptr().cast(),
                n as i32,
                ffi::RSMPI_UINT8_T,
                &mut msg,
                &mut status,
            )
        };
        let Some((p, w)) = from else {
            continue;
        };
        let mut q = p.lock();
        if q.cut || q.closed.is_some() {
            w.head = None;
            continue;
        }
        if rc != 0 || count as usize > buf.len() {
            let why = format!(
                "receiving a message of {count} bytes from rank {src}: {}",
                if rc != 0 {
                    error_string(rc)
                } else {
                    format!("larger than a frame ({} bytes)", buf.len())
                }
            );
            broken(p, &mut q, why);
            continue;
        }
        if w.head.is_some() {
            // (MPI keeps a sender's messages in order: the payload was next.)
            let why =
                format!("rank {src} sent a message between a DATA frame's head and its payload");
            broken(p, &mut q, why);
            continue;
        }
        if tag == TAG_BULK {
            match data_head(&buf[..n]) {
                Ok(Some(head)) => {
                    w.head = Some(head);
                    continue;
                }
                Ok(None) => {}
                Err(why) => {
                    broken(p, &mut q, format!("rank {src}: {why}"));
                    continue;
                }
            }
        }
        // Raw exchanges only with a peer whose session is up (a rank of this job that
        // passed the handshake), so nothing else can hold the progress thread in one.
        if tag == TAG_RAW && q.handler.is_some() {
            drop(q);
            serve_raw(comm, src, &buf[..n]);
            continue;
        }
        if tag == TAG_CLOSE {
            q.closed = Some(None);
            p.changed.notify_all();
            continue;
        }
        if q.handler.is_some() && q.inbox.is_empty() {
            with_handler(p, q, |h| h(Incoming::Frame(&buf[..n], tag)));
        } else {
            to_inbox(p, &mut q, buf[..n].to_vec(), tag);
        }
    }
    any
}

/// A DATA payload from `p` was matched: handed to its session with the head received
/// before it, or into the inbox as a whole frame while no session is installed.
fn payload_arrived(p: &Peer, w: &mut Wire, msg: ffi::MPI_Message, count: usize) {
    let head = w.head.take();
    let mut q = p.lock();
    if q.cut || q.closed.is_some() {
        return discard(msg, count);
    }
    let Some(h) = head.filter(|h| h.len == count) else {
        discard(msg, count);
        let why = format!(
            "rank {} sent a DATA payload of {count} bytes without a head announcing it",
            p.rank
        );
        return broken(p, &mut q, why);
    };
    let (header, head) = (h.header, h.head);
    let payload = MpiPayload {
        msg,
        received: false,
        head: h,
    };
    if q.handler.is_some() && q.inbox.is_empty() {
        return with_handler(p, q, |handler| {
            handler(Incoming::Data(header, head, payload));
        });
    }
    match payload.into_frame() {
        Ok(frame) => to_inbox(p, &mut q, frame, TAG_BULK),
        Err(why) => broken(p, &mut q, format!("receiving a DATA payload: {why}")),
    }
}

/// Runs `f` with `p`'s session handler outside the peer's lock (`q`: a handler sends,
/// which takes it), then puts the handler back unless the session was cut meanwhile.
fn with_handler(
    p: &Peer,
    mut q: std::sync::MutexGuard<'_, PeerQueues>,
    f: impl FnOnce(&mut Handler),
) {
    let mut handler = q.handler.take();
    drop(q);
    if let Some(h) = handler.as_mut() {
        f(h);
    }
    let mut q = p.lock();
    if !q.cut && q.handler.is_none() {
        q.handler = handler;
    }
}

/// Keeps a frame for a session not yet installed (the handshake reads it); past
/// [`INBOX_LIMIT`] the peer broke the protocol.
fn to_inbox(p: &Peer, q: &mut PeerQueues, frame: Vec<u8>, tag: i32) {
    if q.inbox.len() >= INBOX_LIMIT {
        let why = format!(
            "rank {} sent {INBOX_LIMIT} frames before its session started",
            p.rank
        );
        return broken(p, q, why);
    }
    q.inbox.push_back((frame, tag));
    p.changed.notify_all();
}

/// Hands each session with a handler the frames its inbox still holds, then its end if
/// it ended. Whether anything was handed out.
fn deliver(hub: &'static Hub) -> bool {
    let mut any = false;
    for p in &hub.peers {
        let mut q = p.lock();
        let untold = q.closed.is_some() && !q.closed_told;
        if q.handler.is_none() || q.cut || (q.inbox.is_empty() && !untold) {
            continue;
        }
        any = true;
        let inbox = std::mem::take(&mut q.inbox);
        let closed = if untold {
            q.closed_told = true;
            q.closed.clone()
        } else {
            None
        };
        with_handler(p, q, |h| {
            for (frame, tag) in &inbox {
                h(Incoming::Frame(frame, *tag));
            }
            match closed {
                Some(None) => h(Incoming::Closed),
                Some(Some(why)) => h(Incoming::Broken(why)),
                None => {}
            }
        });
    }
    any
}

/// A raw MPI measurement between this rank and `peer` ([`raw`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawOp {
    /// `n` round trips: a 64-byte `MPI_Send`, a 32-byte reply (`MPI_Recv`).
    PingPong {
        /// The peer rank.
        peer: u32,
        /// Round trips.
        n: u32,
    },
    /// `bytes` sent to the peer in one `MPI_Send`, acknowledged with one byte.
    Send {
        /// The peer rank.
        peer: u32,
        /// Bytes.
        bytes: u64,
    },
    /// `bytes` received from the peer in one `MPI_Recv`.
    Receive {
        /// The peer rank.
        peer: u32,
        /// Bytes.
        bytes: u64,
    },
}

/// What a [`RawOp`] measured: per round trip in µs (ping-pong), or one figure in GB/s.
pub type RawResult = Result<Vec<f64>, String>;

struct RawJob {
    op: RawOp,
    done: std::sync::mpsc::Sender<RawResult>,
}

/// Runs a raw MPI measurement on the progress thread — plain blocking `MPI_Send` /
/// `MPI_Recv` on the transport's communicator, the peer's progress thread answering in a
/// blocking loop too — so that a benchmark compares the transport with MPI itself
/// between the same two processes. The sessions' traffic waits meanwhile (keep `n`
/// small against the heartbeat timeout).
///
/// # Errors
/// MPI is not running here, the peer is not a rank of the job, or MPI failed.
pub fn raw(op: RawOp) -> RawResult {
    let hub = Hub::get().map_err(|e| e.to_string())?;
    let peer = match op {
        RawOp::PingPong { peer, .. } | RawOp::Send { peer, .. } | RawOp::Receive { peer, .. } => {
            peer
        }
    };
    if peer == hub.rank || peer >= hub.size {
        return Err(format!("rank {peer} is not a peer of rank {}", hub.rank));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    *hub.raw.lock().unwrap_or_else(|e| e.into_inner()) = Some(RawJob { op, done: tx });
    hub.thread.unpark();
    rx.recv()
        .map_err(|_| "the MPI progress thread ended".to_owned())?
}

/// The first message of a raw exchange: kind (`p`, `s`, `f`, `e`) and a byte count.
fn raw_head(kind: u8, bytes: u64) -> [u8; 9] {
    let mut h = [0u8; 9];
    h[0] = kind;
    h[1..].copy_from_slice(&bytes.to_le_bytes());
    h
}

fn mpi_send(comm: ffi::MPI_Comm, buf: &[u8], peer: i32) -> Result<(), String> {
    let n = i32::try_from(buf.len()).map_err(|_| "a message past 2 GiB".to_owned())?;
    // SAFETY: a live buffer of `n` bytes; blocking send on this thread's communicator.
    let rc = unsafe {
        ffi::MPI_Send(
            buf.as_ptr().cast(),
            n,
            ffi::RSMPI_UINT8_T,
            peer,
            TAG_RAW,
            comm,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("MPI_Send to rank {peer}: {}", error_string(rc)))
    }
}

fn mpi_recv(comm: ffi::MPI_Comm, buf: &mut [u8], peer: i32) -> Result<usize, String> {
    let n = i32::try_from(buf.len()).map_err(|_| "a message past 2 GiB".to_owned())?;
    // SAFETY: a plain C struct MPI fills in.
    let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
    // SAFETY: a live buffer of `n` bytes; blocking receive on this thread's communicator.
    let rc = unsafe {
        ffi::MPI_Recv(
            buf.as_mut_ptr().cast(),
            n,
            ffi::RSMPI_UINT8_T,
            peer,
            TAG_RAW,
            comm,
            &mut status,
        )
    };
    if rc != 0 {
        return Err(format!("MPI_Recv from rank {peer}: {}", error_string(rc)));
    }
    let mut count = 0;
    // SAFETY: the status MPI just filled in.
    unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
    Ok(count.max(0) as usize)
}

thread_local! {
    /// The raw exchanges' buffer, kept (and so touched) between rounds: a fresh buffer's
    /// page faults would be measured as MPI's cost.
    static RAW_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with the progress thread's raw buffer of at least `n` bytes.
fn with_raw_buf<R>(n: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    RAW_BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < n {
            b.resize(n, 5);
        }
        f(&mut b[..n])
    })
}

/// The measuring side of a [`RawOp`].
fn run_raw(comm: ffi::MPI_Comm, op: &RawOp) -> RawResult {
    match *op {
        RawOp::PingPong { peer, n } => {
            let p = peer as i32;
            mpi_send(comm, &raw_head(b'p', u64::from(n)), p)?;
            let (req, mut rep) = ([7u8; 64], [0u8; 32]);
            let mut out = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let t = Instant::now();
                mpi_send(comm, &req, p)?;
                mpi_recv(comm, &mut rep, p)?;
                out.push(t.elapsed().as_secs_f64() * 1e6);
            }
            Ok(out)
        }
        RawOp::Send { peer, bytes } => {
            let p = peer as i32;
            with_raw_buf(bytes as usize, |buf| {
                let t = Instant::now();
                mpi_send(comm, &raw_head(b's', bytes), p)?;
                mpi_send(comm, buf, p)?;
                mpi_recv(comm, &mut [0u8; 1], p)?;
                Ok(vec![bytes as f64 / t.elapsed().as_secs_f64() / 1e9])
            })
        }
        RawOp::Receive { peer, bytes } => {
            let p = peer as i32;
            with_raw_buf(bytes as usize, |buf| {
                let t = Instant::now();
                mpi_send(comm, &raw_head(b'f', bytes), p)?;
                mpi_recv(comm, buf, p)?;
                Ok(vec![bytes as f64 / t.elapsed().as_secs_f64() / 1e9])
            })
        }
    }
}

/// The answering side of a [`RawOp`], started by its first message `head` from `src`:
/// blocking sends and receives until the exchange is over.
fn serve_raw(comm: ffi::MPI_Comm, src: i32, head: &[u8]) {
    let (kind, bytes) = match head {
        [k, rest @ ..] if rest.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(rest);
            (*k, u64::from_le_bytes(b))
        }
        _ => return,
    };
    // Bounded: a raw exchange is a benchmark's, at most a few hundred MiB or a million
    // round trips.
    if bytes > 1 << 32 || (kind == b'p' && bytes > 1 << 20) {
        return;
    }
    let r = match kind {
        b'p' => {
            let (mut req, rep) = ([0u8; 64], [9u8; 32]);
            (0..bytes).try_for_each(|_| {
                mpi_recv(comm, &mut req, src)?;
                mpi_send(comm, &rep, src)
            })
        }
        b's' => with_raw_buf(bytes as usize, |buf| {
            mpi_recv(comm, buf, src).and_then(|_| mpi_send(comm, &[1], src))
        }),
        b'f' => with_raw_buf(bytes as usize, |buf| mpi_send(comm, buf, src)),
        _ => Ok(()),
    };
    if let Err(e) = r {
        eprintln!("strata-net: a raw MPI exchange with rank {src} failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_frame_split_in_head_and_payload_is_the_same_frame() {
        let payload: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 256) as u8).collect();
        let head = wire::DataHead {
            owner: 1 << 33,
            segment: 2,
            offset: 300,
        };
        let mut f = Vec::new();
        wire::encode_data(&mut f, 9, 1 << 33, head, payload.len(), |d| {
            d.copy_from_slice(&payload)
        });
        let at = payload_start(&f).expect("a DATA frame with a payload splits");
        assert_eq!(&f[at..], &payload[..]);
        // Its head message parses as the head announcing exactly that payload, and the
        // checksum the receiver computes over the landed payload is the frame's.
        let h = data_head(&f[..at]).unwrap().expect("a DATA head");
        assert_eq!(
            (h.len, h.head.owner, h.head.segment, h.head.offset),
            (5000, 1 << 33, 2, 300)
        );
        assert_eq!(h.header.length as usize, f.len() - HEADER_BYTES);
        let sum = wire::checksum(&[&h.raw[0..28], &h.prefix[..h.used], &f[at..]]);
        assert_eq!(sum.to_le_bytes(), f[28..32]);
        // The frame in one piece is no head (it is decoded whole), nor is another type.
        assert!(data_head(&f).unwrap().is_none());
        assert!(data_head(&frame(FrameType::Heartbeat)).unwrap().is_none());
        // A head with bytes cut off, or with bytes of the payload, is refused.
        assert!(data_head(&f[..at - 1]).is_err());
        assert!(data_head(&f[..at + 1]).is_err());
        // A frame without payload is sent whole.
        let mut empty = Vec::new();
        wire::encode_data(&mut empty, 9, 1, head, 0, |_| {});
        assert_eq!(payload_start(&empty), None);
        assert!(data_head(&empty).unwrap().is_none());
    }

    fn frame(kind: FrameType) -> Vec<u8> {
        match kind {
            FrameType::Heartbeat | FrameType::Shutdown => wire::encode(kind, 7, 1, &()).unwrap(),
            FrameType::Cancel => wire::encode(kind, 7, 1, &wire::Cancel { task: 3 }).unwrap(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn every_frame_type_has_its_channel_tag() {
        let tags: Vec<i32> = (1..=15u8)
            .map(|b| tag_of(FrameType::from_u8(b).unwrap()))
            .collect();
        // HELLO … READY control; TASK task; DATA bulk; DONE task; CONTROL, REPLY control;
        // HEARTBEAT; CANCEL, SHUTDOWN, ACK control.
        assert_eq!(
            tags,
            [1, 1, 1, 1, 1, 1, 2, 4, 2, 1, 1, 3, 1, 1, 1],
            "{tags:?}"
        );
    }

    #[test]
    fn a_message_decodes_only_whole_checked_and_on_its_channel() {
        let hb = frame(FrameType::Heartbeat);
        let (h, body) = decode_message(&hb, TAG_HEARTBEAT).unwrap();
        assert_eq!(
            (h.kind, h.session, body.len()),
            (FrameType::Heartbeat, 7, 0)
        );
        // Another channel's tag.
        let e = decode_message(&hb, TAG_TASK).unwrap_err();
        assert!(e.to_string().contains("tag 2"), "{e}");
        // Shorter than a header.
        let e = decode_message(&hb[..10], TAG_HEARTBEAT).unwrap_err();
        assert!(e.to_string().contains("shorter than a frame header"), "{e}");
        // A body the header does not announce.
        let c = frame(FrameType::Cancel);
        let mut longer = c.clone();
        longer.push(0);
        let e = decode_message(&longer, TAG_CONTROL).unwrap_err();
        assert!(e.to_string().contains("body bytes"), "{e}");
        // A flipped body byte: the checksum.
        let mut bad = c.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        assert!(matches!(
            decode_message(&bad, TAG_CONTROL),
            Err(NetError::Wire(_))
        ));
        assert!(decode_message(&c, TAG_CONTROL).is_ok());
        assert!(decode_message(&frame(FrameType::Shutdown), TAG_CONTROL).is_ok());
    }
}
