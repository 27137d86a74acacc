//! Level 3 end to end: one host, two emulated chips and one sub-worker, each a forked
//! child process. Chip `r` computes `a[r] + b[r]` (a real AIV kernel on its own device
//! memory) into a run-owned intermediate, then the sub-worker sums the chips' results on
//! the host into `out`. The dependencies (chips before the sub-worker) come from the
//! tensor tags alone.
//!
//! A level-3 program: its signature gives `a` and `b` as `[world, N]` — one row per chip,
//! the world dimension bound to the target's two chips — and `out` as `[N]`; its host
//! orchestration loops over the ranks as the reference's user code does, and it is run
//! once with host tensors in shared memory.
//!
//! Run with `cargo run --release --example l3_vector_sum` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if `out` differs from the host golden.

use std::process::ExitCode;
use strata::prelude::*;

const CHIPS: usize = 2;
const N: u64 = 1 << 16;

/// `out = Σ_r a[r] + b[r]`: chip `r` adds its rows, a sub-worker sums the chips' results.
fn vector_sum() -> Program {
    let mut p = Program::new(
        "vector_sum",
        Signature::new()
            .input("a", DataType::F32, [Dim::World, Dim::Fixed(N)])
            .input("b", DataType::F32, [Dim::World, Dim::Fixed(N)])
            .output("out", DataType::F32, [N]),
    );
    let add = p.kernel("vadd", |ctx| {
        let a = ctx.input::<f32>(0)?.to_vec();
        let b = ctx.input::<f32>(1)?.to_vec();
        let mut o = ctx.output::<f32>(2)?;
        let out = o
            .as_mut_slice()
            .ok_or_else(|| KernelError::new("vadd needs a contiguous output"))?;
        for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(&b)) {
            *o = x + y;
        }
        Ok(())
    });
    let vadd = p.chip_orchestration("vadd", move |o, a| {
        o.submit_aiv(
            add,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .input(&a.tensor(1)?)
                .output(&a.tensor(2)?),
        )?;
        Ok(())
    });
    // The last tensor is the sum of all the others.
    let sum = p.sub("sum", |call| {
        let n = call.num_tensors();
        let mut total = call.tensor::<f32>(0)?.to_vec();
        for i in 1..n - 1 {
            for (t, x) in total.iter_mut().zip(call.tensor::<f32>(i)?.to_vec()) {
                *t += x;
            }
        }
        call.tensor_mut::<f32>(n - 1)?.copy_from_slice(&total)?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let (a, b, out) = (args.tensor("a")?, args.tensor("b")?, args.tensor("out")?);
        let mut partials = TaskArgs::new();
        for r in 0..o.world_size() {
            // Rank r's result: a run-owned intermediate in the shared heap rings,
            // reclaimed after the run.
            let partial = o.alloc(&[1, N], DataType::F32)?;
            let args = TaskArgs::new()
                .input(a.row(r))
                .input(b.row(r))
                .output(&partial);
            o.submit_next_level(vadd, &args, r)?;
            partials = partials.input(&partial);
        }
        o.submit_sub(&sum, &partials.output_existing(out))?;
        Ok(())
    });
    p
}

fn run() -> Result<String, Error> {
    let compiled = vector_sum().compile(&Target::l3(CHIPS).sub_workers(1))?;

    // Host tensors the children see live in shared memory, made before the worker starts.
    let row = |k: usize| (0..N).map(move |i| (i % 1000) as f32 * 0.5 + k as f32);
    let a: Vec<f32> = (0..CHIPS).flat_map(|r| row(2 * r)).collect();
    let b: Vec<f32> = (0..CHIPS).flat_map(|r| row(2 * r + 1)).collect();
    let shape = [CHIPS as u64, N];
    let a_t = SharedTensor::from_data(&shape, &a)?;
    let b_t = SharedTensor::from_data(&shape, &b)?;
    let out = SharedTensor::zeroed(&[N], DataType::F32)?;

    let start = std::time::Instant::now();
    compiled.run_once((&a_t, &b_t, &out))?;
    let elapsed = start.elapsed();

    let got = out.to_vec::<f32>()?;
    let n = N as usize;
    let golden: Vec<f32> = (0..n)
        .map(|i| (0..CHIPS).map(|r| a[r * n + i] + b[r * n + i]).sum())
        .collect();
    if let Some(i) = (0..n).find(|&i| got[i] != golden[i]) {
        return Err(Error::InvalidArgument(format!(
            "out[{i}] = {}, the host golden is {}",
            got[i], golden[i]
        )));
    }
    Ok(format!(
        "ok: l3_vector_sum: {CHIPS} chips + 1 sub-worker, {N} f32 match the host golden (set up, run and tear down in {elapsed:.2?})"
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("l3_vector_sum: {e}");
            ExitCode::FAILURE
        }
    }
}
