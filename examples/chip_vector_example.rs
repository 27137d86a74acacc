//! E2: a small DAG with a nested scope. `c = a + b` is a tensor the runtime creates; inside
//! a scope `d = c + 1`, `e = c + 2`, `g = d · e`, `f = g + c`. The chip infers every
//! dependency from the tensors' tags; with a = 2 and b = 3, every element of f is
//! (5 + 1)(5 + 2) + 5 = 47.
//!
//! Written as a level-2 program — a signature and the chip orchestration that builds the
//! DAG — compiled for one chip and run once with host tensors in shared memory.
//!
//! Run with `cargo run --release --example chip_vector_example` (or `cargo xtask sim`).
//! Prints a final line starting with `ok:` and exits non-zero if f differs from the host
//! golden.

use std::process::ExitCode;
use strata::chip::TensorCreateInfo;
use strata::prelude::*;
use strata::types::CallbackResult;

const N: u64 = 16384;

/// `out(2) = op(x(0), y(1))` element-wise over contiguous f32 tensors.
fn elementwise(ctx: &mut KernelCtx<'_>, op: fn(f32, f32) -> f32) -> CallbackResult {
    let x = ctx.input::<f32>(0)?;
    let y = ctx.input::<f32>(1)?;
    let mut out = ctx.output::<f32>(2)?;
    let (Some(x), Some(y), Some(out)) = (x.as_slice(), y.as_slice(), out.as_mut_slice()) else {
        return Err("contiguous tensors expected".into());
    };
    for ((o, a), b) in out.iter_mut().zip(x).zip(y) {
        *o = op(*a, *b);
    }
    Ok(())
}

/// `f = (c + 1)(c + 2) + c` with `c = a + b`, five tasks on one chip.
fn vector_example() -> Program {
    let mut p = Program::new(
        "vector_example",
        Signature::new()
            .input("a", DataType::F32, [N])
            .input("b", DataType::F32, [N])
            .output("f", DataType::F32, [N]),
    );
    let add = p.kernel("add", |ctx| elementwise(ctx, |a, b| a + b));
    let mul = p.kernel("mul", |ctx| elementwise(ctx, |a, b| a * b));
    // `out(1) = x(0) + s`, with the f32 scalar s as the task's first scalar.
    let add_scalar = p.kernel("add_scalar", |ctx| {
        let s: f32 = ctx.scalar(0)?;
        let x = ctx.input::<f32>(0)?;
        let mut out = ctx.output::<f32>(1)?;
        let x = x.as_slice().ok_or("x must be contiguous")?;
        let out = out.as_mut_slice().ok_or("out must be contiguous")?;
        for (o, v) in out.iter_mut().zip(x) {
            *o = v + s;
        }
        Ok(())
    });
    p.orchestrate_chip(move |o, args| {
        let (a, b, f) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let vector = TensorCreateInfo::new(DataType::F32, &[N]);
        let c = o
            .submit_aiv(add, CoreArgs::new().input(&a).input(&b).output_new(vector))?
            .get(0)?;
        // Tensors created inside the scope are released when it ends.
        o.scope(|o| {
            let d = o
                .submit_aiv(
                    add_scalar,
                    CoreArgs::new().input(&c).output_new(vector).scalar(1.0f32),
                )?
                .get(0)?;
            let e = o
                .submit_aiv(
                    add_scalar,
                    CoreArgs::new().input(&c).output_new(vector).scalar(2.0f32),
                )?
                .get(0)?;
            let g = o
                .submit_aiv(mul, CoreArgs::new().input(&d).input(&e).output_new(vector))?
                .get(0)?;
            o.submit_aiv(add, CoreArgs::new().input(&g).input(&c).output(&f))?;
            Ok(())
        })
    });
    p
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let compiled = vector_example().compile(&Target::chip(ChipConfig::default()))?;
    let a = vec![2.0f32; N as usize];
    let b = vec![3.0f32; N as usize];
    let (a_t, b_t) = (
        SharedTensor::from_data(&[N], &a)?,
        SharedTensor::from_data(&[N], &b)?,
    );
    let f_t = SharedTensor::zeroed(&[N], DataType::F32)?;
    compiled.run_once((&a_t, &b_t, &f_t))?;

    let f = f_t.to_vec::<f32>()?;
    let golden: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(a, b)| {
            let c = a + b;
            (c + 1.0) * (c + 2.0) + c
        })
        .collect();
    if let Some(i) = (0..N as usize).find(|&i| f[i] != golden[i]) {
        return Err(format!("f[{i}] = {}, the host golden is {}", f[i], golden[i]).into());
    }
    Ok("ok: f == 47.0 everywhere (5 tasks, nested scope)".into())
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_vector_example: {e}");
            ExitCode::FAILURE
        }
    }
}
