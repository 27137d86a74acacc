//! Traces of runs: the spans a level-3 (or level-4) worker records about a traced run —
//! the run itself, its orchestration (submit), each task's time queued in the scheduler
//! (schedule) and on its child (dispatch), the caller's wait — and what each child sent
//! back with its completions (a chip's `[STRACE]` spans and core records, a level-3
//! child's whole trace), on one clock. See `docs/tracing.md`.
//!
//! A run is traced when its configuration asks for it ([`CallConfig::traced`]) or a
//! `tracing` subscriber listens to the `strata::trace` target. Nothing here runs for a
//! run that is not traced: the scheduler checks one relaxed atomic per publication and
//! per completion (`TraceBook::active`).
//!
//! [`CallConfig::traced`]: strata_types::CallConfig::traced

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use strata_graph::RunId;
use strata_types::trace::{ClockSync, Span, Trace};
use strata_types::CallableId;

/// What a child sent with a traced task's completion: its trace's bytes (foreign: they
/// are decoded defensively), how its clock maps onto this process's, and the host it ran
/// on (empty: this one).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChildTrace {
    /// The encoded trace ([`Trace::encode_bounded`]).
    pub bytes: Vec<u8>,
    /// The child's clock against this process's.
    pub clock: ClockSync,
    /// The child's host (empty: this host).
    pub host: String,
}

/// Most spans and core records one run's trace keeps (its own and its children's);
/// past it they are counted as dropped.
pub const MAX_RUN_EVENTS: usize = 250_000;
/// Most dependencies a dispatch span lists (`deps=`); the rest are counted (`+N`).
pub const MAX_DEPS_LISTED: usize = 16;

/// Thread ids of the spans this worker records on its own track and on its children's.
pub(crate) const TID_CALLER: u64 = 1;
/// The parent's view of a child's task frame `k` is thread `TID_FRAME + k`.
pub(crate) const TID_FRAME: u64 = 1 << 40;

/// A task of a traced run, from its publication (the scheduler fills it in).
#[derive(Debug)]
pub(crate) struct TaskStart {
    pub(crate) run: RunId,
    pub(crate) callable: CallableId,
    pub(crate) ready_ns: u64,
    pub(crate) publish_ns: u64,
    pub(crate) deps: Vec<u64>,
}

/// One traced run being recorded.
struct RunTrace {
    trace: Trace,
    hid: String,
    start: u64,
    submitted: Option<(u64, u64)>,
    wait_start: Option<u64>,
    events: usize,
}

/// The traces of a worker's runs in flight, shared by the caller's thread (begin, submit,
/// wait, finish) and the scheduler (tasks).
pub(crate) struct TraceBook {
    active: AtomicUsize,
    runs: Mutex<HashMap<RunId, RunTrace>>,
    /// `l3` or `l4`: the span names' prefix.
    prefix: String,
    /// This worker's track.
    name: Mutex<String>,
    pid: u32,
    /// Names of the callables the tasks run.
    names: Mutex<HashMap<CallableId, String>>,
}

fn hid_of(id: &CallableId) -> String {
    id.as_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl TraceBook {
    pub(crate) fn new(level: u8) -> TraceBook {
        TraceBook {
            active: AtomicUsize::new(0),
            runs: Mutex::new(HashMap::new()),
            prefix: format!("l{level}"),
            name: Mutex::new(format!("host (level {level})")),
            pid: std::process::id(),
            names: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, RunTrace>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names this worker's own track (a nested level-3 worker takes its parent's name
    /// for it, so the parent's tree has one name per worker).
    pub(crate) fn set_name(&self, name: &str) {
        *self.name.lock().unwrap_or_else(|e| e.into_inner()) = name.to_owned();
    }

    /// The callables' names, for the dispatch spans (set at `init`, when the registry is
    /// final).
    pub(crate) fn set_names(&self, names: HashMap<CallableId, String>) {
        *self.names.lock().unwrap_or_else(|e| e.into_inner()) = names;
    }

    /// Whether any run is traced now (one relaxed load: the scheduler's fast path).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed) != 0
    }

    /// Whether `run` is traced.
    #[inline]
    pub(crate) fn traced(&self, run: RunId) -> bool {
        self.active() && self.lock().contains_key(&run)
    }

    /// Starts recording `run` of host orchestration `orch`, which began at `start`.
    pub(crate) fn begin(&self, run: RunId, orch: &CallableId, start: u64) {
        let mut runs = self.lock();
        if runs
            .insert(
                run,
                RunTrace {
                    trace: Trace::default(),
                    hid: hid_of(orch),
                    start,
                    submitted: None,
                    wait_start: None,
                    events: 0,
                },
            )
            .is_none()
        {
            self.active.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The orchestration of `run` ran from `start` to `end` (its run closed).
    pub(crate) fn submitted(&self, run: RunId, start: u64, end: u64) {
        if let Some(r) = self.lock().get_mut(&run) {
            r.submitted = Some((start, end));
        }
    }

    /// A caller started waiting for `run` at `t` (the first wait counts).
    pub(crate) fn wait_started(&self, run: RunId, t: u64) {
        if let Some(r) = self.lock().get_mut(&run) {
            r.wait_start.get_or_insert(t);
        }
    }

    /// A task of a traced run finished on `lane` (`label`, pid `lane_pid`) in frame
    /// `frame` at `done_ns`: its schedule and dispatch spans on the child's track, and
    /// the child's own trace (nested under `label`, on this process's clock) if it sent
    /// one. Foreign bytes that do not decode become a note, never an error of the run.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn task(
        &self,
        start: &TaskStart,
        task: u64,
        lane: usize,
        label: &str,
        lane_pid: u32,
        frame: usize,
        done_ns: u64,
        ok: bool,
        child: Option<ChildTrace>,
    ) {
        let name = self
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&start.callable)
            .cloned()
            .unwrap_or_else(|| hid_of(&start.callable));
        let decoded = child.map(|c| (Trace::decode(&c.bytes), c.clock, c.host));
        let mut runs = self.lock();
        let Some(r) = runs.get_mut(&start.run) else {
            return;
        };
        if let Some((decoded, clock, host)) = decoded {
            match decoded {
                Ok(mut t) => {
                    let n = t.span_count() + t.record_count();
                    if r.events + n > MAX_RUN_EVENTS {
                        t.truncate_events(MAX_RUN_EVENTS.saturating_sub(r.events));
                        r.trace.note(format!(
                            "the run's trace reached {MAX_RUN_EVENTS} events: later children's spans were dropped"
                        ));
                    }
                    r.events += t.span_count() + t.record_count();
                    t.nest_under(label);
                    r.trace.absorb(t, clock, &host);
                }
                Err(e) => r.trace.note(format!("{label}: its trace was refused: {e}")),
            }
        }
        let inv = start.run.0;
        let hid = hid_of(&start.callable);
        let track = r.trace.process_mut(label, lane_pid, "");
        let tid = TID_FRAME + frame as u64;
        track.name_thread(tid, &format!("frame {frame} (as its parent saw it)"));
        if r.events + 2 > MAX_RUN_EVENTS {
            track.dropped_spans += 2;
            return;
        }
        let mut deps = String::new();
        for (i, d) in start.deps.iter().take(MAX_DEPS_LISTED).enumerate() {
            if i > 0 {
                deps.push(',');
            }
            deps.push_str(&d.to_string());
        }
        if start.deps.len() > MAX_DEPS_LISTED {
            deps.push_str(&format!(",+{}", start.deps.len() - MAX_DEPS_LISTED));
        }
        let schedule = Span::new(
            self.pid,
            tid,
            inv,
            &hid,
            &format!("{}.run.schedule", self.prefix),
            start.ready_ns,
            start.publish_ns.saturating_sub(start.ready_ns),
        )
        .with_attr("task", task)
        .with_attr("worker", lane);
        let mut dispatch = Span::new(
            self.pid,
            tid,
            inv,
            &hid,
            &format!("{}.run.dispatch", self.prefix),
            start.publish_ns,
            done_ns.saturating_sub(start.publish_ns),
        )
        .with_attr("task", task)
        .with_attr("worker", lane)
        .with_attr("frame", frame)
        .with_attr("callable", name.replace(char::is_whitespace, "_"));
        if !deps.is_empty() {
            dispatch = dispatch.with_attr("deps", deps);
        }
        if !ok {
            dispatch = dispatch.with_attr("ok", 0);
        }
        track.spans.push(schedule);
        track.spans.push(dispatch);
        r.events += 2;
    }

    /// Ends the trace of `run` at `end` (its outcome was seen): the run's own spans on
    /// this worker's track, and the whole trace, which leaves the book.
    pub(crate) fn finish(&self, run: RunId, end: u64) -> Option<Trace> {
        let r = self.lock().remove(&run)?;
        self.active.fetch_sub(1, Ordering::Relaxed);
        let RunTrace {
            trace,
            hid,
            start,
            submitted,
            wait_start,
            ..
        } = r;
        let name = self.name.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let p = &self.prefix;
        let span = |n: &str, a: u64, b: u64| {
            Span::new(self.pid, TID_CALLER, run.0, &hid, n, a, b.saturating_sub(a))
        };
        let mut own = vec![span(&format!("{p}.run"), start, end)];
        if let Some((a, b)) = submitted {
            own.push(span(&format!("{p}.run.submit"), a, b));
        }
        if let Some(w) = wait_start {
            own.push(span(&format!("{p}.run.wait"), w, end));
        }
        // This worker's track first: a parent nests the trace under its own name for it.
        let mut first = Trace::default();
        let track = first.process_mut(&name, self.pid, "");
        track.name_thread(TID_CALLER, "caller (orchestration, wait)");
        track.spans = own;
        first.absorb(trace, ClockSync::SAME_HOST, "");
        Some(first)
    }

    /// Forgets `run` (its handle went away without seeing the outcome, or it failed to
    /// build).
    pub(crate) fn discard(&self, run: RunId) {
        if self.lock().remove(&run).is_some() {
            self.active.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Emits every span of `trace` as a `tracing` event (target `strata::trace`, level INFO)
/// on the trace's clock, for users' own subscribers; does nothing (one check) when no
/// subscriber listens.
pub fn emit(trace: &Trace) {
    if !tracing::enabled!(target: "strata::trace", tracing::Level::INFO) {
        return;
    }
    for p in &trace.processes {
        for s in &p.spans {
            tracing::info!(
                target: "strata::trace",
                process = %p.name,
                host = %p.host,
                pid = s.pid,
                tid = s.tid,
                inv = s.inv,
                hid = %s.hid,
                span = %s.name,
                ts_ns = p.clock.apply(s.ts),
                dur_ns = s.dur,
                clk_dev = s.is_device(),
                "span"
            );
        }
    }
}

/// Whether a `tracing` subscriber listens to the trace target (then runs are traced even
/// when their configuration does not ask for it).
pub fn subscriber_listens() -> bool {
    tracing::enabled!(target: "strata::trace", tracing::Level::INFO)
}
