//! E4: the five task shapes on a two-cluster chip — MIX AIC+AIV0+AIV1, AIC alone, AIV
//! alone, AIV0+AIV1, AIC+AIV0 — over four iterations, each in its own scope, every task
//! writing the iteration's slice of its output tensors. The kernels of a MIX task share
//! one argument list; each reads its own three arguments from an offset (`base`). Checked
//! against a matmul, an add and a multiply on the host.
//!
//! A level-2 program of fifteen parameters (six inputs, nine outputs), run once; with more
//! arguments than a tuple holds, the dispatch's arguments are a `Vec<Arg>`.
//!
//! Run with `cargo run --release --example chip_mixed` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if a result differs from the host
//! golden.

use std::process::ExitCode;
use strata::chip::{ChipTensor, MixedKernels};
use strata::prelude::*;
use strata::types::CallbackResult;
use strata::Arg;

/// The matrices are M×M; every vector (and every output slice) has M·M elements.
const M: u64 = 64;
const V: u64 = M * M;
const ITERS: u64 = 4;

type Kernel = Box<dyn Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync>;

/// `out(base+2) = op(x(base), y(base+1))` element-wise.
fn elementwise(base: usize, op: fn(f32, f32) -> f32) -> Kernel {
    Box::new(move |ctx| {
        let x = ctx.input::<f32>(base)?;
        let y = ctx.input::<f32>(base + 1)?;
        let mut out = ctx.output::<f32>(base + 2)?;
        let (Some(x), Some(y), Some(out)) = (x.as_slice(), y.as_slice(), out.as_mut_slice()) else {
            return Err("contiguous tensors expected".into());
        };
        for ((o, a), b) in out.iter_mut().zip(x).zip(y) {
            *o = op(*a, *b);
        }
        Ok(())
    })
}

/// `C(base+2) = A(base) @ B(base+1)` for 2-D A and B; C is written flat.
fn matmul(base: usize) -> Kernel {
    Box::new(move |ctx| {
        let a = ctx.input::<f32>(base)?;
        let b = ctx.input::<f32>(base + 1)?;
        let mut c = ctx.output::<f32>(base + 2)?;
        let (&[m, k], &[k2, n]) = (a.shape(), b.shape()) else {
            return Err("A and B must be 2-D".into());
        };
        let (m, k, n) = (m as usize, k as usize, n as usize);
        let (Some(a), Some(b), Some(c)) = (a.as_slice(), b.as_slice(), c.as_mut_slice()) else {
            return Err("contiguous tensors expected".into());
        };
        if k != k2 as usize || c.len() != m * n {
            return Err("shape mismatch".into());
        }
        host_matmul_into(a, b, c, m, k, n);
        Ok(())
    })
}

fn host_matmul_into(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
    c.fill(0.0);
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p];
            for (o, y) in c[i * n..(i + 1) * n].iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *o += x * y;
            }
        }
    }
}

/// Deterministic inputs in [-0.01, 0.01).
fn inputs(seed: u64, n: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
        })
        .collect()
}

/// The nine outputs, in parameter order after their inputs.
const OUTPUTS: [&str; 9] = ["C", "F", "I", "J", "K", "L", "M", "N", "O"];

/// Arguments: a, b, C, d, e, F, g, h, I, J, K, L, M, N, O (C and after: ITERS·V each).
fn mixed_example() -> Program {
    let len = ITERS * V;
    let out = |sig: Signature, name: &'static str| sig.output(name, DataType::F32, [len]);
    let mut sig =
        Signature::new()
            .input("a", DataType::F32, [M, M])
            .input("b", DataType::F32, [M, M]);
    sig = out(sig, "C")
        .input("d", DataType::F32, [V])
        .input("e", DataType::F32, [V]);
    sig = out(sig, "F")
        .input("g", DataType::F32, [V])
        .input("h", DataType::F32, [V]);
    for name in &OUTPUTS[2..] {
        sig = out(sig, name);
    }
    let mut p = Program::new("mixed_example", sig);
    let mm0 = p.kernel("matmul@0", matmul(0));
    let add3 = p.kernel("add@3", elementwise(3, |a, b| a + b));
    let mul6 = p.kernel("mul@6", elementwise(6, |a, b| a * b));
    let add0 = p.kernel("add@0", elementwise(0, |a, b| a + b));
    let mul3 = p.kernel("mul@3", elementwise(3, |a, b| a * b));
    p.orchestrate_chip(move |o, args| {
        let t = |i: usize| args.tensor(i);
        let (a, b, d, e, g, h) = (t(0)?, t(1)?, t(3)?, t(4)?, t(6)?, t(7)?);
        for i in 0..ITERS {
            let slice = |k: usize| -> Result<ChipTensor, _> { t(k)?.slice(0, i * V, (i + 1) * V) };
            o.scope(|o| {
                // MIX: C = a @ b on the AIC, F = d + e on AIV0, I = g · h on AIV1.
                let mut x = CoreArgs::new();
                x.input(&a).input(&b).output(&slice(2)?);
                x.input(&d).input(&e).output(&slice(5)?);
                x.input(&g).input(&h).output(&slice(8)?);
                let mix = MixedKernels::none()
                    .with_aic(mm0)
                    .with_aiv0(add3)
                    .with_aiv1(mul6);
                o.submit(mix, &x)?;
                // AIC alone: J = a @ b.
                o.submit_aic(mm0, CoreArgs::new().input(&a).input(&b).output(&slice(9)?))?;
                // AIV alone: K = d + e.
                o.submit_aiv(
                    add0,
                    CoreArgs::new().input(&d).input(&e).output(&slice(10)?),
                )?;
                // AIV0 + AIV1: L = d + e, M = g · h.
                let mut x = CoreArgs::new();
                x.input(&d).input(&e).output(&slice(11)?);
                x.input(&g).input(&h).output(&slice(12)?);
                o.submit(MixedKernels::none().with_aiv0(add0).with_aiv1(mul3), &x)?;
                // AIC + AIV0: N = a @ b, O = d + e.
                let mut x = CoreArgs::new();
                x.input(&a).input(&b).output(&slice(13)?);
                x.input(&d).input(&e).output(&slice(14)?);
                o.submit(MixedKernels::none().with_aic(mm0).with_aiv0(add3), &x)?;
                Ok(())
            })?;
        }
        Ok(())
    });
    p
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let compiled = mixed_example().compile(&Target::chip(ChipConfig::clusters(2)))?;
    let (a, b) = (inputs(1, V), inputs(2, V));
    let (d, e, g, h) = (inputs(3, V), inputs(4, V), inputs(5, V), inputs(6, V));
    let len = ITERS * V;
    let shared = |shape: &[u64], data: &[f32]| SharedTensor::from_data(shape, data);
    let ins = [
        shared(&[M, M], &a)?,
        shared(&[M, M], &b)?,
        shared(&[V], &d)?,
        shared(&[V], &e)?,
        shared(&[V], &g)?,
        shared(&[V], &h)?,
    ];
    let outs: Vec<SharedTensor> = (0..OUTPUTS.len())
        .map(|_| SharedTensor::zeroed(&[len], DataType::F32))
        .collect::<Result<_, _>>()?;
    // In parameter order: a, b, C, d, e, F, g, h, I, then J..O.
    let mut args: Vec<Arg> = Vec::new();
    for k in 0..3 {
        args.extend([
            Arg::from(&ins[2 * k]),
            Arg::from(&ins[2 * k + 1]),
            Arg::from(&outs[k]),
        ]);
    }
    args.extend(outs[3..].iter().map(Arg::from));
    compiled.run_once(args)?;

    let mut mm = vec![0f32; V as usize];
    host_matmul_into(&a, &b, &mut mm, M as usize, M as usize, M as usize);
    let add: Vec<f32> = d.iter().zip(&e).map(|(x, y)| x + y).collect();
    let mul: Vec<f32> = g.iter().zip(&h).map(|(x, y)| x * y).collect();
    let goldens = [&mm, &add, &mul, &mm, &add, &add, &mul, &mm, &add];
    for ((name, out), golden) in OUTPUTS.iter().zip(&outs).zip(goldens) {
        for (i, got) in out.to_vec::<f32>()?.iter().enumerate() {
            let want = golden[i % V as usize];
            if (got - want).abs() > 1e-6 + 1e-4 * want.abs() {
                return Err(format!("{name}[{i}] = {got}, the host golden is {want}").into());
            }
        }
    }
    // Five tasks per iteration.
    Ok(format!(
        "ok: mixed-shape tasks match the host goldens ({} tasks)",
        5 * ITERS
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_mixed: {e}");
            ExitCode::FAILURE
        }
    }
}
