//! The distributed model's quickstart: two emulated chips — two forked child processes of a
//! level-3 worker — allreduce their inputs through a window buffer. Rank 0 holds
//! `[[1, 2, 3, ...]]`, rank 1 `[[10, 20, 30, ...]]`; afterwards every rank sees
//! `[[11, 22, 33, ...]]`.
//!
//! Written as the reference writes it: a program whose host orchestration allocates one
//! window buffer and submits the chip orchestration once per rank — `for r in 0..world` —
//! with the rank's input row, its output row and the window as ordinary arguments. The
//! task on chip `r` receives rank `r`'s copy of the window (so the ranks' tasks run side by
//! side, as a collective needs); its kernel opens it with `ctx.window(2)`, stages its input
//! into it, calls `allreduce` (which synchronises through the buffer's own signal area)
//! and reads the result back into its output row.
//!
//! Run with `cargo run --release --example comm_allreduce_quickstart` (or `cargo xtask
//! sim`). Prints a final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::comm::prelude::*;
use strata::prelude::*;

const N: u64 = 1024;

fn quickstart() -> Program {
    let mut p = Program::new(
        "allreduce_quickstart",
        Signature::new()
            .input("x", DataType::F32, [Dim::World, Dim::Fixed(N)])
            .output("y", DataType::F32, [Dim::World, Dim::Fixed(N)]),
    );
    // Tensor 0: this rank's input row; 1: its output row; 2: its copy of the data window.
    let allreduce = p.kernel("allreduce_user", |ctx| {
        let data = ctx.window(2)?;
        data.write(data.rank(), 0, &ctx.input::<f32>(0)?.to_vec())?; // stage into my copy
        data.allreduce(ReduceOp::Sum, AllreduceAlgo::Auto)?;
        let mut out = ctx.output::<f32>(1)?;
        data.read(
            data.rank(),
            0,
            out.as_mut_slice().ok_or("contiguous output")?,
        )?;
        Ok(())
    });
    let chip_orch = p.chip_orchestration("allreduce_user", move |o, a| {
        o.submit_aiv(
            allreduce,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .output(&a.tensor(1)?)
                .inout(&a.tensor(2)?),
        )?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let (x, y) = (args.tensor("x")?, args.tensor("y")?);
        let buf = o.alloc_window_buffer(4 * N)?;
        let data = o.window(&buf, 0, &[1, N], DataType::F32)?;
        for r in 0..o.world_size() {
            let a = TaskArgs::new()
                .input(x.row(r))
                .output_existing(y.row(r))
                .inout(&data);
            o.submit_next_level(chip_orch, &a, r)?;
        }
        Ok(())
    });
    p
}

fn run() -> Result<String, Error> {
    let compiled = quickstart().compile(&Target::l3(2))?;
    let xs: Vec<f32> = (1..=N)
        .map(|i| i as f32)
        .chain((1..=N).map(|i| 10.0 * i as f32))
        .collect();
    let x = SharedTensor::from_data(&[2, N], &xs)?;
    let y = SharedTensor::zeroed(&[2, N], DataType::F32)?;
    compiled.run_once((&x, &y))?;
    let got = y.to_vec::<f32>()?;

    let golden: Vec<f32> = (1..=N).map(|i| 11.0 * i as f32).collect();
    for (r, row) in got.chunks(N as usize).enumerate() {
        if row != golden.as_slice() {
            return Err(Error::InvalidArgument(format!(
                "rank {r} sees {:?}..., the host golden is {:?}...",
                &row[..3],
                &golden[..3]
            )));
        }
    }
    Ok(format!(
        "ok: comm_allreduce_quickstart: 2 ranks, [[1, 2, 3, ...]] + [[10, 20, 30, ...]] -> every rank sees [[{}, {}, {}, ...]] ({N} f32 match the host golden)",
        got[0], got[1], got[2]
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("comm_allreduce_quickstart: {e}");
            ExitCode::FAILURE
        }
    }
}
