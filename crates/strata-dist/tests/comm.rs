//! Distributed memory end to end: window buffers, signals, one-sided access and
//! collectives across emulated chips, each a forked process of a level-3 worker
//! (`harness = false`: the binary forks; every scenario runs inside strata-testkit's leak
//! check). Kernels reach windows through `strata_comm::Comm::from_kernel`; results are
//! checked against host goldens.

use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, CoreArgs, KernelCtx, KernelError, OrchHandle};
use strata_comm::{Comm, DistributedTensor, NotifyOp, StoreOp, WaitCmp};
use strata_dist::*;
use strata_host::SharedTensor;
use strata_testkit::*;
use strata_types::{ArgTag, CallbackResult, DataType, TaskArgs, TensorArg};

fn l3(chips: usize) -> DistConfig {
    let mut c = DistConfig::l3(vec![ChipConfig::default(); chips], 0);
    c.comm_arena_bytes = 16 << 20;
    c
}

/// Registers `kernel` under `name` with a chip orchestration that hands it tensor 0 as an
/// input and tensor 1 (if any) as an output, and every scalar.
fn register(
    w: &mut DistWorker,
    name: &str,
    kernel: impl Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static,
) -> Result<OrchHandle, String> {
    let k = w.register_kernel(name, kernel).ctx("kernel")?;
    w.register_chip_orchestration(name, move |o, a| {
        let mut core = CoreArgs::new();
        if a.tensor_count() > 0 {
            core.input(&a.tensor(0)?);
        }
        if a.tensor_count() > 1 {
            core.output(&a.tensor(1)?);
        }
        for i in 0..a.scalar_count() {
            core.scalar_bits(a.scalar::<u64>(i)?);
        }
        o.submit_aiv(k, &core)?;
        Ok(())
    })
    .ctx("chip orchestration")
}

/// The window tensor named by the scalars at `i * 4`.
fn window_at(ctx: &KernelCtx<'_>, i: usize) -> Result<DistributedTensor, KernelError> {
    Ok(DistributedTensor::from_scalars(
        &ctx.scalars()[i * DistributedTensor::SCALARS..],
    )?)
}

/// Per-rank arguments: rank `r`'s row of `x` (input), row `r` of `y` (output), the
/// windows (as dependencies and as scalars), then `extra` scalars.
fn rank_args(
    r: u64,
    x: Option<&SharedTensor>,
    y: Option<&SharedTensor>,
    windows: &[&WindowTensor],
    extra: &[u64],
) -> Result<TaskArgs, DistError> {
    let row = |t: &SharedTensor, tag: ArgTag| -> Result<TensorArg, DistError> {
        Ok(t.arg_view(t.view().slice(0, r, r + 1)?, tag)?)
    };
    let mut a = TaskArgs::new();
    if let Some(x) = x {
        a.push_tensor(row(x, ArgTag::Input)?)?;
    }
    if let Some(y) = y {
        a.push_tensor(row(y, ArgTag::OutputExisting)?)?;
    }
    for w in windows {
        a.push_tensor(w.arg(ArgTag::InOut))?;
    }
    for w in windows {
        w.push_to(&mut a)?;
    }
    for &s in extra {
        a.push_scalar_bits(s)?;
    }
    Ok(a)
}

fn rows<T: strata_types::Element>(t: &SharedTensor, n: usize) -> Result<Vec<Vec<T>>, String> {
    let v = t.to_vec::<T>().ctx("read")?;
    Ok(v.chunks(v.len() / n).map(|c| c.to_vec()).collect())
}

// -------------------------------------------------------------------------------------

/// S1, the quickstart: a user kernel stages its input into the window, allreduces it with
/// the two-rank mesh, and reads the result back.
fn quickstart_allreduce_of_two_ranks() -> Outcome {
    const N: u64 = 256;
    let mut w = DistWorker::new(l3(2)).ctx("new")?;
    let k = register(&mut w, "allreduce_user", |ctx| {
        let (data, signal) = (window_at(ctx, 0)?, window_at(ctx, 1)?);
        let comm = Comm::from_kernel(ctx)?;
        let (d, s) = (comm.window(&data)?, comm.window(&signal)?);
        let input = ctx.input::<f32>(0)?.to_vec();
        d.write(d.rank(), 0, &input)?;
        d.allreduce(&s, ReduceOp::Sum, AllreduceAlgo::Mesh)?;
        let mut out = vec![0f32; input.len()];
        d.read(d.rank(), 0, &mut out)?;
        ctx.output::<f32>(1)?
            .as_mut_slice()
            .ok_or_else(|| KernelError::new("contiguous output"))?
            .copy_from_slice(&out);
        Ok(())
    })?;
    let xs: Vec<f32> = (0..2 * N)
        .map(|i| {
            if i < N {
                (i + 1) as f32
            } else {
                10.0 * (i - N + 1) as f32
            }
        })
        .collect();
    let x = w.shared_tensor_from(&[2, N], &xs).ctx("x")?;
    let y = w.shared_tensor(&[2, N], DataType::F32).ctx("y")?;
    let (xa, ya) = (x.clone(), y.clone());
    let orch = w.register_orchestration("quickstart", move |o, _| {
        let cells = strata_comm::signal_cells(2, AllreduceAlgo::Mesh);
        let buf = o.alloc_window_buffer(4 * N + 4 * cells)?;
        let data = o.window(&buf, 0, &[1, N], DataType::F32)?;
        let signal = o.window(&buf, 4 * N, &[cells], DataType::I32)?;
        let args = (0..2)
            .map(|r| rank_args(r, Some(&xa), Some(&ya), &[&data, &signal], &[]))
            .collect::<Result<Vec<_>, _>>()?;
        o.submit_next_level_group(k, &args, &[0, 1])?;
        Ok(())
    });
    w.init().ctx("init")?;
    for round in 0..3 {
        y.write(&vec![f32::NAN; 2 * N as usize]).ctx("poison")?;
        w.run(&orch, &TaskArgs::new()).ctx("run")?;
        let golden: Vec<f32> = (0..N).map(|i| 11.0 * (i + 1) as f32).collect();
        for (r, got) in rows::<f32>(&y, 2)?.iter().enumerate() {
            check!(got == &golden, "round {round} rank {r}: {:?}…", &got[..4]);
        }
    }
    w.close().ctx("close")?;
    Ok(())
}

/// S4: rank r adds r+1 into its peer's cell and waits for its own → [[2], [1]].
fn notify_wait_handshake() -> Outcome {
    let mut w = DistWorker::new(l3(2)).ctx("new")?;
    let k = register(&mut w, "handshake", |ctx| {
        let sig = window_at(ctx, 0)?;
        let comm = Comm::from_kernel(ctx)?;
        let s = comm.window(&sig)?;
        let r = s.rank();
        s.notify((r + 1) % 2, &[0, 0], r as i32 + 1, NotifyOp::AtomicAdd)?;
        let seen = s.wait(&[0, 0], 1, WaitCmp::Ge)?;
        ctx.output::<i32>(1)?.fill(seen);
        Ok(())
    })?;
    let dummy = w.shared_tensor(&[2, 1], DataType::I32).ctx("x")?;
    let y = w.shared_tensor(&[2, 1], DataType::I32).ctx("y")?;
    let (da, ya) = (dummy.clone(), y.clone());
    let orch = w.register_orchestration("handshake", move |o, _| {
        let buf = o.alloc_window_buffer(64)?;
        let sig = o.window(&buf, 0, &[1, 1], DataType::I32)?;
        let args = (0..2)
            .map(|r| rank_args(r, Some(&da), Some(&ya), &[&sig], &[]))
            .collect::<Result<Vec<_>, _>>()?;
        o.submit_next_level_group(k, &args, &[0, 1])?;
        Ok(())
    });
    w.init().ctx("init")?;
    w.run(&orch, &TaskArgs::new()).ctx("run")?;
    check!(
        y.to_vec::<i32>().ctx("y")? == vec![2, 1],
        "{:?}",
        y.to_vec::<i32>()
    );
    w.close().ctx("close")?;
    Ok(())
}

/// One group of `kernel` over chips `workers`, each rank given its row of `x` and `y`
/// and the windows `make` allocates (as dependencies and scalars), plus `extra` scalars.
type MakeWindows =
    dyn Fn(&mut Orch<'_>) -> Result<Vec<WindowTensor>, DistError> + Send + Sync + 'static;

fn group_orch(
    w: &mut DistWorker,
    name: &str,
    kernel: OrchHandle,
    workers: Vec<usize>,
    (x, y): (&SharedTensor, &SharedTensor),
    make: Box<MakeWindows>,
    extra: Vec<u64>,
) -> HostOrchHandle {
    let (xa, ya) = (x.clone(), y.clone());
    w.register_orchestration(name, move |o, _| {
        let windows = make(o)?;
        let refs: Vec<&WindowTensor> = windows.iter().collect();
        let args = (0..workers.len() as u64)
            .map(|r| rank_args(r, Some(&xa), Some(&ya), &refs, &extra))
            .collect::<Result<Vec<_>, _>>()?;
        o.submit_next_level_group(kernel, &args, &workers)?;
        Ok(())
    })
}

/// S6: a hand-rolled barrier's tally — rank r's own signal has 1 in every row but r.
/// S10: each rank adds 1 four times into its peer's cell, waits for 4, then subtracts 4
/// from its own copy (a self-notify): 0 everywhere.
fn barrier_tally_and_self_notify_reset() -> Outcome {
    for p in [2usize, 4] {
        let mut w = DistWorker::new(l3(p)).ctx("new")?;
        let tally = register(&mut w, "tally", |ctx| {
            let s_t = window_at(ctx, 0)?;
            let comm = Comm::from_kernel(ctx)?;
            let s = comm.window(&s_t)?;
            let (r, n) = (s.rank(), s.nranks());
            for peer in (0..n).filter(|&q| q != r) {
                s.notify(peer, &[r as u64], 1, NotifyOp::AtomicAdd)?;
            }
            for peer in (0..n).filter(|&q| q != r) {
                s.wait(&[peer as u64], 1, WaitCmp::Ge)?;
            }
            let own = (0..n as u64)
                .map(|i| s.load_signal(&[i]))
                .collect::<Result<Vec<i32>, _>>()?;
            ctx.output::<i32>(1)?
                .as_mut_slice()
                .ok_or_else(|| KernelError::new("contiguous"))?
                .copy_from_slice(&own);
            Ok(())
        })?;
        let reset = register(&mut w, "reset", |ctx| {
            let s_t = window_at(ctx, 0)?;
            let comm = Comm::from_kernel(ctx)?;
            let s = comm.window(&s_t)?;
            let (r, n) = (s.rank(), s.nranks());
            for _ in 0..4 {
                s.notify((r + 1) % n, &[0], 1, NotifyOp::AtomicAdd)?;
            }
            s.wait(&[0], 4, WaitCmp::Ge)?;
            s.notify(r, &[0], -4, NotifyOp::AtomicAdd)?;
            let v = s.load_signal(&[0])?;
            ctx.output::<i32>(1)?.fill(v);
            Ok(())
        })?;
        let pn = p as u64;
        let x = w.shared_tensor(&[pn, pn], DataType::I32).ctx("x")?;
        let y = w.shared_tensor(&[pn, pn], DataType::I32).ctx("y")?;
        let z = w.shared_tensor_from(&[pn, 1], &vec![7i32; p]).ctx("z")?;
        let workers: Vec<usize> = (0..p).collect();
        let t = group_orch(
            &mut w,
            "tally",
            tally,
            workers.clone(),
            (&x, &y),
            Box::new(move |o| {
                let buf = o.alloc_window_buffer(4 * pn)?;
                Ok(vec![o.window(&buf, 0, &[pn], DataType::I32)?])
            }),
            vec![],
        );
        let zr = z.clone();
        let r = group_orch(
            &mut w,
            "reset",
            reset,
            workers,
            (&zr, &z),
            Box::new(|o| {
                let buf = o.alloc_window_buffer(64)?;
                Ok(vec![o.window(&buf, 0, &[1], DataType::I32)?])
            }),
            vec![],
        );
        w.init().ctx("init")?;
        w.run(&t, &TaskArgs::new()).ctx("tally run")?;
        for (r, got) in rows::<i32>(&y, p)?.iter().enumerate() {
            let want: Vec<i32> = (0..p).map(|i| i32::from(i != r)).collect();
            check!(got == &want, "P={p} tally rank {r}: {got:?}");
        }
        w.run(&r, &TaskArgs::new()).ctx("reset run")?;
        check!(
            z.to_vec::<i32>().ctx("z")? == vec![0; p],
            "P={p} reset: {:?}",
            z.to_vec::<i32>()
        );
        w.close().ctx("close")?;
    }
    Ok(())
}

/// S8: push (put, or remote store of a tile) gives y[r] = x[(r−1) mod P], pull (get, or
/// remote load of a tile) y[r] = x[(r+1) mod P], at P = 2, 3, 4 — domains over the first
/// P chips of one four-chip worker. The tile variants move a [2, N/2] tile.
fn put_and_get_shift_data_around_the_ring() -> Outcome {
    const N: u64 = 48;
    let mut w = DistWorker::new(l3(4)).ctx("new")?;
    let k = register(&mut w, "shift", |ctx| {
        let (d_t, s_t) = (window_at(ctx, 0)?, window_at(ctx, 1)?);
        let mode = ctx.scalar::<u64>(8)?;
        let comm = Comm::from_kernel(ctx)?;
        let (d, s) = (comm.window(&d_t)?, comm.window(&s_t)?);
        let (r, n) = (d.rank(), d.nranks());
        let x = ctx.input::<f32>(0)?.to_vec();
        let mut y = vec![0f32; x.len()];
        let tile = [2, x.len() as u64 / 2];
        match mode {
            0 => {
                d.write((r + 1) % n, 0, &x)?;
                s.barrier()?;
                d.read(r, 0, &mut y)?;
            }
            1 => {
                d.write(r, 0, &x)?;
                s.barrier()?;
                d.read((r + 1) % n, 0, &mut y)?;
            }
            2 => {
                d.store_tile((r + 1) % n, &[0, 0], &tile, &x, StoreOp::Overwrite)?;
                s.barrier()?;
                d.load_tile(r, &[0, 0], &tile, &mut y)?;
            }
            _ => {
                d.store_tile(r, &[0, 0], &tile, &x, StoreOp::Overwrite)?;
                s.barrier()?;
                d.load_tile((r + 1) % n, &[0, 0], &tile, &mut y)?;
            }
        }
        ctx.output::<f32>(1)?
            .as_mut_slice()
            .ok_or_else(|| KernelError::new("contiguous"))?
            .copy_from_slice(&y);
        Ok(())
    })?;
    let mut cases = Vec::new();
    for p in [2u64, 3, 4] {
        let xs: Vec<f32> = (0..p * N).map(|i| i as f32 * 0.5 + 1.0).collect();
        let x = w.shared_tensor_from(&[p, N], &xs).ctx("x")?;
        let y = w.shared_tensor(&[p, N], DataType::F32).ctx("y")?;
        for mode in 0..4u64 {
            let o = group_orch(
                &mut w,
                &format!("shift{p}_{mode}"),
                k,
                (0..p as usize).collect(),
                (&x, &y),
                Box::new(move |o| {
                    let members: Vec<usize> = (0..p as usize).collect();
                    let d = o.comm_domain(&members)?;
                    let cells = strata_comm::collective_signal_cells(p as u32);
                    let buf = o.alloc_window_buffer_in(&d, 4 * N + 4 * cells)?;
                    Ok(vec![
                        o.window(&buf, 0, &[2, N / 2], DataType::F32)?,
                        o.window(&buf, 4 * N, &[cells], DataType::I32)?,
                    ])
                }),
                vec![mode],
            );
            cases.push((p, mode, o, x.clone(), y.clone()));
        }
    }
    w.init().ctx("init")?;
    for (p, mode, o, x, y) in &cases {
        let push = mode % 2 == 0;
        w.run(o, &TaskArgs::new()).ctx("run")?;
        let xr = rows::<f32>(x, *p as usize)?;
        for (r, got) in rows::<f32>(y, *p as usize)?.iter().enumerate() {
            let src = if push {
                (r + *p as usize - 1) % *p as usize
            } else {
                (r + 1) % *p as usize
            };
            check!(
                got == &xr[src],
                "P={p} mode {mode} rank {r}: got row of {:?}",
                got.first()
            );
        }
    }
    w.close().ctx("close")?;
    Ok(())
}

/// S9: y[r] = x[r] + r through a window round trip, on a domain over world ranks {1, 2}
/// of 4 (domain ranks 0 and 1) and on the whole world.
fn rank_identity_on_the_world_and_on_a_sub_domain() -> Outcome {
    const N: u64 = 16;
    let mut w = DistWorker::new(l3(4)).ctx("new")?;
    let k = register(&mut w, "identity", |ctx| {
        let d_t = window_at(ctx, 0)?;
        let comm = Comm::from_kernel(ctx)?;
        let d = comm.window(&d_t)?;
        let x = ctx.input::<f32>(0)?.to_vec();
        d.write(d.rank(), 0, &x)?;
        let mut y = vec![0f32; x.len()];
        d.read(d.rank(), 0, &mut y)?;
        let world = comm.world_rank();
        if d.world_rank_of(d.rank())? != world {
            return Err("domain rank does not map to this chip".into());
        }
        let out = ctx.output::<f32>(1)?;
        let mut out = out;
        let o = out
            .as_mut_slice()
            .ok_or_else(|| KernelError::new("contiguous"))?;
        for (o, v) in o.iter_mut().zip(&y) {
            *o = v + d.rank() as f32 + 100.0 * world as f32;
        }
        Ok(())
    })?;
    let xs: Vec<f32> = (0..4 * N).map(|i| i as f32).collect();
    let x = w.shared_tensor_from(&[4, N], &xs).ctx("x")?;
    let y_world = w.shared_tensor(&[4, N], DataType::F32).ctx("y")?;
    let y_pair = w.shared_tensor(&[2, N], DataType::F32).ctx("y2")?;
    let x_pair = w
        .shared_tensor_from(&[2, N], &xs[N as usize..3 * N as usize])
        .ctx("x2")?;
    let world = group_orch(
        &mut w,
        "world",
        k,
        vec![0, 1, 2, 3],
        (&x, &y_world),
        Box::new(|o| {
            let buf = o.alloc_window_buffer(4 * N)?;
            Ok(vec![o.window(&buf, 0, &[N], DataType::F32)?])
        }),
        vec![],
    );
    let pair = group_orch(
        &mut w,
        "pair",
        k,
        vec![1, 2],
        (&x_pair, &y_pair),
        Box::new(|o| {
            let d = o.comm_domain(&[1, 2])?;
            let buf = o.alloc_window_buffer_in(&d, 4 * N)?;
            Ok(vec![o.window(&buf, 0, &[N], DataType::F32)?])
        }),
        vec![],
    );
    w.init().ctx("init")?;
    w.run(&world, &TaskArgs::new()).ctx("world")?;
    w.run(&pair, &TaskArgs::new()).ctx("pair")?;
    let xr = rows::<f32>(&x, 4)?;
    for (r, got) in rows::<f32>(&y_world, 4)?.iter().enumerate() {
        let want: Vec<f32> = xr[r].iter().map(|v| v + 101.0 * r as f32).collect();
        check!(got == &want, "world rank {r}");
    }
    for (d, got) in rows::<f32>(&y_pair, 2)?.iter().enumerate() {
        let world = d + 1;
        let want: Vec<f32> = xr[world]
            .iter()
            .map(|v| v + d as f32 + 100.0 * world as f32)
            .collect();
        check!(got == &want, "domain rank {d} (world {world})");
    }
    w.close().ctx("close")?;
    Ok(())
}

fn reduce(op: ReduceOp, vals: impl Iterator<Item = f32>) -> f32 {
    vals.reduce(|a, b| match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Max => a.max(b),
        ReduceOp::Min => a.min(b),
        ReduceOp::Prod => a * b,
    })
    .unwrap_or(0.0)
}

/// Every host-level collective at 2 and 4 ranks against host goldens: allreduce with every
/// op and algorithm, broadcast, allgather, reduce-scatter, all-to-all, all staged in and
/// out by builtin tasks; the builtin barrier's signal buffer reused by every call.
fn host_level_collectives_match_host_goldens() -> Outcome {
    const M: u64 = 32; // elements per rank (divisible by every P)
    for p in [2u64, 4] {
        let pu = p as usize;
        let mut w = DistWorker::new(l3(pu)).ctx("new")?;
        let xs: Vec<f32> = (0..p * M)
            .map(|i| ((i * 7) % 23) as f32 * 0.5 + 1.0)
            .collect();
        let x = w.shared_tensor_from(&[p, M], &xs).ctx("x")?;
        let ys: Vec<SharedTensor> = (0..8)
            .map(|_| w.shared_tensor(&[p, M], DataType::F32))
            .collect::<Result<_, _>>()
            .ctx("y")?;
        let gathered = w
            .shared_tensor(&[p, p * M], DataType::F32)
            .ctx("gathered")?;
        let ops = ReduceOp::ALL;
        let (xa, ya, ga) = (x.clone(), ys.clone(), gathered.clone());
        let orch = w.register_orchestration("collectives", move |o, a| {
            let algo = AllreduceAlgo::from_code(a.scalar_at::<u64>(0).ok_or("algo")?)
                .ok_or("algo code")?;
            let row = |t: &SharedTensor, r: u64| -> Result<TensorArg, DistError> {
                Ok(t.arg_view(t.view().slice(0, r, r + 1)?, ArgTag::Input)?)
            };
            let cells = strata_comm::signal_cells(p as u32, AllreduceAlgo::Ring)
                .max(strata_comm::collective_signal_cells(p as u32));
            let sbuf = o.alloc_window_buffer(4 * cells)?;
            let signal = o.window(&sbuf, 0, &[cells], DataType::I32)?;
            // Allreduce with each op (ys[0..4]).
            for (i, op) in ops.into_iter().enumerate() {
                let buf = o.alloc_window_buffer(4 * M)?;
                let d = o.window(&buf, 0, &[M], DataType::F32)?;
                for r in 0..p {
                    o.copy_to_window(row(&xa, r)?, &d, r as u32)?;
                }
                o.allreduce(&d, &signal, op, algo)?;
                for r in 0..p {
                    o.copy_from_window(&d, r as u32, row(&ya[i], r)?)?;
                }
            }
            // Broadcast from the last rank (ys[4]).
            let buf = o.alloc_window_buffer(4 * M)?;
            let d = o.window(&buf, 0, &[M], DataType::F32)?;
            for r in 0..p {
                o.copy_to_window(row(&xa, r)?, &d, r as u32)?;
            }
            o.broadcast(&d, &signal, (p - 1) as u32)?;
            for r in 0..p {
                o.copy_from_window(&d, r as u32, row(&ya[4], r)?)?;
            }
            // Reduce-scatter (ys[5]): rank r ends with chunk r reduced, in place.
            let buf = o.alloc_window_buffer(4 * M)?;
            let d = o.window(&buf, 0, &[p, M / p], DataType::F32)?;
            for r in 0..p {
                o.copy_to_window(row(&xa, r)?, &d, r as u32)?;
            }
            o.reduce_scatter(&d, &signal, ReduceOp::Sum)?;
            for r in 0..p {
                o.copy_from_window(&d, r as u32, row(&ya[5], r)?)?;
            }
            // Allgather (gathered) and all-to-all (ys[6]).
            let sb = o.alloc_window_buffer(4 * M)?;
            let stage = o.window(&sb, 0, &[M], DataType::F32)?;
            let tb = o.alloc_window_buffer(4 * p * M)?;
            let target = o.window(&tb, 0, &[p, M], DataType::F32)?;
            for r in 0..p {
                o.copy_to_window(row(&xa, r)?, &stage, r as u32)?;
            }
            o.allgather(&stage, &target, &signal)?;
            for r in 0..p {
                o.copy_from_window(&target, r as u32, row(&ga, r)?)?;
            }
            let sb2 = o.alloc_window_buffer(4 * M)?;
            let stage2 = o.window(&sb2, 0, &[p, M / p], DataType::F32)?;
            let tb2 = o.alloc_window_buffer(4 * M)?;
            let target2 = o.window(&tb2, 0, &[p, M / p], DataType::F32)?;
            for r in 0..p {
                o.copy_to_window(row(&xa, r)?, &stage2, r as u32)?;
            }
            o.all_to_all(&stage2, &target2, &signal)?;
            for r in 0..p {
                o.copy_from_window(&target2, r as u32, row(&ya[6], r)?)?;
            }
            // The builtin barrier on the same signal buffer, twice.
            o.barrier(&signal)?;
            o.barrier(&signal)?;
            Ok(())
        });
        w.init().ctx("init")?;
        let xr = rows::<f32>(&x, pu)?;
        for algo in [
            AllreduceAlgo::Mesh,
            AllreduceAlgo::TwoPhase,
            AllreduceAlgo::Ring,
            AllreduceAlgo::Auto,
        ] {
            let mut a = TaskArgs::new();
            a.push_scalar_bits(algo.code()).ctx("scalar")?;
            w.run(&orch, &a)
                .map_err(|e| format!("P={p} {algo:?}: {e}"))?;
            for (i, op) in ops.into_iter().enumerate() {
                let want: Vec<f32> = (0..M as usize)
                    .map(|j| reduce(op, xr.iter().map(|r| r[j])))
                    .collect();
                for (r, got) in rows::<f32>(&ys[i], pu)?.iter().enumerate() {
                    let ok = got
                        .iter()
                        .zip(&want)
                        .all(|(g, w)| (g - w).abs() <= 1e-3 * w.abs().max(1.0));
                    check!(
                        ok,
                        "P={p} {algo:?} {op:?} rank {r}: {:?} vs {:?}",
                        &got[..4],
                        &want[..4]
                    );
                }
            }
            for (r, got) in rows::<f32>(&ys[4], pu)?.iter().enumerate() {
                check!(got == &xr[pu - 1], "P={p} broadcast rank {r}");
            }
            let chunk = (M / p) as usize;
            for (r, got) in rows::<f32>(&ys[5], pu)?.iter().enumerate() {
                let want: Vec<f32> = (0..chunk)
                    .map(|j| xr.iter().map(|x| x[r * chunk + j]).sum())
                    .collect();
                check!(
                    got[r * chunk..(r + 1) * chunk] == want[..],
                    "P={p} reduce-scatter rank {r}"
                );
            }
            let all: Vec<f32> = xr.concat();
            for (r, got) in rows::<f32>(&gathered, pu)?.iter().enumerate() {
                check!(got == &all, "P={p} allgather rank {r}");
            }
            for (r, got) in rows::<f32>(&ys[6], pu)?.iter().enumerate() {
                let want: Vec<f32> = (0..pu)
                    .flat_map(|src| xr[src][r * chunk..(r + 1) * chunk].to_vec())
                    .collect();
                check!(got == &want, "P={p} all-to-all rank {r}");
            }
        }
        w.close().ctx("close")?;
    }
    Ok(())
}

/// A wait nobody satisfies ends with an error naming the rank, the cell and the value seen.
fn a_wait_nobody_satisfies_ends_at_the_deadline() -> Outcome {
    let mut cfg = l3(2);
    cfg.comm_wait_timeout = Duration::from_millis(300);
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let k = register(&mut w, "lonely", |ctx| {
        let s_t = window_at(ctx, 0)?;
        let s = Comm::from_kernel(ctx)?.window(&s_t)?;
        // Only rank 0 waits (rank 1 never notifies): the error is rank 0's.
        if s.rank() == 0 {
            s.wait(&[3], 1, WaitCmp::Eq)?;
        }
        Ok(())
    })?;
    let x = w.shared_tensor(&[2, 1], DataType::I32).ctx("x")?;
    let o = group_orch(
        &mut w,
        "lonely",
        k,
        vec![0, 1],
        (&x, &x.clone()),
        Box::new(|o| {
            let buf = o.alloc_window_buffer(64)?;
            Ok(vec![o.window(&buf, 0, &[8], DataType::I32)?])
        }),
        vec![],
    );
    w.init().ctx("init")?;
    let t0 = Instant::now();
    let e = w
        .run(&o, &TaskArgs::new())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    println!("    the wait gave up after {:.2?}: {e}", t0.elapsed());
    check!(
        e.contains("world rank 0") && e.contains("[3]") && e.contains("saw 0"),
        "the error names the rank, the cell and the value seen: {e}"
    );
    check!(
        w.unusable_reason().is_none(),
        "a failed wait does not break the worker"
    );
    w.close().ctx("close")?;
    Ok(())
}

/// A rank killed in the middle of a collective fails the run naming it; the other rank's
/// wait ends at its deadline; nothing hangs or leaks.
fn a_rank_killed_mid_collective_fails_the_run() -> Outcome {
    let mut cfg = l3(2);
    cfg.comm_wait_timeout = Duration::from_secs(2);
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let flag = w.shared_tensor(&[1], DataType::U64).ctx("flag")?;
    let fl = flag.clone();
    let k = register(&mut w, "victim", move |ctx| {
        let (d_t, s_t) = (window_at(ctx, 0)?, window_at(ctx, 1)?);
        let comm = Comm::from_kernel(ctx)?;
        let (d, s) = (comm.window(&d_t)?, comm.window(&s_t)?);
        if d.rank() == 1 {
            fl.write(&[1u64])
                .map_err(|e| KernelError::new(e.to_string()))?;
            std::thread::sleep(Duration::from_secs(60));
        }
        d.allreduce(&s, ReduceOp::Sum, AllreduceAlgo::Mesh)?;
        Ok(())
    })?;
    let x = w.shared_tensor(&[2, 4], DataType::F32).ctx("x")?;
    let o = group_orch(
        &mut w,
        "victim",
        k,
        vec![0, 1],
        (&x, &x.clone()),
        Box::new(|o| {
            let cells = strata_comm::signal_cells(2, AllreduceAlgo::Mesh);
            let buf = o.alloc_window_buffer(64 + 4 * cells)?;
            Ok(vec![
                o.window(&buf, 0, &[4], DataType::F32)?,
                o.window(&buf, 64, &[cells], DataType::I32)?,
            ])
        }),
        vec![],
    );
    w.init().ctx("init")?;
    let victim = w.child_pids()[1];
    let h = w.submit(&o, &TaskArgs::new()).ctx("submit")?;
    wait_for("rank 1 to start", || {
        flag.to_vec::<u64>().map(|v| v[0] == 1).unwrap_or(false)
    })?;
    // SAFETY: killing a chip child this scenario started.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let t0 = Instant::now();
    let e = h.result().err().map(|e| e.to_string()).unwrap_or_default();
    println!("    run failed {:.2?} after the kill: {e}", t0.elapsed());
    check!(
        e.contains("worker 1") && e.contains("SIGKILL"),
        "the error names the killed rank: {e}"
    );
    w.close().ctx("close")?;
    Ok(())
}

/// S5: with persistent windows the handshake's buffer is allocated once over three runs,
/// zero-filled between them.
fn persistent_windows_are_allocated_once() -> Outcome {
    let cfg = l3(2).with_windows(WindowLifetime::Persistent {
        zero_between_runs: true,
    });
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let k = register(&mut w, "handshake", |ctx| {
        let sig = window_at(ctx, 0)?;
        let s = Comm::from_kernel(ctx)?.window(&sig)?;
        let r = s.rank();
        s.notify((r + 1) % 2, &[0], r as i32 + 1, NotifyOp::AtomicAdd)?;
        let seen = s.wait(&[0], 1, WaitCmp::Ge)?;
        ctx.output::<i32>(1)?.fill(seen);
        Ok(())
    })?;
    let x = w.shared_tensor(&[2, 1], DataType::I32).ctx("x")?;
    let y = w.shared_tensor(&[2, 1], DataType::I32).ctx("y")?;
    let o = group_orch(
        &mut w,
        "persistent",
        k,
        vec![0, 1],
        (&x, &y),
        Box::new(|o| {
            let buf = o.alloc_window_buffer(64)?;
            Ok(vec![o.window(&buf, 0, &[1], DataType::I32)?])
        }),
        vec![],
    );
    w.init().ctx("init")?;
    for run in 0..3 {
        y.write(&[0i32, 0]).ctx("zero")?;
        w.run(&o, &TaskArgs::new()).ctx("run")?;
        check!(
            y.to_vec::<i32>().ctx("y")? == vec![2, 1],
            "run {run}: {:?}",
            y.to_vec::<i32>()
        );
    }
    let stats = w.comm_stats().ok_or("no comm stats")?;
    check!(
        stats.buffers_allocated == 1,
        "allocated {} times",
        stats.buffers_allocated
    );
    check!(
        stats.persistent_zero_fills >= 2,
        "zero-filled {} times",
        stats.persistent_zero_fills
    );
    w.close().ctx("close")?;
    Ok(())
}

fn main() {
    become_subreaper();
    run(&[
        (
            "quickstart_allreduce_of_two_ranks",
            quickstart_allreduce_of_two_ranks,
        ),
        ("notify_wait_handshake", notify_wait_handshake),
        (
            "barrier_tally_and_self_notify_reset",
            barrier_tally_and_self_notify_reset,
        ),
        (
            "put_and_get_shift_data_around_the_ring",
            put_and_get_shift_data_around_the_ring,
        ),
        (
            "rank_identity_on_the_world_and_on_a_sub_domain",
            rank_identity_on_the_world_and_on_a_sub_domain,
        ),
        (
            "host_level_collectives_match_host_goldens",
            host_level_collectives_match_host_goldens,
        ),
        (
            "a_wait_nobody_satisfies_ends_at_the_deadline",
            a_wait_nobody_satisfies_ends_at_the_deadline,
        ),
        (
            "a_rank_killed_mid_collective_fails_the_run",
            a_rank_killed_mid_collective_fails_the_run,
        ),
        (
            "persistent_windows_are_allocated_once",
            persistent_windows_are_allocated_once,
        ),
    ]);
}
