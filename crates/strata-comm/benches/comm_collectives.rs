//! Allreduce latency and bandwidth between two ranks (threads pinned to CPUs 0 and 1, one
//! shared arena), next to a raw cache-line ping-pong between the same two threads and
//! single-core memcpy. The L3 end-to-end comparison with Open MPI is `cargo xtask bench
//! allreduce` (strata-dist); this one isolates strata-comm's own cost.
//!
//! Each size is measured in rounds (5, or 2 with STRATA_BENCH_QUICK=1), its variants
//! alternating (A B …, then reversed): for the latency sizes the thread ping-pong and the
//! four algorithms, for the bandwidth sizes a memcpy of the same size and the four
//! algorithms. Figures are medians over the rounds; `Auto` is compared with its floor by the
//! median of the per-round ratios.
//!
//! `cargo bench -p strata-comm --bench comm_collectives` (STRATA_BENCH_QUICK=1 for a short
//! run). Prints the machine (CPU model, load average), tables and a JSON last line
//! (latencies and bandwidths of `Auto`, their ratios to the floor).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use strata_comm::*;
use strata_testkit::bench::{median, pin, pingpong_threads_ns, Json, Machine, Rounds};
use strata_types::DataType;

const P: u32 = 2;

fn quick() -> bool {
    std::env::var_os("STRATA_BENCH_QUICK").is_some()
}

/// Median seconds per allreduce of `bytes` (f32 sum) with `algo`, over `batches` batches
/// of `iters` allreduces each, timed on rank 0.
fn allreduce_secs(
    arena: &Arc<CommArena>,
    bytes: u64,
    algo: AllreduceAlgo,
    iters: usize,
    batches: usize,
) -> f64 {
    let mut alloc = CommAllocator::new(arena.clone());
    let dom = alloc.world().unwrap();
    // The buffer carries its own signal area (after the data, 128-aligned).
    let buf = alloc.alloc_window_buffer(&dom, bytes).unwrap();
    let x = alloc.window(&buf, 0, &[bytes / 4], DataType::F32).unwrap();
    for r in 0..P {
        alloc
            .host_write(&x, r, 0, &vec![1e-3f32; (bytes / 4) as usize])
            .unwrap();
    }
    let gate = Barrier::new(P as usize);
    let times = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..P)
            .map(|r| {
                let ctx = RankContext::new(arena.clone(), r, Duration::from_secs(60));
                let gate = &gate;
                sc.spawn(move || {
                    pin(r as usize);
                    let comm = Comm::from_rank(&ctx);
                    let d = comm.window(&x).unwrap();
                    // Warm-up (pages, caches, branch predictors).
                    for _ in 0..iters.clamp(2, 100) {
                        d.allreduce(ReduceOp::Sum, algo).unwrap();
                    }
                    let mut out = Vec::new();
                    for _ in 0..batches {
                        gate.wait();
                        let t = Instant::now();
                        for _ in 0..iters {
                            d.allreduce(ReduceOp::Sum, algo).unwrap();
                        }
                        out.push(t.elapsed().as_secs_f64() / iters as f64);
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).next().unwrap()
    });
    alloc.end_run();
    median(&times)
}

/// Single-core memcpy GB/s (bytes copied per second) of `bytes`: the median of `samples`
/// timings of `reps` copies.
fn memcpy_gbps(bytes: usize, reps: usize, samples: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    let mut v = Vec::new();
    for _ in 0..samples {
        let t = Instant::now();
        for _ in 0..reps {
            dst.copy_from_slice(std::hint::black_box(&src));
        }
        v.push(bytes as f64 * reps as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(&dst);
    median(&v)
}

const ALGOS: [AllreduceAlgo; 4] = [
    AllreduceAlgo::Mesh,
    AllreduceAlgo::TwoPhase,
    AllreduceAlgo::Ring,
    AllreduceAlgo::Auto,
];

fn main() {
    let q = quick();
    let machine = Machine::now();
    println!("{}", machine.line());
    let arena = Arc::new(CommArena::anonymous(160 << 20, P).unwrap());
    let rounds = if q { 2 } else { 5 };
    // The allreduces run with this thread on CPU 0.
    pin(0);
    let mut json = Json::new();
    let mut floors_ns = Vec::new();
    let mut lat = Vec::new();
    let lat_iters = if q { 5_000 } else { 50_000 };
    for bytes in [8u64, 256, 4096] {
        let mut r = Rounds::new(rounds).variant("ping-pong RTT", || {
            let ns = pingpong_threads_ns(if q { 5_000 } else { 20_000 });
            floors_ns.push(ns);
            ns / 1e3
        });
        for algo in ALGOS {
            let arena = &arena;
            r = r.variant(format!("{algo:?}"), move || {
                allreduce_secs(arena, bytes, algo, lat_iters, 1) * 1e6
            });
        }
        let report = r.baseline("ping-pong RTT").run();
        println!("allreduce {bytes} B, µs per call:");
        print!("{}", report.table("µs", 3));
        lat.push((bytes, report.median("Auto"), report.ratio_median("Auto")));
    }
    let floor = median(&floors_ns);
    json.num("pingpong_rtt_ns", floor, 1);
    for (bytes, us, ratio) in &lat {
        json.num(&format!("lat_us_{bytes}"), *us, 3);
        json.num(&format!("lat_ratio_{bytes}"), *ratio, 3);
    }
    let mut memcpy = Vec::new();
    for (bytes, iters, name, copies) in [
        (
            1u64 << 20,
            if q { 50 } else { 500 },
            "1m",
            if q { 200 } else { 2000 },
        ),
        (
            64 << 20,
            if q { 3 } else { 10 },
            "64m",
            if q { 2 } else { 10 },
        ),
    ] {
        let mut r =
            Rounds::new(rounds).variant("memcpy", move || memcpy_gbps(bytes as usize, copies, 1));
        for algo in ALGOS {
            let arena = &arena;
            r = r.variant(format!("{algo:?}"), move || {
                bytes as f64 / allreduce_secs(arena, bytes, algo, iters, 1) / 1e9
            });
        }
        let report = r.baseline("memcpy").run();
        println!("allreduce {bytes} B, GB/s:");
        print!("{}", report.table("GB/s", 2));
        json.num(&format!("bw_gbps_{name}"), report.median("Auto"), 2);
        json.num(
            &format!("bw_gbps_{name}_vs_memcpy"),
            report.ratio_median("Auto"),
            3,
        );
        memcpy.push((name, report.median("memcpy")));
    }
    println!("raw cache-line ping-pong round trip (2 pinned threads): {floor:.0} ns (median over the latency rounds)");
    let (mc1, mc) = (memcpy[0].1, memcpy[1].1);
    println!("single-core memcpy: {mc:.2} GB/s at 64 MiB, {mc1:.2} GB/s at 1 MiB");
    json.num("memcpy_gbps", mc, 2)
        .num("memcpy_gbps_1m", mc1, 2)
        .int("rounds", rounds as u64)
        .machine(&machine);
    println!("{}", json.line());
}
