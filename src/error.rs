//! The facade's one error type.

use std::time::Duration;
use strata_dist::DistError;
use strata_graph::{Failure, FailureKind, WorkerClass};

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
    #[error("{message}")]
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
    },
    /// A host sub-worker's callback failed, panicked, ran past its deadline, or its
    /// process died.
    #[error("{message}")]
    SubWorker {
        /// The sub-worker's index.
        index: u32,
        /// What kind of failure.
        kind: FailureKind,
        /// What happened, naming the sub-worker and the callback.
        message: String,
    },
    /// A next-level worker (a level-3 child of a level-4 worker) failed as a whole: its
    /// process died, its orchestration failed, it ran past its deadline.
    #[error("{message}")]
    Worker {
        /// Its worker id.
        worker: u32,
        /// What kind of failure.
        kind: FailureKind,
        /// What happened.
        message: String,
    },
    /// The dispatch's host orchestration returned an error (its unstarted tasks were
    /// cancelled), or a task failed in a way no single worker is to blame for.
    #[error("orchestration failed: {0}")]
    Orchestration(String),
    /// A dispatch did not finish within the time given to `wait`; it goes on.
    #[error("the dispatch did not finish within {0:?}; it is still running (wait again, or close the worker to drain it)")]
    Timeout(Duration),
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

impl Error {
    /// The error for a task failure, by where it happened.
    pub(crate) fn from_failure(f: &Failure) -> Error {
        let message = f.message().to_owned();
        let kind = f.kind();
        match f.origin() {
            Some(o) => match o.class {
                WorkerClass::Chip => Error::Chip {
                    worker: o.index,
                    kind,
                    code: (f.code() > 0).then_some(f.code()),
                    message,
                },
                WorkerClass::SubWorker => Error::SubWorker {
                    index: o.index,
                    kind,
                    message,
                },
                WorkerClass::Worker => Error::Worker {
                    worker: o.index,
                    kind,
                    message,
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
        match e {
            C::KernelFailed { .. } | C::OrchestrationFailed { .. } => Error::Chip {
                worker: 0,
                kind: FailureKind::Task,
                code,
                message,
            },
            C::KernelTimeout { .. } => Error::Chip {
                worker: 0,
                kind: FailureKind::Timeout,
                code,
                message,
            },
            C::Fatal { .. } => Error::Chip {
                worker: 0,
                kind: FailureKind::Fatal,
                code,
                message,
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
            DistError::WaitTimeout(d) => Error::Timeout(d),
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
