//! E7: orchestration data access.

use crate::kernels::add_kernel;
use crate::support::{check_close, timed, WorkloadError, WorkloadReport};
use strata_chip::*;
use strata_types::{CallConfig, DataType};

/// E7: orchestration data access — `get_tensor_data` / `set_tensor_data` on external and
/// runtime tensors, `alloc_tensors` with an initial value, INOUT re-registration,
/// orchestration→kernel read-after-write, write-after-read/write-after-write waits on a
/// runtime tensor, and an external write-after-read through `output(b)`.
/// Golden: result = a + b, check = `[2, 102, 77, 77, 79, 42, 12, 88, 55]`.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e7_scalar_data(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    const N: u64 = 16384;
    let mut chip = ChipWorker::new(config)?;
    let add = chip.register_kernel_fn("add", add_kernel(0))?;
    let add_io = chip.register_kernel_fn("add_inout", |ctx| {
        let x = ctx.input::<f32>(1)?;
        let mut acc = ctx.output::<f32>(0)?;
        let xs = x.as_slice().ok_or("x must be contiguous")?;
        for (o, v) in acc
            .as_mut_slice()
            .ok_or("acc must be contiguous")?
            .iter_mut()
            .zip(xs)
        {
            *o += v;
        }
        Ok(())
    })?;
    let noop = chip.register_kernel_fn("noop", |_| Ok(()))?;
    let orch = chip.register_orchestration_fn("scalar_data", move |o, args| {
        let (a, b, result, check) = (
            args.tensor(0)?,
            args.tensor(1)?,
            args.tensor(2)?,
            args.tensor(3)?,
        );
        let ci = TensorCreateInfo::new(DataType::F32, &[N]);
        let mut vals = [0f32; 9];
        // 1. kernel c = a + b (runtime-created c).
        let c = o
            .submit_aiv(add, CoreArgs::new().input(&a).input(&b).output_new(ci))?
            .get(0)?;
        // 2. read an external input (no producer).
        vals[0] = o.get_tensor_data(&a, &[0])?;
        // 3. read a kernel output: waits for the producer.
        vals[1] = o.get_tensor_data(&c, &[100])?;
        // 4. alloc_tensors with an initial value.
        let s = o.alloc_tensors(&[ci.with_initial_value(77.0f32)])?.get(0)?;
        vals[2] = o.get_tensor_data(&s, &[0])?;
        // 5. a task that touches nothing does not disturb it.
        o.submit_aiv(noop, &CoreArgs::new())?;
        vals[3] = o.get_tensor_data(&s, &[10])?;
        // 6. a kernel reads the allocated tensor: s2 = s + a.
        let s2 = o
            .submit_aiv(add, CoreArgs::new().input(&s).input(&a).output_new(ci))?
            .get(0)?;
        vals[4] = o.get_tensor_data(&s2, &[0])?;
        // 7. write a kernel output after its producer (and readers) finished.
        o.set_tensor_data(&c, &[5], 42.0f32)?;
        vals[5] = o.get_tensor_data(&c, &[5])?;
        // 8. INOUT re-registration: v = 10, then v += a through an INOUT task.
        let v = o.alloc_tensors(&[ci.with_initial_value(10.0f32)])?.get(0)?;
        o.submit_aiv(add_io, CoreArgs::new().inout(&v).input(&a))?;
        vals[6] = o.get_tensor_data(&v, &[0])?;
        // 9. WAW + WAR: writing v waits for the INOUT task.
        o.submit_aiv(add_io, CoreArgs::new().inout(&v).input(&a))?;
        o.set_tensor_data(&v, &[1], 88.0f32)?;
        vals[7] = o.get_tensor_data(&v, &[1])?;
        // 10. result = a + b reads b; then b is overwritten (external write-after-read).
        o.submit_aiv(add, CoreArgs::new().input(&a).input(&b).output(&result))?;
        let w = o.alloc_tensors(&[ci.with_initial_value(53.0f32)])?.get(0)?;
        o.submit_aiv(add, CoreArgs::new().input(&a).input(&w).output(&b))?;
        // 11. read the overwritten external tensor.
        vals[8] = o.get_tensor_data(&b, &[0])?;
        // 12–13. publish the observed values.
        for (i, val) in vals.iter().enumerate() {
            o.set_tensor_data(&check, &[i as u64], *val)?;
        }
        Ok(())
    })?;
    chip.init()?;
    let a = vec![2.0f32; N as usize];
    let b: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let mut result = vec![0f32; N as usize];
    let mut check = vec![0f32; 9];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.input(&a, &[N])
        .input(&b, &[N])
        .output(&mut result, &[N])
        .output(&mut check, &[9]);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    let golden: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    check_close("result", &result, &golden, 1e-5, 1e-5)?;
    check_close(
        "check",
        &check,
        &[2.0, 102.0, 77.0, 77.0, 79.0, 42.0, 12.0, 88.0, 55.0],
        0.0,
        0.0,
    )?;
    chip.close()?;
    Ok(rep)
}
