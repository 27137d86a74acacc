//! `cargo xtask bench program`: what the execution API adds or saves (`harness = false`).
//!
//! 1. **Uploading a large weight** (64 MiB, one chip of a `Process`-mode level-3 worker)
//!    with `PreparedWorker::copy_to`: from ordinary host memory (staged through the
//!    worker's shared staging memory in halves) and from host memory inherited at prepare
//!    (read in place by the chip process), next to the machine's single-core memcpy of the
//!    same bytes, measured in the same rounds. Goal: staged ≥ 0.8× memcpy.
//! 2. **The first dispatch** of a freshly prepared worker with a large ring sizing, without
//!    and with `Prepare::prewarm` for that sizing (a fresh worker per variant and round).
//! 3. **A dispatch round trip** of one no-op chip task through `PreparedWorker::call` next
//!    to the engine's own `DistWorker::run` of the same task (what the program layer
//!    costs: argument checks, encoding, the dispatch queue).
//!
//! Each part alternates its variants in rounds; a figure is the median over rounds, a
//! ratio the median of per-round ratios. Every worker is closed (its threads joined)
//! before the next one forks. Prints a table, then one JSON line.

use std::time::Instant;
use strata::prelude::*;
use strata_testkit::bench::{assert_single_threaded, median, Json, Machine, Rounds};

const ROUNDS: usize = 7;
const WEIGHT: usize = 64 << 20;
const RTT_RUNS: usize = 3_000;

fn noop_program() -> Program {
    let mut p = Program::new(
        "noop",
        Signature::new().inout("t", DataType::U8, [Dim::named("n")]),
    );
    let k = p.kernel("k", |_ctx| Ok(()));
    let c = p.chip_orchestration("c", move |o, a| {
        o.submit_aiv(k, CoreArgs::new().inout(&a.tensor(0)?))?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        o.submit_next_level(c, &TaskArgs::new().inout(args.tensor("t")?), 0)?;
        Ok(())
    });
    p
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// A `MAP_SHARED` anonymous mapping (what a shared file mapping of weights would be).
fn shared_map(len: usize) -> &'static mut [u8] {
    // SAFETY: a fresh anonymous shared mapping, never unmapped (the bench exits).
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        std::slice::from_raw_parts_mut(p.cast(), len)
    }
}

fn main() -> Result<(), Error> {
    let start = Machine::now();
    println!("{}", start.line());
    let compiled = noop_program().compile(&Target::l3(1))?;

    // 1. Uploads.
    let plain: Vec<u8> = (0..WEIGHT).map(|i| (i % 251) as u8).collect();
    let inherited = shared_map(WEIGHT);
    inherited.copy_from_slice(&plain);
    let mut scratch = vec![0u8; WEIGHT];
    assert_single_threaded("prepare (uploads)");
    // SAFETY: the mapping is never unmapped.
    let rt = compiled
        .prepare(unsafe { Prepare::new().inherit_raw(inherited.as_mut_ptr(), WEIGHT, true) })?;
    let dev = rt.alloc_tensor(&[WEIGHT as u64], DataType::U8, 0)?;
    let range = CopyRange::bytes(WEIGHT as u64);
    let uploads = Rounds::new(ROUNDS)
        .warmup(1)
        .variant("memcpy, one core", || {
            let t = Instant::now();
            scratch.copy_from_slice(std::hint::black_box(&plain));
            gbps(WEIGHT, t.elapsed().as_secs_f64())
        })
        .variant("upload, staged", || {
            let t = Instant::now();
            rt.copy_to(&dev, &plain, range).expect("staged upload");
            gbps(WEIGHT, t.elapsed().as_secs_f64())
        })
        .variant("upload, inherited in place", || {
            let t = Instant::now();
            rt.copy_to(&dev, &inherited[..], range)
                .expect("in-place upload");
            gbps(WEIGHT, t.elapsed().as_secs_f64())
        })
        .baseline("memcpy, one core")
        .run();
    let mut back = vec![0u8; WEIGHT];
    rt.copy_from(&mut back, &dev, range)?;
    assert!(back == plain, "the weight read back as uploaded");
    rt.close()?;
    drop(rt);
    println!("\nuploading a 64 MiB weight to one chip (GB/s, higher is better)");
    println!("{}", uploads.table("GB/s", 2));

    // 2. First dispatch, cold vs prewarmed.
    let mut sizing = CallConfig::default();
    for r in sizing.rings.iter_mut() {
        r.heap_bytes = Some(64 << 20);
        r.task_window = Some(1 << 16);
        r.dep_pool = Some(1 << 18);
    }
    let t = SharedTensor::zeroed(&[64], DataType::U8)?;
    let first = |options: Prepare| -> f64 {
        assert_single_threaded("prepare (first dispatch)");
        let rt = compiled.prepare(options).expect("prepare");
        let s = Instant::now();
        rt.run_with(&compiled, (&t,), &sizing)
            .expect("first dispatch");
        let us = s.elapsed().as_secs_f64() * 1e6;
        rt.close().expect("close");
        us
    };
    let firsts = Rounds::new(ROUNDS)
        .variant("first dispatch, cold", || first(Prepare::new()))
        .variant("first dispatch, prewarmed", || {
            first(Prepare::new().prewarm(&sizing))
        })
        .baseline("first dispatch, cold")
        .run();
    println!("\nthe first dispatch with 4 x 64 MiB ring heaps, 64 Ki task windows (µs)");
    println!("{}", firsts.table("µs", 1));

    // 3. Round trip: prepared call vs the engine's run.
    let call_rtt = || -> f64 {
        assert_single_threaded("prepare (rtt)");
        let rt = compiled.prepare(Prepare::new()).expect("prepare");
        for _ in 0..RTT_RUNS / 4 {
            rt.call((&t,)).expect("warm-up");
        }
        let mut v = Vec::with_capacity(RTT_RUNS);
        for _ in 0..RTT_RUNS {
            let s = Instant::now();
            rt.call((&t,)).expect("call");
            v.push(s.elapsed().as_secs_f64() * 1e6);
        }
        rt.close().expect("close");
        median(&v)
    };
    let engine_rtt = || -> f64 {
        assert_single_threaded("init (rtt)");
        let mut w = strata::dist::DistWorker::new(strata::dist::DistConfig::l3(
            vec![ChipConfig::default()],
            0,
        ))
        .expect("worker");
        let k = w.register_kernel("k", |_ctx| Ok(())).expect("kernel");
        let c = w
            .register_chip_orchestration("c", move |o, a| {
                o.submit_aiv(k, CoreArgs::new().inout(&a.tensor(0)?))?;
                Ok(())
            })
            .expect("chip orchestration");
        let tt = t.clone();
        let orch = w.register_orchestration("run", move |o, _| {
            o.submit_next_level(c, &TaskArgs::new().inout(&tt), 0)?;
            Ok(())
        });
        w.init().expect("init");
        let none = TaskArgs::new();
        for _ in 0..RTT_RUNS / 4 {
            w.run(&orch, &none).expect("warm-up");
        }
        let mut v = Vec::with_capacity(RTT_RUNS);
        for _ in 0..RTT_RUNS {
            let s = Instant::now();
            w.run(&orch, &none).expect("run");
            v.push(s.elapsed().as_secs_f64() * 1e6);
        }
        w.close().expect("close");
        median(&v)
    };
    let rtt = Rounds::new(ROUNDS)
        .variant("engine DistWorker::run", engine_rtt)
        .variant("PreparedWorker::call", call_rtt)
        .baseline("engine DistWorker::run")
        .run();
    println!("\none no-op chip task, round trip (µs, median of {RTT_RUNS} per round)");
    println!("{}", rtt.table("µs", 2));

    let mut json = Json::new();
    json.num("memcpy_gbps", uploads.median("memcpy, one core"), 2)
        .num("upload_staged_gbps", uploads.median("upload, staged"), 2)
        .num(
            "upload_inplace_gbps",
            uploads.median("upload, inherited in place"),
            2,
        )
        .num(
            "staged_vs_memcpy",
            uploads.ratio_median_vs("upload, staged", "memcpy, one core"),
            3,
        )
        .num(
            "inplace_vs_memcpy",
            uploads.ratio_median_vs("upload, inherited in place", "memcpy, one core"),
            3,
        )
        .num(
            "first_dispatch_cold_us",
            firsts.median("first dispatch, cold"),
            1,
        )
        .num(
            "first_dispatch_prewarmed_us",
            firsts.median("first dispatch, prewarmed"),
            1,
        )
        .num(
            "prewarmed_vs_cold",
            firsts.ratio_median_vs("first dispatch, prewarmed", "first dispatch, cold"),
            3,
        )
        .num("engine_rtt_us", rtt.median("engine DistWorker::run"), 2)
        .num("call_rtt_us", rtt.median("PreparedWorker::call"), 2)
        .num(
            "call_vs_engine",
            rtt.ratio_median_vs("PreparedWorker::call", "engine DistWorker::run"),
            3,
        )
        .int("rounds", ROUNDS as u64)
        .machine(&start);
    println!("{}", json.line());
    Ok(())
}
