//! The distributed model's quickstart: two emulated chips — two forked child processes of a
//! level-3 worker — allreduce their inputs through a window buffer. Rank 0 holds
//! `[[1, 2, 3, ...]]`, rank 1 `[[10, 20, 30, ...]]`; afterwards every rank sees
//! `[[11, 22, 33, ...]]`.
//!
//! The host orchestration allocates one window buffer (the same bytes on every rank) and
//! carves two windows from it: the data and a signal window (i32 cells the collective
//! synchronises through). A user kernel on each chip opens them with
//! `Comm::from_kernel(ctx)?.window(..)`, stages its input into its own copy of the data
//! window, calls `allreduce`, and reads the result back into its output row.
//!
//! Run with `cargo run --release --example comm_allreduce_quickstart` (or `cargo xtask
//! sim`). Prints a final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::chip::{ChipConfig, CoreArgs, KernelError};
use strata::comm::{signal_cells, AllreduceAlgo, Comm, DistributedTensor, ReduceOp};
use strata::types::{DataType, TaskArgs};
use strata::{Error, Worker};

const N: u64 = 1024;

fn run() -> Result<String, Error> {
    let mut w = Worker::l3(vec![ChipConfig::default(); 2], 0)?;

    // The kernel each rank runs. Tensor 0 is its input row, tensor 1 its output row;
    // scalars 0..4 name the data window, 4..8 the signal window.
    let allreduce = w.register_kernel("allreduce_user", |ctx| {
        let s = ctx.scalars();
        let data_t = DistributedTensor::from_scalars(&s[0..4])?;
        let signal_t = DistributedTensor::from_scalars(&s[4..8])?;
        let comm = Comm::from_kernel(ctx)?;
        let (data, signal) = (comm.window(&data_t)?, comm.window(&signal_t)?);

        let input = ctx.input::<f32>(0)?.to_vec();
        data.write(data.rank(), 0, &input)?; // stage into this rank's copy
        data.allreduce(&signal, ReduceOp::Sum, AllreduceAlgo::Auto)?;
        let mut out = ctx.output::<f32>(1)?;
        let out = out
            .as_mut_slice()
            .ok_or_else(|| KernelError::new("contiguous output"))?;
        data.read(data.rank(), 0, out)?; // read the reduced copy back
        Ok(())
    })?;
    let chip_orch = w.register_chip_orchestration("allreduce_user", move |o, a| {
        let mut core = CoreArgs::new();
        core.input(&a.tensor(0)?).output(&a.tensor(1)?);
        for i in 0..a.scalar_count() {
            core.scalar_bits(a.scalar::<u64>(i)?);
        }
        o.submit_aiv(allreduce, &core)?;
        Ok(())
    })?;

    // Row r of `x` is rank r's input; row r of `y` receives its result.
    let xs: Vec<f32> = (1..=N)
        .map(|i| i as f32)
        .chain((1..=N).map(|i| 10.0 * i as f32))
        .collect();
    let x = w.shared_tensor_from(&[2, N], &xs)?;
    let y = w.shared_tensor(&[2, N], DataType::F32)?;

    let (xa, ya) = (x.clone(), y.clone());
    let orch = w.register_orchestration("quickstart", move |o, _| {
        let cells = signal_cells(2, AllreduceAlgo::Auto);
        let buf = o.alloc_window_buffer(4 * N + 4 * cells)?;
        let data = o.window(&buf, 0, &[1, N], DataType::F32)?;
        let signal = o.window(&buf, 4 * N, &[cells], DataType::I32)?;
        let mut per_rank = Vec::new();
        for r in 0..2 {
            let mut a = TaskArgs::new()
                .input(xa.slice(0, r, r + 1))
                .output_existing(ya.slice(0, r, r + 1))
                // The windows as dependencies (the kernel reaches them in place) ...
                .inout(&data)
                .inout(&signal);
            // ... and as the scalars the kernel opens them by.
            data.push_to(&mut a)?;
            signal.push_to(&mut a)?;
            per_rank.push(a);
        }
        // Both ranks start together: a collective needs every rank running.
        o.submit_next_level_group(chip_orch, &per_rank, &[0, 1])?;
        Ok(())
    })?;

    w.init()?;
    w.run(orch, &TaskArgs::new())?;
    let got = y.to_vec::<f32>()?;
    w.close()?;

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
