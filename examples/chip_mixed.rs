//! E4: the five task shapes on a two-cluster chip — MIX AIC+AIV0+AIV1, AIC alone, AIV
//! alone, AIV0+AIV1, AIC+AIV0 — over four iterations, each in its own scope, every task
//! writing the iteration's slice of its output tensors. The kernels of a MIX task share
//! one argument list; each reads its own three arguments from an offset (`base`). Checked
//! against a matmul, an add and a multiply on the host.
//!
//! Run with `cargo run --release --example chip_mixed` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if a result differs from the host
//! golden.

use std::error::Error;
use std::process::ExitCode;
use strata::chip::{
    ChipConfig, ChipTensor, ChipWorker, CoreArgs, KernelCtx, MixedKernels, RunArgs,
};
use strata::types::{CallConfig, CallbackResult};

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

fn run() -> Result<String, Box<dyn Error>> {
    let mut chip = ChipWorker::new(ChipConfig::clusters(2))?;
    let mm0 = chip.register_kernel_fn("matmul@0", matmul(0))?;
    let add3 = chip.register_kernel_fn("add@3", elementwise(3, |a, b| a + b))?;
    let mul6 = chip.register_kernel_fn("mul@6", elementwise(6, |a, b| a * b))?;
    let add0 = chip.register_kernel_fn("add@0", elementwise(0, |a, b| a + b))?;
    let mul3 = chip.register_kernel_fn("mul@3", elementwise(3, |a, b| a * b))?;
    // Arguments: a, b, C, d, e, F, g, h, I, J, K, L, M, N, O (C and after: ITERS·V each).
    let orch = chip.register_orchestration_fn("mixed_example", move |o, args| {
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
    })?;
    chip.init()?;

    let (a, b) = (inputs(1, V), inputs(2, V));
    let (d, e, g, h) = (inputs(3, V), inputs(4, V), inputs(5, V), inputs(6, V));
    let len = ITERS * V;
    let mut outs: Vec<Vec<f32>> = (0..9).map(|_| vec![0f32; len as usize]).collect();
    let tasks = {
        let mut args = RunArgs::new();
        let mut out = outs.iter_mut();
        let mut next = || out.next().expect("nine outputs");
        args.input(&a, &[M, M])
            .input(&b, &[M, M])
            .output(next(), &[len]);
        args.input(&d, &[V]).input(&e, &[V]).output(next(), &[len]);
        args.input(&g, &[V]).input(&h, &[V]).output(next(), &[len]);
        for _ in 0..6 {
            args.output(next(), &[len]);
        }
        chip.run(&orch, &mut args, &CallConfig::default())?.tasks
    };
    chip.close()?;

    let mut mm = vec![0f32; V as usize];
    host_matmul_into(&a, &b, &mut mm, M as usize, M as usize, M as usize);
    let add: Vec<f32> = d.iter().zip(&e).map(|(x, y)| x + y).collect();
    let mul: Vec<f32> = g.iter().zip(&h).map(|(x, y)| x * y).collect();
    let goldens = [&mm, &add, &mul, &mm, &add, &add, &mul, &mm, &add];
    for ((name, out), golden) in ["C", "F", "I", "J", "K", "L", "M", "N", "O"]
        .iter()
        .zip(&outs)
        .zip(goldens)
    {
        for (i, got) in out.iter().enumerate() {
            let want = golden[i % V as usize];
            if (got - want).abs() > 1e-6 + 1e-4 * want.abs() {
                return Err(format!("{name}[{i}] = {got}, the host golden is {want}").into());
            }
        }
    }
    Ok(format!(
        "ok: mixed-shape tasks match the host goldens ({tasks} tasks)"
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
