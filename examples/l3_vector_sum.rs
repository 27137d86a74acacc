//! Level 3 end to end: one host, two emulated chips and one sub-worker, each a forked
//! child process. Chip 0 computes `a + b`, chip 1 computes `c + d` (real AIV kernels on
//! their own device memory), then the sub-worker sums both results on the host into
//! `out`. The dependencies (chips before the sub-worker) come from the tensor tags alone.
//!
//! Run with `cargo run --release --example l3_vector_sum` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if `out` differs from the host golden.

use std::process::ExitCode;
use strata::chip::{ChipConfig, CoreArgs, KernelError};
use strata::types::{DataType, TaskArgs};
use strata::{Error, Worker};

const N: u64 = 1 << 16;

fn run() -> Result<String, Error> {
    let mut w = Worker::l3(vec![ChipConfig::default(); 2], 1)?;
    let add = w.register_kernel("vadd", |ctx| {
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
    })?;
    let vadd = w.register_chip_orchestration("vadd", move |o, a| {
        o.submit_aiv(
            add,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .input(&a.tensor(1)?)
                .output(&a.tensor(2)?),
        )?;
        Ok(())
    })?;
    let sum = w.register_sub("sum", |call| {
        let x = call.tensor::<f32>(0)?.to_vec();
        let y = call.tensor::<f32>(1)?.to_vec();
        let mut o = call.tensor_mut::<f32>(2)?;
        for (i, (x, y)) in x.iter().zip(&y).enumerate() {
            o.set(&[i as u64], x + y)?;
        }
        Ok(())
    })?;

    // Host tensors the children see live in shared memory, created before init.
    let inputs: Vec<Vec<f32>> = (0..4)
        .map(|k| (0..N).map(|i| (i % 1000) as f32 * 0.5 + k as f32).collect())
        .collect();
    let t: Vec<_> = inputs
        .iter()
        .map(|v| w.shared_tensor_from(&[N], v))
        .collect::<Result<_, _>>()?;
    let out = w.shared_tensor(&[N], DataType::F32)?;

    let (ta, oa) = (t.clone(), out.clone());
    let orch = w.register_orchestration("l3_vector_sum", move |o, _| {
        // Run-owned intermediates in the shared heap rings, reclaimed after the run.
        let r0 = o.alloc(&[N], DataType::F32)?;
        let r1 = o.alloc(&[N], DataType::F32)?;
        for (chip, (x, y, r)) in [(&ta[0], &ta[1], &r0), (&ta[2], &ta[3], &r1)]
            .into_iter()
            .enumerate()
        {
            let a = TaskArgs::new().input(x).input(y).output(r);
            o.submit_next_level(vadd, &a, chip)?;
        }
        let a = TaskArgs::new().input(&r0).input(&r1).output_existing(&oa);
        o.submit_sub(&sum, &a)?;
        Ok(())
    })?;

    w.init()?;
    let start = std::time::Instant::now();
    w.run(orch, &TaskArgs::new())?;
    let elapsed = start.elapsed();
    let got = out.to_vec::<f32>()?;
    w.close()?;

    let golden: Vec<f32> = (0..N as usize)
        .map(|i| inputs[0][i] + inputs[1][i] + inputs[2][i] + inputs[3][i])
        .collect();
    if let Some(i) = (0..N as usize).find(|&i| got[i] != golden[i]) {
        return Err(Error::InvalidArgument(format!(
            "out[{i}] = {}, the host golden is {}",
            got[i], golden[i]
        )));
    }
    Ok(format!(
        "ok: l3_vector_sum: 2 chips + 1 sub-worker, {N} f32 match the host golden (run {elapsed:.2?})"
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
