//! The seam between the engine's scheduler and one child: [`Endpoint`]. The scheduler
//! reaches every child — chip, level-3 worker, sub-worker — only through it, so a child
//! that is not a local process (a remote level-3 worker over TCP, strata-net) becomes an
//! ordinary next-level child by implementing it.
//!
//! The local implementation, [`LocalEndpoint`], is one strata-host [`Lane`]: a mailbox's
//! parent end plus the child's liveness watch. A child this crate does not know how to
//! reach (a level-3 worker on another host) is added as a [`RemoteChild`]: it opens its
//! own endpoint at the parent's `init`, and the scheduler holds it beside the local ones in
//! an `AnyEndpoint`.

use crate::config::DistConfig;
use crate::control::ControlCommand;
use crate::trace::ChildTrace;
use std::sync::Arc;
use std::time::Instant;
use strata_host::{Children, Doorbell, ExecMode, HostError, Lane, SharedMemory};
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
    /// A failure a remote endpoint describes itself (the message says what happened
    /// and, where there is one, how to fix it).
    #[error("{0}")]
    Remote(String),
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
/// The engine builds its own local endpoints; a [`RemoteChild`] (strata-net's remote
/// node) brings its own.
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

    /// The trace the child sent with the completion [`Endpoint::poll`] just returned for
    /// frame `slot` (a traced task's), if it sent one — taken once. The local endpoint
    /// returns the completion's reply bytes; a remote one also says how the node's clock
    /// maps onto this process's. `None` by default.
    fn take_trace(&mut self, slot: TaskSlot) -> Option<ChildTrace> {
        let _ = slot;
        None
    }

    /// The child's process id, when it is a process this worker knows (for its track in
    /// a trace). `None` by default.
    fn pid(&self) -> Option<u32> {
        None
    }

    /// Whether the child usually answers a task within a scheduler spin budget (tens of
    /// µs): then a waiting scheduler spins before it parks. A remote child answers after
    /// a network round trip at best, and spinning for it only takes a CPU from the
    /// threads that bring its answer, so it says `false`. `true` by default.
    fn answers_soon(&self) -> bool {
        true
    }

    /// Waits up to `timeout` for the child's news on the calling thread, reading the
    /// child's link itself — so the answer's arrival wakes the waiting caller directly,
    /// not a reader thread that would then wake it — or returns at once when `kick` (an
    /// eventfd the engine signals when anything else needs the loop) is readable, and
    /// drains it then (only then: a drain that finds nothing is a wasted system call per
    /// answer). Returns whether it waited (the caller steps the loop again); `false`
    /// when it cannot (another thread is reading the link, or the link has no descriptor)
    /// — the caller then parks on the doorbell as usual. The engine calls it only while
    /// this child is the one that holds tasks. `false` by default.
    fn wait_answer(&mut self, kick: &strata_sync::EventFd, timeout: std::time::Duration) -> bool {
        let _ = (kick, timeout);
        false
    }

    /// The engine waits elsewhere from now on (on the doorbell): whatever the child's
    /// link brings must be read by the endpoint's own means again, at once — a reader
    /// that stood aside while callers waited in the link takes over. A no-op by default.
    fn release_read(&mut self) {}

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

    /// The worker is closing: ask the child to shut down without waiting for it (every
    /// child is asked first, then each is waited for, so their shutdowns overlap). A
    /// local child is shut down with its siblings by strata-host instead, so this does
    /// nothing by default.
    fn begin_shutdown(&mut self) {}

    /// Waits until the child confirmed its shutdown (its whole subtree reaped), or
    /// `deadline`; then stops it the hard way. `Err` says what was abnormal (it had to be
    /// killed, or reported a child that ended badly). Does nothing by default.
    ///
    /// # Errors
    /// What was abnormal about the child's end, naming it.
    fn finish_shutdown(&mut self, deadline: Instant) -> Result<(), String> {
        let _ = deadline;
        Ok(())
    }
}

/// What a [`RemoteChild`] is given to open its endpoint at the parent's `init`.
#[derive(Debug, Clone)]
pub struct RemoteContext {
    /// The child's worker id in the parent (what `submit_next_level` names).
    pub worker_id: usize,
    /// The parent's doorbell: ring it whenever a task completes (or the child is found
    /// gone), so the scheduler, parked on it, looks at once.
    pub doorbell: Doorbell,
    /// The parent's shared memory: the regions the tasks' tensor arguments name.
    pub shared: Arc<SharedMemory>,
    /// The parent's registry digest ([`crate::DistWorker::registry_digest`]): the remote
    /// side must run a program with the same registrations.
    pub registry_digest: [u8; 32],
    /// When the whole tree must be up (the parent's `startup_timeout` from `init`).
    pub deadline: Instant,
}

/// What the process that serves a [`RemoteChild`] is given (see
/// [`RemoteChild::serves_here`]).
#[derive(Debug, Clone)]
pub struct NodeContext {
    /// The child's worker id in the parent.
    pub worker_id: usize,
    /// The registry digest of the program (the same in every process that runs it).
    pub registry_digest: [u8; 32],
}

/// A next-level child of a level-4 worker that this crate does not reach itself: a
/// level-3 worker in another process tree (on another host), reached through an
/// [`Endpoint`] its implementation opens (strata-net's remote node). Added with
/// [`crate::DistWorker::add_remote_child`] before `init`; its worker id comes from the
/// same counter as [`crate::DistWorker::add_worker`]'s.
///
/// Closures cannot cross hosts, so a remote child runs *the same program*: every process
/// of a job executes the same `main` and makes the same registrations (the registry
/// digest proves it). What differs is what the level-4 worker's `init` does there: in the
/// root process it opens each remote child's endpoint ([`RemoteChild::connect`]); in a
/// process started to serve remote child `k` ([`RemoteChild::serves_here`]), `init` builds
/// the level-3 worker ([`RemoteChild::node_config`] with every registration of the
/// level-4 worker), hands it to [`RemoteChild::serve`], and exits the process with the
/// status `serve` returns instead of returning.
pub trait RemoteChild: Send {
    /// The child's name in messages, e.g. `"remote_worker level=3 id=1 (hostB:7070)"`.
    fn label(&self) -> String;

    /// The configuration of the level-3 worker that serves this child (a level-3
    /// configuration).
    fn node_config(&self) -> DistConfig;

    /// Whether this process was started to serve this child (worker id `worker_id`).
    fn serves_here(&self, worker_id: usize) -> bool;

    /// Serves the parent as this child with `worker` (new, not initialised, holding every
    /// registration of the level-4 worker) until the parent shuts it down or goes away;
    /// returns the process's exit status. Called at most once, from the level-4 worker's
    /// `init` in a process for which [`RemoteChild::serves_here`] is true; no thread of
    /// the engine runs yet, so `worker.init()` may fork.
    fn serve(self: Box<Self>, worker: crate::DistWorker, node: NodeContext) -> i32;

    /// Opens the endpoint to this child (the root process's side), after the local
    /// children were started, by `ctx.deadline`. The remote children of one worker
    /// connect concurrently (one thread each).
    ///
    /// # Errors
    /// Why the child could not be reached or refused the session, naming it and saying
    /// how to fix it.
    fn connect(self: Box<Self>, ctx: RemoteContext) -> Result<Box<dyn Endpoint>, String>;
}

/// The endpoint of one child of the scheduler: a local lane (static calls, nothing
/// between a publication and the mailbox but this match) or a remote child's boxed
/// endpoint.
// The local endpoint is kept inline (not boxed like the remote one): its publish and poll
// are the hot path, and a box would put a pointer chase in front of every mailbox access.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyEndpoint {
    /// A child in this process tree.
    Local(LocalEndpoint),
    /// A child reached through an endpoint another crate implements.
    Remote(Box<dyn Endpoint>),
}

impl std::fmt::Debug for AnyEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnyEndpoint::Local(l) => l.fmt(f),
            AnyEndpoint::Remote(r) => write!(f, "Remote({})", r.label()),
        }
    }
}

impl Endpoint for AnyEndpoint {
    fn label(&self) -> &str {
        match self {
            AnyEndpoint::Local(l) => l.label(),
            AnyEndpoint::Remote(r) => r.label(),
        }
    }

    #[inline]
    fn kind(&self) -> ChildKind {
        match self {
            AnyEndpoint::Local(l) => l.kind(),
            AnyEndpoint::Remote(r) => r.kind(),
        }
    }

    #[inline]
    fn publish(&mut self, slot: TaskSlot, task: &TaskPublication<'_>) -> Result<(), EndpointError> {
        match self {
            AnyEndpoint::Local(l) => l.publish(slot, task),
            AnyEndpoint::Remote(r) => r.publish(slot, task),
        }
    }

    #[inline]
    fn poll(&mut self, slot: TaskSlot) -> Result<Option<TaskOutcome>, EndpointError> {
        match self {
            AnyEndpoint::Local(l) => l.poll(slot),
            AnyEndpoint::Remote(r) => r.poll(slot),
        }
    }

    fn control(
        &mut self,
        request: &ControlCommand,
        deadline: Option<Instant>,
    ) -> Result<u64, EndpointError> {
        match self {
            AnyEndpoint::Local(l) => l.control(request, deadline),
            AnyEndpoint::Remote(r) => r.control(request, deadline),
        }
    }

    fn check_alive(&mut self) -> Result<(), EndpointError> {
        match self {
            AnyEndpoint::Local(l) => l.check_alive(),
            AnyEndpoint::Remote(r) => r.check_alive(),
        }
    }

    fn kill(&mut self) -> bool {
        match self {
            AnyEndpoint::Local(l) => l.kill(),
            AnyEndpoint::Remote(r) => r.kill(),
        }
    }

    fn state_note(&self) -> Option<String> {
        match self {
            AnyEndpoint::Local(l) => l.state_note(),
            AnyEndpoint::Remote(r) => r.state_note(),
        }
    }

    #[inline]
    fn answers_soon(&self) -> bool {
        match self {
            AnyEndpoint::Local(_) => true,
            AnyEndpoint::Remote(r) => r.answers_soon(),
        }
    }

    fn wait_answer(&mut self, kick: &strata_sync::EventFd, timeout: std::time::Duration) -> bool {
        match self {
            AnyEndpoint::Local(_) => false,
            AnyEndpoint::Remote(r) => r.wait_answer(kick, timeout),
        }
    }

    #[inline]
    fn release_read(&mut self) {
        if let AnyEndpoint::Remote(r) = self {
            r.release_read();
        }
    }

    fn take_trace(&mut self, slot: TaskSlot) -> Option<ChildTrace> {
        match self {
            AnyEndpoint::Local(l) => l.take_trace(slot),
            AnyEndpoint::Remote(r) => r.take_trace(slot),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            AnyEndpoint::Local(l) => l.pid(),
            AnyEndpoint::Remote(r) => r.pid(),
        }
    }

    fn abandon(endpoints: Vec<Self>) {
        let (local, remote) = AnyEndpoint::split(endpoints);
        for mut r in remote {
            // No orderly shutdown: stop the remote child at once (its node reaps its own
            // subtree when the session ends).
            r.kill();
        }
        LocalEndpoint::abandon(local);
    }

    fn begin_shutdown(&mut self) {
        if let AnyEndpoint::Remote(r) = self {
            r.begin_shutdown();
        }
    }

    fn finish_shutdown(&mut self, deadline: Instant) -> Result<(), String> {
        match self {
            AnyEndpoint::Local(_) => Ok(()),
            AnyEndpoint::Remote(r) => r.finish_shutdown(deadline),
        }
    }
}

impl AnyEndpoint {
    /// The local endpoints (in lane order) and the remote ones.
    pub(crate) fn split(
        endpoints: Vec<AnyEndpoint>,
    ) -> (Vec<LocalEndpoint>, Vec<Box<dyn Endpoint>>) {
        let mut local = Vec::new();
        let mut remote = Vec::new();
        for e in endpoints {
            match e {
                AnyEndpoint::Local(l) => local.push(l),
                AnyEndpoint::Remote(r) => remote.push(r),
            }
        }
        (local, remote)
    }
}

/// A child in this process tree: a strata-host [`Lane`] (the mailbox's parent end and the
/// child's liveness watch) and what the child is.
#[derive(Debug)]
pub(crate) struct LocalEndpoint {
    lane: Lane,
    kind: ChildKind,
    /// How the child was started (for its shutdown).
    mode: ExecMode,
    /// Per task frame: the reply of the completion last polled from it (a traced task's
    /// trace), until taken.
    replies: [Vec<u8>; 2],
}

impl LocalEndpoint {
    pub(crate) fn new(lane: Lane, kind: ChildKind, mode: ExecMode) -> Self {
        LocalEndpoint {
            lane,
            kind,
            mode,
            replies: [Vec::new(), Vec::new()],
        }
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
        // An untraced task's reply is empty: no allocation (and nothing stale is kept).
        self.replies[slot.index()] = done.reply;
        Ok(Some(done.outcome))
    }

    fn take_trace(&mut self, slot: TaskSlot) -> Option<ChildTrace> {
        let bytes = std::mem::take(&mut self.replies[slot.index()]);
        (!bytes.is_empty()).then(|| ChildTrace {
            bytes,
            clock: strata_types::trace::ClockSync::SAME_HOST,
            host: String::new(),
        })
    }

    fn pid(&self) -> Option<u32> {
        self.lane.pid().and_then(|p| u32::try_from(p).ok())
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
