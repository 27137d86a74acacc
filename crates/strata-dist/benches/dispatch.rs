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
//! Forking: `init` in `Process` mode refuses to fork while this process runs other
//! threads, so everything in `Process` mode comes first (each worker is closed — its
//! scheduler thread joined — before the next starts), then `Threads` mode, then the
//! in-process chip. The bench checks the process is single-threaded before each fork.
//!
//! Prints a table, then as its very last line one JSON object: `l3_rtt_us`,
//! `floor_rtt_us`, `ratio`, `threads_{chain,fan,wavefront}_us`,
//! `process_{chain,fan,wavefront}_us`, `init_ms`, `close_ms` (medians), plus the
//! decomposition keys `l3_sub_rtt_us`, `sub_ratio`, `chip_run_us`,
//! `{process,threads}_wavefront_sep_us`.

use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, ChipWorker, RunArgs};
use strata_dist::{DistConfig, DistWorker, HostOrchHandle};
use strata_host::{ExecMode, SharedTensor};
use strata_types::{ArgTag, CallConfig, DataType, TaskArgs};

// ----- sizes ---------------------------------------------------------------------------

/// Round trips: warm-up runs, then timed runs (each timed on its own).
const RTT_WARMUP: usize = 2_000;
const RTT_RUNS: usize = 20_000;
/// Floor: per-batch averages of `FLOOR_PER_BATCH` ping-pongs.
const FLOOR_WARMUP: usize = 20_000;
const FLOOR_BATCHES: usize = 200;
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

use strata_testkit::bench::{assert_single_threaded, median, min, quantile, FloorSpec};

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

/// Per DAG: µs per task of whole runs, and µs per task spent in `submit` (the
/// orchestration building the run on this thread while the first tasks already execute).
struct DagTimes {
    run: [Vec<f64>; 4],
    submit: [Vec<f64>; 4],
}

/// µs per task of each DAG (`DAG_REPS` runs after one warm-up) on a worker with `SUBS`
/// sub-workers in `mode`.
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
    let mut out = DagTimes {
        run: Default::default(),
        submit: Default::default(),
    };
    for rep in 0..=DAG_REPS {
        for (k, dag) in Dag::ALL.iter().enumerate() {
            let t = Instant::now();
            let mut h = w.submit(&orchs[k], &none).expect("DAG submit");
            let submitted = t.elapsed();
            h.wait(None).expect("DAG run");
            let per_task = |d: Duration| d.as_secs_f64() * 1e6 / dag.tasks() as f64;
            if rep > 0 {
                out.run[k].push(per_task(t.elapsed()));
                out.submit[k].push(per_task(submitted));
            }
        }
    }
    w.close().expect("close");
    drop(tensors);
    out
}

// ----- 4. init + close -----------------------------------------------------------------

/// (init ms, close ms) of `LIFECYCLE_REPS` cycles (after one warm-up) of a `Process`-mode
/// worker with `LIFECYCLE_CHIPS` chips and `SUBS` sub-workers.
fn lifecycle() -> (Vec<f64>, Vec<f64>) {
    let mut init = Vec::with_capacity(LIFECYCLE_REPS);
    let mut close = Vec::with_capacity(LIFECYCLE_REPS);
    for rep in 0..=LIFECYCLE_REPS {
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
        let t_close = t.elapsed();
        if rep > 0 {
            init.push(t_init.as_secs_f64() * 1e3);
            close.push(t_close.as_secs_f64() * 1e3);
        }
    }
    (init, close)
}

// ----- main ----------------------------------------------------------------------------

fn main() {
    let started = Instant::now();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_single_threaded("start");

    // `STRATA_BENCH_ONLY=rtt|dags|lifecycle` runs one part (the others print NaN).
    let only = std::env::var("STRATA_BENCH_ONLY").unwrap_or_default();
    let want = |part: &str| only.is_empty() || only == part;
    let skip = || vec![f64::NAN];
    let skip_dags = || DagTimes {
        run: [skip(), skip(), skip(), skip()],
        submit: [skip(), skip(), skip(), skip()],
    };

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // Process mode and our own forks first, while this process is single-threaded. The
    // floor is measured twice, around the round trips: the host may move the vCPUs.
    let floor_before = floor(cpus >= 2);
    let (init, close) = if want("lifecycle") {
        lifecycle()
    } else {
        (skip(), skip())
    };
    let rtt = want("rtt");
    let l3 = if rtt {
        chip_rtt(ExecMode::Process)
    } else {
        skip()
    };
    let sub = if rtt {
        sub_rtt(ExecMode::Process)
    } else {
        skip()
    };
    let floor_after = floor(cpus >= 2);
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
    let l3_threads = if rtt {
        chip_rtt(ExecMode::Threads)
    } else {
        skip()
    };
    let sub_threads = if rtt {
        sub_rtt(ExecMode::Threads)
    } else {
        skip()
    };
    let chip_local = if rtt { chip_local_run() } else { skip() };

    let fl: Vec<f64> = floor_before.iter().chain(&floor_after).copied().collect();
    let floor_us = median(&fl);
    let l3_us = median(&l3);
    let sub_us = median(&sub);
    let ratio = l3_us / floor_us;
    let sub_ratio = sub_us / floor_us;
    let per_task = |v: &[Vec<f64>; 4]| v.each_ref().map(|x| median(x));
    let p = per_task(&process.run);
    let t = per_task(&threads.run);
    let init_ms = median(&init);
    let close_ms = median(&close);
    let chip_run_us = median(&chip_local);

    println!();
    println!(
        "strata-dist dispatch (L3 engine; {cpus} CPUs; load average at start: {})",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!();
    println!(
        "round trip of one run with one no-op task: {RTT_RUNS} runs timed one by one after {RTT_WARMUP} warm-up runs"
    );
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
    row("  floor measured before the round trips", &floor_before);
    row("  floor measured after them", &floor_after);
    row("L3 run, 1 chip task, forked chip child (l3_rtt)", &l3);
    row("L3 run, 1 sub task, forked sub child", &sub);
    row("L3 run, 1 chip task, Threads mode", &l3_threads);
    row("L3 run, 1 sub task, Threads mode", &sub_threads);
    row(
        "ChipWorker::run of the empty orchestration, in-process",
        &chip_local,
    );
    println!("{:<54} {:>9.2}", "ratio l3_rtt / floor (goal <= 3)", ratio);
    println!("{:<54} {:>9.2}", "ratio sub round trip / floor", sub_ratio);
    println!();
    println!(
        "us per task of no-op sub tasks, {SUBS} sub-workers; median of {DAG_REPS} runs (min); submit = the orchestration's share"
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
    println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
    println!(
        "{{\"l3_rtt_us\": {:.3}, \"floor_rtt_us\": {:.4}, \"ratio\": {:.2}, \"threads_chain_us\": {:.3}, \"threads_fan_us\": {:.3}, \"threads_wavefront_us\": {:.3}, \"process_chain_us\": {:.3}, \"process_fan_us\": {:.3}, \"process_wavefront_us\": {:.3}, \"init_ms\": {:.2}, \"close_ms\": {:.2}, \"l3_sub_rtt_us\": {:.3}, \"sub_ratio\": {:.2}, \"chip_run_us\": {:.3}, \"process_wavefront_sep_us\": {:.3}, \"threads_wavefront_sep_us\": {:.3}}}",
        l3_us,
        floor_us,
        ratio,
        t[0],
        t[1],
        t[2],
        p[0],
        p[1],
        p[2],
        init_ms,
        close_ms,
        sub_us,
        sub_ratio,
        chip_run_us,
        p[3],
        t[3]
    );
}
