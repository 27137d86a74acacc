//! `benchmark()`: a program dispatched `warmup + rounds` times, and statistics over the
//! measured rounds built from the spans every process recorded — per round, per rank, per
//! dispatch, with span trees — in the reference's `BenchmarkStats` model and text formats.
//!
//! One dispatch yields, per process that ran a chip orchestration for it, one
//! [`Invocation`]: the spans of one `chip.run` (host spans on `CLOCK_MONOTONIC`, device
//! spans `clk=dev` on the run's device clock). At level 2 a round is one invocation; at
//! level 3 a round is every invocation of its dispatch, grouped by rank (the process id of
//! the chip): a rank's busy time in a round is the **sum** of its dispatches, the round's
//! figure the **max across ranks**.

use crate::error::Error;
use crate::program::args::{Arg, IntoArgs};
use crate::{Compiled, Prepare, PreparedWorker, Progress};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use strata_chip::Span;

/// Prepares a worker for `compiled`, dispatches it `warmup` times then `rounds` times with
/// `args` (host tensors and scalars: the worker is made here, so there are no resident
/// tensors), closes it, and returns the statistics of the measured rounds. On a terminal
/// a progress bar counts the dispatches; nothing is printed otherwise.
///
/// ```no_run
/// # use strata::prelude::*;
/// # fn f(compiled: &Compiled, x: &SharedTensor, y: &SharedTensor) -> Result<(), Error> {
/// let stats = strata::benchmark(compiled, (x, y), 100, 3)?;
/// println!("{stats}");
/// stats.print_mean_tree(true, strata::bench::Spread::Stdev, None, None);
/// # Ok(()) }
/// ```
///
/// # Errors
/// `rounds == 0`; a resident or stacked argument; the errors of preparing and of each
/// dispatch; no chip recorded any span.
pub fn benchmark<'a>(
    compiled: &Compiled,
    args: impl IntoArgs<'a>,
    rounds: usize,
    warmup: usize,
) -> Result<BenchmarkStats, Error> {
    let args = args.into_args();
    if args
        .iter()
        .any(|a| matches!(a, Arg::Device(_) | Arg::Stacked(_)))
    {
        return Err(Error::InvalidArgument(
            "benchmark() prepares its own worker, so it takes host tensors and scalars only; benchmark resident tensors with PreparedWorker::benchmark".into(),
        ));
    }
    let rt = compiled.prepare(Prepare::new())?;
    let stats = rt.benchmark(compiled, args, rounds, warmup);
    let closed = rt.close();
    let stats = stats?;
    closed?;
    Ok(stats)
}

impl PreparedWorker {
    /// [`benchmark`] on this worker: `warmup` then `rounds` blocking dispatches of
    /// `program` with `args` (which may include its resident and stacked tensors).
    ///
    /// # Errors
    /// `rounds == 0`; the errors of each dispatch; no chip recorded any span.
    pub fn benchmark<'a>(
        &self,
        program: &Compiled,
        args: impl IntoArgs<'a>,
        rounds: usize,
        warmup: usize,
    ) -> Result<BenchmarkStats, Error> {
        if rounds == 0 {
            return Err(Error::InvalidArgument(
                "benchmark: rounds must be at least 1".into(),
            ));
        }
        let args = args.into_args();
        let mut progress = Progress::new("dispatches", (warmup + rounds) as u64);
        let mut measured = Vec::with_capacity(rounds);
        for i in 0..warmup + rounds {
            let h = self.submit(program, args.clone())?;
            h.result(None)?;
            if i >= warmup {
                measured.push(h.invocations());
            }
            progress.tick();
        }
        progress.finish();
        let stats = BenchmarkStats::from_rounds(measured, warmup, self.level() >= 3);
        if stats.invocations.is_empty() {
            return Err(Error::Program(format!(
                "benchmark: no chip recorded a span for program {} (a program whose dispatches run no chip orchestration has nothing to measure)",
                program.name()
            )));
        }
        Ok(stats)
    }
}

/// One launch of one chip orchestration in one process: its spans.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// The process.
    pub pid: u32,
    /// Its invocation number in that process.
    pub inv: u64,
    /// The callable's hash (its digest's first bytes, hex).
    pub hid: String,
    /// The orchestration's name, where known (else the hid).
    pub task_name: String,
    /// Its spans.
    pub spans: Vec<Span>,
}

impl Invocation {
    /// Groups spans into invocations by `(pid, inv)`, in order of first appearance.
    pub fn from_spans(spans: &[Span], names: &BTreeMap<String, String>) -> Vec<Invocation> {
        let mut out: Vec<Invocation> = Vec::new();
        for s in spans {
            match out.iter_mut().find(|i| i.pid == s.pid && i.inv == s.inv) {
                Some(i) => i.spans.push(s.clone()),
                None => out.push(Invocation {
                    pid: s.pid,
                    inv: s.inv,
                    hid: s.hid.clone(),
                    task_name: names.get(&s.hid).cloned().unwrap_or_else(|| s.hid.clone()),
                    spans: vec![s.clone()],
                }),
            }
        }
        out
    }

    /// The root span (depth 0).
    pub fn root(&self) -> Option<&Span> {
        self.spans.iter().find(|s| s.depth == 0)
    }

    /// The first span of each name.
    pub fn by_name(&self) -> BTreeMap<&str, &Span> {
        let mut m = BTreeMap::new();
        for s in &self.spans {
            m.entry(s.name.as_str()).or_insert(s);
        }
        m
    }

    fn span(&self, suffix: &str) -> Option<&Span> {
        let root = self.root()?;
        let name = format!("{}{suffix}", root.name);
        self.spans.iter().find(|s| s.name == name)
    }

    /// The device wall (`<root>.runner_run.device_wall`), µs; 0 without one.
    pub fn device_wall_us(&self) -> f64 {
        self.span(".runner_run.device_wall")
            .map_or(0.0, |s| s.dur as f64 / 1000.0)
    }

    /// The host wall (the root span), µs.
    pub fn host_wall_us(&self) -> f64 {
        self.root().map_or(0.0, |s| s.dur as f64 / 1000.0)
    }

    /// `max(end of orch, end of sched) − min(start of orch, start of sched)` over the
    /// device spans `…device_wall.orch` and `…device_wall.sched`, µs (0 if neither).
    pub fn effective_us(&self) -> f64 {
        let parts: Vec<&Span> = [
            ".runner_run.device_wall.orch",
            ".runner_run.device_wall.sched",
        ]
        .iter()
        .filter_map(|s| self.span(s))
        .collect();
        let (Some(start), Some(end)) = (
            parts.iter().map(|s| s.ts).min(),
            parts.iter().map(|s| s.ts + s.dur).max(),
        ) else {
            return 0.0;
        };
        (end - start) as f64 / 1000.0
    }

    /// Whether it has a device wall span (a chip's run; the host orchestration has none).
    fn on_device(&self) -> bool {
        self.span(".runner_run.device_wall").is_some()
    }

    fn metric(&self, m: Metric) -> f64 {
        match m {
            Metric::Device => self.device_wall_us(),
            Metric::Host => self.host_wall_us(),
            Metric::Effective => self.effective_us(),
        }
    }
}

/// What a per-dispatch or per-rank view measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// The device wall.
    Device,
    /// The host wall (the root span).
    Host,
    /// Orchestrator and scheduler windows together.
    Effective,
}

/// What a per-round view measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundMetric {
    /// The headline device figure (level 3: max over ranks of per-rank sums).
    Device,
    /// The headline host figure.
    Host,
    /// Level 3: max over ranks of per-rank summed effective; else each launch's.
    Effective,
    /// Level 3: `max(host root end) − min(host root start)` over every rank's dispatches
    /// of the round (host clocks are `CLOCK_MONOTONIC`, shared by every process of the
    /// host); empty otherwise.
    Union,
}

/// How a mean tree shows the spread of each node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// `±stdev`.
    Stdev,
    /// `[min..max]`.
    MinMax,
    /// Both.
    Both,
    /// Neither.
    None,
}

/// A dispatch slot: a rank (process id) and the position of a dispatch among that rank's
/// dispatches of one round.
pub type Slot = (u32, usize);

/// A group of launches a mean tree averages: its slot (level 3), task name and launches.
type MeanGroup<'a> = (Option<Slot>, String, Vec<&'a Invocation>);

/// Statistics of a benchmark (see [`crate::benchmark`]).
#[derive(Debug, Clone, Default)]
pub struct BenchmarkStats {
    /// Measured rounds.
    pub rounds: usize,
    /// Warm-up rounds (excluded).
    pub warmup: usize,
    /// Per round: the device wall, µs (level 2: the launch's; level 3: max over ranks of
    /// per-rank sums; flattened: every dispatch).
    pub device_wall_us: Vec<f64>,
    /// The same for the host root span.
    pub host_wall_us: Vec<f64>,
    /// Every measured launch, round after round.
    pub invocations: Vec<Invocation>,
    /// Level 3: round → rank (pid) → its dispatches of that round, in order; empty at
    /// level 2 and when flattened.
    pub rounds_dispatches: Vec<BTreeMap<u32, Vec<Invocation>>>,
    /// The rounds did not all dispatch the same number of tasks per rank: the figures are
    /// a pool of every dispatch, without per-round or per-rank views.
    pub fallback_flattened: bool,
    /// Some slot ran different tasks in different rounds: the per-dispatch views are empty.
    pub unstable_dispatch_slots: bool,
    level3: bool,
}

fn stats(v: &[f64]) -> (f64, f64, f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0, 0.0, 0.0);
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    let mean = s.iter().sum::<f64>() / n as f64;
    let sd = if n < 2 {
        0.0
    } else {
        (s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    };
    (s[0], median, mean, s[n - 1], sd)
}

impl BenchmarkStats {
    /// Builds the statistics from what each measured round's dispatch recorded (`rounds`
    /// lists the launches of one round each); `level3` selects the rank views.
    pub fn from_rounds(rounds: Vec<Vec<Invocation>>, warmup: usize, level3: bool) -> Self {
        let mut st = BenchmarkStats {
            rounds: rounds.len(),
            warmup,
            level3,
            ..BenchmarkStats::default()
        };
        // Only a chip's launches count (the host orchestration's own spans have no
        // device wall).
        let rounds: Vec<Vec<Invocation>> = rounds
            .into_iter()
            .map(|r| r.into_iter().filter(Invocation::on_device).collect())
            .collect();
        st.invocations = rounds.iter().flatten().cloned().collect();
        if !level3 {
            for r in &rounds {
                for i in r {
                    st.device_wall_us.push(i.device_wall_us());
                    st.host_wall_us.push(i.host_wall_us());
                }
            }
            return st;
        }
        let grid: Vec<BTreeMap<u32, Vec<Invocation>>> = rounds
            .iter()
            .map(|r| {
                let mut m: BTreeMap<u32, Vec<Invocation>> = BTreeMap::new();
                for i in r {
                    m.entry(i.pid).or_default().push(i.clone());
                }
                m
            })
            .collect();
        // One shape every round: the same ranks, each with the same number of dispatches.
        let shape = |m: &BTreeMap<u32, Vec<Invocation>>| -> Vec<(u32, usize)> {
            m.iter().map(|(p, v)| (*p, v.len())).collect()
        };
        let stable = grid.windows(2).all(|w| shape(&w[0]) == shape(&w[1]));
        if !stable {
            st.fallback_flattened = true;
            for i in &st.invocations {
                st.device_wall_us.push(i.device_wall_us());
                st.host_wall_us.push(i.host_wall_us());
            }
            return st;
        }
        for m in &grid {
            let per_rank = |f: fn(&Invocation) -> f64| {
                m.values()
                    .map(|v| v.iter().map(f).sum::<f64>())
                    .fold(0.0, f64::max)
            };
            st.device_wall_us.push(per_rank(Invocation::device_wall_us));
            st.host_wall_us.push(per_rank(Invocation::host_wall_us));
        }
        if let Some(first) = grid.first() {
            st.unstable_dispatch_slots = grid.iter().any(|m| {
                m.iter()
                    .any(|(p, v)| v.iter().zip(&first[p]).any(|(a, b)| a.hid != b.hid))
            });
        }
        st.rounds_dispatches = grid;
        st
    }

    /// min, median, mean, max and stdev of [`BenchmarkStats::device_wall_us`] (0 when
    /// empty; stdev 0 below two samples).
    pub fn device_us(&self) -> (f64, f64, f64, f64, f64) {
        stats(&self.device_wall_us)
    }

    /// The minimum device wall, µs.
    pub fn device_us_min(&self) -> f64 {
        self.device_us().0
    }

    /// The median device wall, µs.
    pub fn device_us_median(&self) -> f64 {
        self.device_us().1
    }

    /// The mean device wall, µs.
    pub fn device_us_mean(&self) -> f64 {
        self.device_us().2
    }

    /// The maximum device wall, µs.
    pub fn device_us_max(&self) -> f64 {
        self.device_us().3
    }

    /// The standard deviation of the device wall, µs.
    pub fn device_us_stdev(&self) -> f64 {
        self.device_us().4
    }

    /// The device samples (the same as `device_wall_us`).
    pub fn samples(&self) -> &[f64] {
        &self.device_wall_us
    }

    /// Samples exist and every one is 0 (no device timing was recorded).
    pub fn all_zero_device(&self) -> bool {
        !self.device_wall_us.is_empty() && self.device_wall_us.iter().all(|&v| v == 0.0)
    }

    fn grid_ok(&self) -> bool {
        self.level3 && !self.fallback_flattened && !self.rounds_dispatches.is_empty()
    }

    /// Level 3: every dispatch slot and its launch in each round; empty at level 2, when
    /// flattened, or when some slot ran different tasks in different rounds.
    pub fn dispatch_groups(&self) -> BTreeMap<Slot, Vec<&Invocation>> {
        let mut g: BTreeMap<Slot, Vec<&Invocation>> = BTreeMap::new();
        if !self.grid_ok() || self.unstable_dispatch_slots {
            return g;
        }
        for m in &self.rounds_dispatches {
            for (p, v) in m {
                for (slot, i) in v.iter().enumerate() {
                    g.entry((*p, slot)).or_default().push(i);
                }
            }
        }
        g
    }

    /// Level 3: the task each slot ran (from the first round).
    pub fn dispatch_tasks(&self) -> BTreeMap<Slot, String> {
        self.dispatch_groups()
            .into_iter()
            .map(|(k, v)| (k, v[0].task_name.clone()))
            .collect()
    }

    /// Level 3: each slot's value per round (no summing).
    pub fn per_dispatch(&self, metric: Metric) -> BTreeMap<Slot, Vec<f64>> {
        self.dispatch_groups()
            .into_iter()
            .map(|(k, v)| (k, v.iter().map(|i| i.metric(metric)).collect()))
            .collect()
    }

    /// Level 3: each rank's per-round sum of its dispatches; empty at level 2 or when
    /// flattened.
    pub fn per_rank(&self, metric: Metric) -> BTreeMap<u32, Vec<f64>> {
        let mut out: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
        if !self.grid_ok() {
            return out;
        }
        for m in &self.rounds_dispatches {
            for (p, v) in m {
                out.entry(*p)
                    .or_default()
                    .push(v.iter().map(|i| i.metric(metric)).sum());
            }
        }
        out
    }

    /// A per-round figure (see [`RoundMetric`]).
    pub fn per_round(&self, metric: RoundMetric) -> Vec<f64> {
        match metric {
            RoundMetric::Device => self.device_wall_us.clone(),
            RoundMetric::Host => self.host_wall_us.clone(),
            RoundMetric::Effective if self.grid_ok() => self
                .rounds_dispatches
                .iter()
                .map(|m| {
                    m.values()
                        .map(|v| v.iter().map(Invocation::effective_us).sum::<f64>())
                        .fold(0.0, f64::max)
                })
                .collect(),
            RoundMetric::Effective => self
                .invocations
                .iter()
                .map(Invocation::effective_us)
                .collect(),
            RoundMetric::Union if self.grid_ok() => self
                .rounds_dispatches
                .iter()
                .map(|m| {
                    let roots: Vec<&Span> =
                        m.values().flatten().filter_map(Invocation::root).collect();
                    let start = roots.iter().map(|s| s.ts).min().unwrap_or(0);
                    let end = roots.iter().map(|s| s.ts + s.dur).max().unwrap_or(0);
                    end.saturating_sub(start) as f64 / 1000.0
                })
                .collect(),
            RoundMetric::Union => Vec::new(),
        }
    }

    /// Where each measured launch sits: `(round, slot)` for level-3 grid members.
    fn placement(&self, launch: &Invocation) -> Option<(usize, usize)> {
        if !self.grid_ok() {
            return None;
        }
        self.rounds_dispatches
            .iter()
            .enumerate()
            .find_map(|(k, m)| {
                m.get(&launch.pid)?
                    .iter()
                    .position(|i| i.inv == launch.inv)
                    .map(|s| (k, s))
            })
    }

    /// The span tree of launch `launch` (or of every launch), in the reference's text
    /// format.
    pub fn format_tree(&self, launch: Option<usize>, us: bool) -> String {
        if self.invocations.is_empty() {
            return "BenchmarkStats: no span tree captured (no launch recorded spans)".into();
        }
        let chosen: Vec<(usize, &Invocation)> = match launch {
            Some(i) => self
                .invocations
                .iter()
                .enumerate()
                .skip(i)
                .take(1)
                .collect(),
            None => self.invocations.iter().enumerate().collect(),
        };
        if chosen.is_empty() {
            return format!(
                "BenchmarkStats: no launch {} (there are {})",
                launch.unwrap_or(0),
                self.invocations.len()
            );
        }
        let mut out = String::new();
        for (n, (i, inv)) in chosen.iter().enumerate() {
            if n > 0 {
                out.push('\n');
            }
            let mut header = format!(
                "launch[{i}] (pid={} inv={} hid={}",
                inv.pid, inv.inv, inv.hid
            );
            if let Some((k, s)) = self.placement(inv) {
                let _ = write!(header, " round={k} slot={s}");
            }
            if inv.task_name != inv.hid {
                let _ = write!(header, " task={}", inv.task_name);
            }
            header.push_str("):");
            out.push_str(&header);
            out.push('\n');
            let rows: Vec<(String, Vec<String>)> = tree_rows(&inv.spans)
                .into_iter()
                .map(|(label, s)| (label, vec![fmt_value(s.dur as f64, us)]))
                .collect();
            out.push_str(&render_rows(&rows));
        }
        out
    }

    /// Prints [`BenchmarkStats::format_tree`] to stdout.
    pub fn print_tree(&self, launch: Option<usize>, us: bool) {
        println!("{}", self.format_tree(launch, us));
    }

    /// The launches [`BenchmarkStats::format_mean_tree`] averages, grouped: one group per
    /// dispatch slot at level 3 (filtered by `pid` / `slot`), one group at level 2.
    fn mean_groups(
        &self,
        pid: Option<u32>,
        slot: Option<usize>,
    ) -> Result<Vec<MeanGroup<'_>>, String> {
        if self.invocations.is_empty() {
            return Err("BenchmarkStats: no span tree captured (no launch recorded spans)".into());
        }
        if !self.grid_ok() {
            let name = self.invocations[0].task_name.clone();
            return Ok(vec![(None, name, self.invocations.iter().collect())]);
        }
        if self.unstable_dispatch_slots {
            return Err("BenchmarkStats: per-dispatch view unavailable — a slot ran different tasks in different rounds".into());
        }
        let groups: Vec<MeanGroup<'_>> = self
            .dispatch_groups()
            .into_iter()
            .filter(|((p, s), _)| pid.is_none_or(|x| x == *p) && slot.is_none_or(|x| x == *s))
            .map(|(k, v)| (Some(k), v[0].task_name.clone(), v))
            .collect();
        if groups.is_empty() {
            return Err(format!(
                "BenchmarkStats: no dispatch matches pid={} slot={}",
                pid.map_or("*".into(), |p| p.to_string()),
                slot.map_or("*".into(), |s| s.to_string())
            ));
        }
        Ok(groups)
    }

    /// A synthetic launch whose spans are the span-wise means (rounded) of the matching
    /// launches (`inv` = `u64::MAX`); `None` if nothing matches.
    ///
    /// # Errors
    /// The selectors match more than one dispatch slot.
    pub fn mean_invocation(
        &self,
        pid: Option<u32>,
        slot: Option<usize>,
    ) -> Result<Option<Invocation>, Error> {
        let groups = match self.mean_groups(pid, slot) {
            Ok(g) => g,
            Err(_) => return Ok(None),
        };
        if groups.len() > 1 {
            return Err(Error::InvalidArgument(format!(
                "mean_invocation: pid={pid:?} slot={slot:?} matches {} dispatch slots; select one",
                groups.len()
            )));
        }
        let (_, name, launches) = &groups[0];
        let first = launches[0];
        let spans = first
            .spans
            .iter()
            .map(|s| {
                let same: Vec<&Span> = launches
                    .iter()
                    .filter_map(|l| l.spans.iter().find(|x| x.name == s.name))
                    .collect();
                let n = same.len() as f64;
                let mean = |f: fn(&Span) -> u64| {
                    (same.iter().map(|x| f(x) as f64).sum::<f64>() / n).round() as u64
                };
                Span {
                    ts: mean(|x| x.ts),
                    dur: mean(|x| x.dur),
                    inv: u64::MAX,
                    ..s.clone()
                }
            })
            .collect();
        Ok(Some(Invocation {
            pid: first.pid,
            inv: u64::MAX,
            hid: first.hid.clone(),
            task_name: name.clone(),
            spans,
        }))
    }

    /// One mean span tree per dispatch group: each node's mean over the measured launches,
    /// with its spread.
    pub fn format_mean_tree(
        &self,
        us: bool,
        spread: Spread,
        pid: Option<u32>,
        slot: Option<usize>,
    ) -> String {
        let groups = match self.mean_groups(pid, slot) {
            Ok(g) => g,
            Err(message) => return message,
        };
        let unit = if us { "us" } else { "ns" };
        let mut out = String::new();
        for (n, (key, task, launches)) in groups.iter().enumerate() {
            if n > 0 {
                out.push('\n');
            }
            let what = match spread {
                Spread::Stdev => " ±stdev",
                Spread::MinMax => " [min..max]",
                Spread::Both => " ±stdev [min..max]",
                Spread::None => "",
            };
            if let Some((p, s)) = key {
                let _ = write!(out, "dispatch pid={p} slot={s} task={task} — ");
            }
            let _ = writeln!(
                out,
                "mean of {} launches (warmup {} excluded); each node: mean{what}:",
                launches.len(),
                self.warmup
            );
            let rows: Vec<(String, Vec<String>)> = tree_rows(&launches[0].spans)
                .into_iter()
                .map(|(label, s)| {
                    let durs: Vec<f64> = launches
                        .iter()
                        .filter_map(|l| l.spans.iter().find(|x| x.name == s.name))
                        .map(|x| x.dur as f64)
                        .collect();
                    let (min, _, mean, max, sd) = stats(&durs);
                    let scale = if us { 1000.0 } else { 1.0 };
                    let mut cells = vec![format!("{:.1}{unit}", mean / scale)];
                    if matches!(spread, Spread::Stdev | Spread::Both) {
                        cells.push(format!("±{:.1}", sd / scale));
                    }
                    if matches!(spread, Spread::MinMax | Spread::Both) {
                        cells.push(format!("[{:.1}..{:.1}]", min / scale, max / scale));
                    }
                    (label, cells)
                })
                .collect();
            out.push_str(&render_rows(&rows));
        }
        out
    }

    /// Prints [`BenchmarkStats::format_mean_tree`] to stdout.
    pub fn print_mean_tree(&self, us: bool, spread: Spread, pid: Option<u32>, slot: Option<usize>) {
        println!("{}", self.format_mean_tree(us, spread, pid, slot));
    }
}

impl std::fmt::Display for BenchmarkStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.device_wall_us.is_empty() {
            return write!(f, "BenchmarkStats(rounds={}: no samples)", self.rounds);
        }
        if self.all_zero_device() {
            return write!(
                f,
                "BenchmarkStats(rounds={}): device_wall_us all 0 — no device timing was recorded (use host_wall_us)",
                self.rounds
            );
        }
        let (min, median, mean, max, sd) = self.device_us();
        write!(
            f,
            "BenchmarkStats(rounds={}, warmup={}): device_wall_us min={min:.1} median={median:.1} mean={mean:.1} max={max:.1} stdev={sd:.1}",
            self.rounds, self.warmup
        )?;
        if self.grid_ok() {
            let ranks = self.rounds_dispatches[0].len();
            let union = self.per_round(RoundMetric::Union);
            let u = union.iter().sum::<f64>() / union.len().max(1) as f64;
            write!(
                f,
                " [L3: {ranks} ranks, per-round max across ranks; host-union mean={u:.1}us]"
            )?;
            let many = self.rounds_dispatches[0].values().any(|v| v.len() > 1);
            if many && !self.unstable_dispatch_slots {
                let tasks = self.dispatch_tasks();
                let means: Vec<String> = self
                    .per_dispatch(Metric::Device)
                    .into_iter()
                    .map(|((p, s), v)| {
                        let m = v.iter().sum::<f64>() / v.len().max(1) as f64;
                        format!("(pid={p},slot={s},task={})={m:.1}", tasks[&(p, s)])
                    })
                    .collect();
                write!(f, "\n  per-dispatch device mean us:")?;
                for m in means.iter().take(8) {
                    write!(f, " {m}")?;
                }
                if means.len() > 8 {
                    write!(f, " ... +{} more", means.len() - 8)?;
                }
            }
        } else if self.fallback_flattened {
            write!(
                f,
                " [L3: flattened per-dispatch pool — non-deterministic dispatch shape]"
            )?;
        }
        Ok(())
    }
}

fn fmt_value(dur_ns: f64, us: bool) -> String {
    if us {
        format!("{:.1}us", dur_ns / 1000.0)
    } else {
        format!("{}ns", dur_ns as u64)
    }
}

/// The rows of a span tree: a span's parent is the longest proper dotted prefix of its name
/// that is itself a span name; roots and siblings in start order; each label is the
/// connector prefix and the leaf name (`[dev]` for device spans).
fn tree_rows(spans: &[Span]) -> Vec<(String, &Span)> {
    let mut sorted: Vec<&Span> = spans.iter().collect();
    sorted.sort_by_key(|s| (s.ts, s.depth));
    // The first span of each name stands for it as a parent.
    let mut by_name: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, s) in sorted.iter().enumerate() {
        by_name.entry(s.name.as_str()).or_insert(i);
    }
    let parents: Vec<Option<usize>> = sorted
        .iter()
        .map(|s| {
            let mut n = s.name.as_str();
            while let Some(i) = n.rfind('.') {
                n = &n[..i];
                if let Some(&p) = by_name.get(n) {
                    return Some(p);
                }
            }
            None
        })
        .collect();
    fn walk<'s>(
        of: Option<usize>,
        sorted: &[&'s Span],
        parents: &[Option<usize>],
        prefix: &str,
        out: &mut Vec<(String, &'s Span)>,
    ) {
        let kids: Vec<usize> = (0..sorted.len()).filter(|&i| parents[i] == of).collect();
        for (k, &i) in kids.iter().enumerate() {
            let s = sorted[i];
            let last = k + 1 == kids.len();
            let leaf = match of {
                Some(p) => &s.name[sorted[p].name.len() + 1..],
                None => s.name.as_str(),
            };
            let (connector, cont) = match (of.is_some(), last) {
                (false, _) => ("", ""),
                (true, false) => ("|- ", "|  "),
                (true, true) => ("`- ", "   "),
            };
            let dev = if s.is_device() { " [dev]" } else { "" };
            out.push((format!("{prefix}{connector}{leaf}{dev}"), s));
            walk(Some(i), sorted, parents, &format!("{prefix}{cont}"), out);
        }
    }
    let mut out = Vec::new();
    walk(None, &sorted, &parents, "", &mut out);
    out
}

/// Rows as a table: the label column left-justified to the widest label, each value column
/// right-justified to its widest cell, columns joined by two spaces, trailing spaces
/// stripped.
fn render_rows(rows: &[(String, Vec<String>)]) -> String {
    let lw = rows
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let ncols = rows.iter().map(|(_, c)| c.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..ncols)
        .map(|c| {
            rows.iter()
                .filter_map(|(_, cells)| cells.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (label, cells) in rows {
        let mut line = format!("{label:<lw$}");
        for (c, cell) in cells.iter().enumerate() {
            let _ = write!(line, "  {cell:>w$}", w = widths[c]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(pid: u32, inv: u64, hid: &str, name: &str, ts: u64, dur: u64, dev: bool) -> Span {
        Span {
            v: 1,
            pid,
            tid: 1,
            inv,
            hid: hid.into(),
            depth: name.matches(".").count() as u32 - 1,
            name: name.into(),
            ts,
            dur,
            attrs: if dev {
                vec![("clk".into(), "dev".into())]
            } else {
                Vec::new()
            },
        }
    }

    /// One chip.run launch with a device wall of `dev` µs, host wall `host` µs starting at
    /// `t0` µs, orch `[0, orch)` and sched `[sched0, sched1)` µs on the device clock.
    fn launch(pid: u32, inv: u64, hid: &str, t0: u64, host: u64, dev: u64) -> Invocation {
        let spans = vec![
            span(pid, inv, hid, "chip.run.bind", t0 * 1000, 1000, false),
            span(
                pid,
                inv,
                hid,
                "chip.run.runner_run.device_wall.orch",
                0,
                dev * 400,
                true,
            ),
            span(
                pid,
                inv,
                hid,
                "chip.run.runner_run.device_wall.sched",
                dev * 200,
                dev * 700,
                true,
            ),
            span(
                pid,
                inv,
                hid,
                "chip.run.runner_run.device_wall",
                0,
                dev * 1000,
                true,
            ),
            span(
                pid,
                inv,
                hid,
                "chip.run.runner_run",
                t0 * 1000 + 1000,
                dev * 1000,
                false,
            ),
            span(pid, inv, hid, "chip.run", t0 * 1000, host * 1000, false),
        ];
        Invocation {
            pid,
            inv,
            hid: hid.into(),
            task_name: format!("task_{hid}"),
            spans,
        }
    }

    #[test]
    fn an_invocation_derives_its_figures_from_its_spans() {
        let l = launch(7, 1, "aa", 100, 50, 10);
        assert_eq!(l.host_wall_us(), 50.0);
        assert_eq!(l.device_wall_us(), 10.0);
        // orch [0, 4) and sched [2, 9) µs: effective 9 µs.
        assert_eq!(l.effective_us(), 9.0);
        assert_eq!(l.by_name()["chip.run.bind"].dur, 1000);
    }

    /// Two ranks; rank 10 runs two dispatches per round, rank 11 one. Round figures are
    /// the max over ranks of per-rank sums, computed here by hand.
    fn level3() -> BenchmarkStats {
        let mut rounds = Vec::new();
        for k in 0..3u64 {
            rounds.push(vec![
                launch(10, 2 * k, "aa", 1000 * k, 20 + k, 5),
                launch(10, 2 * k + 1, "bb", 1000 * k + 30, 10, 3 + k),
                launch(11, k, "aa", 1000 * k + 5, 40, 7),
            ]);
        }
        BenchmarkStats::from_rounds(rounds, 2, true)
    }

    #[test]
    fn level_3_rounds_sum_a_ranks_dispatches_and_take_the_max_across_ranks() {
        let st = level3();
        assert!(!st.fallback_flattened && !st.unstable_dispatch_slots);
        // Rank 10: 5 + (3 + k); rank 11: 7 → max(8 + k, 7).
        assert_eq!(st.device_wall_us, vec![8.0, 9.0, 10.0]);
        // Host: rank 10: (20 + k) + 10; rank 11: 40 → 40.
        assert_eq!(st.host_wall_us, vec![40.0, 40.0, 40.0]);
        assert_eq!(st.per_rank(Metric::Device)[&10], vec![8.0, 9.0, 10.0]);
        assert_eq!(st.per_rank(Metric::Device)[&11], vec![7.0, 7.0, 7.0]);
        assert_eq!(
            st.per_dispatch(Metric::Device)[&(10, 1)],
            vec![3.0, 4.0, 5.0]
        );
        assert_eq!(st.dispatch_tasks()[&(10, 1)], "task_bb");
        assert_eq!(st.dispatch_groups().len(), 3);
        // Union: from the first root start (1000k µs) to the last root end: rank 11 starts
        // at +5 and lasts 40 µs → 45 µs.
        assert_eq!(st.per_round(RoundMetric::Union), vec![45.0, 45.0, 45.0]);
        assert_eq!(st.device_us_median(), 9.0);
        assert!((st.device_us_stdev() - 1.0).abs() < 1e-9);
        let text = st.to_string();
        assert!(text.starts_with("BenchmarkStats(rounds=3, warmup=2): device_wall_us min=8.0 median=9.0 mean=9.0 max=10.0 stdev=1.0 [L3: 2 ranks"), "{text}");
        assert!(text.contains("(pid=10,slot=1,task=task_bb)=4.0"), "{text}");
    }

    #[test]
    fn a_slot_that_changes_task_empties_the_per_dispatch_views() {
        let rounds = vec![
            vec![launch(1, 0, "aa", 0, 10, 1), launch(1, 1, "bb", 20, 10, 1)],
            vec![
                launch(1, 2, "bb", 100, 10, 1),
                launch(1, 3, "aa", 120, 10, 1),
            ],
        ];
        let st = BenchmarkStats::from_rounds(rounds, 0, true);
        assert!(st.unstable_dispatch_slots);
        assert!(st.per_dispatch(Metric::Device).is_empty());
        assert_eq!(
            st.per_rank(Metric::Device)[&1],
            vec![2.0, 2.0],
            "per-rank stays valid"
        );
        assert!(st
            .format_mean_tree(true, Spread::Stdev, None, None)
            .contains("per-dispatch view unavailable"));
    }

    #[test]
    fn rounds_of_different_shapes_are_flattened() {
        let rounds = vec![
            vec![launch(1, 0, "aa", 0, 10, 2)],
            vec![
                launch(1, 1, "aa", 100, 10, 3),
                launch(1, 2, "aa", 120, 10, 4),
            ],
        ];
        let st = BenchmarkStats::from_rounds(rounds, 0, true);
        assert!(st.fallback_flattened);
        assert_eq!(st.device_wall_us, vec![2.0, 3.0, 4.0]);
        assert!(st.per_rank(Metric::Device).is_empty());
        assert!(st.to_string().contains("flattened per-dispatch pool"));
    }

    #[test]
    fn the_tree_uses_the_references_connectors_and_columns() {
        let st = BenchmarkStats::from_rounds(vec![vec![launch(7, 1, "aa", 100, 50, 10)]], 0, false);
        let text = st.format_tree(Some(0), true);
        let want = "\
launch[0] (pid=7 inv=1 hid=aa task=task_aa):
chip.run                 50.0us
|- bind                   1.0us
`- runner_run            10.0us
   `- device_wall [dev]  10.0us
      |- orch [dev]       4.0us
      `- sched [dev]      7.0us
";
        assert_eq!(text, want);
        let mean = st.format_mean_tree(true, Spread::Both, None, None);
        assert!(mean.starts_with("mean of 1 launches (warmup 0 excluded); each node: mean ±stdev [min..max]:\nchip.run"), "{mean}");
        assert!(mean.contains("50.0us  ±0.0  [50.0..50.0]"), "{mean}");
    }

    #[test]
    fn empty_and_all_zero_statistics_say_so() {
        let st = BenchmarkStats::from_rounds(Vec::new(), 0, false);
        assert_eq!(st.to_string(), "BenchmarkStats(rounds=0: no samples)");
        assert!(st.format_tree(None, true).contains("no span tree captured"));
        let st = BenchmarkStats::from_rounds(vec![vec![launch(1, 0, "aa", 0, 5, 0)]], 0, false);
        assert!(st.all_zero_device());
        assert!(st.to_string().contains("all 0"));
    }

    #[test]
    fn mean_invocation_averages_span_by_span_and_refuses_ambiguous_selectors() {
        let st = level3();
        let e = st.mean_invocation(Some(10), None).unwrap_err();
        assert!(e.to_string().contains("matches 2 dispatch slots"));
        let m = st.mean_invocation(Some(10), Some(1)).unwrap().unwrap();
        // Device walls 3, 4, 5 µs → 4 µs.
        assert_eq!(m.device_wall_us(), 4.0);
        assert_eq!(m.inv, u64::MAX);
        assert!(st.mean_invocation(Some(99), None).unwrap().is_none());
    }
}
