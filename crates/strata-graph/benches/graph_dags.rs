//! `cargo xtask bench graph`: µs per task through strata-graph for three DAGs — a chain of
//! 100 000 tasks, fan-out/fan-in 1→1000→1 ×100, a 300×300 wavefront — driven by a minimal
//! in-process scheduler, next to the same DAGs with GCC OpenMP `task depend` (a small C
//! program this bench builds with `cc -fopenmp`) measured in the same run.
//!
//! strata runs with the orchestrator on the main thread and the scheduler on a second
//! thread (the machine has two cores; OpenMP gets two threads too). A single-thread
//! figure (build the whole run, then drain it) is printed as well.
//!
//! The variants of a DAG alternate in `REPS` rounds after a warm-up round (strata, strata
//! single-thread, OpenMP, then reversed, …; OpenMP is one launch of the peer program per
//! round), and each is reported as the median over the rounds; the comparison with OpenMP
//! is the median of the per-round ratios strata / OpenMP. The machine (CPU model, load
//! average) heads the output. The last line is a JSON object with the figures.
//!
//! Two more peers, each launched once per round as well: the same DAGs with oneTBB's
//! `flow::graph` (explicit edges, no inference: a lower bound; also its re-run of the
//! already-built graph) and with StarPU's sequential task flow (`starpu_task_insert` with
//! `STARPU_R` / `STARPU_W` / `STARPU_RW` on registered handles). Their sources are in
//! `benches/peers/`; the bench installs `libtbb-dev` / `libstarpu-dev` with `apt-get` if
//! they are missing and prints why a peer is skipped (its JSON figures are then `null`).
//! Goals (issue 15): strata ≥ 1.5× faster than OpenMP on each DAG (ratio ≤ 0.667) and no
//! slower than TBB's flow graph (ratio ≤ 1).
//!
//! A second table measures `submit` alone with many views of one buffer: a wavefront over
//! N = 16², 32², 48² tiles (4 × 4 `u64`) of one 2-D tensor next to the same DAG with one
//! tensor per tile, and a fan-out of width 1000 over 1-element slices of one tensor next
//! to one tensor per slice. The whole run is built before any task executes (as when a
//! scope holds every task), so every entry stays live; then it is drained, untimed. The
//! two variants of a row alternate in rounds too.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_graph::*;
use strata_testkit::bench::{median, Json, Machine, Rounds};
use strata_testkit::peer;
use strata_types::{ArgTag, DataType, IdentityMinter, TensorView};

const CHAIN: usize = 100_000;
const FAN_ROUNDS: usize = 100;
const FAN_WIDTH: usize = 1000;
const WAVE: usize = 300;
const REPS: usize = 5;

#[derive(Clone, Copy, Debug)]
enum Dag {
    Chain,
    Fan,
    Wavefront,
}

impl Dag {
    fn tasks(self) -> usize {
        match self {
            Dag::Chain => CHAIN,
            Dag::Fan => FAN_ROUNDS * (FAN_WIDTH + 2),
            Dag::Wavefront => WAVE * WAVE,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Dag::Chain => "chain",
            Dag::Fan => "fan",
            Dag::Wavefront => "wavefront",
        }
    }
}

struct Keys {
    x: BufferKey,
    y: Vec<BufferKey>,
    cells: Vec<BufferKey>,
}

fn keys() -> Keys {
    let m = IdentityMinter::new();
    let k = || BufferKey::new(m.mint(), KeySpace::Host);
    Keys {
        x: k(),
        y: (0..FAN_WIDTH).map(|_| k()).collect(),
        cells: (0..WAVE * WAVE).map(|_| k()).collect(),
    }
}

fn acc(k: BufferKey, tag: ArgTag) -> Access {
    Access::new(k, Footprint::WHOLE, tag)
}

/// Submits the DAG, calling `ready` for every task that is ready at submit.
fn build(dag: Dag, keys: &Keys, orch: &mut Orchestrator<()>, mut ready: impl FnMut(TaskRef)) {
    let mut submit = |orch: &mut Orchestrator<()>, a: &[Access]| {
        let s = orch.submit(TaskSpec::new((), a)).expect("submit");
        if s.ready {
            ready(s.task);
        }
    };
    match dag {
        Dag::Chain => {
            let a = [acc(keys.x, ArgTag::InOut)];
            for _ in 0..CHAIN {
                submit(orch, &a);
            }
        }
        Dag::Fan => {
            let mut sink: Vec<Access> = keys.y.iter().map(|y| acc(*y, ArgTag::Input)).collect();
            sink.push(acc(keys.x, ArgTag::InOut));
            for _ in 0..FAN_ROUNDS {
                submit(orch, &[acc(keys.x, ArgTag::InOut)]);
                for y in &keys.y {
                    submit(orch, &[acc(keys.x, ArgTag::Input), acc(*y, ArgTag::Output)]);
                }
                submit(orch, &sink);
            }
        }
        Dag::Wavefront => {
            let mut a = Vec::with_capacity(3);
            for i in 0..WAVE {
                for j in 0..WAVE {
                    a.clear();
                    if i > 0 {
                        a.push(acc(keys.cells[(i - 1) * WAVE + j], ArgTag::Input));
                    }
                    if j > 0 {
                        a.push(acc(keys.cells[i * WAVE + j - 1], ArgTag::Input));
                    }
                    a.push(acc(keys.cells[i * WAVE + j], ArgTag::Output));
                    submit(orch, &a);
                }
            }
        }
    }
}

/// The hand-off of tasks found ready at submit from the orchestrator to the scheduler
/// thread. The orchestrator batches them locally and publishes a batch when it holds 32,
/// or at once when the scheduler has said it is hungry (it ran out of work), so a busy
/// scheduler is not interrupted per task and an idle one never waits for a batch to fill.
#[derive(Default)]
struct Handoff {
    pending: AtomicBool,
    hungry: AtomicBool,
    tasks: Mutex<Vec<TaskRef>>,
}

impl Handoff {
    fn publish(&self, batch: &mut Vec<TaskRef>) {
        if batch.is_empty() {
            return;
        }
        self.tasks.lock().expect("handoff").append(batch);
        self.pending.store(true, Ordering::Release);
    }
    fn offer(&self, t: TaskRef, batch: &mut Vec<TaskRef>) {
        batch.push(t);
        if batch.len() >= 32 || self.hungry.load(Ordering::Relaxed) {
            self.publish(batch);
        }
    }
    fn take(&self, into: &mut VecDeque<TaskRef>) -> bool {
        if !self.pending.load(Ordering::Acquire) {
            if !self.hungry.load(Ordering::Relaxed) {
                self.hungry.store(true, Ordering::Relaxed);
            }
            return false;
        }
        self.hungry.store(false, Ordering::Relaxed);
        self.pending.store(false, Ordering::Relaxed);
        into.extend(self.tasks.lock().expect("handoff").drain(..));
        true
    }
}

/// Orchestrator on this thread, scheduler on another: returns the wall time of one run.
fn two_threads(
    dag: Dag,
    keys: &Keys,
    orch: &mut Orchestrator<()>,
    sched: Scheduler<()>,
) -> (Duration, Scheduler<()>) {
    let handoff = Arc::new(Handoff::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (inc, st) = (handoff.clone(), stop.clone());
    let worker = std::thread::spawn(move || {
        let mut sched = sched;
        let mut local: VecDeque<TaskRef> = VecDeque::new();
        let mut newly: Vec<ReadyTask> = Vec::new();
        let mut executed = 0usize;
        loop {
            let Some(t) = local.pop_front() else {
                if !inc.take(&mut local) {
                    if st.load(Ordering::Acquire) {
                        break;
                    }
                    for _ in 0..32 {
                        strata_sync::sync::spin_hint();
                    }
                }
                continue;
            };
            if sched.claim(t).is_some() {
                sched.complete(t, Ok(()), &mut newly).expect("complete");
                executed += 1;
                local.extend(newly.drain(..).map(|r| r.task));
            }
        }
        sched.flush();
        (sched, executed)
    });
    let t0 = Instant::now();
    let run = orch.begin_run().expect("begin");
    let mut batch = Vec::with_capacity(32);
    build(dag, keys, orch, |t| handoff.offer(t, &mut batch));
    handoff.publish(&mut batch);
    orch.close_run().expect("close");
    let out = orch.wait_run(run, None).expect("wait");
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Release);
    let (sched, executed) = worker.join().expect("scheduler thread");
    assert_eq!(out, Some(Ok(())));
    assert_eq!(executed, dag.tasks());
    orch.release_run(run).expect("release");
    (elapsed, sched)
}

/// Build the whole run, then drain it, all on this thread.
fn one_thread(
    dag: Dag,
    keys: &Keys,
    orch: &mut Orchestrator<()>,
    sched: &mut Scheduler<()>,
) -> Duration {
    let t0 = Instant::now();
    let run = orch.begin_run().expect("begin");
    let mut queue: VecDeque<TaskRef> = VecDeque::new();
    build(dag, keys, orch, |t| queue.push_back(t));
    orch.close_run().expect("close");
    let mut newly = Vec::new();
    let mut executed = 0;
    while let Some(t) = queue.pop_front() {
        if sched.claim(t).is_some() {
            sched.complete(t, Ok(()), &mut newly).expect("complete");
            executed += 1;
            queue.extend(newly.drain(..).map(|r| r.task));
        }
    }
    let elapsed = t0.elapsed();
    assert_eq!(orch.wait_run(run, None).expect("wait"), Some(Ok(())));
    assert_eq!(executed, dag.tasks());
    orch.release_run(run).expect("release");
    elapsed
}

/// The figures of one DAG, alternating strata (two threads, one thread) and OpenMP (one
/// launch per round) in `REPS` rounds after a warm-up round.
fn dag_rounds(
    dag: Dag,
    keys: &Keys,
    peers: &Peers,
    tbb_rerun: &Rc<RefCell<Vec<f64>>>,
) -> strata_testkit::bench::RoundsReport {
    let omp_bin = peers.omp.as_deref();
    let per_task = |d: Duration| d.as_secs_f64() * 1e6 / dag.tasks() as f64;
    let (mut orch2, sched2) = graph::<()>(GraphConfig::default()).expect("graph");
    let mut sched2 = Some(sched2);
    let (mut orch1, mut sched1) = graph::<()>(GraphConfig::default()).expect("graph");
    let mut rounds = Rounds::new(REPS)
        .warmup(1)
        .variant("strata", move || {
            let (d, s) = two_threads(dag, keys, &mut orch2, sched2.take().expect("scheduler"));
            sched2 = Some(s);
            per_task(d)
        })
        .variant("strata 1-thread", move || {
            per_task(one_thread(dag, keys, &mut orch1, &mut sched1))
        });
    if let Some(bin) = omp_bin {
        rounds = rounds
            .variant("openmp", move || omp(bin, dag.name()).unwrap_or(f64::NAN))
            .baseline("openmp");
        if matches!(dag, Dag::Fan) {
            rounds = rounds.variant("openmp taskgroup", move || {
                omp(bin, "fan_taskgroup").unwrap_or(f64::NAN)
            });
        }
    }
    if let Ok(bin) = &peers.tbb {
        let rerun = tbb_rerun.clone();
        rounds = rounds.variant("tbb flow graph", move || {
            let v = peer::run_peer(Command::new(bin).arg(dag.name()))
                .map(|o| peer::last_line_numbers(&o))
                .unwrap_or_default();
            rerun
                .borrow_mut()
                .push(v.get(1).copied().unwrap_or(f64::NAN));
            v.first().copied().unwrap_or(f64::NAN)
        });
    }
    if let Ok(bin) = &peers.starpu {
        rounds = rounds.variant("starpu", move || {
            peer::run_peer(
                Command::new(bin)
                    .arg(dag.name())
                    .env("STARPU_NCPU", "2")
                    .env("STARPU_SILENT", "1"),
            )
            .map(|o| peer::last_line_numbers(&o))
            .ok()
            .and_then(|v| v.first().copied())
            .unwrap_or(f64::NAN)
        });
    }
    rounds.run()
}

// ----- many views of one buffer --------------------------------------------------------

/// Wavefront tile grids (tiles per side) and the tile edge, in elements.
const TILE_GRIDS: [usize; 3] = [16, 32, 48];
const TILE: u64 = 4;
/// Fan-out width and rounds of the slice fan.
const SLICES: usize = 1000;
const SLICE_ROUNDS: usize = 4;

/// The argument lists of a DAG over views of one buffer (`shared`) or one buffer per view.
fn view_dag(m: &IdentityMinter, kind: &str, n: usize, shared: bool) -> Vec<Vec<Access>> {
    let key = || BufferKey::new(m.mint(), KeySpace::Host);
    let mut tasks = vec![];
    if kind == "tiles" {
        let side = n as u64 * TILE;
        let grid = TensorView::contiguous(DataType::U64, &[side, side]).expect("grid");
        let one = key();
        let own: Vec<BufferKey> = (0..n * n).map(|_| key()).collect();
        let tile = |i: usize, j: usize, tag: ArgTag| {
            if !shared {
                return Access::new(own[i * n + j], Footprint::WHOLE, tag);
            }
            let v = grid
                .window(&[i as u64 * TILE, j as u64 * TILE], &[TILE, TILE])
                .expect("tile");
            Access::new(one, Footprint::of_view(&v), tag)
        };
        for i in 0..n {
            for j in 0..n {
                let mut a = vec![];
                if i > 0 {
                    a.push(tile(i - 1, j, ArgTag::Input));
                }
                if j > 0 {
                    a.push(tile(i, j - 1, ArgTag::Input));
                }
                a.push(tile(i, j, ArgTag::OutputExisting));
                tasks.push(a);
            }
        }
    } else {
        let y = TensorView::contiguous(DataType::U64, &[n as u64]).expect("y");
        let (x, ys) = (key(), key());
        let own: Vec<BufferKey> = (0..n).map(|_| key()).collect();
        let slice = |i: usize| {
            if shared {
                let v = y.slice(0, i as u64, i as u64 + 1).expect("slice");
                Access::new(ys, Footprint::of_view(&v), ArgTag::OutputExisting)
            } else {
                Access::new(own[i], Footprint::WHOLE, ArgTag::OutputExisting)
            }
        };
        let mut sink: Vec<Access> = if shared {
            vec![Access::new(ys, Footprint::of_view(&y), ArgTag::Input)]
        } else {
            own.iter().map(|k| acc(*k, ArgTag::Input)).collect()
        };
        sink.push(acc(x, ArgTag::InOut));
        for _ in 0..SLICE_ROUNDS {
            tasks.push(vec![acc(x, ArgTag::InOut)]);
            for i in 0..n {
                tasks.push(vec![acc(x, ArgTag::Input), slice(i)]);
            }
            tasks.push(sink.clone());
        }
    }
    tasks
}

/// A graph that builds the whole run of `tasks` before draining it, run after run.
struct SubmitBench<'a> {
    tasks: &'a [Vec<Access>],
    orch: Orchestrator<()>,
    sched: Scheduler<()>,
}

impl<'a> SubmitBench<'a> {
    fn new(tasks: &'a [Vec<Access>]) -> Self {
        let (orch, sched) = graph::<()>(GraphConfig::default()).expect("graph");
        SubmitBench { tasks, orch, sched }
    }

    /// One run: µs per `submit`, and the TensorMap entries examined per submit.
    fn once(&mut self) -> (f64, f64) {
        let (orch, sched, tasks) = (&mut self.orch, &mut self.sched, self.tasks);
        let run = orch.begin_run().expect("begin");
        let mut queue: VecDeque<TaskRef> = VecDeque::new();
        let v0 = orch.tensormap_visits();
        let t0 = Instant::now();
        for a in tasks {
            let s = orch.submit(TaskSpec::new((), a)).expect("submit");
            if s.ready {
                queue.push_back(s.task);
            }
        }
        let elapsed = t0.elapsed();
        let visits = orch.tensormap_visits() - v0;
        orch.close_run().expect("close");
        let mut newly = Vec::new();
        let mut executed = 0;
        while let Some(t) = queue.pop_front() {
            if sched.claim(t).is_some() {
                sched.complete(t, Ok(()), &mut newly).expect("complete");
                executed += 1;
                queue.extend(newly.drain(..).map(|r| r.task));
            }
        }
        assert_eq!(orch.wait_run(run, None).expect("wait"), Some(Ok(())));
        assert_eq!(executed, tasks.len());
        orch.release_run(run).expect("release");
        (
            elapsed.as_secs_f64() * 1e6 / tasks.len() as f64,
            visits as f64 / tasks.len() as f64,
        )
    }
}

/// One row of the many-views table: a DAG over views of one buffer and the same DAG with
/// one buffer per view.
struct ViewCase {
    label: String,
    name: String,
    one: Vec<Vec<Access>>,
    sep: Vec<Vec<Access>>,
}

/// The many-views table; appends its JSON fields.
fn views(json: &mut Json) {
    let m = IdentityMinter::new();
    let case = |label: String, name: String, kind: &str, n: usize| ViewCase {
        label,
        name,
        one: view_dag(&m, kind, n, true),
        sep: view_dag(&m, kind, n, false),
    };
    let mut cases = vec![];
    for n in TILE_GRIDS {
        cases.push(case(
            format!("wavefront, {} tiles", n * n),
            format!("tiles_{}", n * n),
            "tiles",
            n,
        ));
    }
    cases.push(case(
        format!("fan, {SLICES} slices"),
        format!("slices_{SLICES}"),
        "slices",
        SLICES,
    ));
    println!("submit: µs per task, whole run built before it executes (median of {REPS} rounds, the two variants alternating; ratio = one buffer / per view, median of per-round ratios)");
    println!(
        "{:<24} {:>8} {:>12} {:>14} {:>12} {:>14} {:>8}",
        "dag", "tasks", "one buffer", "entries seen", "per view", "entries seen", "ratio"
    );
    for c in &cases {
        let (mut one, mut sep) = (SubmitBench::new(&c.one), SubmitBench::new(&c.sep));
        let (mut seen, mut seen_sep) = (0.0, 0.0);
        let report = Rounds::new(REPS)
            .warmup(1)
            .variant("one buffer", || {
                let (us, v) = one.once();
                seen = v;
                us
            })
            .variant("per view", || {
                let (us, v) = sep.once();
                seen_sep = v;
                us
            })
            .baseline("per view")
            .run();
        let (us, us_sep) = (report.median("one buffer"), report.median("per view"));
        let ratio = report.ratio_median("one buffer");
        println!(
            "{:<24} {:>8} {us:>12.3} {seen:>14.1} {us_sep:>12.3} {seen_sep:>14.1} {ratio:>8.2}",
            c.label,
            c.one.len()
        );
        let name = &c.name;
        json.num(&format!("{name}_submit_us"), us, 4)
            .num(&format!("{name}_sep_submit_us"), us_sep, 4)
            .num(&format!("{name}_entries_seen"), seen, 2)
            .num(&format!("{name}_ratio_vs_sep"), ratio, 3);
    }
}

/// The external peers: built programs, or why each is missing.
struct Peers {
    omp: Option<PathBuf>,
    tbb: Result<PathBuf, String>,
    starpu: Result<PathBuf, String>,
}

fn peer_src(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches/peers")
        .join(file)
}

/// oneTBB's flow graph peer: installs `libtbb-dev` if its header is missing, then builds
/// `benches/peers/tbb_dag.cpp` with `$CXX` (else `c++`).
fn build_tbb() -> Result<PathBuf, String> {
    let header = || {
        [
            "/usr/include/oneapi/tbb/flow_graph.h",
            "/usr/include/tbb/flow_graph.h",
        ]
        .iter()
        .any(|h| Path::new(h).exists())
    };
    peer::ensure_apt("oneTBB (libtbb-dev)", &["libtbb-dev"], header)?;
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    peer::build_program(
        "tbb_dag",
        &cxx,
        &["-std=c++17"],
        &peer_src("tbb_dag.cpp"),
        &["-ltbb".into()],
    )
}

/// StarPU 1.3's peer: installs `libstarpu-dev` (and `pkg-config`) if pkg-config does not
/// know `starpu-1.3`, then builds `benches/peers/starpu_dag.c`.
fn build_starpu() -> Result<PathBuf, String> {
    peer::ensure_apt(
        "StarPU (libstarpu-dev)",
        &["libstarpu-dev", "pkg-config"],
        || peer::pkg_config_has("starpu-1.3"),
    )?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    peer::build_program(
        "starpu_dag",
        &cc,
        &[],
        &peer_src("starpu_dag.c"),
        &peer::pkg_config_flags("starpu-1.3")?,
    )
}

const OMP_SRC: &str = r#"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CHAIN 100000
#define ROUNDS 100
#define WIDTH 1000
#define WAVE 300
static long X, Y[WIDTH];
static long A[WAVE][WAVE];
static double chain(void) {
  double t0 = omp_get_wtime();
  #pragma omp parallel
  #pragma omp single
  for (long i = 0; i < CHAIN; i++) {
    #pragma omp task depend(inout: X)
    { X++; }
  }
  return (omp_get_wtime() - t0) * 1e6 / CHAIN;
}
static double fan(int taskgroup) {
  double t0 = omp_get_wtime();
  #pragma omp parallel
  #pragma omp single
  for (int r = 0; r < ROUNDS; r++) {
    #pragma omp task depend(inout: X)
    { X++; }
    if (taskgroup) {
      #pragma omp taskgroup
      {
        for (int i = 0; i < WIDTH; i++) {
          #pragma omp task depend(in: X) depend(out: Y[i])
          { Y[i] = X; }
        }
      }
      #pragma omp task depend(inout: X)
      { long s = 0; for (int i = 0; i < WIDTH; i++) s += Y[i]; X += s > 0; }
    } else {
      for (int i = 0; i < WIDTH; i++) {
        #pragma omp task depend(in: X) depend(out: Y[i])
        { Y[i] = X; }
      }
      #pragma omp task depend(iterator(j = 0:WIDTH), in: Y[j]) depend(inout: X)
      { long s = 0; for (int i = 0; i < WIDTH; i++) s += Y[i]; X += s > 0; }
    }
  }
  return (omp_get_wtime() - t0) * 1e6 / (ROUNDS * (WIDTH + 2.0));
}
static double wavefront(void) {
  double t0 = omp_get_wtime();
  #pragma omp parallel
  #pragma omp single
  for (int i = 0; i < WAVE; i++)
    for (int j = 0; j < WAVE; j++) {
      if (i > 0 && j > 0) {
        #pragma omp task depend(in: A[i-1][j], A[i][j-1]) depend(out: A[i][j])
        { A[i][j] = A[i-1][j] + A[i][j-1]; }
      } else if (i > 0) {
        #pragma omp task depend(in: A[i-1][j]) depend(out: A[i][j])
        { A[i][j] = A[i-1][j]; }
      } else if (j > 0) {
        #pragma omp task depend(in: A[i][j-1]) depend(out: A[i][j])
        { A[i][j] = A[i][j-1]; }
      } else {
        #pragma omp task depend(out: A[i][j])
        { A[i][j] = 1; }
      }
    }
  return (omp_get_wtime() - t0) * 1e6 / (WAVE * WAVE);
}
int main(int argc, char **argv) {
  const char *w = argv[1];
  double us = !strcmp(w, "chain") ? chain()
            : !strcmp(w, "fan") ? fan(0)
            : !strcmp(w, "fan_taskgroup") ? fan(1)
            : wavefront();
  printf("%f\n", us);
  return 0;
}
"#;

/// Builds the OpenMP peer; `None` (with a reason printed) if no OpenMP compiler is present.
fn build_omp() -> Option<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("strata-omp-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("omp_dag.c");
    let bin = dir.join("omp_dag");
    std::fs::write(&src, OMP_SRC).ok()?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    match Command::new(&cc)
        .args(["-O2", "-fopenmp", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
    {
        Ok(s) if s.success() => Some(bin),
        Ok(s) => {
            eprintln!(
                "OpenMP peer: `{cc} -fopenmp` failed ({s}); install gcc (Debian: build-essential)"
            );
            None
        }
        Err(e) => {
            eprintln!("OpenMP peer: cannot run `{cc}`: {e}; install gcc (Debian: build-essential)");
            None
        }
    }
}

/// One launch of the OpenMP peer: µs per task (`None` if it fails).
fn omp(bin: &std::path::Path, which: &str) -> Option<f64> {
    let out = Command::new(bin)
        .arg(which)
        .env("OMP_NUM_THREADS", "2")
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<f64>()
        .ok()
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let machine = Machine::now();
    println!("{}", machine.line());
    let keys = keys();
    let peers = Peers {
        omp: build_omp(),
        tbb: build_tbb(),
        starpu: build_starpu(),
    };
    for (name, p) in [("oneTBB flow graph", &peers.tbb), ("StarPU", &peers.starpu)] {
        if let Err(why) = p {
            println!("{name} peer skipped: {why}");
        }
    }
    let mut rows = vec![];
    let mut peer_rows = vec![];
    let mut json = Json::new();
    let mut taskgroup = None;
    // STRATA_BENCH_DAGS=chain,fan limits the run (for profiling).
    let only = std::env::var("STRATA_BENCH_DAGS").ok();
    for dag in [Dag::Chain, Dag::Fan, Dag::Wavefront] {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|n| n == dag.name()))
        {
            continue;
        }
        let tbb_rerun = Rc::new(RefCell::new(Vec::new()));
        let report = dag_rounds(dag, &keys, &peers, &tbb_rerun);
        println!("{} ({} tasks), µs per task:", dag.name(), dag.tasks());
        print!("{}", report.table("µs", 3));
        let two = report.median("strata");
        let one = report.median("strata 1-thread");
        let has = |v: &str| report.names().iter().any(|n| n == v);
        let peer = has("openmp")
            .then(|| report.median("openmp"))
            .filter(|v| v.is_finite());
        let (ratio, ratio_one) = if has("openmp") {
            (
                report.ratio_median("strata"),
                report.ratio_median("strata 1-thread"),
            )
        } else {
            (f64::NAN, f64::NAN)
        };
        if has("openmp taskgroup") {
            taskgroup = Some(report.median("openmp taskgroup")).filter(|v| v.is_finite());
        }
        let name = dag.name();
        let fig = |v: &str| has(v).then(|| report.median(v)).filter(|x| x.is_finite());
        let vs = |v: &str| {
            fig(v)
                .map(|_| report.ratio_median_vs("strata", v))
                .filter(|x| x.is_finite())
        };
        let tbb = fig("tbb flow graph");
        let tbb_rerun = Some(median(&tbb_rerun.borrow())).filter(|x| x.is_finite());
        let starpu = fig("starpu");
        let (vs_tbb, vs_starpu) = (vs("tbb flow graph"), vs("starpu"));
        json.opt(&format!("tbb_{name}_us"), tbb, 4)
            .opt(&format!("tbb_{name}_rerun_us"), tbb_rerun, 4)
            .opt(&format!("starpu_{name}_us"), starpu, 4)
            .opt(&format!("{name}_ratio_vs_tbb"), vs_tbb, 3)
            .opt(&format!("{name}_ratio_vs_starpu"), vs_starpu, 3);
        peer_rows.push((
            name, two, peer, tbb, tbb_rerun, starpu, ratio, vs_tbb, vs_starpu,
        ));
        json.num(&format!("{name}_us"), two, 4)
            .num(&format!("{name}_us_single_thread"), one, 4)
            .opt(&format!("omp_{name}_us"), peer, 4)
            .num(&format!("{name}_ratio_vs_omp"), ratio, 3)
            .num(&format!("{name}_single_ratio_vs_omp"), ratio_one, 3);
        rows.push((name, dag.tasks(), two, one, peer, ratio));
    }
    json.opt("omp_fan_taskgroup_us", taskgroup, 4);
    println!();
    println!("graph: µs per task (median of {REPS} rounds; strata = orchestrator + scheduler thread, OpenMP = 2 threads; ratio = strata / OpenMP, median of per-round ratios)");
    println!(
        "{:<10} {:>8} {:>12} {:>14} {:>12} {:>10} {:>8}",
        "dag", "tasks", "strata", "strata 1-thr", "openmp", "speedup", "ratio"
    );
    for (name, n, two, one, peer, ratio) in &rows {
        let p = peer.map_or("n/a".to_string(), |v| format!("{v:.3}"));
        let s = peer.map_or("n/a".to_string(), |v| format!("{:.2}x", v / two));
        println!("{name:<10} {n:>8} {two:>12.3} {one:>14.3} {p:>12} {s:>10} {ratio:>8.3}");
    }
    if let Some(tg) = taskgroup {
        println!(
            "(OpenMP fan with a taskgroup barrier instead of an iterator fan-in: {tg:.3} µs/task)"
        );
    }
    println!();
    println!("peers: µs per task (medians of {REPS} rounds); strata / peer = median of per-round ratios; goals: vs OpenMP <= 0.667 (1.5x faster), vs TBB <= 1");
    println!(
        "{:<10} {:>9} {:>9} {:>9} {:>11} {:>9} {:>16} {:>16} {:>10}",
        "dag",
        "strata",
        "openmp",
        "tbb",
        "tbb re-run",
        "starpu",
        "vs openmp",
        "vs tbb",
        "vs starpu"
    );
    let f = |v: Option<f64>, d: usize| v.map_or("null".to_string(), |x| format!("{x:.d$}"));
    for (name, two, omp, tbb, rerun, starpu, r_omp, r_tbb, r_starpu) in &peer_rows {
        let r_omp = Some(*r_omp).filter(|x| x.is_finite());
        let goal = |r: Option<f64>, g: f64| match r {
            Some(x) if x <= g => " (met)",
            Some(_) => " (missed)",
            None => "",
        };
        println!(
            "{name:<10} {two:>9.3} {:>9} {:>9} {:>11} {:>9} {:>16} {:>16} {:>10}",
            f(*omp, 3),
            f(*tbb, 3),
            f(*rerun, 3),
            f(*starpu, 3),
            f(r_omp, 3) + goal(r_omp, 1.0 / 1.5),
            f(*r_tbb, 3) + goal(*r_tbb, 1.0),
            f(*r_starpu, 3),
        );
    }
    if only
        .as_deref()
        .is_none_or(|o| o.split(',').any(|n| n == "views"))
    {
        views(&mut json);
    }
    json.int("rounds", REPS as u64).machine(&machine);
    println!("{}", json.line());
}
