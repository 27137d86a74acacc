//! The emulated AICPU scheduler: one thread that claims READY tasks from the graph, places
//! their (block × subtask) invocations on cores through the dispatch rings, collects
//! completions, completes tasks in the graph (which readies or poisons consumers), and
//! takes stuck cores out of service. Where blocks go is `placement.rs`; taking stuck cores
//! out of service is `health.rs`.

use crate::aicore::kernels::RunEnv;
use crate::aicore::link::{CoreLink, CoreMsg};
use crate::error::{codes, ChipError};
use crate::task::{Meta, Shape, TaskDesc};
use crate::trace::swimlane::SwimRecord;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_graph::{Failure, FailureKind, ReadyTask, Scheduler, TaskRef};
use strata_sync::{Broken, Driven, DriverSeat, Idle, Queue, Spin, ThreadBell, Turn};

mod health;
mod placement;
mod snapshot;

pub(crate) use placement::Topology;

/// Messages to the scheduler thread (from the orchestrator thread and the host).
pub(crate) enum SchedMsg {
    /// A task that was READY at submit.
    Ready(TaskRef),
    /// A run starts. The orchestrator sends it just before the run's first task, so a run
    /// that gives the scheduler no task costs it nothing (no message, no wake-up).
    Begin(RunCtl),
    /// Shut down (after sending EXIT to every core).
    Exit,
}

/// Per-run scheduler settings.
#[derive(Clone)]
pub(crate) struct RunCtl {
    pub(crate) timing: bool,
    pub(crate) timeout: Duration,
    pub(crate) env: Arc<RunEnv>,
}

/// The scheduler's view of one run.
#[derive(Debug, Default)]
pub(crate) struct SchedReport {
    /// The run this reports on.
    pub(crate) run: u64,
    pub(crate) swimlane: Vec<SwimRecord>,
    /// ns since the chip epoch of the first dispatch and last completion (0 if none).
    pub(crate) first_ns: u64,
    pub(crate) last_ns: u64,
    pub(crate) dispatches: u64,
    /// Typed errors of failed tasks, with the graph failure they were recorded as.
    pub(crate) errors: Vec<(Failure, ChipError)>,
    /// Notes about cores taken out of (or returned to) service.
    pub(crate) notes: Vec<String>,
}

/// State shared with the other threads.
pub(crate) struct SchedShared {
    pub(crate) incoming: Queue<SchedMsg>,
    /// Finished task payloads on their way back to the orchestrator for reuse.
    pub(crate) recycled: std::sync::Mutex<Vec<Arc<TaskDesc>>>,
    pub(crate) recycled_pending: AtomicBool,
    pub(crate) bell: Arc<ThreadBell>,
    /// Cores taken out of service (with `completed`, a liveness counter for the host's
    /// watchdog).
    pub(crate) progress: AtomicU64,
    /// Tasks completed by the scheduler (for the orchestrator's submission throttle).
    pub(crate) completed: AtomicU64,
    /// The orchestrator wants to be woken once `completed` reaches this (`u64::MAX`: no).
    pub(crate) orch_wake_at: AtomicU64,
    /// The orchestrator thread's doorbell.
    pub(crate) orch_bell: ThreadBell,
    /// Per core: taken out of service by a timeout.
    pub(crate) lost: Vec<AtomicBool>,
    /// Kernels abandoned after their timeout so far (the host quarantines the memory of
    /// a run that abandoned one).
    pub(crate) abandoned: AtomicU64,
    /// The device byte ranges `[start, end)` that abandoned kernels still running may
    /// touch (their task's arguments), with the core each runs on; a core's entries are
    /// removed when its kernel returns.
    pub(crate) abandoned_ranges: std::sync::Mutex<Vec<(u32, u64, u64)>>,
}

impl SchedShared {
    pub(crate) fn new(cores: usize) -> Self {
        SchedShared {
            incoming: Queue::new(INCOMING),
            recycled: std::sync::Mutex::new(Vec::new()),
            recycled_pending: AtomicBool::new(false),
            bell: Arc::new(ThreadBell::default()),
            progress: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            orch_wake_at: AtomicU64::new(u64::MAX),
            orch_bell: ThreadBell::default(),
            lost: (0..cores).map(|_| AtomicBool::new(false)).collect(),
            abandoned: AtomicU64::new(0),
            abandoned_ranges: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Whether a kernel abandoned after its timeout may still be running (a core is out
    /// of service until its kernel returns).
    pub(crate) fn abandoned_kernels_may_run(&self) -> bool {
        self.lost.iter().any(|l| l.load(Ordering::Acquire))
    }

    /// A number that grows whenever the scheduler makes progress (a task or block finished,
    /// a core was given up): what the stall watchdogs sample.
    pub(crate) fn progress_mark(&self) -> u64 {
        self.progress.load(Ordering::Relaxed) + self.completed.load(Ordering::Relaxed)
    }

    /// Queues a message without waking the scheduler (for a message that the next rung
    /// one follows, such as `Begin` before a run's first `Ready`).
    pub(crate) fn post_quiet(&self, m: SchedMsg) {
        strata_sync::push_retry(m, |m| self.incoming.push(m), || self.bell.ring());
    }

    /// Sends a message (waiting while the bounded queue is full: the scheduler drains it
    /// on every loop iteration).
    pub(crate) fn send(&self, m: SchedMsg) {
        strata_sync::push_retry(m, |m| self.incoming.push(m), || self.bell.ring());
        self.bell.ring();
    }
}

/// The payload of an outstanding dispatch, without a reference count: the `Arc` travels
/// to the core in the dispatch and comes back in its completion, so it is alive for as
/// long as the dispatch is outstanding (what [`Sched::lose_core`] relies on to read an
/// abandoned kernel's arguments). Never dereferenced once its completion was taken.
#[derive(Clone, Copy)]
pub(super) struct DescPtr(std::ptr::NonNull<TaskDesc>);

// SAFETY: a `DescPtr` is only dereferenced (for shared reads of a `Sync` payload) by the
// scheduler while the dispatch it belongs to is outstanding, when the payload is alive.
unsafe impl Send for DescPtr {}

impl DescPtr {
    pub(super) fn of(desc: &Arc<TaskDesc>) -> Self {
        DescPtr(std::ptr::NonNull::from(&**desc))
    }
}

struct Out {
    seq: u64,
    /// The task's payload (see [`DescPtr`]).
    desc: DescPtr,
    task: TaskRef,
    block: u32,
    lane: u8,
    meta: Meta,
    abandoned: bool,
}

struct CoreState {
    outstanding: VecDeque<Out>,
    next_seq: u64,
    lost: bool,
    completed: u64,
    checked_completed: u64,
    busy_since: Option<Instant>,
}

struct ReadyEntry {
    task: TaskRef,
    desc: Arc<TaskDesc>,
    meta: Meta,
    next_block: u32,
}

struct Retry {
    task: TaskRef,
    desc: Arc<TaskDesc>,
    meta: Meta,
    block: u32,
    lane: u8,
    sub_block_id: u32,
}

struct InFlight {
    task: TaskRef,
    remaining: u32,
    failure: Option<Failure>,
}

/// Capacity of the scheduler's incoming queue.
const INCOMING: usize = 8192;
/// Payloads handed back to the orchestrator per batch.
const RECYCLE_BATCH: usize = 64;
/// Most payloads kept for reuse.
const RECYCLE_MAX: usize = 16384;

/// How often (in busy loop iterations) the scheduler checks for stuck cores.
const TIMEOUT_CHECK_EVERY: u32 = 4096;

/// What one pass of the scheduler loop found.
pub(crate) enum Step {
    /// It did something: go on at once.
    Busy,
    /// Nothing to do: wait for completions or messages (`spin_only`: a task is about to be
    /// armed, do not park), waking after `timeout` to check for stuck cores.
    Idle {
        timeout: Option<Duration>,
        spin_only: bool,
    },
    /// The scheduler handled `Exit`.
    Exit,
}

/// A driver that stepped this long without progress hands the loop back to the scheduler
/// thread (a kernel is running: the CPU is better left to it).
const DRIVE_SPIN: Duration = Duration::from_micros(50);
/// How long the scheduler thread parks at a time while a caller drives.
const DRIVEN_SLICE: Duration = Duration::from_millis(1);

/// How often a caller waiting for a run whose loop was handed back checks whether the
/// loop broke (a pass panicked), so the run fails with the panic instead of waiting for
/// its stall budget.
pub(crate) const BROKEN_CHECK: Duration = Duration::from_millis(10);

/// The scheduler, stepped by the scheduler thread — or, while a caller waits for its run,
/// by that caller ("caller-runs", as the level-3 engine does, through the same
/// [`DriverSeat`]): the waiting thread completes and dispatches the run's tasks itself and
/// the scheduler thread parks, so a short run hands over between two threads (caller and
/// core) instead of three or four, which matters on machines with no more cores than
/// spinning threads. A pass that panics (an internal error), on either thread, breaks the
/// loop: nobody steps the half-updated state again, and waiting runs fail naming the panic.
pub(crate) struct SchedCell {
    seat: DriverSeat<Sched>,
    shared: Arc<SchedShared>,
}

impl SchedCell {
    pub(crate) fn new(sched: Sched) -> Arc<SchedCell> {
        Arc::new(SchedCell {
            shared: sched.shared.clone(),
            seat: DriverSeat::new(sched),
        })
    }

    /// The scheduler's part of the report of run `run` (call it once the run is done);
    /// empty if the loop broke.
    pub(crate) fn take_report(&self, run: u64) -> SchedReport {
        match self.seat.with(|s| s.take_report(run)) {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => SchedReport::default(),
        }
    }

    /// The scheduler's wait-for snapshot now (running kernels, their signal waits, tasks
    /// not started), headed by `stalled`; `None` if the loop is broken or gone.
    pub(crate) fn wait_for(&self, stalled: String) -> Option<strata_types::WaitFor> {
        self.seat.with(|s| s.wait_for(stalled, None)).ok().flatten()
    }

    /// Why the loop is broken (a pass panicked), if it is.
    pub(crate) fn broken(&self) -> Option<Broken> {
        self.seat.broken()
    }

    /// The scheduler thread's loop.
    pub(crate) fn thread_main(&self) {
        self.seat.register_loop_thread();
        let shared = &self.shared;
        shared.bell.register_current();
        // The scheduler spins (about 20 µs) but does not yield-spin: with kernels running it
        // would take a CPU from them, and their pending slots hide its wake-up latency.
        let mut idle = Idle::new(Duration::ZERO);
        let mut iter: u32 = 0;
        let mut watch: Vec<Arc<CoreLink>> = Vec::new();
        loop {
            if self.seat.park_while_driven(DRIVEN_SLICE) {
                idle.reset();
                continue;
            }
            let pass = self.seat.pass(|s| {
                let step = s.step(&mut iter);
                if let Step::Idle {
                    spin_only: false, ..
                } = step
                {
                    watch.clear();
                    watch.extend(s.busy.iter().map(|&c| s.links[c as usize].clone()));
                }
                step
            });
            // A broken loop (a pass panicked here or on a caller) is over for everyone.
            let Ok(Some(step)) = pass else {
                return;
            };
            match step {
                Step::Exit => return,
                Step::Busy => idle.reset(),
                Step::Idle {
                    spin_only: true, ..
                } => std::thread::yield_now(),
                Step::Idle { timeout, .. } => {
                    idle.step(&shared.bell, timeout, || {
                        !shared.incoming.is_empty()
                            || self.seat.is_driven()
                            || watch.iter().any(|l| !l.completions.is_empty())
                    });
                }
            }
        }
    }

    /// Drives the loop on the calling thread until `done()` returns a value, or until it
    /// made no progress for [`DRIVE_SPIN`] (then the scheduler thread takes over and the
    /// caller should block). A pass that panics is caught on the caller's thread and
    /// breaks the loop for everyone ([`Driven::Broken`]).
    pub(crate) fn drive<R>(&self, done: impl FnMut() -> Option<R>) -> Driven<R> {
        let mut iter: u32 = 0;
        // Pause-only: the caller would otherwise take a CPU from the kernels it waits for.
        let mut quiet = Spin::new(DRIVE_SPIN).without_yield();
        self.seat.drive(done, |s| match s.step(&mut iter) {
            Step::Busy => {
                quiet.reset();
                Turn::Again
            }
            Step::Exit => Turn::Over,
            Step::Idle { .. } => {
                if quiet.spin() {
                    Turn::Again
                } else {
                    Turn::HandBack
                }
            }
        })
    }
}

pub(crate) struct Sched {
    graph: Scheduler<Arc<TaskDesc>>,
    shared: Arc<SchedShared>,
    links: Vec<Arc<CoreLink>>,
    topo: Topology,
    cores: Vec<CoreState>,
    q_aic: VecDeque<ReadyEntry>,
    q_aiv: VecDeque<ReadyEntry>,
    q_mix: VecDeque<ReadyEntry>,
    retry: VecDeque<Retry>,
    unarmed: Vec<(TaskRef, Arc<TaskDesc>, Meta)>,
    /// Payloads of completed dispatches, dropped when the scheduler is idle (freeing
    /// them is off the dispatch path).
    graveyard: Vec<Arc<TaskDesc>>,
    inflight: Vec<Option<InFlight>>,
    newly: Vec<ReadyTask>,
    busy: Vec<u32>,
    ctl: RunCtl,
    report: SchedReport,
    /// `Exit` was handled: the loop is over.
    exited: bool,
}

impl Sched {
    pub(crate) fn new(
        graph: Scheduler<Arc<TaskDesc>>,
        shared: Arc<SchedShared>,
        links: Vec<Arc<CoreLink>>,
        topo: Topology,
        timeout: Duration,
        env: Arc<RunEnv>,
    ) -> Self {
        let n = links.len();
        Sched {
            graph,
            shared,
            links,
            topo,
            cores: (0..n)
                .map(|_| CoreState {
                    outstanding: VecDeque::with_capacity(2),
                    next_seq: 1,
                    lost: false,
                    completed: 0,
                    checked_completed: 0,
                    busy_since: None,
                })
                .collect(),
            q_aic: VecDeque::new(),
            q_aiv: VecDeque::new(),
            q_mix: VecDeque::new(),
            retry: VecDeque::new(),
            unarmed: Vec::new(),
            graveyard: Vec::new(),
            inflight: Vec::new(),
            newly: Vec::new(),
            busy: Vec::new(),
            ctl: RunCtl {
                timing: false,
                timeout,
                env,
            },
            report: SchedReport::default(),
            exited: false,
        }
    }

    fn now_ns(&self) -> u64 {
        strata_sync::mono_ns()
    }

    /// One pass of the scheduler loop: completions, messages, arming, dispatch, timeout
    /// checks. Whoever holds the [`SchedCell`] runs it: the scheduler thread, or a caller
    /// that waits for its run ([`SchedCell::drive`]).
    pub(crate) fn step(&mut self, iter: &mut u32) -> Step {
        if self.exited {
            return Step::Exit;
        }
        let mut did = self.poll_completions();
        while let Some(m) = self.shared.incoming.pop() {
            did = true;
            match m {
                SchedMsg::Ready(t) => self.accept(t),
                SchedMsg::Begin(ctl) => {
                    self.ctl = ctl;
                    self.report = SchedReport::default();
                }
                SchedMsg::Exit => {
                    self.shutdown();
                    self.exited = true;
                    return Step::Exit;
                }
            }
        }
        if !self.unarmed.is_empty() {
            did |= self.check_unarmed();
        }
        did |= self.dispatch();
        *iter = iter.wrapping_add(if did { 1 } else { 64 });
        if !self.busy.is_empty() && *iter % TIMEOUT_CHECK_EVERY < 64 {
            self.check_timeouts();
        }
        if self.graveyard.len() >= RECYCLE_BATCH {
            self.recycle();
        }
        if did {
            return Step::Busy;
        }
        self.recycle();
        self.graph.flush();
        // With tasks waiting to be armed, keep spinning (arming takes nanoseconds); with
        // kernels running, wake up to check for stuck cores.
        if !self.unarmed.is_empty() {
            return Step::Idle {
                timeout: None,
                spin_only: true,
            };
        }
        let timeout = (!self.busy.is_empty()).then(|| {
            (self.ctl.timeout / 8).clamp(Duration::from_millis(1), Duration::from_millis(100))
        });
        Step::Idle {
            timeout,
            spin_only: false,
        }
    }

    /// The scheduler's part of the report of run `run` (call it once the run is done).
    pub(crate) fn take_report(&mut self, run: u64) -> SchedReport {
        self.graph.flush();
        let mut r = std::mem::take(&mut self.report);
        r.run = run;
        r
    }

    /// Hands finished payloads back to the orchestrator (who reuses their allocations).
    fn recycle(&mut self) {
        if self.graveyard.is_empty() {
            return;
        }
        let mut pool = self
            .shared
            .recycled
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if pool.len() < RECYCLE_MAX {
            pool.append(&mut self.graveyard);
        }
        drop(pool);
        self.graveyard.clear();
        self.shared.recycled_pending.store(true, Ordering::Release);
    }

    fn shutdown(&mut self) {
        for l in &self.links {
            let _ = l.dispatch.push(CoreMsg::Exit);
            l.bell.unpark();
        }
        self.graph.flush();
    }

    // ----- intake ------------------------------------------------------------------------

    fn accept(&mut self, t: TaskRef) {
        let Some(c) = self.graph.claim(t) else {
            return; // poisoned or cancelled meanwhile
        };
        let meta = Meta::decode(c.route);
        let desc = c.payload;
        if meta.needs_arm && !desc.is_armed() {
            self.unarmed.push((t, desc, meta));
            return;
        }
        self.route(t, desc, meta);
    }

    fn check_unarmed(&mut self) -> bool {
        let mut did = false;
        let mut i = 0;
        while i < self.unarmed.len() {
            if self.unarmed[i].1.is_armed() {
                let (t, d, m) = self.unarmed.swap_remove(i);
                self.route(t, d, m);
                did = true;
            } else {
                i += 1;
            }
        }
        did
    }

    fn route(&mut self, t: TaskRef, desc: Arc<TaskDesc>, meta: Meta) {
        let total = meta.total_subtasks();
        if total > 1 {
            let i = t.slot_index() as usize;
            if self.inflight.len() <= i {
                self.inflight.resize_with(i + 1, || None);
            }
            self.inflight[i] = Some(InFlight {
                task: t,
                remaining: total,
                failure: None,
            });
        }
        let e = ReadyEntry {
            task: t,
            desc,
            meta,
            next_block: 0,
        };
        match meta.shape {
            Shape::Dummy => {
                self.graveyard.push(e.desc);
                self.complete_task(t, Ok(()));
            }
            Shape::Aic => self.q_aic.push_back(e),
            Shape::Aiv => self.q_aiv.push_back(e),
            Shape::Mix(_) => self.q_mix.push_back(e),
        }
    }

    fn complete_task(&mut self, t: TaskRef, outcome: Result<(), Failure>) {
        let mut newly = std::mem::take(&mut self.newly);
        if let Err(e) = self.graph.complete(t, outcome, &mut newly) {
            self.report
                .notes
                .push(format!("internal: completing {t} failed: {e}"));
        }
        let done = self.shared.completed.fetch_add(1, Ordering::SeqCst) + 1;
        if done >= self.shared.orch_wake_at.load(Ordering::SeqCst) {
            self.shared.orch_bell.unpark();
        }
        for r in newly.drain(..) {
            self.accept(r.task);
        }
        self.newly = newly;
    }

    /// `n` kernel invocations of `t` (which has `total`) finished or were given up on.
    fn subtask_done(&mut self, t: TaskRef, total: u32, failure: Option<Failure>, n: u32) {
        if total <= 1 {
            self.complete_task(t, failure.map_or(Ok(()), Err));
            return;
        }
        let i = t.slot_index() as usize;
        let Some(Some(f)) = self.inflight.get_mut(i) else {
            return;
        };
        if f.task != t {
            return;
        }
        if f.failure.is_none() {
            f.failure = failure;
        }
        f.remaining = f.remaining.saturating_sub(n);
        if f.remaining == 0 {
            let f = self.inflight[i].take().expect("checked above");
            self.complete_task(t, f.failure.map_or(Ok(()), Err));
        } else {
            // A finished block is progress too: a task of many blocks may run far longer
            // than the stall budget of whoever waits for the run.
            self.shared.progress.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn failed_already(&self, t: TaskRef) -> bool {
        matches!(self.inflight.get(t.slot_index() as usize), Some(Some(f)) if f.task == t && f.failure.is_some())
    }

    fn record_error(&mut self, code: i32, err: ChipError) -> Failure {
        let f = Failure::with_code(FailureKind::Task, code, err.to_string());
        if self.report.errors.len() < 64 {
            self.report.errors.push((f.clone(), err));
        }
        f
    }

    // ----- completions -------------------------------------------------------------------

    fn poll_completions(&mut self) -> bool {
        let mut did = false;
        let mut k = 0;
        while k < self.busy.len() {
            let c = self.busy[k] as usize;
            while let Some(comp) = self.links[c].completions.pop() {
                did = true;
                let Some(out) = self.cores[c].outstanding.pop_front() else {
                    self.report.notes.push(format!(
                        "internal: core {c} reported a completion with nothing outstanding"
                    ));
                    continue;
                };
                debug_assert_eq!(out.seq, comp.seq);
                self.cores[c].completed += 1;
                let func = out.meta.funcs[out.lane as usize];
                if self.cores[c].lost && self.cores[c].outstanding.is_empty() {
                    self.cores[c].lost = false;
                    self.shared
                        .abandoned_ranges
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .retain(|&(core, _, _)| core as usize != c);
                    self.shared.lost[c].store(false, Ordering::Release);
                    let note = format!(
                        "core {c} finished its cancelled kernel {:?} and is back in service",
                        self.ctl.env.func_name(func)
                    );
                    self.report.notes.push(note);
                }
                if out.abandoned {
                    continue;
                }
                if self.ctl.timing {
                    let rec = SwimRecord {
                        core: c as u32,
                        core_type: self.topo.types[c],
                        task: out.task.id().0,
                        block: out.block,
                        lane: out.lane,
                        kernel: self.ctl.env.func_name(func).to_owned(),
                        start_ns: comp.start_ns,
                        end_ns: comp.end_ns,
                    };
                    self.report.swimlane.push(rec);
                }
                let failure = match comp.failure {
                    None => None,
                    Some(msg) => {
                        let kernel = self.ctl.env.func_name(func).to_owned();
                        // A kernel that gave up a signal wait stalled the run: say what
                        // everything was waiting for.
                        let wait_for = self.links[c].signal.read(out.seq).filter(|n| n.gave_up).map(|n| {
                            let stalled = format!(
                                "kernel {kernel:?} (task {}) on core {c} gave up waiting for signal cell {}",
                                out.task.id().0,
                                n.cell
                            );
                            let gave_up = strata_types::SignalWait {
                                task: out.task.id().0,
                                core: c as u32,
                                rank: n.rank,
                                cell: n.cell,
                                cmp: n.cmp.to_owned(),
                                expected: n.expected,
                                value: n.value,
                                gave_up: true,
                            };
                            Box::new(self.wait_for(stalled, Some(gave_up)))
                        });
                        let err = ChipError::KernelFailed {
                            kernel,
                            task: out.task.id().0,
                            block: out.block,
                            core: c as u32,
                            message: msg.into(),
                            wait_for,
                        };
                        Some(self.record_error(codes::KERNEL_FAILED, err))
                    }
                };
                self.graveyard.push(comp.desc);
                self.subtask_done(out.task, out.meta.total_subtasks(), failure, 1);
            }
            if self.cores[c].outstanding.is_empty() {
                self.cores[c].busy_since = None;
                self.busy.swap_remove(k);
            } else {
                k += 1;
            }
        }
        if did {
            self.report.last_ns = self.now_ns();
        }
        did
    }
}
