//! `cargo xtask bench dispatch`: the L3 engine's dispatch costs (`harness = false`).
//!
//! 1. **Round trip** of one run with one no-op next-level task — `DistWorker::run` =
//!    submit (the host orchestration on this thread) → scheduler thread → mailbox →
//!    forked chip child (an empty chip orchestration) → completion → wait — next to the
//!    machine's floor measured in the same run: two processes ping-ponging one cache line
//!    in shared memory, pinned to CPU 0 / CPU 1 (as `cargo xtask bench mailbox`). Also
//!    printed, to split the chip figure: the same round trip with a no-op *sub-worker*
//!    task (no emulator behind the mailbox), and the empty chip orchestration run by a
//!    `ChipWorker` in this process (the emulator's own share).
//! 2. **µs per task** (run wall time / tasks, submit + wait) for DAGs of no-op sub-worker
//!    tasks on 2 sub-workers, in `Process` and in `Threads` mode, dependencies inferred
//!    from tags on `SharedTensor`s (the argument lists are built once, outside the timed
//!    runs; the table also shows the share of `submit`, i.e. of the orchestration building
//!    the run while its first tasks already execute):
//!    - chain: `CHAIN` tasks, each `INOUT` on one 1-element tensor;
//!    - fan: `FAN_ROUNDS` rounds of 1 → `FAN_WIDTH` → 1 (root `INOUT x`; reader `i`
//!      `INPUT x`, `OUTPUT_EXISTING y[i]` (a 1-element slice of `y`); sink `INPUT y` (all
//!      of it), `INOUT x`);
//!    - wavefront: a `WAVE` × `WAVE` grid of `TILE` × `TILE` tiles of one 2-D tensor, tile
//!      (i, j) `INPUT` (i−1, j) and (i, j−1), `OUTPUT_EXISTING` (i, j); and, to separate the
//!      cost of many disjoint views of one buffer, the same DAG with one tensor per tile.
//! 3. **init + close** of a `Process`-mode worker with 4 chips (`ChipConfig::default()`)
//!    and 2 sub-workers.
//!
//! 4. **Side by side (issue 15)**, in the same rounds as the Process-mode round trips:
//!    strata's own mailbox round trip (a no-op task to a forked child, as `bench mailbox`;
//!    goal: an L3 round trip ≤ 4× it), a Process-mode chain of `CHAIN` sub tasks on a
//!    fresh worker, and the Python peers — `multiprocessing` (`Pipe` round trip and
//!    `Pool.apply`) and Ray (`ray.get(f.remote(x))`, installed into a venv under
//!    `target/peers/` on first use; skipped with the reason printed, `null` in the JSON,
//!    if it cannot be installed) — each launched once per round doing the same no-op
//!    round trip and the same chain (`benches/peers/dispatch_peers.py`; goal: strata ≥ 50×
//!    faster on both). In the DAG rounds, strata-graph alone (one thread, build then
//!    drain) runs the same four DAGs (goal: Process mode ≤ 2× it per task). In the
//!    lifecycle rounds, init alternates with forking and reaping six bare children
//!    (goal: init ≤ 1.5× that).
//!
//! Forking: `init` in `Process` mode refuses to fork while this process runs other
//! threads, so everything in `Process` mode comes first (each worker is closed — its
//! scheduler thread joined — before the next starts), then `Threads` mode, then the
//! in-process chip. The bench checks the process is single-threaded before each fork.
//!
//! **Rounds.** Side-by-side figures alternate in `ROUNDS` rounds (A B C, C B A, …): the
//! Process-mode round trips with the floor (a fresh worker per round, since `init` forks
//! only from a single-threaded process), the four DAGs of a mode with each other (one
//! worker, one warm-up round; the tiles-of-one-tensor wavefront is compared with the
//! tensor-per-tile one), and the Threads-mode round trips and the in-process chip run with
//! a two-thread ping-pong floor. Each figure is the median over the rounds; a ratio is
//! the median of the per-round ratios. The machine (CPU model, load average) heads the
//! output.
//!
//! Prints a table, then as its very last line one JSON object: `l3_rtt_us`,
//! `floor_rtt_us`, `ratio`, `threads_{chain,fan,wavefront}_us`,
//! `process_{chain,fan,wavefront}_us`, `init_ms`, `close_ms` (medians), plus the
//! decomposition keys `l3_sub_rtt_us`, `sub_ratio`, `chip_run_us`,
//! `{process,threads}_wavefront_sep_us`; from the rounds `ratio_round_median`,
//! `sub_ratio_round_median`, `{process,threads}_wavefront_vs_sep`, `threads_floor_rtt_us`,
//! `threads_l3_rtt_us`, `threads_sub_rtt_us`, `rounds` and the `machine_` keys.

#[path = "dispatch_parts/side.rs"]
mod side;

use std::cell::RefCell;
use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, ChipWorker, RunArgs};
use strata_dist::{DistConfig, DistWorker, HostOrchHandle};
use strata_host::{ExecMode, SharedTensor};
use strata_types::{ArgTag, CallConfig, DataType, TaskArgs};

// ----- sizes ---------------------------------------------------------------------------

/// Rounds of the side-by-side parts.
const ROUNDS: usize = 5;
/// Round trips: warm-up runs, then timed runs (each timed on its own), per round.
const RTT_WARMUP: usize = 2_000;
const RTT_RUNS: usize = 4_000;
/// Floor: per-batch averages of `FLOOR_PER_BATCH` ping-pongs, `FLOOR_BATCHES` per round.
const FLOOR_WARMUP: usize = 20_000;
const FLOOR_BATCHES: usize = 80;
const FLOOR_PER_BATCH: usize = 1_000;
/// DAGs: one warm-up run, then `DAG_REPS` timed runs per DAG and mode.
const CHAIN: usize = 1_000;
const FAN_ROUNDS: usize = 4;
const FAN_WIDTH: usize = 254;
const WAVE: usize = 32;
/// Wavefront tiles are `TILE` × `TILE` elements.
const TILE: u64 = 4;
const DAG_REPS: usize = 15;
/// init + close: one warm-up cycle, then this many timed cycles.
const LIFECYCLE_REPS: usize = 10;
const LIFECYCLE_CHIPS: usize = 4;
const SUBS: usize = 2;

use strata_testkit::bench::{
    assert_single_threaded, median, min, pingpong_threads_ns, quantile, FloorSpec, Json, Machine,
    Rounds, RoundsReport,
};

/// Per-batch average RTTs (µs) of the raw two-process cache-line ping-pong.
fn floor(pinned: bool) -> Vec<f64> {
    let spec = FloorSpec {
        warmup: FLOOR_WARMUP,
        batches: FLOOR_BATCHES,
        per_batch: FLOOR_PER_BATCH,
    };
    strata_testkit::bench::pingpong_floor_ns(pinned, spec)
        .into_iter()
        .map(|ns| ns / 1000.0)
        .collect()
}

// ----- 2. round trips ------------------------------------------------------------------

/// Times `RTT_RUNS` runs of `orch` one by one (after `RTT_WARMUP`); µs per run.
fn time_runs(w: &mut DistWorker, orch: &HostOrchHandle) -> Vec<f64> {
    let args = TaskArgs::new();
    for _ in 0..RTT_WARMUP {
        w.run(orch, &args).expect("warm-up run");
    }
    let mut out = Vec::with_capacity(RTT_RUNS);
    for _ in 0..RTT_RUNS {
        let t = Instant::now();
        w.run(orch, &args).expect("run");
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

/// One run = one no-op chip orchestration on chip 0 of a 1-chip worker.
fn chip_rtt(mode: ExecMode) -> Vec<f64> {
    let mut w =
        DistWorker::new(DistConfig::l3(vec![ChipConfig::default()], 0).with_exec_mode(mode))
            .expect("worker");
    let empty = w
        .register_chip_orchestration("bench.empty", |_, _| Ok(()))
        .expect("chip orchestration");
    let orch = w.register_orchestration("bench.one_chip_task", move |o, _| {
        o.submit_next_level(empty, &TaskArgs::new(), 0)?;
        Ok(())
    });
    if mode == ExecMode::Process {
        assert_single_threaded("init (chip round trip)");
    }
    w.init().expect("init");
    let v = time_runs(&mut w, &orch);
    w.close().expect("close");
    v
}

/// One run = one no-op sub-worker task on a worker with one sub-worker.
fn sub_rtt(mode: ExecMode) -> Vec<f64> {
    let mut w = DistWorker::new(DistConfig::l3(vec![], 1).with_exec_mode(mode)).expect("worker");
    let noop = w.register_sub("bench.noop", |_| Ok(()));
    let orch = w.register_orchestration("bench.one_sub_task", move |o, _| {
        o.submit_sub(&noop, &TaskArgs::new())?;
        Ok(())
    });
    if mode == ExecMode::Process {
        assert_single_threaded("init (sub round trip)");
    }
    w.init().expect("init");
    let v = time_runs(&mut w, &orch);
    w.close().expect("close");
    v
}

/// µs per task of a chain of `CHAIN` no-op sub tasks on a fresh Process-mode worker with
/// `SUBS` sub-workers: the median of `CHAIN_RUNS` runs after one warm-up run.
fn process_chain() -> f64 {
    const CHAIN_RUNS: usize = 5;
    let mut w = DistWorker::new(DistConfig::l3(vec![], SUBS)).expect("worker");
    let noop = w.register_sub("bench.noop", |_| Ok(()));
    let (args, tensors) = dag_args(&w, Dag::Chain);
    let orch = w.register_orchestration("bench.chain", move |o, _| {
        for a in &args {
            o.submit_sub(&noop, a)?;
        }
        Ok(())
    });
    assert_single_threaded("init (chain)");
    w.init().expect("init");
    let none = TaskArgs::new();
    let mut v = Vec::with_capacity(CHAIN_RUNS);
    for i in 0..=CHAIN_RUNS {
        let t = Instant::now();
        w.run(&orch, &none).expect("chain run");
        if i > 0 {
            v.push(t.elapsed().as_secs_f64() * 1e6 / CHAIN as f64);
        }
    }
    w.close().expect("close");
    drop(tensors);
    median(&v)
}

/// The empty chip orchestration run by a `ChipWorker` in this process (µs per run): the
/// emulator's share of the chip round trip. Starts threads: call after every fork.
fn chip_local_run() -> Vec<f64> {
    let mut chip = ChipWorker::new(ChipConfig::default()).expect("chip");
    let empty = chip
        .register_orchestration_fn("bench.empty", |_, _| Ok(()))
        .expect("orchestration");
    chip.init().expect("chip init");
    let cfg = CallConfig::default();
    let mut out = Vec::with_capacity(RTT_RUNS);
    for i in 0..RTT_WARMUP + RTT_RUNS {
        let mut args = RunArgs::new();
        let t = Instant::now();
        chip.run(&empty, &mut args, &cfg).expect("chip run");
        if i >= RTT_WARMUP {
            out.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    chip.close().expect("chip close");
    out
}

// ----- 3. DAGs -------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dag {
    Chain,
    Fan,
    Wavefront,
    WavefrontSep,
}

impl Dag {
    const ALL: [Dag; 4] = [Dag::Chain, Dag::Fan, Dag::Wavefront, Dag::WavefrontSep];

    fn tasks(self) -> usize {
        match self {
            Dag::Chain => CHAIN,
            Dag::Fan => FAN_ROUNDS * (FAN_WIDTH + 2),
            Dag::Wavefront | Dag::WavefrontSep => WAVE * WAVE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dag::Chain => "chain",
            Dag::Fan => "fan",
            Dag::Wavefront => "wavefront",
            Dag::WavefrontSep => "wavefront_sep",
        }
    }

    fn label(self) -> String {
        match self {
            Dag::Chain => format!("chain ({CHAIN} tasks)"),
            Dag::Fan => format!(
                "fan 1->{FAN_WIDTH}->1 x{FAN_ROUNDS} ({} tasks)",
                self.tasks()
            ),
            Dag::Wavefront => format!("wavefront {WAVE}x{WAVE} ({} tasks)", self.tasks()),
            Dag::WavefrontSep => "  same, one tensor per tile".into(),
        }
    }
}

fn task_args(tensors: &[strata_types::TensorArg]) -> TaskArgs {
    let mut a = TaskArgs::new();
    for t in tensors {
        a.push_tensor(*t).expect("a tensor argument");
    }
    a
}

/// The argument lists of every task of `dag`, in submit order (built once, outside the
/// timed runs: the bench measures the engine, not argument building), and the tensors
/// they name (which must outlive every task that uses them).
fn dag_args(w: &DistWorker, dag: Dag) -> (Vec<TaskArgs>, Vec<SharedTensor>) {
    match dag {
        Dag::Chain => {
            let x = w.shared_tensor(&[1], DataType::U64).expect("x");
            let a = task_args(&[x.arg(ArgTag::InOut)]);
            (vec![a; CHAIN], vec![x])
        }
        Dag::Fan => {
            let x = w.shared_tensor(&[1], DataType::U64).expect("x");
            let y = w
                .shared_tensor(&[FAN_WIDTH as u64], DataType::U64)
                .expect("y");
            let root = task_args(&[x.arg(ArgTag::InOut)]);
            let readers: Vec<TaskArgs> = (0..FAN_WIDTH as u64)
                .map(|i| {
                    let yi = y.view().slice(0, i, i + 1).expect("slice");
                    task_args(&[
                        x.arg(ArgTag::Input),
                        y.arg_view(yi, ArgTag::OutputExisting).expect("view"),
                    ])
                })
                .collect();
            let sink = task_args(&[y.arg(ArgTag::Input), x.arg(ArgTag::InOut)]);
            let mut v = Vec::with_capacity(dag.tasks());
            for _ in 0..FAN_ROUNDS {
                v.push(root.clone());
                v.extend(readers.iter().cloned());
                v.push(sink.clone());
            }
            (v, vec![x, y])
        }
        Dag::Wavefront | Dag::WavefrontSep => {
            let (n, b) = (WAVE as u64, TILE);
            // Tiles of one 2-D tensor, or (the variant) one tensor per tile.
            let grid = w
                .shared_tensor(&[n * b, n * b], DataType::U64)
                .expect("grid");
            let tiles: Vec<_> = if dag == Dag::WavefrontSep {
                (0..n * n)
                    .map(|_| w.shared_tensor(&[b, b], DataType::U64).expect("tile"))
                    .collect()
            } else {
                Vec::new()
            };
            let tile = |i: u64, j: u64, tag: ArgTag| {
                if dag == Dag::WavefrontSep {
                    return tiles[(i * n + j) as usize].arg(tag);
                }
                let v = grid
                    .view()
                    .slice(0, i * b, (i + 1) * b)
                    .and_then(|v| v.slice(1, j * b, (j + 1) * b))
                    .expect("tile view");
                grid.arg_view(v, tag).expect("tile")
            };
            let mut v = Vec::with_capacity(dag.tasks());
            for i in 0..n {
                for j in 0..n {
                    let mut a = Vec::with_capacity(3);
                    if i > 0 {
                        a.push(tile(i - 1, j, ArgTag::Input));
                    }
                    if j > 0 {
                        a.push(tile(i, j - 1, ArgTag::Input));
                    }
                    a.push(tile(i, j, ArgTag::OutputExisting));
                    v.push(task_args(&a));
                }
            }
            let mut keep = tiles;
            keep.push(grid);
            (v, keep)
        }
    }
}

/// Per DAG: µs per task of whole runs (per round), and µs per task spent in `submit`.
struct DagTimes {
    run: [Vec<f64>; 4],
    submit: [Vec<f64>; 4],
    /// Median of the per-round ratios wavefront / wavefront with one tensor per tile.
    wavefront_vs_sep: f64,
    /// strata-graph alone on the same DAG (µs per task, median), and the median of the
    /// per-round ratios engine / graph core.
    core: [f64; 4],
    vs_core: [f64; 4],
}

/// µs per task of each DAG on a worker with `SUBS` sub-workers in `mode`: the four DAGs
/// alternate in `DAG_REPS` rounds after a warm-up round.
fn dags(mode: ExecMode) -> DagTimes {
    let mut w = DistWorker::new(DistConfig::l3(vec![], SUBS).with_exec_mode(mode)).expect("worker");
    let noop = w.register_sub("bench.noop", |_| Ok(()));
    // The tensors stay alive until the worker is closed.
    let mut tensors = Vec::new();
    let orchs: Vec<HostOrchHandle> = Dag::ALL
        .iter()
        .map(|&dag| {
            let (args, t) = dag_args(&w, dag);
            tensors.extend(t);
            w.register_orchestration(&format!("bench.{}", dag.name()), move |o, _| {
                for a in &args {
                    o.submit_sub(&noop, a)?;
                }
                Ok(())
            })
        })
        .collect();
    if mode == ExecMode::Process {
        assert_single_threaded("init (DAGs)");
    }
    w.init().expect("init");
    let none = TaskArgs::new();
    let worker = RefCell::new(w);
    let mut submit: [Vec<f64>; 4] = Default::default();
    let mut cores = Dag::ALL.map(side::Core::new);
    let mut rounds = Rounds::new(DAG_REPS).warmup(1);
    for ((k, dag), sub) in Dag::ALL.iter().enumerate().zip(&mut submit) {
        let (worker, orch, none) = (&worker, &orchs[k], &none);
        rounds = rounds.variant(dag.name(), move || {
            let per_task = |d: Duration| d.as_secs_f64() * 1e6 / dag.tasks() as f64;
            let mut w = worker.borrow_mut();
            let t = Instant::now();
            let mut h = w.submit(orch, none).expect("DAG submit");
            let submitted = t.elapsed();
            h.wait(None).expect("DAG run");
            let run = per_task(t.elapsed());
            sub.push(per_task(submitted));
            run
        });
    }
    for (dag, core) in Dag::ALL.iter().zip(cores.iter_mut()) {
        rounds = rounds.variant(format!("core {}", dag.name()), move || core.run());
    }
    let report = rounds.baseline(Dag::WavefrontSep.name()).run();
    // The warm-up round's submit shares are the first four entries.
    for sub in &mut submit {
        sub.remove(0);
    }
    worker.into_inner().close().expect("close");
    drop(tensors);
    DagTimes {
        run: Dag::ALL.map(|d| report.figures(d.name())),
        submit,
        wavefront_vs_sep: report.ratio_median(Dag::Wavefront.name()),
        core: Dag::ALL.map(|d| report.median(&format!("core {}", d.name()))),
        vs_core: Dag::ALL.map(|d| report.ratio_median_vs(d.name(), &format!("core {}", d.name()))),
    }
}

// ----- 4. init + close -----------------------------------------------------------------

/// (init ms, close ms, six forks ms, median of per-round ratios init / forks) of
/// `LIFECYCLE_REPS` rounds (after one warm-up): a cycle of a `Process`-mode worker with
/// `LIFECYCLE_CHIPS` chips and `SUBS` sub-workers alternating with forking and reaping
/// as many bare children.
fn lifecycle() -> (Vec<f64>, Vec<f64>, Vec<f64>, f64) {
    let close = RefCell::new(Vec::with_capacity(LIFECYCLE_REPS + 1));
    let report = Rounds::new(LIFECYCLE_REPS)
        .warmup(1)
        .variant("init", || {
            let mut w = DistWorker::new(DistConfig::l3(
                vec![ChipConfig::default(); LIFECYCLE_CHIPS],
                SUBS,
            ))
            .expect("worker");
            let noop = w.register_sub("bench.noop", |_| Ok(()));
            let _orch = w.register_orchestration("bench.lifecycle", move |o, _| {
                o.submit_sub(&noop, &TaskArgs::new())?;
                Ok(())
            });
            assert_single_threaded("init (lifecycle)");
            let t = Instant::now();
            w.init().expect("init");
            let t_init = t.elapsed();
            let t = Instant::now();
            w.close().expect("close");
            close.borrow_mut().push(t.elapsed().as_secs_f64() * 1e3);
            t_init.as_secs_f64() * 1e3
        })
        .variant("forks", || side::forks_ms(LIFECYCLE_CHIPS + SUBS))
        .baseline("forks")
        .run();
    let mut close = close.into_inner();
    close.remove(0); // the warm-up round's
    (
        report.figures("init"),
        close,
        report.figures("forks"),
        report.ratio_median("init"),
    )
}

// ----- main ----------------------------------------------------------------------------

/// "met" / "missed" / "n/a" (not measured) for a goal check on `value`.
fn verdict(met: bool, value: f64) -> &'static str {
    if !value.is_finite() {
        "n/a"
    } else if met {
        "met"
    } else {
        "missed"
    }
}

/// A variant's per-round figures, or one NaN if it was not run.
fn figures(r: &RoundsReport, name: &str) -> Vec<f64> {
    if r.names().iter().any(|n| n == name) {
        r.figures(name)
    } else {
        vec![f64::NAN]
    }
}

/// A variant's median per-round ratio to the baseline, or NaN if it was not run.
fn ratio(r: &RoundsReport, name: &str) -> f64 {
    if r.names().iter().any(|n| n == name) {
        r.ratio_median(name)
    } else {
        f64::NAN
    }
}

fn main() {
    let started = Instant::now();
    let machine = Machine::now();
    let cpus = machine.cpus;
    assert_single_threaded("start");

    // `STRATA_BENCH_ONLY=rtt|dags|lifecycle` runs one part (the others print NaN).
    let only = std::env::var("STRATA_BENCH_ONLY").unwrap_or_default();
    let want = |part: &str| only.is_empty() || only == part;
    let skip = || vec![f64::NAN];
    let skip_dags = || DagTimes {
        run: [skip(), skip(), skip(), skip()],
        submit: [skip(), skip(), skip(), skip()],
        wavefront_vs_sep: f64::NAN,
        core: [f64::NAN; 4],
        vs_core: [f64::NAN; 4],
    };
    let rtt = want("rtt");

    // Process mode and our own forks first, while this process is single-threaded: the
    // floor and the two round trips alternate, each round with fresh workers (all samples
    // are kept for the percentiles).
    let (mut fl, mut l3, mut sub) = (Vec::new(), Vec::new(), Vec::new());
    let (py, py_missing) = if rtt {
        side::py_peers()
    } else {
        (vec![], vec![])
    };
    for (name, why) in &py_missing {
        println!("{name} peer skipped: {why}");
    }
    let py_chain: Vec<RefCell<Vec<f64>>> = py.iter().map(|_| RefCell::new(vec![])).collect();
    let mut process_rtt = Rounds::new(ROUNDS).variant("floor", || {
        let v = floor(cpus >= 2);
        let m = median(&v);
        fl.extend(v);
        m
    });
    if rtt {
        process_rtt = process_rtt
            .variant("l3_rtt", || {
                let v = chip_rtt(ExecMode::Process);
                let m = median(&v);
                l3.extend(v);
                m
            })
            .variant("l3_sub_rtt", || {
                let v = sub_rtt(ExecMode::Process);
                let m = median(&v);
                sub.extend(v);
                m
            })
            .variant("mailbox", || median(&side::mailbox_rtt(cpus >= 2)))
            .variant("l3_chain", process_chain);
        for (p, chain) in py.iter().zip(&py_chain) {
            process_rtt = process_rtt.variant(p.name, move || {
                let (rtt, c) = p.measure();
                chain.borrow_mut().push(c);
                rtt
            });
        }
    }
    let process_rtt = process_rtt.baseline("floor").run();
    let (init, close, forks, init_vs_forks) = if want("lifecycle") {
        lifecycle()
    } else {
        (skip(), skip(), skip(), f64::NAN)
    };
    let process = if want("dags") {
        dags(ExecMode::Process)
    } else {
        skip_dags()
    };
    // Threads from here on.
    let threads = if want("dags") {
        dags(ExecMode::Threads)
    } else {
        skip_dags()
    };
    let (mut l3_threads, mut sub_threads, mut chip_local) = (Vec::new(), Vec::new(), Vec::new());
    let threads_rtt = if rtt {
        Rounds::new(ROUNDS)
            .variant("threads floor", || pingpong_threads_ns(20_000) / 1e3)
            .variant("l3_rtt, Threads", || {
                let v = chip_rtt(ExecMode::Threads);
                let m = median(&v);
                l3_threads.extend(v);
                m
            })
            .variant("l3_sub_rtt, Threads", || {
                let v = sub_rtt(ExecMode::Threads);
                let m = median(&v);
                sub_threads.extend(v);
                m
            })
            .variant("chip_run", || {
                let v = chip_local_run();
                let m = median(&v);
                chip_local.extend(v);
                m
            })
            .baseline("threads floor")
            .run()
    } else {
        Rounds::new(1).variant("threads floor", || f64::NAN).run()
    };
    let (l3_threads, sub_threads, chip_local) = if rtt {
        (l3_threads, sub_threads, chip_local)
    } else {
        (skip(), skip(), skip())
    };
    let (l3, sub) = if rtt { (l3, sub) } else { (skip(), skip()) };

    let floor_us = process_rtt.median("floor");
    let l3_us = median(&figures(&process_rtt, "l3_rtt"));
    let sub_us = median(&figures(&process_rtt, "l3_sub_rtt"));
    let ratio_of_medians = l3_us / floor_us;
    let sub_ratio = sub_us / floor_us;
    let per_task = |v: &[Vec<f64>; 4]| v.each_ref().map(|x| median(x));
    let p = per_task(&process.run);
    let t = per_task(&threads.run);
    let init_ms = median(&init);
    let close_ms = median(&close);
    let chip_run_us = median(&figures(&threads_rtt, "chip_run"));

    println!();
    println!(
        "strata-dist dispatch (L3 engine; {cpus} CPUs); {}",
        machine.line()
    );
    println!();
    println!(
        "round trip of one run with one no-op task: {ROUNDS} rounds, each {RTT_RUNS} runs timed one by one after {RTT_WARMUP} warm-up runs on a fresh worker; a round's figure is the median of its runs"
    );
    print!("{}", process_rtt.table("us", 3));
    print!("{}", threads_rtt.table("us", 3));
    println!("all runs of all rounds:");
    println!(
        "{:<54} {:>9} {:>9} {:>9} {:>9}",
        "measurement", "median", "min", "p10", "p90"
    );
    let row = |name: &str, v: &[f64]| {
        println!(
            "{:<54} {:>7.3}us {:>7.3}us {:>7.3}us {:>7.3}us",
            name,
            median(v),
            min(v),
            quantile(v, 0.1),
            quantile(v, 0.9)
        );
    };
    row("floor: cache-line ping-pong RTT (pinned, per batch)", &fl);
    row("L3 run, 1 chip task, forked chip child (l3_rtt)", &l3);
    row("L3 run, 1 sub task, forked sub child", &sub);
    row("L3 run, 1 chip task, Threads mode", &l3_threads);
    row("L3 run, 1 sub task, Threads mode", &sub_threads);
    row(
        "ChipWorker::run of the empty orchestration, in-process",
        &chip_local,
    );
    println!(
        "{:<54} {:>9.2}",
        "ratio l3_rtt / floor (goal <= 3)", ratio_of_medians
    );
    println!(
        "{:<54} {:>9.2}",
        "  median of the per-round ratios",
        ratio(&process_rtt, "l3_rtt")
    );
    println!("{:<54} {:>9.2}", "ratio sub round trip / floor", sub_ratio);
    println!(
        "{:<54} {:>9.2}",
        "  median of the per-round ratios",
        ratio(&process_rtt, "l3_sub_rtt")
    );
    println!();
    println!(
        "us per task of no-op sub tasks, {SUBS} sub-workers; median of {DAG_REPS} rounds, the DAGs alternating (min); submit = the orchestration's share"
    );
    println!(
        "{:<36} {:>18} {:>9} {:>18} {:>9}",
        "DAG", "Process", "submit", "Threads", "submit"
    );
    for (k, dag) in Dag::ALL.iter().enumerate() {
        println!(
            "{:<36} {:>8.3}us ({:>5.3}) {:>7.3}us {:>8.3}us ({:>5.3}) {:>7.3}us",
            dag.label(),
            p[k],
            min(&process.run[k]),
            median(&process.submit[k]),
            t[k],
            min(&threads.run[k]),
            median(&threads.submit[k]),
        );
    }
    println!(
        "wavefront / wavefront with one tensor per tile (median of per-round ratios): Process {:.3}, Threads {:.3}",
        process.wavefront_vs_sep, threads.wavefront_vs_sep
    );
    println!("goal: <= 1 us per task in Process mode");
    println!();
    println!(
        "Process-mode worker with {LIFECYCLE_CHIPS} chips + {SUBS} sub-workers; median of {LIFECYCLE_REPS} cycles (min)"
    );
    println!(
        "{:<40} {:>8.2}ms ({:.2})",
        "init (goal <= 10 ms)",
        init_ms,
        min(&init)
    );
    println!("{:<40} {:>8.2}ms ({:.2})", "close", close_ms, min(&close));
    let forks_ms = median(&forks);
    println!(
        "{:<40} {:>8.2}ms ({:.2})",
        format!("fork + reap {} bare children", LIFECYCLE_CHIPS + SUBS),
        forks_ms,
        min(&forks)
    );
    println!(
        "{:<40} {:>10.2} (goal <= 1.5: {})",
        "init / forks, median of per-round ratios",
        init_vs_forks,
        verdict(init_vs_forks <= 1.5, init_vs_forks)
    );

    // ----- side by side (issue 15)
    println!();
    println!("side by side, from the Process-mode round-trip rounds ({ROUNDS} rounds; ratios are medians of per-round ratios):");
    let has = |r: &RoundsReport, n: &str| r.names().iter().any(|x| x == n);
    let vs = |a: &str, b: &str| {
        if has(&process_rtt, a) && has(&process_rtt, b) {
            process_rtt.ratio_median_vs(a, b)
        } else {
            f64::NAN
        }
    };
    let mailbox_us = median(&figures(&process_rtt, "mailbox"));
    let (l3_vs_mb, sub_vs_mb) = (vs("l3_rtt", "mailbox"), vs("l3_sub_rtt", "mailbox"));
    println!(
        "{:<54} {:>9.3}us",
        "strata mailbox: no-op task RTT", mailbox_us
    );
    println!(
        "{:<54} {:>9.2} (goal <= 4: {})",
        "L3 chip round trip / mailbox",
        l3_vs_mb,
        verdict(l3_vs_mb <= 4.0, l3_vs_mb)
    );
    println!(
        "{:<54} {:>9.2} (goal <= 4: {})",
        "L3 sub round trip / mailbox",
        sub_vs_mb,
        verdict(sub_vs_mb <= 4.0, sub_vs_mb)
    );
    let l3_chain = figures(&process_rtt, "l3_chain");
    println!(
        "{:<54} {:>9.3}us",
        format!("L3 chain of {CHAIN} sub tasks, fresh worker (per task)"),
        median(&l3_chain)
    );
    println!(
        "{:<10} {:>11} {:>11} {:>16} {:>16} {:>16}   goal: strata >= 50x faster",
        "peer", "rtt us", "chain us", "vs sub rtt", "vs chip rtt", "vs chain"
    );
    let mut py_json = Vec::new();
    for (peer, chain) in py.iter().zip(&py_chain) {
        let chain = chain.borrow();
        let (rtt_us, chain_us) = (median(&figures(&process_rtt, peer.name)), median(&chain));
        // strata / peer, per round: below 0.02 is 50x faster.
        let r_sub = vs("l3_sub_rtt", peer.name);
        let r_chip = vs("l3_rtt", peer.name);
        let r_chain = side::ratio_median(&l3_chain, &chain);
        let x = |r: f64| format!("{:.1}x ({})", 1.0 / r, verdict(r <= 0.02, r));
        println!(
            "{:<10} {rtt_us:>11.2} {chain_us:>11.2} {:>16} {:>16} {:>16}",
            peer.name,
            x(r_sub),
            x(r_chip),
            x(r_chain)
        );
        py_json.push((peer.name, rtt_us, chain_us, r_sub, r_chip, r_chain));
    }
    for (name, why) in &py_missing {
        println!("{name:<10} {:>11} ({why})", "null");
    }
    println!();
    println!("L3 DAGs against strata-graph alone on the same DAG (one thread, build then drain), from the DAG rounds; goal: Process <= 2x the graph core");
    println!(
        "{:<36} {:>10} {:>10} {:>18} {:>10}",
        "DAG", "core us", "Process us", "Process / core", "Threads / core"
    );
    for (k, dag) in Dag::ALL.iter().enumerate() {
        let r = process.vs_core[k];
        println!(
            "{:<36} {:>10.3} {:>10.3} {:>18} {:>10.2}",
            dag.label(),
            process.core[k],
            p[k],
            format!("{r:.2} ({})", verdict(r <= 2.0, r)),
            threads.vs_core[k]
        );
    }
    println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
    let mut json = Json::new();
    json.num("mailbox_rtt_us", mailbox_us, 4)
        .num("l3_rtt_vs_mailbox", l3_vs_mb, 2)
        .num("l3_sub_rtt_vs_mailbox", sub_vs_mb, 2)
        .num("l3_chain_fresh_us", median(&l3_chain), 3)
        .num("forks_ms", forks_ms, 2)
        .num("init_vs_forks", init_vs_forks, 2);
    for (k, dag) in Dag::ALL.iter().enumerate() {
        let d = dag.name();
        json.num(&format!("core_{d}_us"), process.core[k], 4)
            .num(&format!("process_{d}_vs_core"), process.vs_core[k], 2)
            .num(&format!("threads_{d}_vs_core"), threads.vs_core[k], 2);
    }
    let fin = |v: f64| Some(v).filter(|x| x.is_finite());
    for (name, rtt_us, chain_us, r_sub, r_chip, r_chain) in py_json {
        json.opt(&format!("{name}_rtt_us"), fin(rtt_us), 2)
            .opt(&format!("{name}_chain_us"), fin(chain_us), 2)
            .opt(&format!("l3_sub_rtt_vs_{name}"), fin(r_sub), 4)
            .opt(&format!("l3_rtt_vs_{name}"), fin(r_chip), 4)
            .opt(&format!("l3_chain_vs_{name}"), fin(r_chain), 4);
    }
    for (name, _) in &py_missing {
        for k in ["rtt_us", "chain_us"] {
            json.opt(&format!("{name}_{k}"), None, 2);
        }
        for k in ["l3_sub_rtt_vs_", "l3_rtt_vs_", "l3_chain_vs_"] {
            json.opt(&format!("{k}{name}"), None, 4);
        }
    }
    json.num("l3_rtt_us", l3_us, 3)
        .num("floor_rtt_us", floor_us, 4)
        .num("ratio", ratio_of_medians, 2)
        .num("threads_chain_us", t[0], 3)
        .num("threads_fan_us", t[1], 3)
        .num("threads_wavefront_us", t[2], 3)
        .num("process_chain_us", p[0], 3)
        .num("process_fan_us", p[1], 3)
        .num("process_wavefront_us", p[2], 3)
        .num("init_ms", init_ms, 2)
        .num("close_ms", close_ms, 2)
        .num("l3_sub_rtt_us", sub_us, 3)
        .num("sub_ratio", sub_ratio, 2)
        .num("chip_run_us", chip_run_us, 3)
        .num("process_wavefront_sep_us", p[3], 3)
        .num("threads_wavefront_sep_us", t[3], 3)
        .num("ratio_round_median", ratio(&process_rtt, "l3_rtt"), 2)
        .num(
            "sub_ratio_round_median",
            ratio(&process_rtt, "l3_sub_rtt"),
            2,
        )
        .num("process_wavefront_vs_sep", process.wavefront_vs_sep, 3)
        .num("threads_wavefront_vs_sep", threads.wavefront_vs_sep, 3)
        .num(
            "threads_floor_rtt_us",
            median(&figures(&threads_rtt, "threads floor")),
            4,
        )
        .num(
            "threads_l3_rtt_us",
            median(&figures(&threads_rtt, "l3_rtt, Threads")),
            3,
        )
        .num(
            "threads_sub_rtt_us",
            median(&figures(&threads_rtt, "l3_sub_rtt, Threads")),
            3,
        )
        .int("rounds", ROUNDS as u64)
        .machine(&machine);
    println!("{}", json.line());
}
