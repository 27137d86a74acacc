//! Level 4 end to end: a level-4 worker whose two next-level workers are whole level-3
//! workers (each forks its own two chips and one sub-worker: 7 processes below the top,
//! plus the top's own sub-worker). Each level-3 worker runs the level-3 vector sum on its
//! own rows (chip `r` adds `a[r] + b[r]`, its sub-worker sums the chips' results); the
//! top's sub-worker then adds the level-3 workers' results into `total`.
//!
//! A level-4 program: its signature gives `a` and `b` as `[world, chips, N]` (the world
//! dimension bound to the two level-3 workers), each level-3 worker's result `partial` as
//! `[world, N]` and `total` as `[N]`. Its host orchestration sends row `w` of every
//! tensor to level-3 worker `w`; what the level-3 workers run is the program's
//! `worker_orchestration`, which loops over its own chips the same way. Every callable is
//! part of the one program, registered on the top before anything forks and inherited by
//! the level-3 workers and their chips.
//!
//! Run with `cargo run --release --example l4_vector_sum` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if a result differs from the host
//! golden.

use std::process::ExitCode;
use strata::prelude::*;

const WORKERS: usize = 2;
const CHIPS: usize = 2;
const N: u64 = 1 << 14;

/// `total = Σ_w Σ_r a[w][r] + b[w][r]`, with `partial[w] = Σ_r a[w][r] + b[w][r]`.
fn vector_sum() -> Program {
    let per_chip = [Dim::World, Dim::Fixed(CHIPS as u64), Dim::Fixed(N)];
    let mut p = Program::new(
        "l4_vector_sum",
        Signature::new()
            .input("a", DataType::F32, per_chip.clone())
            .input("b", DataType::F32, per_chip)
            .output("partial", DataType::F32, [Dim::World, Dim::Fixed(N)])
            .output("total", DataType::F32, [N]),
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
    // One host-side sum for the level-3 workers' sub-workers and the top's: the last
    // tensor is the sum of all the others.
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
    // What a level-3 worker runs: its rows of a and b (`[1, chips, N]` each) and its
    // `partial` row. Chip r adds its part of both (index r of axis 1) into a run-owned
    // intermediate; the sub-worker sums the chips' results into `partial`.
    let level3 = p.worker_orchestration("l3_vector_sum", move |o, args| {
        let [a, b, partial] = args.tensors() else {
            return Err(format!(
                "l3_vector_sum takes 3 tensors, got {}",
                args.tensors().len()
            )
            .into());
        };
        let mut results = TaskArgs::new();
        for r in 0..o.world_size() {
            let result = o.alloc(&[1, N], DataType::F32)?;
            let args = TaskArgs::new()
                .input(a.slice(1, r as u64, r as u64 + 1))
                .input(b.slice(1, r as u64, r as u64 + 1))
                .output(&result);
            o.submit_next_level(vadd, &args, r)?;
            results = results.input(&result);
        }
        o.submit_sub(&sum, &results.output_existing(partial))?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let (a, b) = (args.tensor("a")?, args.tensor("b")?);
        let (partial, total) = (args.tensor("partial")?, args.tensor("total")?);
        let mut partials = TaskArgs::new();
        for w in 0..o.world_size() {
            let args = TaskArgs::new()
                .input(a.row(w))
                .input(b.row(w))
                .output_existing(partial.row(w));
            o.submit_next_level(level3, &args, w)?;
            partials = partials.input(partial.row(w));
        }
        o.submit_sub(&sum, &partials.output_existing(total))?;
        Ok(())
    });
    p
}

fn run() -> Result<String, Error> {
    let level3 = || Target::l3(CHIPS).sub_workers(1);
    let target = Target::l4(vec![level3(); WORKERS]).sub_workers(1);
    let compiled = vector_sum().compile(&target)?;

    // Inputs, the level-3 workers' results and the total: shared, made before prepare.
    let n = N as usize;
    let row = |k: usize| (0..N).map(move |i| (i % 512) as f32 * 0.25 + k as f32);
    let rows = WORKERS * CHIPS;
    let a: Vec<f32> = (0..rows).flat_map(|r| row(2 * r)).collect();
    let b: Vec<f32> = (0..rows).flat_map(|r| row(2 * r + 1)).collect();
    let shape = [WORKERS as u64, CHIPS as u64, N];
    let a_t = SharedTensor::from_data(&shape, &a)?;
    let b_t = SharedTensor::from_data(&shape, &b)?;
    let partial = SharedTensor::zeroed(&[WORKERS as u64, N], DataType::F32)?;
    let total = SharedTensor::zeroed(&[N], DataType::F32)?;

    let start = std::time::Instant::now();
    compiled.run_once((&a_t, &b_t, &partial, &total))?;
    let elapsed = start.elapsed();

    // The golden, summed in the same order: per chip, per level-3 worker, then the top.
    let chip = |r: usize, i: usize| a[r * n + i] + b[r * n + i];
    let level3_golden =
        |w: usize, i: usize| (0..CHIPS).fold(0.0f32, |s, c| s + chip(w * CHIPS + c, i));
    let (got_partial, got_total) = (partial.to_vec::<f32>()?, total.to_vec::<f32>()?);
    for i in 0..n {
        for w in 0..WORKERS {
            let want = level3_golden(w, i);
            if got_partial[w * n + i] != want {
                return Err(Error::InvalidArgument(format!(
                    "partial[{w}][{i}] = {}, the host golden is {want}",
                    got_partial[w * n + i]
                )));
            }
        }
        let want = (0..WORKERS).fold(0.0f32, |s, w| s + level3_golden(w, i));
        if got_total[i] != want {
            return Err(Error::InvalidArgument(format!(
                "total[{i}] = {}, the host golden is {want}",
                got_total[i]
            )));
        }
    }
    Ok(format!(
        "ok: l4_vector_sum: {WORKERS} level-3 workers x ({CHIPS} chips + 1 sub-worker), {N} f32 match the host golden (set up, run and tear down in {elapsed:.2?})"
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("l4_vector_sum: {e}");
            ExitCode::FAILURE
        }
    }
}
