//! The error type of this crate.

use crate::state::{FrameId, FrameIdentity, MailboxState};
use std::fmt;
use std::time::Duration;
use thiserror::Error;

/// How a child process ended, as seen by a liveness check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildExit {
    /// It called `exit`/`_exit` with this status.
    Exited(i32),
    /// A signal killed it.
    Signaled {
        /// The signal number (e.g. 6 for `SIGABRT`, 9 for `SIGKILL`).
        signal: i32,
        /// Whether it dumped core.
        core_dumped: bool,
    },
    /// `waitpid` no longer knows it (`ECHILD`): reaped elsewhere, or not our child.
    NotWaitable,
}

impl fmt::Display for ChildExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildExit::Exited(code) => write!(f, "exited with status {code}"),
            ChildExit::Signaled {
                signal,
                core_dumped,
            } => {
                write!(f, "killed by signal {signal}")?;
                if *core_dumped {
                    f.write_str(" (core dumped)")?;
                }
                Ok(())
            }
            ChildExit::NotWaitable => f.write_str(
                "is no longer waitable (already reaped, or not a child of this process)",
            ),
        }
    }
}

/// Everything that can go wrong in the mailbox: setting up shared memory, reading what
/// the peer wrote, and waiting for it.
///
/// Every variant says what failed and, where there is one, how to fix it. Data read from
/// shared memory is validated; bad data is one of these errors, never a panic.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MailboxError {
    /// A system call on a shared-memory region failed.
    #[error("could not {op} shared-memory region{}: {source}; {hint}", name.as_ref().map(|n| format!(" {n:?}")).unwrap_or_default())]
    Region {
        /// What was attempted (`create`, `open`, `size`, `map`, `unlink`).
        op: &'static str,
        /// The region's name, for named regions.
        name: Option<String>,
        /// The OS error.
        #[source]
        source: std::io::Error,
        /// How to fix it.
        hint: &'static str,
    },
    /// A name that cannot name a POSIX shared-memory object.
    #[error("invalid shared-memory name {name:?}: {reason}")]
    InvalidRegionName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A region too small for what is asked of it.
    #[error("shared-memory region holds {actual} bytes but {needed} are needed; create it with at least {needed} bytes")]
    RegionTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        actual: usize,
    },
    /// A frame that does not carry the mailbox magic.
    #[error("{frame} does not carry the strata mailbox magic (found {found:#018x}); the region was not created by Mailbox::create* or was overwritten")]
    BadMagic {
        /// The frame.
        frame: FrameId,
        /// The value found.
        found: u64,
    },
    /// A frame written by a different mailbox ABI version, or at the wrong index.
    #[error("{frame} has ABI version {found_version} at index {found_index}, expected version {expected_version} at index {expected_index}; build both processes from the same strata version")]
    AbiMismatch {
        /// The frame.
        frame: FrameId,
        /// The version found.
        found_version: u32,
        /// The version this build speaks.
        expected_version: u32,
        /// The frame index found.
        found_index: u32,
        /// The frame index expected.
        expected_index: u32,
    },
    /// A state word holding a value that names no state.
    #[error("{frame} holds unknown state value {value}; the peer wrote garbage or speaks another mailbox ABI")]
    UnknownState {
        /// The frame.
        frame: FrameId,
        /// The raw value.
        value: u32,
    },
    /// A known state that is not valid in this frame or at this point of the protocol.
    #[error("{frame} entered state {state}, which is not valid there; the peer broke the mailbox protocol")]
    UnexpectedState {
        /// The frame.
        frame: FrameId,
        /// The state found.
        state: MailboxState,
    },
    /// A publication into a frame that is not IDLE.
    #[error("{frame} is not reusable: it is in state {state}, not IDLE; wait for its completion and reset it before publishing again")]
    FrameBusy {
        /// The frame.
        frame: FrameId,
        /// The state found.
        state: MailboxState,
    },
    /// A reset of a frame whose task has not finished.
    #[error("{frame} is in state {state}; only a finished frame (TASK_DONE or TASK_FAILED) can be reset to IDLE")]
    NotTerminal {
        /// The frame.
        frame: FrameId,
        /// The state found.
        state: MailboxState,
    },
    /// A task frame that is busy although this parent published nothing into it.
    #[error("{frame} is in state {state} but this parent published no task there; was the mailbox shared by two parents?")]
    NoTaskPublished {
        /// The frame.
        frame: FrameId,
        /// The state found.
        state: MailboxState,
    },
    /// A frame whose identity is not the one its task was published with.
    #[error("stale frame identity at {frame}: published {expected}, the frame now holds {found} (protocol {found_protocol})")]
    StaleFrameIdentity {
        /// The frame.
        frame: FrameId,
        /// The identity this parent published.
        expected: FrameIdentity,
        /// The identity the frame holds.
        found: FrameIdentity,
        /// The protocol version the frame holds.
        found_protocol: u32,
    },
    /// An identity that breaks the non-zero rules.
    #[error("invalid task identity ({identity}): {reason}")]
    InvalidIdentity {
        /// The identity given.
        identity: FrameIdentity,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A task publication without a callable digest.
    #[error("a task must name a callable: the digest is all zero (CallableId::NONE)")]
    MissingCallable,
    /// An argument blob larger than a task frame's capacity.
    #[error("argument blob of {len} bytes exceeds the task frame capacity of {capacity} bytes; pass fewer arguments")]
    ArgsTooLarge {
        /// The blob's length.
        len: usize,
        /// The frame's capacity.
        capacity: usize,
    },
    /// A control payload larger than the control frame's payload area.
    #[error("control payload of {len} bytes exceeds the {capacity}-byte payload area; stage large data in a separate shared-memory region")]
    PayloadTooLarge {
        /// The payload's length.
        len: usize,
        /// The area's capacity.
        capacity: usize,
    },
    /// A length or enum field in shared memory with an impossible value.
    #[error(
        "{frame} field {field} holds {value}, beyond its limit {limit}; the peer wrote garbage"
    )]
    CorruptField {
        /// The frame.
        frame: FrameId,
        /// The field.
        field: &'static str,
        /// The value read.
        value: u64,
        /// The largest valid value.
        limit: u64,
    },
    /// A call configuration that does not validate.
    #[error("invalid call configuration: {0}")]
    InvalidConfig(#[source] strata_types::TypesError),
    /// The child process is gone (found by a liveness check while waiting).
    #[error("child process {pid} {exit} while the parent waited for it")]
    ChildExited {
        /// The child's pid.
        pid: i32,
        /// How it ended.
        exit: ChildExit,
    },
    /// The peer is gone, as reported by a caller-supplied liveness check.
    #[error("the peer is gone: {0}")]
    PeerGone(String),
    /// A deadline passed.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the wait lasted.
        waited: Duration,
    },
    /// A control command the child reported as failed.
    #[error("control command {command} failed on the child (code {code}): {message}")]
    ControlFailed {
        /// The sub-command.
        command: u64,
        /// The child's error code (non-zero).
        code: i32,
        /// The child's message.
        message: String,
    },
    /// The child published `INIT_FAILED`.
    #[error("child failed during init (code {code}): {message}")]
    InitFailed {
        /// The child's error code.
        code: i32,
        /// The child's message.
        message: String,
    },
    /// The control channel is unusable after an earlier control command timed out or
    /// lost its child.
    #[error(
        "the control channel is unusable: {reason}; shut the child down and create a new mailbox"
    )]
    ControlPoisoned {
        /// Why.
        reason: String,
    },
    /// A request after shutdown was requested on this mailbox.
    #[error("shutdown was already requested on this mailbox; it accepts no more work")]
    ShutdownRequested,
    /// A futex system call failed in an unexpected way.
    #[error("futex {op} failed: {source}")]
    Futex {
        /// `wait`, `waitv` or `wake`.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Another system call failed.
    #[error("{op} failed: {source}")]
    Os {
        /// What was called.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}
