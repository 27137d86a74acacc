//! The `Worker` facade at every level, children as threads (the process-mode engine is
//! covered by `crates/strata-dist/tests/processes.rs` and the examples).

use strata::chip::{ChipConfig, CoreArgs, KernelError, KernelHandle, OrchHandle};
use strata::dist::DistConfig;
use strata::host::{ExecMode, SharedTensor};
use strata::types::{ArgTag, BufferDesc, BufferLocation, DataType, IdentityMinter, TaskArgs};
use strata::types::{TensorArg, TensorView};
use strata::{Callable, Error, Worker};

fn tensors(ts: &[TensorArg]) -> TaskArgs {
    let mut a = TaskArgs::new();
    for t in ts {
        a.push_tensor(*t).unwrap();
    }
    a
}

/// Registers `out = a + b` (f32) as a kernel and a chip orchestration.
fn register_vadd(w: &mut Worker) -> (KernelHandle, OrchHandle) {
    let add = w
        .register_kernel("vadd", |ctx| {
            let a = ctx.input::<f32>(0)?.to_vec();
            let b = ctx.input::<f32>(1)?.to_vec();
            let mut o = ctx.output::<f32>(2)?;
            let out = o
                .as_mut_slice()
                .ok_or_else(|| KernelError::new("contiguous output"))?;
            for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(&b)) {
                *o = x + y;
            }
            Ok(())
        })
        .unwrap();
    let orch = w
        .register_chip_orchestration("vadd", move |o, a| {
            o.submit_aiv(
                add,
                CoreArgs::new()
                    .input(&a.tensor(0)?)
                    .input(&a.tensor(1)?)
                    .output(&a.tensor(2)?),
            )?;
            Ok(())
        })
        .unwrap();
    (add, orch)
}

fn ramp(w: &Worker, n: u64, k: f32) -> (SharedTensor, Vec<f32>) {
    let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 + k).collect();
    (w.shared_tensor_from(&[n], &v).unwrap(), v)
}

#[test]
fn a_level_2_worker_runs_chip_orchestrations_on_shared_tensors() {
    let mut w = Worker::chip(ChipConfig::default()).unwrap();
    assert_eq!(w.level(), 2);
    let (_, vadd) = register_vadd(&mut w);
    let (a, av) = ramp(&w, 300, 1.0);
    let (b, bv) = ramp(&w, 300, -4.0);
    let out = w.shared_tensor(&[300], DataType::F32).unwrap();
    w.init().unwrap();
    let h = w
        .submit(
            vadd,
            &tensors(&[
                a.arg(ArgTag::Input),
                b.arg(ArgTag::Input),
                out.arg(ArgTag::OutputExisting),
            ]),
        )
        .unwrap();
    assert!(h.is_done(), "a chip run is synchronous");
    h.result(None).unwrap();
    let golden: Vec<f32> = av.iter().zip(&bv).map(|(x, y)| x + y).collect();
    assert_eq!(out.to_vec::<f32>().unwrap(), golden);
    assert!(w.chip_worker().is_some() && w.dist_worker().is_none());
    w.close().unwrap();
}

#[test]
fn a_level_3_worker_sums_two_chips_on_a_sub_worker() {
    let n = 512;
    let cfg = DistConfig::l3(vec![ChipConfig::default(); 2], 1).with_exec_mode(ExecMode::Threads);
    let mut w = Worker::with_config(cfg).unwrap();
    let (_, vadd) = register_vadd(&mut w);
    let sum = w
        .register_sub("sum", |call| {
            let x = call.tensor::<f32>(0)?.to_vec();
            let y = call.tensor::<f32>(1)?.to_vec();
            let mut o = call.tensor_mut::<f32>(2)?;
            for (i, (x, y)) in x.iter().zip(&y).enumerate() {
                o.set(&[i as u64], x + y)?;
            }
            Ok(())
        })
        .unwrap();
    let inputs: Vec<(SharedTensor, Vec<f32>)> = (0..4).map(|k| ramp(&w, n, k as f32)).collect();
    let out = w.shared_tensor(&[n], DataType::F32).unwrap();
    let (ins, oa): (Vec<SharedTensor>, _) =
        (inputs.iter().map(|x| x.0.clone()).collect(), out.clone());
    let orch = w
        .register_orchestration("l3", move |o, _| {
            let r0 = o.alloc(&[n], DataType::F32)?;
            let r1 = o.alloc(&[n], DataType::F32)?;
            for (chip, r) in [&r0, &r1].into_iter().enumerate() {
                let a = tensors(&[
                    ins[2 * chip].arg(ArgTag::Input),
                    ins[2 * chip + 1].arg(ArgTag::Input),
                    r.arg(ArgTag::Output),
                ]);
                o.submit_next_level(vadd, &a, chip)?;
            }
            let a = tensors(&[
                r0.arg(ArgTag::Input),
                r1.arg(ArgTag::Input),
                oa.arg(ArgTag::OutputExisting),
            ]);
            o.submit_sub(&sum, &a)?;
            Ok(())
        })
        .unwrap();
    w.init().unwrap();
    w.run(orch, &TaskArgs::new()).unwrap();
    let golden: Vec<f32> = (0..n as usize)
        .map(|i| inputs.iter().map(|x| x.1[i]).sum())
        .collect();
    assert_eq!(out.to_vec::<f32>().unwrap(), golden);
    w.close().unwrap();
}

#[test]
fn a_level_4_worker_drives_two_level_3_workers() {
    let mut top = Worker::with_config(DistConfig::l4(0).with_exec_mode(ExecMode::Threads)).unwrap();
    let (_, vadd) = register_vadd(&mut top);
    let l3_vadd = top
        .register_orchestration("l3_vadd", move |o, a| {
            let t = a.tensors();
            let a = tensors(&[
                t[0].with_tag(ArgTag::Input),
                t[1].with_tag(ArgTag::Input),
                t[2].with_tag(ArgTag::OutputExisting),
            ]);
            o.submit_next_level(vadd, &a, 0)?;
            Ok(())
        })
        .unwrap();
    for _ in 0..2 {
        let child = Worker::l3(vec![ChipConfig::default()], 0).unwrap();
        top.add_worker(child).unwrap();
    }
    let (a, av) = ramp(&top, 64, 2.0);
    let (b, bv) = ramp(&top, 64, 3.0);
    let outs = [
        top.shared_tensor(&[64], DataType::F32).unwrap(),
        top.shared_tensor(&[64], DataType::F32).unwrap(),
    ];
    let oa = outs.clone();
    let orch = top
        .register_orchestration("l4", move |o, _| {
            for (worker, out) in oa.iter().enumerate() {
                let t = tensors(&[
                    a.arg(ArgTag::Input),
                    b.arg(ArgTag::Input),
                    out.arg(ArgTag::OutputExisting),
                ]);
                o.submit_next_level(l3_vadd, &t, worker)?;
            }
            Ok(())
        })
        .unwrap();
    top.init().unwrap();
    top.run(orch, &TaskArgs::new()).unwrap();
    let golden: Vec<f32> = av.iter().zip(&bv).map(|(x, y)| x + y).collect();
    for out in &outs {
        assert_eq!(out.to_vec::<f32>().unwrap(), golden);
    }
    top.close().unwrap();
}

#[test]
fn mismatched_levels_and_callables_are_typed_errors() {
    // Each level has its constructor; a configuration a level cannot have is refused.
    let mut bad = DistConfig::l4(0);
    bad.chips = vec![ChipConfig::default()];
    assert!(
        matches!(Worker::with_config(bad), Err(Error::Config(m)) if m.contains("level-3")),
        "chips on a level-4 worker"
    );
    let bad = ChipConfig {
        aiv_cores: 100,
        ..ChipConfig::default()
    };
    assert!(
        matches!(Worker::chip(bad), Err(Error::Config(_))),
        "a chip with 100 AIV cores"
    );

    // A host orchestration on a chip, a chip orchestration on a host.
    let mut w2 = Worker::chip(ChipConfig::default()).unwrap();
    let mut w3 =
        Worker::with_config(DistConfig::l3(vec![], 1).with_exec_mode(ExecMode::Threads)).unwrap();
    let (_, vadd) = register_vadd(&mut w2);
    let host = w3.register_orchestration("noop", |_, _| Ok(())).unwrap();
    w2.init().unwrap();
    w3.init().unwrap();
    let e = w2.run(Callable::Host(host), &TaskArgs::new()).unwrap_err();
    assert!(e.to_string().contains("runs chip orchestrations"), "{e}");
    let e = w3.run(vadd, &TaskArgs::new()).unwrap_err();
    assert!(e.to_string().contains("submit_next_level"), "{e}");

    // Private host memory is refused with the fix in the message.
    let private = [0f32; 16];
    // SAFETY: the worker must refuse this descriptor at submit; nothing dereferences it.
    let buf = unsafe {
        BufferDesc::from_parts(
            IdentityMinter::new().mint(),
            64,
            BufferLocation::HostLocal {
                addr: private.as_ptr() as u64,
            },
        )
    };
    let view = TensorView::contiguous(DataType::F32, &[16]).unwrap();
    let t = TensorArg::new(buf, view, ArgTag::Input).unwrap();
    let e = w2.run(vadd, &tensors(&[t, t, t])).unwrap_err();
    assert!(e.to_string().contains("SharedTensor"), "{e}");

    // Level-specific operations name the level that has them.
    assert!(matches!(
        w2.alloc_child_tensor(0, &[4], DataType::F32),
        Err(Error::InvalidArgument(m)) if m.contains("level-2 worker")
    ));
    let child =
        Worker::with_config(DistConfig::l3(vec![], 1).with_exec_mode(ExecMode::Threads)).unwrap();
    assert!(
        w3.add_worker(child).is_err(),
        "only a level-4 worker takes children"
    );
    w2.close().unwrap();
    w3.close().unwrap();
    w3.close().unwrap(); // idempotent
}
