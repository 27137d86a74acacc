//! Criterion benchmarks of the public API's hot paths (`cargo bench --bench hot_paths`,
//! or `cargo bench` for every bench): the graph core's submit, a mailbox round trip, one
//! chip run, one L3 round trip and a small allreduce. Each is short (about 2 s of
//! measurement) and in process — threads, not forked children, since criterion's
//! analysis runs threads and a fork must come from a single-threaded process — so
//! `cargo bench` stays quick. Criterion saves each run's estimates under
//! `target/criterion/`, so two commits compare with `--save-baseline` / `--baseline`.
//!
//! These are absolute times, for comparing one build with another on one machine. The
//! side-by-side figures (strata next to a floor or a peer, alternated in rounds) are
//! `cargo xtask bench <name>` (docs/benchmarks.md).

use criterion::{criterion_group, criterion_main, Criterion};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use strata::chip::{ChipConfig, ChipWorker, CoreArgs, RunArgs};
use strata::comm::{AllreduceAlgo, Comm, CommAllocator, CommArena, RankContext, ReduceOp};
use strata::dist::{DistConfig, DistWorker};
use strata::graph::{graph, Access, BufferKey, Footprint, GraphConfig, KeySpace, TaskSpec};
use strata::host::ExecMode;
use strata::mailbox::{
    encode_args_blob, AssumeAlive, Child, EncodedConfig, FailureReport, FrameIdentity, Handler,
    Mailbox, Parent, TaskPublication, TaskRequest, TaskSlot, WaitOptions,
};
use strata::types::{ArgTag, CallConfig, CallableId, DataType, IdentityMinter, TaskArgs};

/// Submit, claim and complete one task of a chain (`INOUT` on one buffer): the graph
/// core's cost per task, dependency inference included.
fn graph_submit(c: &mut Criterion) {
    let (mut orch, mut sched) = graph::<()>(GraphConfig::default()).expect("graph");
    let m = IdentityMinter::new();
    let x = [Access::new(
        BufferKey::new(m.mint(), KeySpace::Host),
        Footprint::WHOLE,
        ArgTag::InOut,
    )];
    orch.begin_run().expect("run");
    let mut ready = Vec::new();
    c.bench_function("graph: submit + claim + complete, chain task", |b| {
        b.iter(|| {
            let s = orch.submit(TaskSpec::new((), &x)).expect("submit");
            sched.claim(s.task).expect("ready");
            sched
                .complete(s.task, Ok(()), &mut ready)
                .expect("complete");
        })
    });
}

struct NoOp;

impl Handler for NoOp {
    fn task(&mut self, _req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        Ok(())
    }
}

/// A no-op task through a mailbox to a child *thread* serving it (publish, wait for the
/// completion, reset the frame).
fn mailbox_rtt(c: &mut Criterion) {
    let mb = Mailbox::create().expect("mailbox");
    let child_mb = mb.try_clone().expect("mapping");
    let server = std::thread::spawn(move || {
        let mut child = Child::new(child_mb);
        child.init_ready(0).expect("ready");
        child.serve(&mut NoOp).expect("serve");
    });
    let mut parent = Parent::new(mb);
    let opts = WaitOptions::default();
    parent.wait_init(&opts, &mut AssumeAlive).expect("init");
    let config = EncodedConfig::default();
    let blob = encode_args_blob(&TaskArgs::new()).expect("blob");
    let mut dispatch = 0u64;
    c.bench_function("mailbox: no-op task round trip (threads)", |b| {
        b.iter(|| {
            dispatch += 1;
            let id = FrameIdentity {
                run_id: 1,
                lease_slot: 0,
                lease_generation: 1,
                dispatch_id: dispatch,
            };
            let task = TaskPublication::run(CallableId([7; 32]), id, &config, &blob);
            parent.publish(TaskSlot::Slot0, &task).expect("publish");
            parent
                .wait_task(TaskSlot::Slot0, &opts, &mut AssumeAlive)
                .expect("done");
            parent.reset(TaskSlot::Slot0).expect("reset");
        })
    });
    parent.request_shutdown();
    server.join().expect("server thread");
}

/// `ChipWorker::run` of an orchestration that submits one empty AIV kernel.
fn chip_run(c: &mut Criterion) {
    let mut chip = ChipWorker::new(ChipConfig::default()).expect("chip");
    let empty = chip
        .register_kernel_fn("empty", |_| Ok(()))
        .expect("kernel");
    let one = chip
        .register_orchestration_fn("one", move |o, _| {
            o.submit_aiv(empty, &CoreArgs::new())?;
            Ok(())
        })
        .expect("orchestration");
    chip.init().expect("init");
    let cfg = CallConfig::default();
    c.bench_function("chip: run of one empty kernel", |b| {
        b.iter(|| chip.run(&one, &mut RunArgs::new(), &cfg).expect("run"))
    });
    chip.close().expect("close");
}

/// `DistWorker::run` of a host orchestration that submits one no-op sub-worker task
/// (Threads mode: the sub-worker is a thread of this process).
fn l3_round_trip(c: &mut Criterion) {
    let mut w = DistWorker::new(DistConfig::l3(vec![], 1).with_exec_mode(ExecMode::Threads))
        .expect("worker");
    let noop = w.register_sub("bench.noop", |_| Ok(()));
    let orch = w.register_orchestration("bench.one_sub_task", move |o, _| {
        o.submit_sub(&noop, &TaskArgs::new())?;
        Ok(())
    });
    w.init().expect("init");
    let args = TaskArgs::new();
    c.bench_function("l3: run of one sub task (Threads mode)", |b| {
        b.iter(|| w.run(&orch, &args).expect("run"))
    });
    w.close().expect("close");
}

/// A 2-rank allreduce (f32 sum) of 256 bytes between two threads pinned to CPUs 0 and 1
/// (one CPU if the machine has one), time per allreduce on rank 0.
fn allreduce_small(c: &mut Criterion) {
    const BYTES: u64 = 256;
    const P: u32 = 2;
    let algo = AllreduceAlgo::Auto;
    let arena = Arc::new(CommArena::anonymous(1 << 20, P).expect("arena"));
    let mut alloc = CommAllocator::new(arena.clone());
    let dom = alloc.world().expect("world");
    // The buffer carries its own signal area (after the data).
    let buf = alloc
        .alloc_window_buffer(&dom, BYTES)
        .expect("window buffer");
    let x = alloc
        .window(&buf, 0, &[BYTES / 4], DataType::F32)
        .expect("x");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    c.bench_function("comm: allreduce 256 B, 2 ranks (threads)", |b| {
        b.iter_custom(|iters| {
            let gate = Barrier::new(P as usize);
            std::thread::scope(|sc| {
                let hs: Vec<_> = (0..P)
                    .map(|r| {
                        let ctx = RankContext::new(arena.clone(), r, Duration::from_secs(60));
                        let (gate, x) = (&gate, &x);
                        sc.spawn(move || {
                            if cpus >= 2 {
                                strata_testkit::bench::pin(r as usize);
                            }
                            let comm = Comm::from_rank(&ctx);
                            let d = comm.window(x).unwrap();
                            gate.wait();
                            let t = Instant::now();
                            for _ in 0..iters {
                                d.allreduce(ReduceOp::Sum, algo).expect("allreduce");
                            }
                            t.elapsed()
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().expect("rank"))
                    .next()
                    .expect("rank 0")
            })
        })
    });
    alloc.end_run();
}

fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = hot_paths;
    config = quick();
    targets = graph_submit, mailbox_rtt, chip_run, l3_round_trip, allreduce_small
}
criterion_main!(hot_paths);
