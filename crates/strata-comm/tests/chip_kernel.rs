//! The comm hook end to end inside one process: real `ChipWorker`s (one per rank, each on
//! its own thread) whose external memory is the comm arena, and whose kernels receive
//! windows as ordinary tensor arguments (`RunArgs::external`, the rank's own copy) and open
//! them with `ctx.window(i)`. (The process-level suite through the L3 engine lives in
//! strata-dist.)

mod common;

use common::*;
use std::sync::Arc;
use strata_chip::{
    ChipConfig, ChipWorker, CoreArgs, ExternalMemory, KernelCtx, OrchHandle, RunArgs,
};
use strata_comm::prelude::*;
use strata_comm::*;
use strata_types::{ArgTag, CallConfig, CallbackResult, DataType};

/// Tensor 0: this rank's input row; 1: the data window; 2: this rank's output row.
fn allreduce_kernel(ctx: &mut KernelCtx) -> CallbackResult {
    let data = ctx.window(1)?;
    // Rank identity: x[r] + r, then the sum over ranks.
    let me = data.rank();
    let mut v = ctx.input::<f32>(0)?.to_vec();
    v.iter_mut().for_each(|x| *x += me as f32);
    data.write(me, 0, &v)?;
    data.allreduce(ReduceOp::Sum, AllreduceAlgo::Auto)?;
    let mut out = ctx.output::<f32>(2)?;
    data.read(me, 0, out.as_mut_slice().ok_or("contiguous output")?)?;
    Ok(())
}

/// What a kernel cannot do with a window argument, and the message it gets.
fn refusals_kernel(ctx: &mut KernelCtx) -> CallbackResult {
    let e = ctx.input::<f32>(1).err().ok_or("ctx.input on a window")?;
    let msg = e.to_string();
    if !(msg.contains("ctx.window(1)") && msg.contains("strata_comm::KernelWindows")) {
        return Err(format!("unhelpful: {msg}").into());
    }
    match ctx.window(0) {
        Err(CommError::NotAWindow { index: 0, .. }) => {}
        other => return Err(format!("a host tensor is no window: {other:?}").into()),
    }
    let w = ctx.window(1)?;
    if w.shape() != [4, 256] || w.dtype() != DataType::F32 || w.nranks() != 2 {
        return Err(format!("{w:?}").into());
    }
    Ok(())
}

fn no_comm_kernel(ctx: &mut KernelCtx) -> CallbackResult {
    match Comm::from_kernel(ctx) {
        Err(CommError::NoCommContext) => Ok(()),
        other => Err(format!("expected NoCommContext, got {other:?}").into()),
    }
}

fn chip(
    with_comm: Option<(Arc<CommArena>, u32)>,
    kernel: fn(&mut KernelCtx) -> CallbackResult,
) -> (ChipWorker, OrchHandle) {
    let mut chip = ChipWorker::new(ChipConfig {
        device_memory_bytes: 512 << 20,
        ..ChipConfig::default()
    })
    .unwrap();
    let k = chip.register_kernel_fn("k", kernel).unwrap();
    let orch = chip
        .register_orchestration_fn("run", move |o, a| {
            let mut core = CoreArgs::new();
            for i in 0..a.tensor_count() {
                let t = a.tensor(i)?;
                core.tensor(
                    &t,
                    [ArgTag::Input, ArgTag::InOut, ArgTag::OutputExisting][i],
                );
            }
            o.submit_aiv(k, &core)?;
            Ok(())
        })
        .unwrap();
    if let Some((arena, rank)) = &with_comm {
        // SAFETY: the arena's mapping lives as long as the `Arc` the chip keeps; it is
        // page-aligned, and every access to it goes through atomics and raw copies.
        let ext =
            unsafe { ExternalMemory::new(0, arena.base_ptr(), arena.len() as u64, arena.clone()) }
                .unwrap();
        chip.attach_external_memory(ext).unwrap();
        chip.set_comm_context(Some(Arc::new(RankContext::new(
            arena.clone(),
            *rank,
            TIMEOUT,
        ))));
    }
    chip.init().unwrap();
    (chip, orch)
}

#[test]
fn kernels_on_two_chips_allreduce_windows_passed_as_tensor_arguments() {
    let p = 2u32;
    let mut w = world(p, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let buf = w.alloc.alloc_window_buffer(&dom, 4096).unwrap();
    let x = w.alloc.window(&buf, 0, &[4, 256], DataType::F32).unwrap();
    let copies: Vec<RankCopy> = (0..p).map(|r| w.alloc.rank_copy(&x, r).unwrap()).collect();
    let arena = w.arena.clone();
    let outs: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let arena = arena.clone();
                let copy = copies[r as usize];
                s.spawn(move || {
                    let (mut chip, orch) = chip(Some((arena, r)), allreduce_kernel);
                    let mut y = vec![0f32; 1024];
                    let mut x: Vec<f32> = (0..1024).map(|i| (i + 1000 * r) as f32).collect();
                    for _ in 0..3 {
                        let mut args = RunArgs::new();
                        args.input(&x, &[4, 256])
                            .external(
                                copy.buffer_offset,
                                copy.buffer_bytes,
                                copy.view,
                                ArgTag::InOut,
                            )
                            .output(&mut y, &[4, 256]);
                        chip.run(&orch, &mut args, &CallConfig::default()).unwrap();
                        x.copy_from_slice(&y);
                    }
                    chip.close().unwrap();
                    y
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Three rounds of x <- sum_r (x_r + r): x0 = i + 1000 r; after one round every rank
    // holds 2i + 1001; after two 4i + 2003; after three 8i + 4007.
    for (r, y) in outs.iter().enumerate() {
        assert!(
            y.iter()
                .enumerate()
                .all(|(i, &v)| v == (8 * i + 4007) as f32),
            "rank {r}: {:?}",
            &y[..4]
        );
        let mut v = vec![0f32; 1024];
        w.alloc.host_read(&x, r as u32, 0, &mut v).unwrap();
        assert_eq!(&v, y, "the window holds the result on rank {r}");
    }
}

#[test]
fn a_window_argument_is_refused_as_a_slice_and_opened_at_its_index() {
    let mut w = world(2, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let buf = w.alloc.alloc_window_buffer(&dom, 4096).unwrap();
    let x = w.alloc.window(&buf, 0, &[4, 256], DataType::F32).unwrap();
    let own = w.alloc.rank_copy(&x, 1).unwrap();
    let peer = w.alloc.rank_copy(&x, 0).unwrap();
    let (mut chip, orch) = chip(Some((w.arena.clone(), 1)), refusals_kernel);
    let host = vec![0f32; 4];
    let mut out = vec![0f32; 4];
    let run = |chip: &mut ChipWorker, copy: RankCopy, out: &mut Vec<f32>| {
        let mut args = RunArgs::new();
        args.input(&host, &[4])
            .external(
                copy.buffer_offset,
                copy.buffer_bytes,
                copy.view,
                ArgTag::InOut,
            )
            .output(out, &[4]);
        chip.run(&orch, &mut args, &CallConfig::default())
    };
    run(&mut chip, own, &mut out).unwrap();
    // Domain rank 0's copy on world rank 1's chip: not this rank's window.
    let e = run(&mut chip, peer, &mut out).unwrap_err().to_string();
    assert!(
        e.contains("copy of domain rank 0 (world rank 0)") && e.contains("world rank 1"),
        "{e}"
    );
    chip.close().unwrap();
}

#[test]
fn a_chip_without_comm_context_tells_the_kernel_so() {
    let (mut chip, orch) = chip(None, no_comm_kernel);
    chip.run(&orch, &mut RunArgs::new(), &CallConfig::default())
        .unwrap();
    chip.close().unwrap();
}

/// Runs, on a chip with one AIV core and no AIC core (its kernels run on core 0) that is
/// rank 0 of `arena` with signal waits giving up after 100 ms, the orchestration
/// `register` registers, with `copy` (a window's rank-0 copy) as its one argument; returns
/// the run's error and the chip (to close).
fn stalled_run(
    arena: &Arc<CommArena>,
    copy: &RankCopy,
    register: impl FnOnce(&mut ChipWorker) -> OrchHandle,
) -> (strata_chip::ChipError, ChipWorker) {
    let mut chip = ChipWorker::new(ChipConfig {
        device_memory_bytes: 512 << 20,
        aic_cores: 0,
        aiv_cores: 1,
        ..ChipConfig::default()
    })
    .unwrap();
    let orch = register(&mut chip);
    // SAFETY: as in `chip` above: the arena's mapping lives as long as the `Arc` the chip
    // keeps, is page-aligned, and is only accessed through atomics and raw copies.
    let ext =
        unsafe { ExternalMemory::new(0, arena.base_ptr(), arena.len() as u64, arena.clone()) }
            .unwrap();
    chip.attach_external_memory(ext).unwrap();
    chip.set_comm_context(Some(Arc::new(RankContext::new(
        arena.clone(),
        0,
        std::time::Duration::from_millis(100),
    ))));
    chip.init().unwrap();
    let mut args = RunArgs::new();
    args.external(
        copy.buffer_offset,
        copy.buffer_bytes,
        copy.view,
        ArgTag::InOut,
    );
    let e = chip
        .run(&orch, &mut args, &CallConfig::default())
        .unwrap_err();
    (e, chip)
}

/// A missing notify: a kernel waits for a signal cell nobody increments. Its wait gives
/// up at the rank's deadline, and the chip's error carries the wait-for state: the cell,
/// the condition, the value it last saw, and the task that waits for the kernel.
#[test]
fn a_wait_for_a_notify_nobody_sends_names_the_cell_and_its_value() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use strata_types::{PendingTask, SignalWait};
    let mut w = world(1, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let buf = w.alloc.alloc_window_buffer(&dom, 4096).unwrap();
    let sig = w.alloc.window(&buf, 0, &[8], DataType::I32).unwrap();
    let copy = w.alloc.rank_copy(&sig, 0).unwrap();
    let ids = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let i = ids.clone();
    let (e, mut chip) = stalled_run(&w.arena, &copy, |chip| {
        let waiter = chip
            .register_kernel_fn("wait_flag", |ctx| {
                ctx.window(0)?.wait(&[3], 1, WaitCmp::Ge)?;
                Ok(())
            })
            .unwrap();
        let consumer = chip.register_kernel_fn("consumer", |_| Ok(())).unwrap();
        let orch = chip
            .register_orchestration_fn("o", move |o, args| {
                let a = o.submit_aiv(
                    waiter,
                    CoreArgs::new().tensor(&args.tensor(0)?, ArgTag::InOut),
                )?;
                let b = o.submit_aiv(consumer, CoreArgs::new().dep(a.task_id()))?;
                i[0].store(a.task_id().id().unwrap(), Ordering::SeqCst);
                i[1].store(b.task_id().id().unwrap(), Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        orch
    });
    let (a, b) = (ids[0].load(Ordering::SeqCst), ids[1].load(Ordering::SeqCst));
    let wf = e
        .wait_for()
        .unwrap_or_else(|| panic!("no wait-for state: {e}"));
    assert_eq!(
        wf.signals,
        vec![SignalWait {
            task: a,
            core: 0,
            rank: 0,
            cell: 3,
            cmp: ">=".into(),
            expected: 1,
            value: 0,
            gave_up: true,
        }]
    );
    assert_eq!(
        wf.pending,
        vec![PendingTask {
            task: b,
            name: "consumer".into(),
            ready: false,
            producers: vec![a],
            workers: vec![],
        }]
    );
    assert!(wf.running.is_empty(), "{wf}");
    assert!(
        e.to_string().contains(&format!(
            "task {a} on core 0 (rank 0) gave up waiting for signal cell 3 >= 1, value 0"
        )),
        "{e}"
    );
    chip.close().unwrap();
}

/// A barrier a peer never reaches: rank 0's kernel waits on the barrier row of domain
/// rank 1, which never arrives. The wait gives up at the rank's deadline and the chip's
/// error names that row — the missing peer — in its wait-for state.
#[test]
fn a_barrier_a_peer_never_reaches_names_the_missing_peers_row() {
    use strata_types::SignalWait;
    let mut w = world(2, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let buf = w.alloc.alloc_window_buffer(&dom, 4096).unwrap();
    let data = w.alloc.window(&buf, 0, &[8], DataType::F32).unwrap();
    let copy = w.alloc.rank_copy(&data, 0).unwrap();
    let (e, mut chip) = stalled_run(&w.arena, &copy, |chip| {
        let barrier = chip
            .register_kernel_fn("barrier", |ctx| {
                ctx.window(0)?.barrier()?;
                Ok(())
            })
            .unwrap();
        let orch = chip
            .register_orchestration_fn("o", move |o, args| {
                o.submit_aiv(
                    barrier,
                    CoreArgs::new().tensor(&args.tensor(0)?, ArgTag::InOut),
                )?;
                Ok(())
            })
            .unwrap();
        orch
    });
    let wf = e
        .wait_for()
        .unwrap_or_else(|| panic!("no wait-for state: {e}"));
    assert_eq!(
        wf.signals
            .iter()
            .map(|s| SignalWait {
                task: 0,
                ..s.clone()
            })
            .collect::<Vec<_>>(),
        vec![SignalWait {
            task: 0,
            core: 0,
            rank: 0,
            cell: 1,
            cmp: ">=".into(),
            expected: 1,
            value: 0,
            gave_up: true,
        }],
        "{wf}"
    );
    assert!(
        e.to_string()
            .contains("gave up waiting for signal cell 1 >= 1, value 0"),
        "{e}"
    );
    chip.close().unwrap();
}
