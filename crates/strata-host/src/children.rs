//! The children of one worker: spawning (fork or threads), startup readiness, the
//! parent-side lanes, liveness, shutdown and reaping.

use crate::doorbell::Doorbell;
use crate::error::{who, ChildEnd, HostError};
use crate::shm::SharedMemory;
use std::cell::Cell;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use strata_mailbox::release_foreign_mailboxes;
use strata_mailbox::{
    AssumeAlive, Child, ChildProcess, ControlReply, ControlRequest, FailureReport, FrameId,
    Handler, Liveness, Mailbox, MailboxError, MailboxState, Parent, PublishHook, ServeOptions,
    TaskCompletion, TaskPublication, TaskSlot, WaitOptions,
};

/// How a worker runs its children.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ExecMode {
    /// Each child is a forked process (the default): isolation, and a crash or a `kill`
    /// of one child is reported as that child's death.
    #[default]
    Process,
    /// Each child is a thread of this process serving its own mapping of the same
    /// mailbox, with the same protocol. No `fork`: usable when the process already runs
    /// threads, and in tests.
    Threads,
}

/// Exit codes of a child process (and return codes of a child thread).
pub mod exit_codes {
    /// Normal end: the parent requested shutdown (or died), or shutdown was requested
    /// before the child became ready.
    pub const OK: i32 = 0;
    /// `ChildProgram::start` returned an error (reported as `INIT_FAILED`).
    pub const START_FAILED: i32 = 1;
    /// `ChildProgram::start` panicked (reported as `INIT_FAILED`).
    pub const START_PANICKED: i32 = 2;
    /// The mailbox protocol broke (garbage in a state word); the child left.
    pub const PROTOCOL_ERROR: i32 = 3;
    /// Dropping the handler after the serve loop panicked.
    pub const DROP_PANICKED: i32 = 4;
    /// A panic escaped everything else (should not happen).
    pub const PANICKED: i32 = 101;
}

/// The `INIT_FAILED` error code written when `ChildProgram::start` fails or panics.
pub const INIT_FAILED_CODE: i32 = 1;

/// What one child runs.
///
/// `start` runs **inside the child** — after `fork` in [`ExecMode::Process`], on the
/// child's thread in [`ExecMode::Threads`] — and returns the mailbox handler the child
/// then serves until shutdown. An `Err` is reported to the parent as `INIT_FAILED` with
/// the message (a panic too, as `"panicked: <msg>"`), and `Children::spawn` fails naming
/// the child.
///
/// Anything the program captured before the fork (registries, closures, tables) is in
/// the child's copy of memory; nothing is serialized. The exception is mailboxes: in
/// [`ExecMode::Process`] every mailbox but the child's own is unmapped and closed before
/// `start` runs, so a program must not carry one across the fork.
pub trait ChildProgram: Send + 'static {
    /// The child's name in logs and errors, e.g. `"sub_worker 1"`,
    /// `"chip_process dev=0"`, `"child_worker level=3 id=0"`.
    fn label(&self) -> String;

    /// Prepares the child and returns its handler.
    ///
    /// # Errors
    /// A message saying why the child cannot start; it becomes `INIT_FAILED`.
    fn start(
        self: Box<Self>,
        env: &ChildEnv,
    ) -> Result<Box<dyn strata_mailbox::Handler + Send>, String>;
}

/// What a child program is told about where it runs.
#[derive(Debug)]
pub struct ChildEnv {
    /// Process or thread.
    pub mode: ExecMode,
    /// The child's index among the children of this spawn (its lane index).
    pub index: usize,
    /// Its label ([`ChildProgram::label`]).
    pub label: String,
    /// The worker's shared memory (regions created after the fork are not mapped here).
    pub shared: Arc<SharedMemory>,
    /// The parent's pid (this process's own pid in [`ExecMode::Threads`]).
    pub parent_pid: u32,
    ready_info: Cell<u64>,
}

impl ChildEnv {
    /// An environment (for running a program outside `Children::spawn`, e.g. in a test).
    pub fn new(
        mode: ExecMode,
        index: usize,
        label: impl Into<String>,
        shared: Arc<SharedMemory>,
        parent_pid: u32,
    ) -> ChildEnv {
        ChildEnv {
            mode,
            index,
            label: label.into(),
            shared,
            parent_pid,
            ready_info: Cell::new(0),
        }
    }

    /// Sets the info word the child publishes with `INIT_READY` (e.g. a chip's pipeline
    /// depth); the parent reads it as [`Lane::ready_info`]. Default 0.
    pub fn set_ready_info(&self, info: u64) {
        self.ready_info.set(info);
    }

    /// The info word that will be published with `INIT_READY`.
    pub fn ready_info(&self) -> u64 {
        self.ready_info.get()
    }
}

/// How [`Children::spawn`] starts the children.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// Processes or threads.
    pub mode: ExecMode,
    /// How long every child together may take to report `INIT_READY` (one deadline for
    /// all children of the spawn).
    pub startup_timeout: Duration,
    /// Fork even if this process runs other threads (process mode). A fork copies only
    /// the calling thread; a lock another thread held at that moment (allocator, stdio,
    /// environment) stays locked forever in the child. Opt in only if you know the other
    /// threads hold no such lock.
    ///
    /// The children's parent-death signal (`PR_SET_PDEATHSIG(SIGKILL)`) fires when the
    /// *thread* that forked them exits. Without this option that thread is the process's
    /// only one, so it fires exactly when the process dies; with it, call
    /// [`Children::spawn`] from a thread that outlives the children (e.g. `main`), or they
    /// are killed when it exits.
    pub allow_fork_with_threads: bool,
    /// Rung by every child after each publication its parent acts on (terminal task
    /// states, `FRAME_STAGED`, `CONTROL_DONE`, `INIT_*`). Create it before spawning.
    pub doorbell: Option<Doorbell>,
    /// How children wait for work (spin budget) and how the parent's blocking waits on a
    /// lane spin and park. The deadline is ignored.
    pub wait: WaitOptions,
    /// How long an idle child sleeps between checks that its parent is alive (a parked
    /// child is woken at once by work or a shutdown request; only a dead parent is
    /// noticed this late). Longer slices cost less idle CPU.
    pub child_park_slice: Duration,
}

impl SpawnOptions {
    /// Default idle child park slice: 50 ms (≈ 0.1 % of a core per idle child here).
    pub const DEFAULT_CHILD_PARK_SLICE: Duration = Duration::from_millis(50);

    /// Default startup timeout: 300 s (as the reference).
    pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(300);

    /// Defaults for `mode`: 300 s startup timeout, no fork with threads, no doorbell,
    /// default waits.
    pub fn new(mode: ExecMode) -> SpawnOptions {
        SpawnOptions {
            mode,
            startup_timeout: Self::DEFAULT_STARTUP_TIMEOUT,
            allow_fork_with_threads: false,
            doorbell: None,
            wait: WaitOptions::new(),
            child_park_slice: Self::DEFAULT_CHILD_PARK_SLICE,
        }
    }

    /// Sets the startup timeout.
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Sets the doorbell.
    pub fn with_doorbell(mut self, doorbell: Doorbell) -> Self {
        self.doorbell = Some(doorbell);
        self
    }

    /// Sets the wait options.
    pub fn with_wait(mut self, wait: WaitOptions) -> Self {
        self.wait = wait;
        self
    }

    /// Allows (or forbids) forking while other threads run.
    pub fn with_fork_with_threads(mut self, allow: bool) -> Self {
        self.allow_fork_with_threads = allow;
        self
    }
}

impl Default for SpawnOptions {
    fn default() -> Self {
        SpawnOptions::new(ExecMode::Process)
    }
}

/// Threads of this process besides the caller (entries of `/proc/self/task` minus one).
///
/// # Errors
/// [`HostError::Os`] if `/proc/self/task` cannot be read.
pub fn other_threads() -> Result<usize, HostError> {
    let dir = std::fs::read_dir("/proc/self/task").map_err(|source| HostError::Os {
        op: "reading /proc/self/task (is /proc mounted?)",
        source,
    })?;
    Ok(dir.count().saturating_sub(1))
}

// -------------------------------------------------------------------------------------
// Liveness of one child
// -------------------------------------------------------------------------------------

#[derive(Debug)]
enum Watch {
    Process(ChildProcess),
    Thread {
        handle: Option<JoinHandle<i32>>,
        end: Option<ChildEnd>,
    },
}

impl Watch {
    fn pid(&self) -> Option<i32> {
        match self {
            Watch::Process(p) => Some(p.pid()),
            Watch::Thread { .. } => None,
        }
    }

    /// How the child ended, if a poll found it gone.
    fn end(&self) -> Option<ChildEnd> {
        match self {
            Watch::Process(p) => p.exit().map(ChildEnd::Process),
            Watch::Thread { end, .. } => end.clone(),
        }
    }

    /// Polls once without blocking (reaps a process / joins a thread that ended).
    fn poll(&mut self) -> Result<Option<ChildEnd>, MailboxError> {
        match self {
            Watch::Process(p) => {
                if p.exit().is_none() && exited_unreaped(p.pid()) {
                    // Its pid (and so its process group id) stays ours until the reap
                    // below: anything the child left in its group dies with it now.
                    kill_group(p.pid());
                }
                Ok(p.try_wait()?.map(ChildEnd::Process))
            }
            Watch::Thread { handle, end } => {
                if end.is_none() && handle.as_ref().is_some_and(|h| h.is_finished()) {
                    if let Some(h) = handle.take() {
                        *end = Some(match h.join() {
                            Ok(code) => ChildEnd::ThreadReturned(code),
                            Err(p) => ChildEnd::ThreadPanicked(panic_message(&*p)),
                        });
                    }
                }
                Ok(end.clone())
            }
        }
    }
}

impl Liveness for Watch {
    fn check(&mut self) -> Result<(), MailboxError> {
        match self.poll()? {
            None => Ok(()),
            Some(ChildEnd::Process(exit)) => Err(MailboxError::ChildExited {
                pid: self.pid().unwrap_or(0),
                exit,
            }),
            Some(end) => Err(MailboxError::PeerGone(format!("the child {end}"))),
        }
    }
}

pub(crate) use strata_sync::panic_message;

/// Whether the child `pid` has exited but is not reaped yet (`waitid(WNOWAIT)`: the
/// zombie stays, so its pid cannot be reused).
fn exited_unreaped(pid: i32) -> bool {
    // SAFETY: an all-zero siginfo_t is valid (plain integers and a union of them).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid only writes into `info`; WNOWAIT leaves the child waitable and
    // WNOHANG makes it return at once.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid is set (to the child's pid, or 0 if it is still running) whenever
    // waitid returns 0 with WEXITED.
    r == 0 && unsafe { info.si_pid() } != 0
}

/// `SIGKILL`s the process group that the child `pid` leads (the child and whatever it
/// started that stayed in its group, e.g. a program a sub callable spawned).
///
/// Only call it while `pid` is an unreaped child of this process: then no other process
/// can have that pid, and no other group that id. A child that is no group leader (its
/// `setpgid` failed) has no such group: `ESRCH`, and the child alone is killed.
fn kill_group(pid: i32) {
    // SAFETY: kill has no memory preconditions; `-pid` names the group `pid` leads, which
    // the caller guarantees is still ours.
    let r = unsafe { libc::kill(-pid, libc::SIGKILL) };
    if r != 0 {
        // SAFETY: as above, `pid` is our unreaped child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

// -------------------------------------------------------------------------------------
// Lane
// -------------------------------------------------------------------------------------

/// One child's parent-side endpoint: its mailbox ([`Lane::parent`]) and its liveness.
///
/// A lane has no thread of its own: the engine's scheduler publishes into it, polls it,
/// and calls [`Lane::check_alive`] in its loop.
#[derive(Debug)]
pub struct Lane {
    index: usize,
    label: String,
    parent: Parent,
    watch: Watch,
    wait: WaitOptions,
    last_poll: Option<Instant>,
    ready_info: u64,
}

/// Shortest interval between two `waitpid` calls of [`Lane::check_alive`].
pub const LIVENESS_POLL_INTERVAL: Duration = Duration::from_millis(1);

impl Lane {
    fn new(index: usize, label: String, parent: Parent, watch: Watch, wait: WaitOptions) -> Lane {
        Lane {
            index,
            label,
            parent,
            watch,
            wait: WaitOptions {
                deadline: None,
                ..wait
            },
            last_poll: None,
            ready_info: 0,
        }
    }

    /// The child's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The child's pid (`None` for a thread child).
    pub fn pid(&self) -> Option<i32> {
        self.watch.pid()
    }

    /// The lane's index among the children of its spawn.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The info word the child published with `INIT_READY` (`ChildEnv::set_ready_info`).
    pub fn ready_info(&self) -> u64 {
        self.ready_info
    }

    /// The wait options of this lane's blocking waits (no deadline).
    pub fn wait_options(&self) -> WaitOptions {
        self.wait
    }

    /// The mailbox's parent end: publish, poll, reset, activate, snapshot.
    pub fn parent(&mut self) -> &mut Parent {
        &mut self.parent
    }

    /// The mailbox's parent end and the liveness check together, for a blocking
    /// `Parent` wait (`wait_task`, `wait_change`, `control`).
    pub fn parts(&mut self) -> (&mut Parent, &mut dyn Liveness) {
        (&mut self.parent, &mut self.watch)
    }

    /// The liveness check for blocking waits: `waitpid(WNOHANG)` for a process, "has the
    /// thread finished" for a thread. A child it finds gone is reaped and remembered (a
    /// process's group is killed just before the reap).
    pub fn liveness(&mut self) -> &mut dyn Liveness {
        &mut self.watch
    }

    /// Whether the child is known to be gone (found by an earlier check).
    pub fn is_dead(&self) -> bool {
        self.watch.end().is_some()
    }

    /// How the child ended, once a check found it gone.
    pub fn exit(&self) -> Option<ChildEnd> {
        self.watch.end()
    }

    fn died(&self, exit: ChildEnd) -> HostError {
        HostError::ChildDied {
            label: self.label.clone(),
            pid: self.pid(),
            exit,
        }
    }

    /// Cheap liveness check for a scheduler loop. A process is polled with
    /// `waitpid(WNOHANG)` at most every [`LIVENESS_POLL_INTERVAL`] (calls in between
    /// return `Ok` at the cost of a clock read); a thread's "finished" flag is read every
    /// time.
    ///
    /// # Errors
    /// [`HostError::ChildDied`] (label, pid, exit status or signal) once the child is
    /// gone — on this and every later call; [`HostError::Mailbox`] if `waitpid` fails
    /// unexpectedly.
    pub fn check_alive(&mut self) -> Result<(), HostError> {
        if let Some(end) = self.watch.end() {
            return Err(self.died(end));
        }
        if let Watch::Process(_) = self.watch {
            let now = Instant::now();
            if self
                .last_poll
                .is_some_and(|t| now.duration_since(t) < LIVENESS_POLL_INTERVAL)
            {
                return Ok(());
            }
            self.last_poll = Some(now);
        }
        match self.watch.poll() {
            Ok(None) => Ok(()),
            Ok(Some(end)) => Err(self.died(end)),
            Err(e) => Err(HostError::mailbox(
                format!(
                    "checking whether {} is alive",
                    who(&self.label, &self.pid())
                ),
                e,
            )),
        }
    }

    /// Sends `SIGKILL` to the child process (and the process group it leads) now, for a
    /// child the caller declared unresponsive (a missed deadline). `SIGKILL` also ends a
    /// stopped (`SIGSTOP`ped) process, which a graceful request never reaches. The child is reaped by a later
    /// [`Lane::check_alive`] or by [`Children::shutdown`]. A thread child cannot be
    /// killed: nothing is done (shutdown detaches it). Returns whether a signal was sent.
    pub fn kill(&mut self) -> bool {
        match (&self.watch, self.watch.end()) {
            (Watch::Process(p), None) => {
                // Unreaped (its end is unknown), so the pid and its group are still ours;
                // the group takes what the child started with it (a level-3 child's
                // chips and subs).
                kill_group(p.pid());
                true
            }
            _ => false,
        }
    }

    /// The child process's scheduler state as `/proc/<pid>/stat` reports it: `'R'`
    /// running, `'S'` sleeping, `'T'` stopped (`SIGSTOP`), `'Z'` zombie, …; `None` for a
    /// thread child, a reaped one, or when the file cannot be read. `waitpid(WNOHANG)`
    /// does not see a stopped child; this does. It reads a file, so it is meant for
    /// the moment a deadline passed, not for every liveness check.
    pub fn process_state(&self) -> Option<char> {
        if self.watch.end().is_some() {
            return None;
        }
        let pid = self.pid()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ...`: comm may hold spaces and parentheses, so the state is
        // the first field after the last `)`.
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    }

    fn opts(&self, timeout: Option<Duration>) -> WaitOptions {
        match timeout {
            Some(t) => self.wait.with_timeout(t),
            None => self.wait,
        }
    }

    /// Maps the error of a blocking wait: a dead child becomes [`HostError::ChildDied`].
    fn wait_error(&self, e: MailboxError, what: &str) -> HostError {
        match self.watch.end() {
            Some(end) => self.died(end),
            None => HostError::mailbox(format!("{}: {what}", self.label), e),
        }
    }

    /// Runs a control command (spin-then-park wait, liveness-checked, optional timeout).
    ///
    /// # Errors
    /// [`HostError::ChildDied`] if the child died meanwhile; [`HostError::Control`]
    /// otherwise (the child's failure, a timeout, a poisoned channel, …).
    pub fn control(
        &mut self,
        req: &ControlRequest<'_>,
        timeout: Option<Duration>,
    ) -> Result<ControlReply, HostError> {
        let opts = self.opts(timeout);
        self.parent
            .control(req, &opts, &mut self.watch)
            .map_err(|source| match self.watch.end() {
                Some(end) => self.died(end),
                None => HostError::Control {
                    label: self.label.clone(),
                    command: req.command,
                    source,
                },
            })
    }

    /// Waits (spin-then-park, liveness-checked) for the task in `slot` to finish; the
    /// frame stays terminal until `parent().reset(slot)`.
    ///
    /// # Errors
    /// [`HostError::ChildDied`]; [`HostError::Mailbox`] (timeout, protocol error).
    pub fn wait_task(
        &mut self,
        slot: TaskSlot,
        timeout: Option<Duration>,
    ) -> Result<TaskCompletion, HostError> {
        let opts = self.opts(timeout);
        self.parent
            .wait_task(slot, &opts, &mut self.watch)
            .map_err(|e| self.wait_error(e, "waiting for a task"))
    }

    /// Publishes a task, waits for it and resets the frame: one round trip.
    ///
    /// # Errors
    /// As [`Lane::wait_task`]; a publication error as [`HostError::Mailbox`].
    pub fn run_task(
        &mut self,
        slot: TaskSlot,
        task: &TaskPublication<'_>,
        timeout: Option<Duration>,
    ) -> Result<TaskCompletion, HostError> {
        let opts = self.opts(timeout);
        self.parent
            .run_task(slot, task, &opts, &mut self.watch)
            .map_err(|e| self.wait_error(e, "running a task"))
    }

    /// Polls the startup report: `Some(info)` on `INIT_READY`.
    fn poll_init(&mut self) -> Result<Option<u64>, HostError> {
        let failed = |lane: &Lane, reason: String| HostError::StartupFailed {
            label: lane.label.clone(),
            pid: lane.pid(),
            reason,
        };
        for attempt in 0..2 {
            let state = self
                .parent
                .mailbox()
                .state(FrameId::Control)
                .map_err(|e| failed(self, e.to_string()))?;
            match state {
                MailboxState::InitReady | MailboxState::InitFailed => {
                    let opts = WaitOptions::new().with_spin(Duration::ZERO);
                    return match self.parent.wait_init(&opts, &mut AssumeAlive) {
                        Ok(info) => Ok(Some(info)),
                        Err(MailboxError::InitFailed { message, .. }) => Err(failed(self, message)),
                        Err(e) => Err(failed(self, e.to_string())),
                    };
                }
                MailboxState::Idle if attempt == 0 => match self.watch.poll() {
                    Ok(None) => return Ok(None),
                    // Gone: look once more (it may have published and then exited).
                    Ok(Some(_)) => continue,
                    Err(e) => return Err(failed(self, format!("liveness check failed: {e}"))),
                },
                MailboxState::Idle => {
                    let end = self
                        .watch
                        .end()
                        .map_or_else(|| "ended".into(), |e| e.to_string());
                    let what = if self.pid().is_some() {
                        "exited"
                    } else {
                        "the thread ended"
                    };
                    return Err(failed(
                        self,
                        format!("{what} during init before signalling ready: {end}"),
                    ));
                }
                other => {
                    return Err(failed(
                        self,
                        format!("the control frame entered {other} during startup"),
                    ))
                }
            }
        }
        Ok(None)
    }
}

// -------------------------------------------------------------------------------------
// Shutdown report
// -------------------------------------------------------------------------------------

/// How one child ended, as recorded by [`Children::shutdown`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildReport {
    /// Its lane index.
    pub index: usize,
    /// Its label.
    pub label: String,
    /// Its pid (`None` for a thread).
    pub pid: Option<i32>,
    /// How it ended; `None` for a thread that did not stop within the grace period and
    /// was detached (threads cannot be killed).
    pub end: Option<ChildEnd>,
    /// Whether it had to be `SIGKILL`ed after the grace period.
    pub killed: bool,
    /// Whether it had died before shutdown was requested.
    pub died_before_shutdown: bool,
}

impl ChildReport {
    /// Whether it ended abnormally: a signal, a non-zero status, killed after the grace
    /// period, dead before shutdown, or a detached thread.
    pub fn is_abnormal(&self) -> bool {
        self.killed || self.died_before_shutdown || self.end.as_ref().is_none_or(|e| !e.is_normal())
    }
}

impl std::fmt::Display for ChildReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ", who(&self.label, &self.pid))?;
        match &self.end {
            None => f.write_str("did not stop within the grace period (thread detached)")?,
            Some(end) => write!(f, "{end}")?,
        }
        if self.killed {
            f.write_str(" (SIGKILLed after the grace period)")?;
        }
        if self.died_before_shutdown {
            f.write_str(" (before shutdown was requested)")?;
        }
        Ok(())
    }
}

/// What [`Children::shutdown`] found: one entry per child.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Every child, in lane order.
    pub children: Vec<ChildReport>,
}

impl ShutdownReport {
    /// The children that ended abnormally.
    pub fn abnormal(&self) -> Vec<&ChildReport> {
        self.children.iter().filter(|c| c.is_abnormal()).collect()
    }

    /// Whether every child exited normally after the shutdown request.
    pub fn is_clean(&self) -> bool {
        self.children.iter().all(|c| !c.is_abnormal())
    }

    /// `Ok(self)` if clean, else [`HostError::AbnormalExit`] listing the abnormal
    /// children.
    ///
    /// # Errors
    /// [`HostError::AbnormalExit`].
    pub fn into_result(self) -> Result<ShutdownReport, HostError> {
        if self.is_clean() {
            Ok(self)
        } else {
            Err(HostError::AbnormalExit {
                summary: self
                    .abnormal()
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            })
        }
    }
}

impl std::fmt::Display for ShutdownReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, c) in self.children.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

// -------------------------------------------------------------------------------------
// Children
// -------------------------------------------------------------------------------------

/// Grace period of the rollback after a failed startup, and of `Drop`.
pub const ABORT_GRACE: Duration = Duration::from_secs(2);
/// Grace period `Drop` gives the children before killing them.
pub const DROP_GRACE: Duration = Duration::from_secs(5);
/// How long to wait for a `SIGKILL`ed child to become reapable.
const KILL_REAP_BOUND: Duration = Duration::from_secs(10);

/// The children of one worker. See `docs/host.md` for the process tree, the startup
/// sequence and the failure model.
///
/// Dropping it shuts the children down ([`Children::shutdown`] with [`DROP_GRACE`]).
#[derive(Debug)]
pub struct Children {
    mode: ExecMode,
    lanes: Vec<Lane>,
    report: Option<ShutdownReport>,
    /// Test-only: the next shutdown's waits for processes fail (see
    /// [`Children::inject_reap_failure`]).
    reap_fault: bool,
}

impl Children {
    /// Starts one child per program and waits until every one is ready.
    ///
    /// Process mode: refuses ([`HostError::ThreadsRunning`]) if this process runs other
    /// threads, unless `opts.allow_fork_with_threads`. Then: creates one
    /// mailbox per child; forks every child (each child sets `OMP_NUM_THREADS`,
    /// `OPENBLAS_NUM_THREADS` and `MKL_NUM_THREADS` to 1 where unset, runs
    /// `program.start`, publishes `INIT_READY` or `INIT_FAILED`, serves its mailbox
    /// — ringing the doorbell after each publication — and leaves through `_exit`).
    /// Before any of that each child sets `PR_SET_PDEATHSIG(SIGKILL)` (it dies with the
    /// calling thread, busy or not; see [`SpawnOptions::allow_fork_with_threads`]),
    /// leaves at once if its parent already died, leads a process group of its own
    /// (killed when the child is reaped), and unmaps and closes every mailbox but its own.
    /// Finally waits for every `INIT_READY` within `opts.startup_timeout` (one deadline
    /// for all).
    ///
    /// Threads mode: the same, with a thread per child serving a second mapping of its
    /// mailbox.
    ///
    /// On any failure every child already started is shut down (graceful request, then
    /// `SIGKILL` after [`ABORT_GRACE`]) and reaped before the error is returned.
    ///
    /// # Errors
    /// [`HostError::ThreadsRunning`]; [`HostError::StartupFailed`] naming the child
    /// (label, pid) with its `INIT_FAILED` message, its exit status, or the timeout;
    /// [`HostError::SpawnFailed`] if `fork` or thread creation fails;
    /// [`HostError::Mailbox`] if a mailbox cannot be created.
    pub fn spawn(
        shared: &Arc<SharedMemory>,
        programs: Vec<Box<dyn ChildProgram>>,
        opts: SpawnOptions,
    ) -> Result<Children, HostError> {
        // Whether this process is single-threaded at the fork (then the child may flush
        // stdio without risking a lock another thread held).
        let mut single_threaded = false;
        // Nothing to fork (e.g. a level-4 worker whose children are all remote): other
        // threads are no danger then.
        if opts.mode == ExecMode::Process && !programs.is_empty() {
            let others = other_threads()?;
            if others > 0 && !opts.allow_fork_with_threads {
                return Err(HostError::ThreadsRunning { count: others });
            }
            single_threaded = others == 0;
        }
        let labels: Vec<String> = programs.iter().map(|p| p.label()).collect();
        let mut mailboxes = Vec::with_capacity(programs.len());
        for label in &labels {
            mailboxes.push(
                Mailbox::create().map_err(|e| {
                    HostError::mailbox(format!("creating the mailbox of {label}"), e)
                })?,
            );
        }
        let serve = ServeOptions {
            wait: WaitOptions {
                deadline: None,
                park_slice: opts.child_park_slice,
                ..opts.wait
            },
            on_publish: opts
                .doorbell
                .clone()
                .map(|bell| PublishHook::new(move || bell.ring())),
            ..ServeOptions::default()
        };
        let mut children = Children {
            mode: opts.mode,
            lanes: Vec::with_capacity(programs.len()),
            report: None,
            reap_fault: false,
        };
        let started = children.start_all(
            shared,
            programs,
            mailboxes,
            labels,
            &serve,
            &opts,
            single_threaded,
        );
        let ready = started.and_then(|()| children.await_ready(opts.startup_timeout));
        match ready {
            Ok(()) => Ok(children),
            Err(e) => {
                // Roll back: nothing may be left running.
                let _ = children.shutdown(ABORT_GRACE);
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start_all(
        &mut self,
        shared: &Arc<SharedMemory>,
        programs: Vec<Box<dyn ChildProgram>>,
        mailboxes: Vec<Mailbox>,
        labels: Vec<String>,
        serve: &ServeOptions,
        opts: &SpawnOptions,
        single_threaded: bool,
    ) -> Result<(), HostError> {
        let parent_pid = std::process::id();
        for (index, ((program, mailbox), label)) in
            programs.into_iter().zip(mailboxes).zip(labels).enumerate()
        {
            let env = ChildEnv::new(opts.mode, index, label.clone(), shared.clone(), parent_pid);
            let watch = match opts.mode {
                ExecMode::Process => {
                    let _ = std::io::stdout().flush();
                    let _ = std::io::stderr().flush();
                    // SAFETY: fork duplicates this process with only the calling thread.
                    // Either the process is single-threaded (checked above) or the caller
                    // opted in knowing the risk. The child never returns from
                    // `child_process` (it leaves through `_exit`), so it never unwinds into
                    // or drops the parent's copied state.
                    let pid = unsafe { libc::fork() };
                    if pid == 0 {
                        child_process(program, env, mailbox, serve.clone(), single_threaded);
                    }
                    if pid > 0 {
                        // Also done by the child; doing it here too means the group exists
                        // before this function returns, whichever runs first. EACCES /
                        // ESRCH (the child already set it, or died) change nothing.
                        // SAFETY: setpgid has no memory preconditions; `pid` is our child.
                        unsafe { libc::setpgid(pid, pid) };
                    }
                    if pid < 0 {
                        return Err(HostError::SpawnFailed {
                            label,
                            reason: format!(
                                "fork failed: {}; check the process limit (ulimit -u) and memory",
                                std::io::Error::last_os_error()
                            ),
                        });
                    }
                    drop(program);
                    self.lanes.push(Lane::new(
                        index,
                        label,
                        Parent::new(mailbox),
                        Watch::Process(ChildProcess::new(pid)),
                        opts.wait,
                    ));
                    continue;
                }
                ExecMode::Threads => {
                    let child_mb = mailbox.try_clone().map_err(|e| {
                        HostError::mailbox(format!("mapping the mailbox of {label} again"), e)
                    })?;
                    let serve = serve.clone();
                    let name: String = label
                        .chars()
                        .map(|c| if c == '\0' { '_' } else { c })
                        .collect();
                    let handle = std::thread::Builder::new()
                        .name(name)
                        .spawn(move || run_child(program, env, child_mb, serve, Ok(())))
                        .map_err(|e| HostError::SpawnFailed {
                            label: label.clone(),
                            reason: format!("could not create the thread: {e}"),
                        })?;
                    Watch::Thread {
                        handle: Some(handle),
                        end: None,
                    }
                }
            };
            self.lanes.push(Lane::new(
                index,
                label,
                Parent::new(mailbox),
                watch,
                opts.wait,
            ));
        }
        Ok(())
    }

    /// The readiness barrier: polls every pending child until all published
    /// `INIT_READY`, one fails, or the deadline passes.
    fn await_ready(&mut self, timeout: Duration) -> Result<(), HostError> {
        // A timeout past what an `Instant` holds is no deadline (validated configs are
        // positive; a huge one means "wait as long as it takes").
        let deadline = Instant::now().checked_add(timeout);
        let mut pending: Vec<usize> = (0..self.lanes.len()).collect();
        let mut nap = Duration::from_micros(20);
        loop {
            let mut i = 0;
            while i < pending.len() {
                let lane = &mut self.lanes[pending[i]];
                if let Some(info) = lane.poll_init()? {
                    lane.ready_info = info;
                    pending.swap_remove(i);
                } else {
                    i += 1;
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                pending.sort_unstable();
                let lane = &self.lanes[pending[0]];
                let others = pending.len() - 1;
                return Err(HostError::StartupFailed {
                    label: lane.label.clone(),
                    pid: lane.pid(),
                    reason: format!(
                        "did not become ready within {timeout:?} (startup deadline exceeded{})",
                        if others > 0 {
                            format!("; {others} other child(ren) were not ready either")
                        } else {
                            String::new()
                        }
                    ),
                });
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }

    /// The execution mode.
    pub fn mode(&self) -> ExecMode {
        self.mode
    }

    /// The number of children (0 after [`Children::shutdown`]).
    pub fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Whether there are no children.
    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }

    /// Lane `i`.
    ///
    /// # Panics
    /// If `i >= self.len()` (like slice indexing); see [`Children::get`].
    pub fn lane(&mut self, i: usize) -> &mut Lane {
        let n = self.lanes.len();
        self.lanes
            .get_mut(i)
            .unwrap_or_else(|| panic!("lane index {i} out of range: there are {n} lanes"))
    }

    /// Lane `i`, if it exists.
    pub fn get(&mut self, i: usize) -> Option<&mut Lane> {
        self.lanes.get_mut(i)
    }

    /// Every lane.
    pub fn lanes_mut(&mut self) -> &mut [Lane] {
        &mut self.lanes
    }

    /// Every lane (read-only).
    pub fn lanes(&self) -> &[Lane] {
        &self.lanes
    }

    /// Takes every lane out, e.g. for a scheduler that wraps each in an endpoint of its
    /// own; the children keep running. Give them back with [`Children::from_lanes`] to
    /// shut them down together (nothing shuts them down otherwise).
    pub fn into_lanes(mut self) -> Vec<Lane> {
        std::mem::take(&mut self.lanes)
    }

    /// The children behind `lanes` (taken out with [`Children::into_lanes`], in lane
    /// order), spawned in `mode`: shutting down and dropping work as for the original.
    pub fn from_lanes(mode: ExecMode, lanes: Vec<Lane>) -> Children {
        Children {
            mode,
            lanes,
            report: None,
            reap_fault: false,
        }
    }

    /// The pids of the child processes (empty in threads mode).
    pub fn pids(&self) -> Vec<i32> {
        self.lanes.iter().filter_map(|l| l.pid()).collect()
    }

    /// Whether [`Children::shutdown`] ran.
    pub fn is_shut_down(&self) -> bool {
        self.report.is_some()
    }

    /// Shuts every child down and reaps it.
    ///
    /// 1. Requests shutdown on every mailbox (sticky word, then `SHUTDOWN`, waking a
    ///    parked child). A child finishes the task it is running, fails the frames it
    ///    still owns with `SHUT_DOWN`, drops its handler and exits 0.
    /// 2. Polls (`waitpid(WNOHANG)` / thread finished) every ≤ 1 ms until all ended or
    ///    `grace` passed.
    /// 3. `SIGKILL`s the process group of every surviving process (the child and what it
    ///    left in its group; its own children die by their parent-death signal) and reaps
    ///    them. Surviving threads cannot be killed: they are detached (reported with
    ///    `end: None`).
    /// 4. Drops the lanes and their mailboxes (only now, after reaping).
    ///
    /// A signal only ever reaches a child that has not been reaped (through its pidfd
    /// where the kernel has them, see [`strata_mailbox::ChildProcess::kill`]), never a
    /// later process that reused its pid.
    ///
    /// Idempotent once every child was reaped: a later call returns the first report.
    /// A call that left processes unreaped keeps them: the next call (and the drop)
    /// kills and reaps them again, updating the report. Also run on drop.
    ///
    /// # Errors
    /// [`HostError::Reap`] if a killed process could not be reaped within 10 s (the
    /// report is still recorded). Abnormal exits are *not* errors here: they are in the
    /// report ([`ShutdownReport::into_result`] turns them into one).
    pub fn shutdown(&mut self, grace: Duration) -> Result<ShutdownReport, HostError> {
        if let Some(r) = &self.report {
            if self.lanes.is_empty() {
                return Ok(r.clone());
            }
            // An earlier call could not reap these: try again.
            let mut killed = vec![false; self.lanes.len()];
            self.kill_and_reap(&mut killed, KILL_REAP_BOUND);
            return self.finish_shutdown(None, &killed);
        }
        let dead_before: Vec<bool> = self.lanes.iter().map(|l| l.is_dead()).collect();
        for lane in &mut self.lanes {
            lane.parent.request_shutdown();
        }
        let fault = std::mem::take(&mut self.reap_fault);
        // A grace past what an `Instant` holds waits as long as the children take.
        let deadline = Instant::now().checked_add(grace);
        if !fault {
            poll_until_ended(&mut self.lanes, deadline);
        }
        let mut killed = vec![false; self.lanes.len()];
        let bound = if fault {
            Duration::ZERO
        } else {
            KILL_REAP_BOUND
        };
        self.kill_and_reap(&mut killed, bound);
        self.finish_shutdown(Some(&dead_before), &killed)
    }

    /// `SIGKILL`s every process child not known to have ended (marking it in `killed`)
    /// and polls them all for up to `bound`.
    fn kill_and_reap(&mut self, killed: &mut [bool], bound: Duration) {
        for (i, lane) in self.lanes.iter().enumerate() {
            if let (Watch::Process(p), None) = (&lane.watch, lane.watch.end()) {
                // Never a reaped child: the watch refuses to signal one (its pid may be
                // reused), and through its pidfd where the kernel has them. An unreaped
                // child still holds its pid and its group id, so the group kill reaches
                // only what it left in its group; its own strata children die by their
                // parent-death signal.
                p.kill(libc::SIGKILL);
                kill_group(p.pid());
                killed[i] = true;
            }
        }
        if killed.iter().any(|&k| k) && !bound.is_zero() {
            poll_until_ended(&mut self.lanes, Instant::now().checked_add(bound));
        }
    }

    /// Records the report (the first time, from `dead_before`; on a retry, updating the
    /// entries of the lanes retried) and releases every lane whose child ended; the
    /// lanes of unreaped processes are kept for the next call.
    fn finish_shutdown(
        &mut self,
        dead_before: Option<&[bool]>,
        killed: &[bool],
    ) -> Result<ShutdownReport, HostError> {
        let mut unreaped = Vec::new();
        let mut report = self.report.take().unwrap_or_default();
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            let end = lane.watch.end();
            if end.is_none() {
                match &mut lane.watch {
                    Watch::Process(_) => unreaped.push(who(&lane.label, &lane.pid())),
                    Watch::Thread { handle, .. } => {
                        // Detach: a thread cannot be killed. It still holds its own
                        // mapping of the mailbox and leaves once its task returns.
                        drop(handle.take());
                    }
                }
            }
            match dead_before {
                Some(dead) => report.children.push(ChildReport {
                    index: lane.index,
                    label: lane.label.clone(),
                    pid: lane.pid(),
                    end,
                    killed: killed[i],
                    died_before_shutdown: dead[i],
                }),
                None => {
                    if let Some(c) = report.children.iter_mut().find(|c| c.index == lane.index) {
                        c.end = end;
                        c.killed |= killed[i];
                    }
                }
            }
        }
        self.report = Some(report.clone());
        if unreaped.is_empty() {
            self.lanes.clear();
            Ok(report)
        } else {
            // Keep the lanes (and their watches) of unreaped children: dropping them
            // would lose the pids, and the next call retries them. Everything else is
            // released.
            self.lanes.retain(|l| l.pid().is_some() && !l.is_dead());
            Err(HostError::Reap {
                what: unreaped.join(", "),
                hint: "the process ignored SIGKILL for 10 s (uninterruptible sleep?); check it with `ps -o stat,wchan -p <pid>`",
            })
        }
    }

    /// Test hook: the next [`Children::shutdown`] sees every wait for a process child
    /// fail (as if `waitpid` kept failing), so it kills the processes but reaps none and
    /// returns [`HostError::Reap`] at once; the call after it must reap them.
    #[doc(hidden)]
    pub fn inject_reap_failure(&mut self) {
        self.reap_fault = true;
    }
}

/// Polls every lane's liveness (reaping/joining what ended) until all ended or
/// `deadline` passes (`None`: until all ended); naps grow from 20 µs to 1 ms.
fn poll_until_ended(lanes: &mut [Lane], deadline: Option<Instant>) {
    let mut nap = Duration::from_micros(20);
    loop {
        let mut alive = 0;
        for lane in lanes.iter_mut() {
            if lane.watch.end().is_none() {
                match lane.watch.poll() {
                    Ok(None) => alive += 1,
                    Ok(Some(_)) => {}
                    // waitpid failed with something other than ECHILD/EINTR; treat the
                    // child as alive (it will be SIGKILLed and polled again).
                    Err(_) => alive += 1,
                }
            }
        }
        if alive == 0 || deadline.is_some_and(|d| Instant::now() >= d) {
            return;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(1));
    }
}

impl Drop for Children {
    /// Shuts down, or retries the reaps an earlier shutdown could not finish.
    fn drop(&mut self) {
        if self.report.is_none() || !self.lanes.is_empty() {
            let _ = self.shutdown(DROP_GRACE);
        }
    }
}

// -------------------------------------------------------------------------------------
// The child side
// -------------------------------------------------------------------------------------

/// Ties a freshly forked child to its parent and cuts it off from its siblings, before
/// it runs anything else:
///
/// 1. `PR_SET_PDEATHSIG(SIGKILL)`: the kernel kills the child when the parent thread that
///    forked it exits — busy or idle, so a child stuck in a task cannot outlive its
///    parent (an idle child would notice through `getppid()`; a busy one never looks).
///    Every level sets it, so a killed level-3 child takes its own children with it.
/// 2. Re-checks `getppid()` against the pid the parent recorded before `fork`: a parent
///    that died before step 1 sends no signal; the child then leaves at once (exit 0,
///    as an idle orphan does).
/// 3. `setpgid(0, 0)`: the child leads a process group of its own, which the parent kills
///    when it reaps the child, so whatever the child started (and left in that group)
///    dies too.
/// 4. Unmaps and closes every mailbox but its own ([`release_foreign_mailboxes`]).
///
/// Returns why the child cannot start (reported as `INIT_FAILED`).
fn isolate_child(parent_pid: u32, own: &Mailbox) -> Result<(), String> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
        return Err(format!(
            "prctl(PR_SET_PDEATHSIG): {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } as u32 != parent_pid {
        // SAFETY: the parent is gone; leave without touching the state we inherited.
        unsafe { libc::_exit(exit_codes::OK) }
    }
    // SAFETY: setpgid(0, 0) only moves this process into a new group it leads. It fails
    // only for a session leader (impossible right after fork); the parent sets it too.
    unsafe { libc::setpgid(0, 0) };
    // SAFETY: this forked child never uses or drops the other mailboxes it inherited (its
    // copies of the parent's lanes and of the siblings' mailboxes): it never returns into
    // the parent's frames and leaves through `_exit`.
    unsafe { release_foreign_mailboxes(own) }
        .map(|_| ())
        .map_err(|e| format!("could not drop the other children's mailboxes: {e}"))
}

/// The body of a forked child: never returns.
fn child_process(
    program: Box<dyn ChildProgram>,
    env: ChildEnv,
    mailbox: Mailbox,
    serve: ServeOptions,
    flush_stdio: bool,
) -> ! {
    let isolated = isolate_child(env.parent_pid, &mailbox);
    for var in ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"] {
        if std::env::var_os(var).is_none() {
            std::env::set_var(var, "1");
        }
    }
    let code = catch_unwind(AssertUnwindSafe(|| {
        run_child(program, env, mailbox, serve, isolated)
    }))
    .unwrap_or(exit_codes::PANICKED);
    if flush_stdio {
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
    }
    // SAFETY: `_exit` ends the process at once, without running the destructors and
    // atexit handlers of the parent's state this child inherited (which it does not own).
    unsafe { libc::_exit(code) }
}

/// The child's life, shared by both modes: start, report readiness, serve, drop the
/// handler. Returns the exit code. `setup` is the outcome of the process-mode setup
/// ([`isolate_child`]); an error is reported as `INIT_FAILED` without starting.
fn run_child(
    program: Box<dyn ChildProgram>,
    env: ChildEnv,
    mailbox: Mailbox,
    serve: ServeOptions,
    setup: Result<(), String>,
) -> i32 {
    let mut child = Child::with_parent(mailbox, env.parent_pid).with_options(serve);
    if let Err(message) = setup {
        let _ = child.init_failed(&FailureReport::new(INIT_FAILED_CODE, message));
        return exit_codes::START_FAILED;
    }
    let mut handler = match catch_unwind(AssertUnwindSafe(|| program.start(&env))) {
        Ok(Ok(h)) => h,
        Ok(Err(message)) => {
            let _ = child.init_failed(&FailureReport::new(INIT_FAILED_CODE, message));
            return exit_codes::START_FAILED;
        }
        Err(payload) => {
            let message = format!("panicked: {}", panic_message(&*payload));
            let _ = child.init_failed(&FailureReport::new(INIT_FAILED_CODE, message));
            return exit_codes::START_PANICKED;
        }
    };
    let served = match child.init_ready(env.ready_info()) {
        Ok(()) => child.serve(&mut *handler).map(|_| ()),
        // Shut down before we were ready: leave quietly.
        Err(MailboxError::ShutdownRequested) => Ok(()),
        Err(e) => Err(e),
    };
    let dropped = catch_unwind(AssertUnwindSafe(move || {
        drop::<Box<dyn Handler + Send>>(handler)
    }));
    match served {
        Ok(()) if dropped.is_ok() => exit_codes::OK,
        Ok(()) => exit_codes::DROP_PANICKED,
        Err(e) => {
            eprintln!("strata-host: {}: mailbox protocol error: {e}", env.label);
            exit_codes::PROTOCOL_ERROR
        }
    }
}
