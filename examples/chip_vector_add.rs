//! E1 (reference/chip.md §8): one AIV task `out = a + b` over 128×128 f32 on the default
//! chip (one cluster), checked against the sum computed on the host.
//!
//! The whole life of a level-2 program: a signature (`a`, `b` in, `out` out — the
//! arguments are checked against it before anything runs), a kernel, the chip
//! orchestration that submits it, `compile` for one chip, and `run_once` with host tensors
//! in shared memory. The chip is configured with `print_strace`, so the run prints its
//! `[STRACE]` lines on stderr, as the reference's host runtime does. (The rendered span
//! tree, `span_tree(&report.spans())`, needs the run report, which only the raw
//! `strata::chip::ChipWorker::run` returns; a dispatch through a program returns `()`.)
//!
//! Run with `cargo run --release --example chip_vector_add` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the host
//! golden.

use std::process::ExitCode;
use strata::prelude::*;
use strata::types::CallbackResult;

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

/// `out = a + b` on one chip: one AIV task.
fn vector_add_program() -> Program {
    let mut p = Program::new(
        "vector_add",
        Signature::new()
            .input("a", DataType::F32, [ROWS, COLS])
            .input("b", DataType::F32, [ROWS, COLS])
            .output("out", DataType::F32, [ROWS, COLS]),
    );
    let add = p.kernel("vector_add", vector_add);
    p.orchestrate_chip(move |o, args| {
        o.submit_aiv(
            add,
            CoreArgs::new()
                .input(&args.tensor(0)?)
                .input(&args.tensor(1)?)
                .output(&args.tensor(2)?),
        )?;
        Ok(())
    });
    p
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let target = Target::chip(ChipConfig {
        print_strace: true,
        ..ChipConfig::default()
    });
    let compiled = vector_add_program().compile(&target)?;

    let n = (ROWS * COLS) as usize;
    let a: Vec<f32> = (0..n).map(|i| (i % 251) as f32 * 0.5 - 60.0).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 127) as f32 * 0.25).collect();
    let a_t = SharedTensor::from_data(&[ROWS, COLS], &a)?;
    let b_t = SharedTensor::from_data(&[ROWS, COLS], &b)?;
    let out_t = SharedTensor::zeroed(&[ROWS, COLS], DataType::F32)?;
    compiled.run_once((&a_t, &b_t, &out_t))?;

    let out = out_t.to_vec::<f32>()?;
    let golden: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    if let Some(i) = (0..n).find(|&i| out[i] != golden[i]) {
        return Err(format!("out[{i}] = {}, the host golden is {}", out[i], golden[i]).into());
    }
    Ok(format!(
        "ok: vector_add {ROWS}x{COLS} matches the host golden (1 task)"
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
