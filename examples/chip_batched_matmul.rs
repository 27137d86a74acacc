//! A batched tiled matmul `C[b] = A[b] @ B[b]` (3 × 128×128, 32×32 tiles): per output
//! tile and k-step an AIC task multiplies two tile views into a partial product the
//! runtime creates, and an AIV task accumulates it into the INOUT tile view of C — 384
//! tasks whose independence comes only from the disjoint windows they touch. Checked
//! against a matmul on the host.
//!
//! A level-2 program: its signature gives A and B as inputs and C as INOUT, each
//! `[3, 128, 128]`; it is prepared once on a two-cluster chip and dispatched with `call`.
//!
//! Run with `cargo run --release --example chip_batched_matmul` (or `cargo xtask sim`).
//! Prints a final line starting with `ok:` and exits non-zero if the result differs from
//! the host golden.

use std::process::ExitCode;
use std::time::Instant;
use strata::chip::{ChipTensor, TensorCreateInfo};
use strata::prelude::*;

const BATCH: u64 = 3;
const N: u64 = 128;
const TILE: u64 = 32;

/// The last two axes of a shape (a tile window keeps its unit batch axis).
fn matrix_dims(shape: &[u64]) -> Option<(usize, usize)> {
    match shape {
        [.., rows, cols] => Some((*rows as usize, *cols as usize)),
        _ => None,
    }
}

/// Deterministic inputs in [-0.1, 0.1).
fn inputs(seed: u64, n: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
        })
        .collect()
}

/// `C[b] += A[b] @ B[b]`, tile by tile.
fn batched_matmul() -> Program {
    let shape = [BATCH, N, N];
    let mut p = Program::new(
        "batched_matmul",
        Signature::new()
            .input("a", DataType::F32, shape)
            .input("b", DataType::F32, shape)
            .inout("c", DataType::F32, shape),
    );
    // P(2) = A(0) @ B(1); A and B are strided tile windows, P a fresh contiguous tile.
    let tile_matmul = p.kernel("tile_matmul", |ctx| {
        let a = ctx.input::<f32>(0)?;
        let b = ctx.input::<f32>(1)?;
        let mut p = ctx.output::<f32>(2)?;
        let (m, k) = matrix_dims(a.shape()).ok_or("A must be a matrix")?;
        let (k2, n) = matrix_dims(b.shape()).ok_or("B must be a matrix")?;
        if k != k2 || p.numel() != m * n {
            return Err(format!("{m}x{k} @ {k2}x{n} does not fit P").into());
        }
        let (a, b) = (a.to_vec(), b.to_vec()); // gathers the strided windows
        let p = p.as_mut_slice().ok_or("P must be contiguous")?;
        p.fill(0.0);
        for i in 0..m {
            for q in 0..k {
                let x = a[i * k + q];
                for (o, y) in p[i * n..(i + 1) * n].iter_mut().zip(&b[q * n..(q + 1) * n]) {
                    *o += x * y;
                }
            }
        }
        Ok(())
    });
    // C(1) += P(0), C a strided tile window written run by run.
    let tile_accumulate = p.kernel("tile_accumulate", |ctx| {
        let p = ctx.input::<f32>(0)?;
        let mut c = ctx.output::<f32>(1)?;
        let p = p.as_slice().ok_or("P must be contiguous")?;
        let mut at = 0;
        for run in c.runs_mut().ok_or("the C tile overlaps itself")? {
            for (o, v) in run.iter_mut().zip(&p[at..]) {
                *o += v;
            }
            at += run.len();
        }
        Ok(())
    });
    p.orchestrate_chip(move |o, args| {
        let (a, b, c) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let tiles = N / TILE;
        let partial = TensorCreateInfo::new(DataType::F32, &[TILE, TILE]);
        let tile = |t: ChipTensor, batch: u64, row: u64, col: u64| {
            t.window(&[batch, row * TILE, col * TILE], &[1, TILE, TILE])
        };
        for bi in 0..BATCH {
            for i in 0..tiles {
                for j in 0..tiles {
                    let c_tile = tile(c, bi, i, j)?;
                    // Each output tile's partial products are released with its scope.
                    o.scope(|o| {
                        for k in 0..tiles {
                            let mut x = CoreArgs::new();
                            x.input(&tile(a, bi, i, k)?)
                                .input(&tile(b, bi, k, j)?)
                                .output_new(partial);
                            let p = o.submit_aic(tile_matmul, &x)?.get(0)?;
                            o.submit_aiv(
                                tile_accumulate,
                                CoreArgs::new().input(&p).inout(&c_tile),
                            )?;
                        }
                        Ok(())
                    })?;
                }
            }
        }
        Ok(())
    });
    p
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let compiled = batched_matmul().compile(&Target::chip(ChipConfig::clusters(2)))?;
    let (len, shape) = (BATCH * N * N, [BATCH, N, N]);
    let a = inputs(7, len);
    let b = inputs(8, len);
    let (a_t, b_t) = (
        SharedTensor::from_data(&shape, &a)?,
        SharedTensor::from_data(&shape, &b)?,
    );
    let c_t = SharedTensor::zeroed(&shape, DataType::F32)?;
    let rt = compiled.prepare(Prepare::new())?;
    let start = Instant::now();
    rt.call((&a_t, &b_t, &c_t))?;
    let elapsed = start.elapsed();
    rt.close()?;
    let c = c_t.to_vec::<f32>()?;

    let (n, m) = (N as usize, (N * N) as usize);
    for bi in 0..BATCH as usize {
        let (a, b, c) = (&a[bi * m..][..m], &b[bi * m..][..m], &c[bi * m..][..m]);
        for i in 0..n {
            for j in 0..n {
                let want: f32 = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
                let got = c[i * n + j];
                if (got - want).abs() > 1e-4 + 1e-3 * want.abs() {
                    return Err(
                        format!("C[{bi}][{i}][{j}] = {got}, the host golden is {want}").into(),
                    );
                }
            }
        }
    }
    // Per output tile and k-step, one AIC and one AIV task.
    let tasks = BATCH * (N / TILE).pow(3) * 2;
    Ok(format!(
        "ok: batched matmul matches the host ({tasks} tasks in {:.1} ms)",
        elapsed.as_secs_f64() * 1e3
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_batched_matmul: {e}");
            ExitCode::FAILURE
        }
    }
}
