//! `cargo xtask bench chip`: empty-kernel tasks through one emulated chip (default
//! configuration: one cluster, 1 AIC + 2 AIV cores) for a chain, fan-out/fan-in rounds and
//! independent tasks, and the bandwidth of a 1 MiB-per-task vector add next to this
//! machine's single-core memcpy bandwidth measured in the same run (STREAM convention:
//! bytes read + bytes written per second); and the fixed cost of a run that submits one
//! empty kernel, back to back, with the orchestration on the chip's orchestrator thread
//! and on the caller's thread (`OrchestratorPlacement`). The last line is a JSON object.

use std::time::{Duration, Instant};
use strata_chip::*;
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

/// µs per run (median of `REPS` batches after a warm-up) of an orchestration that submits
/// one empty AIV kernel, on a fresh chip with the given placement.
fn one_kernel_runs(placement: OrchestratorPlacement) -> Vec<f64> {
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
    let cfg = CallConfig::default();
    let mut us = vec![];
    for rep in 0..=REPS {
        let t = Instant::now();
        for _ in 0..ONE_KERNEL_RUNS {
            chip.run(&one, &mut RunArgs::new(), &cfg).expect("run");
        }
        if rep > 0 {
            us.push(t.elapsed().as_secs_f64() * 1e6 / ONE_KERNEL_RUNS as f64);
        }
    }
    chip.close().expect("close");
    us
}

fn main() {
    let one_thread = one_kernel_runs(OrchestratorPlacement::Thread);
    let one_caller = one_kernel_runs(OrchestratorPlacement::Caller);
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
    let mut run = |orch: &OrchHandle, args: &mut RunArgs<'_>, tasks: u64| -> f64 {
        let t = Instant::now();
        let r = chip.run(orch, args, &cfg).expect("run");
        let el = t.elapsed();
        assert_eq!(r.tasks, tasks);
        el.as_secs_f64() * 1e6 / tasks as f64
    };
    let only = std::env::var("STRATA_BENCH_ONLY").unwrap_or_default();
    let want = |w: &str| only.is_empty() || only == w;
    let mut chain_us = vec![];
    let mut fan_us = vec![];
    let mut indep_us = vec![];
    for rep in 0..=REPS {
        let mut a = RunArgs::new();
        a.device(&x, ArgTag::InOut);
        let c = if want("chain") {
            run(&chain, &mut a, CHAIN)
        } else {
            0.0
        };
        let mut a = RunArgs::new();
        a.device(&x, ArgTag::InOut);
        let f = if want("fan") {
            run(&fan, &mut a, FAN_ROUNDS * (FAN_WIDTH + 2))
        } else {
            0.0
        };
        let i = if want("indep") {
            run(&indep, &mut RunArgs::new(), INDEP)
        } else {
            0.0
        };
        if rep > 0 {
            // rep 0 warms up (grows the slot arena and the TensorMap once)
            chain_us.push(c);
            fan_us.push(f);
            indep_us.push(i);
        }
    }

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
    let mut vadd_gbps = vec![];
    for rep in 0..=REPS {
        let mut a = RunArgs::new();
        for s in &sets {
            a.device(&s[0], ArgTag::Input)
                .device(&s[1], ArgTag::Input)
                .device(&s[2], ArgTag::OutputExisting);
        }
        let t = Instant::now();
        chip.run(&vadd_orch, &mut a, &cfg).expect("vadd");
        let el = t.elapsed().as_secs_f64();
        if rep > 0 {
            vadd_gbps.push((VADD_TASKS * VADD_ELEMS * 4 * 3) as f64 / el / 1e9);
        }
    }
    let out = chip.read_tensor::<f32>(&sets[0][2]).expect("read");
    assert!(out.iter().all(|&v| v == 3.0), "vector add result");

    // The machine's single-core memcpy over the same working set and chunk size.
    let chunk = (VADD_ELEMS * 4) as usize;
    let src: Vec<Vec<u8>> = (0..VADD_SETS * 2).map(|i| vec![i as u8; chunk]).collect();
    let mut dst: Vec<Vec<u8>> = (0..VADD_SETS).map(|_| vec![0u8; chunk]).collect();
    let mut memcpy_gbps = vec![];
    for rep in 0..=REPS {
        let t = Instant::now();
        for k in 0..VADD_TASKS as usize {
            let d = &mut dst[k % VADD_SETS];
            d.copy_from_slice(&src[(2 * k) % src.len()]);
            std::hint::black_box(&d);
        }
        let el = t.elapsed().as_secs_f64();
        if rep > 0 {
            memcpy_gbps.push((VADD_TASKS as usize * chunk * 2) as f64 / el / 1e9);
        }
    }

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

    println!(
        "strata-chip throughput (1 AIC + 2 AIV cores; median of {REPS} runs, min in brackets)"
    );
    println!("{:<34} {:>10} {:>10}", "workload", "median", "min");
    println!(
        "{:<34} {:>8.3}us {:>8.3}us",
        format!("empty chain ({CHAIN} tasks)"),
        median(chain_us.clone()),
        min(&chain_us)
    );
    println!(
        "{:<34} {:>8.3}us {:>8.3}us",
        format!("empty fan 1->{FAN_WIDTH}->1 x{FAN_ROUNDS}"),
        median(fan_us.clone()),
        min(&fan_us)
    );
    println!(
        "{:<34} {:>8.3}us {:>8.3}us",
        format!("empty independent ({INDEP})"),
        median(indep_us.clone()),
        min(&indep_us)
    );
    println!(
        "{:<34} {:>7.2}GB/s {:>7.2}GB/s",
        "vector add, 1 MiB per task",
        median(vadd_gbps.clone()),
        vadd_gbps.iter().copied().fold(0.0, f64::max)
    );
    println!(
        "{:<34} {:>7.2}GB/s {:>7.2}GB/s",
        "memcpy, one core, same set",
        median(memcpy_gbps.clone()),
        memcpy_gbps.iter().copied().fold(0.0, f64::max)
    );
    println!(
        "{:<34} {:>8.1}ms",
        "process CPU while idle for 500 ms", idle_ms
    );
    println!(
        "{:<34} {:>8.3}us {:>8.3}us",
        "run of 1 kernel, orchestrator thread",
        median(one_thread.clone()),
        min(&one_thread)
    );
    println!(
        "{:<34} {:>8.3}us {:>8.3}us",
        "run of 1 kernel, caller's thread",
        median(one_caller.clone()),
        min(&one_caller)
    );
    println!(
        "{{\"empty_chain_us\":{:.4},\"empty_fan_us\":{:.4},\"empty_indep_us\":{:.4},\"vadd_gbps\":{:.3},\"memcpy_gbps\":{:.3},\"idle_cpu_ms\":{:.1},\"one_kernel_run_us\":{:.3},\"one_kernel_run_caller_us\":{:.3}}}",
        median(chain_us),
        median(fan_us),
        median(indep_us),
        median(vadd_gbps),
        median(memcpy_gbps),
        idle_ms,
        median(one_thread),
        median(one_caller)
    );
}
