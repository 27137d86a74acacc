//! The wire format: a fixed 32-byte versioned header and a postcard body per frame.
//!
//! ```text
//! offset size field      rule
//!      0    4 magic      b"STRN"
//!      4    2 version    u16 LE, = PROTOCOL_VERSION (else refused, naming both)
//!      6    1 type       u8, a FrameType (else refused)
//!      7    1 flags      u8, 0 (no flag is defined; any bit set is refused)
//!      8    8 session    u64 LE, the session's id (0 only in HELLO before one exists)
//!     16    8 sequence   u64 LE, the sender's frame counter, or the task/control a
//!                        reply answers
//!     24    4 length     u32 LE, body bytes, ≤ MAX_BODY (checked before allocating)
//!     28    4 checksum   u32 LE, over bytes 0..28 of the header and the body
//! ```
//!
//! Everything is little-endian. The body is the postcard encoding of the type's struct
//! ([`Body`]); a decoded body must use every byte (trailing bytes are refused). The
//! checksum detects frames damaged in transit or by a buggy peer — it is not
//! authentication (the handshake is; see `auth`).

use crate::error::WireError;
use serde::{Deserialize, Serialize};

/// The frame magic.
pub const MAGIC: [u8; 4] = *b"STRN";
/// The protocol version this build speaks (both ends must speak the same). 3: DONE
/// carries a wait-for state; CONTROL has `FreeBytes` and `Capacity`. (2: DONE carries a
/// trace.)
pub const PROTOCOL_VERSION: u16 = 3;
/// Header bytes.
pub const HEADER_BYTES: usize = 32;
/// The largest body a frame may carry (a bulk chunk plus its few bytes of framing, or a
/// task's argument blob and segment list).
pub const MAX_BODY: usize = 1 << 20;
/// Bytes of bulk data per DATA frame: small enough that a heartbeat or a control frame
/// never waits behind more than one chunk, large enough that framing costs nothing.
pub const CHUNK_BYTES: usize = 256 * 1024;
/// The longest error message a frame carries (longer ones are cut on a character
/// boundary).
pub const MAX_MESSAGE: usize = 4096;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    /// Initiator → responder: first frame of a connection.
    Hello = 1,
    /// Responder → initiator: its nonce and its proof of the secret.
    Challenge = 2,
    /// Initiator → responder: its proof and what it wants.
    Auth = 3,
    /// Either way: why the sender refuses or ends the session; the connection closes
    /// after it.
    Error = 4,
    /// Node → root: who the node is (build-id, registry digest, level-3 shape).
    NodeHello = 5,
    /// Node → root: the level-3 worker is up; tasks may come.
    Ready = 6,
    /// Root → node: run a host orchestration.
    Task = 7,
    /// Either way: a chunk of bulk data for a task or a control request.
    Data = 8,
    /// Node → root: a task finished (its outputs were sent before).
    Done = 9,
    /// Root → node: a device-memory request.
    Control = 10,
    /// Node → root: a control request's answer.
    ControlReply = 11,
    /// Either way: the sender is alive.
    Heartbeat = 12,
    /// Root → node: drop a task that has not started.
    Cancel = 13,
    /// Root → node: close the level-3 worker and end the session.
    Shutdown = 14,
    /// Node → root: the level-3 worker is closed and its whole subtree reaped.
    ShutdownAck = 15,
}

impl FrameType {
    /// The type with wire number `b`.
    pub fn from_u8(b: u8) -> Option<FrameType> {
        use FrameType::*;
        Some(match b {
            1 => Hello,
            2 => Challenge,
            3 => Auth,
            4 => Error,
            5 => NodeHello,
            6 => Ready,
            7 => Task,
            8 => Data,
            9 => Done,
            10 => Control,
            11 => ControlReply,
            12 => Heartbeat,
            13 => Cancel,
            14 => Shutdown,
            15 => ShutdownAck,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame is.
    pub kind: FrameType,
    /// The session it belongs to.
    pub session: u64,
    /// The sender's counter, or what a reply answers.
    pub sequence: u64,
    /// Body bytes.
    pub length: u32,
    /// The checksum the sender wrote.
    pub checksum: u32,
}

/// A fast checksum (four interleaved multiply–rotate lanes over 8-byte words), cheap
/// enough to run over every bulk chunk at memory speed.
pub fn checksum(parts: &[&[u8]]) -> u32 {
    const K: [u64; 4] = [
        0x9E37_79B9_7F4A_7C15,
        0xC2B2_AE3D_27D4_EB4F,
        0x1656_67B1_9E37_79F9,
        0x27D4_EB2F_1656_67C5,
    ];
    let mut lanes = K;
    let mut total = 0u64;
    let mut tail = [0u8; 32];
    let mut tail_len = 0usize;
    let mix = |lanes: &mut [u64; 4], block: &[u8]| {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&block[i * 8..i * 8 + 8]);
            *lane = (*lane ^ u64::from_le_bytes(w))
                .wrapping_mul(K[i])
                .rotate_left(29);
        }
    };
    for part in parts {
        total = total.wrapping_add(part.len() as u64);
        let mut p: &[u8] = part;
        if tail_len > 0 {
            let take = (32 - tail_len).min(p.len());
            tail[tail_len..tail_len + take].copy_from_slice(&p[..take]);
            tail_len += take;
            p = &p[take..];
            if tail_len < 32 {
                continue;
            }
            mix(&mut lanes, &tail);
        }
        let mut blocks = p.chunks_exact(32);
        for b in &mut blocks {
            mix(&mut lanes, b);
        }
        let rest = blocks.remainder();
        tail[..rest.len()].copy_from_slice(rest);
        tail_len = rest.len();
    }
    if tail_len > 0 {
        tail[tail_len..].fill(0);
        mix(&mut lanes, &tail);
    }
    let mut h = total.wrapping_mul(K[0]);
    for (i, l) in lanes.iter().enumerate() {
        h = (h ^ l.rotate_left(i as u32 * 16)).wrapping_mul(K[3]);
    }
    h ^= h >> 32;
    h as u32
}

/// Writes a header for a body of `body.len()` bytes into `out[..32]`, with its checksum.
///
/// # Panics
/// Never for bodies built by this crate: the body length is checked by [`encode`].
fn write_header(out: &mut [u8], kind: FrameType, session: u64, sequence: u64, body: &[u8]) {
    out[0..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out[6] = kind as u8;
    out[7] = 0;
    out[8..16].copy_from_slice(&session.to_le_bytes());
    out[16..24].copy_from_slice(&sequence.to_le_bytes());
    out[24..28].copy_from_slice(&(body.len() as u32).to_le_bytes());
    let sum = checksum(&[&out[0..28], body]);
    out[28..32].copy_from_slice(&sum.to_le_bytes());
}

/// Decodes and checks a header: magic, version, type, flags, and the body length bound.
/// The checksum is checked with the body ([`check_body`]).
///
/// # Errors
/// [`WireError`] naming what is wrong; never a panic.
pub fn decode_header(h: &[u8; HEADER_BYTES]) -> Result<Header, WireError> {
    if h[0..4] != MAGIC {
        return Err(WireError::BadMagic([h[0], h[1], h[2], h[3]]));
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if version != PROTOCOL_VERSION {
        return Err(WireError::Version {
            theirs: version,
            ours: PROTOCOL_VERSION,
        });
    }
    let kind = FrameType::from_u8(h[6]).ok_or(WireError::UnknownType(h[6]))?;
    if h[7] != 0 {
        return Err(WireError::Flags(h[7]));
    }
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[o..o + 8]);
        u64::from_le_bytes(b)
    };
    let u32_at = |o: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&h[o..o + 4]);
        u32::from_le_bytes(b)
    };
    let length = u32_at(24);
    if length as usize > MAX_BODY {
        return Err(WireError::TooLarge {
            length: length as u64,
            max: MAX_BODY,
        });
    }
    Ok(Header {
        kind,
        session: u64_at(8),
        sequence: u64_at(16),
        length,
        checksum: u32_at(28),
    })
}

/// Checks the checksum of a frame whose header bytes are `raw` and body `body`.
///
/// # Errors
/// [`WireError::Checksum`].
pub fn check_body(raw: &[u8; HEADER_BYTES], header: &Header, body: &[u8]) -> Result<(), WireError> {
    let sum = checksum(&[&raw[0..28], body]);
    if sum != header.checksum {
        return Err(WireError::Checksum {
            kind: header.kind,
            expected: header.checksum,
            computed: sum,
        });
    }
    Ok(())
}

/// One whole frame: header and body bytes, ready to write.
pub fn encode<T: Serialize>(
    kind: FrameType,
    session: u64,
    sequence: u64,
    body: &T,
) -> Result<Vec<u8>, WireError> {
    let mut out = vec![0u8; HEADER_BYTES];
    let mut out = postcard::to_extend(body, std::mem::take(&mut out))
        .map_err(|e| WireError::Encode(e.to_string()))?;
    let len = out.len() - HEADER_BYTES;
    if len > MAX_BODY {
        return Err(WireError::TooLarge {
            length: len as u64,
            max: MAX_BODY,
        });
    }
    let (head, body) = out.split_at_mut(HEADER_BYTES);
    write_header(head, kind, session, sequence, body);
    Ok(out)
}

/// Where a DATA frame's bytes belong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHead {
    /// The task (its TASK frame's sequence) or control request.
    pub owner: u64,
    /// The segment.
    pub segment: u32,
    /// The offset in the segment.
    pub offset: u64,
}

/// A DATA frame carrying `len` bytes (at most [`CHUNK_BYTES`]) for `head`, written by
/// `fill` straight into the frame; built in `out` (cleared first), so a bulk sender
/// reuses one buffer.
pub fn encode_data(
    out: &mut Vec<u8>,
    session: u64,
    sequence: u64,
    head: DataHead,
    len: usize,
    fill: impl FnOnce(&mut [u8]),
) {
    out.clear();
    out.resize(HEADER_BYTES, 0);
    let (prefix, used) = data_prefix(head, len);
    out.extend_from_slice(&prefix[..used]);
    let at = out.len();
    out.resize(at + len, 0);
    fill(&mut out[at..]);
    let (head, body) = out.split_at_mut(HEADER_BYTES);
    write_header(head, FrameType::Data, session, sequence, body);
}

/// [`encode_data`] of a copy of `payload`: the bytes are appended, not written over a
/// zeroed frame (one pass over them fewer).
pub fn encode_data_copy(
    out: &mut Vec<u8>,
    session: u64,
    sequence: u64,
    head: DataHead,
    payload: &[u8],
) {
    out.clear();
    out.reserve(HEADER_BYTES + DATA_PREFIX_MAX + payload.len());
    out.resize(HEADER_BYTES, 0);
    let (prefix, used) = data_prefix(head, payload.len());
    out.extend_from_slice(&prefix[..used]);
    out.extend_from_slice(payload);
    let (head, body) = out.split_at_mut(HEADER_BYTES);
    write_header(head, FrameType::Data, session, sequence, body);
}

/// The most bytes a DATA body's prefix (four varints) takes.
pub const DATA_PREFIX_MAX: usize = 40;

/// The head of a DATA frame carrying `payload` for `head`: the frame's header and its
/// body's prefix, `(bytes, length)`. Sent before `payload` itself, it makes the same
/// frame as [`encode_data`] without copying the payload into a frame buffer.
pub fn data_head_bytes(
    session: u64,
    sequence: u64,
    head: DataHead,
    payload: &[u8],
) -> ([u8; HEADER_BYTES + DATA_PREFIX_MAX], usize) {
    let mut out = [0u8; HEADER_BYTES + DATA_PREFIX_MAX];
    let (prefix, used) = data_prefix(head, payload.len());
    out[HEADER_BYTES..HEADER_BYTES + used].copy_from_slice(&prefix[..used]);
    let (h, rest) = out.split_at_mut(HEADER_BYTES);
    h[0..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    h[6] = FrameType::Data as u8;
    h[7] = 0;
    h[8..16].copy_from_slice(&session.to_le_bytes());
    h[16..24].copy_from_slice(&sequence.to_le_bytes());
    h[24..28].copy_from_slice(&((used + payload.len()) as u32).to_le_bytes());
    let sum = checksum(&[&h[0..28], &rest[..used], payload]);
    h[28..32].copy_from_slice(&sum.to_le_bytes());
    (out, HEADER_BYTES + used)
}

/// The postcard form of `Data { owner, segment, offset, bytes }` up to the bytes: the
/// varints, then the byte string's varint length.
fn data_prefix(head: DataHead, len: usize) -> ([u8; DATA_PREFIX_MAX], usize) {
    let mut prefix = [0u8; DATA_PREFIX_MAX];
    let mut n = 0;
    for v in [head.owner, head.segment as u64, head.offset, len as u64] {
        n += put_varint(&mut prefix[n..], v);
    }
    (prefix, n)
}

/// Parses the prefix of a DATA body from its first bytes (`start`, at most
/// [`DATA_PREFIX_MAX`] of them, or the whole body if shorter) given the body's length:
/// the head, the payload's length and where the payload starts. `None` if the prefix is
/// malformed or its length does not match the body's.
pub fn parse_data_prefix(start: &[u8], body_len: usize) -> Option<(DataHead, usize, usize)> {
    let mut at = 0usize;
    let mut next = || -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *start.get(at)?;
            at += 1;
            // The tenth byte holds the top bit only: more would overflow.
            if shift == 63 && b > 1 {
                return None;
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    };
    let owner = next()?;
    let segment = u32::try_from(next()?).ok()?;
    let offset = next()?;
    let len = usize::try_from(next()?).ok()?;
    (at.checked_add(len)? == body_len).then_some((
        DataHead {
            owner,
            segment,
            offset,
        },
        len,
        at,
    ))
}

/// postcard's unsigned varint (LEB128); returns the bytes written.
fn put_varint(out: &mut [u8], mut v: u64) -> usize {
    let mut n = 0;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out[n] = b;
            return n + 1;
        }
        out[n] = b | 0x80;
        n += 1;
    }
}

/// Decodes a body of type `T`, refusing trailing bytes.
///
/// # Errors
/// [`WireError::Body`] naming the frame type.
pub fn decode_body<'a, T: Deserialize<'a>>(
    kind: FrameType,
    body: &'a [u8],
) -> Result<T, WireError> {
    let (v, rest) = postcard::take_from_bytes::<T>(body).map_err(|e| WireError::Body {
        kind,
        reason: e.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(WireError::Body {
            kind,
            reason: format!("{} trailing bytes", rest.len()),
        });
    }
    Ok(v)
}

/// Cuts `s` to at most [`MAX_MESSAGE`] bytes on a character boundary.
pub fn clip_message(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

// ----- bodies ----------------------------------------------------------------------------

/// The first frame of a connection (initiator → responder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The initiator's fresh nonce.
    pub nonce: [u8; 32],
}

/// The responder's answer: its nonce and its proof that it holds the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// The responder's fresh nonce.
    pub nonce: [u8; 32],
    /// HMAC-SHA256(secret, "strata-net responder" ‖ session ‖ initiator nonce ‖ responder nonce).
    pub proof: [u8; 32],
}

/// The initiator's proof and what it wants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auth {
    /// HMAC-SHA256(secret, "strata-net initiator" ‖ session ‖ responder nonce ‖ initiator nonce).
    pub proof: [u8; 32],
    /// What the initiator wants.
    pub intro: Intro,
}

/// What an authenticated initiator wants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Intro {
    /// A root asks a node daemon to start `program` (found by its build-id) as remote
    /// level-3 worker `worker_id` of this session.
    Open {
        /// The worker id in the root.
        worker_id: u32,
        /// The ELF build-id of the root's executable.
        build_id: Vec<u8>,
        /// The arguments the program is started with (the root's own, by default).
        args: Vec<String>,
    },
    /// A launched node (`strata-node launch`, rank > 0) joins its root as worker
    /// `worker_id`.
    Join {
        /// The worker id in the root.
        worker_id: u32,
    },
}

/// Why a peer refuses (then closes the connection).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What kind of refusal.
    pub code: ErrorCode,
    /// What was wrong and how to fix it.
    pub message: String,
}

/// The kinds of refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The peer's proof of the secret was wrong.
    Auth,
    /// The peer's program differs (build-id or registry digest).
    Program,
    /// A frame broke the protocol.
    Protocol,
    /// The node is shutting down (its daemon drains).
    Draining,
    /// The node failed to start its level-3 worker.
    Startup,
    /// Anything else.
    Other,
}

/// Who a node is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHello {
    /// The worker id it serves.
    pub worker_id: u32,
    /// The ELF build-id of its executable.
    pub build_id: Vec<u8>,
    /// Its registry digest.
    pub registry_digest: [u8; 32],
    /// Chips and sub-workers of its level-3 worker (as its program declared them).
    pub chips: u32,
    /// Sub-workers.
    pub sub_workers: u32,
    /// Its process id (for messages).
    pub pid: u32,
    /// Its host name (for messages).
    pub host: String,
}

/// The node's level-3 worker is up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// Bytes of its staging area (the largest total of a task's shipped tensors).
    pub staging_bytes: u64,
}

/// A byte range of the root's shared memory that a task's tensors name, shipped to the
/// node before the task (`send`) and back after it (`recv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// The root's shared-memory region.
    pub region: u64,
    /// First byte in the region.
    pub start: u64,
    /// Bytes.
    pub len: u64,
    /// The node needs the bytes before the task runs.
    pub send: bool,
    /// The task writes them: the node sends them back before DONE.
    pub recv: bool,
}

/// A task for the node's level-3 worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// The host orchestration's digest.
    pub callable: [u8; 32],
    /// The encoded call configuration, trailing zero bytes left off.
    pub config: Vec<u8>,
    /// The argument blob as the root's engine encoded it (tensors name the root's
    /// shared memory; the node rewrites them to its own).
    pub args: Vec<u8>,
    /// The root's shared-memory ranges the tensors name.
    pub segments: Vec<Segment>,
}

/// A chunk of bulk data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Data<'a> {
    /// The task (its TASK frame's sequence) or control request it belongs to.
    pub owner: u64,
    /// Which segment.
    pub segment: u32,
    /// Offset in the segment.
    pub offset: u64,
    /// The bytes.
    #[serde(borrow)]
    pub bytes: &'a [u8],
}

/// The most trace bytes a DONE carries (a traced task's trace is encoded within it).
pub const MAX_TRACE_BYTES: usize = 512 * 1024;

/// A task's end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {
    /// `None`: success; else the failure's code and message.
    pub failure: Option<(i32, String)>,
    /// A traced task's trace ([`strata_types::trace::Trace::encode_bounded`], at most
    /// [`MAX_TRACE_BYTES`]); empty otherwise. Foreign bytes: decoded defensively.
    pub trace: Vec<u8>,
    /// A traced task: when the node received its TASK frame, ns on the node's
    /// `CLOCK_MONOTONIC` (0 otherwise).
    pub node_recv_ns: u64,
    /// A traced task: when the node sent this DONE, on the same clock (0 otherwise). With
    /// the root's own send and receive times they give the node's clock offset and its
    /// error bound (`ClockSync::from_round_trip`).
    pub node_send_ns: u64,
    /// A failed task that stalled: what its level-3 run was waiting for
    /// ([`strata_types::WaitFor::encode`], at most [`strata_types::WAIT_FOR_MAX_BYTES`]);
    /// empty otherwise. Foreign bytes: decoded defensively (undecodable ones are dropped).
    pub wait_for: Vec<u8>,
}

impl Done {
    /// An untraced task's end.
    pub fn new(failure: Option<(i32, String)>) -> Done {
        Done {
            failure,
            trace: Vec::new(),
            node_recv_ns: 0,
            node_send_ns: 0,
            wait_for: Vec::new(),
        }
    }
}

/// A device-memory request for one of the node's chips.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// Allocate `bytes` on chip `chip`; the reply's value is the allocation's id.
    Alloc {
        /// The chip (its worker id in the node's level-3 worker).
        chip: u32,
        /// Bytes.
        bytes: u64,
    },
    /// Free allocation `id`.
    Free {
        /// The allocation.
        id: u64,
    },
    /// Copy `len` bytes into allocation `id` from its byte `offset` on (the bytes follow
    /// as DATA frames owned by this request, segment 0, in order).
    CopyTo {
        /// The allocation.
        id: u64,
        /// The first byte of the allocation written.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Copy `len` bytes of allocation `id` from its byte `offset` on back to the root
    /// (they come as DATA frames owned by this request, segment 0, before the reply).
    CopyFrom {
        /// The allocation.
        id: u64,
        /// The first byte of the allocation read.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Bytes chip `chip`'s allocator holds.
    Committed {
        /// The chip.
        chip: u32,
    },
    /// Bytes chip `chip`'s emulated card could still hand out.
    FreeBytes {
        /// The chip.
        chip: u32,
    },
    /// Bytes chip `chip`'s emulated card holds in all (its configured capacity).
    Capacity {
        /// The chip.
        chip: u32,
    },
}

/// A control request's answer (the body of a [`FrameType::ControlReply`]; named apart from
/// strata-mailbox's `ControlReply`, the mailbox's own control reply).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlAnswer {
    /// The result word, or why there is none.
    pub result: Result<u64, String>,
}

/// The node's confirmation that it shut down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShutdownAck {
    /// Every process of its subtree was reaped.
    pub reaped: bool,
    /// What was abnormal, if anything (empty: nothing).
    pub report: String,
}

/// Drop a task that has not started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    /// The task (its TASK frame's sequence).
    pub task: u64,
}

/// A decoded body of any frame type (what the fuzz target and the readers use).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body<'a> {
    /// [`FrameType::Hello`].
    Hello(Hello),
    /// [`FrameType::Challenge`].
    Challenge(Challenge),
    /// [`FrameType::Auth`].
    Auth(Auth),
    /// [`FrameType::Error`].
    Error(ErrorBody),
    /// [`FrameType::NodeHello`].
    NodeHello(NodeHello),
    /// [`FrameType::Ready`].
    Ready(Ready),
    /// [`FrameType::Task`].
    Task(Task),
    /// [`FrameType::Data`].
    Data(Data<'a>),
    /// [`FrameType::Done`].
    Done(Done),
    /// [`FrameType::Control`].
    Control(Control),
    /// [`FrameType::ControlReply`].
    ControlReply(ControlAnswer),
    /// [`FrameType::Heartbeat`] (empty body).
    Heartbeat,
    /// [`FrameType::Cancel`].
    Cancel(Cancel),
    /// [`FrameType::Shutdown`] (empty body).
    Shutdown,
    /// [`FrameType::ShutdownAck`].
    ShutdownAck(ShutdownAck),
}

/// Decodes the body of a frame of type `kind`.
///
/// # Errors
/// [`WireError::Body`]; never a panic.
pub fn decode_any(kind: FrameType, body: &[u8]) -> Result<Body<'_>, WireError> {
    Ok(match kind {
        FrameType::Hello => Body::Hello(decode_body(kind, body)?),
        FrameType::Challenge => Body::Challenge(decode_body(kind, body)?),
        FrameType::Auth => Body::Auth(decode_body(kind, body)?),
        FrameType::Error => Body::Error(decode_body(kind, body)?),
        FrameType::NodeHello => Body::NodeHello(decode_body(kind, body)?),
        FrameType::Ready => Body::Ready(decode_body(kind, body)?),
        FrameType::Task => Body::Task(decode_body(kind, body)?),
        FrameType::Data => Body::Data(decode_body(kind, body)?),
        FrameType::Done => Body::Done(decode_body(kind, body)?),
        FrameType::Control => Body::Control(decode_body(kind, body)?),
        FrameType::ControlReply => Body::ControlReply(decode_body(kind, body)?),
        FrameType::Heartbeat => {
            decode_body::<()>(kind, body)?;
            Body::Heartbeat
        }
        FrameType::Cancel => Body::Cancel(decode_body(kind, body)?),
        FrameType::Shutdown => {
            decode_body::<()>(kind, body)?;
            Body::Shutdown
        }
        FrameType::ShutdownAck => Body::ShutdownAck(decode_body(kind, body)?),
    })
}

/// Decodes one whole frame from `bytes` (header, then exactly `length` body bytes): what
/// a reader does with what it read, in one call (the fuzz target's entry point).
///
/// # Errors
/// [`WireError`] naming what is wrong; never a panic.
pub fn decode_frame(bytes: &[u8]) -> Result<(Header, Body<'_>), WireError> {
    let raw: &[u8; HEADER_BYTES] = bytes
        .get(..HEADER_BYTES)
        .and_then(|h| h.try_into().ok())
        .ok_or(WireError::Truncated {
            have: bytes.len(),
            need: HEADER_BYTES,
        })?;
    let header = decode_header(raw)?;
    let body = &bytes[HEADER_BYTES..];
    if body.len() != header.length as usize {
        return Err(WireError::Truncated {
            have: body.len(),
            need: header.length as usize,
        });
    }
    check_body(raw, &header, body)?;
    Ok((header, decode_any(header.kind, body)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DATA frame sent as its head bytes then the payload, or built by
    /// `encode_data_copy`, is the frame `encode_data` builds, byte for byte, and the receiver's prefix parser finds the head, length and
    /// payload offset postcard's decoder finds — at the varints' one-byte and ten-byte
    /// extremes.
    #[test]
    fn a_data_frame_sent_in_two_parts_is_the_encoded_one_and_parses_alike() {
        for (owner, segment, offset, len) in [
            (1u64, 0u32, 0u64, 0usize),
            (7, 3, 300, 1),
            (u64::MAX, u32::MAX, u64::MAX - 1, 4097),
            (1 << 35, 127, 128, CHUNK_BYTES),
        ] {
            let head = DataHead {
                owner,
                segment,
                offset,
            };
            let payload: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let mut whole = Vec::new();
            encode_data(&mut whole, 0xabc, 99, head, len, |d| {
                d.copy_from_slice(&payload)
            });
            let (bytes, used) = data_head_bytes(0xabc, 99, head, &payload);
            let mut parts = bytes[..used].to_vec();
            parts.extend_from_slice(&payload);
            assert_eq!(parts, whole, "{head:?} {len}");
            let mut copied = vec![0xee; 3];
            encode_data_copy(&mut copied, 0xabc, 99, head, &payload);
            assert_eq!(copied, whole, "encode_data_copy {head:?} {len}");
            let (h, Body::Data(d)) = decode_frame(&whole).unwrap() else {
                panic!("not DATA")
            };
            let body = &whole[HEADER_BYTES..];
            let start = &body[..body.len().min(DATA_PREFIX_MAX)];
            let (parsed, n, at) = parse_data_prefix(start, h.length as usize).unwrap();
            assert_eq!(parsed, head);
            assert_eq!((n, &body[at..]), (d.bytes.len(), d.bytes));
        }
    }

    /// The prefix parser refuses truncated varints, values past their type and a length
    /// that disagrees with the body's, and never panics on arbitrary bytes.
    #[test]
    fn the_data_prefix_parser_refuses_malformed_prefixes() {
        assert_eq!(parse_data_prefix(&[], 0), None);
        assert_eq!(parse_data_prefix(&[1, 0, 0], 3), None);
        // Length 2 declared, body of 4 prefix bytes + 1.
        assert_eq!(parse_data_prefix(&[1, 0, 0, 2, 9], 5), None);
        assert_eq!(parse_data_prefix(&[0xff; DATA_PREFIX_MAX], 100), None);
        // An owner past u64 (a tenth byte above 1).
        let mut big = [0xffu8; 14];
        big[9] = 2;
        big[10..].copy_from_slice(&[0, 0, 0, 0]);
        assert_eq!(parse_data_prefix(&big, 14), None);
        // A segment past u32.
        assert_eq!(
            parse_data_prefix(&[1, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0], 8),
            None
        );
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut b = [0u8; DATA_PREFIX_MAX];
            for v in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x as u8;
            }
            let n = (x >> 8) as usize % (DATA_PREFIX_MAX + 1);
            let _ = parse_data_prefix(&b[..n], (x >> 16) as usize % 1000);
        }
    }

    fn roundtrip(kind: FrameType, frame: Vec<u8>) -> Header {
        let (h, _) = decode_frame(&frame).expect("decodes");
        assert_eq!(h.kind, kind);
        h
    }

    #[test]
    fn header_byte_map_is_the_documented_one() {
        let f = encode(
            FrameType::Cancel,
            0x0102_0304_0506_0708,
            42,
            &Cancel { task: 7 },
        )
        .unwrap();
        assert_eq!(&f[0..4], b"STRN");
        assert_eq!(u16::from_le_bytes([f[4], f[5]]), PROTOCOL_VERSION);
        assert_eq!(f[6], 13);
        assert_eq!(f[7], 0);
        assert_eq!(&f[8..16], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&f[16..24], &42u64.to_le_bytes());
        assert_eq!(
            u32::from_le_bytes([f[24], f[25], f[26], f[27]]) as usize,
            f.len() - 32
        );
        assert_eq!(&f[32..], &[7u8]); // postcard varint 7
        let h = roundtrip(FrameType::Cancel, f);
        assert_eq!((h.session, h.sequence), (0x0102_0304_0506_0708, 42));
    }

    #[test]
    fn every_body_round_trips() {
        let task = Task {
            callable: [3; 32],
            config: vec![1, 2, 3],
            args: vec![9; 100],
            segments: vec![Segment {
                region: 4,
                start: 8,
                len: 16,
                send: true,
                recv: false,
            }],
        };
        let f = encode(FrameType::Task, 1, 2, &task).unwrap();
        let (_, b) = decode_frame(&f).unwrap();
        assert_eq!(b, Body::Task(task));
        let f = encode(FrameType::Heartbeat, 1, 3, &()).unwrap();
        assert_eq!(decode_frame(&f).unwrap().1, Body::Heartbeat);
        let reply = ControlAnswer {
            result: Err("no such allocation".into()),
        };
        let f = encode(FrameType::ControlReply, 1, 4, &reply).unwrap();
        assert_eq!(decode_frame(&f).unwrap().1, Body::ControlReply(reply));
    }

    #[test]
    fn data_frames_built_in_place_decode_like_postcard_ones() {
        let mut buf = Vec::new();
        let payload: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        encode_data(
            &mut buf,
            5,
            6,
            DataHead {
                owner: 300,
                segment: 2,
                offset: 1 << 40,
            },
            payload.len(),
            |d| d.copy_from_slice(&payload),
        );
        let (h, b) = decode_frame(&buf).unwrap();
        assert_eq!(h.kind, FrameType::Data);
        assert_eq!(
            b,
            Body::Data(Data {
                owner: 300,
                segment: 2,
                offset: 1 << 40,
                bytes: &payload
            })
        );
        let via_postcard = encode(
            FrameType::Data,
            5,
            6,
            &Data {
                owner: 300,
                segment: 2,
                offset: 1 << 40,
                bytes: &payload,
            },
        )
        .unwrap();
        assert_eq!(buf, via_postcard);
    }

    #[test]
    fn damaged_frames_are_refused_with_typed_errors() {
        let good = encode(FrameType::Cancel, 1, 1, &Cancel { task: 1 }).unwrap();
        let mut f = good.clone();
        f[0] = b'X';
        assert!(matches!(decode_frame(&f), Err(WireError::BadMagic(_))));
        let mut f = good.clone();
        f[4] = 9;
        assert!(matches!(
            decode_frame(&f),
            Err(WireError::Version { theirs: 9, .. })
        ));
        let mut f = good.clone();
        f[6] = 200;
        assert!(matches!(decode_frame(&f), Err(WireError::UnknownType(200))));
        let mut f = good.clone();
        f[7] = 1;
        assert!(matches!(decode_frame(&f), Err(WireError::Flags(1))));
        let mut f = good.clone();
        f[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_frame(&f), Err(WireError::TooLarge { .. })));
        let mut f = good.clone();
        *f.last_mut().unwrap() ^= 0x40;
        assert!(matches!(decode_frame(&f), Err(WireError::Checksum { .. })));
        assert!(matches!(
            decode_frame(&good[..20]),
            Err(WireError::Truncated { .. })
        ));
        // A body with trailing bytes (checksum fixed up, so only the body is wrong).
        let mut f = good.clone();
        f.push(0);
        let n = (f.len() - HEADER_BYTES) as u32;
        f[24..28].copy_from_slice(&n.to_le_bytes());
        let sum = checksum(&[&f[0..28], &f[HEADER_BYTES..]]);
        f[28..32].copy_from_slice(&sum.to_le_bytes());
        assert!(matches!(decode_frame(&f), Err(WireError::Body { .. })));
    }

    #[test]
    fn checksum_does_not_depend_on_how_the_bytes_are_split() {
        let data: Vec<u8> = (0..999u32).map(|i| (i * 7) as u8).collect();
        let whole = checksum(&[&data]);
        for cut in [0, 1, 28, 31, 32, 33, 500, 998, 999] {
            assert_eq!(checksum(&[&data[..cut], &data[cut..]]), whole, "cut {cut}");
        }
        let mut other = data.clone();
        other[500] ^= 1;
        assert_ne!(checksum(&[&other]), whole);
    }

    #[test]
    fn long_messages_are_clipped_on_a_character_boundary() {
        let s = "é".repeat(MAX_MESSAGE);
        let c = clip_message(s);
        assert!(c.len() <= MAX_MESSAGE);
        assert!(c.chars().all(|ch| ch == 'é'));
    }
}
