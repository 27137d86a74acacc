//! `cargo xtask bench allreduce`: 2-rank allreduce (f32 sum) through a level-3 worker whose
//! two chips are forked child processes, next to Open MPI's `MPI_Allreduce` over shared
//! memory and the machine's single-core memcpy, in one run (`harness = false`).
//!
//! **strata.** A `Process`-mode `DistWorker` with two chips. One run per timed loop: the
//! host orchestration allocates a window buffer (the data, `bytes` per rank; the buffer
//! carries its own signal area) and submits one group of a user kernel to both chips, the
//! data window an ordinary argument of each. On each rank the kernel opens its copy
//! (`ctx.window(1)`, strata-comm's `KernelWindows`), pins its core
//! thread to CPU `rank`, checks one allreduce of rank-dependent data against the host
//! golden, zeroes its copy, runs `iters / 10 + 1` warm-up allreduces and a barrier, then
//! **times a loop of `iters` allreduces on the same windows with the monotonic clock**
//! and writes the elapsed nanoseconds into its row of an output tensor; the slower rank's
//! time counts. `iters` is calibrated once per size and algorithm (doubling a loop until
//! it takes 50 ms) so that a timed loop takes about 0.3 s. Every algorithm is measured;
//! the JSON keys are `AllreduceAlgo::Auto`'s (the table marks the fastest).
//!
//! **Open MPI.** `benches/mpi/allreduce.c`, built here with `mpicc -O2` into the target
//! directory and run with `mpirun -n 2 --mca btl self,vader --bind-to core` (plus
//! `--allow-run-as-root` as root; without vader's single-copy path if that fails): the same
//! sizes timed the same way (a calibrated loop of `MPI_Allreduce(MPI_FLOAT, MPI_SUM)` after
//! a warm-up and a barrier, `MPI_Wtime`, the slower rank), with separate send/receive
//! buffers and in place; the faster of the two is the MPI figure. Without `mpicc`/`mpirun`
//! the bench installs `openmpi-bin libopenmpi-dev` with `apt-get` (non-interactive; it
//! says so); if that is impossible it prints `MPI: not available (why)` and NaN — MPI never
//! fails the bench.
//!
//! **Order and placement.** The VM's two vCPUs move between placements (cache-line round
//! trip ~50 ns or ~400 ns) at random moments, also during a run, and every figure here
//! follows the placement. So the figures are taken size by size in *rounds*
//! (`strata_testkit::bench::Rounds`): a thread ping-pong, one MPI launch (one timed loop per
//! mode, calibrated at the first launch), a ping-pong, strata `Auto`, a ping-pong, the other
//! strata algorithms, a ping-pong — in this order in even rounds and reversed in odd ones,
//! so neither MPI nor strata always runs first, and a ping-pong always separates them. A
//! round whose ping-pongs differ by more than 1.5× saw the placement change and is set
//! aside; the reported figures are the medians over the largest group of rounds in one
//! placement (rounds are added until 3 agree, at most 9). MPI and strata figures of a size
//! therefore always come from the same placement, which the summary table shows.
//!
//! **Floors.** Single-core memcpy of 64 MiB (best of 10, bytes copied per second) and the
//! raw two-process cache-line ping-pong of strata-testkit (pinned to CPUs 0 / 1), before
//! the worker starts.
//!
//! Bandwidth = bytes reduced per second = `bytes / time per call`. Prints the machine (CPU
//! model, load average), tables and, as its last line, one JSON object:
//! `lat_us_{8,256,4096}`, `mpi_lat_us_{8,256,4096}`, `bw_gbps_{1m,64m}`,
//! `mpi_bw_gbps_{1m,64m}`, `memcpy_gbps`, `pingpong_rtt_ns`, and the medians of the
//! per-round ratios `lat_vs_mpi_{8,256,4096}` (strata / MPI time) and
//! `bw_gbps_{1m,64m}_vs_mpi` (strata / MPI bandwidth), `rounds_{8,…,64m}` (rounds used)
//! and the `machine_` keys; a missing MPI figure is `null`.
//! `STRATA_BENCH_QUICK=1` shortens the loops (0.05 s, one round per size).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, CoreArgs, KernelError};
use strata_comm::KernelWindows;
use strata_dist::{AllreduceAlgo, DistConfig, DistWorker, HostOrchHandle, ReduceOp};
use strata_host::SharedTensor;
use strata_testkit::bench::{
    affinity, assert_single_threaded, median, pin, pingpong_threads_ns, restore_affinity,
    FloorSpec, Json, Machine, Rounds, RoundsReport,
};
use strata_testkit::peer;
use strata_types::{CallConfig, DataType, TaskArgs};

/// (bytes, JSON suffix, latency or bandwidth figure).
const SIZES: [(u64, &str, bool); 5] = [
    (8, "8", true),
    (256, "256", true),
    (4096, "4096", true),
    (1 << 20, "1m", false),
    (64 << 20, "64m", false),
];
const ALGOS: [AllreduceAlgo; 4] = [
    AllreduceAlgo::Auto,
    AllreduceAlgo::Mesh,
    AllreduceAlgo::TwoPhase,
    AllreduceAlgo::Ring,
];
/// Round trips per batch of the thread ping-pong taken around each round.
const PINGPONG_ROUNDS: u64 = 5_000;
/// A calibration loop is long enough at this many seconds.
const CALIBRATED: f64 = 0.05;
/// Generous bounds: a timed loop takes about a second at most.
const KERNEL_TIMEOUT: Duration = Duration::from_secs(600);
const WAIT_TIMEOUT: Duration = Duration::from_secs(60);

fn quick() -> bool {
    std::env::var_os("STRATA_BENCH_QUICK").is_some()
}

/// Seconds a timed loop should take, and how many timed loops (runs) per figure.
fn target() -> (f64, usize) {
    if quick() {
        (0.05, 1)
    } else {
        (0.3, 3)
    }
}

// ----- floors ----------------------------------------------------------------------------

/// Single-core memcpy of 64 MiB buffers: best of 10, GB/s (bytes copied per second).
fn memcpy_gbps() -> f64 {
    const BYTES: usize = 64 << 20;
    let src = vec![1u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    dst.copy_from_slice(&src);
    let mut best = 0f64;
    for _ in 0..10 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        best = best.max(BYTES as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(&dst);
    best
}

/// Median round trip (ns) of the raw cache-line ping-pong between two pinned processes.
fn pingpong_ns() -> f64 {
    let spec = FloorSpec {
        warmup: 20_000,
        batches: if quick() { 20 } else { 100 },
        per_batch: 1_000,
    };
    median(&strata_testkit::bench::pingpong_floor_ns(true, spec))
}

// ----- strata through L3 -----------------------------------------------------------------

struct L3 {
    w: DistWorker,
    orch: HostOrchHandle,
    /// `[2, 4]` u64: per rank elapsed ns, check passed (1), iterations, CPU.
    res: SharedTensor,
}

fn l3_start() -> L3 {
    let chip = ChipConfig {
        kernel_timeout: KERNEL_TIMEOUT,
        ..ChipConfig::default()
    };
    let mut cfg = DistConfig::l3(vec![chip; 2], 0);
    // One buffer lives at a time: 64 MiB of data and its signal area per rank, plus the
    // arena's header and domain table.
    cfg.comm_arena_bytes = 2 * ((64 << 20) + 4096) + (1 << 20);
    cfg.comm_wait_timeout = WAIT_TIMEOUT;
    let mut w = DistWorker::new(cfg).expect("worker");
    let k = w
        .register_kernel("bench.allreduce_loop", |ctx| {
            // Tensor 0: this rank's result row; 1: the data window.
            let d = ctx.window(1)?;
            let iters = ctx.scalar::<u64>(0)?;
            let warmup = ctx.scalar::<u64>(1)?;
            let algo = AllreduceAlgo::from_code(ctx.scalar::<u64>(2)?)
                .ok_or_else(|| KernelError::new("algorithm code"))?;
            let (r, n) = (d.rank(), d.nranks());
            let saved = affinity();
            pin(r as usize);
            // One allreduce of rank-dependent data against the host golden.
            let numel = d.tensor().numel() as usize;
            let x: Vec<f32> = (0..numel)
                .map(|i| ((r + 1) as usize * (i % 13)) as f32)
                .collect();
            d.write(r, 0, &x)?;
            d.allreduce(ReduceOp::Sum, algo)?;
            let mut y = vec![0f32; numel];
            d.read(r, 0, &mut y)?;
            let k = (n * (n + 1) / 2) as f32;
            let mut ok = y.iter().enumerate().all(|(i, &v)| v == k * (i % 13) as f32);
            // Zeros stay zeros under Sum: the timed loop reduces the same data each call.
            // (After an allreduce returns nobody touches this rank's copy until the next
            // call's arrival, so rewriting it here is safe.)
            d.write(r, 0, &vec![0f32; numel])?;
            for _ in 0..warmup {
                d.allreduce(ReduceOp::Sum, algo)?;
            }
            d.barrier()?;
            let t = Instant::now();
            for _ in 0..iters {
                d.allreduce(ReduceOp::Sum, algo)?;
            }
            let ns = t.elapsed().as_nanos() as u64;
            d.read(r, 0, &mut y)?;
            ok &= y.iter().all(|&v| v == 0.0);
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = unsafe { libc::sched_getcpu() } as u64;
            if let Some(set) = saved {
                restore_affinity(&set);
            }
            ctx.output::<u64>(0)?
                .as_mut_slice()
                .ok_or_else(|| KernelError::new("contiguous output"))?
                .copy_from_slice(&[ns, u64::from(ok), iters, cpu]);
            Ok(())
        })
        .expect("kernel");
    let chip_orch = w
        .register_chip_orchestration("bench.allreduce_loop", move |o, a| {
            let mut core = CoreArgs::new();
            core.output(&a.tensor(0)?).inout(&a.tensor(1)?);
            for i in 0..a.scalar_count() {
                core.scalar_bits(a.scalar::<u64>(i)?);
            }
            o.submit_aiv(k, &core)?;
            Ok(())
        })
        .expect("chip orchestration");
    let res = w.shared_tensor(&[2, 4], DataType::U64).expect("res");
    let ra = res.clone();
    // Scalars: bytes, iters, warmup, algorithm code.
    let orch = w.register_orchestration("bench.allreduce", move |o, a| {
        let s = |i: usize| a.scalar_at::<u64>(i).ok_or("missing scalar");
        let (bytes, iters, warmup, algo) = (s(0)?, s(1)?, s(2)?, s(3)?);
        let buf = o.alloc_window_buffer(bytes)?;
        let data = o.window(&buf, 0, &[bytes / 4], DataType::F32)?;
        let mut per_rank = Vec::new();
        for r in 0..2u64 {
            let t = TaskArgs::new()
                .output_existing(ra.slice(0, r, r + 1))
                .inout(&data)
                .scalar(iters)
                .scalar(warmup)
                .scalar(algo);
            per_rank.push(t);
        }
        o.submit_next_level_group(chip_orch, &per_rank, &[0, 1])?;
        Ok(())
    });
    assert_single_threaded("init (level-3 worker with 2 chip children)");
    w.init().expect("init");
    L3 { w, orch, res }
}

/// One run: seconds of the slower rank's timed loop of `iters` allreduces.
fn l3_loop(l3: &mut L3, bytes: u64, iters: u64, warmup: u64, algo: AllreduceAlgo) -> f64 {
    let mut a = TaskArgs::new();
    for v in [bytes, iters, warmup, algo.code()] {
        a.push_scalar_bits(v).expect("scalar");
    }
    l3.res.write(&[0u64; 8]).expect("reset");
    let cfg = CallConfig::default().with_timeout(KERNEL_TIMEOUT);
    l3.w.run_with(&l3.orch, &a, &cfg)
        .unwrap_or_else(|e| panic!("allreduce run ({bytes} B, {algo:?}): {e}"));
    let v = l3.res.to_vec::<u64>().expect("res");
    for r in 0..2 {
        let row = &v[4 * r..4 * r + 4];
        assert_eq!(
            row[1], 1,
            "rank {r}: allreduce of {bytes} B ({algo:?}) differs from the host golden"
        );
        assert_eq!(row[2], iters, "rank {r}: iterations");
    }
    if v[3] == v[7] {
        eprintln!("warning: both ranks ran on CPU {}", v[3]);
    }
    v[0].max(v[4]) as f64 / 1e9
}

/// Iterations for a timed loop of about `target().0` seconds (doubling a short loop
/// until it takes `CALIBRATED` seconds).
fn l3_calibrate(l3: &mut L3, bytes: u64, algo: AllreduceAlgo) -> u64 {
    let mut n: u64 = if bytes <= 4096 { 1024 } else { 1 };
    let per = loop {
        let t = l3_loop(l3, bytes, n, 0, algo);
        if t >= CALIBRATED {
            break t / n as f64;
        }
        n *= 2;
    };
    ((target().0 / per) as u64).max(1)
}

// ----- Open MPI --------------------------------------------------------------------------

/// Whether Open MPI can build and launch a program here: `mpirun` runs and `mpicc`
/// compiles a file that includes `mpi.h` (a machine may have the runtime without the
/// headers of `libopenmpi-dev`).
fn mpi_present() -> bool {
    if !peer::runs_ok("mpirun", &["--version"]) {
        return false;
    }
    let src = std::env::temp_dir().join(format!("strata-mpi-probe-{}.c", std::process::id()));
    let ok = std::fs::write(&src, "#include <mpi.h>\nint main(void) { return 0; }\n").is_ok()
        && peer::runs_ok("mpicc", &["-fsyntax-only", &src.to_string_lossy()]);
    let _ = std::fs::remove_file(&src);
    ok
}

fn is_root() -> bool {
    peer::is_root()
}

/// Installs Open MPI from the distribution's packages (Debian: `openmpi-bin
/// libopenmpi-dev`), non-interactively, unless it is usable already.
fn install_mpi() -> Result<(), String> {
    peer::ensure_apt("MPI", &["openmpi-bin", "libopenmpi-dev"], mpi_present)
}

/// The target directory's profile folder (`target/release`): the bench binary lives in
/// its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir)
}

fn build_mpi() -> Result<PathBuf, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/mpi/allreduce.c");
    let dir = profile_dir().join("mpi");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let exe = dir.join("allreduce");
    let out = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("could not run mpicc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mpicc -O2 {} failed: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(exe)
}

/// Open MPI, ready to run: the program and the `mpirun` options that work here.
struct Mpi {
    exe: PathBuf,
    /// `None` until the first launch found options that work.
    opts: Option<Vec<String>>,
}

impl Mpi {
    /// Installs (if needed) and builds; the reason if MPI is not available.
    fn setup() -> Result<Mpi, String> {
        if !mpi_present() {
            install_mpi()?;
        }
        Ok(Mpi {
            exe: build_mpi()?,
            opts: None,
        })
    }

    /// The options to try: `-n 2 --mca btl self,vader --bind-to core` (and
    /// `--allow-run-as-root` as root), then the same without vader's single-copy (CMA)
    /// path, which containers that forbid cross-process memory access need.
    fn candidates(&self) -> Vec<Vec<String>> {
        if let Some(o) = &self.opts {
            return vec![o.clone()];
        }
        let mut base: Vec<String> = ["-n", "2", "--mca", "btl", "self,vader", "--bind-to", "core"]
            .map(String::from)
            .to_vec();
        if is_root() {
            base.push("--allow-run-as-root".into());
        }
        let mut no_cma = base.clone();
        no_cma.extend(["--mca", "btl_vader_single_copy_mechanism", "none"].map(String::from));
        vec![base, no_cma]
    }

    fn command_line(&self) -> String {
        format!(
            "mpirun {}",
            self.opts.as_deref().unwrap_or_default().join(" ")
        )
    }

    /// One timed loop of `bytes` per mode (calibrated unless `iters` is given): seconds
    /// per call with separate buffers and in place, and the iterations of the loop.
    fn measure(&mut self, bytes: u64, iters: Option<u64>) -> Result<(f64, f64, u64), String> {
        let mut why = String::new();
        let size = match iters {
            Some(n) => format!("{bytes}:{n}"),
            None => bytes.to_string(),
        };
        for opts in self.candidates() {
            let out = Command::new("mpirun")
                .args(&opts)
                .arg(&self.exe)
                .arg(target().0.to_string())
                .arg("1")
                .arg(&size)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("could not run mpirun: {e}"))?;
            let mut per = BTreeMap::new();
            for l in String::from_utf8_lossy(&out.stdout).lines() {
                let f: Vec<&str> = l.split_whitespace().collect();
                if let ["RESULT", _, mode, _, iters, secs] = f[..] {
                    if let (Ok(i), Ok(s)) = (iters.parse::<u64>(), secs.parse::<f64>()) {
                        per.insert(mode.to_string(), (s / i as f64, i));
                    }
                }
            }
            if let (true, Some(&(a, n)), Some(&(b, _))) = (
                out.status.success(),
                per.get("separate"),
                per.get("inplace"),
            ) {
                self.opts = Some(opts);
                return Ok((a, b, n));
            }
            let err = String::from_utf8_lossy(&out.stderr);
            why = format!(
                "mpirun {} failed ({}): {}",
                opts.join(" "),
                out.status,
                err.lines()
                    .filter(|l| !l.trim().is_empty())
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
        }
        Err(why)
    }
}

// ----- report ----------------------------------------------------------------------------

fn fmt_size(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The ping-pongs taken in each round, around and between MPI and strata.
const FLOORS: [&str; 4] = ["ping-pong 1", "ping-pong 2", "ping-pong 3", "ping-pong 4"];

/// Floors within this factor of each other count as one vCPU placement.
const SAME_PLACEMENT: f64 = 1.5;

fn spread(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max) / v.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The ping-pongs (ns) of every round.
fn floors(rep: &RoundsReport) -> Vec<Vec<f64>> {
    let cols: Vec<Vec<f64>> = FLOORS.iter().map(|f| rep.figures(f)).collect();
    (0..rep.rounds())
        .map(|r| cols.iter().map(|c| c[r]).collect())
        .collect()
}

/// The rounds to report: the largest group of rounds that each stayed in one placement
/// (floors within `SAME_PLACEMENT`) and share it (ties: the closer placement). All rounds
/// if none stayed put.
fn consistent(rep: &RoundsReport) -> Vec<usize> {
    let fl = floors(rep);
    let steady: Vec<usize> = (0..fl.len())
        .filter(|&r| spread(&fl[r]) <= SAME_PLACEMENT)
        .collect();
    let group = |m: f64| -> Vec<usize> {
        steady
            .iter()
            .copied()
            .filter(|&r| spread(&[m, median(&fl[r])]) <= SAME_PLACEMENT)
            .collect()
    };
    steady
        .iter()
        .map(|&r| median(&fl[r]))
        .map(|m| (m, group(m)))
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.total_cmp(&a.0)))
        .map_or_else(|| (0..fl.len()).collect(), |(_, g)| g)
}

/// What is reported for one size.
struct Summary {
    /// Median ping-pong RTT (ns) of the rounds used, rounds used, rounds taken.
    floor: f64,
    used: usize,
    taken: usize,
    /// Seconds per call and iterations per timed loop, by `ALGOS` index.
    strata: Vec<(f64, u64)>,
    /// Seconds per call: separate buffers, in place.
    mpi: Option<(f64, f64)>,
    /// Median over the rounds used of the per-round ratio strata `Auto` / MPI (time).
    auto_vs_mpi: f64,
}

impl Summary {
    fn auto(&self) -> f64 {
        self.strata[0].0
    }

    /// The faster of MPI's two modes (NaN without MPI).
    fn mpi_best(&self) -> f64 {
        self.mpi.map_or(f64::NAN, |(a, b)| a.min(b))
    }
}

/// Measures one size: rounds until `target().1` of them agree on the placement (at most
/// three times as many).
fn measure_size(l3: &mut L3, mpi: &mut Option<Mpi>, bytes: u64) -> Summary {
    let iters: Vec<u64> = ALGOS.iter().map(|&a| l3_calibrate(l3, bytes, a)).collect();
    let need = target().1;
    let had_mpi = mpi.is_some();
    let l3 = RefCell::new(l3);
    // MPI's two modes per round (None: not measured).
    let mut mpi_rounds: Vec<Option<(f64, f64)>> = Vec::new();
    let mut mpi_iters = None;
    let pp = || pingpong_threads_ns(PINGPONG_ROUNDS);
    let strata = |k: usize| {
        let l3 = &l3;
        let n = iters[k];
        move || l3_loop(&mut l3.borrow_mut(), bytes, n, n / 10 + 1, ALGOS[k]) / n as f64
    };
    let report = Rounds::new(3 * need)
        .variant(FLOORS[0], pp)
        .variant("MPI", || {
            let m = mpi
                .as_mut()
                .and_then(|p| match p.measure(bytes, mpi_iters) {
                    Ok((a, b, n)) => {
                        mpi_iters = Some(n);
                        Some((a, b))
                    }
                    Err(why) => {
                        println!("MPI: not available ({why})");
                        None
                    }
                });
            if m.is_none() {
                *mpi = None;
            }
            mpi_rounds.push(m);
            m.map_or(f64::NAN, |(a, b)| a.min(b))
        })
        .variant(FLOORS[1], pp)
        .variant("Auto", strata(0))
        .variant(FLOORS[2], pp)
        .variant("Mesh", strata(1))
        .variant("TwoPhase", strata(2))
        .variant("Ring", strata(3))
        .variant(FLOORS[3], pp)
        .baseline("MPI")
        .run_until(|rep| consistent(rep).len() >= need);
    let rounds = consistent(&report);
    let used = report.only(&rounds);
    let mpi_ok = had_mpi && mpi.is_some() && rounds.iter().all(|&r| mpi_rounds[r].is_some());
    let mpi_col = |f: fn((f64, f64)) -> f64| {
        median(
            &rounds
                .iter()
                .map(|&r| mpi_rounds[r].map_or(f64::NAN, f))
                .collect::<Vec<_>>(),
        )
    };
    Summary {
        floor: median(&floors(&used).iter().map(|f| median(f)).collect::<Vec<_>>()),
        used: used.rounds(),
        taken: report.rounds(),
        strata: ["Auto", "Mesh", "TwoPhase", "Ring"]
            .iter()
            .zip(&iters)
            .map(|(name, &n)| (used.median(name), n))
            .collect(),
        mpi: mpi_ok.then(|| (mpi_col(|m| m.0), mpi_col(|m| m.1))),
        auto_vs_mpi: if mpi_ok {
            used.ratio_median_vs("Auto", "MPI")
        } else {
            f64::NAN
        },
    }
}

fn main() {
    let started = Instant::now();
    let machine = Machine::now();
    println!("{}", machine.line());
    let floor = pingpong_ns();
    let memcpy = memcpy_gbps();
    println!("floor: raw cache-line ping-pong between two pinned processes: {floor:.0} ns RTT");
    println!("floor: single-core memcpy, 64 MiB buffers, best of 10: {memcpy:.2} GB/s");

    let mut mpi = match Mpi::setup() {
        Ok(m) => Some(m),
        Err(why) => {
            println!("MPI: not available ({why})");
            None
        }
    };
    let mut l3 = l3_start();
    let sums: Vec<Summary> = SIZES
        .iter()
        .map(|&(bytes, _, _)| measure_size(&mut l3, &mut mpi, bytes))
        .collect();
    l3.w.close().expect("close");
    // MPI figures only if MPI worked to the end.
    let mpi_cmd = mpi.as_ref().map(Mpi::command_line);

    let (secs, loops) = target();
    println!();
    println!(
        "strata: 2-rank allreduce, f32 sum, a loop of allreduces inside one dispatch (L3 worker, 2 forked chip children), timed by each rank; slower rank; median of {loops} loops of ~{secs} s taken in one vCPU placement"
    );
    println!(
        "{:<8} {:<9} {:>11} {:>10} {:>10}",
        "size", "algorithm", "µs/call", "GB/s", "iters"
    );
    for (&(bytes, _, _), sum) in SIZES.iter().zip(&sums) {
        let fastest = (0..ALGOS.len())
            .min_by(|&a, &b| sum.strata[a].0.total_cmp(&sum.strata[b].0))
            .unwrap_or(0);
        for (k, algo) in ALGOS.iter().enumerate() {
            let (s, iters) = sum.strata[k];
            println!(
                "{:<8} {:<9} {:>11.3} {:>10.2} {:>10}{}",
                fmt_size(bytes),
                format!("{algo:?}"),
                s * 1e6,
                bytes as f64 / s / 1e9,
                iters,
                if k == fastest { "  fastest" } else { "" }
            );
        }
    }
    if let Some(cmd) = &mpi_cmd {
        println!();
        println!(
            "Open MPI MPI_Allreduce (float, MPI_SUM): {cmd}; slower rank; the same loops, alternating with strata's"
        );
        println!(
            "{:<8} {:>16} {:>16} {:>10}",
            "size", "separate µs", "in place µs", "best GB/s"
        );
        for (&(bytes, _, _), sum) in SIZES.iter().zip(&sums) {
            let (a, b) = sum.mpi.unwrap_or((f64::NAN, f64::NAN));
            println!(
                "{:<8} {:>16.3} {:>16.3} {:>10.2}",
                fmt_size(bytes),
                a * 1e6,
                b * 1e6,
                bytes as f64 / sum.mpi_best() / 1e9
            );
        }
    }

    println!();
    println!(
        "{:<8} {:>16} {:>16} {:>9} {:>9} {:>10} {:>7}   goal",
        "size", "strata (Auto)", "Open MPI", "strata ×", "per round", "ping-pong", "rounds"
    );
    let (mut lat, mut mpi_lat, mut bw, mut mpi_bw) = (vec![], vec![], vec![], vec![]);
    let mut round_ratios = vec![];
    for (&(bytes, key, latency), sum) in SIZES.iter().zip(&sums) {
        let (s, m) = if mpi_cmd.is_some() {
            (sum.auto(), sum.mpi_best())
        } else {
            (sum.auto(), f64::NAN)
        };
        let placement = format!("{:>7.0} ns {:>4}/{}", sum.floor, sum.used, sum.taken);
        // strata × per round: MPI time / strata time, the median over the rounds used.
        let per_round = 1.0 / sum.auto_vs_mpi;
        round_ratios.push((key, latency, sum.auto_vs_mpi, sum.used));
        if latency {
            println!(
                "{:<8} {:>13.3} µs {:>13.3} µs {:>9.2} {per_round:>9.2} {placement}   strata <= MPI",
                fmt_size(bytes),
                s * 1e6,
                m * 1e6,
                m / s,
            );
            lat.push((format!("lat_us_{key}"), s * 1e6));
            mpi_lat.push((format!("mpi_lat_us_{key}"), m * 1e6));
        } else {
            let (gs, gm) = (bytes as f64 / s / 1e9, bytes as f64 / m / 1e9);
            let goal = if bytes == 64 << 20 {
                format!(
                    ">= 2x MPI, >= 0.6x memcpy (strata/memcpy {:.2})",
                    gs / memcpy
                )
            } else {
                String::new()
            };
            println!(
                "{:<8} {:>11.2} GB/s {:>11.2} GB/s {:>9.2} {per_round:>9.2} {placement}   {goal}",
                fmt_size(bytes),
                gs,
                gm,
                gs / gm,
            );
            bw.push((format!("bw_gbps_{key}"), gs));
            mpi_bw.push((format!("mpi_bw_gbps_{key}"), gm));
        }
    }
    println!("(strata × = how many times faster strata is, from the medians; per round = the same from the median of the per-round ratios; ping-pong = median RTT between the two CPUs around the rounds used; rounds = used / taken)");
    let mut json = Json::new();
    for (k, v) in &lat {
        json.num(k, *v, 3);
    }
    for (k, v) in &mpi_lat {
        json.num(k, *v, 3);
    }
    for (k, v) in bw.iter().chain(&mpi_bw) {
        json.num(k, *v, 3);
    }
    json.num("memcpy_gbps", memcpy, 3)
        .num("pingpong_rtt_ns", floor, 1);
    for (key, latency, auto_vs_mpi, used) in round_ratios {
        if latency {
            json.num(&format!("lat_vs_mpi_{key}"), auto_vs_mpi, 3);
        } else {
            json.num(&format!("bw_gbps_{key}_vs_mpi"), 1.0 / auto_vs_mpi, 3);
        }
        json.int(&format!("rounds_{key}"), used as u64);
    }
    json.machine(&machine);
    println!(
        "total bench time {:.1} s; at the end: {}",
        started.elapsed().as_secs_f64(),
        Machine::now().line()
    );
    println!("{}", json.line());
}
