//! The reference's communication scenarios (distributed model §7: S1, S4, S5, S6, S9)
//! written with programs: a host orchestration that allocates a window buffer and submits
//! one chip task per rank, the window an ordinary argument each rank's kernel opens with
//! `ctx.window(i)`.

use super::{l3, Mode};
use strata::comm::prelude::*;
use strata::prelude::*;
use strata_testkit::{check, Ctx, Outcome};

/// S1, the quickstart: rank 0 holds `[1, 2, 3, ...]`, rank 1 `[10, 20, 30, ...]` (256
/// elements, the docs' size); after the allreduce both output rows are `[11, 22, 33, ...]`.
pub fn s1_quickstart_allreduce_gives_the_sum_on_every_rank<M: Mode>() -> Outcome {
    const N: u64 = 256;
    let mut p = Program::new(
        "s1",
        Signature::new()
            .input("x", DataType::F32, [Dim::World, Dim::Fixed(N)])
            .output("y", DataType::F32, [Dim::World, Dim::Fixed(N)]),
    );
    let allreduce = p.kernel("allreduce", |ctx| {
        let data = ctx.window(2)?;
        data.write(data.rank(), 0, &ctx.input::<f32>(0)?.to_vec())?;
        data.allreduce(ReduceOp::Sum, AllreduceAlgo::Auto)?;
        let mut out = ctx.output::<f32>(1)?;
        data.read(data.rank(), 0, out.as_mut_slice().ok_or("contiguous")?)?;
        Ok(())
    });
    let chip = p.chip_orchestration("allreduce", move |o, a| {
        o.submit_aiv(
            allreduce,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .output(&a.tensor(1)?)
                .inout(&a.tensor(2)?),
        )?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let (x, y) = (args.tensor("x")?, args.tensor("y")?);
        let buf = o.alloc_window_buffer(4 * N)?;
        let data = o.window(&buf, 0, &[1, N], DataType::F32)?;
        for r in 0..o.world_size() {
            let a = TaskArgs::new()
                .input(x.row(r))
                .output_existing(y.row(r))
                .inout(&data);
            o.submit_next_level(chip, &a, r)?;
        }
        Ok(())
    });
    let compiled = p.compile(&l3::<M>(2)).ctx("compile")?;
    let xs: Vec<f32> = (1..=N)
        .map(|i| i as f32)
        .chain((1..=N).map(|i| 10.0 * i as f32))
        .collect();
    let x = SharedTensor::from_data(&[2, N], &xs).ctx("x")?;
    let y = SharedTensor::zeroed(&[2, N], DataType::F32).ctx("y")?;
    compiled.run_once((&x, &y)).ctx("run_once")?;
    let got = y.to_vec::<f32>().ctx("y")?;
    check!(
        got[..3] == [11.0, 22.0, 33.0] && got[N as usize..N as usize + 3] == [11.0, 22.0, 33.0],
        "both ranks start with [11, 22, 33]: {:?} / {:?}",
        &got[..3],
        &got[N as usize..N as usize + 3]
    );
    let sum: Vec<f32> = (1..=N).map(|i| 11.0 * i as f32).collect();
    for (r, row) in got.chunks(N as usize).enumerate() {
        check!(row == sum.as_slice(), "rank {r}: out[r] = x[0] + x[1]");
    }
    Ok(())
}

/// The S4 handshake: rank `r` adds `r + 1` into its peer's `[1, 1]` i32 cell, waits for its
/// own cell to reach 1 and writes what it reads: `y = [[[2]], [[1]]]`.
fn handshake_program() -> Program {
    let mut p = Program::new(
        "handshake",
        Signature::new().output(
            "y",
            DataType::I32,
            [Dim::World, Dim::Fixed(1), Dim::Fixed(1)],
        ),
    );
    let k = p.kernel("handshake", |ctx| {
        let s = ctx.window(0)?;
        let r = s.rank();
        s.notify((r + 1) % 2, &[0, 0], r as i32 + 1, NotifyOp::AtomicAdd)?;
        s.wait(&[0, 0], 1, WaitCmp::Ge)?;
        let mut cell = [0i32];
        s.read(r, 0, &mut cell)?;
        ctx.output::<i32>(1)?.fill(cell[0]);
        Ok(())
    });
    let chip = p.chip_orchestration("handshake", move |o, a| {
        o.submit_aiv(
            k,
            CoreArgs::new().inout(&a.tensor(0)?).output(&a.tensor(1)?),
        )?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let y = args.tensor("y")?;
        let buf = o.alloc_window_buffer(64)?;
        let cell = o.window(&buf, 0, &[1, 1], DataType::I32)?;
        for r in 0..o.world_size() {
            let a = TaskArgs::new().inout(&cell).output_existing(y.row(r));
            o.submit_next_level(chip, &a, r)?;
        }
        Ok(())
    });
    p
}

/// S4: the notify/wait handshake gives `[[[2]], [[1]]]`.
pub fn s4_notify_wait_handshake<M: Mode>() -> Outcome {
    let compiled = handshake_program().compile(&l3::<M>(2)).ctx("compile")?;
    let y = SharedTensor::zeroed(&[2, 1, 1], DataType::I32).ctx("y")?;
    compiled.run_once((&y,)).ctx("run_once")?;
    let got = y.to_vec::<i32>().ctx("y")?;
    check!(got == vec![2, 1], "[[[2]], [[1]]], got {got:?}");
    Ok(())
}

/// S5: the S4 program prepared with persistent windows, dispatched three times: every
/// dispatch gives `[[[2]], [[1]]]` (the cells are zeroed between dispatches) and the window
/// buffer is allocated once. Without persistence every dispatch allocates (and frees) its
/// own; persistent without the reset issues no zero-fill.
pub fn s5_persistent_windows_are_allocated_once_and_reset<M: Mode>() -> Outcome {
    let compiled = handshake_program().compile(&l3::<M>(2)).ctx("compile")?;
    let y = SharedTensor::zeroed(&[2, 1, 1], DataType::I32).ctx("y")?;

    let rt = compiled
        .prepare(Prepare::new().persistent_windows(true))
        .ctx("prepare persistent")?;
    for dispatch in 0..3 {
        y.write(&[0i32, 0]).ctx("zero y")?;
        rt.call((&y,)).ctx("call")?;
        let got = y.to_vec::<i32>().ctx("y")?;
        check!(got == vec![2, 1], "dispatch {dispatch}: {got:?}");
    }
    let stats = rt.comm_stats().ctx("stats")?.ok_or("no window allocator")?;
    check!(
        (
            stats.domains_created,
            stats.buffers_allocated,
            stats.buffers_freed
        ) == (1, 1, 0),
        "persistent: one domain and one buffer, kept: {stats:?}"
    );
    check!(
        stats.persistent_zero_fills >= 2,
        "the cells were reset between the three dispatches: {stats:?}"
    );
    rt.close().ctx("close persistent")?;

    let rt = compiled
        .prepare(Prepare::new())
        .ctx("prepare per dispatch")?;
    for _ in 0..3 {
        rt.call((&y,)).ctx("call")?;
        let got = y.to_vec::<i32>().ctx("y")?;
        check!(got == vec![2, 1], "per-dispatch windows: {got:?}");
    }
    let stats = rt.comm_stats().ctx("stats")?.ok_or("no window allocator")?;
    check!(
        (
            stats.buffers_allocated,
            stats.buffers_freed,
            stats.persistent_zero_fills
        ) == (3, 2, 0),
        "per-dispatch windows: a buffer per dispatch, each freed when the next dispatch \
         claims the windows (the last one at close): {stats:?}"
    );
    rt.close().ctx("close per dispatch")?;

    let rt = compiled
        .prepare(Prepare::new().persistent_windows(false))
        .ctx("prepare persistent, no reset")?;
    for _ in 0..2 {
        // The second dispatch starts from the first one's cells: protocol-dependent values,
        // so only the absence of a reset is asserted, as the reference does.
        rt.call((&y,)).ctx("call")?;
    }
    let stats = rt.comm_stats().ctx("stats")?.ok_or("no window allocator")?;
    check!(
        (stats.buffers_allocated, stats.persistent_zero_fills) == (1, 0),
        "persistent without reset: one buffer, no zero-fill: {stats:?}"
    );
    rt.close().ctx("close persistent, no reset")
}

/// S6: a hand-rolled barrier's tally on an `[NR, 1]` i32 window: rank `r` adds 1 into row
/// `r` of every peer's copy, waits for every peer's row in its own, and outputs its own
/// column — `y[r][i] = 0 if i == r else 1`, `[[[0], [1]], [[1], [0]]]` at P = 2 (and the
/// same rule at P = 4).
pub fn s6_barrier_tally<M: Mode>() -> Outcome {
    for p in [2u64, 4] {
        let mut prog = Program::new(
            "tally",
            Signature::new().output("y", DataType::I32, [Dim::World, Dim::World, Dim::Fixed(1)]),
        );
        let k = prog.kernel("tally", |ctx| {
            let s = ctx.window(0)?;
            let (r, n) = (s.rank(), s.nranks());
            for peer in (0..n).filter(|&q| q != r) {
                s.notify(peer, &[r as u64, 0], 1, NotifyOp::AtomicAdd)?;
            }
            for peer in (0..n).filter(|&q| q != r) {
                s.wait(&[peer as u64, 0], 1, WaitCmp::Ge)?;
            }
            let own = (0..n as u64)
                .map(|i| s.load_signal(&[i, 0]))
                .collect::<Result<Vec<i32>, _>>()?;
            ctx.output::<i32>(1)?.copy_from_slice(&own)?;
            Ok(())
        });
        let chip = prog.chip_orchestration("tally", move |o, a| {
            o.submit_aiv(
                k,
                CoreArgs::new().inout(&a.tensor(0)?).output(&a.tensor(1)?),
            )?;
            Ok(())
        });
        prog.orchestrate(move |o, args| {
            let y = args.tensor("y")?;
            let nr = o.world_size() as u64;
            let buf = o.alloc_window_buffer(4 * nr)?;
            let sig = o.window(&buf, 0, &[nr, 1], DataType::I32)?;
            for r in 0..o.world_size() {
                let a = TaskArgs::new().inout(&sig).output_existing(y.row(r));
                o.submit_next_level(chip, &a, r)?;
            }
            Ok(())
        });
        let compiled = prog.compile(&l3::<M>(p as usize)).ctx("compile")?;
        let y = SharedTensor::zeroed(&[p, p, 1], DataType::I32).ctx("y")?;
        compiled.run_once((&y,)).ctx("run_once")?;
        let got = y.to_vec::<i32>().ctx("y")?;
        let want: Vec<i32> = (0..p)
            .flat_map(|r| (0..p).map(move |i| i32::from(i != r)))
            .collect();
        check!(got == want, "P={p}: {got:?} (shape [{p}, {p}, 1])");
        if p == 2 {
            check!(got == vec![0, 1, 1, 0], "S6: [[[0], [1]], [[1], [0]]]");
        }
    }
    Ok(())
}

/// S9 at P = 2 on 8 × 8: rank identity `y[r] = x[r] + r`, the programming model's
/// `y[r] = x[r] · (r + 1)` and a window round trip `y == x` — each kernel stages its row
/// through its own window copy. One prepared worker, the variant a dispatch-time scalar.
pub fn s9_rank_identity_scale_and_round_trip<M: Mode>() -> Outcome {
    let mut p = Program::new(
        "rank_identity",
        Signature::new()
            .input(
                "x",
                DataType::F32,
                [Dim::World, Dim::Fixed(8), Dim::Fixed(8)],
            )
            .output(
                "y",
                DataType::F32,
                [Dim::World, Dim::Fixed(8), Dim::Fixed(8)],
            )
            .scalar("which", DataType::U64),
    );
    let k = p.kernel("identity", |ctx| {
        let d = ctx.window(1)?;
        let r = d.rank();
        d.write(r, 0, &ctx.input::<f32>(0)?.to_vec())?;
        let mut v = vec![0f32; 64];
        d.read(r, 0, &mut v)?;
        let which: u64 = ctx.scalar(0)?;
        let mut y = ctx.output::<f32>(2)?;
        for (o, v) in y.as_mut_slice().ok_or("contiguous")?.iter_mut().zip(&v) {
            *o = match which {
                0 => v + r as f32,
                1 => v * (r + 1) as f32,
                _ => *v,
            };
        }
        Ok(())
    });
    let chip = p.chip_orchestration("identity", move |o, a| {
        o.submit_aiv(
            k,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .inout(&a.tensor(1)?)
                .output(&a.tensor(2)?)
                .scalar(a.scalar::<u64>(0)?),
        )?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let (x, y) = (args.tensor("x")?, args.tensor("y")?);
        let which = args.scalar::<u64>("which")?;
        let buf = o.alloc_window_buffer(4 * 64)?;
        let win = o.window(&buf, 0, &[8, 8], DataType::F32)?;
        for r in 0..o.world_size() {
            let a = TaskArgs::new()
                .input(x.row(r))
                .inout(&win)
                .output_existing(y.row(r))
                .scalar(which);
            o.submit_next_level(chip, &a, r)?;
        }
        Ok(())
    });
    let compiled = p.compile(&l3::<M>(2)).ctx("compile")?;
    let xs: Vec<f32> = (0..128).map(|i| i as f32 * 0.25 - 3.0).collect();
    let x = SharedTensor::from_data(&[2, 8, 8], &xs).ctx("x")?;
    let y = SharedTensor::zeroed(&[2, 8, 8], DataType::F32).ctx("y")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    for (which, name) in [(0u64, "x + r"), (1, "x * (r + 1)"), (2, "round trip")] {
        rt.call((&x, &y, which)).ctx(name)?;
        let got = y.to_vec::<f32>().ctx("y")?;
        let want: Vec<f32> = xs
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let r = (i / 64) as f32;
                match which {
                    0 => v + r,
                    1 => v * (r + 1.0),
                    _ => v,
                }
            })
            .collect();
        check!(got == want, "{name}: {:?}", &got[60..68]);
    }
    rt.close().ctx("close")
}
