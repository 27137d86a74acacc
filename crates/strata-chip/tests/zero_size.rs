//! Zero-size tensors are accepted, as in the reference: they get device address 0, take
//! no staging, and nothing is copied in or back; kernels see empty slices.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use strata_chip::*;
use strata_types::{CallConfig, DataType, TensorView};

#[test]
fn zero_size_tensors_get_address_zero_and_copy_nothing() {
    let mut chip = ChipWorker::new(ChipConfig {
        device_memory_bytes: 512 << 20,
        ..ChipConfig::default()
    })
    .unwrap();
    let empty_lens = Arc::new(AtomicUsize::new(usize::MAX));
    let lens = empty_lens.clone();
    let k = chip
        .register_kernel_fn("count", move |ctx: &mut KernelCtx| {
            let e = ctx.input::<f32>(0)?;
            let n = e.as_slice().ok_or("contiguous")?.len();
            lens.store(n, Ordering::SeqCst);
            let mut o = ctx.output::<f32>(1)?;
            o.as_mut_slice().ok_or("contiguous")?.fill(n as f32 + 5.0);
            Ok(())
        })
        .unwrap();
    let orch = chip
        .register_orchestration_fn("o", move |o: &mut ChipOrch, args: &ChipArgs| {
            let (empty, out, empty_out) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
            for e in [&empty, &empty_out] {
                assert_eq!((e.buffer_addr(), e.buffer_bytes(), e.numel()), (0, 0, 0));
            }
            assert_eq!(empty_out.shape(), &[4, 0]);
            assert!(o.read_tensor::<f32>(&empty)?.is_empty());
            o.write_tensor::<f32>(&empty_out, &[])?;
            o.submit_aiv(k, CoreArgs::new().input(&empty).output(&out))?;
            o.submit_aiv(k, CoreArgs::new().input(&empty_out).output(&out))?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let none: [f32; 0] = [];
    let mut none_out: [f32; 0] = [];
    let mut out = vec![0f32; 8];
    let mut a = RunArgs::new();
    a.input(&none, &[0])
        .output(&mut out, &[8])
        .inout(&mut none_out, &[4, 0]);
    chip.run(&orch, &mut a, &CallConfig::default()).unwrap();
    assert_eq!(empty_lens.load(Ordering::SeqCst), 0);
    assert_eq!(out, vec![5.0; 8]);
    // A shape that does not match the data is still refused.
    let mut a = RunArgs::new();
    a.input(&none, &[1]);
    assert!(matches!(
        chip.run(&orch, &mut a, &CallConfig::default()),
        Err(ChipError::InvalidRunArgs(_))
    ));
    assert!(TensorView::contiguous(DataType::F32, &[0]).is_err());
}
