//! Allreduce latency and bandwidth between two ranks (threads pinned to CPUs 0 and 1, one
//! shared arena), next to a raw cache-line ping-pong between the same two threads and
//! single-core memcpy. The L3 end-to-end comparison with Open MPI is `cargo xtask bench
//! allreduce` (strata-dist); this one isolates strata-comm's own cost.
//!
//! `cargo bench -p strata-comm --bench comm_collectives` (STRATA_BENCH_QUICK=1 for a short
//! run). Prints a table and a JSON last line (latencies and bandwidths of `Auto`).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use strata_comm::*;
use strata_testkit::bench::{median, pin, pingpong_threads_ns};
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
    let cells = signal_cells(P, algo);
    let sig_off = bytes.div_ceil(4096) * 4096;
    let buf = alloc
        .alloc_window_buffer(&dom, sig_off + cells * 4)
        .unwrap();
    let x = alloc.window(&buf, 0, &[bytes / 4], DataType::F32).unwrap();
    let s = alloc
        .window(&buf, sig_off, &[cells], DataType::I32)
        .unwrap();
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
                    let (d, sw) = (comm.window(&x).unwrap(), comm.window(&s).unwrap());
                    // Warm-up (pages, caches, branch predictors).
                    for _ in 0..iters.clamp(2, 100) {
                        d.allreduce(&sw, ReduceOp::Sum, algo).unwrap();
                    }
                    let mut out = Vec::new();
                    for _ in 0..batches {
                        gate.wait();
                        let t = Instant::now();
                        for _ in 0..iters {
                            d.allreduce(&sw, ReduceOp::Sum, algo).unwrap();
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

/// Single-core memcpy GB/s (bytes copied per second) of `bytes`.
fn memcpy_gbps(bytes: usize, reps: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    let mut v = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            dst.copy_from_slice(std::hint::black_box(&src));
        }
        v.push(bytes as f64 * reps as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(&dst);
    median(&v)
}

fn main() {
    let q = quick();
    let arena = Arc::new(CommArena::anonymous(160 << 20, P).unwrap());
    let floor = pingpong_threads_ns(if q { 20_000 } else { 200_000 });
    // The rest of the bench ran with this thread on CPU 0, as the ping-pong used to leave it.
    pin(0);
    println!("raw cache-line ping-pong round trip (2 pinned threads): {floor:.0} ns");
    let mut json = vec![format!("\"pingpong_rtt_ns\": {floor:.1}")];
    let lat_iters = if q { 5_000 } else { 50_000 };
    for bytes in [8u64, 256, 4096] {
        for algo in [
            AllreduceAlgo::Mesh,
            AllreduceAlgo::TwoPhase,
            AllreduceAlgo::Ring,
            AllreduceAlgo::Auto,
        ] {
            let us = allreduce_secs(&arena, bytes, algo, lat_iters, 5) * 1e6;
            println!("allreduce {bytes:>8} B  {algo:<9?} {us:8.3} µs");
            if algo == AllreduceAlgo::Auto {
                json.push(format!("\"lat_us_{bytes}\": {us:.3}"));
            }
        }
    }
    for (bytes, iters, name) in [
        (1u64 << 20, if q { 50 } else { 500 }, "1m"),
        (64 << 20, if q { 3 } else { 10 }, "64m"),
    ] {
        let mut best = 0f64;
        for algo in [
            AllreduceAlgo::Mesh,
            AllreduceAlgo::TwoPhase,
            AllreduceAlgo::Ring,
            AllreduceAlgo::Auto,
        ] {
            let s = allreduce_secs(&arena, bytes, algo, iters, if q { 2 } else { 5 });
            let gbps = bytes as f64 / s / 1e9;
            println!(
                "allreduce {bytes:>8} B  {algo:<9?} {gbps:8.2} GB/s ({:.1} µs)",
                s * 1e6
            );
            if algo == AllreduceAlgo::Auto {
                best = gbps;
            }
        }
        json.push(format!("\"bw_gbps_{name}\": {best:.2}"));
    }
    let mc = memcpy_gbps(64 << 20, if q { 2 } else { 10 });
    let mc1 = memcpy_gbps(1 << 20, if q { 200 } else { 2000 });
    println!("single-core memcpy: {mc:.2} GB/s at 64 MiB, {mc1:.2} GB/s at 1 MiB");
    json.push(format!("\"memcpy_gbps\": {mc:.2}"));
    json.push(format!("\"memcpy_gbps_1m\": {mc1:.2}"));
    println!("{{{}}}", json.join(", "));
}
