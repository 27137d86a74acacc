//! Criterion micro-benchmarks of the graph core's hot paths, on one thread: submit + claim
//! + complete of a chain task, a 1000-producer fan-in, and the footprint overlap test.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use std::hint::black_box;
use strata_graph::*;
use strata_types::{ArgTag, DataType, IdentityMinter, TensorView};

fn key(m: &IdentityMinter) -> BufferKey {
    BufferKey::new(m.mint(), KeySpace::Host)
}

fn chain_task(c: &mut Criterion) {
    let (mut orch, mut sched) = graph::<()>(GraphConfig::default()).expect("graph");
    let m = IdentityMinter::new();
    let x = [Access::new(key(&m), Footprint::WHOLE, ArgTag::InOut)];
    orch.begin_run().expect("run");
    let mut ready = Vec::new();
    c.bench_function("submit+claim+complete (chain)", |b| {
        b.iter(|| {
            let s = orch.submit(TaskSpec::new((), &x)).expect("submit");
            sched.claim(s.task).expect("ready");
            sched
                .complete(s.task, Ok(()), &mut ready)
                .expect("complete");
        })
    });
}

fn fan_in(c: &mut Criterion) {
    let m = IdentityMinter::new();
    let ys: Vec<BufferKey> = (0..1000).map(|_| key(&m)).collect();
    let reads: Vec<Access> = ys
        .iter()
        .map(|y| Access::new(*y, Footprint::WHOLE, ArgTag::Input))
        .collect();
    c.bench_function("fan-in of 1000 producers (submit whole round)", |b| {
        b.iter_batched(
            || graph::<()>(GraphConfig::default()).expect("graph"),
            |(mut orch, _sched)| {
                orch.begin_run().expect("run");
                for y in &ys {
                    orch.submit(TaskSpec::new(
                        (),
                        &[Access::new(*y, Footprint::WHOLE, ArgTag::Output)],
                    ))
                    .expect("producer");
                }
                black_box(orch.submit(TaskSpec::new((), &reads)).expect("sink"));
            },
            BatchSize::LargeInput,
        )
    });
}

fn overlap(c: &mut Criterion) {
    let m = TensorView::contiguous(DataType::F32, &[1024, 1024]).expect("view");
    let a = Footprint::of_view(&m.window(&[0, 0], &[64, 64]).expect("tile"));
    let b = Footprint::of_view(&m.window(&[0, 64], &[64, 64]).expect("tile"));
    c.bench_function("overlap of two disjoint tiles", |bn| {
        bn.iter(|| black_box(&a).overlap(black_box(&b)))
    });
}

criterion_group!(benches, chain_task, fan_in, overlap);
criterion_main!(benches);
