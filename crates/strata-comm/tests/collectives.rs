//! Every collective against host goldens, with ranks as threads over one shared arena.

mod common;

use common::*;
use proptest::prelude::*;
use strata_comm::*;
use strata_types::DataType;

/// Runs `rounds` allreduces of `numel` elements on `p` ranks (round 0 staged by the host,
/// later rounds written by each rank into its own copy) and checks every rank against the
/// golden fold. Returns whether the barrier rows ended clear.
fn allreduce_case(
    p: u32,
    dtype: DataType,
    op: ReduceOp,
    algo: AllreduceAlgo,
    numel: u64,
    rounds: usize,
) {
    let mut w = world(p, 4 << 20);
    let dom = w.alloc.world().unwrap();
    let db = r64(numel * dtype.size_bytes() as u64);
    let buf = w.alloc.alloc_window_buffer(&dom, db).unwrap();
    let data = w.alloc.window(&buf, 0, &[numel], dtype).unwrap();
    let inputs: Vec<Vec<Vec<f64>>> = (0..rounds)
        .map(|r| {
            (0..p)
                .map(|rank| values(op, 1 + 1000 * r as u64 + rank as u64, numel as usize))
                .collect()
        })
        .collect();
    for rank in 0..p {
        host_put(&w.alloc, &data, rank, &inputs[0][rank as usize]);
    }
    let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
        let d = comm.window(&data).unwrap();
        let mut outs = Vec::new();
        for (r, input) in inputs.iter().enumerate() {
            if r > 0 {
                put_own(&d, &input[d.rank() as usize]);
            }
            d.allreduce(op, algo).unwrap();
            outs.push(get_own(&d));
        }
        outs
    });
    for (rank, o) in outs.iter().enumerate() {
        for (r, got) in o.iter().enumerate() {
            let want = fold(op, dtype, &inputs[r]);
            assert_eq!(
                got, &want,
                "p={p} {dtype} {op:?} {algo:?} numel={numel} rank {rank} round {r}"
            );
        }
    }
    assert!(rows_clear(&w.alloc, &buf, p), "barrier rows left a tally");
}

#[test]
fn s1_quickstart_two_rank_allreduce() {
    for algo in [
        AllreduceAlgo::Mesh,
        AllreduceAlgo::TwoPhase,
        AllreduceAlgo::Auto,
    ] {
        let mut w = world(2, 1 << 20);
        let dom = w.alloc.world().unwrap();
        let buf = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
        let x = w.alloc.window(&buf, 0, &[1, 3], DataType::F32).unwrap();
        w.alloc.host_write(&x, 0, 0, &[1f32, 2., 3.]).unwrap();
        w.alloc.host_write(&x, 1, 0, &[10f32, 20., 30.]).unwrap();
        run_ranks(&w.arena, &[0, 1], TIMEOUT, |comm| {
            let d = comm.window(&x).unwrap();
            d.allreduce(ReduceOp::Sum, algo).unwrap();
        });
        for r in 0..2 {
            let mut out = [0f32; 3];
            w.alloc.host_read(&x, r, 0, &mut out).unwrap();
            assert_eq!(out, [11., 22., 33.], "{algo:?} rank {r}");
        }
    }
    // The docs' SIZE = 256 with the ring: out[i] = in0[i] + in1[i].
    let mut w = world(2, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let buf = w.alloc.alloc_window_buffer(&dom, 1024).unwrap();
    let x = w.alloc.window(&buf, 0, &[1, 256], DataType::F32).unwrap();
    let a: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..256).map(|i| (i + 100) as f32).collect();
    w.alloc.host_write(&x, 0, 0, &a).unwrap();
    w.alloc.host_write(&x, 1, 0, &b).unwrap();
    run_ranks(&w.arena, &[0, 1], TIMEOUT, |comm| {
        comm.window(&x)
            .unwrap()
            .allreduce(ReduceOp::Sum, AllreduceAlgo::Ring)
            .unwrap();
    });
    for r in 0..2 {
        let mut out = vec![0f32; 256];
        w.alloc.host_read(&x, r, 0, &mut out).unwrap();
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, &v)| v == (2 * i + 100) as f32));
    }
}

#[test]
fn allreduce_every_op_dtype_and_algorithm_at_2_and_4_ranks() {
    for p in [2u32, 4] {
        for dtype in DTYPES {
            for op in OPS {
                for algo in [
                    AllreduceAlgo::Mesh,
                    AllreduceAlgo::TwoPhase,
                    AllreduceAlgo::Ring,
                ] {
                    // 24 elements take the inline path of the mesh; 120 f32 the pull path.
                    for numel in [24, 120] {
                        allreduce_case(p, dtype, op, algo, numel, 2);
                    }
                }
            }
        }
    }
}

#[test]
fn allreduce_at_3_ranks_and_odd_sizes() {
    for op in OPS {
        for algo in ALGOS {
            for numel in [1u64, 3, 63, 66, 999] {
                let numel = if algo == AllreduceAlgo::Ring {
                    numel * 3
                } else {
                    numel
                };
                allreduce_case(3, DataType::F32, op, algo, numel, 2);
            }
        }
    }
    // A domain of one rank: every collective is a no-op.
    allreduce_case(1, DataType::I32, ReduceOp::Sum, AllreduceAlgo::Ring, 8, 2);
}

#[test]
fn allreduce_large_messages_span_many_blocks() {
    for p in [2u32, 4] {
        for algo in ALGOS {
            allreduce_case(p, DataType::F32, ReduceOp::Sum, algo, 40_000, 2);
            allreduce_case(p, DataType::BF16, ReduceOp::Max, algo, 12_000, 1);
        }
    }
}

/// Builds a world with one window buffer: a data window of `data_shape` x `dtype` and,
/// after it, an optional second window of `extra_shape`.
fn setup(
    p: u32,
    data_shape: &[u64],
    dtype: DataType,
    extra_shape: Option<&[u64]>,
) -> (
    World,
    DistributedTensor,
    Option<DistributedTensor>,
    WindowBuffer,
) {
    let mut w = world(p, 4 << 20);
    let dom = w.alloc.world().unwrap();
    let es = dtype.size_bytes() as u64;
    let a = r64(data_shape.iter().product::<u64>() * es);
    let b = extra_shape.map_or(0, |s| r64(s.iter().product::<u64>() * es));
    let buf = w.alloc.alloc_window_buffer(&dom, a + b).unwrap();
    let x = w.alloc.window(&buf, 0, data_shape, dtype).unwrap();
    let y = extra_shape.map(|s| w.alloc.window(&buf, a, s, dtype).unwrap());
    (w, x, y, buf)
}

#[test]
fn broadcast_from_every_root_reusing_one_signal_area() {
    for p in [2u32, 3, 4] {
        for dtype in [DataType::F32, DataType::I32, DataType::F16] {
            let (w, x, _, buf) = setup(p, &[p as u64, 37], dtype, None);
            let m = 37 * p as usize;
            let inputs: Vec<Vec<Vec<f64>>> = (0..p)
                .map(|root| {
                    (0..p)
                        .map(|r| values(ReduceOp::Max, 77 + 10 * root as u64 + r as u64, m))
                        .collect()
                })
                .collect();
            let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
                let d = comm.window(&x).unwrap();
                (0..p)
                    .map(|root| {
                        put_own(&d, &inputs[root as usize][d.rank() as usize]);
                        d.broadcast(root).unwrap();
                        get_own(&d)
                    })
                    .collect::<Vec<_>>()
            });
            for (rank, o) in outs.iter().enumerate() {
                for root in 0..p as usize {
                    let want: Vec<f64> = inputs[root][root]
                        .iter()
                        .map(|&v| to_f64(dtype, v))
                        .collect();
                    assert_eq!(o[root], want, "p={p} {dtype} root {root} rank {rank}");
                }
            }
            assert!(rows_clear(&w.alloc, &buf, p));
        }
    }
}

#[test]
fn allgather_at_2_3_4_ranks() {
    for p in [2u32, 3, 4] {
        for dtype in DTYPES {
            let m = 29u64;
            let (w, stage, target, _) = setup(p, &[m], dtype, Some(&[p as u64, m]));
            let target = target.unwrap();
            let inputs: Vec<Vec<Vec<f64>>> = (0..2)
                .map(|round| {
                    (0..p)
                        .map(|r| values(ReduceOp::Max, 5 + 100 * round + r as u64, m as usize))
                        .collect()
                })
                .collect();
            let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
                let st = comm.window(&stage).unwrap();
                let tg = comm.window(&target).unwrap();
                (0..2)
                    .map(|round| {
                        put_own(&st, &inputs[round][st.rank() as usize]);
                        st.allgather(&tg).unwrap();
                        get_own(&tg)
                    })
                    .collect::<Vec<_>>()
            });
            for (rank, o) in outs.iter().enumerate() {
                for round in 0..2 {
                    let want: Vec<f64> = inputs[round]
                        .iter()
                        .flat_map(|v| v.iter().map(|&x| to_f64(dtype, x)))
                        .collect();
                    assert_eq!(o[round], want, "p={p} {dtype} rank {rank} round {round}");
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_every_op_at_2_3_4_ranks() {
    for p in [2u32, 3, 4] {
        for dtype in DTYPES {
            for op in OPS {
                let m = 21u64;
                let (w, x, _, _) = setup(p, &[p as u64, m], dtype, None);
                let n = (p as u64 * m) as usize;
                let inputs: Vec<Vec<f64>> = (0..p).map(|r| values(op, 900 + r as u64, n)).collect();
                for r in 0..p {
                    host_put(&w.alloc, &x, r, &inputs[r as usize]);
                }
                run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
                    let d = comm.window(&x).unwrap();
                    d.reduce_scatter(op).unwrap();
                });
                let golden = fold(op, dtype, &inputs);
                for (r, input) in inputs.iter().enumerate() {
                    let got = host_get(&w.alloc, &x, r as u32);
                    let m = m as usize;
                    for c in 0..p as usize {
                        let want: Vec<f64> = if c == r {
                            golden[c * m..(c + 1) * m].to_vec()
                        } else {
                            input[c * m..(c + 1) * m]
                                .iter()
                                .map(|&v| to_f64(dtype, v))
                                .collect()
                        };
                        assert_eq!(
                            &got[c * m..(c + 1) * m],
                            &want[..],
                            "p={p} {dtype} {op:?} rank {r} chunk {c}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn all_to_all_at_2_3_4_ranks() {
    for p in [2u32, 3, 4] {
        for dtype in [DataType::F32, DataType::I32, DataType::BF16] {
            let m = 13u64;
            let shape = [p as u64, m];
            let (w, stage, target, _) = setup(p, &shape, dtype, Some(&shape));
            let target = target.unwrap();
            // stage of rank s, chunk d = 1000 s + 100 d + j (scaled down for bf16).
            let val = |s: u32, d: u32, j: u64| -> f64 {
                if dtype == DataType::BF16 {
                    (s * 16 + d * 4) as f64 + (j % 4) as f64
                } else {
                    (1000 * s + 100 * d) as f64 + j as f64
                }
            };
            for s in 0..p {
                let v: Vec<f64> = (0..p)
                    .flat_map(|d| (0..m).map(move |j| val(s, d, j)))
                    .collect();
                host_put(&w.alloc, &stage, s, &v);
            }
            run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
                let st = comm.window(&stage).unwrap();
                let tg = comm.window(&target).unwrap();
                st.all_to_all(&tg).unwrap();
            });
            for r in 0..p {
                let want: Vec<f64> = (0..p)
                    .flat_map(|s| (0..m).map(move |j| val(s, r, j)))
                    .collect();
                assert_eq!(
                    host_get(&w.alloc, &target, r),
                    want,
                    "p={p} {dtype} rank {r}"
                );
            }
        }
    }
}

/// One buffer's signal area serves a long mix of collectives and barriers on its windows,
/// call after call.
#[test]
fn one_signal_area_serves_every_collective_in_turn() {
    let p = 4u32;
    let (w, x, y, buf) = setup(p, &[p as u64, 40], DataType::F32, Some(&[p as u64, 40]));
    let y = y.unwrap();
    let small = x.with_shape(&[8], DataType::F32).unwrap();
    let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
        let d = comm.window(&x).unwrap();
        let ds = comm.window(&small).unwrap();
        let t = comm.window(&y).unwrap();
        let me = d.rank() as f64;
        let mut log = Vec::new();
        for round in 0..3 {
            let base = 10_000.0 * round as f64;
            put_own(&d, &vec![base + me; 160]);
            d.allreduce(ReduceOp::Sum, AllreduceAlgo::Mesh).unwrap();
            log.push(get_own(&d)[0]);
            put_own(&ds, &[base + me; 8]);
            ds.allreduce(ReduceOp::Max, AllreduceAlgo::Mesh).unwrap();
            log.push(get_own(&ds)[7]);
            t.barrier().unwrap();
            put_own(&d, &vec![base + me; 160]);
            d.allreduce(ReduceOp::Min, AllreduceAlgo::Ring).unwrap();
            log.push(get_own(&d)[159]);
            put_own(&d, &vec![base + me; 160]);
            d.broadcast(2).unwrap();
            log.push(get_own(&d)[3]);
            put_own(&d, &vec![base + me; 160]);
            d.allreduce(ReduceOp::Sum, AllreduceAlgo::TwoPhase).unwrap();
            log.push(get_own(&d)[100]);
            put_own(&d, &vec![base + me; 160]);
            d.all_to_all(&t).unwrap();
            log.push(get_own(&t)[40 * 3]);
            d.barrier().unwrap();
        }
        log
    });
    for o in outs {
        for round in 0..3 {
            let b = 10_000.0 * round as f64;
            assert_eq!(
                &o[6 * round..6 * round + 6],
                &[4.0 * b + 6.0, b + 3.0, b, b + 2.0, 4.0 * b + 6.0, b + 3.0],
                "round {round}"
            );
        }
    }
    assert!(rows_clear(&w.alloc, &buf, p));
}

#[test]
fn a_collective_mismatch_is_detected_on_every_rank_and_the_signal_area_stays_usable() {
    for (p, a, b) in [
        // op differs
        (
            2u32,
            (ReduceOp::Sum, AllreduceAlgo::Mesh, 64u64),
            (ReduceOp::Max, AllreduceAlgo::Mesh, 64u64),
        ),
        // algorithm differs
        (
            4,
            (ReduceOp::Sum, AllreduceAlgo::Ring, 64),
            (ReduceOp::Sum, AllreduceAlgo::TwoPhase, 64),
        ),
        // size differs: one rank on the inline path, the other not
        (
            2,
            (ReduceOp::Sum, AllreduceAlgo::Mesh, 8),
            (ReduceOp::Sum, AllreduceAlgo::Mesh, 512),
        ),
    ] {
        let (w, x, _, _) = setup(p, &[512], DataType::F32, None);
        let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
            let me = comm.world_rank();
            let (op, algo, n) = if me == p - 1 { b } else { a };
            let d = comm
                .window(&x.with_shape(&[n], DataType::F32).unwrap())
                .unwrap();
            let first = d.allreduce(op, algo);
            // Everyone agrees now: the same signal area still works.
            let full = comm.window(&x).unwrap();
            put_own(&full, &vec![1.0 + me as f64; 512]);
            full.allreduce(ReduceOp::Sum, AllreduceAlgo::Mesh).unwrap();
            (first, get_own(&full)[511])
        });
        let total: f64 = (1..=p).map(f64::from).sum();
        for (rank, (first, v)) in outs.into_iter().enumerate() {
            match first {
                Err(CommError::CollectiveMismatch {
                    domain_rank,
                    mine,
                    theirs,
                    ..
                }) => {
                    assert_eq!(domain_rank, rank as u32);
                    assert_ne!(mine, theirs);
                }
                other => panic!("rank {rank}: expected a mismatch, got {other:?}"),
            }
            assert_eq!(v, total);
        }
    }
}

#[test]
fn arguments_every_rank_rejects_leave_the_signal_area_usable() {
    let p = 2;
    let (w, x, y, buf) = setup(p, &[7], DataType::F32, Some(&[5]));
    let y = y.unwrap();
    let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
        let d = comm.window(&x).unwrap();
        let t = comm.window(&y).unwrap();
        let ring = d.allreduce(ReduceOp::Sum, AllreduceAlgo::Ring);
        let root = d.broadcast(9);
        let gather = d.allgather(&t);
        let overlap = d.all_to_all(&d);
        put_own(&d, &[2.0; 7]);
        d.allreduce(ReduceOp::Prod, AllreduceAlgo::TwoPhase)
            .unwrap();
        (ring, root, gather, overlap, get_own(&d))
    });
    for (ring, root, gather, overlap, v) in outs {
        for (what, r) in [
            ("ring", ring),
            ("root", root),
            ("gather", gather),
            ("overlap", overlap),
        ] {
            assert!(
                matches!(r, Err(CommError::BadArgument { .. })),
                "{what}: {r:?}"
            );
        }
        assert_eq!(v, vec![4.0; 7]);
    }
    assert!(rows_clear(&w.alloc, &buf, p));
    // A stage and a target of two domains (over the same ranks, in another order).
    let mut w2 = world(2, 1 << 20);
    let d01 = w2.alloc.world().unwrap();
    let d10 = w2.alloc.domain(&[1, 0]).unwrap();
    let b1 = w2.alloc.alloc_window_buffer(&d01, 64).unwrap();
    let b2 = w2.alloc.alloc_window_buffer(&d10, 64).unwrap();
    let s1 = w2.alloc.window(&b1, 0, &[2], DataType::F32).unwrap();
    let s2 = w2.alloc.window(&b2, 0, &[4], DataType::F32).unwrap();
    let outs = run_ranks(&w2.arena, &all(2), TIMEOUT, |comm| {
        let (a, b) = (comm.window(&s1).unwrap(), comm.window(&s2).unwrap());
        a.allgather(&b)
    });
    for o in outs {
        assert!(
            matches!(&o, Err(CommError::BadArgument { what }) if what.contains("same comm domain")),
            "{o:?}"
        );
    }
    // f64 data is not reducible.
    let (w, x, _, _) = setup(2, &[4], DataType::F64, None);
    let outs = run_ranks(&w.arena, &all(2), TIMEOUT, |comm| {
        let d = comm.window(&x).unwrap();
        d.allreduce(ReduceOp::Sum, AllreduceAlgo::Mesh)
    });
    for o in outs {
        assert!(
            matches!(o, Err(CommError::UnsupportedDtype { .. })),
            "{o:?}"
        );
    }
}

#[test]
fn a_rank_that_never_arrives_ends_the_collective_with_a_wait_timeout() {
    let (w, x, _, _) = setup(2, &[16], DataType::F32, None);
    let outs = run_ranks(
        &w.arena,
        &[0],
        std::time::Duration::from_millis(200),
        |comm| {
            let d = comm.window(&x).unwrap();
            d.allreduce(ReduceOp::Sum, AllreduceAlgo::TwoPhase)
        },
    );
    match &outs[0] {
        Err(CommError::WaitTimeout {
            rank,
            domain_rank,
            what,
            expected,
            cmp,
            seen,
            waited,
            ..
        }) => {
            assert_eq!((*rank, *domain_rank), (0, 0));
            assert!(what.contains("arrival of domain rank 1"), "{what}");
            assert_eq!((*expected, *cmp, *seen), (1, WaitCmp::Eq, 0));
            assert!(*waited >= std::time::Duration::from_millis(200));
        }
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// Allreduce against a sequential fold, for random rank counts, sizes, ops, dtypes and
    /// algorithms.
    #[test]
    fn allreduce_matches_a_sequential_fold(
        p in 1u32..=4,
        numel in 1u64..2000,
        op_i in 0usize..4,
        dt_i in 0usize..4,
        algo_i in 0usize..4,
    ) {
        let algo = ALGOS[algo_i];
        let numel = if algo == AllreduceAlgo::Ring { numel.div_ceil(p as u64) * p as u64 } else { numel };
        allreduce_case(p, DTYPES[dt_i], OPS[op_i], algo, numel, 2);
    }
}
