//! Errors of the network node. Each says what was wrong and, where there is a fix, how.

use crate::wire::FrameType;

/// A frame that cannot be decoded (from a peer that is broken, hostile, or not strata).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The first four bytes are not `STRN`: the peer does not speak this protocol.
    #[error(
        "not a strata-net frame (magic {0:02x?}, expected \"STRN\"): is the peer a strata node?"
    )]
    BadMagic([u8; 4]),
    /// The peer speaks another protocol version.
    #[error("protocol version {theirs} is not this build's {ours}: run the same strata build on both ends")]
    Version {
        /// The peer's version.
        theirs: u16,
        /// Ours.
        ours: u16,
    },
    /// The frame type is not one this version defines.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// A flag bit is set, and this version defines none.
    #[error("frame flags {0:#04x} are set; this protocol version defines none")]
    Flags(u8),
    /// The body is longer than a frame may be.
    #[error("frame body of {length} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// The length announced.
        length: u64,
        /// The limit.
        max: usize,
    },
    /// The checksum does not match the bytes: the frame was damaged.
    #[error("corrupted {kind:?} frame: checksum {computed:#010x} does not match the sender's {expected:#010x}")]
    Checksum {
        /// The frame's type.
        kind: FrameType,
        /// What the header says.
        expected: u32,
        /// What the bytes give.
        computed: u32,
    },
    /// Fewer bytes than the header announces.
    #[error("truncated frame: {have} bytes, {need} needed")]
    Truncated {
        /// Bytes present.
        have: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The body does not decode as its type's struct.
    #[error("malformed {kind:?} body: {reason}")]
    Body {
        /// The frame's type.
        kind: FrameType,
        /// What postcard or the checks said.
        reason: String,
    },
    /// A body could not be encoded (a bug of this crate).
    #[error("cannot encode a frame body: {0}")]
    Encode(String),
}

/// What went wrong in the network node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// A frame could not be decoded.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A wait ran past its deadline.
    #[error("{what}: no answer within {after:?}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The budget.
        after: std::time::Duration,
    },
    /// The peer failed the challenge–response: it does not hold the same secret (or the
    /// answer was forged).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The peer runs a different program (build-id or registry digest).
    #[error("program mismatch: {0}")]
    Program(String),
    /// The peer refused with an ERROR frame.
    #[error("the peer refused: {0}")]
    Refused(String),
    /// The peer broke the protocol (an unexpected frame, a wrong session).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A bad argument, address, secret file or environment (the message says how to fix
    /// it).
    #[error("{0}")]
    Config(String),
    /// A device-memory request for a remote worker's chips failed; `worker` names the
    /// remote worker (its label: address, pid, host), `fault` says what kind of failure.
    #[error("{worker}: {message}")]
    DeviceMemory {
        /// The remote worker.
        worker: String,
        /// What kind of failure.
        fault: MemoryFault,
        /// What was wrong and how to fix it.
        message: String,
    },
    /// An error of the engine.
    #[error(transparent)]
    Dist(#[from] strata_dist::DistError),
}

/// The kinds of [`NetError::DeviceMemory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryFault {
    /// The level-4 worker is not initialised (or its session never started).
    NotConnected,
    /// The tensor belongs to another remote worker.
    OtherWorker,
    /// The tensor was freed.
    Freed,
    /// The byte range leaves the tensor.
    OutOfRange,
    /// The remote worker has no such chip.
    NoSuchChip,
    /// The node refused or failed the request (its message says why).
    Node,
    /// The session ended before the answer (the node died, or the link failed).
    SessionLost,
    /// No answer within the control deadline.
    Timeout,
}

impl NetError {
    /// An [`NetError::Io`] for `what`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> NetError {
        NetError::Io {
            what: what.into(),
            source,
        }
    }
}
