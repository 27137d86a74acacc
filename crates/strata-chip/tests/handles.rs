//! Tensor handles are judged by the bytes they name: a handle kept from an earlier run or
//! taken from another chip is a typed error, and two arguments of one task that cover
//! the same device bytes (one of them written) are refused whatever their buffer keys —
//! a kernel never holds a `&mut` and a `&` over the same bytes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use strata_chip::*;
use strata_types::{CallConfig, DataType};

fn cfg() -> ChipConfig {
    ChipConfig {
        device_memory_bytes: 512 << 20,
        ..ChipConfig::default()
    }
}

/// Small ring heaps, so the ring reuses addresses after a few allocations.
fn small_rings() -> ChipConfig {
    let mut c = cfg();
    for r in c.rings.iter_mut() {
        r.heap_bytes = 8 * 1024;
    }
    c
}

/// A kernel over (INOUT 0, INPUT 1) that counts the invocations whose two slices share
/// a byte (what must never happen).
fn register_probe(chip: &mut ChipWorker, aliased: Arc<AtomicUsize>) -> KernelHandle {
    chip.register_kernel_fn("probe", move |ctx: &mut KernelCtx| {
        let mut w = ctx.output::<f32>(0)?;
        let r = ctx.input::<f32>(1)?;
        let r = r.as_slice().ok_or("contiguous")?;
        let (r0, r1) = (
            r.as_ptr() as usize,
            r.as_ptr() as usize + std::mem::size_of_val(r),
        );
        let w = w.as_mut_slice().ok_or("contiguous")?;
        let (w0, w1) = (
            w.as_ptr() as usize,
            w.as_ptr() as usize + std::mem::size_of_val(w),
        );
        if w0 < r1 && r0 < w1 {
            aliased.fetch_add(1, Ordering::SeqCst);
        }
        w[0] = r[0];
        Ok(())
    })
    .unwrap()
}

#[test]
fn a_handle_kept_from_an_earlier_run_is_stale_even_when_its_address_is_reused() {
    let mut chip = ChipWorker::new(small_rings()).unwrap();
    let aliased = Arc::new(AtomicUsize::new(0));
    let probe = register_probe(&mut chip, aliased.clone());
    // Each run allocates a runtime tensor in the ring; once its address is one an earlier
    // run's handle has, it submits (stale INOUT, fresh INPUT).
    let kept: Arc<Mutex<Vec<ChipTensor>>> = Arc::default();
    let reused = Arc::new(AtomicUsize::new(0));
    let (k, r) = (kept.clone(), reused.clone());
    let orch = chip
        .register_orchestration_fn("keep", move |o: &mut ChipOrch, _| {
            let fresh = o
                .alloc_tensors(&[
                    TensorCreateInfo::new(DataType::F32, &[256]).with_initial_value(1.0f32)
                ])?
                .get(0)?;
            let old = k
                .lock()
                .unwrap()
                .iter()
                .copied()
                .find(|t| t.buffer_addr() == fresh.buffer_addr());
            match old {
                Some(stale) => {
                    r.fetch_add(1, Ordering::SeqCst);
                    assert_ne!(stale.run_epoch(), fresh.run_epoch());
                    o.submit_aiv(probe, CoreArgs::new().inout(&stale).input(&fresh))?;
                }
                None => k.lock().unwrap().push(fresh),
            }
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let mut outcome = None;
    for _ in 0..64 {
        let r = chip.run(&orch, &mut RunArgs::new(), &CallConfig::default());
        if reused.load(Ordering::SeqCst) > 0 {
            outcome = Some(r);
            break;
        }
        r.unwrap();
    }
    let e = outcome
        .expect("the ring reuses a tensor address within 64 runs")
        .unwrap_err();
    assert!(
        matches!(e, ChipError::StaleTensor { handle_run, current_run } if handle_run < current_run),
        "{e:?}"
    );
    assert_eq!(e.code(), Some(codes::INVALID_ARGS));
    assert_eq!(
        aliased.load(Ordering::SeqCst),
        0,
        "a kernel saw two aliasing slices"
    );
    // Entry tensors are handles too: one kept from the run it came in is stale later.
    let entry: Arc<Mutex<Option<ChipTensor>>> = Arc::default();
    let en = entry.clone();
    let mut chip2 = ChipWorker::new(cfg()).unwrap();
    let probe2 = register_probe(&mut chip2, aliased.clone());
    let orch2 = chip2
        .register_orchestration_fn("entry", move |o: &mut ChipOrch, args: &ChipArgs| {
            let x = args.tensor(0)?;
            let old = en.lock().unwrap().replace(x);
            if let Some(stale) = old {
                o.submit_aiv(probe2, CoreArgs::new().inout(&stale).input(&x))?;
            }
            Ok(())
        })
        .unwrap();
    chip2.init().unwrap();
    let x = vec![2.0f32; 256];
    let mut a = RunArgs::new();
    a.input(&x, &[256]);
    chip2.run(&orch2, &mut a, &CallConfig::default()).unwrap();
    let mut a = RunArgs::new();
    a.input(&x, &[256]);
    let e = chip2
        .run(&orch2, &mut a, &CallConfig::default())
        .unwrap_err();
    assert!(matches!(e, ChipError::StaleTensor { .. }), "{e:?}");
    assert_eq!(
        aliased.load(Ordering::SeqCst),
        0,
        "a kernel saw two aliasing slices"
    );
}

#[test]
fn a_handle_of_another_chip_is_foreign() {
    let aliased = Arc::new(AtomicUsize::new(0));
    // Two chips with the same (default) chip id: only the nonce tells them apart.
    let mut a = ChipWorker::new(cfg()).unwrap();
    let mut b = ChipWorker::new(cfg()).unwrap();
    let taken: Arc<Mutex<Option<ChipTensor>>> = Arc::default();
    let t = taken.clone();
    let give = a
        .register_orchestration_fn("give", move |o: &mut ChipOrch, _| {
            let x = o
                .alloc_tensors(&[TensorCreateInfo::new(DataType::F32, &[256])])?
                .get(0)?;
            *t.lock().unwrap() = Some(x);
            Ok(())
        })
        .unwrap();
    let probe = register_probe(&mut b, aliased.clone());
    let t = taken.clone();
    let uses = b
        .register_orchestration_fn("use", move |o: &mut ChipOrch, _| {
            let foreign = t.lock().unwrap().expect("chip a ran first");
            let mine = o
                .alloc_tensors(&[TensorCreateInfo::new(DataType::F32, &[256])])?
                .get(0)?;
            o.submit_aiv(probe, CoreArgs::new().inout(&foreign).input(&mine))?;
            Ok(())
        })
        .unwrap();
    let reads = b
        .register_orchestration_fn("read", move |o: &mut ChipOrch, _| {
            let foreign = taken.lock().unwrap().expect("chip a ran first");
            o.read_tensor::<f32>(&foreign)?;
            Ok(())
        })
        .unwrap();
    a.init().unwrap();
    b.init().unwrap();
    a.run(&give, &mut RunArgs::new(), &CallConfig::default())
        .unwrap();
    for orch in [&uses, &reads] {
        let e = b
            .run(orch, &mut RunArgs::new(), &CallConfig::default())
            .unwrap_err();
        assert!(
            matches!(e, ChipError::ForeignTensor { handle_chip, this_chip }
                if handle_chip == a.nonce() && this_chip == b.nonce()),
            "{e:?}"
        );
        assert_eq!(e.code(), Some(codes::INVALID_ARGS));
    }
    assert_eq!(
        aliased.load(Ordering::SeqCst),
        0,
        "a kernel saw two aliasing slices"
    );
}

#[test]
fn arguments_with_different_keys_over_the_same_bytes_are_refused() {
    // Within one run: a tensor whose scope ended, and a later one the ring put at its
    // address. Their keys differ; their bytes are the same. (The graph would refuse the
    // reclaimed buffer too; the chip judges the task's arguments by bytes first.)
    let mut chip = ChipWorker::new(small_rings()).unwrap();
    let aliased = Arc::new(AtomicUsize::new(0));
    let probe = register_probe(&mut chip, aliased.clone());
    let found = Arc::new(AtomicUsize::new(0));
    let f = found.clone();
    let orch = chip
        .register_orchestration_fn("reuse", move |o: &mut ChipOrch, _| {
            let ci = [TensorCreateInfo::new(DataType::F32, &[256]).with_initial_value(1.0f32)];
            let first = o.scope(|o| Ok(o.alloc_tensors(&ci)?.get(0)?))?;
            for _ in 0..64 {
                let next = o.scope(|o| Ok(o.alloc_tensors(&ci)?.get(0)?))?;
                if next.buffer_addr() == first.buffer_addr() {
                    f.fetch_add(1, Ordering::SeqCst);
                    o.scope(|o| {
                        Ok(o.submit_aiv(probe, CoreArgs::new().inout(&first).input(&next))?)
                    })?;
                    return Ok(());
                }
            }
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let r = chip.run(&orch, &mut RunArgs::new(), &CallConfig::default());
    assert_eq!(
        found.load(Ordering::SeqCst),
        1,
        "the ring reuses the address"
    );
    let e = r.unwrap_err();
    assert_eq!(e.code(), Some(codes::INVALID_ARGS), "{e}");
    assert!(e.to_string().contains("overlap in device memory"), "{e}");
    assert_eq!(
        aliased.load(Ordering::SeqCst),
        0,
        "a kernel saw two aliasing slices"
    );
}
