//! Task and control outcomes: failures with a code and a message.

use std::fmt;
use strata_types::WaitFor;

/// Error codes the mailbox itself reports. Handlers should use positive codes; the
/// negative range `-1..=-99` is reserved for these.
pub mod codes {
    /// Success.
    pub const OK: i32 = 0;
    /// A failure whose handler gave code 0 (normalised, since 0 means success).
    pub const FAILED: i32 = -1;
    /// The handler panicked; the message carries the panic payload.
    pub const HANDLER_PANICKED: i32 = -2;
    /// The frame's content failed validation in the child (protocol version, identity,
    /// digest, lengths, config or argument encoding).
    pub const BAD_REQUEST: i32 = -3;
    /// The child does not support the request (e.g. an unknown control command).
    pub const UNSUPPORTED: i32 = -4;
    /// The child shut down before it ran the task.
    pub const SHUT_DOWN: i32 = -5;
    /// The handler's reply does not fit the frame.
    pub const REPLY_TOO_LARGE: i32 = -6;
}

/// A failed task or control command: a non-zero code and a message.
///
/// Messages travel in a 256-byte NUL-terminated region, so at most 255 bytes arrive
/// (truncated on a UTF-8 character boundary).
///
/// ```
/// use strata_mailbox::{codes, FailureReport};
/// let f = FailureReport::new(42, "buffer 7 is not mapped");
/// assert_eq!(f.to_string(), "code 42: buffer 7 is not mapped");
/// assert_eq!(FailureReport::new(0, "?").code, codes::FAILED); // 0 would mean success
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureReport {
    /// The error code, never 0.
    pub code: i32,
    /// What went wrong.
    pub message: String,
    /// What the task was waiting for when it gave up, if the failure ended a stall (a
    /// chip's kernel past its timeout, a heap ring that could not make room): travels
    /// beside the message, bounded ([`strata_types::WAIT_FOR_MAX_BYTES`] encoded).
    pub wait_for: Option<Box<WaitFor>>,
}

impl FailureReport {
    /// A failure; a `code` of 0 becomes [`codes::FAILED`].
    pub fn new(code: i32, message: impl Into<String>) -> FailureReport {
        FailureReport {
            code: if code == codes::OK {
                codes::FAILED
            } else {
                code
            },
            message: message.into(),
            wait_for: None,
        }
    }

    /// The same failure, carrying the wait-for state of the stall it ended (`None`: none).
    pub fn with_wait_for(mut self, wait_for: Option<WaitFor>) -> FailureReport {
        self.wait_for = wait_for.map(Box::new);
        self
    }
}

impl fmt::Display for FailureReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "code {}: {}", self.code, self.message)
    }
}

impl std::error::Error for FailureReport {}

pub(crate) use strata_sync::panic_message;
