//! Level 4 end to end: a level-4 worker whose two next-level children are whole level-3
//! workers (each forks its own two chips and one sub-worker: 7 processes below the top,
//! plus the top's own sub-worker). Each level-3 child runs the level-3 vector sum on its
//! own inputs (two chips add pairs of vectors, its sub-worker sums them); the top's
//! sub-worker then adds the two children's results. Callables are registered once, on
//! the top, and inherited by the children.
//!
//! Run with `cargo run --release --example l4_vector_sum` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the host
//! golden.

use std::process::ExitCode;
use strata::chip::{ChipConfig, CoreArgs, KernelError};
use strata::host::SharedTensor;
use strata::types::{DataType, TaskArgs};
use strata::{Error, Worker};

const N: u64 = 1 << 14;

fn level3() -> Result<Worker, Error> {
    Worker::l3(vec![ChipConfig::default(); 2], 1)
}

fn run() -> Result<String, Error> {
    let mut top = Worker::l4(1)?;
    let add = top.register_kernel("vadd", |ctx| {
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
    let vadd = top.register_chip_orchestration("vadd", move |o, a| {
        o.submit_aiv(
            add,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .input(&a.tensor(1)?)
                .output(&a.tensor(2)?),
        )?;
        Ok(())
    })?;
    // One host-side sum, used by the level-3 children's sub-workers and by the top's.
    let sum = top.register_sub("sum", |call| {
        let x = call.tensor::<f32>(0)?.to_vec();
        let y = call.tensor::<f32>(1)?.to_vec();
        let mut o = call.tensor_mut::<f32>(2)?;
        for (i, (x, y)) in x.iter().zip(&y).enumerate() {
            o.set(&[i as u64], x + y)?;
        }
        Ok(())
    })?;
    // The level-3 program: args = [a, b, c, d (inputs), out].
    let l3_sum = top.register_orchestration("l3_vector_sum", move |o, args| {
        let t = args.tensors();
        if t.len() != 5 {
            return Err(format!("l3_vector_sum takes 5 tensors, got {}", t.len()).into());
        }
        let r0 = o.alloc(&[N], DataType::F32)?;
        let r1 = o.alloc(&[N], DataType::F32)?;
        for (chip, (x, y, r)) in [(t[0], t[1], &r0), (t[2], t[3], &r1)]
            .into_iter()
            .enumerate()
        {
            let a = TaskArgs::new().input(x).input(y).output(r);
            o.submit_next_level(vadd, &a, chip)?;
        }
        let a = TaskArgs::new().input(&r0).input(&r1).output_existing(t[4]);
        o.submit_sub(&sum, &a)?;
        Ok(())
    })?;
    let children = [top.add_worker(level3()?)?, top.add_worker(level3()?)?];

    // Inputs of both children, their outputs and the total: shared, created before init.
    let mut golden = vec![0.0f32; N as usize];
    let mut child_args = Vec::new();
    let mut child_outs: Vec<SharedTensor> = Vec::new();
    // Task arguments only name tensors: the tensors themselves must stay alive (here, in
    // the orchestration's closure) while tasks use them.
    let mut inputs: Vec<SharedTensor> = Vec::new();
    for c in 0..2 {
        let mut a = TaskArgs::new();
        for k in 0..4 {
            let v: Vec<f32> = (0..N)
                .map(|i| (i % 512) as f32 * 0.25 + (4 * c + k) as f32)
                .collect();
            for (g, x) in golden.iter_mut().zip(&v) {
                *g += x;
            }
            let t = top.shared_tensor_from(&[N], &v)?;
            a = a.input(&t);
            inputs.push(t);
        }
        let out = top.shared_tensor(&[N], DataType::F32)?;
        a = a.output_existing(&out);
        child_args.push(a);
        child_outs.push(out);
    }
    let total = top.shared_tensor(&[N], DataType::F32)?;

    let (outs, tot) = (child_outs.clone(), total.clone());
    let l4_sum = top.register_orchestration("l4_vector_sum", move |o, _| {
        let _alive = &inputs;
        for (a, &worker) in child_args.iter().zip(&children) {
            o.submit_next_level(l3_sum, a, worker)?;
        }
        let a = TaskArgs::new()
            .input(&outs[0])
            .input(&outs[1])
            .output_existing(&tot);
        o.submit_sub(&sum, &a)?;
        Ok(())
    })?;

    top.init()?;
    let start = std::time::Instant::now();
    top.run(l4_sum, &TaskArgs::new())?;
    let elapsed = start.elapsed();
    let got = total.to_vec::<f32>()?;
    top.close()?;

    if let Some(i) = (0..N as usize).find(|&i| got[i] != golden[i]) {
        return Err(Error::InvalidArgument(format!(
            "total[{i}] = {}, the host golden is {}",
            got[i], golden[i]
        )));
    }
    Ok(format!(
        "ok: l4_vector_sum: 2 level-3 children x (2 chips + 1 sub-worker), {N} f32 match the host golden (run {elapsed:.2?})"
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
