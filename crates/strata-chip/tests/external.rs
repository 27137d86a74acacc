//! External memory (the memory of distributed windows, `docs/chip.md`): arguments in it
//! are passed in place at their external device address, keep their positions among the
//! run's tensors, and reach kernels only through atomics or `external_arg` — never as
//! slices, which `ctx.input` / `ctx.output` refuse with a message saying what to use.

use std::sync::{Arc, Mutex};
use strata_chip::*;
use strata_types::{ArgTag, CallConfig, CallbackResult, DataType, TensorView};

const EXT_BYTES: u64 = 1 << 16;

fn cfg() -> ChipConfig {
    ChipConfig {
        device_memory_bytes: 512 << 20,
        ..ChipConfig::default()
    }
}

/// A chip with `EXT_BYTES` of external memory standing for shared-memory region 7, and
/// the mapping (to look at the bytes from outside).
fn chip_with_external() -> (ChipWorker, *mut u8) {
    let mut map = memmap2::MmapOptions::new()
        .len(EXT_BYTES as usize)
        .map_anon()
        .unwrap();
    let base = map.as_mut_ptr();
    let owner = Arc::new(Mutex::new(map));
    let mut chip = ChipWorker::new(cfg()).unwrap();
    // SAFETY: the mapping is owned by `owner`, which the chip keeps alive; it is 64-byte
    // aligned (page-aligned), disjoint from the device arena, and the test touches it only
    // through raw reads after the runs.
    let ext = unsafe { ExternalMemory::new(7, base, EXT_BYTES, owner) }.unwrap();
    chip.attach_external_memory(ext).unwrap();
    (chip, base)
}

/// Tensors 0 and 2 are host tensors around the external argument 1: each keeps its index.
fn probe(ctx: &mut KernelCtx) -> CallbackResult {
    let x = ctx.input::<f32>(0)?.to_vec();
    // The window argument: refused as a slice, with what to use instead.
    let e = ctx
        .input::<i32>(1)
        .err()
        .ok_or("input on a window must fail")?;
    if !e.to_string().contains("ctx.window(1)") || !e.to_string().contains("ctx.shared(1)") {
        return Err(format!("unhelpful refusal: {e}").into());
    }
    let e = ctx
        .output::<i32>(1)
        .err()
        .ok_or("output on a window must fail")?;
    if !e
        .to_string()
        .contains("ctx.output(1) cannot lend it as a slice")
    {
        return Err(format!("unhelpful refusal: {e}").into());
    }
    let ext = ctx.external_arg(1)?;
    if ext.offset != 4096 || ext.size != 1024 || ext.view.shape() != [4] || ext.tag != ArgTag::InOut
    {
        return Err(format!("external_arg: {ext:?}").into());
    }
    if ctx.external_arg(0).is_ok() {
        return Err("a host tensor is not external".into());
    }
    // Atomics reach it: cell k = x[k] as i32 + 100.
    let w = ctx.shared::<i32>(1)?;
    for (k, v) in x.iter().enumerate() {
        if !w.store(&[k as u64], *v as i32 + 100) {
            return Err("store refused".into());
        }
    }
    let mut o = ctx.output::<f32>(2)?;
    let out = o.as_mut_slice().ok_or("contiguous")?;
    for (k, o) in out.iter_mut().enumerate() {
        *o = w.load(&[k as u64]).ok_or("load")? as f32;
    }
    Ok(())
}

#[test]
fn an_external_argument_keeps_its_index_and_is_reached_through_atomics_only() {
    let (mut chip, base) = chip_with_external();
    let k = chip.register_kernel_fn("probe", probe).unwrap();
    let orch = chip
        .register_orchestration_fn("probe", move |o, a| {
            o.submit_aiv(
                k,
                CoreArgs::new()
                    .input(&a.tensor(0)?)
                    .inout(&a.tensor(1)?)
                    .output(&a.tensor(2)?),
            )?;
            Ok(())
        })
        .unwrap();
    // The orchestration cannot read external memory.
    let peek = chip
        .register_orchestration_fn("peek", |o, a| {
            o.read_tensor::<i32>(&a.tensor(0)?)?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let mut y = [0f32; 4];
    let view = TensorView::new(DataType::I32, &[4], &[1], 16).unwrap();
    let mut args = RunArgs::new();
    args.input(&x, &[4])
        .external(4096, 1024, view, ArgTag::InOut)
        .output(&mut y, &[4]);
    chip.run(&orch, &mut args, &CallConfig::default()).unwrap();
    assert_eq!(y, [101.0, 102.0, 103.0, 104.0]);
    // The kernel ran on the external bytes in place: 16 bytes into the buffer at 4096.
    let mut cells = [0i32; 4];
    for (k, c) in cells.iter_mut().enumerate() {
        // SAFETY: inside the mapping; no run is in flight.
        *c = unsafe { (base.add(4096 + 16) as *const i32).add(k).read() };
    }
    assert_eq!(cells, [101, 102, 103, 104]);
    let mut args = RunArgs::new();
    args.external(4096, 1024, view, ArgTag::Input);
    let e = chip
        .run(&peek, &mut args, &CallConfig::default())
        .unwrap_err();
    assert_eq!(e.code(), Some(codes::INVALID_ARGS), "{e}");
    assert!(e.to_string().contains("external memory"), "{e}");
    chip.close().unwrap();
}

#[test]
fn external_arguments_are_checked_against_the_attached_memory() {
    let view = TensorView::contiguous(DataType::I32, &[4]).unwrap();
    // No external memory.
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let orch = chip
        .register_orchestration_fn("none", |_, _| Ok(()))
        .unwrap();
    chip.init().unwrap();
    let mut args = RunArgs::new();
    args.external(0, 64, view, ArgTag::Input);
    let e = chip
        .run(&orch, &mut args, &CallConfig::default())
        .unwrap_err();
    assert!(e.to_string().contains("no external memory"), "{e}");
    // Attaching after init is refused.
    let (mut late, _) = chip_with_external();
    late.init().unwrap();
    let map = memmap2::MmapOptions::new().len(4096).map_anon().unwrap();
    let mut m = map;
    let p = m.as_mut_ptr();
    // SAFETY: the mapping outlives the (refused) attachment.
    let ext = unsafe { ExternalMemory::new(1, p, 4096, Arc::new(Mutex::new(m))) }.unwrap();
    assert!(matches!(
        late.attach_external_memory(ext),
        Err(ChipError::AlreadyInitialized)
    ));
    // Outside the attached memory.
    let orch2 = late.register_orchestration_fn("none", |_, _| Ok(()));
    assert!(orch2.is_err(), "registration after init is refused");
    late.close().unwrap();
    let (mut chip, _) = chip_with_external();
    let orch = chip
        .register_orchestration_fn("none", |_, _| Ok(()))
        .unwrap();
    chip.init().unwrap();
    let mut args = RunArgs::new();
    args.external(EXT_BYTES - 32, 64, view, ArgTag::Input);
    let e = chip
        .run(&orch, &mut args, &CallConfig::default())
        .unwrap_err();
    assert!(e.to_string().contains("does not lie in"), "{e}");
    chip.close().unwrap();
    drop(chip);
    // A misaligned base is refused.
    let mut m = memmap2::MmapOptions::new().len(4096).map_anon().unwrap();
    // SAFETY: never dereferenced (refused).
    let bad = unsafe { ExternalMemory::new(1, m.as_mut_ptr().add(8), 64, Arc::new(())) };
    assert!(matches!(bad, Err(ChipError::InvalidConfig(_))));
}
