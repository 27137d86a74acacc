//! Memory outlives whoever may still write it: a kernel abandoned after its timeout keeps
//! running, so the memory its run could reach — ring heaps, staging, resident tensors —
//! is never handed to the next run or allocation while it may write, is reported as
//! committed, and returns to the allocator once the kernel has returned.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_chip::*;
use strata_types::{ArgTag, CallConfig, DataType};

const N: u64 = 4096; // f32 elements per tensor

/// `[start, end)` device byte ranges a run's orchestration saw.
type Ranges = Arc<Mutex<Vec<(u64, u64)>>>;

fn range(t: &ChipTensor) -> (u64, u64) {
    (t.buffer_addr(), t.buffer_addr() + t.buffer_bytes())
}

fn overlaps(a: &[(u64, u64)], b: &[(u64, u64)]) -> bool {
    a.iter()
        .any(|&(s, e)| b.iter().any(|&(s2, e2)| s < e2 && s2 < e))
}

#[test]
fn memory_an_abandoned_kernel_may_write_is_quarantined_until_it_returns() {
    let mut chip = ChipWorker::new(ChipConfig {
        device_memory_bytes: 1 << 30,
        aic_cores: 0,
        aiv_cores: 2,
        ..ChipConfig::default()
    })
    .unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let rel = release.clone();
    // Ignores cancellation and keeps writing every argument until the test releases it.
    let scribble = chip
        .register_kernel_fn("scribble", move |ctx: &mut KernelCtx| {
            let mut outs = Vec::new();
            for i in 0..ctx.tensor_count() {
                outs.push(ctx.output::<f32>(i)?);
            }
            while !rel.load(Ordering::SeqCst) {
                for o in outs.iter_mut() {
                    o.as_mut_slice().ok_or("contiguous")?.fill(-1.0);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        })
        .unwrap();
    let copy = chip
        .register_kernel_fn("copy", |ctx: &mut KernelCtx| {
            let a = ctx.input::<f32>(0)?;
            let mut o = ctx.output::<f32>(1)?;
            o.as_mut_slice()
                .ok_or("contiguous")?
                .copy_from_slice(a.as_slice().ok_or("contiguous")?);
            Ok(())
        })
        .unwrap();
    let seen: [Ranges; 2] = Default::default();
    let s0 = seen[0].clone();
    let hang = chip
        .register_orchestration_fn("hang", move |o: &mut ChipOrch, args: &ChipArgs| {
            let staged = args.tensor(0)?;
            let resident = args.tensor(1)?;
            let ring = o
                .alloc_tensors(&[TensorCreateInfo::new(DataType::F32, &[N])])?
                .get(0)?;
            s0.lock()
                .unwrap()
                .extend([range(&staged), range(&resident), range(&ring)]);
            o.submit_aiv(
                scribble,
                CoreArgs::new().inout(&staged).inout(&resident).inout(&ring),
            )?;
            Ok(())
        })
        .unwrap();
    let s1 = seen[1].clone();
    let fine = chip
        .register_orchestration_fn("fine", move |o: &mut ChipOrch, args: &ChipArgs| {
            let (x, y) = (args.tensor(0)?, args.tensor(1)?);
            let mid = o
                .alloc_tensors(&[TensorCreateInfo::new(DataType::F32, &[N])])?
                .get(0)?;
            s1.lock()
                .unwrap()
                .extend([range(&x), range(&y), range(&mid)]);
            o.submit_aiv(copy, CoreArgs::new().input(&x).output(&mid))?;
            o.submit_aiv(copy, CoreArgs::new().input(&mid).output(&y))?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let resident = chip
        .alloc_tensor(&[N], DataType::F32, TensorInit::Zeros)
        .unwrap();
    // Not an argument of the abandoned kernel: stays usable throughout.
    let bystander = chip
        .alloc_tensor(&[N], DataType::F32, TensorInit::Zeros)
        .unwrap();
    let mut host = vec![0f32; N as usize];
    let mut a = RunArgs::new();
    a.inout(&mut host, &[N]).device(&resident, ArgTag::InOut);
    let timeout = CallConfig::default().with_timeout(Duration::from_millis(100));
    let e = chip.run(&hang, &mut a, &timeout).unwrap_err();
    assert!(matches!(e, ChipError::KernelTimeout { .. }), "{e}");
    assert_eq!(chip.lost_cores().len(), 1);

    // The next run gets other staging and ring memory, and computes undisturbed.
    let x: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let mut y = vec![0f32; N as usize];
    let mut a = RunArgs::new();
    a.input(&x, &[N]).output(&mut y, &[N]);
    chip.run(&fine, &mut a, &CallConfig::default()).unwrap();
    assert_eq!(y, x);
    let (old, new) = (
        seen[0].lock().unwrap().clone(),
        seen[1].lock().unwrap().clone(),
    );
    assert!(
        !overlaps(&old, &new),
        "the abandoned kernel's memory {old:x?} was handed to the next run {new:x?}"
    );
    assert!(chip.quarantined_device_memory().unwrap() >= 2 * N * 4);

    chip.write_tensor(&bystander, &x).unwrap();
    assert_eq!(chip.read_tensor::<f32>(&bystander).unwrap(), x);

    // The resident tensor it writes is refused, and freeing it keeps it out of reuse.
    let mut buf = vec![0f32; N as usize];
    let e = chip
        .copy_from(&mut buf, resident.ptr(), 16, CopyOffsets::default())
        .unwrap_err();
    assert!(matches!(e, ChipError::Quarantined { .. }), "{e}");
    let mut a = RunArgs::new();
    a.device(&resident, ArgTag::InOut)
        .device(&resident, ArgTag::InOut);
    assert!(matches!(
        chip.run(&fine, &mut a, &CallConfig::default()),
        Err(ChipError::Quarantined { .. })
    ));
    let committed = chip.committed_device_memory().unwrap();
    chip.free_tensor(resident).unwrap();
    assert_eq!(
        chip.committed_device_memory().unwrap(),
        committed,
        "held, not freed"
    );
    assert!(matches!(
        chip.free_tensor(resident),
        Err(ChipError::DoubleFree { .. })
    ));
    let fresh = chip.malloc(resident.nbytes()).unwrap();
    let (rs, re) = (
        resident.ptr().addr(),
        resident.ptr().addr() + resident.nbytes(),
    );
    assert!(fresh.addr() + resident.nbytes() <= rs || re <= fresh.addr());

    // Once the kernel returns, the quarantined memory goes back to the allocator.
    release.store(true, Ordering::SeqCst);
    let t = Instant::now();
    while !chip.lost_cores().is_empty() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(chip.lost_cores().is_empty(), "the kernel returned");
    let held = chip.quarantined_device_memory().unwrap();
    assert_eq!(held, 0);
    assert!(chip.committed_device_memory().unwrap() <= committed - resident.nbytes());
    chip.free(fresh).unwrap();
    chip.free_tensor(bystander).unwrap();
    chip.close().unwrap();
}
