//! `cargo xtask bench scale`: parallel efficiency and the minimum effective task
//! granularity (METG, the Task Bench paper's measure) of strata on this machine.
//!
//! Every task is a busy-wait of a given length (it spins on the clock, so it occupies
//! one CPU for exactly that long). Efficiency = useful task time / (wall time × width):
//! with `width` chains of `k` tasks of length `s` each, `k·s / wall`. 1.0 means the
//! runtime added nothing.
//!
//! 1. **Scaling with 1 ms tasks**, for N = 1, 2, … up to the machine's CPU count:
//!    - N chips (Process mode, each chip one AIV core) each running `SCALE_TASKS` 1 ms
//!      kernels in a loop (one chip orchestration per chip; the kernels of a chip run one
//!      at a time on its core);
//!    - N sub-workers (Process mode) running N × `SCALE_TASKS` independent 1 ms sub tasks.
//! 2. **METG** at width N = the CPU count: N independent chains (each task `INOUT` on its
//!    chain's buffer) of tasks of length 1000, 300, 100, 30, 10 and 3 µs, through
//!    - the graph core (strata-graph): the whole run submitted on this thread, then N
//!      threads claim, run and complete the tasks (the scheduler behind a mutex);
//!    - one chip (`ChipWorker` in this process, N AIV cores, chains on device tensors);
//!    - the L3 engine (`DistWorker`, Process mode, N sub-workers, chains on shared
//!      tensors).
//!
//!    The METG is the task length at which efficiency falls below 0.9: from the longest
//!    length down, the last of the lengths that all reach 0.9, interpolated on a log
//!    scale towards the next shorter one (`null` if the longest does not reach 0.9, the
//!    shortest if all do), computed twice: on the efficiency itself, and on
//!    the efficiency relative to the floor's in the same round (what the runtime loses,
//!    apart from what a shared machine takes from every thread; on an idle machine the
//!    two agree).
//!
//! Every figure is measured next to its floor in the same rounds (`ROUNDS`, alternating):
//! N bare threads spinning the same task lengths back to back (no runtime at all), whose
//! efficiency shows what the machine itself loses (other tenants, the hypervisor). Both
//! efficiencies are reported (medians over the rounds) and their ratio (median of the
//! per-round ratios). Goal (issue 15): efficiency ≥ 0.9 at N = CPU count.
//!
//! Process-mode parts run first, while this process is single-threaded (a worker forks
//! its children at `init`). Nothing here depends on the machine's size: N runs up to
//! whatever `available_parallelism` reports. `STRATA_BENCH_QUICK=1` shortens it.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, ChipWorker, CoreArgs, DeviceTensor, RunArgs, TensorInit};
use strata_dist::{DistConfig, DistWorker};
use strata_graph::{graph, Access, BufferKey, Footprint, GraphConfig, KeySpace, TaskRef, TaskSpec};
use strata_testkit::bench::{assert_single_threaded, Json, Machine, Rounds, RoundsReport};
use strata_types::{ArgTag, CallConfig, DataType, IdentityMinter, TaskArgs};

const ROUNDS: usize = 3;
/// 1 ms tasks per chip / per sub-worker in the scaling part.
const SCALE_TASKS: usize = 40;
const SCALE_TASK_US: u64 = 1000;
/// Task lengths of the METG part, longest first.
const SIZES_US: [u64; 6] = [1000, 300, 100, 30, 10, 3];

fn quick() -> bool {
    std::env::var_os("STRATA_BENCH_QUICK").is_some()
}

/// Tasks per chain for a task length: about `budget` of work per chain, 20..=20 000.
fn per_chain(s_us: u64) -> usize {
    let budget_us = if quick() { 10_000 } else { 40_000 };
    ((budget_us / s_us) as usize).clamp(20, 20_000)
}

/// Spins for `us` microseconds.
fn spin_us(us: u64) {
    let t = Instant::now();
    let d = Duration::from_micros(us);
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// The floor: `width` threads each spinning `k` tasks of `s_us`; efficiency.
fn floor_eff(width: usize, k: usize, s_us: u64) -> f64 {
    let t = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..width {
            sc.spawn(|| {
                for _ in 0..k {
                    spin_us(s_us);
                }
            });
        }
    });
    eff(k, s_us, t.elapsed())
}

fn eff(k: usize, s_us: u64, wall: Duration) -> f64 {
    (k as f64 * s_us as f64) / (wall.as_secs_f64() * 1e6)
}

/// Alternates `runtime` with the floor (same width, tasks and length) in `ROUNDS`.
fn with_floor<'a>(
    width: usize,
    k: usize,
    s_us: u64,
    runtime: impl FnMut() -> f64 + 'a,
) -> RoundsReport {
    Rounds::new(ROUNDS)
        .variant("floor", move || floor_eff(width, k, s_us))
        .variant("strata", runtime)
        .baseline("floor")
        .run()
}

/// (strata's efficiency, the floor's, median of per-round ratios strata / floor).
fn triple(r: &RoundsReport) -> (f64, f64, f64) {
    (
        r.median("strata"),
        r.median("floor"),
        r.ratio_median("strata"),
    )
}

// ----- 1. scaling with 1 ms tasks ------------------------------------------------------

fn one_core_chip() -> ChipConfig {
    ChipConfig {
        aic_cores: 0,
        aiv_cores: 1,
        ..ChipConfig::default()
    }
}

/// N chips, each running `SCALE_TASKS` 1 ms kernels: efficiency per round.
fn chips_scaling(n: usize) -> RoundsReport {
    let mut w = DistWorker::new(DistConfig::l3(vec![one_core_chip(); n], 0)).expect("worker");
    let spin = w
        .register_kernel("scale.spin", |ctx| {
            spin_us(ctx.scalar::<u64>(0)?);
            Ok(())
        })
        .expect("kernel");
    let loop_orch = w
        .register_chip_orchestration("scale.loop", move |o, args| {
            let (k, s) = (args.scalar::<u64>(0)?, args.scalar::<u64>(1)?);
            let mut a = CoreArgs::new();
            a.scalar(s);
            for _ in 0..k {
                o.submit_aiv(spin, &a)?;
            }
            Ok(())
        })
        .expect("orchestration");
    let host = w.register_orchestration("scale.chips", move |o, _| {
        let a = TaskArgs::new()
            .scalar(SCALE_TASKS as u64)
            .scalar(SCALE_TASK_US);
        for chip in 0..n {
            o.submit_next_level(loop_orch, &a, chip)?;
        }
        Ok(())
    });
    assert_single_threaded("init (chips)");
    w.init().expect("init");
    let none = TaskArgs::new();
    w.run(&host, &none).expect("warm-up run");
    let report = with_floor(n, SCALE_TASKS, SCALE_TASK_US, || {
        let t = Instant::now();
        w.run(&host, &none).expect("run");
        eff(SCALE_TASKS, SCALE_TASK_US, t.elapsed())
    });
    w.close().expect("close");
    report
}

/// A Process-mode worker with `n` sub-workers whose host orchestration submits
/// `n` chains of `k` busy-wait sub tasks of `s` µs (`k`, `s` are its scalars); chains are
/// independent when `chained` is false.
struct SubWorker {
    w: DistWorker,
    orch: strata_dist::HostOrchHandle,
    _tensors: Vec<strata_host::SharedTensor>,
}

impl SubWorker {
    fn new(n: usize, chained: bool) -> SubWorker {
        let mut w = DistWorker::new(DistConfig::l3(vec![], n)).expect("worker");
        let spin = w.register_sub("scale.spin", |call| {
            spin_us(call.scalar::<u64>(0).unwrap_or(0));
            Ok(())
        });
        let tensors: Vec<_> = (0..n)
            .map(|_| w.shared_tensor(&[1], DataType::U64).expect("tensor"))
            .collect();
        let args: Vec<TaskArgs> = tensors
            .iter()
            .map(|t| {
                let mut a = TaskArgs::new();
                if chained {
                    a.push_tensor(t.arg(ArgTag::InOut)).expect("tensor arg");
                }
                a
            })
            .collect();
        let orch = w.register_orchestration("scale.subs", move |o, call| {
            let k = call.scalar_at::<u64>(0).unwrap_or(0);
            let s = call.scalar_at::<u64>(1).unwrap_or(0);
            for _ in 0..k {
                for a in &args {
                    let mut a = a.clone();
                    a.push_scalar(s)?;
                    o.submit_sub(&spin, &a)?;
                }
            }
            Ok(())
        });
        assert_single_threaded("init (sub-workers)");
        w.init().expect("init");
        SubWorker {
            w,
            orch,
            _tensors: tensors,
        }
    }

    /// Efficiency of one run of `k` tasks of `s_us` per chain.
    fn run(&mut self, k: usize, s_us: u64) -> f64 {
        let a = TaskArgs::new().scalar(k as u64).scalar(s_us);
        let t = Instant::now();
        self.w.run(&self.orch, &a).expect("run");
        eff(k, s_us, t.elapsed())
    }
}

fn subs_scaling(n: usize) -> RoundsReport {
    let mut sw = SubWorker::new(n, false);
    sw.run(SCALE_TASKS, SCALE_TASK_US);
    let report = with_floor(n, SCALE_TASKS, SCALE_TASK_US, || {
        sw.run(SCALE_TASKS, SCALE_TASK_US)
    });
    sw.w.close().expect("close");
    report
}

// ----- 2. METG -----------------------------------------------------------------------

/// The graph core: `width` chains of `k` tasks submitted as one run on this thread, then
/// `width` threads run them. Efficiency.
struct GraphCore {
    width: usize,
    keys: Vec<BufferKey>,
    orch: strata_graph::Orchestrator<()>,
    sched: Mutex<(strata_graph::Scheduler<()>, VecDeque<TaskRef>)>,
}

impl GraphCore {
    fn new(width: usize) -> GraphCore {
        let m = IdentityMinter::new();
        let (orch, sched) = graph::<()>(GraphConfig::default()).expect("graph");
        GraphCore {
            width,
            keys: (0..width)
                .map(|_| BufferKey::new(m.mint(), KeySpace::Host))
                .collect(),
            orch,
            sched: Mutex::new((sched, VecDeque::new())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (strata_graph::Scheduler<()>, VecDeque<TaskRef>)> {
        self.sched.lock().expect("scheduler")
    }

    fn run(&mut self, k: usize, s_us: u64) -> f64 {
        let t = Instant::now();
        let run = self.orch.begin_run().expect("begin");
        let accesses: Vec<[Access; 1]> = self
            .keys
            .iter()
            .map(|&key| [Access::new(key, Footprint::WHOLE, ArgTag::InOut)])
            .collect();
        let mut ready = Vec::new();
        for _ in 0..k {
            for a in &accesses {
                let s = self.orch.submit(TaskSpec::new((), a)).expect("submit");
                if s.ready {
                    ready.push(s.task);
                }
            }
        }
        self.orch.close_run().expect("close");
        self.lock().1.extend(ready);
        let total = k * self.width;
        let done = std::sync::atomic::AtomicUsize::new(0);
        let this = &*self;
        std::thread::scope(|sc| {
            for _ in 0..this.width {
                sc.spawn(|| {
                    let mut newly = Vec::new();
                    while done.load(std::sync::atomic::Ordering::Acquire) < total {
                        let task = {
                            let mut g = this.lock();
                            let Some(task) = g.1.pop_front() else {
                                drop(g);
                                std::hint::spin_loop();
                                continue;
                            };
                            g.0.claim(task).expect("claimable");
                            task
                        };
                        spin_us(s_us);
                        let mut g = this.lock();
                        g.0.complete(task, Ok(()), &mut newly).expect("complete");
                        let (_, queue) = &mut *g;
                        queue.extend(newly.drain(..).map(|r| r.task));
                        drop(g);
                        done.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                });
            }
        });
        assert_eq!(self.orch.wait_run(run, None).expect("wait"), Some(Ok(())));
        self.orch.release_run(run).expect("release");
        eff(k, s_us, t.elapsed())
    }
}

/// One chip in this process with `width` AIV cores; `width` chains of kernels on device
/// tensors.
struct Chip {
    chip: ChipWorker,
    orch: strata_chip::OrchHandle,
    tensors: Vec<DeviceTensor>,
}

impl Chip {
    fn new(width: usize) -> Chip {
        let mut chip = ChipWorker::new(ChipConfig {
            aic_cores: 0,
            aiv_cores: width as u32,
            ..ChipConfig::default()
        })
        .expect("chip");
        let spin = chip
            .register_kernel_fn("scale.spin", |ctx| {
                spin_us(ctx.scalar::<u64>(0)?);
                Ok(())
            })
            .expect("kernel");
        let orch = chip
            .register_orchestration_fn("scale.chains", move |o, args| {
                let (k, s) = (args.scalar::<u64>(0)?, args.scalar::<u64>(1)?);
                let n = args.tensor_count();
                let xs: Vec<_> = (0..n).map(|i| args.tensor(i)).collect::<Result<_, _>>()?;
                for _ in 0..k {
                    for x in &xs {
                        let mut a = CoreArgs::new();
                        a.inout(x).scalar(s);
                        o.submit_aiv(spin, &a)?;
                    }
                }
                Ok(())
            })
            .expect("orchestration");
        chip.init().expect("init");
        let tensors = (0..width)
            .map(|_| {
                chip.alloc_tensor(&[16], DataType::U64, TensorInit::Zeros)
                    .expect("tensor")
            })
            .collect();
        Chip {
            chip,
            orch,
            tensors,
        }
    }

    fn run(&mut self, k: usize, s_us: u64) -> f64 {
        let mut a = RunArgs::new();
        for x in &self.tensors {
            a.device(x, ArgTag::InOut);
        }
        a.scalar(k as u64).scalar(s_us);
        let t = Instant::now();
        self.chip
            .run(&self.orch, &mut a, &CallConfig::default())
            .expect("run");
        eff(k, s_us, t.elapsed())
    }
}

/// Per task length: (strata's efficiency, the floor's, ratio).
type Curve = Vec<(u64, (f64, f64, f64))>;

fn curve(width: usize, mut run: impl FnMut(usize, u64) -> f64) -> Curve {
    SIZES_US
        .iter()
        .map(|&s| {
            let k = per_chain(s);
            run(k, s); // warm-up
            (s, triple(&with_floor(width, k, s, || run(k, s))))
        })
        .collect()
}

/// The task length (µs) at which efficiency (or, with `relative`, efficiency / the
/// floor's) crosses 0.9, interpolated on log(length).
fn metg(c: &Curve, relative: bool) -> Option<f64> {
    let pts: Vec<(f64, f64)> = c
        .iter()
        .map(|(s, (e, _, r))| (*s as f64, if relative { *r } else { *e }))
        .collect();
    // The longest run of lengths, from the longest down, that all reach 0.9: a noisy
    // dip at a long length ends it (no crossing is read into noise further down).
    let ok = pts.iter().take_while(|p| p.1 >= 0.9).count();
    match (ok, pts.get(ok)) {
        (0, _) => None,
        (_, None) => pts.last().map(|p| p.0),
        (_, Some(&(s_lo, e_lo))) => {
            let (s_hi, e_hi) = pts[ok - 1];
            let f = (e_hi - 0.9) / (e_hi - e_lo);
            Some((s_hi.ln() + f * (s_lo.ln() - s_hi.ln())).exp())
        }
    }
}

fn main() {
    let started = Instant::now();
    let machine = Machine::now();
    println!("{}", machine.line());
    let cpus = machine.cpus.max(1);
    let widths: Vec<usize> = (1..=cpus).collect();
    assert_single_threaded("start");

    // Process mode first (forks).
    let chips: Vec<_> = widths.iter().map(|&n| triple(&chips_scaling(n))).collect();
    let subs: Vec<_> = widths.iter().map(|&n| triple(&subs_scaling(n))).collect();
    let l3 = {
        let mut sw = SubWorker::new(cpus, true);
        let c = curve(cpus, |k, s| sw.run(k, s));
        sw.w.close().expect("close");
        c
    };
    // Threads from here on.
    let mut core = GraphCore::new(cpus);
    let graph_curve = curve(cpus, |k, s| core.run(k, s));
    let mut chip = Chip::new(cpus);
    let chip_curve = curve(cpus, |k, s| chip.run(k, s));
    chip.chip.close().expect("close");

    println!();
    println!(
        "parallel efficiency with {SCALE_TASK_US} us tasks ({SCALE_TASKS} per chip / sub-worker; medians of {ROUNDS} rounds alternating with N bare spinning threads; ratio = median of per-round ratios)"
    );
    println!(
        "{:>3} {:>10} {:>10} {:>8} {:>12} {:>10} {:>8}",
        "N", "chips", "floor", "ratio", "sub-workers", "floor", "ratio"
    );
    let mut json = Json::new();
    for (i, n) in widths.iter().enumerate() {
        let (c, s) = (chips[i], subs[i]);
        println!(
            "{n:>3} {:>10.3} {:>10.3} {:>8.3} {:>12.3} {:>10.3} {:>8.3}",
            c.0, c.1, c.2, s.0, s.1, s.2
        );
        json.num(&format!("chips_rel_n{n}"), c.2, 3)
            .num(&format!("subs_rel_n{n}"), s.2, 3)
            .num(&format!("chips_eff_n{n}"), c.0, 3)
            .num(&format!("chips_floor_eff_n{n}"), c.1, 3)
            .num(&format!("subs_eff_n{n}"), s.0, 3)
            .num(&format!("subs_floor_eff_n{n}"), s.1, 3);
    }
    let goal = |e: f64| if e >= 0.9 { "met" } else { "missed" };
    println!(
        "goal: efficiency >= 0.9 at N = {cpus}: chips {} ({:.3}; {:.3} of the floor's), sub-workers {} ({:.3}; {:.3} of the floor's)",
        goal(chips[cpus - 1].0),
        chips[cpus - 1].0,
        chips[cpus - 1].2,
        goal(subs[cpus - 1].0),
        subs[cpus - 1].0,
        subs[cpus - 1].2
    );
    println!();
    println!(
        "efficiency by task length, width {cpus} (independent chains; floor = {cpus} bare spinning threads)"
    );
    println!(
        "{:>8} {:>12} {:>8} {:>7} {:>12} {:>8} {:>7} {:>12} {:>8} {:>7}",
        "task us",
        "graph core",
        "floor",
        "ratio",
        "chip",
        "floor",
        "ratio",
        "L3 engine",
        "floor",
        "ratio"
    );
    for (i, s) in SIZES_US.iter().enumerate() {
        let (g, c, l) = (graph_curve[i].1, chip_curve[i].1, l3[i].1);
        println!(
            "{s:>8} {:>12.3} {:>8.3} {:>7.3} {:>12.3} {:>8.3} {:>7.3} {:>12.3} {:>8.3} {:>7.3}",
            g.0, g.1, g.2, c.0, c.1, c.2, l.0, l.1, l.2
        );
        json.num(&format!("graph_eff_{s}us"), g.0, 3)
            .num(&format!("chip_eff_{s}us"), c.0, 3)
            .num(&format!("l3_eff_{s}us"), l.0, 3)
            .num(&format!("graph_rel_{s}us"), g.2, 3)
            .num(&format!("chip_rel_{s}us"), c.2, 3)
            .num(&format!("l3_rel_{s}us"), l.2, 3)
            .num(&format!("floor_eff_{s}us"), g.1, 3);
    }
    let (mg, mc, ml) = (
        metg(&graph_curve, false),
        metg(&chip_curve, false),
        metg(&l3, false),
    );
    let (rg, rc, rl) = (
        metg(&graph_curve, true),
        metg(&chip_curve, true),
        metg(&l3, true),
    );
    let show = |m: Option<f64>| m.map_or("null (never 0.9)".into(), |v| format!("{v:.1} us"));
    println!(
        "METG (task length at efficiency 0.9): graph core {}, chip {}, L3 engine {}",
        show(mg),
        show(mc),
        show(ml)
    );
    println!(
        "METG relative to the floor (strata / floor efficiency 0.9): graph core {}, chip {}, L3 engine {}",
        show(rg),
        show(rc),
        show(rl)
    );
    println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
    json.opt("metg_graph_rel_us", rg, 1)
        .opt("metg_chip_rel_us", rc, 1)
        .opt("metg_l3_rel_us", rl, 1)
        .opt("metg_graph_us", mg, 1)
        .opt("metg_chip_us", mc, 1)
        .opt("metg_l3_us", ml, 1)
        .int("width", cpus as u64)
        .int("rounds", ROUNDS as u64)
        .machine(&machine);
    println!("{}", json.line());
}
