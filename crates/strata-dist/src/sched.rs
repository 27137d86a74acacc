//! The scheduler thread: routes ready tasks into per-run FIFOs (one per next-level worker
//! id, one for groups, one shared by the sub-workers), dispatches them to idle children
//! through their mailboxes, collects completions, and runs control commands.
//!
//! Placement is directed, as in the reference engine: a next-level task runs on exactly
//! the worker id it names; a group launches all its members together; sub tasks go to any
//! idle sub-worker. Only the dispatchable run (the oldest in flight) is dispatched; ready
//! tasks of the next run wait in their own partition.
//!
//! Per-worker submit order: each next-level worker has one FIFO of its ready tasks, singles
//! and groups alike (a group is queued on every worker it names), kept in submission order
//! (task ids grow with every submit). Only a worker's head may start there, so a later task
//! never overtakes an earlier one on the same worker, in either direction: a group waits
//! for the singles submitted before it on each of its workers, and reserves each of them
//! against later singles until it launches (when it heads every one of their FIFOs and all
//! of them are idle). Programs whose tasks synchronise through signals rather than data
//! depend on it. Every FIFO is ordered by the same ids, so the oldest ready group heads all
//! of its FIFOs once the singles before it have started: no two groups wait for each
//! other.
//!
//! Waiting is spin-then-park on the worker's doorbell, which children ring after every
//! completion and the orchestrator rings when it hands over work.

mod stall;

use crate::control::ControlCommand;
use crate::endpoint::{AnyEndpoint, ChildKind, Endpoint, EndpointError, LocalEndpoint};
use crate::task::{DistTask, Route, Target};
use crate::trace::{TaskStart, TraceBook};
use crate::worker::CHIP_FAILED_BELOW;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use strata_graph::{
    Claimed, Failure, FailureKind, Origin, ReadyTask, RunId, Scheduler, TaskRef, WorkerClass,
};
use strata_host::{Children, Doorbell, HostError, SharedMemory};
use strata_mailbox::{EncodedConfig, FrameIdentity, MailboxError, TaskPublication, TaskSlot};
use strata_sync::{Broken, Driven, DriverSeat, SeatWaker, Turn};

/// Spin before parking on the doorbell.
const SPIN: Duration = Duration::from_micros(50);
/// Park slice while children run tasks (bounds how late a dead child is noticed).
const BUSY_SLICE: Duration = Duration::from_millis(5);
/// Park slice while idle.
const IDLE_SLICE: Duration = Duration::from_millis(200);

/// A control request for one child, run by the scheduler when the child is idle; the
/// reply is the child's result word or why there is none.
pub(crate) struct ControlJob {
    pub(crate) lane: usize,
    pub(crate) command: ControlCommand,
    pub(crate) reply: mpsc::Sender<Result<u64, ControlFailure>>,
}

/// Why a control request has no result word.
#[derive(Debug)]
pub(crate) enum ControlFailure {
    /// The child's failure, its death, or the worker closing (the message says which).
    Failed(String),
    /// The child did not answer within the control deadline: it was declared unresponsive
    /// (and killed).
    Unresponsive { message: String, after: Duration },
}

impl From<String> for ControlFailure {
    fn from(message: String) -> Self {
        ControlFailure::Failed(message)
    }
}

impl From<&str> for ControlFailure {
    fn from(message: &str) -> Self {
        ControlFailure::Failed(message.to_owned())
    }
}

#[derive(Default)]
struct Inbox {
    ready: Vec<ReadyTask>,
    controls: Vec<ControlJob>,
    /// Stop once every child is idle, or at this deadline (failing what still runs).
    stop: Option<std::time::Instant>,
    /// A test-only fault (see [`Link::inject_pass_panic`]).
    fault: Option<PassFault>,
}

/// A test-only fault: a later scheduler pass panics with `message` after its intake
/// (mid-pass, with the intake's state changes made), on a caller's pass or on the
/// scheduler thread's.
#[derive(Debug, Clone)]
pub(crate) struct PassFault {
    pub(crate) message: String,
    pub(crate) on_caller: bool,
}

/// What the orchestrator side and the scheduler thread share.
pub(crate) struct Link {
    pub(crate) doorbell: Doorbell,
    inbox: Mutex<Inbox>,
    pending: AtomicBool,
    unusable: Mutex<Option<String>>,
    unusable_flag: AtomicBool,
    /// The scheduler ran out of work: hand ready tasks over at once rather than batching.
    hungry: AtomicBool,
    /// Wakes the scheduler thread when a caller left it dormant (set once the driver
    /// exists).
    waker: OnceLock<Arc<SeatWaker>>,
    /// Per next-level worker, the submission sequence (task id) of the oldest ready task
    /// the orchestrator still holds in its hand-over batch for that worker (`u64::MAX`:
    /// none). A later task on the worker that a completion made ready meanwhile must not
    /// start before it (per-worker submit order): the dispatch pass leaves it queued, and
    /// the orchestrator hands its batch over as soon as it submits such a task
    /// ([`Link::hold`], [`Link::release_holds`]).
    held: Box<[AtomicU64]>,
    /// A test-only fault: the scheduler thread panics outside any pass with this message
    /// (see [`Link::inject_thread_panic`]).
    thread_fault: Mutex<Option<String>>,
    thread_fault_flag: AtomicBool,
    /// The traces of the traced runs in flight.
    pub(crate) trace: TraceBook,
    /// Wakes a caller that waits in a remote child's link ([`Endpoint::wait_answer`])
    /// when work is handed to the loop; `None` without remote children, or if no eventfd
    /// could be made (callers then always park on the doorbell).
    kick: Option<Kick>,
}

/// An eventfd the loop's own rings also write while a caller waits in a remote child's
/// link instead of on the doorbell's futex. Rings from this process (work handed over, a
/// run's phase change, a stop) are the ones such a caller could otherwise miss: the other
/// ringers are the child it waits for, and children that hold no task.
///
/// The hand-shake is strata-sync's [`strata_sync::KickGate`] (loom-checked): a ringer
/// publishes (`pending`, the doorbell's bump) and then asks the gate; a caller enters the
/// gate and then re-checks `pending` and the doorbell. One of the two sees the other: the
/// ringer kicks, or the caller does not wait.
struct Kick {
    fd: strata_sync::EventFd,
    gate: strata_sync::KickGate,
}

impl Kick {
    fn kick(&self) {
        if self.gate.should_kick() {
            self.fd.signal();
        }
    }
}

impl Link {
    /// `links_waited`: some children are reached over a link a caller may wait in
    /// ([`Endpoint::wait_answer`]: remote ones), so the loop's rings must kick it.
    pub(crate) fn new(
        doorbell: Doorbell,
        next_level_workers: usize,
        level: u8,
        links_waited: bool,
    ) -> Self {
        Link {
            trace: TraceBook::new(level),
            held: (0..next_level_workers)
                .map(|_| AtomicU64::new(u64::MAX))
                .collect(),
            doorbell,
            inbox: Mutex::new(Inbox::default()),
            pending: AtomicBool::new(false),
            unusable: Mutex::new(None),
            unusable_flag: AtomicBool::new(false),
            hungry: AtomicBool::new(true),
            waker: OnceLock::new(),
            thread_fault: Mutex::new(None),
            kick: links_waited
                .then(strata_sync::EventFd::new)
                .and_then(Result::ok)
                .map(|fd| Kick {
                    fd,
                    gate: strata_sync::KickGate::new(),
                }),
            thread_fault_flag: AtomicBool::new(false),
        }
    }

    /// The orchestrator holds ready task `seq` for `worker` in its batch (the first one
    /// it holds for that worker since its last hand-over: the oldest).
    pub(crate) fn hold(&self, worker: usize, seq: u64) {
        if let Some(h) = self.held.get(worker) {
            h.store(seq, Ordering::Release);
        }
    }

    /// The orchestrator handed its batch over ([`Link::push_ready`] first: a pass that
    /// sees a hold released then sees the tasks in the inbox).
    pub(crate) fn release_holds(&self, workers: &[usize]) {
        for &w in workers {
            if let Some(h) = self.held.get(w) {
                h.store(u64::MAX, Ordering::Release);
            }
        }
    }

    /// Whether the scheduler is waiting for work.
    pub(crate) fn is_hungry(&self) -> bool {
        self.hungry.load(Ordering::Relaxed)
    }

    fn inbox(&self) -> std::sync::MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands ready tasks to the scheduler; with `wake`, also a scheduler thread a caller
    /// left dormant (without, a caller is expected to drive the loop, or to call
    /// [`Link::wake_dormant`] before it waits for anything the loop does).
    pub(crate) fn push_ready(&self, batch: &mut Vec<ReadyTask>, wake: bool) {
        if batch.is_empty() {
            return;
        }
        self.inbox().ready.append(batch);
        self.pending.store(true, Ordering::SeqCst);
        self.ring();
        if wake {
            self.wake_dormant();
        }
    }

    /// Wakes the scheduler thread if the last caller that drove the loop left it dormant
    /// (quiet, `Driver::drive_until`) and nobody drives it now. Call after handing work
    /// over.
    #[inline]
    pub(crate) fn wake_dormant(&self) {
        if let Some(w) = self.waker.get() {
            w.wake_dormant();
        }
    }

    /// Queues a control command.
    pub(crate) fn push_control(&self, job: ControlJob) {
        self.inbox().controls.push(job);
        self.pending.store(true, Ordering::SeqCst);
        self.ring();
        self.wake_dormant();
    }

    /// Asks the scheduler thread to stop: it dispatches nothing more, fails what is queued,
    /// and returns once every child is idle or `deadline` passed (failing the tasks still
    /// running, whose children the caller then shuts down).
    pub(crate) fn stop(&self, deadline: std::time::Instant) {
        self.inbox().stop = Some(deadline);
        self.pending.store(true, Ordering::SeqCst);
        self.ring();
        self.wake_dormant();
    }

    /// Test hook: a later scheduler pass panics (see [`PassFault`]).
    pub(crate) fn inject_pass_panic(&self, fault: PassFault) {
        self.inbox().fault = Some(fault);
        self.pending.store(true, Ordering::SeqCst);
        self.ring();
        self.wake_dormant();
    }

    /// Test hook: the scheduler thread panics with `message` at its next iteration,
    /// outside any pass (so the loop is not broken: the thread is gone with the loop
    /// still in its seat).
    pub(crate) fn inject_thread_panic(&self, message: String) {
        *self.thread_fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(message);
        self.thread_fault_flag.store(true, Ordering::SeqCst);
        self.ring();
        self.wake_dormant();
    }

    #[cold]
    fn fire_thread_fault(&self) {
        let fault = self
            .thread_fault
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(message) = fault {
            panic!("{message}");
        }
    }

    /// Rings the doorbell, and kicks a caller that waits in a remote child's link.
    #[inline]
    fn ring(&self) {
        self.doorbell.ring();
        if let Some(k) = &self.kick {
            k.kick();
        }
    }

    /// Wakes the scheduler (a run changed phase). A dormant scheduler thread stays
    /// parked: the loop was left with nothing queued, so a phase change gives it nothing
    /// to dispatch.
    pub(crate) fn nudge(&self) {
        self.ring();
    }

    /// Why the worker is unusable, if it is.
    pub(crate) fn unusable(&self) -> Option<String> {
        if !self.unusable_flag.load(Ordering::Acquire) {
            return None;
        }
        self.unusable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_unusable(&self, why: String) {
        let mut u = self.unusable.lock().unwrap_or_else(|e| e.into_inner());
        if u.is_none() {
            *u = Some(why);
        }
        self.unusable_flag.store(true, Ordering::Release);
    }
}

#[derive(Debug)]
struct InFlight {
    task: TaskRef,
    member: usize,
    group: bool,
    /// The shared-tensor regions this member holds in use until it ends.
    uses: Vec<u64>,
    /// When the task is overdue (`None`: its budget is past what an `Instant` holds).
    deadline: Option<Instant>,
    /// Its budget from dispatch, for the message when it is overdue.
    budget: Duration,
    /// When its run is traced: what the trace needs of its dispatch.
    trace: Option<Box<TaskStart>>,
}

/// A child's two task frames, as the scheduler uses them: the second frame holds the
/// child's next task while it runs the first, so it never waits for the scheduler between
/// tasks. Control commands and group members need the child idle (both frames free).
#[derive(Debug, Default)]
struct LaneState {
    frames: [Option<InFlight>; 2],
    seq: u64,
    dead: Option<String>,
}

impl LaneState {
    fn in_flight(&self) -> usize {
        self.frames.iter().filter(|f| f.is_some()).count()
    }
    fn is_busy(&self) -> bool {
        self.frames.iter().any(Option::is_some)
    }
    fn free_frame(&self) -> Option<TaskSlot> {
        TaskSlot::ALL
            .into_iter()
            .find(|s| self.frames[s.index()].is_none())
    }
}

/// A ready next-level task in a worker's FIFO.
#[derive(Debug, Clone, Copy)]
struct Queued {
    task: TaskRef,
    /// A group: it is queued on each of its workers, and launches from all at once.
    group: bool,
}

impl Queued {
    /// Submission order (task ids grow with every submit, across runs).
    fn seq(&self) -> u64 {
        self.task.id().0
    }
}

#[derive(Debug, Default)]
struct RunQueues {
    /// Per next-level worker, its ready tasks (singles and groups) in submission order.
    workers: Vec<VecDeque<Queued>>,
    subs: VecDeque<TaskRef>,
}

impl RunQueues {
    fn is_empty(&self) -> bool {
        self.subs.is_empty() && self.workers.iter().all(|q| q.is_empty())
    }
}

/// Queues `q` in submission order. Tasks mostly become ready in that order, so the scan
/// from the back usually stops at once.
fn insert_in_order(fifo: &mut VecDeque<Queued>, q: Queued) {
    let mut at = fifo.len();
    while at > 0 && fifo[at - 1].seq() > q.seq() {
        at -= 1;
    }
    fifo.insert(at, q);
}

/// What one scheduler pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The loop has stopped (closing: every child idle, or the close deadline passed).
    Stopped,
    /// Something moved (intake, a completion, a control request, a dispatch): step again.
    Progressed,
    /// Nothing moved; whether a child holds a task (how long the loop may park).
    Idle {
        /// A child holds a task.
        busy: bool,
        /// A child that holds a task answers within a spin budget
        /// ([`Endpoint::answers_soon`]): worth spinning for before parking.
        spin: bool,
    },
}

/// The scheduler's state: the graph's scheduler end, one [`Endpoint`] per child, and the
/// FIFOs. It talks to the children only through their endpoints: generic over them, so the
/// local lanes are reached by static calls (nothing between a publication and the
/// mailbox), and a future remote endpoint slots in as another `E` (or an enum of both).
pub(crate) struct SchedLoop<E: Endpoint = AnyEndpoint> {
    sched: Scheduler<DistTask>,
    /// One per child, in lane order: lanes `0..n_next` are the next-level children (lane
    /// index = worker id); the rest are sub-workers.
    endpoints: Vec<E>,
    link: Arc<Link>,
    n_next: usize,
    lanes: Vec<LaneState>,
    queues: BTreeMap<RunId, RunQueues>,
    controls: VecDeque<ControlJob>,
    ready: Vec<ReadyTask>,
    labels: Vec<String>,
    stopping: Option<std::time::Instant>,
    last_liveness: std::time::Instant,
    /// The clock read at the start of the current pass (the only one a pass makes on its
    /// hot path): task deadlines are counted from it.
    now: Instant,
    /// How long a control reply may take ([`crate::DistConfig::control_timeout`]).
    control_timeout: Duration,
    /// A task's default budget ([`crate::DistConfig::task_timeout`]).
    task_timeout: Duration,
    /// A test-only fault taken from the inbox, not yet fired.
    fault: Option<PassFault>,
    /// The shared memory the tasks' tensors live in (their in-use marks).
    shared: Arc<SharedMemory>,
    /// In-use marks of tasks failed at the close deadline while their children still ran
    /// them: released only once those children are known to be gone.
    abandoned_uses: Vec<u64>,
    /// This pass's snapshot of [`Link::held`] (reused).
    held: Vec<u64>,
    /// Traced runs only: when each ready task was routed (by task id), until published.
    ready_at: HashMap<u64, u64>,
}

/// What the scheduler thread hands back when it stops: the children, still running, for
/// the worker to shut down.
pub(crate) struct SchedExit {
    pub(crate) children: Children,
    /// The remote children (strata-net's endpoints), still running: asked to shut down
    /// and waited for beside the local ones.
    pub(crate) remotes: Vec<Box<dyn Endpoint>>,
    /// In-use marks of shared tensors whose tasks were abandoned at the close deadline
    /// (see [`SchedLoop::abandoned_uses`]): the worker releases them once the children are
    /// reaped, or keeps them for good if a thread child was detached still running.
    pub(crate) abandoned_uses: Vec<u64>,
    /// The shared memory those marks are in.
    pub(crate) shared: Arc<SharedMemory>,
}

impl SchedLoop<AnyEndpoint> {
    /// Ends the loop: queued control requests are refused, and the children, still
    /// running, are handed back for their shutdown together (the local ones as strata-host
    /// `Children`, the remote ones as their endpoints).
    fn into_exit(mut self) -> SchedExit {
        let (local, remotes) = AnyEndpoint::split(self.take_endpoints());
        SchedExit {
            children: LocalEndpoint::into_children(local),
            remotes,
            abandoned_uses: std::mem::take(&mut self.abandoned_uses),
            shared: self.shared.clone(),
        }
    }
}

impl<E: Endpoint> Drop for SchedLoop<E> {
    /// Reached with endpoints only if the loop unwound (`into_exit` takes them): nothing
    /// else will shut the children down.
    fn drop(&mut self) {
        E::abandon(std::mem::take(&mut self.endpoints));
    }
}

impl<E: Endpoint> SchedLoop<E> {
    pub(crate) fn new(
        sched: Scheduler<DistTask>,
        endpoints: Vec<E>,
        link: Arc<Link>,
        n_next: usize,
    ) -> Self {
        let n = endpoints.len();
        let labels = endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| {
                if i < n_next {
                    format!("worker {i} ({})", e.label())
                } else {
                    e.label().to_owned()
                }
            })
            .collect();
        SchedLoop {
            sched,
            endpoints,
            link,
            n_next,
            lanes: (0..n).map(|_| LaneState::default()).collect(),
            queues: BTreeMap::new(),
            controls: VecDeque::new(),
            ready: Vec::new(),
            labels,
            stopping: None,
            last_liveness: std::time::Instant::now(),
            now: Instant::now(),
            control_timeout: crate::config::DEFAULT_CONTROL_TIMEOUT,
            task_timeout: crate::config::DEFAULT_TASK_TIMEOUT,
            fault: None,
            shared: SharedMemory::process().clone(),
            abandoned_uses: Vec::new(),
            held: vec![u64::MAX; n_next],
            ready_at: HashMap::new(),
        }
    }

    /// Sets the shared memory the tasks' tensors live in (the process's table by
    /// default).
    pub(crate) fn with_shared(mut self, shared: Arc<SharedMemory>) -> Self {
        self.shared = shared;
        self
    }

    /// Sets the control deadline and the tasks' default budget (see
    /// [`crate::DistConfig::control_timeout`] and [`crate::DistConfig::task_timeout`]).
    pub(crate) fn with_deadlines(
        mut self,
        control_timeout: Duration,
        task_timeout: Duration,
    ) -> Self {
        self.control_timeout = control_timeout;
        self.task_timeout = task_timeout;
        self
    }

    /// One pass: intake, completions, control requests, dispatch, liveness.
    fn step(&mut self) -> Step {
        self.now = Instant::now();
        let mut progress = self.intake();
        if self.fault.is_some() {
            self.fire_fault();
        }
        progress |= self.poll_lanes();
        progress |= self.run_controls();
        if self.stopping.is_none() {
            progress |= self.dispatch();
        }
        if self.now.saturating_duration_since(self.last_liveness) >= BUSY_SLICE {
            self.check_deadlines();
            self.check_liveness();
            self.last_liveness = self.now;
        }
        let busy = self.lanes.iter().any(LaneState::is_busy);
        if let Some(deadline) = self.stopping {
            self.fail_queued("the worker is closing");
            if !busy || std::time::Instant::now() >= deadline {
                for lane in 0..self.lanes.len() {
                    // The child may still be running these tasks (a thread child cannot
                    // be stopped): their tensors stay in use until it is known gone.
                    self.abandon_uses(lane);
                    let f = self.endpoint_failure(
                        lane,
                        "the worker closed before this task finished (close_grace passed)",
                    );
                    self.finish_all(lane, &f);
                }
                self.sched.flush();
                return Step::Stopped;
            }
        }
        if progress {
            return Step::Progressed;
        }
        let queued = self.queues.values().any(|q| !q.is_empty());
        if !queued && !self.link.hungry.load(Ordering::Relaxed) {
            self.link.hungry.store(true, Ordering::Relaxed);
        }
        if !busy {
            self.sched.flush();
        }
        let spin = self
            .lanes
            .iter()
            .zip(&self.endpoints)
            .any(|(l, e)| l.is_busy() && e.answers_soon());
        Step::Idle { busy, spin }
    }

    /// Waits up to `timeout` in the link of the one child that holds tasks (a remote
    /// one: [`Endpoint::wait_answer`]) rather than on the doorbell, unless the doorbell
    /// moved past `seen` or work was handed over. Whether it waited.
    fn wait_answer(&mut self, seen: u32, timeout: Duration) -> bool {
        let Some(kick) = self.link.kick.as_ref() else {
            return false;
        };
        let mut busy = self.lanes.iter().enumerate().filter(|(_, l)| l.is_busy());
        let (Some((lane, _)), None) = (busy.next(), busy.next()) else {
            return false;
        };
        let inside = kick.gate.enter();
        let quiet = !self.link.pending.load(Ordering::SeqCst) && self.link.doorbell.seq() == seen;
        let waited = quiet && self.endpoints[lane].wait_answer(&kick.fd, timeout);
        drop(inside);
        waited
    }

    /// The link of every child that holds tasks is read by its own reader again
    /// ([`Endpoint::release_read`]): the driver is about to wait on the doorbell, and
    /// their answers must wake it. (An idle child's link brings nothing a driver waits
    /// for: its reader takes it back by itself soon enough.)
    fn release_reads(&mut self) {
        for (l, e) in self.lanes.iter().zip(&mut self.endpoints) {
            if l.is_busy() {
                e.release_read();
            }
        }
    }

    /// Whether the loop has nothing to do until it is handed new work (nothing in the
    /// inbox, queued, in flight or closing): a caller whose run is done may then leave
    /// the scheduler thread parked. Hands the consumed slots back first, as an idle pass
    /// would.
    fn go_quiet(&mut self) -> bool {
        if self.lanes.iter().any(LaneState::is_busy) {
            return false;
        }
        self.sched.flush();
        !self.link.pending.load(Ordering::SeqCst)
            && self.stopping.is_none()
            && self.fault.is_none()
            && self.controls.is_empty()
            && self.queues.values().all(RunQueues::is_empty)
    }

    /// Panics with the injected fault if this pass runs where it should fire.
    #[cold]
    fn fire_fault(&mut self) {
        let on_scheduler = std::thread::current().name() == Some(SCHED_THREAD);
        if self
            .fault
            .as_ref()
            .is_some_and(|f| f.on_caller != on_scheduler)
        {
            if let Some(f) = self.fault.take() {
                panic!("{}", f.message);
            }
        }
    }

    /// Refuses the queued control requests and takes the endpoints out (the loop is
    /// over).
    fn take_endpoints(&mut self) -> Vec<E> {
        for job in self.controls.drain(..) {
            let _ = job.reply.send(Err("the worker is closing".into()));
        }
        std::mem::take(&mut self.endpoints)
    }

    fn intake(&mut self) -> bool {
        if !self.link.pending.load(Ordering::Acquire) {
            return false;
        }
        self.link.pending.store(false, Ordering::Relaxed);
        self.link.hungry.store(false, Ordering::Relaxed);
        let (mut ready, controls, stop) = {
            let mut inbox = self.link.inbox();
            if let Some(f) = inbox.fault.take() {
                self.fault = Some(f);
            }
            (
                std::mem::take(&mut inbox.ready),
                std::mem::take(&mut inbox.controls),
                inbox.stop.take(),
            )
        };
        if stop.is_some() {
            self.stopping = stop;
        }
        self.controls.extend(controls);
        for r in ready.drain(..) {
            self.route(r);
        }
        true
    }

    fn route(&mut self, r: ReadyTask) {
        if self.link.trace.active() && self.link.trace.traced(r.run) {
            self.ready_at.insert(r.task.id().0, strata_sync::mono_ns());
        }
        let n_next = self.n_next;
        let route = Route::from_word(r.route);
        if let Route::Worker(w) = route {
            if w >= n_next {
                // Validated at submit, so out of range is a bug of this engine.
                let why = format!(
                    "internal error: a task was routed to next-level worker {} of {n_next}",
                    r.route
                );
                self.link.set_unusable(why.clone());
                self.fail_task(r.task, &why);
                return;
            }
        }
        let targets = match route {
            Route::Group => match self.sched.peek(r.task, |p| p.worker_targets()) {
                Some(t) => t,
                // Cancelled or poisoned meanwhile: nothing to dispatch.
                None => return,
            },
            _ => Vec::new(),
        };
        let q = self.queues.entry(r.run).or_insert_with(|| RunQueues {
            workers: (0..n_next).map(|_| VecDeque::new()).collect(),
            ..RunQueues::default()
        });
        match route {
            Route::Sub => q.subs.push_back(r.task),
            Route::Group => {
                let entry = Queued {
                    task: r.task,
                    group: true,
                };
                for w in targets {
                    insert_in_order(&mut q.workers[w], entry);
                }
            }
            Route::Worker(w) => insert_in_order(
                &mut q.workers[w],
                Queued {
                    task: r.task,
                    group: false,
                },
            ),
        }
    }

    fn label(&self, lane: usize) -> &str {
        &self.labels[lane]
    }

    /// `message` attributed to `lane`: children name themselves in their messages (by
    /// their process label); next-level lanes add their worker id, and a message that
    /// names nobody gets the lane's full label.
    fn attribute(&self, lane: usize, message: String) -> String {
        let own = self.endpoints[lane].label();
        match (message.starts_with(own), lane < self.n_next) {
            (true, true) => format!("worker {lane}: {message}"),
            (true, false) => message,
            (false, _) => format!("{}: {message}", self.label(lane)),
        }
    }

    /// Fails everything `lane` holds.
    fn finish_all(&mut self, lane: usize, failure: &Failure) {
        for slot in TaskSlot::ALL {
            self.finish(lane, slot, Err(failure.clone()));
        }
    }

    /// Keeps the in-use marks of what `lane` still runs after it was killed or abandoned:
    /// a killed process may run on until the signal lands and an abandoned thread never
    /// stops, so their tensors stay in use until the worker knows the children are gone.
    fn abandon_uses(&mut self, lane: usize) {
        for f in self.lanes[lane].frames.iter_mut().flatten() {
            self.abandoned_uses.append(&mut f.uses);
        }
    }

    /// Where a failure on `lane` happened: the lane's kind of worker and index — or, for a
    /// level-3 child reporting that one of its chips failed ([`CHIP_FAILED_BELOW`]), a chip.
    fn origin(&self, lane: usize, failure: &Failure) -> Origin {
        let (class, index) = match self.endpoints[lane].kind() {
            ChildKind::Chip => (WorkerClass::Chip, lane),
            ChildKind::Worker if failure.code() == CHIP_FAILED_BELOW => (WorkerClass::Chip, lane),
            ChildKind::Worker => (WorkerClass::Worker, lane),
            ChildKind::Sub => (WorkerClass::SubWorker, lane - self.n_next),
        };
        Origin {
            class,
            index: index as u32,
        }
    }

    /// Completes what `lane` ran in frame `slot`.
    fn finish(&mut self, lane: usize, slot: TaskSlot, outcome: Result<(), Failure>) {
        let Some(mut f) = self.lanes[lane].frames[slot.index()].take() else {
            return;
        };
        if let Some(start) = f.trace.take() {
            // Before the graph hears of it: the run's waiter takes the trace once the run
            // is complete.
            let done = strata_sync::mono_ns();
            let child = self.endpoints[lane].take_trace(slot);
            let e = &self.endpoints[lane];
            self.link.trace.task(
                &start,
                f.task.id().0,
                lane,
                e.label(),
                e.pid().unwrap_or(0),
                slot.index(),
                done,
                outcome.is_ok(),
                child,
            );
        }
        let outcome = outcome.map_err(|failure| match failure.origin() {
            Some(_) => failure,
            None => {
                let origin = self.origin(lane, &failure);
                failure.with_origin(origin)
            }
        });
        // Before the graph hears of it: a caller that sees the run done may copy the
        // tensors at once.
        for &r in &f.uses {
            self.shared.release_task_use(r);
        }
        let mut ready = std::mem::take(&mut self.ready);
        let result = if f.group {
            self.sched
                .complete_member(f.task, f.member, outcome, &mut ready)
                .map(|_| ())
        } else {
            self.sched.complete(f.task, outcome, &mut ready)
        };
        // The lane tracks exactly what it dispatched, so the graph refusing the completion
        // is a bug of this engine: stop admitting work rather than run on a broken graph.
        if let Err(e) = result {
            self.link.set_unusable(format!(
                "internal error: the graph refused the completion of a task on {}: {e}",
                self.label(lane)
            ));
        }
        for r in ready.drain(..) {
            self.route(r);
        }
        self.ready = ready;
    }

    fn endpoint_failure(&self, lane: usize, what: &str) -> Failure {
        Failure::new(
            FailureKind::Endpoint,
            format!("{}: {what}", self.label(lane)),
        )
    }

    fn lane_died(&mut self, lane: usize, why: String) {
        let msg = self.attribute(lane, why);
        self.lanes[lane].dead = Some(msg.clone());
        self.link.set_unusable(msg.clone());
        let f = Failure::new(FailureKind::Endpoint, msg);
        self.finish_all(lane, &f);
    }

    fn poll_lanes(&mut self) -> bool {
        let mut progress = false;
        for lane in 0..self.lanes.len() {
            for slot in TaskSlot::ALL {
                if self.lanes[lane].frames[slot.index()].is_none() {
                    continue;
                }
                match self.endpoints[lane].poll(slot) {
                    Ok(None) => {}
                    Ok(Some(outcome)) => {
                        let outcome = outcome.map_err(|f| {
                            let message = self.attribute(lane, f.message);
                            Failure::with_code(FailureKind::Task, f.code, message)
                                .with_wait_for(f.wait_for.map(|w| Arc::new(*w)))
                        });
                        self.finish(lane, slot, outcome);
                        progress = true;
                    }
                    Err(e) => {
                        self.lane_died(lane, e.to_string());
                        progress = true;
                        break;
                    }
                }
            }
        }
        progress
    }

    /// Checks every child still believed alive: a busy child's death fails its task, an
    /// idle child's death makes the worker unusable before anything is sent to it.
    fn check_liveness(&mut self) {
        for lane in 0..self.lanes.len() {
            if self.lanes[lane].dead.is_some() {
                continue;
            }
            if let Err(e) = self.endpoints[lane].check_alive() {
                // A completion published just before the child died still counts (the
                // lane is dead all the same).
                if self.lanes[lane].is_busy() {
                    self.poll_lanes();
                }
                self.lane_died(lane, e.to_string());
            }
        }
    }

    /// Fails every task past its deadline with a timeout naming its child, and stops that
    /// child (it may be stuck anywhere, so it is killed, or abandoned if it is a thread):
    /// its other frame fails with it and the worker becomes unusable, but closes.
    fn check_deadlines(&mut self) {
        let now = self.now;
        let overdue = |l: &LaneState| {
            l.dead.is_none()
                && l.frames
                    .iter()
                    .flatten()
                    .any(|f| f.deadline.is_some_and(|d| now >= d))
        };
        if !self.lanes.iter().any(overdue) {
            return;
        }
        // A completion published just before the deadline still counts.
        self.poll_lanes();
        for lane in 0..self.lanes.len() {
            if !overdue(&self.lanes[lane]) {
                continue;
            }
            let Some((slot, budget)) = TaskSlot::ALL.into_iter().find_map(|s| {
                self.lanes[lane].frames[s.index()]
                    .as_ref()
                    .filter(|f| f.deadline.is_some_and(|d| now >= d))
                    .map(|f| (s, f.budget))
            }) else {
                continue;
            };
            let note = self.endpoints[lane]
                .state_note()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            let how = if self.endpoints[lane].kill() {
                "the child was killed"
            } else {
                "the child (a thread) was abandoned"
            };
            let label = self.label(lane).to_owned();
            let what = format!(
                "{label}: the task ran past its deadline of {budget:?}{note} (timeout); {how} so the worker can close"
            );
            let dead = format!("{label}: stopped after a task ran past its deadline of {budget:?}");
            // Before the lane is stopped: the snapshot shows the task still running there.
            let wait_for = Arc::new(self.wait_for(format!(
                "{label}: a task ran past its deadline of {budget:?}"
            )));
            self.lanes[lane].dead = Some(dead.clone());
            self.link.set_unusable(what.clone());
            self.abandon_uses(lane);
            let f = Failure::new(FailureKind::Timeout, what).with_wait_for(Some(wait_for));
            self.finish(lane, slot, Err(f));
            self.finish_all(lane, &Failure::new(FailureKind::Endpoint, dead));
        }
    }

    /// Declares `lane` unresponsive: it did not answer the control request `request`
    /// within the control deadline. It is stopped (killed, or abandoned if a thread) and
    /// the worker becomes unusable.
    fn unresponsive(&mut self, lane: usize, request: &str) -> ControlFailure {
        let after = self.control_timeout;
        let note = self.endpoints[lane]
            .state_note()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        let how = if self.endpoints[lane].kill() {
            "the child was killed"
        } else {
            "the child (a thread) was abandoned"
        };
        let message = format!(
            "{}: unresponsive: no reply to the control request `{request}` within {after:?}{note}; {how}",
            self.label(lane)
        );
        self.lanes[lane].dead = Some(message.clone());
        self.link.set_unusable(message.clone());
        self.abandon_uses(lane);
        ControlFailure::Unresponsive { message, after }
    }

    /// The budget of a task on `lane`: its call configuration's `timeout` on a sub or
    /// level-3 worker (the worker's `task_timeout` when `None`); on a chip, `timeout`
    /// bounds each kernel (the chip enforces it) and `task_timeout` is the backstop.
    #[inline]
    fn task_budget(&self, lane: usize, config: &EncodedConfig) -> Duration {
        if self.endpoints[lane].kind() == ChildKind::Chip {
            return self.task_timeout;
        }
        strata_types::wire::config_timeout(config.as_bytes()).unwrap_or(self.task_timeout)
    }

    fn run_controls(&mut self) -> bool {
        let mut progress = false;
        let mut i = 0;
        while i < self.controls.len() {
            let lane = self.controls[i].lane;
            if self.lanes.get(lane).is_some_and(LaneState::is_busy) {
                i += 1;
                continue;
            }
            let job = self.controls.remove(i).unwrap_or_else(|| unreachable!());
            progress = true;
            let result = if let Some(dead) = self.lanes.get(lane).and_then(|l| l.dead.clone()) {
                Err(dead.into())
            } else if lane >= self.lanes.len() {
                Err(format!("no child {lane}").into())
            } else {
                // The child is idle and liveness-checked while it answers; one that does
                // not answer in time (stopped, stuck) would hold every lane.
                let deadline = Instant::now().checked_add(self.control_timeout);
                let reply = match self.endpoints[lane].control(&job.command, deadline) {
                    Ok(word) => Ok(word),
                    Err(EndpointError::Control(HostError::Control {
                        source: MailboxError::Timeout { .. },
                        ..
                    })) => Err(self.unresponsive(lane, job.command.name())),
                    Err(e) => Err(e.to_string().into()),
                };
                // The wait may have been long: tasks dispatched later in this pass count
                // their deadlines from now.
                self.now = Instant::now();
                reply
            };
            let _ = job.reply.send(result);
        }
        progress
    }

    /// Publishes member `member` of a claimed task to a free frame of `lane` (the caller
    /// checked there is one). On failure the member is completed as an endpoint failure.
    fn publish(
        &mut self,
        lane: usize,
        task: TaskRef,
        member: usize,
        group: bool,
        run: RunId,
        p: &mut DistTask,
    ) {
        let Some(slot) = self.lanes[lane].free_frame() else {
            // Unreachable: every caller checks for a free frame first.
            let f = self.endpoint_failure(lane, "internal error: no free task frame");
            self.link.set_unusable(f.message().to_owned());
            return;
        };
        self.lanes[lane].seq += 1;
        let budget = self.task_budget(lane, &p.config);
        let identity = FrameIdentity {
            run_id: run.0,
            lease_slot: slot.index() as u32,
            lease_generation: 1,
            dispatch_id: self.lanes[lane].seq,
        };
        // Mark the member's shared tensors in use before the child can touch them.
        let uses = std::mem::take(&mut p.members[member].uses);
        let mut refused = None;
        for (k, &r) in uses.iter().enumerate() {
            if let Err(e) = self.shared.acquire_task_use(r) {
                for &held in &uses[..k] {
                    self.shared.release_task_use(held);
                }
                refused = Some(e);
                break;
            }
        }
        let trace = if self.link.trace.active() && self.link.trace.traced(run) {
            let publish_ns = strata_sync::mono_ns();
            let mut producers = Vec::new();
            self.sched.producers(task, &mut producers);
            Some(Box::new(TaskStart {
                run,
                callable: p.callable,
                ready_ns: self.ready_at.remove(&task.id().0).unwrap_or(publish_ns),
                publish_ns,
                deps: producers.iter().map(|t| t.id().0).collect(),
            }))
        } else {
            None
        };
        if let Some(e) = refused {
            self.lanes[lane].frames[slot.index()] = Some(InFlight {
                task,
                member,
                group,
                uses: Vec::new(),
                deadline: None,
                budget,
                trace,
            });
            let f = Failure::new(FailureKind::Task, format!("{}: {e}", self.label(lane)));
            self.finish(lane, slot, Err(f));
            return;
        }
        let publication =
            TaskPublication::run(p.callable, identity, &p.config, &p.members[member].blob);
        self.lanes[lane].frames[slot.index()] = Some(InFlight {
            task,
            member,
            group,
            uses,
            deadline: self.now.checked_add(budget),
            budget,
            trace,
        });
        if let Err(e) = self.endpoints[lane].publish(slot, &publication) {
            let f = self.endpoint_failure(lane, &e.to_string());
            self.finish(lane, slot, Err(f));
        }
    }

    /// Claims and fails a task that cannot be dispatched (its worker is dead).
    fn fail_task(&mut self, t: TaskRef, why: &str) {
        let Some(c) = self.sched.claim(t) else {
            return;
        };
        let f = Failure::new(FailureKind::Endpoint, why.to_owned());
        let mut ready = std::mem::take(&mut self.ready);
        if c.group_size > 1 || c.payload.members.len() > 1 {
            for m in 0..c.group_size {
                let _ = self.sched.complete_member(t, m, Err(f.clone()), &mut ready);
            }
        } else {
            let _ = self.sched.complete(t, Err(f), &mut ready);
        }
        for r in ready.drain(..) {
            self.route(r);
        }
        self.ready = ready;
    }

    fn fail_queued(&mut self, why: &str) {
        let all: Vec<TaskRef> = self
            .queues
            .values_mut()
            .flat_map(|q| {
                let mut v: Vec<TaskRef> = q.subs.drain(..).collect();
                for w in &mut q.workers {
                    v.extend(w.drain(..).map(|e| e.task));
                }
                v
            })
            .collect();
        // A group is queued on each of its workers: failing it once is enough (the graph
        // refuses to claim it again).
        for t in all {
            self.fail_task(t, why);
        }
    }

    /// Alive with both frames free.
    fn idle(&self, lane: usize) -> bool {
        !self.lanes[lane].is_busy() && self.lanes[lane].dead.is_none()
    }

    /// Alive with a free frame.
    fn has_room(&self, lane: usize) -> bool {
        self.lanes[lane].free_frame().is_some() && self.lanes[lane].dead.is_none()
    }

    fn dispatch(&mut self) -> bool {
        let Some(run) = self.sched.dispatchable_run() else {
            return false;
        };
        if !self.queues.contains_key(&run) {
            self.queues.retain(|_, q| !q.is_empty());
            return false;
        }
        // Tasks the orchestrator still holds come before anything later on their worker.
        // The holds are read first: a hold released since was released after its tasks
        // reached the inbox, which the intake below then routes.
        for (h, link) in self.held.iter_mut().zip(self.link.held.iter()) {
            *h = link.load(Ordering::Acquire);
        }
        if self.link.pending.load(Ordering::Acquire) {
            self.intake();
        }
        let mut progress = false;
        // Next-level workers: each starts only the head of its FIFO (submission order). A
        // single takes a free frame; a group launches once it heads the FIFO of every
        // worker it names and all of them are idle, and until then holds up what is
        // queued behind it on each (a dead worker's queued tasks fail).
        for w in 0..self.n_next {
            while let Some(&head) = self.queues.get(&run).and_then(|q| q.workers[w].front()) {
                if let Some(dead) = self.lanes[w].dead.clone() {
                    self.pop_head(run, w);
                    // A group already failed through another of its workers is refused
                    // here by the graph (not claimable).
                    self.fail_task(head.task, &dead);
                    progress = true;
                    continue;
                }
                if head.seq() > self.held[w] {
                    // An older ready task for this worker is still in the orchestrator's
                    // batch (handed over at once: the orchestrator flushes when it submits
                    // a task that may become ready behind it).
                    break;
                }
                if !head.group {
                    if !self.has_room(w) {
                        break;
                    }
                    self.pop_head(run, w);
                    progress = true;
                    if let Some(mut c) = self.sched.claim(head.task) {
                        self.publish(w, head.task, 0, false, run, &mut c.payload);
                    }
                    continue;
                }
                let Some(targets) = self.sched.peek(head.task, |p| p.worker_targets()) else {
                    // Cancelled, poisoned, or failed through another of its workers.
                    self.pop_head(run, w);
                    progress = true;
                    continue;
                };
                if let Some(&dead) = targets.iter().find(|&&t| self.lanes[t].dead.is_some()) {
                    self.pop_head(run, w);
                    let why = self.lanes[dead].dead.clone().unwrap_or_default();
                    self.fail_task(head.task, &why);
                    progress = true;
                    continue;
                }
                let heads_all = targets.iter().all(|&t| {
                    head.seq() <= self.held[t]
                        && self.idle(t)
                        && self
                            .queues
                            .get(&run)
                            .and_then(|q| q.workers[t].front())
                            .is_some_and(|f| f.task == head.task)
                });
                if !heads_all {
                    break;
                }
                for &t in &targets {
                    self.pop_head(run, t);
                }
                progress = true;
                if let Some(c) = self.sched.claim(head.task) {
                    self.launch(head.task, c, run, &targets);
                }
            }
        }

        // Sub tasks: any idle sub-workers, all members of a sub group at once.
        while let Some(&t) = self.queues.get(&run).and_then(|q| q.subs.front()) {
            let Some(size) = self.sched.peek(t, |p| p.members.len()) else {
                self.queues.get_mut(&run).map(|q| q.subs.pop_front());
                progress = true;
                continue;
            };
            // Idle sub-workers first; a single task may also queue in the second frame of
            // the least loaded busy one. Group members need idle workers (they must run
            // together).
            let mut idle: Vec<usize> = (self.n_next..self.lanes.len())
                .filter(|&l| {
                    if size == 1 {
                        self.has_room(l)
                    } else {
                        self.idle(l)
                    }
                })
                .collect();
            idle.sort_by_key(|&l| self.lanes[l].in_flight());
            let alive = (self.n_next..self.lanes.len())
                .filter(|&l| self.lanes[l].dead.is_none())
                .count();
            if alive < size {
                self.queues.get_mut(&run).map(|q| q.subs.pop_front());
                let why = format!("the task needs {size} sub-workers but only {alive} are alive");
                self.fail_task(t, &why);
                progress = true;
                continue;
            }
            if idle.len() < size {
                break;
            }
            self.queues.get_mut(&run).map(|q| q.subs.pop_front());
            progress = true;
            if let Some(c) = self.sched.claim(t) {
                self.launch(t, c, run, &idle[..size]);
            }
        }
        if progress {
            self.queues.retain(|r, q| *r == run || !q.is_empty());
        }
        progress
    }

    /// Drops the head of worker `w`'s FIFO in `run`.
    fn pop_head(&mut self, run: RunId, w: usize) {
        if let Some(q) = self.queues.get_mut(&run) {
            q.workers[w].pop_front();
        }
    }

    /// Launches every member of a claimed task: member `i` on `lanes[i]`.
    fn launch(&mut self, t: TaskRef, mut c: Claimed<DistTask>, run: RunId, lanes: &[usize]) {
        let group = c.payload.members.len() > 1 || c.group_size > 1;
        for (i, &lane) in lanes.iter().enumerate() {
            if group && !self.sched.start_member(t, i).unwrap_or(false) {
                continue;
            }
            let lane = match c.payload.members[i].target {
                Target::Worker(w) => w,
                Target::Sub => lane,
            };
            self.publish(lane, t, i, group, run, &mut c.payload);
        }
    }
}

/// The scheduler thread's name.
const SCHED_THREAD: &str = "strata-scheduler";

/// How often a caller waiting for a run checks whether the loop broke (a pass panicked).
pub(crate) const BROKEN_CHECK: Duration = Duration::from_millis(10);

/// The scheduler loop, driven by the scheduler thread — or, while a caller waits for a
/// run, by that caller ("caller-runs", through strata-sync's [`DriverSeat`], as the chip
/// does): the waiting thread polls the children and completes and dispatches tasks
/// itself, and the scheduler thread parks. A round trip then involves two parties (the
/// caller and the child) instead of three, which matters when there are no more cores
/// than spinning parties: with three spinners on two cores a hand-off can wait for another
/// spinner's whole budget. A pass that panics, on either thread, breaks the loop: nobody
/// steps it again, the worker becomes unusable, and every waiting run fails naming the
/// panic.
pub(crate) struct Driver {
    seat: DriverSeat<SchedLoop>,
    link: Arc<Link>,
}

impl Driver {
    pub(crate) fn new(lp: SchedLoop) -> Arc<Driver> {
        let link = lp.link.clone();
        let seat = DriverSeat::new(lp);
        let _ = link.waker.set(seat.waker());
        Arc::new(Driver { link, seat })
    }

    /// Starts the scheduler thread.
    pub(crate) fn spawn(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<SchedExit>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name(SCHED_THREAD.into())
            .spawn(move || me.thread_main())
    }

    /// Takes the loop out of its seat for teardown, once the scheduler thread is gone
    /// without having taken it (it panicked outside a pass): its children, still running,
    /// for the worker to shut down. `None` if it was taken already.
    pub(crate) fn take_exit(&self) -> Option<SchedExit> {
        self.seat.take().map(SchedLoop::into_exit)
    }

    /// Why the loop is broken (a pass panicked), if it is.
    pub(crate) fn broken(&self) -> Option<Broken> {
        self.seat.broken()
    }

    /// The scheduler's wait-for state now, headed by `stalled` (`None` if the loop broke
    /// or was taken down).
    pub(crate) fn wait_for(&self, stalled: String) -> Option<strata_types::WaitFor> {
        self.seat.with(|lp| lp.wait_for(stalled)).ok().flatten()
    }

    /// The loop broke: nothing more is admitted, with the panic as the reason.
    fn broke(&self, b: &Broken) {
        self.link.set_unusable(format!("internal error: {b}"));
    }

    /// The scheduler thread: runs the loop until it stops (or breaks), parking while a
    /// caller drives it, and hands the children back for shutdown.
    fn thread_main(&self) -> SchedExit {
        /// Makes the worker unusable if this thread unwinds (outside a pass: a pass's
        /// panic is caught and breaks the loop instead); `close` then tears down.
        struct OnUnwind<'a>(&'a Link);
        impl Drop for OnUnwind<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0
                        .set_unusable("internal error: the scheduler thread panicked".into());
                }
            }
        }
        let _unwind = OnUnwind(&self.link);
        self.seat.register_loop_thread();
        loop {
            if self.link.thread_fault_flag.load(Ordering::Relaxed) {
                self.link.fire_thread_fault();
            }
            if self.seat.park_while_driven(BUSY_SLICE) {
                continue;
            }
            let seen = self.link.doorbell.seq();
            // This thread waits on the doorbell only: a remote child's link is read by
            // its own reader while it does (a caller's link wait may have left it aside).
            let pass = |lp: &mut SchedLoop| {
                let step = lp.step();
                if matches!(step, Step::Idle { .. }) {
                    lp.release_reads();
                }
                step
            };
            match self.seat.pass(pass) {
                Err(b) => {
                    self.broke(&b);
                    break;
                }
                Ok(None | Some(Step::Stopped)) => break,
                Ok(Some(Step::Progressed)) => {}
                Ok(Some(Step::Idle { busy, spin })) => {
                    let slice = if busy { BUSY_SLICE } else { IDLE_SLICE };
                    let spin = if spin { SPIN } else { Duration::ZERO };
                    self.link.doorbell.wait(seen, spin, slice);
                }
            }
        }
        // Teardown only (a broken loop is never stepped again): the children are shut
        // down by the worker.
        let lp = self.seat.take();
        lp.map(SchedLoop::into_exit)
            .unwrap_or_else(|| unreachable!("only this thread takes the loop"))
    }

    /// Drives the loop on the calling thread until `done()`, `deadline`, or a spin budget
    /// without progress (then the caller parks and the scheduler thread takes over).
    ///
    /// # Errors
    /// The loop is broken: a pass panicked (now, on this caller, or before).
    pub(crate) fn drive_until(
        &self,
        deadline: Option<Instant>,
        mut done: impl FnMut() -> bool,
    ) -> Result<(), Broken> {
        let mut entered = false;
        let mut idle_since: Option<Instant> = None;
        let link = &self.link;
        let driven = self.seat.drive_quiet(
            || {
                if done() {
                    return Some(());
                }
                if !entered {
                    // About to drive: get the scheduler thread out of its spin on the
                    // doorbell, so it parks. (Not when the run is done already: the
                    // ring would only wake it.)
                    entered = true;
                    link.doorbell.ring();
                }
                None
            },
            |lp| {
                let seen = link.doorbell.seq();
                let turn = match lp.step() {
                    Step::Stopped => Turn::Over,
                    Step::Progressed => {
                        idle_since = None;
                        Turn::Again
                    }
                    Step::Idle {
                        busy: true,
                        spin: false,
                    } => {
                        // Only children that answer slowly (remote ones) hold tasks: a
                        // spin would only take the CPU from the threads that bring their
                        // answers. Park on the doorbell, still the driver (no hand-over
                        // to the scheduler thread, which would add a wake-up).
                        let mut wait = BUSY_SLICE;
                        if let Some(d) = deadline {
                            wait = wait.min(d.saturating_duration_since(Instant::now()));
                        }
                        if wait.is_zero() {
                            Turn::HandBack
                        } else {
                            if !lp.wait_answer(seen, wait) {
                                lp.release_reads();
                                link.doorbell.wait(seen, Duration::ZERO, wait);
                            }
                            Turn::Again
                        }
                    }
                    Step::Idle { .. } => {
                        let now = Instant::now();
                        let since = *idle_since.get_or_insert(now);
                        let mut left = SPIN.saturating_sub(now.duration_since(since));
                        if let Some(d) = deadline {
                            left = left.min(d.saturating_duration_since(now));
                        }
                        if left.is_zero() {
                            Turn::HandBack
                        } else {
                            lp.release_reads();
                            link.doorbell.wait(seen, left, left);
                            Turn::Again
                        }
                    }
                };
                if turn == Turn::Again && deadline.is_some_and(|d| Instant::now() >= d) {
                    return Turn::HandBack;
                }
                turn
            },
            // The run is done and the loop idle: leave the scheduler thread parked rather
            // than wake it only to have it park again when this caller drives its next
            // run. Waking it costs this round trip tens of µs whenever the kernel puts it
            // on the CPU of the child the caller waits for (2 CPUs, 3 threads). It
            // resumes at its park slice, or when work is handed over without a driver.
            SchedLoop::go_quiet,
            || link.pending.load(Ordering::SeqCst),
        );
        match driven {
            Driven::Broken(b) => {
                self.broke(&b);
                Err(b)
            }
            Driven::Done(()) | Driven::HandedBack | Driven::Over => Ok(()),
        }
    }
}
