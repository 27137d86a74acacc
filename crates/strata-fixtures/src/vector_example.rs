//! E2: a small DAG with a nested scope.

use crate::kernels::{add_kernel, add_scalar_kernel, mul_kernel};
use crate::support::{check_close, timed, WorkloadError, WorkloadReport};
use strata_chip::*;
use strata_types::{CallConfig, DataType};

/// E2: a small DAG with a nested scope: `c = a + b` (runtime-created), then in a scope
/// `d = c + 1`, `e = c + 2`, `g = d · e`, `f = g + c`; with a = 2, b = 3 every `f` is 47.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e2_vector_example(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    const N: u64 = 16384;
    let mut chip = ChipWorker::new(config)?;
    let add = chip.register_kernel_fn("add", add_kernel(0))?;
    let add_s = chip.register_kernel_fn("add_scalar", add_scalar_kernel)?;
    let mul = chip.register_kernel_fn("mul", mul_kernel(0))?;
    let orch = chip.register_orchestration_fn("vector_example", move |o, args| {
        let (a, b, f) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let ci = TensorCreateInfo::new(DataType::F32, &[N]);
        let mut t = CoreArgs::new();
        t.input(&a).input(&b).output_new(ci);
        let c = o.submit_aiv(add, &t)?.get(0)?;
        o.scope(|o| {
            let mut t = CoreArgs::new();
            t.input(&c).output_new(ci).scalar(1.0f32).scalar(3u32);
            let d = o.submit_aiv(add_s, &t)?.get(0)?;
            let mut t = CoreArgs::new();
            t.input(&c).output_new(ci).scalar(2.0f32).scalar(3u32);
            let e = o.submit_aiv(add_s, &t)?.get(0)?;
            let mut t = CoreArgs::new();
            t.input(&d).input(&e).output_new(ci);
            let g = o.submit_aiv(mul, &t)?.get(0)?;
            let mut t = CoreArgs::new();
            t.input(&g).input(&c).output(&f);
            o.submit_aiv(add, &t)?;
            Ok(())
        })
    })?;
    chip.init()?;
    let a = vec![2.0f32; N as usize];
    let b = vec![3.0f32; N as usize];
    let mut f = vec![0f32; N as usize];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.input(&a, &[N]).input(&b, &[N]).output(&mut f, &[N]);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    check_close("f", &f, &vec![47.0; N as usize], 1e-5, 1e-5)?;
    chip.close()?;
    Ok(rep)
}
