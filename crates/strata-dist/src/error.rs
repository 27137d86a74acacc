//! Errors of the L3+ engine.

use strata_graph::{Failure, GraphError};
use thiserror::Error;

/// What went wrong in a worker. Every variant says what and, where there is one, how to fix.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DistError {
    /// An invalid configuration.
    #[error("invalid worker configuration: {0}")]
    InvalidConfig(String),
    /// An operation in the wrong lifecycle state.
    #[error("{op} requires a worker that is {expected}, but it is {actual}")]
    State {
        /// The operation.
        op: &'static str,
        /// The state it needs.
        expected: &'static str,
        /// The state it found.
        actual: &'static str,
    },
    /// The worker lost a child and admits no further work.
    #[error("the worker is unusable: {0}; close() it")]
    Unusable(String),
    /// Invalid task arguments (what was wrong and how to fix it).
    #[error("{0}")]
    InvalidArgs(String),
    /// An argument a [`strata_types::TaskArgs`] chaining method recorded as invalid
    /// ([`strata_types::TypesError::InvalidArgument`], naming it), reported by the submit
    /// before anything was published.
    #[error("invalid task arguments{}: {error}", .member.map(|m| format!(" of group member {m}")).unwrap_or_default())]
    BadArgument {
        /// The group member whose arguments hold it (`None` outside a group).
        member: Option<usize>,
        /// Which argument, and what was wrong with it.
        error: strata_types::TypesError,
    },
    /// A tensor argument whose descriptor names no live buffer of this worker: a
    /// [`crate::RunTensor`] kept from another run or from a scope that ended, a window
    /// tensor whose buffer was freed, a freed chip tensor, or a forged descriptor (one
    /// decoded from bytes). Running it would alias live bytes without a dependency edge.
    #[error("tensor argument {index} is not a live buffer of this worker: {reason}")]
    StaleTensor {
        /// Index of the tensor argument.
        index: usize,
        /// What the descriptor names and why it is refused.
        reason: String,
    },
    /// A window tensor passed to a task on a worker outside the window's domain: a chip
    /// task receives its own rank's copy of a window, and this worker has none.
    #[error("tensor argument {index}{} is a window of the domain over workers {members:?}, but the task runs on worker {worker}, which is not one of them: submit it to a member of the domain, or allocate the window in a domain that includes worker {worker} (Orch::comm_domain)", .member.map(|m| format!(" of group member {m}")).unwrap_or_default())]
    WindowOutsideDomain {
        /// Index of the tensor argument.
        index: usize,
        /// The worker the task was submitted to.
        worker: usize,
        /// The window's domain: next-level worker ids in domain-rank order.
        members: Vec<u32>,
        /// The group member whose arguments hold it (`None` outside a group).
        member: Option<usize>,
    },
    /// A worker id that names no next-level child.
    #[error("worker id {id} is out of range: this worker has {count} next-level workers (ids 0..{count})")]
    UnknownWorker {
        /// The id given.
        id: usize,
        /// How many there are.
        count: usize,
    },
    /// A callable of the wrong kind for its target.
    #[error("{what}: {target} expects {expected}, but the handle is {got}")]
    WrongCallable {
        /// The operation.
        what: &'static str,
        /// The target.
        target: String,
        /// The kind it expects.
        expected: &'static str,
        /// The kind given.
        got: &'static str,
    },
    /// A callable not registered with this worker.
    #[error("callable {0} is not registered with this worker; register it before init()")]
    UnknownCallable(String),
    /// A task of the run failed: the run's first error, naming the worker and carrying the
    /// child's message.
    #[error("{0}")]
    TaskFailed(Failure),
    /// The orchestration function returned an error (its own, boxed: downcast it to
    /// recover its type); the run's unstarted tasks were cancelled.
    #[error("orchestration failed: {0}")]
    Orchestration(strata_types::BoxError),
    /// `RunHandle::wait` timed out; the run goes on (wait again later). Carries what the
    /// run was waiting for at that moment: which tasks wait for which producers or
    /// workers, which run where and for how long.
    #[error("RunHandle::wait() timed out after {after:?}; the run is still in flight{}", wait_for.as_ref().map_or_else(String::new, |w| format!("\n{w}")))]
    WaitTimeout {
        /// The timeout given to `wait`.
        after: std::time::Duration,
        /// The scheduler's wait-for state when the wait gave up (`None` if the scheduler
        /// could not be asked: its loop broke).
        wait_for: Option<std::sync::Arc<strata_types::WaitFor>>,
    },
    /// A child process or thread failed to start, died, or misbehaved.
    #[error(transparent)]
    Host(#[from] strata_host::HostError),
    /// A control command on a child failed.
    #[error("{worker}: {message}")]
    Control {
        /// The child.
        worker: String,
        /// Its message.
        message: String,
    },
    /// A child did not answer a control request within
    /// [`crate::DistConfig::control_timeout`] (stopped, stuck, or too slow): it was
    /// declared unresponsive and killed, and the worker is unusable.
    #[error("{message}")]
    Unresponsive {
        /// The child.
        worker: String,
        /// What happened, naming the child, the request and the deadline.
        message: String,
        /// The deadline it missed.
        after: std::time::Duration,
    },
    /// `close()` found children that ended abnormally during shutdown (killed after the
    /// grace period because a task did not finish, crashed while shutting down, ...). The
    /// worker is closed and every child reaped regardless.
    #[error("the worker closed, but: {0}")]
    Close(String),
    /// A remote next-level child ([`crate::RemoteChild`]) could not be reached or refused
    /// its session at `init`; the message names it and says how to fix it. Nothing of
    /// the tree is left running.
    #[error("remote child failed to start: {0}")]
    RemoteStart(String),
    /// A failure of the engine itself (a thread that could not start or panicked); the
    /// message says which. Please report it.
    #[error("internal error: {0}")]
    Internal(String),
    /// An error of the comm layer (window buffers, domains, collectives).
    #[error(transparent)]
    Comm(strata_comm::CommError),
    /// An error of the graph core.
    #[error(transparent)]
    Graph(GraphError),
    /// An error of a chip (level-2 worker).
    #[error(transparent)]
    Chip(#[from] strata_chip::ChipError),
    /// A mailbox error.
    #[error(transparent)]
    Mailbox(#[from] strata_mailbox::MailboxError),
    /// A type or view error.
    #[error(transparent)]
    Types(#[from] strata_types::TypesError),
}

impl From<GraphError> for DistError {
    fn from(e: GraphError) -> Self {
        match e {
            GraphError::RunFailed(f) => DistError::TaskFailed(f),
            e => DistError::Graph(e),
        }
    }
}
