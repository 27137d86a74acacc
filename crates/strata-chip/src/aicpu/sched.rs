//! The emulated AICPU scheduler: one thread that claims READY tasks from the graph, places
//! their (block × subtask) invocations on cores through the dispatch rings, collects
//! completions, completes tasks in the graph (which readies or poisons consumers), and
//! takes stuck cores out of service.

use crate::aicore::kernels::RunEnv;
use crate::aicore::link::Dispatch;
use crate::aicore::link::{CoreLink, CoreMsg};
use crate::config::CoreType;
use crate::error::{codes, ChipError};
use crate::task::{Meta, Shape, TaskDesc};
use crate::trace::swimlane::SwimRecord;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_graph::{Failure, FailureKind, ReadyTask, Scheduler, TaskRef};
use strata_sync::sync::Ordering as SyncOrdering;
use strata_sync::{Broken, Driven, DriverSeat, Idle, Queue, Spin, ThreadBell, Turn};

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
        }
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

/// The core layout of a chip.
#[derive(Debug, Clone)]
pub(crate) struct Topology {
    pub(crate) types: Vec<CoreType>,
    /// AIV lane (0/1) of each core (0 for AIC).
    pub(crate) lane: Vec<u32>,
    pub(crate) aic: Vec<u32>,
    pub(crate) aiv: Vec<u32>,
    /// Per cluster: the core of each lane (AIC, AIV0, AIV1), if present.
    pub(crate) clusters: Vec<[Option<u32>; 3]>,
}

impl Topology {
    pub(crate) fn new(aic: u32, aiv: u32) -> Self {
        let mut t = Topology {
            types: Vec::new(),
            lane: Vec::new(),
            aic: Vec::new(),
            aiv: Vec::new(),
            clusters: Vec::new(),
        };
        for i in 0..aic {
            t.types.push(CoreType::Aic);
            t.lane.push(0);
            t.aic.push(i);
            t.clusters.push([Some(i), None, None]);
        }
        for j in 0..aiv {
            let id = aic + j;
            t.types.push(CoreType::Aiv);
            t.lane.push(j % 2);
            t.aiv.push(id);
            if let Some(c) = t.clusters.get_mut((j / 2) as usize) {
                c[1 + (j % 2) as usize] = Some(id);
            }
        }
        t
    }

    /// Cores (or clusters, for MIX) that can run one block of `shape`, counting only those
    /// `healthy` says are in service.
    pub(crate) fn capacity(&self, shape: Shape, mask: u8, healthy: impl Fn(u32) -> bool) -> u32 {
        match shape {
            Shape::Dummy => u32::MAX,
            Shape::Aic => self.aic.iter().filter(|&&c| healthy(c)).count() as u32,
            Shape::Aiv => self.aiv.iter().filter(|&&c| healthy(c)).count() as u32,
            Shape::Mix(_) => self
                .clusters
                .iter()
                .filter(|cl| (0..3).all(|l| mask & (1 << l) == 0 || cl[l].is_some_and(&healthy)))
                .count() as u32,
        }
    }
}

struct Out {
    seq: u64,
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
                        let err = ChipError::KernelFailed {
                            kernel: self.ctl.env.func_name(func).to_owned(),
                            task: out.task.id().0,
                            block: out.block,
                            core: c as u32,
                            message: msg.into(),
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

    // ----- dispatch ----------------------------------------------------------------------

    fn healthy(&self, c: u32) -> bool {
        !self.cores[c as usize].lost
    }

    /// Picks a core of `ty` with a free slot: idle awake cores first, then idle parked
    /// ones, then the pending slot of a busy core.
    fn pick_core(&self, ty: CoreType, idle_only: bool) -> Option<u32> {
        let list = match ty {
            CoreType::Aic => &self.topo.aic,
            CoreType::Aiv => &self.topo.aiv,
        };
        let mut best: Option<(u8, u32)> = None;
        for &c in list {
            let s = &self.cores[c as usize];
            if s.lost {
                continue;
            }
            let n = s.outstanding.len();
            if n >= 2 || (idle_only && n > 0) {
                continue;
            }
            let asleep = self.links[c as usize].bell.is_sleeping();
            let rank = (n as u8) * 2 + asleep as u8;
            if rank == 0 {
                return Some(c);
            }
            if best.is_none_or(|(r, _)| rank < r) {
                best = Some((rank, c));
            }
        }
        best.map(|(_, c)| c)
    }

    /// Picks a cluster where every lane of `mask` has a free slot (all idle preferred).
    fn pick_cluster(&self, mask: u8, idle_only: bool, exclude: &[usize]) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (i, cl) in self.topo.clusters.iter().enumerate() {
            if exclude.contains(&i) {
                continue;
            }
            let mut load = 0;
            let mut ok = true;
            for (l, core) in cl.iter().enumerate() {
                if mask & (1 << l) == 0 {
                    continue;
                }
                match core {
                    Some(c) if !self.cores[*c as usize].lost => {
                        let n = self.cores[*c as usize].outstanding.len();
                        if n >= 2 || (idle_only && n > 0) {
                            ok = false;
                        }
                        load += n;
                    }
                    _ => ok = false,
                }
            }
            if !ok {
                continue;
            }
            if load == 0 {
                return Some(i);
            }
            if best.is_none_or(|(b, _)| load < b) {
                best = Some((load, i));
            }
        }
        best.map(|(_, i)| i)
    }

    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        core: u32,
        task: TaskRef,
        desc: Arc<TaskDesc>,
        meta: &Meta,
        block: u32,
        lane: u8,
        sub_block_id: u32,
    ) {
        let c = core as usize;
        let s = &mut self.cores[c];
        let seq = s.next_seq;
        s.next_seq += 1;
        if s.outstanding.is_empty() {
            self.busy.push(core);
        }
        s.outstanding.push_back(Out {
            seq,
            task,
            block,
            lane,
            meta: *meta,
            abandoned: false,
        });
        let d = Dispatch {
            seq,
            task_id: task.id().0,
            epoch: self.ctl.env.epoch,
            desc,
            block,
            lane,
            func: meta.funcs[lane as usize].unwrap_or(u32::MAX),
            sub_block_id,
            timing: self.ctl.timing,
        };
        if self.report.dispatches == 0 {
            self.report.first_ns = self.now_ns();
        }
        self.report.dispatches += 1;
        if self.links[c].dispatch.push(CoreMsg::Run(d)).is_err() {
            // Cannot happen: at most two dispatches are outstanding per core.
            self.report
                .notes
                .push(format!("internal: dispatch ring of core {c} full"));
        }
        self.links[c].bell.ring();
    }

    /// Sends block `block` of `e` to cluster `cl` (MIX) or core `core` (AIC/AIV).
    fn send_block(
        &mut self,
        task: TaskRef,
        desc: &Arc<TaskDesc>,
        meta: &Meta,
        block: u32,
        place: Place,
    ) {
        match place {
            Place::Core(core) => {
                let (lane, sub) = match meta.shape {
                    Shape::Aic => (0, 0),
                    _ => (1, self.topo.lane[core as usize]),
                };
                self.send(core, task, desc.clone(), meta, block, lane, sub);
            }
            Place::Cluster(cl) => {
                let mask = meta.mask();
                for l in 0..3u8 {
                    if mask & (1 << l) == 0 {
                        continue;
                    }
                    let core =
                        self.topo.clusters[cl][l as usize].expect("picked cluster has the lane");
                    let sub = if l == 0 { 0 } else { (l - 1) as u32 };
                    self.send(core, task, desc.clone(), meta, block, l, sub);
                }
            }
        }
    }

    /// Like [`Sched::send_block`], moving the payload into the last dispatch.
    fn send_last(
        &mut self,
        task: TaskRef,
        desc: Arc<TaskDesc>,
        meta: &Meta,
        block: u32,
        place: Place,
    ) {
        match (place, meta.shape) {
            (Place::Core(core), Shape::Aic) => self.send(core, task, desc, meta, block, 0, 0),
            (Place::Core(core), _) => {
                let sub = self.topo.lane[core as usize];
                self.send(core, task, desc, meta, block, 1, sub)
            }
            (Place::Cluster(_), _) => self.send_block(task, &desc, meta, block, place),
        }
    }

    fn place_for(&self, shape: Shape, mask: u8, idle_only: bool, taken: &[usize]) -> Option<Place> {
        match shape {
            Shape::Aic => self.pick_core(CoreType::Aic, idle_only).map(Place::Core),
            Shape::Aiv => self.pick_core(CoreType::Aiv, idle_only).map(Place::Core),
            Shape::Mix(_) => self
                .pick_cluster(mask, idle_only, taken)
                .map(Place::Cluster),
            Shape::Dummy => None,
        }
    }

    fn dispatch(&mut self) -> bool {
        let mut did = false;
        while let Some(r) = self.retry.front() {
            let ty = if r.lane == 0 {
                CoreType::Aic
            } else {
                CoreType::Aiv
            };
            let Some(core) = self.pick_core(ty, false) else {
                break;
            };
            let r = self.retry.pop_front().expect("front exists");
            self.send(
                core,
                r.task,
                r.desc,
                &r.meta,
                r.block,
                r.lane,
                r.sub_block_id,
            );
            did = true;
        }
        for which in [Shape::Mix(0), Shape::Aic, Shape::Aiv] {
            did |= self.dispatch_queue(which);
        }
        did
    }

    fn queue(&mut self, which: Shape) -> &mut VecDeque<ReadyEntry> {
        match which {
            Shape::Aic => &mut self.q_aic,
            Shape::Aiv => &mut self.q_aiv,
            _ => &mut self.q_mix,
        }
    }

    fn dispatch_queue(&mut self, which: Shape) -> bool {
        let mut did = false;
        loop {
            let Some(e) = self.queue(which).front() else {
                return did;
            };
            let (task, meta, next) = (e.task, e.meta, e.next_block);
            let mask = meta.mask();
            let healthy_capacity = self.topo.capacity(meta.shape, mask, |c| self.healthy(c));
            if healthy_capacity == 0 || (meta.sync_start && meta.block_num > healthy_capacity) {
                let e = self.queue(which).pop_front().expect("front exists");
                self.graveyard.push(e.desc);
                self.fail_unplaceable(task, &meta, next, healthy_capacity);
                did = true;
                continue;
            }
            if next > 0 && self.failed_already(task) {
                // A block failed: the remaining ones are not started.
                let left = (meta.block_num - next) * mask.count_ones();
                let e = self.queue(which).pop_front().expect("front exists");
                self.graveyard.push(e.desc);
                self.subtask_done(task, meta.total_subtasks(), None, left);
                did = true;
                continue;
            }
            if meta.sync_start && next == 0 {
                // All blocks at once, each on idle cores.
                let mut places = Vec::with_capacity(meta.block_num as usize);
                let mut taken_cores: Vec<u32> = Vec::new();
                let mut taken_clusters: Vec<usize> = Vec::new();
                for _ in 0..meta.block_num {
                    let p = match meta.shape {
                        Shape::Mix(_) => self
                            .pick_cluster(mask, true, &taken_clusters)
                            .map(Place::Cluster),
                        Shape::Aic | Shape::Aiv => {
                            let ty = if meta.shape == Shape::Aic {
                                CoreType::Aic
                            } else {
                                CoreType::Aiv
                            };
                            let list = if ty == CoreType::Aic {
                                &self.topo.aic
                            } else {
                                &self.topo.aiv
                            };
                            list.iter()
                                .copied()
                                .find(|&c| {
                                    !self.cores[c as usize].lost
                                        && self.cores[c as usize].outstanding.is_empty()
                                        && !taken_cores.contains(&c)
                                })
                                .map(Place::Core)
                        }
                        Shape::Dummy => None,
                    };
                    match p {
                        Some(Place::Core(c)) => taken_cores.push(c),
                        Some(Place::Cluster(cl)) => taken_clusters.push(cl),
                        None => break,
                    }
                    places.push(p.expect("matched Some"));
                }
                if places.len() < meta.block_num as usize {
                    return did; // wait until enough cores are idle together
                }
                let e = self.queue(which).pop_front().expect("front exists");
                for (b, p) in places.into_iter().enumerate() {
                    self.send_block(task, &e.desc, &meta, b as u32, p);
                }
                did = true;
                continue;
            }
            let Some(place) = self.place_for(meta.shape, mask, false, &[]) else {
                return did;
            };
            did = true;
            if next + 1 >= meta.block_num {
                // The last block takes the queue's reference (no reference-count traffic).
                let e = self.queue(which).pop_front().expect("front exists");
                self.send_last(task, e.desc, &meta, next, place);
            } else {
                let desc = self
                    .queue(which)
                    .front()
                    .expect("front exists")
                    .desc
                    .clone();
                self.send_block(task, &desc, &meta, next, place);
                self.queue(which)
                    .front_mut()
                    .expect("front exists")
                    .next_block += 1;
            }
        }
    }

    fn fail_unplaceable(&mut self, task: TaskRef, meta: &Meta, next: u32, capacity: u32) {
        let what = match meta.shape {
            Shape::Aic => "AIC cores",
            Shape::Aiv => "AIV cores",
            _ => "clusters with the task's lanes",
        };
        let (code, err) = if meta.sync_start && capacity > 0 {
            (
                codes::REQUIRE_SYNC_START_INVALID,
                ChipError::fatal(
                    codes::REQUIRE_SYNC_START_INVALID,
                    format!(
                        "task {} needs {} blocks started together but only {capacity} {what} are in service (others were lost to kernel timeouts)",
                        task.id().0,
                        meta.block_num
                    ),
                ),
            )
        } else {
            (
                codes::SCHEDULER_TIMEOUT,
                ChipError::fatal(
                    codes::SCHEDULER_TIMEOUT,
                    format!(
                        "task {} cannot be placed: no {what} are in service (they were lost to kernel timeouts); close the chip and create a new one",
                        task.id().0
                    ),
                ),
            )
        };
        let f = self.record_error(code, err);
        let left = (meta.block_num - next) * meta.mask().count_ones().max(1);
        self.subtask_done(task, meta.total_subtasks(), Some(f), left);
    }

    // ----- timeouts ----------------------------------------------------------------------

    fn check_timeouts(&mut self) {
        let now = Instant::now();
        let timeout = self.ctl.timeout;
        let mut stuck = Vec::new();
        for &c in &self.busy {
            let s = &mut self.cores[c as usize];
            if s.lost {
                continue;
            }
            if s.completed != s.checked_completed || s.busy_since.is_none() {
                s.checked_completed = s.completed;
                s.busy_since = Some(now);
                continue;
            }
            if let Some(since) = s.busy_since {
                if now.duration_since(since) >= timeout {
                    stuck.push((c, now.duration_since(since)));
                }
            }
        }
        for (c, after) in stuck {
            self.lose_core(c as usize, after);
        }
    }

    /// Takes a core whose running kernel exceeded the timeout out of service: its kernel
    /// is asked to stop, its task fails with SCHEDULER_TIMEOUT, its pending dispatch (if
    /// the core has not taken it) is re-placed elsewhere.
    fn lose_core(&mut self, c: usize, after: Duration) {
        let mut stolen = None;
        if self.cores[c].outstanding.len() == 2 {
            match self.links[c].dispatch.pop() {
                Some(CoreMsg::Run(d)) => stolen = Some(d),
                Some(CoreMsg::Exit) => {}
                None => {
                    // The core took its pending dispatch: it finished the running one.
                    self.cores[c].busy_since = Some(Instant::now());
                    return;
                }
            }
        }
        let s = &mut self.cores[c];
        s.lost = true;
        self.shared.lost[c].store(true, Ordering::Release);
        let front = s.outstanding.front_mut().expect("a busy core has work");
        front.abandoned = true;
        let (task, block, seq) = (front.task, front.block, front.seq);
        let (func, total) = (
            front.meta.funcs[front.lane as usize],
            front.meta.total_subtasks(),
        );
        self.links[c].cancel.store(seq, SyncOrdering::Relaxed);
        if let Some(d) = stolen {
            if let Some(pending) = self.cores[c].outstanding.pop_back() {
                self.retry.push_back(Retry {
                    task: pending.task,
                    meta: pending.meta,
                    desc: d.desc,
                    block: d.block,
                    lane: d.lane,
                    sub_block_id: d.sub_block_id,
                });
            }
        }
        let kernel = self.ctl.env.func_name(func).to_owned();
        self.report.notes.push(format!(
            "core {c} taken out of service: kernel {kernel:?} of task {} ran for {} ms",
            task.id().0,
            after.as_millis()
        ));
        let err = ChipError::KernelTimeout {
            kernel,
            task: task.id().0,
            block,
            core: c as u32,
            after,
        };
        let f = self.record_error(codes::SCHEDULER_TIMEOUT, err);
        self.subtask_done(task, total, Some(f), 1);
        self.shared.progress.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Copy)]
enum Place {
    Core(u32),
    Cluster(usize),
}
