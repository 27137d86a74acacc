//! The seam between the engine's scheduler and one child: [`Endpoint`]. The scheduler
//! reaches every child — chip, level-3 worker, sub-worker — only through it, so a child
//! that is not a local process (a remote level-3 worker over TCP, strata-net) becomes an
//! ordinary next-level child by implementing it.
//!
//! The local implementation, [`LocalEndpoint`], is one strata-host [`Lane`]: a mailbox's
//! parent end plus the child's liveness watch.

use crate::control::ControlCommand;
use std::time::Instant;
use strata_host::{Children, ExecMode, HostError, Lane};
use strata_mailbox::{FailureReport, MailboxError, TaskPublication, TaskSlot};

/// What a child is (its kind travels with its endpoint; the scheduler never guesses it
/// from a label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChildKind {
    /// A chip: runs chip orchestrations, serves device-memory control requests.
    Chip,
    /// A level-3 worker under a level-4 worker: runs host orchestrations.
    Worker,
    /// A host sub-worker: runs registered closures.
    Sub,
}

/// Why an endpoint operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The child is gone (it ended, crashed or was killed); the message names it and says
    /// how it ended.
    #[error("{message}")]
    Gone {
        /// The child, and how it ended.
        message: String,
    },
    /// Whether the child is alive could not be found out.
    #[error("liveness check failed: {0}")]
    Liveness(String),
    /// The channel to the child broke (a frame with garbage, a stale identity): the child
    /// may still be running.
    #[error("mailbox protocol error: {0}")]
    Protocol(#[source] MailboxError),
    /// The task could not be published (nothing was sent).
    #[error("could not publish the task: {0}")]
    Publish(#[source] MailboxError),
    /// A control request failed: the child's answer, a deadline, or the child's death.
    #[error("{0}")]
    Control(#[source] HostError),
}

/// What a task frame's completion says: `Ok` or the child's failure (code and message).
pub type TaskOutcome = Result<(), FailureReport>;

/// One child as the scheduler sees it: up to two tasks in flight (one per task frame,
/// [`TaskSlot`]), control requests while it holds none, liveness and its kind.
///
/// Every operation returns at once except [`Endpoint::control`], which waits for the reply
/// until its deadline. A publication carries the task's encoded bytes (digest, encoded
/// configuration, encoded argument blob): nothing in it points into this process's memory
/// except through the shared-memory region ids the arguments name.
///
/// Today the engine builds only its own local endpoints; the network node (strata-net)
/// adds the remote one.
pub trait Endpoint: Send {
    /// The child's name in messages, e.g. `"chip_process dev=0"`.
    fn label(&self) -> &str;

    /// What the child is.
    fn kind(&self) -> ChildKind;

    /// Hands `task` to the child in frame `slot`, which the caller knows to be free.
    ///
    /// # Errors
    /// [`EndpointError::Publish`] if it could not be sent (the frame is then still free).
    fn publish(&mut self, slot: TaskSlot, task: &TaskPublication<'_>) -> Result<(), EndpointError>;

    /// The outcome of the task in frame `slot` once it finished (the frame is free again
    /// then); `None` while it runs.
    ///
    /// # Errors
    /// [`EndpointError::Protocol`] when the frame cannot be trusted any more.
    fn poll(&mut self, slot: TaskSlot) -> Result<Option<TaskOutcome>, EndpointError>;

    /// Sends a control request (the child holds no task) and waits for its reply word
    /// until `deadline` (`None`: as long as the child lives).
    ///
    /// # Errors
    /// [`EndpointError::Control`]: the child's failure, the deadline, or its death.
    fn control(
        &mut self,
        request: &ControlCommand,
        deadline: Option<Instant>,
    ) -> Result<u64, EndpointError>;

    /// Whether the child is still alive; cheap enough to call on every scheduler pass.
    ///
    /// # Errors
    /// [`EndpointError::Gone`] once it is gone (on this and every later call);
    /// [`EndpointError::Liveness`] if that cannot be told.
    fn check_alive(&mut self) -> Result<(), EndpointError>;

    /// Stops the child at once: it missed a deadline (a control reply, a task's). A local
    /// process is `SIGKILL`ed (which also ends a stopped one) and reaped at shutdown; a
    /// thread cannot be killed and is abandoned (detached at shutdown).
    /// Returns whether it was killed (`false`: abandoned).
    fn kill(&mut self) -> bool;

    /// What the child is doing, for the message of a missed deadline (e.g. that the
    /// process is stopped), when that can be told.
    fn state_note(&self) -> Option<String> {
        None
    }

    /// The engine drops these endpoints without an orderly shutdown (its scheduler
    /// unwound): stop their children as well as can be done without one.
    fn abandon(endpoints: Vec<Self>)
    where
        Self: Sized;
}

/// A child in this process tree: a strata-host [`Lane`] (the mailbox's parent end and the
/// child's liveness watch) and what the child is.
#[derive(Debug)]
pub(crate) struct LocalEndpoint {
    lane: Lane,
    kind: ChildKind,
    /// How the child was started (for its shutdown).
    mode: ExecMode,
}

impl LocalEndpoint {
    pub(crate) fn new(lane: Lane, kind: ChildKind, mode: ExecMode) -> Self {
        LocalEndpoint { lane, kind, mode }
    }

    /// The children behind `endpoints` (in lane order), to shut them down together under
    /// one grace period.
    pub(crate) fn into_children(endpoints: Vec<LocalEndpoint>) -> Children {
        let mode = endpoints.first().map_or(ExecMode::default(), |e| e.mode);
        Children::from_lanes(mode, endpoints.into_iter().map(|e| e.lane).collect())
    }
}

impl Endpoint for LocalEndpoint {
    fn label(&self) -> &str {
        self.lane.label()
    }

    fn kind(&self) -> ChildKind {
        self.kind
    }

    #[inline]
    fn publish(&mut self, slot: TaskSlot, task: &TaskPublication<'_>) -> Result<(), EndpointError> {
        self.lane
            .parent()
            .publish(slot, task)
            .map_err(EndpointError::Publish)
    }

    #[inline]
    fn poll(&mut self, slot: TaskSlot) -> Result<Option<TaskOutcome>, EndpointError> {
        let parent = self.lane.parent();
        let Some(done) = parent
            .poll(slot)
            .map_err(EndpointError::Protocol)?
            .completion
        else {
            return Ok(None);
        };
        parent.reset(slot).map_err(EndpointError::Protocol)?;
        Ok(Some(done.outcome))
    }

    fn control(
        &mut self,
        request: &ControlCommand,
        deadline: Option<Instant>,
    ) -> Result<u64, EndpointError> {
        let mut payload = [0u8; crate::control::COPY_PAYLOAD_BYTES];
        let req = request.to_request(&mut payload);
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        self.lane
            .control(&req, timeout)
            .map(|reply| reply.result)
            .map_err(EndpointError::Control)
    }

    fn check_alive(&mut self) -> Result<(), EndpointError> {
        match self.lane.check_alive() {
            Ok(()) => Ok(()),
            Err(e @ HostError::ChildDied { .. }) => {
                let stalled = matches!(&e, HostError::ChildDied { exit, .. }
                    if exit.code() == Some(strata_chip::EXIT_ORCHESTRATION_STALLED));
                let message = if self.kind == ChildKind::Chip && stalled {
                    format!("{e}: its chip orchestration made no progress for the run's budget (SCHEDULER_TIMEOUT, orchestrator-starvation), so the chip process ended itself")
                } else {
                    e.to_string()
                };
                Err(EndpointError::Gone { message })
            }
            Err(other) => Err(EndpointError::Liveness(other.to_string())),
        }
    }

    fn kill(&mut self) -> bool {
        self.lane.kill()
    }

    fn state_note(&self) -> Option<String> {
        let note = match self.lane.process_state()? {
            'T' | 't' => "the process is stopped (SIGSTOP or a tracer: state T)".to_owned(),
            'D' => "the process is in uninterruptible sleep (state D)".to_owned(),
            'Z' => "the process has exited (zombie)".to_owned(),
            c => format!("process state {c}"),
        };
        Some(note)
    }

    fn abandon(endpoints: Vec<Self>) {
        // Dropping `Children` shuts them down (request, grace, SIGKILL, reap).
        drop(Self::into_children(endpoints));
    }
}
