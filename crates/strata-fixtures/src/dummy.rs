//! E6: dependency-only tasks.

use crate::support::{check_close, timed, WorkloadError, WorkloadReport};
use strata_chip::*;
use strata_types::CallConfig;

/// E6: dependency-only tasks in four cases (a dummy between a writer and a reader; four
/// chained dummies; a dummy with explicit dependencies on two writers; 18 dummies fanning
/// out of a writer into a consumer with 18 explicit dependencies); compared exactly.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e6_dummy_task(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let write = chip.register_kernel_fn("write_const", |ctx| {
        let mut t = ctx.output::<f32>(0)?;
        t.set_flat(0, 42.0)?;
        Ok(())
    })?;
    let copy = chip.register_kernel_fn("copy_first", |ctx| {
        let v = ctx.input::<f32>(0)?.get_flat(0)?;
        ctx.output::<f32>(1)?.set_flat(0, v)?;
        Ok(())
    })?;
    let orch = chip.register_orchestration_fn("dummy_task", move |o, args| {
        let (x, y, w) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let case: u32 = args.scalar(0)?;
        let mut wx = CoreArgs::new();
        wx.inout(&x);
        let mut cp = CoreArgs::new();
        cp.input(&x).inout(&y);
        match case {
            1 => {
                o.submit_aic(write, &wx)?;
                o.submit_dummy(CoreArgs::new().inout(&x))?;
                o.submit_aic(copy, &cp)?;
            }
            2 => {
                o.submit_aic(write, &wx)?;
                for _ in 0..4 {
                    o.submit_dummy(CoreArgs::new().inout(&x))?;
                }
                o.submit_aic(copy, &cp)?;
            }
            3 => {
                let a = o.submit_aic(write, &wx)?.task_id();
                let b = o.submit_aic(write, CoreArgs::new().inout(&w))?.task_id();
                let d = o.submit_dummy(CoreArgs::new().dep(a).dep(b))?.task_id();
                o.submit_aic(copy, cp.clone().dep(d))?;
            }
            _ => {
                let a = o.submit_aic(write, &wx)?.task_id();
                let mut consumer = cp.clone();
                for _ in 0..18 {
                    let d = o.submit_dummy(CoreArgs::new().dep(a))?.task_id();
                    consumer.dep(d);
                }
                o.submit_aic(copy, &consumer)?;
            }
        }
        Ok(())
    })?;
    let cfg = CallConfig::default().with_aicpu_threads(2);
    chip.init()?;
    let mut rep = WorkloadReport::default();
    for case in 1..=4u32 {
        let (mut x, mut y, mut w) = (vec![-1f32; 16], vec![-1f32; 16], vec![-1f32; 16]);
        let mut args = RunArgs::new();
        args.inout(&mut x, &[16])
            .inout(&mut y, &[16])
            .inout(&mut w, &[16])
            .scalar(case);
        timed(&mut chip, &orch, &mut args, &cfg, &mut rep)?;
        let mut gx = vec![-1f32; 16];
        gx[0] = 42.0;
        let mut gw = vec![-1f32; 16];
        if case == 3 {
            gw[0] = 42.0;
        }
        check_close(&format!("case {case} x"), &x, &gx, 0.0, 0.0)?;
        check_close(&format!("case {case} y"), &y, &gx, 0.0, 0.0)?;
        check_close(&format!("case {case} w"), &w, &gw, 0.0, 0.0)?;
    }
    chip.close()?;
    Ok(rep)
}
