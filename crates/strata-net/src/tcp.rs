//! A session's TCP link on plain threads: a reader thread blocked in `recv`, a writer
//! thread for what the sending threads could not write at once, and direct writes.
//!
//! Sessions used to run their reader and writer as tasks of this crate's tokio runtime.
//! Timestamps of a remote round trip on loopback showed what that cost: each small write
//! took 11–12 µs (the socket sat in the runtime's epoll set, so every frame and every ACK
//! woke the runtime's thread as well as the peer's), and every frame in crossed one more
//! thread before anyone saw it. A thread blocked in `recv` is what a raw TCP
//! request/response has on each side, and it is woken once per frame, by the frame.
//!
//! - **Direct writes.** A frame sent while the writer holds nothing (no item queued or
//!   being written) is written by the sending thread itself with `MSG_DONTWAIT`, so the
//!   scheduler or the node's main thread never blocks on the network and no thread is
//!   woken to write it; whatever the socket did not take goes to the head of the
//!   priority lane, so frames never interleave.
//! - **The writer** takes the priority lane (heartbeats, errors) before the ordered lane
//!   (tasks, their bulk data, completions, device-memory requests), streams bulk data
//!   from shared memory in chunks with priority frames between them, and blocks in
//!   `send` when the socket is full: that is the back-pressure. It ends once the lanes
//!   are closed and drained, or the socket fails (a cut session's socket is shut down,
//!   which ends a blocked `send` at once).
//! - **The reader** is each side's own loop ([`read_next`] then its frame handler); it
//!   ends when the socket is shut down or fails. It reads through a small read-ahead
//!   buffer ([`FrameReader`]: one `recv` per small frame, not one for the header and one
//!   for the body), and a DATA frame's payload past what was read ahead goes from the
//!   socket straight to where it lands (the staging area, a task's output tensor, the
//!   buffer of a copy); a bulk sender writes the frame's head and then the payload
//!   straight from shared memory: the kernel's copies and the checksum are the only
//!   passes over the bytes (plus at most the read-ahead's few KiB per frame).

use crate::client::{Lane, Out};
use crate::error::NetError;
use crate::wire::{self, Header, CHUNK_BYTES, HEADER_BYTES};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use strata_host::SharedMemory;

/// What the senders and the writer thread share.
#[derive(Default)]
struct Lanes {
    st: Mutex<LaneState>,
    ready: Condvar,
}

#[derive(Default)]
struct LaneState {
    prio: VecDeque<Out>,
    main: VecDeque<Out>,
    /// Items queued or being written; a direct write needs 0.
    pending: u64,
    /// No item is taken any more: the writer drains what is queued and ends.
    closed: bool,
}

impl Lanes {
    fn lock(&self) -> MutexGuard<'_, LaneState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer finished an item.
    fn done(&self) {
        let mut st = self.lock();
        st.pending = st.pending.saturating_sub(1);
    }

    /// The next frame of the priority lane, if one is queued (it carries frames only).
    fn next_prio_frame(&self) -> Option<Vec<u8>> {
        let mut st = self.lock();
        match st.prio.front() {
            Some(Out::Frame(_)) => match st.prio.pop_front() {
                Some(Out::Frame(f)) => Some(f),
                _ => None,
            },
            _ => None,
        }
    }
}

/// The sending side of a TCP session (see the module docs). Dropping it closes the
/// lanes: the writer writes what is queued, then ends.
pub(crate) struct TcpTx {
    lanes: Arc<Lanes>,
    /// The session's socket, for the direct writes.
    sock: TcpStream,
}

impl TcpTx {
    /// Sends `out` on `lane`; `Err` once the lanes are closed (the session was cut).
    pub(crate) fn send(&self, lane: Lane, out: Out) -> Result<(), ()> {
        let mut st = self.lanes.lock();
        if st.closed {
            return Err(());
        }
        if st.pending == 0 {
            match out {
                Out::Frame(f) => {
                    let rest = match send_now(&self.sock, &f) {
                        Ok(n) if n == f.len() => return Ok(()),
                        // The rest first, before anything queued after this.
                        Ok(n) => {
                            st.prio.push_front(Out::Frame(f[n..].to_vec()));
                            None
                        }
                        // Nothing was written: the writer writes it (and meets the
                        // socket's error, if it has one).
                        Err(_) => Some(Out::Frame(f)),
                    };
                    if let Some(out) = rest {
                        queue(&mut st, lane, out);
                    }
                    st.pending += 1;
                    drop(st);
                    self.lanes.ready.notify_one();
                    return Ok(());
                }
                // Everything before it is written: run it now.
                Out::Then(f) => {
                    drop(st);
                    f();
                    return Ok(());
                }
                Out::Bulk { .. } => {}
            }
        }
        st.pending += 1;
        queue(&mut st, lane, out);
        drop(st);
        self.lanes.ready.notify_one();
        Ok(())
    }

    /// Closes the lanes: later sends fail; the writer drains what is queued, then ends.
    pub(crate) fn close(&self) {
        self.lanes.lock().closed = true;
        self.lanes.ready.notify_all();
    }
}

impl Drop for TcpTx {
    fn drop(&mut self) {
        self.close();
    }
}

fn queue(st: &mut LaneState, lane: Lane, out: Out) {
    match lane {
        Lane::Prio => st.prio.push_back(out),
        Lane::Main => st.main.push_back(out),
    }
}

/// Writes what the socket takes now, without blocking (`MSG_DONTWAIT`; `MSG_NOSIGNAL`:
/// a closed peer is an error, not a signal).
fn send_now(sock: &TcpStream, bytes: &[u8]) -> std::io::Result<usize> {
    loop {
        // SAFETY: `bytes` is a valid, initialised buffer of `bytes.len()` bytes, and the
        // descriptor is the open socket `sock` owns.
        let n = unsafe {
            libc::send(
                sock.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The writer thread of a session, started by [`start`]; `on_error` runs if the socket
/// fails (not when the lanes closed and were drained).
pub(crate) struct Writer {
    done: std::sync::mpsc::Receiver<()>,
}

impl Writer {
    /// Waits up to `budget` for the writer to drain its lanes and end (after the sender
    /// was dropped or closed); `false` if it did not.
    pub(crate) fn wait(&self, budget: std::time::Duration) -> bool {
        !matches!(
            self.done.recv_timeout(budget),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        )
    }
}

/// Puts `stream` (a handshaken session socket) in the mode the link needs and starts the
/// writer thread: returns the sender, the writer, and a clone of the socket for the
/// reader.
///
/// # Errors
/// The socket cannot be set up or cloned, or the thread cannot start.
pub(crate) fn start(
    stream: TcpStream,
    shared: Arc<SharedMemory>,
    session: u64,
    on_error: impl FnOnce(std::io::Error) + Send + 'static,
) -> Result<(TcpTx, Writer, TcpStream), NetError> {
    let io = |what: &str, e| NetError::io(what.to_owned(), e);
    // The handshake left timeouts on it; the session's bounds are the heartbeat's.
    stream
        .set_nonblocking(false)
        .map_err(|e| io("making the session socket blocking", e))?;
    stream
        .set_read_timeout(None)
        .map_err(|e| io("clearing the handshake's read timeout", e))?;
    stream
        .set_write_timeout(None)
        .map_err(|e| io("clearing the handshake's write timeout", e))?;
    let clone = |s: &TcpStream| {
        s.try_clone()
            .map_err(|e| io("cloning the session socket", e))
    };
    let lanes = Arc::new(Lanes::default());
    let tx = TcpTx {
        lanes: lanes.clone(),
        sock: clone(&stream)?,
    };
    let reader = clone(&stream)?;
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("strata-net-tx".into())
        .spawn(move || {
            let mut sock = stream;
            match pump(&lanes, &mut sock, &shared, session) {
                Ok(()) => {
                    let _ = sock.shutdown(std::net::Shutdown::Write);
                }
                Err(e) => {
                    // Later sends fail at once instead of queueing behind a dead writer, and
                    // what is queued goes now: its closures may hold the session, which
                    // holds these lanes (a cycle that would keep both alive for good).
                    let queued = {
                        let mut st = lanes.lock();
                        st.closed = true;
                        (std::mem::take(&mut st.prio), std::mem::take(&mut st.main))
                    };
                    drop(queued);
                    on_error(e);
                }
            }
            let _ = done_tx.send(());
        })
        .map_err(|e| io("starting the session's writer thread", e))?;
    Ok((tx, Writer { done }, reader))
}

/// The writer's loop: the priority lane first, then the ordered lane; ends when the lanes
/// are closed and empty.
fn pump(
    lanes: &Lanes,
    sock: &mut TcpStream,
    shared: &SharedMemory,
    session: u64,
) -> std::io::Result<()> {
    loop {
        let out = {
            let mut st = lanes.lock();
            loop {
                if let Some(o) = st.prio.pop_front() {
                    break o;
                }
                if let Some(o) = st.main.pop_front() {
                    break o;
                }
                if st.closed {
                    return Ok(());
                }
                st = lanes.ready.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        match out {
            Out::Frame(f) => sock.write_all(&f)?,
            Out::Bulk { owner, parts } => stream_bulk(lanes, sock, shared, session, owner, &parts)?,
            Out::Then(f) => f(),
        }
        lanes.done();
    }
}

/// Streams shared-memory ranges as DATA chunks; between chunks, frames of the priority
/// lane go first, so a large copy never holds a heartbeat back by more than one chunk.
/// The socket's own back-pressure paces the reads.
fn stream_bulk(
    lanes: &Lanes,
    sock: &mut TcpStream,
    shared: &SharedMemory,
    session: u64,
    owner: u64,
    parts: &[(u32, u64, u64, u64)],
) -> std::io::Result<()> {
    for &(segment, region, start, len) in parts {
        let mut off = 0u64;
        while off < len {
            while let Some(f) = lanes.next_prio_frame() {
                sock.write_all(&f)?;
                lanes.done();
            }
            let n = (len - off).min(CHUNK_BYTES as u64) as usize;
            let src = shared
                .ptr(region, start + off, n as u64)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            // SAFETY: `ptr` checked the range lies in the region; the task (or request)
            // holds the region in use, and nothing writes these bytes while they are sent.
            let payload = unsafe { std::slice::from_raw_parts(src.cast_const(), n) };
            let head = wire::DataHead {
                owner,
                segment,
                offset: off,
            };
            // The frame's head, then the payload straight from shared memory: no copy
            // into a frame buffer (the checksum is the one pass over the bytes).
            let (bytes, used) = wire::data_head_bytes(session, owner, head, payload);
            write_all_vectored(sock, &bytes[..used], payload)?;
            off += n as u64;
        }
    }
    Ok(())
}

/// Writes `head` then `payload` in as few `writev` calls as the socket allows.
fn write_all_vectored(sock: &mut TcpStream, head: &[u8], payload: &[u8]) -> std::io::Result<()> {
    let (mut head, mut payload) = (head, payload);
    while !head.is_empty() || !payload.is_empty() {
        let parts = [std::io::IoSlice::new(head), std::io::IoSlice::new(payload)];
        let n = match sock.write_vectored(&parts) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let from_head = n.min(head.len());
        head = &head[from_head..];
        payload = &payload[n - from_head..];
    }
    Ok(())
}

/// A frame read from a session's socket: whole (its body in the caller's buffer), or a
/// DATA frame whose payload is still in the socket, to be read straight to where it
/// lands ([`Payload`]).
pub(crate) enum Incoming<'s> {
    /// The header; the body is in the buffer given to [`read_next`], checksum checked.
    Whole(Header),
    /// A DATA frame's header, head, and its payload still in the socket.
    Data(Header, wire::DataHead, SocketPayload<'s>),
}

/// The payload of a DATA frame not yet read from the socket (its prefix was).
pub(crate) struct SocketPayload<'s> {
    sock: &'s mut FrameReader,
    raw: [u8; HEADER_BYTES],
    /// The body's first bytes: the prefix, then possibly the payload's first bytes.
    start: [u8; wire::DATA_PREFIX_MAX],
    got: usize,
    /// Where the payload begins in `start`.
    at: usize,
    len: usize,
}

/// Why a DATA frame was not taken: its link failed while its payload was read (the peer
/// died, the connection broke), or the frame itself is wrong (damaged, or not what the
/// session expects) — a protocol error the receiver reports as such.
#[derive(Debug)]
pub(crate) enum DataError {
    /// The link failed.
    Link(NetError),
    /// The frame is wrong (the reason).
    Protocol(String),
}

impl From<String> for DataError {
    fn from(why: String) -> Self {
        DataError::Protocol(why)
    }
}

impl DataError {
    /// A payload of `len` bytes lands only in a destination of exactly that length.
    pub(crate) fn check_destination(len: usize, dst: &[u8]) -> Result<(), DataError> {
        if dst.len() == len {
            return Ok(());
        }
        Err(DataError::Protocol(format!(
            "a DATA payload of {len} bytes has a destination of {}",
            dst.len()
        )))
    }
}

impl std::fmt::Display for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataError::Link(e) => e.fmt(f),
            DataError::Protocol(why) => f.write_str(why),
        }
    }
}

impl SocketPayload<'_> {
    /// Reads the payload into `dst` (exactly its length) and checks the frame's
    /// checksum. On an error the bytes in `dst` are unspecified and the session must end.
    fn read_into(self, dst: &mut [u8]) -> Result<(), DataError> {
        DataError::check_destination(self.len, dst)?;
        let early = &self.start[self.at..self.got];
        dst[..early.len()].copy_from_slice(early);
        self.sock
            .read_exact(&mut dst[early.len()..])
            .map_err(|e| DataError::Link(read_failed("reading a DATA frame's payload", e)))?;
        check_landed(&self.raw, &self.start[..self.at], dst)
    }
}

/// Checks the checksum of a DATA frame whose header bytes are `raw`, body prefix
/// `prefix`, and payload `landed` (read to its place).
pub(crate) fn check_landed(
    raw: &[u8; HEADER_BYTES],
    prefix: &[u8],
    landed: &[u8],
) -> Result<(), DataError> {
    let sum = wire::checksum(&[&raw[0..28], prefix, landed]);
    let expected = u32::from_le_bytes([raw[28], raw[29], raw[30], raw[31]]);
    if sum != expected {
        return Err(DataError::Protocol(format!(
            "a DATA frame's checksum does not match (computed {sum:#010x}, header {expected:#010x}): the frame was damaged"
        )));
    }
    Ok(())
}

/// Where a DATA frame's payload is: in memory (a whole frame, e.g. over MPI), or still in
/// the socket. The frame handlers land it with [`Payload::land`] — from the socket that
/// is one kernel copy straight to its destination — or take it as bytes where it must be
/// split up ([`Payload::bytes`]).
pub(crate) enum Payload<'a, 's> {
    /// The bytes, checksum checked.
    Bytes(&'a [u8]),
    /// Still in the socket.
    Socket(SocketPayload<'s>),
    /// Matched by MPI, not yet received.
    #[cfg(feature = "mpi")]
    Mpi(crate::mpi_link::MpiPayload),
}

impl Payload<'_, '_> {
    /// The payload's length.
    pub(crate) fn len(&self) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::Socket(p) => p.len,
            #[cfg(feature = "mpi")]
            Payload::Mpi(p) => p.len(),
        }
    }

    /// Puts the payload in `dst` (exactly [`Payload::len`] bytes).
    ///
    /// # Errors
    /// The socket failed or the checksum does not match: `dst` holds unspecified bytes
    /// and the session must end.
    pub(crate) fn land(self, dst: &mut [u8]) -> Result<(), DataError> {
        match self {
            Payload::Bytes(b) => {
                DataError::check_destination(b.len(), dst)?;
                dst.copy_from_slice(b);
                Ok(())
            }
            Payload::Socket(p) => p.read_into(dst),
            #[cfg(feature = "mpi")]
            Payload::Mpi(p) => p.land(dst),
        }
    }

    /// The payload as bytes, read into `scratch` if it is still in the socket.
    ///
    /// # Errors
    /// As [`Payload::land`].
    pub(crate) fn bytes<'b>(self, scratch: &'b mut Vec<u8>) -> Result<&'b [u8], DataError>
    where
        Self: 'b,
    {
        match self {
            Payload::Bytes(b) => Ok(b),
            Payload::Socket(p) => {
                scratch.clear();
                scratch.resize(p.len, 0);
                p.read_into(scratch)?;
                Ok(scratch)
            }
            #[cfg(feature = "mpi")]
            Payload::Mpi(p) => {
                scratch.clear();
                scratch.resize(p.len(), 0);
                p.land(scratch)?;
                Ok(scratch)
            }
        }
    }
}

/// Reads the next frame from a session's socket: a DATA frame's header and prefix only
/// ([`Incoming::Data`], its payload left in the socket), any other frame whole into
/// `body` (reused). A DATA frame whose prefix does not parse is read whole, for the
/// decoder to refuse.
///
/// # Errors
/// The socket failed or closed, or the frame is malformed.
pub(crate) fn read_next<'s>(
    sock: &'s mut FrameReader,
    body: &mut Vec<u8>,
) -> Result<Incoming<'s>, NetError> {
    let mut raw = [0u8; HEADER_BYTES];
    sock.read_exact(&mut raw)
        .map_err(|e| read_failed("reading a frame header", e))?;
    let header = wire::decode_header(&raw)?;
    let length = header.length as usize;
    let mut start = [0u8; wire::DATA_PREFIX_MAX];
    let mut got = 0;
    if header.kind == wire::FrameType::Data {
        got = length.min(wire::DATA_PREFIX_MAX);
        sock.read_exact(&mut start[..got])
            .map_err(|e| read_failed("reading a frame body", e))?;
        if let Some((head, len, at)) = wire::parse_data_prefix(&start[..got], length) {
            return Ok(Incoming::Data(
                header,
                head,
                SocketPayload {
                    sock,
                    raw,
                    start,
                    got,
                    at,
                    len,
                },
            ));
        }
    }
    body.clear();
    body.extend_from_slice(&start[..got]);
    body.resize(length, 0);
    sock.read_exact(&mut body[got..])
        .map_err(|e| read_failed("reading a frame body", e))?;
    wire::check_body(&raw, &header, body)?;
    Ok(Incoming::Whole(header))
}

/// Bytes one `recv` asks for ahead of what a frame needs: a small frame's header and
/// body (and whatever follows, if it is there already) in one system call. Reads of at
/// least this much — a DATA payload's bulk — go straight to their destination.
const READ_AHEAD: usize = 8 << 10;

/// A session socket's reading side, with a small read-ahead buffer: reading a frame's
/// header and then its body exactly took two `recv`s per small frame; read ahead, it
/// takes one. A holder that lets go of the reader leaves nothing read ahead
/// ([`FrameReader::buffered`] is `false`): a socket's readiness says nothing about bytes
/// already in this buffer, so bytes left there would wait for the next frame.
pub(crate) struct FrameReader {
    sock: TcpStream,
    ahead: Box<[u8]>,
    /// The unread part of `ahead`.
    lo: usize,
    hi: usize,
    /// The last `recv` returned less than it asked for: the socket held nothing more
    /// then.
    drained: bool,
}

impl FrameReader {
    pub(crate) fn new(sock: TcpStream) -> FrameReader {
        FrameReader {
            sock,
            ahead: vec![0u8; READ_AHEAD].into_boxed_slice(),
            lo: 0,
            hi: 0,
            drained: false,
        }
    }

    /// Whether bytes were read ahead and not taken yet.
    pub(crate) fn buffered(&self) -> bool {
        self.hi > self.lo
    }

    /// Whether the last `recv` emptied the socket (what arrived since, it cannot say).
    pub(crate) fn drained(&self) -> bool {
        self.drained
    }

    /// The socket.
    pub(crate) fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Whether another frame is there to read without waiting for the peer: bytes read
    /// ahead, or bytes in the socket (not asked of the kernel when the last `recv`
    /// emptied it a moment ago).
    pub(crate) fn more_ready(&self) -> bool {
        self.buffered()
            || (!self.drained
                && poll_in(
                    &mut [pollfd(self.sock.as_raw_fd())],
                    Some(std::time::Duration::ZERO),
                ))
    }

    /// Fills `dst` (blocking): read-ahead bytes first, then from the socket.
    ///
    /// # Errors
    /// The socket failed, or closed (`UnexpectedEof`) before `dst` was full.
    pub(crate) fn read_exact(&mut self, dst: &mut [u8]) -> std::io::Result<()> {
        let mut at = (self.hi - self.lo).min(dst.len());
        dst[..at].copy_from_slice(&self.ahead[self.lo..self.lo + at]);
        self.lo += at;
        while at < dst.len() {
            let want = dst.len() - at;
            let direct = want >= READ_AHEAD;
            let into: &mut [u8] = if direct {
                &mut dst[at..]
            } else {
                &mut self.ahead
            };
            let asked = into.len();
            let n = match self.sock.read(into) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.drained = n < asked;
            if direct {
                at += n;
            } else {
                let take = n.min(want);
                dst[at..at + take].copy_from_slice(&self.ahead[..take]);
                at += take;
                (self.lo, self.hi) = (take, n);
            }
        }
        Ok(())
    }
}

fn read_failed(what: &str, e: std::io::Error) -> NetError {
    let e = if e.kind() == std::io::ErrorKind::UnexpectedEof {
        std::io::Error::new(e.kind(), "the peer closed the connection")
    } else {
        e
    };
    NetError::io(what.to_owned(), e)
}

/// Who reads a root session's socket: its reader thread, or a caller of the level-4
/// engine that waits for this node's answer and reads the socket itself
/// ([`ReadRole::wait`]), so the answer's arrival wakes that caller directly — not a
/// reader thread that would then wake it (measured on loopback: host-orchestration round
/// trips 0.74× and node-only ones 0.83× of what the reader-thread hand-off cost).
///
/// Frames are read under the lock, and a thread that takes it reads only what is there
/// by then. While callers wait in the link the reader thread *stands aside* (`aside`):
/// it stops polling the socket — else every answer would wake it too — and waits on its
/// own eventfd instead. It takes the socket back when told ([`ReadRole::release`]: the
/// engine waits on its doorbell from then on), or by itself once no caller has entered
/// the link for [`ASIDE_LAPSE`] and none is in it: so a frame nobody waits for (a
/// heartbeat, a reply to a device-memory request) is read within that lapse at worst.
pub(crate) struct ReadRole {
    sock: Mutex<FrameReader>,
    fd: RawFd,
    aside: AtomicBool,
    /// Wakes the reader thread (to stand aside, or to take the socket back).
    kick: strata_sync::EventFd,
    /// When a caller last entered the link (µs since `epoch`).
    entered: AtomicU64,
    epoch: std::time::Instant,
    /// Times the reader thread found the socket readable and nothing left to read (a
    /// caller took it): what standing aside avoids. For tests.
    #[cfg_attr(not(test), allow(dead_code))]
    empty_wakes: AtomicU64,
}

/// How long the reader thread stands aside after the last caller entered the link.
pub(crate) const ASIDE_LAPSE: std::time::Duration = std::time::Duration::from_millis(2);

impl ReadRole {
    /// The read role of `sock` (the session's read side).
    ///
    /// # Errors
    /// No eventfd could be made.
    pub(crate) fn new(sock: TcpStream) -> Result<ReadRole, NetError> {
        let kick = strata_sync::EventFd::new()
            .map_err(|e| NetError::io("creating the session reader's eventfd", e))?;
        Ok(ReadRole {
            fd: sock.as_raw_fd(),
            sock: Mutex::new(FrameReader::new(sock)),
            aside: AtomicBool::new(false),
            kick,
            entered: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            empty_wakes: AtomicU64::new(0),
        })
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// The reader thread's loop: `read` takes one frame (`false`: the session ended);
    /// runs while `go_on()`.
    pub(crate) fn run_reader(
        &self,
        go_on: impl Fn() -> bool,
        mut read: impl FnMut(&mut FrameReader) -> bool,
    ) {
        let kick = self.kick.as_raw_fd();
        while go_on() {
            if self.aside.load(Ordering::Acquire) {
                poll_in(&mut [pollfd(kick)], Some(ASIDE_LAPSE));
                self.kick.drain();
                let idle = self
                    .now_us()
                    .saturating_sub(self.entered.load(Ordering::Relaxed))
                    > ASIDE_LAPSE.as_micros() as u64;
                if idle {
                    // Unless a caller waits in the link right now.
                    if let Ok(_sock) = self.sock.try_lock() {
                        self.aside.store(false, Ordering::Release);
                    }
                }
                continue;
            }
            // (Bounded: a cut socket wakes it at once anyway.)
            let mut fds = [pollfd(self.fd), pollfd(kick)];
            poll_in(&mut fds, Some(std::time::Duration::from_secs(1)));
            if fds[1].revents != 0 {
                self.kick.drain();
            }
            if self.aside.load(Ordering::Acquire) {
                continue;
            }
            let mut sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
            if !poll_in(&mut [pollfd(self.fd)], Some(std::time::Duration::ZERO)) {
                if fds[0].revents != 0 {
                    self.empty_wakes.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            // What was read ahead is taken before the lock goes (see `FrameReader`).
            loop {
                if !read(&mut sock) {
                    return;
                }
                if !sock.buffered() {
                    break;
                }
            }
        }
    }

    /// A caller waits up to `timeout` in the link: reads what arrives (`read` as for
    /// [`ReadRole::run_reader`]) until nothing more is there, or returns when `kick` is
    /// readable (and drains it) or the time is up. `false` if the reader thread is in the
    /// middle of a frame (it rings the doorbell when it is done).
    pub(crate) fn wait(
        &self,
        kick: &strata_sync::EventFd,
        timeout: std::time::Duration,
        mut read: impl FnMut(&mut FrameReader) -> bool,
    ) -> bool {
        let Ok(mut sock) = self.sock.try_lock() else {
            return false;
        };
        self.entered.store(self.now_us(), Ordering::Relaxed);
        if !self.aside.swap(true, Ordering::AcqRel) {
            self.kick.signal();
        }
        let mut fds = [pollfd(self.fd), pollfd(kick.as_raw_fd())];
        if poll_in(&mut fds, Some(timeout)) {
            if fds[1].revents != 0 {
                kick.drain();
            }
            if fds[0].revents != 0 {
                while read(&mut sock) && sock.more_ready() {}
            }
        }
        true
    }

    /// The reader thread reads again, at once.
    pub(crate) fn release(&self) {
        if self.aside.swap(false, Ordering::AcqRel) {
            self.kick.signal();
        }
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Waits until one of `fds` is readable (or ended), at most `timeout` (`None`: for
/// good); whether one is.
fn poll_in(fds: &mut [libc::pollfd], timeout: Option<std::time::Duration>) -> bool {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(3600) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` and the timespec are valid for the call.
    let n = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            ts_ptr,
            std::ptr::null(),
        )
    };
    n > 0
}

/// Starts a session's reader thread running `run`.
///
/// # Errors
/// The thread cannot start.
pub(crate) fn spawn_reader(run: impl FnOnce() + Send + 'static) -> Result<(), NetError> {
    std::thread::Builder::new()
        .name("strata-net-rx".into())
        .spawn(run)
        .map(drop)
        .map_err(|e| NetError::io("starting the session's reader thread", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{encode_data, FrameType};
    use std::time::Duration;

    /// Who read each 8-byte message of a [`ReadRole`]: a waiting caller reads what
    /// arrives while it waits, and the reader thread does not (it stood aside); a kick
    /// ends a wait; after `release` — or, by itself, after the lapse — the reader thread
    /// reads again. Every message is read exactly once.
    #[test]
    fn a_waiting_caller_reads_its_answer_and_the_reader_takes_the_socket_back() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        let role = Arc::new(ReadRole::new(rx).unwrap());
        let by_reader = Arc::new(Mutex::new(Vec::<u64>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let take = |sock: &mut FrameReader| {
            let mut b = [0u8; 8];
            sock.read_exact(&mut b).ok().map(|()| u64::from_le_bytes(b))
        };
        let reader = {
            let (role, by_reader, stop) = (role.clone(), by_reader.clone(), stop.clone());
            std::thread::spawn(move || {
                role.run_reader(
                    || !stop.load(Ordering::Acquire),
                    |sock| {
                        take(sock).is_some_and(|v| {
                            by_reader.lock().unwrap().push(v);
                            true
                        })
                    },
                )
            })
        };
        let kick = strata_sync::EventFd::new().unwrap();
        let send = |tx: &mut TcpStream, v: u64| tx.write_all(&v.to_le_bytes()).unwrap();
        let later = |tx: &TcpStream, v: u64| {
            let mut tx = tx.try_clone().unwrap();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(200));
                send(&mut tx, v);
            })
        };
        let mut by_caller = Vec::new();
        let wait = |by_caller: &mut Vec<u64>| {
            role.wait(&kick, Duration::from_secs(30), |sock| {
                take(sock).is_some_and(|v| {
                    by_caller.push(v);
                    true
                })
            })
        };
        // Answers that arrive while a caller waits are the caller's.
        for v in 1..=50u64 {
            let sender = later(&tx, v);
            while !by_caller.contains(&v) {
                assert!(wait(&mut by_caller), "the reader thread held the socket");
            }
            sender.join().unwrap();
        }
        assert_eq!(by_caller, (1..=50).collect::<Vec<_>>());
        assert!(
            by_reader.lock().unwrap().is_empty(),
            "the reader read a waiting caller's answer"
        );
        // It stood aside: the answers did not wake it (each would, were it polling too).
        let empty = role.empty_wakes.load(Ordering::Relaxed);
        assert!(empty < 10, "the reader was woken by {empty} of 50 answers");
        // A kick ends a wait that nothing arrives for, and the wait drains it.
        kick.signal();
        assert!(wait(&mut by_caller));
        assert!(
            !poll_in(&mut [pollfd(kick.as_raw_fd())], Some(Duration::ZERO)),
            "the kick was left readable"
        );
        assert_eq!(by_caller.len(), 50);
        // Answers that arrive together are all read by the caller (those read ahead
        // with the first are not left behind).
        let mut three = Vec::new();
        for v in 51..=53u64 {
            three.extend_from_slice(&v.to_le_bytes());
        }
        tx.write_all(&three).unwrap();
        assert!(wait(&mut by_caller));
        assert_eq!(by_caller[50..], [51, 52, 53], "one wait reads all three");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let read_by_reader = |v: u64, what: &str| {
            while !by_reader.lock().unwrap().contains(&v) {
                assert!(std::time::Instant::now() < deadline, "{what}");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // Released: the reader thread reads what comes next.
        role.release();
        send(&mut tx, 100);
        read_by_reader(100, "the released reader never read");
        // A caller waits again (the reader stands aside), then leaves without releasing:
        // the reader takes the socket back by itself after the lapse.
        let sender = later(&tx, 101);
        while !by_caller.contains(&101) {
            assert!(wait(&mut by_caller));
        }
        sender.join().unwrap();
        send(&mut tx, 102);
        read_by_reader(102, "the reader never took the socket back");
        stop.store(true, Ordering::Release);
        drop(tx);
        reader.join().unwrap();
        let mut all: Vec<u64> = by_caller
            .iter()
            .chain(by_reader.lock().unwrap().iter())
            .copied()
            .collect();
        all.sort_unstable();
        let mut want: Vec<u64> = (1..=53).collect();
        want.extend([100, 101, 102]);
        assert_eq!(all, want, "every message read exactly once");
    }

    /// Frames sent through a [`TcpTx`] — written directly by the sender when the writer is
    /// idle, cut short by a small send buffer, queued behind each other on two lanes —
    /// arrive whole (checksums hold), each lane in its order.
    #[test]
    fn direct_and_queued_frames_arrive_whole_and_in_lane_order() {
        use std::io::Read;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let small: libc::c_int = 4096;
        // SAFETY: setsockopt on a socket this test owns, with a valid int option value.
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&a),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&small as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
        let failed = Arc::new(Mutex::new(None));
        let f2 = failed.clone();
        let (tx, writer, _rd) = start(a, SharedMemory::process().clone(), 9, move |e| {
            *f2.lock().unwrap() = Some(e.to_string());
        })
        .unwrap();
        const FRAMES: u64 = 600;
        let reader = std::thread::spawn(move || {
            let (mut main, mut prio) = (Vec::new(), Vec::new());
            // Read nothing at first: the socket's buffers fill, so direct writes are cut
            // short or refused and the writer takes over.
            std::thread::sleep(Duration::from_millis(100));
            let mut h = [0u8; wire::HEADER_BYTES];
            while b.read_exact(&mut h).is_ok() {
                let head = wire::decode_header(&h).unwrap();
                let mut body = vec![0u8; head.length as usize];
                b.read_exact(&mut body).unwrap();
                wire::check_body(&h, &head, &body).unwrap();
                match head.kind {
                    FrameType::Data => main.push(head.sequence),
                    FrameType::Heartbeat => prio.push(head.sequence),
                    other => panic!("unexpected {other:?}"),
                }
            }
            (main, prio)
        });
        for i in 1..=FRAMES {
            // Sizes from a few bytes to 4× the send buffer, so many writes are cut short.
            let n = ((i * 7919) % (16 << 10)) as usize;
            let mut f = Vec::new();
            let head = wire::DataHead {
                owner: i,
                segment: 0,
                offset: 0,
            };
            encode_data(&mut f, 9, i, head, n, |d| d.fill(i as u8));
            tx.send(Lane::Main, Out::Frame(f)).unwrap();
            if i % 3 == 0 {
                let hb = wire::encode(FrameType::Heartbeat, 9, i, &()).unwrap();
                tx.send(Lane::Prio, Out::Frame(hb)).unwrap();
            }
        }
        drop(tx);
        assert!(
            writer.wait(Duration::from_secs(60)),
            "the writer did not drain"
        );
        assert_eq!(*failed.lock().unwrap(), None);
        let (main, prio) = reader.join().unwrap();
        assert_eq!(main, (1..=FRAMES).collect::<Vec<_>>());
        assert_eq!(
            prio,
            (1..=FRAMES).filter(|i| i % 3 == 0).collect::<Vec<_>>()
        );
    }

    /// A stream of frames — small ones, and DATA frames whose payloads run from nothing
    /// to several times the read-ahead — written in pieces of any size, some splitting a
    /// header: [`read_next`] through a [`FrameReader`] gives every frame back whole and
    /// in order, each payload landed byte for byte (the frame's checksum holds), and
    /// nothing is left read ahead at the end.
    #[test]
    fn frames_read_ahead_arrive_whole_whatever_the_pieces_they_come_in() {
        for seed in [1u64, 7, 42] {
            let mut rng = seed;
            let mut next = move |bound: u64| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (rng >> 33) % bound
            };
            let mut stream = Vec::new();
            let mut want = Vec::new();
            for i in 1..=300u64 {
                if next(3) == 0 {
                    stream.extend(wire::encode(FrameType::Heartbeat, 9, i, &()).unwrap());
                    want.push((i, None));
                } else {
                    let n = match next(4) {
                        0 => next(64),
                        1 => next(READ_AHEAD as u64),
                        _ => next(5 * READ_AHEAD as u64),
                    } as usize;
                    let head = wire::DataHead {
                        owner: i,
                        segment: 0,
                        offset: 0,
                    };
                    let mut f = Vec::new();
                    encode_data(&mut f, 9, i, head, n, |d| {
                        for (k, b) in d.iter_mut().enumerate() {
                            *b = (k as u64 ^ i) as u8;
                        }
                    });
                    stream.extend(f);
                    want.push((i, Some(n)));
                }
            }
            let mut pieces = Vec::new();
            let mut at = 0;
            while at < stream.len() {
                let k = match next(3) {
                    0 => 1 + next(40),
                    _ => 1 + next(3 * READ_AHEAD as u64),
                } as usize;
                let end = (at + k).min(stream.len());
                pieces.push(stream[at..end].to_vec());
                at = end;
            }
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            tx.set_nodelay(true).unwrap();
            let (rx, _) = l.accept().unwrap();
            let writer = std::thread::spawn(move || {
                for (j, p) in pieces.iter().enumerate() {
                    tx.write_all(p).unwrap();
                    if j % 16 == 0 {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
            });
            let mut reader = FrameReader::new(rx);
            let mut body = Vec::new();
            let mut got = Vec::new();
            for _ in 0..want.len() {
                match read_next(&mut reader, &mut body).unwrap() {
                    Incoming::Whole(h) => got.push((h.sequence, None)),
                    Incoming::Data(h, head, p) => {
                        assert_eq!(head.owner, h.sequence);
                        let mut dst = vec![0u8; p.len];
                        Payload::Socket(p).land(&mut dst).unwrap();
                        for (k, b) in dst.iter().enumerate() {
                            assert_eq!(*b, (k as u64 ^ h.sequence) as u8, "frame {}", h.sequence);
                        }
                        got.push((h.sequence, Some(dst.len())));
                    }
                }
            }
            writer.join().unwrap();
            assert_eq!(got, want, "seed {seed}");
            assert!(!reader.buffered(), "bytes left read ahead");
        }
    }
}
