//! `cargo xtask bench chip`: empty-kernel tasks through one emulated chip (default
//! configuration: one cluster, 1 AIC + 2 AIV cores) for a chain, fan-out/fan-in rounds and
//! independent tasks, and the bandwidth of a 1 MiB-per-task vector add next to this
//! machine's single-core memcpy bandwidth measured in the same run (STREAM convention:
//! bytes read + bytes written per second); and the fixed cost of a run that submits one
//! empty kernel, back to back, with the orchestration on the chip's orchestrator thread
//! and on the caller's thread (`OrchestratorPlacement`).
//!
//! Next to each DAG, in the same rounds, strata-graph alone runs the same DAG of empty
//! tasks on one thread (submit the whole run, then claim and complete every task): the
//! graph core's per-task cost, which a chip task is compared with (goal, issue 15: an
//! empty chip task ≤ 2× the graph core's per-task cost; vector add ≥ 0.8× memcpy).
//!
//! Side by side figures alternate in rounds (A B, B A, …; one warm-up round first): the
//! vector add with the memcpy floor, the two placements of the one-kernel run with each
//! other, and the three task DAGs with each other. Each is the median over the rounds; a
//! ratio is the median of the per-round ratios. The machine (CPU model, load average) heads
//! the output. The last line is a JSON object.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use strata_chip::*;
use strata_testkit::bench::{Json, Machine, Rounds};
use strata_types::{ArgTag, CallConfig, DataType};

const CHAIN: u64 = 100_000;
const FAN_ROUNDS: u64 = 100;
const FAN_WIDTH: u64 = 1000;
const INDEP: u64 = 100_000;
const VADD_ELEMS: u64 = 1 << 18; // 1 MiB of f32 per operand
const VADD_SETS: usize = 8;
const VADD_TASKS: u64 = 512;
const REPS: usize = 5;
/// Runs of one kernel per timed batch.
const ONE_KERNEL_RUNS: usize = 10_000;

/// A chip with the given orchestrator placement and an orchestration that submits one
/// empty AIV kernel.
struct OneKernel {
    chip: ChipWorker,
    one: OrchHandle,
}

impl OneKernel {
    fn new(placement: OrchestratorPlacement) -> OneKernel {
        let mut chip = ChipWorker::new(ChipConfig {
            orchestrator: placement,
            ..ChipConfig::default()
        })
        .expect("chip");
        let empty = chip
            .register_kernel_fn("empty", |_| Ok(()))
            .expect("kernel");
        let one = chip
            .register_orchestration_fn("one", move |o, _| {
                o.submit_aiv(empty, &CoreArgs::new())?;
                Ok(())
            })
            .expect("orch");
        chip.init().expect("init");
        OneKernel { chip, one }
    }

    /// µs per run of a batch of `ONE_KERNEL_RUNS` runs, back to back.
    fn batch(&mut self) -> f64 {
        let cfg = CallConfig::default();
        let t = Instant::now();
        for _ in 0..ONE_KERNEL_RUNS {
            self.chip
                .run(&self.one, &mut RunArgs::new(), &cfg)
                .expect("run");
        }
        t.elapsed().as_secs_f64() * 1e6 / ONE_KERNEL_RUNS as f64
    }
}

/// strata-graph alone, one thread: the same DAG's access lists, submitted as one run
/// and then drained (claim + complete in dependency order). µs per task.
struct Core {
    tasks: Vec<Vec<strata_graph::Access>>,
    orch: strata_graph::Orchestrator<()>,
    sched: strata_graph::Scheduler<()>,
}

impl Core {
    fn new(dag: &str) -> Core {
        use strata_graph::{Access, BufferKey, Footprint, KeySpace};
        let m = strata_types::IdentityMinter::new();
        let x = BufferKey::new(m.mint(), KeySpace::Host);
        let acc = |tag| vec![Access::new(x, Footprint::WHOLE, tag)];
        let tasks = match dag {
            "chain" => vec![acc(ArgTag::InOut); CHAIN as usize],
            "fan" => {
                let mut t = vec![];
                for _ in 0..FAN_ROUNDS {
                    t.push(acc(ArgTag::InOut));
                    t.extend((0..FAN_WIDTH).map(|_| acc(ArgTag::Input)));
                    t.push(acc(ArgTag::InOut));
                }
                t
            }
            _ => vec![vec![]; INDEP as usize],
        };
        let (orch, sched) =
            strata_graph::graph::<()>(strata_graph::GraphConfig::default()).expect("graph");
        Core { tasks, orch, sched }
    }

    fn run(&mut self) -> f64 {
        let (orch, sched) = (&mut self.orch, &mut self.sched);
        let t = Instant::now();
        let run = orch.begin_run().expect("begin");
        let mut queue = VecDeque::new();
        for a in &self.tasks {
            let s = orch
                .submit(strata_graph::TaskSpec::new((), a))
                .expect("submit");
            if s.ready {
                queue.push_back(s.task);
            }
        }
        orch.close_run().expect("close");
        let (mut newly, mut done) = (Vec::new(), 0);
        while let Some(task) = queue.pop_front() {
            if sched.claim(task).is_some() {
                sched.complete(task, Ok(()), &mut newly).expect("complete");
                done += 1;
                queue.extend(newly.drain(..).map(|r| r.task));
            }
        }
        assert_eq!(orch.wait_run(run, None).expect("wait"), Some(Ok(())));
        let us = t.elapsed().as_secs_f64() * 1e6 / self.tasks.len() as f64;
        assert_eq!(done, self.tasks.len());
        orch.release_run(run).expect("release");
        us
    }
}

fn main() {
    let machine = Machine::now();
    // The two placements of a one-kernel run, alternating (each on its own chip).
    let (mut thread, mut caller) = (
        OneKernel::new(OrchestratorPlacement::Thread),
        OneKernel::new(OrchestratorPlacement::Caller),
    );
    let one_kernel = Rounds::new(REPS)
        .warmup(1)
        .variant("run of 1 kernel, orchestrator thread", || thread.batch())
        .variant("run of 1 kernel, caller's thread", || caller.batch())
        .baseline("run of 1 kernel, caller's thread")
        .run();
    thread.chip.close().expect("close");
    caller.chip.close().expect("close");
    let mut chip = ChipWorker::new(ChipConfig::default()).expect("chip");
    let empty = chip
        .register_kernel_fn("empty", |_| Ok(()))
        .expect("kernel");
    let vadd = chip
        .register_kernel_fn("vadd", strata_fixtures::add_kernel(0))
        .expect("kernel");
    let chain = chip
        .register_orchestration_fn("chain", move |o, args| {
            let x = args.tensor(0)?;
            let mut a = CoreArgs::new();
            a.inout(&x);
            for _ in 0..CHAIN {
                o.submit_aiv(empty, &a)?;
            }
            Ok(())
        })
        .expect("orch");
    let fan = chip
        .register_orchestration_fn("fan", move |o, args| {
            // The root writes x; FAN_WIDTH tasks read it; the sink writes x again, so it
            // waits for every reader (write-after-read).
            let x = args.tensor(0)?;
            let mut root = CoreArgs::new();
            root.inout(&x);
            let mut mid = CoreArgs::new();
            mid.input(&x);
            for _ in 0..FAN_ROUNDS {
                o.submit_aiv(empty, &root)?;
                for _ in 0..FAN_WIDTH {
                    o.submit_aiv(empty, &mid)?;
                }
                o.submit_aiv(empty, &root)?;
            }
            Ok(())
        })
        .expect("orch");
    let indep = chip
        .register_orchestration_fn("independent", move |o, _| {
            let a = CoreArgs::new();
            for _ in 0..INDEP {
                o.submit_aiv(empty, &a)?;
            }
            Ok(())
        })
        .expect("orch");
    let vadd_orch = chip
        .register_orchestration_fn("vadd", move |o, args| {
            let n = args.tensor_count() / 3;
            for t in 0..VADD_TASKS as usize {
                let s = t % n;
                let mut a = CoreArgs::new();
                a.input(&args.tensor(3 * s)?)
                    .input(&args.tensor(3 * s + 1)?)
                    .output(&args.tensor(3 * s + 2)?);
                o.submit_aiv(vadd, &a)?;
            }
            Ok(())
        })
        .expect("orch");
    chip.init().expect("init");

    let x = chip
        .alloc_tensor(&[16], DataType::F32, TensorInit::Zeros)
        .expect("x");
    let cfg = CallConfig::default();
    // The three DAGs alternate in rounds (they share the chip, hence the cell).
    let cell = RefCell::new(&mut chip);
    let run = |orch: &OrchHandle, args: &mut RunArgs<'_>, tasks: u64| -> f64 {
        let t = Instant::now();
        let r = cell.borrow_mut().run(orch, args, &cfg).expect("run");
        let el = t.elapsed();
        assert_eq!(r.tasks, tasks);
        el.as_secs_f64() * 1e6 / tasks as f64
    };
    let only = std::env::var("STRATA_BENCH_ONLY").unwrap_or_default();
    let want = |w: &str| only.is_empty() || only == w;
    // The first round warms up (grows the slot arena and the TensorMap once).
    let (mut core_chain, mut core_fan, mut core_indep) = (
        Core::new("chain"),
        Core::new("fan"),
        Core::new("independent"),
    );
    let mut dags = Rounds::new(REPS).warmup(1);
    if want("chain") {
        dags = dags.variant("core chain", || core_chain.run());
    }
    if want("fan") {
        dags = dags.variant("core fan", || core_fan.run());
    }
    if want("indep") {
        dags = dags.variant("core independent", || core_indep.run());
    }
    if want("chain") {
        dags = dags.variant("chain", || {
            let mut a = RunArgs::new();
            a.device(&x, ArgTag::InOut);
            run(&chain, &mut a, CHAIN)
        });
    }
    if want("fan") {
        dags = dags.variant("fan", || {
            let mut a = RunArgs::new();
            a.device(&x, ArgTag::InOut);
            run(&fan, &mut a, FAN_ROUNDS * (FAN_WIDTH + 2))
        });
    }
    if want("indep") {
        dags = dags.variant("independent", || run(&indep, &mut RunArgs::new(), INDEP));
    }
    let dags = dags.run();
    let dag = |name: &str| {
        if dags.names().iter().any(|n| n == name) {
            dags.figures(name)
        } else {
            vec![f64::NAN]
        }
    };
    let (chain_us, fan_us, indep_us) = (dag("chain"), dag("fan"), dag("independent"));
    let vs_core = |name: &str| {
        let core = format!("core {name}");
        if dags.names().contains(&core) {
            dags.ratio_median_vs(name, &core)
        } else {
            f64::NAN
        }
    };
    let core_us = |name: &str| strata_testkit::bench::median(&dag(&format!("core {name}")));
    let vs = [
        ("chain", vs_core("chain")),
        ("fan", vs_core("fan")),
        ("independent", vs_core("independent")),
    ];

    // Vector add over resident device tensors, 1 MiB per operand.
    let sets: Vec<[DeviceTensor; 3]> = (0..VADD_SETS)
        .map(|_| {
            let t = || {
                chip.alloc_tensor(&[VADD_ELEMS], DataType::F32, TensorInit::value(1.5f32))
                    .expect("alloc")
            };
            [t(), t(), t()]
        })
        .collect();
    // The machine's single-core memcpy over the same working set and chunk size.
    let chunk = (VADD_ELEMS * 4) as usize;
    let src: Vec<Vec<u8>> = (0..VADD_SETS * 2).map(|i| vec![i as u8; chunk]).collect();
    let mut dst: Vec<Vec<u8>> = (0..VADD_SETS).map(|_| vec![0u8; chunk]).collect();
    let bandwidth = Rounds::new(REPS)
        .warmup(1)
        .variant("vector add, 1 MiB per task", || {
            let mut a = RunArgs::new();
            for s in &sets {
                a.device(&s[0], ArgTag::Input)
                    .device(&s[1], ArgTag::Input)
                    .device(&s[2], ArgTag::OutputExisting);
            }
            let t = Instant::now();
            chip.run(&vadd_orch, &mut a, &cfg).expect("vadd");
            let el = t.elapsed().as_secs_f64();
            (VADD_TASKS * VADD_ELEMS * 4 * 3) as f64 / el / 1e9
        })
        .variant("memcpy, one core, same set", || {
            let t = Instant::now();
            for k in 0..VADD_TASKS as usize {
                let d = &mut dst[k % VADD_SETS];
                d.copy_from_slice(&src[(2 * k) % src.len()]);
                std::hint::black_box(&d);
            }
            let el = t.elapsed().as_secs_f64();
            (VADD_TASKS as usize * chunk * 2) as f64 / el / 1e9
        })
        .baseline("memcpy, one core, same set")
        .run();
    let out = chip.read_tensor::<f32>(&sets[0][2]).expect("read");
    assert!(out.iter().all(|&v| v == 3.0), "vector add result");

    let idle_ms = {
        let me = std::process::id() as i32;
        let before = strata_testkit::stat_cpu_ns(me).unwrap_or(0);
        std::thread::sleep(Duration::from_millis(500));
        strata_testkit::stat_cpu_ns(me)
            .unwrap_or(0)
            .saturating_sub(before) as f64
            / 1e6
    };
    chip.close().expect("close");

    let vadd_gbps = bandwidth.median("vector add, 1 MiB per task");
    let memcpy_gbps = bandwidth.median("memcpy, one core, same set");
    let vadd_vs_memcpy = bandwidth.ratio_median("vector add, 1 MiB per task");
    let one_thread = one_kernel.median("run of 1 kernel, orchestrator thread");
    let one_caller = one_kernel.median("run of 1 kernel, caller's thread");
    let thread_vs_caller = one_kernel.ratio_median("run of 1 kernel, orchestrator thread");
    let median = strata_testkit::bench::median;
    let min = strata_testkit::bench::min;

    println!("{}", machine.line());
    println!(
        "strata-chip throughput (1 AIC + 2 AIV cores; median of {REPS} rounds, min in brackets)"
    );
    print!("{}", dags.table("us/task", 3));
    print!("{}", bandwidth.table("GB/s", 2));
    print!("{}", one_kernel.table("us/run", 3));
    println!();
    println!("{:<34} {:>10} {:>10}", "workload", "median", "min");
    println!(
        "{:<34} {:>8.3}us {:>8.3}us",
        format!("empty chain ({CHAIN} tasks)"),
        median(&chain_us),
        min(&chain_us)
    );
    println!(
        "{:<34} {:>8.3}us {:>8.3}us",
        format!("empty fan 1->{FAN_WIDTH}->1 x{FAN_ROUNDS}"),
        median(&fan_us),
        min(&fan_us)
    );
    println!(
        "{:<34} {:>8.3}us {:>8.3}us",
        format!("empty independent ({INDEP})"),
        median(&indep_us),
        min(&indep_us)
    );
    println!(
        "{:<34} {:>7.2}GB/s   (x{:.2} memcpy, median of per-round ratios)",
        "vector add, 1 MiB per task", vadd_gbps, vadd_vs_memcpy
    );
    println!(
        "{:<34} {:>7.2}GB/s",
        "memcpy, one core, same set", memcpy_gbps
    );
    println!(
        "{:<34} {:>8.1}ms",
        "process CPU while idle for 500 ms", idle_ms
    );
    let goal = |met: bool, v: f64| match (v.is_finite(), met) {
        (false, _) => "n/a",
        (true, true) => "met",
        (true, false) => "missed",
    };
    for (name, r) in vs {
        println!(
            "{:<34} {:>8.3}us   (chip / core {r:.2}, median of per-round ratios; goal <= 2: {})",
            format!("graph core alone, {name}"),
            core_us(name),
            goal(r <= 2.0, r)
        );
    }
    println!(
        "{:<34} {:>10.2}   (goal >= 0.8: {})",
        "vector add / memcpy",
        vadd_vs_memcpy,
        goal(vadd_vs_memcpy >= 0.8, vadd_vs_memcpy)
    );
    println!(
        "{:<34} {:>8.3}us",
        "run of 1 kernel, orchestrator thread", one_thread
    );
    println!(
        "{:<34} {:>8.3}us   (thread / caller {:.2}, median of per-round ratios)",
        "run of 1 kernel, caller's thread", one_caller, thread_vs_caller
    );
    let mut json = Json::new();
    json.num("empty_chain_us", median(&chain_us), 4)
        .num("empty_fan_us", median(&fan_us), 4)
        .num("empty_indep_us", median(&indep_us), 4)
        .num("vadd_gbps", vadd_gbps, 3)
        .num("memcpy_gbps", memcpy_gbps, 3)
        .num("idle_cpu_ms", idle_ms, 1)
        .num("one_kernel_run_us", one_thread, 3)
        .num("one_kernel_run_caller_us", one_caller, 3)
        .num("vadd_gbps_vs_memcpy", vadd_vs_memcpy, 3)
        .num("one_kernel_thread_vs_caller", thread_vs_caller, 3)
        .num("core_chain_us", core_us("chain"), 4)
        .num("core_fan_us", core_us("fan"), 4)
        .num("core_indep_us", core_us("independent"), 4)
        .num("empty_chain_vs_core", vs[0].1, 3)
        .num("empty_fan_vs_core", vs[1].1, 3)
        .num("empty_indep_vs_core", vs[2].1, 3)
        .int("rounds", REPS as u64)
        .machine(&machine);
    println!("{}", json.line());
}
