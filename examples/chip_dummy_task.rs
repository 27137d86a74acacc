//! E6: dependency-only (dummy) tasks, which run no kernel — the scheduler completes them
//! itself — yet order the tasks around them, in the reference's four cases: a dummy between
//! a writer and a reader; four chained dummies; a dummy with explicit dependencies on two
//! writers; 18 dummies fanning out of a writer into a reader that depends on all of them.
//! Each case is one dispatch of one level-2 program with the case number as a scalar
//! argument — the worker is prepared once, and every dispatch runs with two AICPU threads
//! (`CallConfig` per dispatch, `run_with`); results compared exactly.
//!
//! Run with `cargo run --release --example chip_dummy_task` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if a result differs from the host
//! golden.

use std::process::ExitCode;
use strata::prelude::*;

const LEN: u64 = 16;
const UNTOUCHED: f32 = -1.0;
const WRITTEN: f32 = 42.0;

/// Writer, dummies and reader over x, y and w, in the shape of case `case`.
fn dummy_task() -> Program {
    let mut p = Program::new(
        "dummy_task",
        Signature::new()
            .inout("x", DataType::F32, [LEN])
            .inout("y", DataType::F32, [LEN])
            .inout("w", DataType::F32, [LEN])
            .scalar("case", DataType::U32),
    );
    let write = p.kernel("write_const", |ctx| {
        ctx.output::<f32>(0)?.set_flat(0, WRITTEN)?;
        Ok(())
    });
    let copy = p.kernel("copy_first", |ctx| {
        let v = ctx.input::<f32>(0)?.get_flat(0)?;
        ctx.output::<f32>(1)?.set_flat(0, v)?;
        Ok(())
    });
    p.orchestrate_chip(move |o, args| {
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
    });
    p
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let compiled = dummy_task().compile(&Target::chip(ChipConfig::default()))?;
    let untouched = vec![UNTOUCHED; LEN as usize];
    let (x_t, y_t, w_t) = (
        SharedTensor::from_data(&[LEN], &untouched)?,
        SharedTensor::from_data(&[LEN], &untouched)?,
        SharedTensor::from_data(&[LEN], &untouched)?,
    );
    let rt = compiled.prepare(Prepare::new())?;

    let config = CallConfig::default().with_aicpu_threads(2);
    for case in 1..=4u32 {
        for t in [&x_t, &y_t, &w_t] {
            t.write(&untouched)?;
        }
        rt.run_with(&compiled, (&x_t, &y_t, &w_t, case), &config)?;
        let (x, y, w) = (
            x_t.to_vec::<f32>()?,
            y_t.to_vec::<f32>()?,
            w_t.to_vec::<f32>()?,
        );
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
        println!("case {case}: exact");
    }
    rt.close()?;
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
