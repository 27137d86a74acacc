//! Errors and task failures.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use strata_types::WaitFor;
use thiserror::Error;

/// What kind of thing went wrong with a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The task ran and reported an error (a kernel or callback returned an error or
    /// panicked).
    Task,
    /// The place the task was sent to failed (a dead child, a broken transport, a rejected
    /// publication).
    Endpoint,
    /// The run's orchestration failed and its unstarted tasks were cancelled.
    Cancelled,
    /// A fatal error of the orchestration itself (a ring deadlock, an explicit fatal).
    Fatal,
    /// The task ran past its deadline (the message names the child and the deadline);
    /// the child that ran it was stopped.
    Timeout,
}

/// Why a task (and its run) failed. Cheap to clone: downstream tasks poisoned by a failure
/// share it.
///
/// ```
/// use strata_graph::{Failure, FailureKind};
/// let f = Failure::new(FailureKind::Task, "kernel vector_add: index out of range");
/// assert_eq!(f.to_string(), "kernel vector_add: index out of range");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(Arc<FailureInner>);

#[derive(Debug, PartialEq, Eq)]
struct FailureInner {
    kind: FailureKind,
    code: i32,
    message: String,
    origin: Option<Origin>,
    /// What the stalled run was waiting for, when the failure ended a stall.
    wait_for: Option<Arc<WaitFor>>,
}

/// What kind of worker a task ran on, as the engine that dispatched it knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerClass {
    /// A chip: its kernels or its chip orchestration, whether the chip is a child of this
    /// engine or of a worker below it.
    Chip,
    /// A host sub-worker running a callback.
    SubWorker,
    /// A whole next-level worker (a level-3 worker under a level-4 one) that failed as a
    /// whole: it died, or its orchestration failed.
    Worker,
}

/// Where a failure happened: the class of worker and its index among its engine's
/// children of that kind (next-level worker id, or sub-worker index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Origin {
    /// What kind of worker.
    pub class: WorkerClass,
    /// Its index.
    pub index: u32,
}

impl Failure {
    /// A failure with code 0.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Self::with_code(kind, 0, message)
    }

    /// A failure carrying a numeric code (e.g. a chip fatal code).
    pub fn with_code(kind: FailureKind, code: i32, message: impl Into<String>) -> Self {
        Failure(Arc::new(FailureInner {
            kind,
            code,
            message: message.into(),
            origin: None,
            wait_for: None,
        }))
    }

    /// The same failure, saying where it happened.
    pub fn with_origin(self, origin: Origin) -> Self {
        let inner = Arc::try_unwrap(self.0).unwrap_or_else(|shared| FailureInner {
            kind: shared.kind,
            code: shared.code,
            message: shared.message.clone(),
            origin: shared.origin,
            wait_for: shared.wait_for.clone(),
        });
        Failure(Arc::new(FailureInner {
            origin: Some(origin),
            ..inner
        }))
    }

    /// The same failure, carrying the wait-for state of the stall it ended (`None` keeps
    /// what it carries).
    pub fn with_wait_for(self, wait_for: Option<Arc<WaitFor>>) -> Self {
        let Some(wait_for) = wait_for else {
            return self;
        };
        let inner = Arc::try_unwrap(self.0).unwrap_or_else(|shared| FailureInner {
            kind: shared.kind,
            code: shared.code,
            message: shared.message.clone(),
            origin: shared.origin,
            wait_for: None,
        });
        Failure(Arc::new(FailureInner {
            wait_for: Some(wait_for),
            ..inner
        }))
    }

    /// What the run was waiting for when this failure ended a stall (a kernel or task
    /// past its deadline, a heap ring that could not make room), if it did.
    pub fn wait_for(&self) -> Option<&Arc<WaitFor>> {
        self.0.wait_for.as_ref()
    }

    /// Where it happened, if the engine that reported it knows.
    pub fn origin(&self) -> Option<Origin> {
        self.0.origin
    }

    /// The kind.
    pub fn kind(&self) -> FailureKind {
        self.0.kind
    }

    /// The numeric code (0 when none applies).
    pub fn code(&self) -> i32 {
        self.0.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.0.message
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::error::Error for Failure {}

/// Why a ring resource could never be (or was not) obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadlockCause {
    /// The oldest live task of the ring is held by a scope that is still open on the
    /// orchestrator's own stack: nothing can free space before the scope ends, and the
    /// scope cannot end while the orchestrator waits.
    ScopeHeld,
    /// Nothing was reclaimed for this long.
    NoProgress(Duration),
}

impl fmt::Display for DeadlockCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeadlockCause::ScopeHeld => f.write_str(
                "its oldest live task is held by a scope that is still open, so nothing can be reclaimed until that scope ends",
            ),
            DeadlockCause::NoProgress(d) => write!(f, "nothing was reclaimed for {} ms", d.as_millis()),
        }
    }
}

/// Errors of the graph core. Every variant says what was wrong and how to fix it.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum GraphError {
    /// `scope_begin` past the maximum depth.
    #[error("scope nesting exceeds the maximum depth of {max} (the run's outer scope counts); flatten the orchestration's scopes")]
    ScopeDepthExceeded {
        /// The maximum.
        max: usize,
    },
    /// `scope_end` with no open scope.
    #[error("scope_end without a matching scope_begin")]
    NoOpenScope,
    /// A graph operation that needs a building run, outside of one.
    #[error("{op} requires a run that is being built; call begin_run first")]
    NoBuildingRun {
        /// The operation.
        op: &'static str,
    },
    /// `begin_run` while another run is still being built.
    #[error("run {building} is still being built; close it before beginning another")]
    RunAlreadyBuilding {
        /// The run being built.
        building: u64,
    },
    /// A submit into a run that has already failed (fail-fast): carries the run's first error.
    #[error("{0}")]
    RunFailed(Failure),
    /// Invalid task arguments.
    #[error("invalid task arguments: {0}")]
    InvalidArgs(String),
    /// A task names a runtime-allocated buffer whose memory has already been reclaimed.
    #[error("argument {arg} names runtime-allocated buffer {buffer} whose scope has ended and whose memory was reclaimed; allocate it in a scope that encloses every use")]
    BufferReclaimed {
        /// Argument index.
        arg: usize,
        /// The buffer, printed.
        buffer: String,
    },
    /// A heap request larger than the whole ring.
    #[error("heap ring {ring} holds {ring_bytes} bytes but {request} bytes (1024-aligned) were requested; raise the ring's heap size")]
    HeapRequestTooLarge {
        /// Ring index.
        ring: usize,
        /// Ring size.
        ring_bytes: u64,
        /// Aligned request.
        request: u64,
    },
    /// A heap request on a ring configured without a heap.
    #[error("heap ring {ring} is disabled (size 0) but {request} bytes were requested; configure a heap for it")]
    HeapDisabled {
        /// Ring index.
        ring: usize,
        /// Request.
        request: u64,
    },
    /// Heap space that cannot be (or was not) reclaimed in time.
    #[error("heap ring {ring} deadlock or undersized ring: {request} bytes requested, {ring_bytes}-byte ring has {free} free and {cause}; raise the ring's heap size or end scopes sooner")]
    HeapDeadlock {
        /// Ring index.
        ring: usize,
        /// Ring size.
        ring_bytes: u64,
        /// Aligned request.
        request: u64,
        /// Contiguous bytes free when giving up.
        free: u64,
        /// Why.
        cause: DeadlockCause,
    },
    /// The current scope alone fills the ring's task window.
    #[error("scope deadlock on ring {ring}: the current scope already holds {in_scope} tasks and the task window is {window} (at most window-1 live); raise the ring's task window or split the scope")]
    ScopeDeadlock {
        /// Ring index.
        ring: usize,
        /// Task window.
        window: u64,
        /// Tasks in the current scope.
        in_scope: usize,
    },
    /// The ring's task window is full.
    #[error("flow-control deadlock on ring {ring}: task window of {window} is full and {cause}; raise the ring's task window")]
    FlowControlDeadlock {
        /// Ring index.
        ring: usize,
        /// Task window.
        window: u64,
        /// Why.
        cause: DeadlockCause,
    },
    /// The ring's dependency pool cannot hold a task's edges.
    #[error("dependency pool overflow on ring {ring}: {needed} edges needed, pool of {pool} has {free} free and {cause}; raise the ring's dependency pool")]
    DepPoolOverflow {
        /// Ring index.
        ring: usize,
        /// Pool size.
        pool: u64,
        /// Free entries when giving up.
        free: u64,
        /// Edges the task needs.
        needed: u64,
        /// Why.
        cause: DeadlockCause,
    },
    /// The graph was shut down.
    #[error("the graph is shut down")]
    Shutdown,
    /// A wait that timed out.
    #[error("timed out after {} ms waiting for {what}", .after.as_millis())]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        after: Duration,
    },
    /// An operation that needs a quiescent graph (no live task).
    #[error("{op} requires a quiescent graph but {live} tasks are live")]
    NotQuiescent {
        /// The operation.
        op: &'static str,
        /// Live tasks.
        live: u64,
    },
    /// An invalid configuration.
    #[error("invalid graph configuration: {0}")]
    InvalidConfig(String),
    /// An unknown or already released run.
    #[error("run {0} is unknown or was already released")]
    UnknownRun(u64),
    /// An invalid tensor view or argument list.
    #[error(transparent)]
    Types(#[from] strata_types::TypesError),
}

impl GraphError {
    /// The reference runtime's orchestrator fatal code for this error, where one applies:
    /// 1 scope deadlock, 2 heap-ring deadlock, 3 flow-control deadlock, 4 dependency-pool
    /// overflow, 5 invalid arguments.
    pub fn fatal_code(&self) -> Option<i32> {
        Some(match self {
            GraphError::ScopeDeadlock { .. } => 1,
            GraphError::HeapDeadlock { .. }
            | GraphError::HeapRequestTooLarge { .. }
            | GraphError::HeapDisabled { .. } => 2,
            GraphError::FlowControlDeadlock { .. } => 3,
            GraphError::DepPoolOverflow { .. } => 4,
            GraphError::InvalidArgs(_)
            | GraphError::Types(_)
            | GraphError::BufferReclaimed { .. }
            | GraphError::ScopeDepthExceeded { .. }
            | GraphError::NoOpenScope => 5,
            _ => return None,
        })
    }
}
