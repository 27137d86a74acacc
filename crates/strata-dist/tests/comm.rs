//! Distributed memory end to end: window buffers, signals, one-sided access and
//! collectives across emulated chips — forked processes of a level-3 worker, and (where
//! marked) the same scenario with the chips as threads (`harness = false`: the binary
//! forks; every scenario runs inside strata-testkit's leak check). A window is an ordinary
//! tensor argument: the host orchestration passes the `WindowTensor`, each chip task
//! receives its own rank's copy at the same index, and the kernel opens it with
//! `ctx.window(i)`. Results are checked against host goldens.

use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, CoreArgs, KernelCtx, OrchHandle};
use strata_comm::prelude::*;
use strata_dist::*;
use strata_host::{ExecMode, SharedTensor};
use strata_testkit::*;
use strata_types::{ArgTag, CallbackResult, DataType, TaskArgs, TensorArg};

const MODES: [ExecMode; 2] = [ExecMode::Process, ExecMode::Threads];

fn l3_in(mode: ExecMode, chips: usize, subs: usize) -> DistConfig {
    let mut c = DistConfig::l3(vec![ChipConfig::default(); chips], subs).with_exec_mode(mode);
    c.comm_arena_bytes = 16 << 20;
    c
}

fn l3(chips: usize) -> DistConfig {
    l3_in(ExecMode::Process, chips, 0)
}

/// The tags of the usual kernel: input row, window, output row.
const IN_WIN_OUT: &[ArgTag] = &[ArgTag::Input, ArgTag::InOut, ArgTag::OutputExisting];

/// Registers `kernel` under `name` with a chip orchestration that hands it the task's
/// tensors (tensor `i` tagged `tags[i]`) and every scalar.
fn register(
    w: &mut DistWorker,
    name: &str,
    tags: &'static [ArgTag],
    kernel: impl Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static,
) -> Result<OrchHandle, String> {
    let k = w.register_kernel(name, kernel).ctx("kernel")?;
    w.register_chip_orchestration(name, move |o, a| {
        let mut core = CoreArgs::new();
        for (i, tag) in tags.iter().enumerate().take(a.tensor_count()) {
            core.tensor(&a.tensor(i)?, *tag);
        }
        for i in 0..a.scalar_count() {
            core.scalar_bits(a.scalar::<u64>(i)?);
        }
        o.submit_aiv(k, &core)?;
        Ok(())
    })
    .ctx("chip orchestration")
}

fn rows<T: strata_types::Element>(t: &SharedTensor, n: usize) -> Result<Vec<Vec<T>>, String> {
    let v = t.to_vec::<T>().ctx("read")?;
    Ok(v.chunks(v.len() / n).map(|c| c.to_vec()).collect())
}

fn row(t: &SharedTensor, r: u64) -> Result<TensorArg, DistError> {
    Ok(t.arg_view(t.view().slice(0, r, r + 1)?, ArgTag::Input)?)
}

// -------------------------------------------------------------------------------------

/// S1, the quickstart as the reference writes it: a per-rank loop of single tasks, each
/// given its input row, its output row and the data window as ordinary arguments. Each
/// kernel stages its row into its copy, allreduces, and reads the result back. The two
/// tasks name the same window: were they ordered against each other, the first would wait
/// in the collective for the second forever (the deadline would fail the run).
fn s1_quickstart_per_rank_singles_allreduce() -> Outcome {
    const N: u64 = 256;
    for mode in MODES {
        let mut w = DistWorker::new(l3_in(mode, 2, 0)).ctx("new")?;
        let k = register(&mut w, "allreduce_user", IN_WIN_OUT, |ctx| {
            let data = ctx.window(1)?;
            data.write(data.rank(), 0, &ctx.input::<f32>(0)?.to_vec())?;
            data.allreduce(ReduceOp::Sum, AllreduceAlgo::Auto)?;
            let mut out = ctx.output::<f32>(2)?;
            data.read(data.rank(), 0, out.as_mut_slice().ok_or("contiguous")?)?;
            Ok(())
        })?;
        let xs: Vec<f32> = (1..=N)
            .map(|i| i as f32)
            .chain((1..=N).map(|i| 10.0 * i as f32))
            .collect();
        let x = w.shared_tensor_from(&[2, N], &xs).ctx("x")?;
        let y = w.shared_tensor(&[2, N], DataType::F32).ctx("y")?;
        let (xa, ya) = (x.clone(), y.clone());
        let orch = w.register_orchestration("quickstart", move |o, _| {
            let buf = o.alloc_window_buffer(4 * N)?;
            let data = o.window(&buf, 0, &[1, N], DataType::F32)?;
            for r in 0..2u64 {
                let args = TaskArgs::new()
                    .input(xa.slice(0, r, r + 1))
                    .inout(&data)
                    .output_existing(ya.slice(0, r, r + 1));
                o.submit_next_level(k, &args, r as usize)?;
            }
            Ok(())
        });
        w.init().ctx("init")?;
        for round in 0..3 {
            y.write(&vec![f32::NAN; 2 * N as usize]).ctx("poison")?;
            w.run(&orch, &TaskArgs::new())
                .map_err(|e| format!("{mode:?}: {e}"))?;
            let golden: Vec<f32> = (1..=N).map(|i| 11.0 * i as f32).collect();
            for (r, got) in rows::<f32>(&y, 2)?.iter().enumerate() {
                check!(
                    got == &golden,
                    "{mode:?} round {round} rank {r}: {:?}…",
                    &got[..4]
                );
            }
        }
        w.close().ctx("close")?;
    }
    Ok(())
}

/// Kernel tensor indices are the host's argument indices: a kernel given a host tensor,
/// a window, another host tensor and a second window sees each at the index the host
/// passed it (no window drops out of the list), in both exec modes.
fn window_arguments_keep_the_hosts_indices() -> Outcome {
    const TAGS: &[ArgTag] = &[
        ArgTag::Input,
        ArgTag::InOut,
        ArgTag::OutputExisting,
        ArgTag::Input,
    ];
    for mode in MODES {
        let mut w = DistWorker::new(l3_in(mode, 2, 1)).ctx("new")?;
        let k = register(&mut w, "indices", TAGS, |ctx| {
            // 0: x row [4] f32; 1: window a [2, 2] i32; 2: y row [4] f32; 3: window b [3] f32.
            let x = ctx.input::<f32>(0)?.to_vec();
            let a = ctx.window(1)?;
            let b = ctx.window(3)?;
            if a.shape() != [2, 2] || a.dtype() != DataType::I32 {
                return Err(format!("window a: {:?} {}", a.shape(), a.dtype()).into());
            }
            if b.shape() != [3] || b.dtype() != DataType::F32 {
                return Err(format!("window b: {:?} {}", b.shape(), b.dtype()).into());
            }
            let me = a.rank();
            a.write(me, 0, &[me as i32 + 1; 4])?;
            let mut bv = [0f32; 3];
            b.read(me, 0, &mut bv)?;
            let mut y = ctx.output::<f32>(2)?;
            let y = y.as_mut_slice().ok_or("contiguous")?;
            for (i, v) in y.iter_mut().enumerate() {
                *v = x[i] + bv[i % 3] + 1000.0 * ctx.tensor_count() as f32;
            }
            Ok(())
        })?;
        let x = w
            .shared_tensor_from(&[2, 4], &[1f32, 2., 3., 4., 5., 6., 7., 8.])
            .ctx("x")?;
        let y = w.shared_tensor(&[2, 4], DataType::F32).ctx("y")?;
        let seen = w.shared_tensor(&[2, 4], DataType::I32).ctx("seen")?;
        let dump = w.register_sub("dump", |call| {
            // The window as a sub-worker sees it: [nranks, 2, 2].
            let v = call.tensor::<i32>(0)?;
            if v.shape() != [2, 2, 2] {
                return Err(format!("sub-worker view {:?}", v.shape()).into());
            }
            let all = v.to_vec();
            call.tensor_mut::<i32>(1)?.copy_from_slice(&all)?;
            Ok(())
        });
        let (xa, ya, sa) = (x.clone(), y.clone(), seen.clone());
        let orch = w.register_orchestration("indices", move |o, _| {
            let buf = o.alloc_window_buffer(64)?;
            let a = o.window(&buf, 0, &[2, 2], DataType::I32)?;
            let b = o.window(&buf, 16, &[3], DataType::F32)?;
            for r in 0..2u32 {
                o.window_write(&b, r, &[10.0 * (r + 1) as f32, 0.5, 0.25])?;
            }
            for r in 0..2u64 {
                let args = TaskArgs::new()
                    .input(xa.slice(0, r, r + 1))
                    .inout(&a)
                    .output_existing(ya.slice(0, r, r + 1))
                    .input(&b);
                o.submit_next_level(k, &args, r as usize)?;
            }
            o.submit_sub(&dump, &TaskArgs::new().input(&a).output_existing(&sa))?;
            Ok(())
        });
        w.init().ctx("init")?;
        w.run(&orch, &TaskArgs::new())
            .map_err(|e| format!("{mode:?}: {e}"))?;
        let want = vec![
            vec![4011.0f32, 4002.5, 4003.25, 4014.0],
            vec![4025.0, 4006.5, 4007.25, 4028.0],
        ];
        check!(
            rows::<f32>(&y, 2)? == want,
            "{mode:?}: {:?}",
            y.to_vec::<f32>()
        );
        check!(
            seen.to_vec::<i32>().ctx("seen")? == vec![1, 1, 1, 1, 2, 2, 2, 2],
            "{mode:?}: the sub-worker saw {:?}",
            seen.to_vec::<i32>()
        );
        w.close().ctx("close")?;
    }
    Ok(())
}

/// A window given to a task on a worker outside its domain is refused at the submit,
/// naming the worker and the domain — a single and a group member alike; a view of
/// another rank's copy is refused too. Both exec modes.
fn a_window_to_a_worker_outside_its_domain_is_refused() -> Outcome {
    for mode in MODES {
        let mut w = DistWorker::new(l3_in(mode, 3, 0)).ctx("new")?;
        let k = register(&mut w, "noop", &[ArgTag::InOut], |_| Ok(()))?;
        let orch = w.register_orchestration("outside", move |o, _| {
            let pair = o.comm_domain(&[1, 2])?;
            let buf = o.alloc_window_buffer_in(&pair, 64)?;
            let win = o.window(&buf, 0, &[4], DataType::F32)?;
            let single = o
                .submit_next_level(k, &TaskArgs::new().inout(&win), 0)
                .err()
                .ok_or("a single on worker 0 was accepted")?;
            match &single {
                DistError::WindowOutsideDomain {
                    index: 0,
                    worker: 0,
                    members,
                    member: None,
                } if members == &[1, 2] => {}
                e => return Err(format!("single: {e:?}").into()),
            }
            let msg = single.to_string();
            if !(msg.contains("worker 0") && msg.contains("[1, 2]")) {
                return Err(format!("the message names neither: {msg}").into());
            }
            let group = o
                .submit_next_level_group(
                    k,
                    &[TaskArgs::new().inout(&win), TaskArgs::new().inout(&win)],
                    &[2, 0],
                )
                .err()
                .ok_or("a group with worker 0 was accepted")?;
            if !matches!(
                group,
                DistError::WindowOutsideDomain {
                    worker: 0,
                    member: Some(1),
                    ..
                }
            ) {
                return Err(format!("group: {group:?}").into());
            }
            // Domain rank 0's copy (worker 1) on worker 2 (domain rank 1).
            let other = o
                .submit_next_level(
                    k,
                    &TaskArgs::new().tensor(win.arg_rank(0, ArgTag::InOut)?, ArgTag::InOut),
                    2,
                )
                .err()
                .ok_or("another rank's copy was accepted")?;
            if !other.to_string().contains("domain rank 0's copy") {
                return Err(format!("other copy: {other}").into());
            }
            // The members themselves are fine.
            o.submit_next_level_group(
                k,
                &[TaskArgs::new().inout(&win), TaskArgs::new().inout(&win)],
                &[2, 1],
            )?;
            Ok(())
        });
        w.init().ctx("init")?;
        w.run(&orch, &TaskArgs::new())
            .map_err(|e| format!("{mode:?}: {e}"))?;
        w.close().ctx("close")?;
    }
    Ok(())
}

/// `ctx.input` / `ctx.output` on a window argument fail the task with a message that says
/// what to use instead. Both exec modes.
fn ctx_input_on_a_window_is_refused_with_the_message() -> Outcome {
    for mode in MODES {
        let mut w = DistWorker::new(l3_in(mode, 1, 0)).ctx("new")?;
        let k = register(&mut w, "slice_of_window", &[ArgTag::Input], |ctx| {
            ctx.input::<f32>(0)?;
            Ok(())
        })?;
        let orch = w.register_orchestration("refused", move |o, _| {
            let buf = o.alloc_window_buffer(64)?;
            let win = o.window(&buf, 0, &[4], DataType::F32)?;
            o.submit_next_level(k, &TaskArgs::new().input(&win), 0)?;
            Ok(())
        });
        w.init().ctx("init")?;
        let e = w
            .run(&orch, &TaskArgs::new())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        check!(
            e.contains("argument 0 is a window")
                && e.contains("ctx.input(0) cannot lend it as a slice")
                && e.contains("ctx.window(0)")
                && e.contains("ctx.shared(0)"),
            "{mode:?}: {e}"
        );
        check!(w.unusable_reason().is_none(), "the worker stays usable");
        w.close().ctx("close")?;
    }
    Ok(())
}

/// Tasks of one rank that name windows of one buffer run one at a time in submit order,
/// whatever their tags: 20 tasks tagged INPUT each read the window's cell and write it
/// back plus one (through the window, as a kernel may) — exactly 20 at the end.
fn tasks_of_one_rank_on_one_buffer_run_in_submit_order() -> Outcome {
    let mut w = DistWorker::new(l3(2)).ctx("new")?;
    let k = register(&mut w, "bump", &[ArgTag::Input], |ctx| {
        let c = ctx.window(0)?;
        let mut v = [0i64];
        c.read(c.rank(), 0, &mut v)?;
        std::thread::yield_now();
        c.write(c.rank(), 0, &[v[0] + 1])?;
        Ok(())
    })?;
    let out = w.shared_tensor(&[2], DataType::I64).ctx("out")?;
    let oa = out.clone();
    let orch = w.register_orchestration("bump", move |o, _| {
        let buf = o.alloc_window_buffer(64)?;
        let cell = o.window(&buf, 0, &[1], DataType::I64)?;
        for _ in 0..20 {
            o.submit_next_level(k, &TaskArgs::new().input(&cell), 1)?;
        }
        o.copy_from_window(
            &cell,
            1,
            oa.arg_view(oa.view().slice(0, 1, 2)?, ArgTag::OutputExisting)?,
        )?;
        o.copy_from_window(
            &cell,
            0,
            oa.arg_view(oa.view().slice(0, 0, 1)?, ArgTag::OutputExisting)?,
        )?;
        Ok(())
    });
    w.init().ctx("init")?;
    w.run(&orch, &TaskArgs::new()).ctx("run")?;
    check!(
        out.to_vec::<i64>().ctx("out")? == vec![0, 20],
        "{:?}",
        out.to_vec::<i64>()
    );
    w.close().ctx("close")?;
    Ok(())
}

/// S4: P = 2, one `[1, 1]` I32 window cell; rank r adds r+1 into peer (r+1) % 2's cell,
/// waits for its own to reach 1, reads it: `[[[2]], [[1]]]`. Both exec modes.
fn s4_notify_wait_handshake() -> Outcome {
    for mode in MODES {
        let mut w = DistWorker::new(l3_in(mode, 2, 0)).ctx("new")?;
        let (_, y, orch) = handshake(&mut w, "s4")?;
        w.init().ctx("init")?;
        w.run(&orch, &TaskArgs::new())
            .map_err(|e| format!("{mode:?}: {e}"))?;
        check!(
            y.to_vec::<i32>().ctx("y")? == vec![2, 1],
            "{mode:?}: {:?} (shape [2, 1, 1])",
            y.to_vec::<i32>()
        );
        w.close().ctx("close")?;
    }
    Ok(())
}

/// The S4 program: a kernel, the `[2, 1, 1]` output, and the orchestration (per-rank
/// singles over a `[1, 1]` i32 window).
fn handshake(
    w: &mut DistWorker,
    name: &str,
) -> Result<(OrchHandle, SharedTensor, HostOrchHandle), String> {
    let k = register(w, name, &[ArgTag::InOut, ArgTag::OutputExisting], |ctx| {
        let s = ctx.window(0)?;
        let r = s.rank();
        s.notify((r + 1) % 2, &[0, 0], r as i32 + 1, NotifyOp::AtomicAdd)?;
        s.wait(&[0, 0], 1, WaitCmp::Ge)?;
        let mut cell = [0i32];
        s.read(r, 0, &mut cell)?;
        ctx.output::<i32>(1)?.fill(cell[0]);
        Ok(())
    })?;
    let y = w.shared_tensor(&[2, 1, 1], DataType::I32).ctx("y")?;
    let ya = y.clone();
    let orch = w.register_orchestration(name, move |o, _| {
        let buf = o.alloc_window_buffer(64)?;
        let sig = o.window(&buf, 0, &[1, 1], DataType::I32)?;
        for r in 0..2u64 {
            let args = TaskArgs::new()
                .inout(&sig)
                .output_existing(ya.slice(0, r, r + 1));
            o.submit_next_level(k, &args, r as usize)?;
        }
        Ok(())
    });
    Ok((k, y, orch))
}

/// S5: the S4 program with persistent windows (zeroed between dispatches), dispatched 3
/// times: every dispatch gives `[[[2]], [[1]]]`, and the domain and its buffer are
/// allocated once.
fn s5_persistent_windows_are_allocated_once() -> Outcome {
    let cfg = l3(2).with_windows(WindowLifetime::Persistent {
        zero_between_runs: true,
    });
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let (_, y, orch) = handshake(&mut w, "s5")?;
    w.init().ctx("init")?;
    for run in 0..3 {
        y.write(&[0i32, 0]).ctx("zero")?;
        w.run(&orch, &TaskArgs::new()).ctx("run")?;
        check!(
            y.to_vec::<i32>().ctx("y")? == vec![2, 1],
            "dispatch {run}: {:?}",
            y.to_vec::<i32>()
        );
    }
    let stats = w.comm_stats().ok_or("no comm stats")?;
    check!(
        (stats.domains_created, stats.buffers_allocated) == (1, 1),
        "domains created {}, buffers allocated {}",
        stats.domains_created,
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

/// S6: a hand-rolled barrier's tally on an `[NR, 1]` I32 window — rank r's own copy has 1
/// in every row but r: `[[[0], [1]], [[1], [0]]]` at P = 2 (and the same rule at P = 4).
/// S10: each rank adds 1 four times into its peer's cell, waits for 4, then subtracts 4
/// from its own copy (a self-notify): 0 everywhere.
fn s6_barrier_tally_and_s10_self_notify_reset() -> Outcome {
    for p in [2usize, 4] {
        let mut w = DistWorker::new(l3(p)).ctx("new")?;
        let tally = register(
            &mut w,
            "tally",
            &[ArgTag::InOut, ArgTag::OutputExisting],
            |ctx| {
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
            },
        )?;
        let reset = register(
            &mut w,
            "reset",
            &[ArgTag::InOut, ArgTag::OutputExisting],
            |ctx| {
                let s = ctx.window(0)?;
                let (r, n) = (s.rank(), s.nranks());
                for _ in 0..4 {
                    s.notify((r + 1) % n, &[0], 1, NotifyOp::AtomicAdd)?;
                }
                s.wait(&[0], 4, WaitCmp::Ge)?;
                s.notify(r, &[0], -4, NotifyOp::AtomicAdd)?;
                let v = s.load_signal(&[0])?;
                ctx.output::<i32>(1)?.fill(v);
                Ok(())
            },
        )?;
        let pn = p as u64;
        let y = w.shared_tensor(&[pn, pn, 1], DataType::I32).ctx("y")?;
        let z = w.shared_tensor_from(&[pn, 1], &vec![7i32; p]).ctx("z")?;
        let (ya, za) = (y.clone(), z.clone());
        let t = w.register_orchestration("tally", move |o, _| {
            let buf = o.alloc_window_buffer(4 * pn)?;
            let sig = o.window(&buf, 0, &[pn, 1], DataType::I32)?;
            for r in 0..pn {
                let a = TaskArgs::new()
                    .inout(&sig)
                    .output_existing(ya.slice(0, r, r + 1));
                o.submit_next_level(tally, &a, r as usize)?;
            }
            Ok(())
        });
        let rs = w.register_orchestration("reset", move |o, _| {
            let buf = o.alloc_window_buffer(64)?;
            let cell = o.window(&buf, 0, &[1], DataType::I32)?;
            for r in 0..pn {
                let a = TaskArgs::new()
                    .inout(&cell)
                    .output_existing(za.slice(0, r, r + 1));
                o.submit_next_level(reset, &a, r as usize)?;
            }
            Ok(())
        });
        w.init().ctx("init")?;
        w.run(&t, &TaskArgs::new()).ctx("tally run")?;
        let got = y.to_vec::<i32>().ctx("y")?;
        let want: Vec<i32> = (0..p)
            .flat_map(|r| (0..p).map(move |i| i32::from(i != r)))
            .collect();
        check!(got == want, "P={p} tally {got:?} (shape [{p}, {p}, 1])");
        if p == 2 {
            check!(
                got == vec![0, 1, 1, 0],
                "S6: [[[0], [1]], [[1], [0]]], got {got:?}"
            );
        }
        w.run(&rs, &TaskArgs::new()).ctx("reset run")?;
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
/// P chips of one four-chip worker, per-rank singles. The tile variants move a [2, N/2]
/// tile; the barrier is the window buffer's own.
fn s8_put_and_get_shift_data_around_the_ring() -> Outcome {
    const N: u64 = 48;
    let mut w = DistWorker::new(l3(4)).ctx("new")?;
    let k = register(&mut w, "shift", IN_WIN_OUT, |ctx| {
        let d = ctx.window(1)?;
        let mode = ctx.scalar::<u64>(0)?;
        let (r, n) = (d.rank(), d.nranks());
        let x = ctx.input::<f32>(0)?.to_vec();
        let mut y = vec![0f32; x.len()];
        let tile = [2, x.len() as u64 / 2];
        match mode {
            0 => {
                d.write((r + 1) % n, 0, &x)?;
                d.barrier()?;
                d.read(r, 0, &mut y)?;
            }
            1 => {
                d.write(r, 0, &x)?;
                d.barrier()?;
                d.read((r + 1) % n, 0, &mut y)?;
            }
            2 => {
                d.store_tile((r + 1) % n, &[0, 0], &tile, &x, StoreOp::Overwrite)?;
                d.barrier()?;
                d.load_tile(r, &[0, 0], &tile, &mut y)?;
            }
            _ => {
                d.store_tile(r, &[0, 0], &tile, &x, StoreOp::Overwrite)?;
                d.barrier()?;
                d.load_tile((r + 1) % n, &[0, 0], &tile, &mut y)?;
            }
        }
        ctx.output::<f32>(2)?.copy_from_slice(&y)?;
        Ok(())
    })?;
    let mut cases = Vec::new();
    for p in [2u64, 3, 4] {
        let xs: Vec<f32> = (0..p * N).map(|i| i as f32 * 0.5 + 1.0).collect();
        let x = w.shared_tensor_from(&[p, N], &xs).ctx("x")?;
        let y = w.shared_tensor(&[p, N], DataType::F32).ctx("y")?;
        for mode in 0..4u64 {
            let (xa, ya) = (x.clone(), y.clone());
            let o = w.register_orchestration(&format!("shift{p}_{mode}"), move |o, _| {
                let members: Vec<usize> = (0..p as usize).collect();
                let d = o.comm_domain(&members)?;
                let buf = o.alloc_window_buffer_in(&d, 4 * N)?;
                let win = o.window(&buf, 0, &[2, N / 2], DataType::F32)?;
                for r in 0..p {
                    let a = TaskArgs::new()
                        .input(xa.slice(0, r, r + 1))
                        .inout(&win)
                        .output_existing(ya.slice(0, r, r + 1))
                        .scalar(mode);
                    o.submit_next_level(k, &a, r as usize)?;
                }
                Ok(())
            });
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

/// S9 at P = 2 on 8 × 8: rank identity `y[r] = x[r] + r`, the programming model's
/// `y[r] = x[r] · (r + 1)`, and a window round trip `y == x` — each kernel writes its row
/// into its window copy and computes from what it reads back. Both exec modes.
fn s9_rank_identity_scale_and_round_trip() -> Outcome {
    for mode in MODES {
        let mut w = DistWorker::new(l3_in(mode, 2, 0)).ctx("new")?;
        let k = register(&mut w, "s9", IN_WIN_OUT, |ctx| {
            let d = ctx.window(1)?;
            let r = d.rank();
            d.write(r, 0, &ctx.input::<f32>(0)?.to_vec())?;
            let mut v = vec![0f32; 64];
            d.read(r, 0, &mut v)?;
            let f: fn(f32, u32) -> f32 = match ctx.scalar::<u64>(0)? {
                0 => |v, r| v + r as f32,
                1 => |v, r| v * (r + 1) as f32,
                _ => |v, _| v,
            };
            let mut y = ctx.output::<f32>(2)?;
            for (o, v) in y.as_mut_slice().ok_or("contiguous")?.iter_mut().zip(&v) {
                *o = f(*v, r);
            }
            Ok(())
        })?;
        let xs: Vec<f32> = (0..128).map(|i| i as f32 * 0.25 - 3.0).collect();
        let x = w.shared_tensor_from(&[2, 8, 8], &xs).ctx("x")?;
        let y = w.shared_tensor(&[2, 8, 8], DataType::F32).ctx("y")?;
        let (xa, ya) = (x.clone(), y.clone());
        let orch = w.register_orchestration("s9", move |o, a| {
            let which = a.scalar_at::<u64>(0).ok_or("which")?;
            let buf = o.alloc_window_buffer(256)?;
            let win = o.window(&buf, 0, &[8, 8], DataType::F32)?;
            for r in 0..2u64 {
                let args = TaskArgs::new()
                    .input(xa.slice(0, r, r + 1))
                    .inout(&win)
                    .output_existing(ya.slice(0, r, r + 1))
                    .scalar(which);
                o.submit_next_level(k, &args, r as usize)?;
            }
            Ok(())
        });
        w.init().ctx("init")?;
        for (which, name) in [(0u64, "x + r"), (1, "x * (r + 1)"), (2, "round trip")] {
            w.run(&orch, &TaskArgs::new().scalar(which))
                .map_err(|e| format!("{mode:?} {name}: {e}"))?;
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
            check!(got == want, "{mode:?} {name}: {:?}", &got[60..68]);
        }
        w.close().ctx("close")?;
    }
    Ok(())
}

/// S9 on a domain over world ranks {1, 2} of 4 (domain ranks 0 and 1) and on the whole
/// world: y[r] = x[r] + domain rank + 100 · world rank.
fn rank_identity_on_the_world_and_on_a_sub_domain() -> Outcome {
    const N: u64 = 16;
    let mut w = DistWorker::new(l3(4)).ctx("new")?;
    let k = register(&mut w, "identity", IN_WIN_OUT, |ctx| {
        let d = ctx.window(1)?;
        let x = ctx.input::<f32>(0)?.to_vec();
        d.write(d.rank(), 0, &x)?;
        let mut y = vec![0f32; x.len()];
        d.read(d.rank(), 0, &mut y)?;
        let world = d.context().world_rank();
        if d.world_rank_of(d.rank())? != world {
            return Err("domain rank does not map to this chip".into());
        }
        let mut out = ctx.output::<f32>(2)?;
        let o = out.as_mut_slice().ok_or("contiguous")?;
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
    let (xa, ya) = (x.clone(), y_world.clone());
    let world = w.register_orchestration("world", move |o, _| {
        let buf = o.alloc_window_buffer(4 * N)?;
        let win = o.window(&buf, 0, &[N], DataType::F32)?;
        for r in 0..4u64 {
            let a = TaskArgs::new()
                .input(xa.slice(0, r, r + 1))
                .inout(&win)
                .output_existing(ya.slice(0, r, r + 1));
            o.submit_next_level(k, &a, r as usize)?;
        }
        Ok(())
    });
    let (xp, yp) = (x_pair.clone(), y_pair.clone());
    let pair = w.register_orchestration("pair", move |o, _| {
        let d = o.comm_domain(&[1, 2])?;
        let buf = o.alloc_window_buffer_in(&d, 4 * N)?;
        let win = o.window(&buf, 0, &[N], DataType::F32)?;
        let args: Vec<TaskArgs> = (0..2u64)
            .map(|r| {
                TaskArgs::new()
                    .input(xp.slice(0, r, r + 1))
                    .inout(&win)
                    .output_existing(yp.slice(0, r, r + 1))
            })
            .collect();
        o.submit_next_level_group(k, &args, &[1, 2])?;
        Ok(())
    });
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
/// out by builtin tasks; the builtin barrier twice at the end.
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
            // Allreduce with each op (ys[0..4]).
            for (i, op) in ops.into_iter().enumerate() {
                let buf = o.alloc_window_buffer(4 * M)?;
                let d = o.window(&buf, 0, &[M], DataType::F32)?;
                for r in 0..p {
                    o.copy_to_window(row(&xa, r)?, &d, r as u32)?;
                }
                o.allreduce(&d, op, algo)?;
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
            o.broadcast(&d, (p - 1) as u32)?;
            for r in 0..p {
                o.copy_from_window(&d, r as u32, row(&ya[4], r)?)?;
            }
            // Reduce-scatter (ys[5]): rank r ends with chunk r reduced, in place.
            let buf = o.alloc_window_buffer(4 * M)?;
            let d = o.window(&buf, 0, &[p, M / p], DataType::F32)?;
            for r in 0..p {
                o.copy_to_window(row(&xa, r)?, &d, r as u32)?;
            }
            o.reduce_scatter(&d, ReduceOp::Sum)?;
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
            o.allgather(&stage, &target)?;
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
            o.all_to_all(&stage2, &target2)?;
            for r in 0..p {
                o.copy_from_window(&target2, r as u32, row(&ya[6], r)?)?;
            }
            // The builtin barrier on one buffer, twice.
            o.barrier(&target2)?;
            o.barrier(&target2)?;
            Ok(())
        });
        w.init().ctx("init")?;
        let xr = rows::<f32>(&x, pu)?;
        for algo in AllreduceAlgo::ALL {
            w.run(&orch, &TaskArgs::new().scalar(algo.code()))
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
    let k = register(&mut w, "lonely", &[ArgTag::InOut], |ctx| {
        let s = ctx.window(0)?;
        // Only rank 0 waits (rank 1 never notifies): the error is rank 0's.
        if s.rank() == 0 {
            s.wait(&[3], 1, WaitCmp::Eq)?;
        }
        Ok(())
    })?;
    let o = w.register_orchestration("lonely", move |o, _| {
        let buf = o.alloc_window_buffer(64)?;
        let sig = o.window(&buf, 0, &[8], DataType::I32)?;
        for r in 0..2 {
            o.submit_next_level(k, &TaskArgs::new().inout(&sig), r)?;
        }
        Ok(())
    });
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
    let k = register(&mut w, "victim", &[ArgTag::InOut], move |ctx| {
        let d = ctx.window(0)?;
        if d.rank() == 1 {
            fl.write(&[1u64]).map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_secs(60));
        }
        d.allreduce(ReduceOp::Sum, AllreduceAlgo::Mesh)?;
        Ok(())
    })?;
    let o = w.register_orchestration("victim", move |o, _| {
        let buf = o.alloc_window_buffer(64)?;
        let d = o.window(&buf, 0, &[4], DataType::F32)?;
        let args = vec![TaskArgs::new().inout(&d); 2];
        o.submit_next_level_group(k, &args, &[0, 1])?;
        Ok(())
    });
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

fn main() {
    become_subreaper();
    run(&[
        (
            "s1_quickstart_per_rank_singles_allreduce",
            s1_quickstart_per_rank_singles_allreduce,
        ),
        (
            "window_arguments_keep_the_hosts_indices",
            window_arguments_keep_the_hosts_indices,
        ),
        (
            "a_window_to_a_worker_outside_its_domain_is_refused",
            a_window_to_a_worker_outside_its_domain_is_refused,
        ),
        (
            "ctx_input_on_a_window_is_refused_with_the_message",
            ctx_input_on_a_window_is_refused_with_the_message,
        ),
        (
            "tasks_of_one_rank_on_one_buffer_run_in_submit_order",
            tasks_of_one_rank_on_one_buffer_run_in_submit_order,
        ),
        ("s4_notify_wait_handshake", s4_notify_wait_handshake),
        (
            "s5_persistent_windows_are_allocated_once",
            s5_persistent_windows_are_allocated_once,
        ),
        (
            "s6_barrier_tally_and_s10_self_notify_reset",
            s6_barrier_tally_and_s10_self_notify_reset,
        ),
        (
            "s8_put_and_get_shift_data_around_the_ring",
            s8_put_and_get_shift_data_around_the_ring,
        ),
        (
            "s9_rank_identity_scale_and_round_trip",
            s9_rank_identity_scale_and_round_trip,
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
    ]);
}
