//! E6: dependency-only (dummy) tasks, which run no kernel — the scheduler completes them
//! itself — yet order the tasks around them, in the reference's four cases: a dummy between
//! a writer and a reader; four chained dummies; a dummy with explicit dependencies on two
//! writers; 18 dummies fanning out of a writer into a reader that depends on all of them.
//! Each case is one run with its number as a scalar argument; results compared exactly.
//!
//! Run with `cargo run --release --example chip_dummy_task` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if a result differs from the host
//! golden.

use std::error::Error;
use std::process::ExitCode;
use strata::chip::{ChipConfig, ChipWorker, CoreArgs, RunArgs};
use strata::types::CallConfig;

const LEN: u64 = 16;
const UNTOUCHED: f32 = -1.0;
const WRITTEN: f32 = 42.0;

fn run() -> Result<String, Box<dyn Error>> {
    let mut chip = ChipWorker::new(ChipConfig::default())?;
    let write = chip.register_kernel_fn("write_const", |ctx| {
        ctx.output::<f32>(0)?.set_flat(0, WRITTEN)?;
        Ok(())
    })?;
    let copy = chip.register_kernel_fn("copy_first", |ctx| {
        let v = ctx.input::<f32>(0)?.get_flat(0)?;
        ctx.output::<f32>(1)?.set_flat(0, v)?;
        Ok(())
    })?;
    let orch = chip.register_orchestration_fn("dummy_task", move |o, args| {
        let (x, y, w) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let mut write_x = CoreArgs::new();
        write_x.inout(&x);
        let mut copy_x_to_y = CoreArgs::new();
        copy_x_to_y.input(&x).inout(&y);
        match args.scalar::<u32>(0)? {
            // The dummy touches x, so the copy waits for it, and it for the writer.
            1 => {
                o.submit_aic(write, &write_x)?;
                o.submit_dummy(CoreArgs::new().inout(&x))?;
                o.submit_aic(copy, &copy_x_to_y)?;
            }
            2 => {
                o.submit_aic(write, &write_x)?;
                for _ in 0..4 {
                    o.submit_dummy(CoreArgs::new().inout(&x))?;
                }
                o.submit_aic(copy, &copy_x_to_y)?;
            }
            // Explicit dependencies: the dummy joins two writers, the copy follows it.
            3 => {
                let a = o.submit_aic(write, &write_x)?.task_id();
                let b = o.submit_aic(write, CoreArgs::new().inout(&w))?.task_id();
                let join = o.submit_dummy(CoreArgs::new().dep(a).dep(b))?.task_id();
                o.submit_aic(copy, copy_x_to_y.clone().dep(join))?;
            }
            _ => {
                let a = o.submit_aic(write, &write_x)?.task_id();
                let mut reader = copy_x_to_y.clone();
                for _ in 0..18 {
                    let d = o.submit_dummy(CoreArgs::new().dep(a))?.task_id();
                    reader.dep(d);
                }
                o.submit_aic(copy, &reader)?;
            }
        }
        Ok(())
    })?;
    chip.init()?;

    let config = CallConfig::default().with_aicpu_threads(2);
    for case in 1..=4u32 {
        let mut x = vec![UNTOUCHED; LEN as usize];
        let mut y = x.clone();
        let mut w = x.clone();
        let mut args = RunArgs::new();
        args.inout(&mut x, &[LEN])
            .inout(&mut y, &[LEN])
            .inout(&mut w, &[LEN])
            .scalar(case);
        let report = chip.run(&orch, &mut args, &config)?;
        // The writer sets x[0], the copy y[0]; only case 3 also writes w[0].
        let mut golden = vec![UNTOUCHED; LEN as usize];
        golden[0] = WRITTEN;
        let golden_w = if case == 3 {
            golden.clone()
        } else {
            vec![UNTOUCHED; LEN as usize]
        };
        if x != golden || y != golden || w != golden_w {
            return Err(format!("case {case}: x {x:?}, y {y:?}, w {w:?}").into());
        }
        println!("case {case}: {:>2} tasks, exact", report.tasks);
    }
    chip.close()?;
    Ok("ok: dependency-only tasks, 4 cases exact".into())
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_dummy_task: {e}");
            ExitCode::FAILURE
        }
    }
}
