//! E4: the five task shapes.

use crate::kernels::{add_kernel, host_matmul, matmul_kernel, mul_kernel};
use crate::support::{check_close, timed, Rng, WorkloadError, WorkloadReport};
use strata_chip::*;
use strata_types::CallConfig;

/// E4: the five task shapes (MIX AIC+AIV0+AIV1, AIC, AIV, AIV0+AIV1, AIC+AIV0) over four
/// iterations, each in its own scope, writing slices of nine output tensors.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e4_mixed_example(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    const V: u64 = 16384;
    const ITERS: u64 = 4;
    let mut chip = ChipWorker::new(config)?;
    let mm0 = chip.register_kernel_fn("matmul@0", matmul_kernel(0))?;
    let add3 = chip.register_kernel_fn("add@3", add_kernel(3))?;
    let mul6 = chip.register_kernel_fn("mul@6", mul_kernel(6))?;
    let add0 = chip.register_kernel_fn("add@0", add_kernel(0))?;
    let mul3 = chip.register_kernel_fn("mul@3", mul_kernel(3))?;
    let orch = chip.register_orchestration_fn("mixed_example", move |o, args| {
        let t = |i: usize| args.tensor(i);
        let (a, b, d, e, g, h) = (t(0)?, t(1)?, t(3)?, t(4)?, t(6)?, t(7)?);
        let iters = t(2)?.numel() / V;
        for i in 0..iters {
            let v =
                |k: usize| -> Result<ChipTensor, ChipError> { t(k)?.slice(0, i * V, (i + 1) * V) };
            o.scope(|o| {
                let mut x = CoreArgs::new();
                x.input(&a)
                    .input(&b)
                    .output(&v(2)?)
                    .input(&d)
                    .input(&e)
                    .output(&v(5)?)
                    .input(&g)
                    .input(&h)
                    .output(&v(8)?);
                o.submit(
                    MixedKernels::none()
                        .with_aic(mm0)
                        .with_aiv0(add3)
                        .with_aiv1(mul6),
                    &x,
                )?;
                let mut x = CoreArgs::new();
                x.input(&a).input(&b).output(&v(9)?);
                o.submit_aic(mm0, &x)?;
                let mut x = CoreArgs::new();
                x.input(&d).input(&e).output(&v(10)?);
                o.submit_aiv(add0, &x)?;
                let mut x = CoreArgs::new();
                x.input(&d)
                    .input(&e)
                    .output(&v(11)?)
                    .input(&g)
                    .input(&h)
                    .output(&v(12)?);
                o.submit(MixedKernels::none().with_aiv0(add0).with_aiv1(mul3), &x)?;
                let mut x = CoreArgs::new();
                x.input(&a)
                    .input(&b)
                    .output(&v(13)?)
                    .input(&d)
                    .input(&e)
                    .output(&v(14)?);
                o.submit(MixedKernels::none().with_aic(mm0).with_aiv0(add3), &x)?;
                Ok(())
            })?;
        }
        Ok(())
    })?;
    chip.init()?;
    let mut rng = Rng::new(42);
    let a = rng.randn(128 * 128, 0.01);
    let b = rng.randn(128 * 128, 0.01);
    let d = rng.randn(V as usize, 0.01);
    let e = rng.randn(V as usize, 0.01);
    let g = rng.randn(V as usize, 0.01);
    let h = rng.randn(V as usize, 0.01);
    let n = (ITERS * V) as usize;
    let mut outs: Vec<Vec<f32>> = (0..9).map(|_| vec![0f32; n]).collect();
    let mut rep = WorkloadReport::default();
    {
        let mut args = RunArgs::new();
        args.input(&a, &[V]).input(&b, &[V]);
        let mut it = outs.iter_mut();
        let mut next = || it.next().expect("nine outputs");
        args.output(next(), &[n as u64]);
        args.input(&d, &[V])
            .input(&e, &[V])
            .output(next(), &[n as u64]);
        args.input(&g, &[V])
            .input(&h, &[V])
            .output(next(), &[n as u64]);
        for _ in 0..6 {
            args.output(next(), &[n as u64]);
        }
        timed(
            &mut chip,
            &orch,
            &mut args,
            &CallConfig::default(),
            &mut rep,
        )?;
    }
    let mm: Vec<f32> = host_matmul(&a, &b, 128, 128, 128);
    let add: Vec<f32> = d.iter().zip(&e).map(|(x, y)| x + y).collect();
    let mul: Vec<f32> = g.iter().zip(&h).map(|(x, y)| x * y).collect();
    let rep_n = |v: &Vec<f32>| -> Vec<f32> { (0..ITERS).flat_map(|_| v.iter().copied()).collect() };
    let names = ["C", "F", "I", "J", "K", "L", "M", "N", "O"];
    let goldens = [&mm, &add, &mul, &mm, &add, &add, &mul, &mm, &add];
    for ((name, out), golden) in names.iter().zip(&outs).zip(goldens) {
        check_close(name, out, &rep_n(golden), 1e-3, 1e-3)?;
    }
    chip.close()?;
    Ok(rep)
}
