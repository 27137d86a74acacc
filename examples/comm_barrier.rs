//! A barrier ordering a remote load, reused on one window buffer (the distributed model's
//! S7): each of 4 ranks stores its row of `x` into its copy of a window, waits at the
//! barrier, then loads rank `(r + 1) % 4`'s copy — so `y[r] = x[(r + 1) % 4]`. Two rounds
//! with different data (the second offset by 10 000) go through the same window, with the
//! host-level barrier (`Orch::barrier`) on it between and after them; at the end the
//! buffer's barrier rows are back to 0 on every rank (the barrier is self-clearing).
//!
//! The window is an ordinary argument of each rank's task (`.inout(&data)`): the task on
//! chip `r` receives rank `r`'s copy, and its kernel opens it with `ctx.window(2)`. Every
//! window buffer carries its own signal area, which its barriers and collectives use.
//!
//! Why the barrier is inside the kernel: the engine orders *tasks* by their arguments, so
//! the tasks of one rank on a window never overlap wrongly; the four ranks' tasks, though,
//! run at the same time on four chips and exchange data through the window behind the
//! engine's back: only a barrier guarantees rank `r + 1` has stored before rank `r` loads.
//!
//! Run with `cargo run --release --example comm_barrier` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::chip::{ChipConfig, CoreArgs};
use strata::comm::KernelWindows;
use strata::types::{DataType, TaskArgs};
use strata::{Error, Worker};

const P: u64 = 4;
const M: u64 = 64;

fn run() -> Result<String, Error> {
    let mut w = Worker::l3(vec![ChipConfig::default(); P as usize], 0)?;
    // Tensor 0: this rank's input row; 1: its output row; 2: the data window.
    let kernel = w.register_kernel("store_barrier_load", |ctx| {
        let data = ctx.window(2)?;
        let (r, n) = (data.rank(), data.nranks());
        data.write(r, 0, &ctx.input::<f32>(0)?.to_vec())?; // store into my copy
        data.barrier()?; // every rank has stored
        let mut out = ctx.output::<f32>(1)?;
        data.read(
            (r + 1) % n,
            0,
            out.as_mut_slice().ok_or("contiguous output")?,
        )?; // remote load
        Ok(())
    })?;
    let chip_orch = w.register_chip_orchestration("store_barrier_load", move |o, a| {
        o.submit_aiv(
            kernel,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .output(&a.tensor(1)?)
                .inout(&a.tensor(2)?),
        )?;
        Ok(())
    })?;
    // Tensor 0: this rank's row of the tally; 1: the window. Reads the buffer's barrier rows.
    let tally = w.register_kernel("barrier_rows", |ctx| {
        let rows = ctx.window(1)?.barrier_rows();
        ctx.output::<i32>(0)?.copy_from_slice(&rows)?;
        Ok(())
    })?;
    let tally_orch = w.register_chip_orchestration("barrier_rows", move |o, a| {
        o.submit_aiv(
            tally,
            CoreArgs::new().output(&a.tensor(0)?).inout(&a.tensor(1)?),
        )?;
        Ok(())
    })?;

    // x[k, r, :] = rank r's data in round k.
    let xs: Vec<f32> = (0..2 * P * M)
        .map(|i| (i % (P * M)) as f32 + 10_000.0 * (i / (P * M)) as f32)
        .collect();
    let x = w.shared_tensor_from(&[2, P, M], &xs)?;
    let y = w.shared_tensor(&[2, P, M], DataType::F32)?;
    let rows = w.shared_tensor_from(&[P, P], &vec![-1i32; (P * P) as usize])?; // the rows at the end

    let (xa, ya, ra) = (x.clone(), y.clone(), rows.clone());
    let orch = w.register_orchestration("barrier", move |o, _| {
        let buf = o.alloc_window_buffer(4 * M)?;
        let data = o.window(&buf, 0, &[M], DataType::F32)?;
        for k in 0..2 {
            for r in 0..P {
                let args = TaskArgs::new()
                    .input(xa.window(&[k, r, 0], &[1, 1, M]))
                    .output_existing(ya.window(&[k, r, 0], &[1, 1, M]))
                    .inout(&data);
                o.submit_next_level(chip_orch, &args, r as usize)?;
            }
            o.barrier(&data)?; // the host-level barrier, on the same buffer
        }
        for r in 0..P {
            let args = TaskArgs::new()
                .output_existing(ra.slice(0, r, r + 1))
                .inout(&data);
            o.submit_next_level(tally_orch, &args, r as usize)?;
        }
        Ok(())
    })?;

    w.init()?;
    w.run(orch, &TaskArgs::new())?;
    let (got, left) = (y.to_vec::<f32>()?, rows.to_vec::<i32>()?);
    w.close()?;

    let (p, m) = (P as usize, M as usize);
    for k in 0..2 {
        for r in 0..p {
            let have = &got[(k * p + r) * m..(k * p + r + 1) * m];
            let golden = &xs[(k * p + (r + 1) % p) * m..(k * p + (r + 1) % p + 1) * m];
            if have != golden {
                return Err(Error::InvalidArgument(format!(
                    "round {k}, rank {r} loaded {:?}..., rank {}'s row is {:?}...",
                    &have[..3],
                    (r + 1) % p,
                    &golden[..3]
                )));
            }
        }
    }
    if left.iter().any(|&v| v != 0) {
        return Err(Error::InvalidArgument(format!(
            "the barriers left a tally in the buffer's barrier rows: {left:?}"
        )));
    }
    Ok(format!(
        "ok: comm_barrier: {P} ranks, y[r] = x[(r+1) % {P}] in 2 rounds; 4 barriers on one window buffer left its barrier rows at 0"
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("comm_barrier: {e}");
            ExitCode::FAILURE
        }
    }
}
