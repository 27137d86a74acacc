//! Host-level allreduce at 4 ranks with every reduction op (sum, max, min, prod) and every
//! algorithm (mesh, two-phase, ring, auto), checked against host goldens.
//!
//! Nothing here is a user kernel: the host orchestration stages each rank's input into its
//! copy of a window (`Orch::copy_to_window`, a task on that rank's chip), runs the builtin
//! collective (`Orch::allreduce`, a group task on every chip of the window's domain) and
//! stages the result out (`Orch::copy_from_window`). The engine orders the three from the
//! windows (tasks of one rank on one window buffer run in submit order). Each window
//! buffer carries its own signal area, sized by the runtime for every collective over its
//! domain: no signal window to allocate or size.
//!
//! Run with `cargo run --release --example comm_allreduce_ops` (or `cargo xtask sim`).
//! Prints a final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::chip::ChipConfig;
use strata::comm::{AllreduceAlgo, ReduceOp};
use strata::types::{ArgTag, DataType, TaskArgs};
use strata::{Error, Worker};

const P: u64 = 4;
const M: u64 = 64; // elements per rank (a multiple of P, as the ring needs)

fn run() -> Result<String, Error> {
    let mut w = Worker::l3(vec![ChipConfig::default(); P as usize], 0)?;
    // Small multiples of 0.5: sums and products are exact in f32 whatever the fold order.
    let xs: Vec<f32> = (0..P * M)
        .map(|i| ((i * 7) % 5) as f32 * 0.5 + 1.0)
        .collect();
    let x = w.shared_tensor_from(&[P, M], &xs)?;
    let combos: Vec<(ReduceOp, AllreduceAlgo)> = ReduceOp::ALL
        .into_iter()
        .flat_map(|op| AllreduceAlgo::ALL.map(|algo| (op, algo)))
        .collect();
    let nc = combos.len() as u64;
    // y[c, r, :] = what rank r holds after combination c.
    let y = w.shared_tensor(&[nc, P, M], DataType::F32)?;

    let (xa, ya, cs) = (x.clone(), y.clone(), combos.clone());
    let orch = w.register_orchestration("allreduce_ops", move |o, _| {
        for (c, &(op, algo)) in cs.iter().enumerate() {
            let buf = o.alloc_window_buffer(4 * M)?;
            let data = o.window(&buf, 0, &[M], DataType::F32)?;
            for r in 0..P {
                let row = xa.view().slice(0, r, r + 1)?;
                o.copy_to_window(xa.arg_view(row, ArgTag::Input)?, &data, r as u32)?;
            }
            o.allreduce(&data, op, algo)?;
            for r in 0..P {
                let out = ya
                    .view()
                    .slice(0, c as u64, c as u64 + 1)?
                    .slice(1, r, r + 1)?;
                o.copy_from_window(&data, r as u32, ya.arg_view(out, ArgTag::OutputExisting)?)?;
            }
        }
        Ok(())
    })?;

    w.init()?;
    w.run(orch, &TaskArgs::new())?;
    let got = y.to_vec::<f32>()?;
    w.close()?;

    let rows: Vec<&[f32]> = xs.chunks(M as usize).collect();
    for (c, &(op, algo)) in combos.iter().enumerate() {
        let golden: Vec<f32> = (0..M as usize)
            .map(|i| {
                let col = rows.iter().map(|row| row[i]);
                match op {
                    ReduceOp::Sum => col.sum(),
                    ReduceOp::Prod => col.product(),
                    ReduceOp::Max => col.fold(f32::MIN, f32::max),
                    ReduceOp::Min => col.fold(f32::MAX, f32::min),
                }
            })
            .collect();
        for r in 0..P as usize {
            let at = (c * P as usize + r) * M as usize;
            let have = &got[at..at + M as usize];
            if have != golden.as_slice() {
                return Err(Error::InvalidArgument(format!(
                    "{op:?} / {algo:?}: rank {r} holds {:?}..., the host golden is {:?}...",
                    &have[..4],
                    &golden[..4]
                )));
            }
        }
    }
    Ok(format!(
        "ok: comm_allreduce_ops: {P} ranks x {} ops x {} algorithms, {M} f32 each, match the host goldens",
        ReduceOp::ALL.len(),
        AllreduceAlgo::ALL.len()
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("comm_allreduce_ops: {e}");
            ExitCode::FAILURE
        }
    }
}
