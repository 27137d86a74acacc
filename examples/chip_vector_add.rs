//! E1 (reference/chip.md §8): one AIV task `out = a + b` over 128×128 f32 on the default
//! chip (one cluster), checked against the sum computed on the host; prints the run's
//! [STRACE] span tree.
//!
//! The whole life of a chip: create it, register a kernel and an orchestration (with its
//! parameter signature), `init`, `run` with host buffers, `close`.
//!
//! Run with `cargo run --release --example chip_vector_add` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the host
//! golden.

use std::error::Error;
use std::process::ExitCode;
use strata::chip::{span_tree, ChipConfig, ChipWorker, CoreArgs, KernelCtx, RunArgs};
use strata::types::{CallConfig, CallableDescriptor, CallableKind, CallbackResult, ParamDirection};

const ROWS: u64 = 128;
const COLS: u64 = 128;

/// The kernel: `out(2) = a(0) + b(1)`, element-wise over contiguous tensors.
fn vector_add(ctx: &mut KernelCtx<'_>) -> CallbackResult {
    let a = ctx.input::<f32>(0)?;
    let b = ctx.input::<f32>(1)?;
    let mut out = ctx.output::<f32>(2)?;
    let a = a.as_slice().ok_or("a must be contiguous")?;
    let b = b.as_slice().ok_or("b must be contiguous")?;
    let out = out.as_mut_slice().ok_or("out must be contiguous")?;
    if a.len() != out.len() || b.len() != out.len() {
        return Err("a, b and out differ in length".into());
    }
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
    Ok(())
}

fn run() -> Result<String, Box<dyn Error>> {
    let mut chip = ChipWorker::new(ChipConfig::default())?;
    let add = chip.register_kernel_fn("vector_add", vector_add)?;
    // The signature lets `run` check the arguments' directions before anything runs.
    let orch =
        chip.register_orchestration(
            CallableDescriptor::new(CallableKind::ChipOrchestration, "vector_add")
                .with_signature(&[ParamDirection::In, ParamDirection::In, ParamDirection::Out]),
            move |o, args| {
                let mut task = CoreArgs::new();
                task.input(&args.tensor(0)?)
                    .input(&args.tensor(1)?)
                    .output(&args.tensor(2)?);
                o.submit_aiv(add, &task)?;
                Ok(())
            },
        )?;
    chip.init()?;

    let n = (ROWS * COLS) as usize;
    let a: Vec<f32> = (0..n).map(|i| (i % 251) as f32 * 0.5 - 60.0).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 127) as f32 * 0.25).collect();
    let mut out = vec![0f32; n];
    let mut args = RunArgs::new();
    args.input(&a, &[ROWS, COLS])
        .input(&b, &[ROWS, COLS])
        .output(&mut out, &[ROWS, COLS]);
    let report = chip.run(&orch, &mut args, &CallConfig::default())?;
    chip.close()?;

    for tree in span_tree(&report.spans()) {
        print!("{}", tree.render());
    }
    let golden: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    if let Some(i) = (0..n).find(|&i| out[i] != golden[i]) {
        return Err(format!("out[{i}] = {}, the host golden is {}", out[i], golden[i]).into());
    }
    Ok(format!(
        "ok: vector_add {ROWS}x{COLS} matches the host golden ({} task)",
        report.tasks
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_vector_add: {e}");
            ExitCode::FAILURE
        }
    }
}
