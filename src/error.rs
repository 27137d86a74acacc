//! The facade's one error type.

use std::sync::Arc;
use std::time::Duration;
use strata_dist::DistError;
use strata_graph::{Failure, FailureKind, WorkerClass};
use strata_types::WaitFor;

/// Everything that can go wrong through the facade. A failure of a chip's work is one
/// variant ([`Error::Chip`]) whether the chip is the worker itself (level 2) or a child
/// of a level-3 worker, or of a level-3 worker under a level-4 one.
///
/// Cheap to clone: a dispatch handle returns the same error on every wait.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A chip's task failed: a kernel returned an error or panicked, ran past its
    /// deadline, the chip orchestration failed or hit a fatal code, or the chip's process
    /// died.
    #[error("{message}{}", shown(wait_for))]
    Chip {
        /// The chip: its worker id at the level that dispatched to it (0 for a level-2
        /// worker), or the level-3 child it sits under.
        worker: u32,
        /// What kind of failure.
        kind: FailureKind,
        /// The chip's status code (a fatal code, `SCHEDULER_TIMEOUT` = 100, ...), when it
        /// reported one.
        code: Option<i32>,
        /// What happened, naming the chip (and kernel, where one failed).
        message: String,
        /// What the run was waiting for, when the failure ended a stall (a kernel past its
        /// timeout or that gave up a signal wait, a heap ring that could not make room):
        /// its text also ends the error's message.
        wait_for: Option<Arc<WaitFor>>,
    },
    /// A host sub-worker's callback failed, panicked, ran past its deadline, or its
    /// process died.
    #[error("{message}{}", shown(wait_for))]
    SubWorker {
        /// The sub-worker's index.
        index: u32,
        /// What kind of failure.
        kind: FailureKind,
        /// What happened, naming the sub-worker and the callback.
        message: String,
        /// What the run was waiting for, when the failure ended a stall (the callback ran
        /// past its deadline).
        wait_for: Option<Arc<WaitFor>>,
    },
    /// A next-level worker (a level-3 child of a level-4 worker) failed as a whole: its
    /// process died, its orchestration failed, it ran past its deadline.
    #[error("{message}{}", shown(wait_for))]
    Worker {
        /// Its worker id.
        worker: u32,
        /// What kind of failure.
        kind: FailureKind,
        /// What happened.
        message: String,
        /// What the run was waiting for, when the failure ended a stall.
        wait_for: Option<Arc<WaitFor>>,
    },
    /// The dispatch's host orchestration returned an error (its unstarted tasks were
    /// cancelled), or a task failed in a way no single worker is to blame for.
    #[error("orchestration failed: {0}")]
    Orchestration(String),
    /// A dispatch did not finish within the time given to `wait`; it goes on.
    #[error("the dispatch did not finish within {after:?}; it is still running (wait again, or close the worker to drain it){}", shown(wait_for))]
    Timeout {
        /// The time given to `wait`.
        after: Duration,
        /// What the dispatch was waiting for when the wait gave up: which tasks wait for
        /// which producers or workers, which run on which worker and for how long (`None`
        /// for a level-2 worker's dispatch, or when another thread is waiting for the same
        /// dispatch).
        wait_for: Option<Arc<WaitFor>>,
    },
    /// A program's signature is invalid (at compile).
    #[error("program {program}: parameter {param:?} {message}")]
    Signature {
        /// The program.
        program: String,
        /// The parameter.
        param: String,
        /// What is wrong with it.
        message: String,
    },
    /// A dispatch argument does not match the program's signature, or cannot be
    /// dispatched (a private buffer, a tensor of another worker, a freed one).
    #[error("program {program}: argument {param:?} {message}")]
    Argument {
        /// The program.
        program: String,
        /// The parameter.
        param: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A program cannot be used the way it was asked to (compiled for another target, not
    /// prepared on this worker, a callback missing or unknown, ...).
    #[error("{0}")]
    Program(String),
    /// Device memory: out of the card's memory, a stale, foreign or freed tensor, a copy
    /// that leaves its tensor.
    #[error("{0}")]
    Memory(String),
    /// Bad input to a call (what was wrong and how to fix it).
    #[error("{0}")]
    InvalidArgument(String),
    /// An invalid configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The worker was closed (or is closing) before this call.
    #[error("{0}() called after close(); prepare a new worker")]
    Closed(&'static str),
    /// A memory region is in use by dispatches in flight.
    #[error("{0}")]
    Busy(String),
    /// The worker lost a child (or a thread of its own) and accepts no more work; close it.
    #[error("the worker is unusable: {0}; close() it")]
    Unusable(String),
    /// Shared memory or child processes: a fork refused, a child that did not start, a
    /// close that had to kill children.
    #[error("{0}")]
    Host(String),
    /// An internal error of the runtime; please report it.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The wait-for state's text, on the lines after a message (nothing without one).
fn shown(w: &Option<Arc<WaitFor>>) -> String {
    w.as_ref().map_or_else(String::new, |w| format!("\n{w}"))
}

impl Error {
    /// The wait-for state of the stall this error ended or reports (a timeout, a kernel or
    /// task past its deadline, a signal wait given up, a heap ring that could not make
    /// room): as data, for a program to inspect; its text also ends the error's message.
    pub fn wait_for(&self) -> Option<&WaitFor> {
        match self {
            Error::Chip { wait_for, .. }
            | Error::SubWorker { wait_for, .. }
            | Error::Worker { wait_for, .. }
            | Error::Timeout { wait_for, .. } => wait_for.as_deref(),
            _ => None,
        }
    }

    /// The error for a task failure, by where it happened.
    pub(crate) fn from_failure(f: &Failure) -> Error {
        let message = f.message().to_owned();
        let kind = f.kind();
        let wait_for = f.wait_for().cloned();
        match f.origin() {
            Some(o) => match o.class {
                WorkerClass::Chip => Error::Chip {
                    worker: o.index,
                    kind,
                    code: (f.code() > 0).then_some(f.code()),
                    message,
                    wait_for,
                },
                WorkerClass::SubWorker => Error::SubWorker {
                    index: o.index,
                    kind,
                    message,
                    wait_for,
                },
                WorkerClass::Worker => Error::Worker {
                    worker: o.index,
                    kind,
                    message,
                    wait_for,
                },
            },
            None => Error::Orchestration(message),
        }
    }

    /// A chip's own error at level 2 (the chip is the worker).
    pub(crate) fn from_chip(e: strata_chip::ChipError) -> Error {
        use strata_chip::ChipError as C;
        let message = e.to_string();
        let code = e.code();
        // A chip error's Display ends with its wait-for state's text; the facade's error
        // shows it from the data.
        let headline = e.headline();
        let wait_for = e.wait_for().cloned().map(Arc::new);
        match e {
            C::KernelFailed { .. } | C::OrchestrationFailed { .. } => Error::Chip {
                worker: 0,
                kind: FailureKind::Task,
                code,
                message: headline,
                wait_for,
            },
            C::KernelTimeout { .. } => Error::Chip {
                worker: 0,
                kind: FailureKind::Timeout,
                code,
                message: headline,
                wait_for,
            },
            C::Fatal { .. } => Error::Chip {
                worker: 0,
                kind: FailureKind::Fatal,
                code,
                message: headline,
                wait_for,
            },
            C::Unusable(_) => Error::Unusable(message),
            C::OutOfDeviceMemory { .. }
            | C::ZeroSizedAlloc
            | C::DoubleFree { .. }
            | C::StaleHandle { .. }
            | C::InteriorFree { .. }
            | C::ForeignHandle { .. }
            | C::OutOfRange { .. }
            | C::HostRange { .. } => Error::Memory(message),
            C::InvalidConfig(_) => Error::Config(message),
            C::Closed { op } => Error::Closed(op),
            _ => Error::InvalidArgument(message),
        }
    }
}

impl From<DistError> for Error {
    fn from(e: DistError) -> Error {
        match e {
            DistError::TaskFailed(f) => Error::from_failure(&f),
            DistError::Orchestration(e) => Error::Orchestration(e.to_string()),
            DistError::WaitTimeout { after, wait_for } => Error::Timeout { after, wait_for },
            DistError::InvalidConfig(m) => Error::Config(m),
            DistError::Unusable(m) => Error::Unusable(m),
            DistError::Chip(c) => Error::from_chip(c),
            DistError::Host(h) => Error::from(h),
            e @ (DistError::StaleTensor { .. } | DistError::Control { .. }) => {
                Error::Memory(e.to_string())
            }
            e @ (DistError::Unresponsive { .. } | DistError::Close(_)) => {
                Error::Host(e.to_string())
            }
            DistError::Internal(m) => Error::Internal(m),
            e => Error::InvalidArgument(e.to_string()),
        }
    }
}

impl From<strata_net::NetError> for Error {
    fn from(e: strata_net::NetError) -> Error {
        use strata_net::{MemoryFault, NetError};
        match e {
            NetError::Dist(d) => Error::from(d),
            // As for a local child's chips: a range or chip the caller got wrong is an
            // argument error, a tensor that is not live (or the chip's refusal) a memory one.
            NetError::DeviceMemory {
                fault: MemoryFault::NoSuchChip | MemoryFault::OutOfRange,
                ..
            } => Error::InvalidArgument(e.to_string()),
            NetError::DeviceMemory {
                fault: MemoryFault::Freed | MemoryFault::OtherWorker | MemoryFault::Node,
                ..
            } => Error::Memory(e.to_string()),
            NetError::Config(m) => Error::Config(m),
            e => Error::Host(e.to_string()),
        }
    }
}

impl From<strata_chip::ChipError> for Error {
    fn from(e: strata_chip::ChipError) -> Error {
        Error::from_chip(e)
    }
}

impl From<strata_host::HostError> for Error {
    fn from(e: strata_host::HostError) -> Error {
        match e {
            strata_host::HostError::Busy { .. } => Error::Busy(e.to_string()),
            e => Error::Host(e.to_string()),
        }
    }
}

impl From<strata_types::TypesError> for Error {
    fn from(e: strata_types::TypesError) -> Error {
        Error::InvalidArgument(e.to_string())
    }
}

/// A facade error met while building a task argument (e.g. `ProgramTensor::row` on a
/// stacked tensor), recorded by `TaskArgs`' chaining methods.
impl From<Error> for strata_types::TypesError {
    fn from(e: Error) -> strata_types::TypesError {
        strata_types::TypesError::NotAnArgument(e.to_string())
    }
}
