//! A barrier ordering a remote load, reused on one signal buffer (the distributed model's
//! S7): each of 4 ranks stores its row of `x` into its copy of a window, waits at the
//! barrier, then loads rank `(r + 1) % 4`'s copy — so `y[r] = x[(r + 1) % 4]`. Two rounds
//! with different data (the second offset by 10 000) go through the same signal buffer,
//! with the host-level barrier (`Orch::barrier`) on it between and after them; at the end
//! its barrier rows are back to 0 on every rank (the barrier is self-clearing).
//!
//! Why the barrier is inside the kernel: the engine orders *tasks* by their tags, so two
//! tasks that touch a window never overlap wrongly. But the four kernels of one group run
//! at the same time on four chips and exchange data through the window behind the engine's
//! back: only a barrier guarantees rank `r + 1` has stored before rank `r` loads.
//!
//! Run with `cargo run --release --example comm_barrier` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::chip::{ChipConfig, CoreArgs, KernelError};
use strata::comm::{Comm, DistributedTensor};
use strata::types::{ArgTag, DataType, TaskArgs};
use strata::{Error, Worker};

const P: u64 = 4;
const M: u64 = 64;
const CELLS: u64 = 16; // barrier rows 0..P, padded to one cache line

fn run() -> Result<String, Error> {
    let mut w = Worker::l3(vec![ChipConfig::default(); P as usize], 0)?;
    // Tensor 0: this rank's input row; tensor 1: its output row; scalars: the data window,
    // then the signal window.
    let kernel = w.register_kernel("store_barrier_load", |ctx| {
        let s = ctx.scalars();
        let data_t = DistributedTensor::from_scalars(&s[0..4])?;
        let signal_t = DistributedTensor::from_scalars(&s[4..8])?;
        let comm = Comm::from_kernel(ctx)?;
        let (data, signal) = (comm.window(&data_t)?, comm.window(&signal_t)?);
        let (r, n) = (data.rank(), data.nranks());
        data.write(r, 0, &ctx.input::<f32>(0)?.to_vec())?; // store into my copy
        signal.barrier()?; // every rank has stored
        let mut out = ctx.output::<f32>(1)?;
        let out = out
            .as_mut_slice()
            .ok_or_else(|| KernelError::new("contiguous output"))?;
        data.read((r + 1) % n, 0, out)?; // remote load from the next rank
        Ok(())
    })?;
    let chip_orch = w.register_chip_orchestration("store_barrier_load", move |o, a| {
        let mut core = CoreArgs::new();
        core.input(&a.tensor(0)?).output(&a.tensor(1)?);
        for i in 0..a.scalar_count() {
            core.scalar_bits(a.scalar::<u64>(i)?);
        }
        o.submit_aiv(kernel, &core)?;
        Ok(())
    })?;

    // x[k, r, :] = rank r's data in round k.
    let xs: Vec<f32> = (0..2 * P * M)
        .map(|i| (i % (P * M)) as f32 + 10_000.0 * (i / (P * M)) as f32)
        .collect();
    let x = w.shared_tensor_from(&[2, P, M], &xs)?;
    let y = w.shared_tensor(&[2, P, M], DataType::F32)?;
    let rows = w.shared_tensor(&[P, CELLS], DataType::I32)?; // the signal copies at the end

    let (xa, ya, ra) = (x.clone(), y.clone(), rows.clone());
    let orch = w.register_orchestration("barrier", move |o, _| {
        let buf = o.alloc_window_buffer(4 * M)?;
        let data = o.window(&buf, 0, &[M], DataType::F32)?;
        let sbuf = o.alloc_window_buffer(4 * CELLS)?;
        let signal = o.window(&sbuf, 0, &[CELLS], DataType::I32)?;
        for k in 0..2 {
            let mut per_rank = Vec::new();
            for r in 0..P {
                let mut a = TaskArgs::new()
                    .input(xa.window(&[k, r, 0], &[1, 1, M]))
                    .output_existing(ya.window(&[k, r, 0], &[1, 1, M]))
                    .inout(&data)
                    .inout(&signal);
                data.push_to(&mut a)?;
                signal.push_to(&mut a)?;
                per_rank.push(a);
            }
            o.submit_next_level_group(chip_orch, &per_rank, &[0, 1, 2, 3])?;
            o.barrier(&signal)?; // the host-level barrier, on the same signal buffer
        }
        for r in 0..P {
            let row = ra.view().slice(0, r, r + 1)?;
            o.copy_from_window(&signal, r as u32, ra.arg_view(row, ArgTag::OutputExisting)?)?;
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
            "the barrier left a tally in the signal buffer: {left:?}"
        )));
    }
    Ok(format!(
        "ok: comm_barrier: {P} ranks, y[r] = x[(r+1) % {P}] in 2 rounds; 4 barriers on one signal buffer left it at 0"
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
