//! The comm hook end to end inside one process: two real `ChipWorker`s (one per rank, each
//! on its own thread) run a kernel that opens its windows with `Comm::from_kernel` and
//! allreduces. (The process-level suite through the L3 engine lives in strata-dist.)

mod common;

use common::*;
use std::sync::Arc;
use strata_chip::{ChipConfig, ChipWorker, CoreArgs, KernelCtx, RunArgs};
use strata_comm::*;
use strata_types::{CallConfig, CallbackResult, DataType};

fn allreduce_kernel(ctx: &mut KernelCtx) -> CallbackResult {
    let comm = Comm::from_kernel(ctx)?;
    let data = comm.window(&DistributedTensor::from_scalars(ctx.scalars())?)?;
    let signal = comm.window(&DistributedTensor::from_scalars(
        &ctx.scalars()[DistributedTensor::SCALARS..],
    )?)?;
    // y[r] = x[r] + r before the reduction (rank identity), then the sum over ranks.
    let me = data.rank();
    let mut v = vec![0f32; data.tensor().numel() as usize];
    data.read(me, 0, &mut v)?;
    v.iter_mut().for_each(|x| *x += me as f32);
    data.write(me, 0, &v)?;
    data.allreduce(&signal, ReduceOp::Sum, AllreduceAlgo::Auto)?;
    Ok(())
}

fn no_comm_kernel(ctx: &mut KernelCtx) -> CallbackResult {
    match Comm::from_kernel(ctx) {
        Err(CommError::NoCommContext) => Ok(()),
        other => Err(format!("expected NoCommContext, got {other:?}").into()),
    }
}

fn chip(with_comm: Option<Arc<RankContext>>) -> (ChipWorker, strata_chip::OrchHandle) {
    let mut chip = ChipWorker::new(ChipConfig {
        device_memory_bytes: 512 << 20,
        ..ChipConfig::default()
    })
    .unwrap();
    let k = if with_comm.is_some() {
        chip.register_kernel_fn("allreduce", allreduce_kernel)
            .unwrap()
    } else {
        chip.register_kernel_fn("no_comm", no_comm_kernel).unwrap()
    };
    let orch = chip
        .register_orchestration_fn("run", move |o, args| {
            let scalars: Vec<u64> = (0..args.scalar_count())
                .map(|i| args.scalar::<u64>(i))
                .collect::<Result<_, _>>()?;
            o.submit_aiv(k, CoreArgs::new().scalars(&scalars))?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    if let Some(ctx) = with_comm {
        chip.set_comm_context(Some(ctx));
    }
    (chip, orch)
}

#[test]
fn kernels_on_two_chips_allreduce_through_the_comm_hook() {
    let p = 2u32;
    let mut w = world(p, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let cells = signal_cells(p, AllreduceAlgo::Auto);
    let buf = w.alloc.alloc_window_buffer(&dom, 4096 + cells * 4).unwrap();
    let x = w.alloc.window(&buf, 0, &[4, 256], DataType::F32).unwrap();
    let sig = w.alloc.window(&buf, 4096, &[cells], DataType::I32).unwrap();
    for r in 0..p {
        let v: Vec<f32> = (0..1024).map(|i| (i + 1000 * r) as f32).collect();
        w.alloc.host_write(&x, r, 0, &v).unwrap();
    }
    let mut scalars = x.to_scalars().to_vec();
    scalars.extend(sig.to_scalars());
    let arena = w.arena.clone();
    std::thread::scope(|s| {
        for r in 0..p {
            let ctx = Arc::new(RankContext::new(arena.clone(), r, TIMEOUT));
            let scalars = scalars.clone();
            s.spawn(move || {
                let (mut chip, orch) = chip(Some(ctx));
                for _ in 0..3 {
                    let mut args = RunArgs::new();
                    for &v in &scalars {
                        args.scalar(v);
                    }
                    chip.run(&orch, &mut args, &CallConfig::default()).unwrap();
                }
                chip.close().unwrap();
            });
        }
    });
    // Three rounds of x <- sum_r (x_r + r): x0 = i + 1000 r; after one round every rank
    // holds 2i + 1001; after two 4i + 2003; after three 8i + 4007.
    for r in 0..p {
        let mut v = vec![0f32; 1024];
        w.alloc.host_read(&x, r, 0, &mut v).unwrap();
        assert!(
            v.iter()
                .enumerate()
                .all(|(i, &x)| x == (8 * i + 4007) as f32),
            "rank {r}: {:?}",
            &v[..4]
        );
    }
}

#[test]
fn a_chip_without_comm_context_tells_the_kernel_so() {
    let (mut chip, orch) = chip(None);
    chip.run(&orch, &mut RunArgs::new(), &CallConfig::default())
        .unwrap();
    chip.close().unwrap();
}

/// A missing notify: a kernel waits for a signal cell nobody increments. Its wait gives
/// up at the rank's deadline, and the chip's error carries the wait-for state: the cell,
/// the condition, the value it last saw, and the task that waits for the kernel.
#[test]
fn a_wait_for_a_notify_nobody_sends_names_the_cell_and_its_value() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;
    use strata_types::{PendingTask, SignalWait};
    let mut w = world(1, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let buf = w.alloc.alloc_window_buffer(&dom, 4096).unwrap();
    let sig = w.alloc.window(&buf, 0, &[8], DataType::I32).unwrap();
    let mut chip = ChipWorker::new(ChipConfig {
        device_memory_bytes: 512 << 20,
        aic_cores: 0,
        aiv_cores: 1,
        ..ChipConfig::default()
    })
    .unwrap();
    let waiter = chip
        .register_kernel_fn("wait_flag", |ctx| {
            let comm = Comm::from_kernel(ctx)?;
            let s = comm.window(&DistributedTensor::from_scalars(ctx.scalars())?)?;
            s.wait(&[3], 1, WaitCmp::Ge)?;
            Ok(())
        })
        .unwrap();
    let consumer = chip.register_kernel_fn("consumer", |_| Ok(())).unwrap();
    let ids = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let i = ids.clone();
    let orch = chip
        .register_orchestration_fn("o", move |o, args| {
            let scalars: Vec<u64> = (0..args.scalar_count())
                .map(|i| args.scalar::<u64>(i))
                .collect::<Result<_, _>>()?;
            let a = o.submit_aiv(waiter, CoreArgs::new().scalars(&scalars))?;
            let b = o.submit_aiv(consumer, CoreArgs::new().dep(a.task_id()))?;
            i[0].store(a.task_id().id().unwrap(), Ordering::SeqCst);
            i[1].store(b.task_id().id().unwrap(), Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let ctx = RankContext::new(w.arena.clone(), 0, Duration::from_millis(100));
    chip.set_comm_context(Some(Arc::new(ctx)));
    let mut args = RunArgs::new();
    for v in sig.to_scalars() {
        args.scalar(v);
    }
    let e = chip
        .run(&orch, &mut args, &CallConfig::default())
        .unwrap_err();
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
