//! Host-level reduce-scatter at 4 ranks: each rank's window holds `P` chunks; afterwards
//! rank `r`'s chunk `r` is the sum of chunk `r` over all ranks (its other chunks are left
//! as they were).
//!
//! The orchestration stages each rank's input (`Orch::copy_to_window`), runs the builtin
//! collective (`Orch::reduce_scatter`: a group task on every chip; rank `r` folds chunk `r`
//! of every rank's copy into its own, then a barrier) and stages every copy out
//! (`Orch::copy_from_window`).
//!
//! Run with `cargo run --release --example comm_reduce_scatter` (or `cargo xtask sim`).
//! Prints a final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::chip::ChipConfig;
use strata::comm::ReduceOp;
use strata::types::{ArgTag, DataType, TaskArgs};
use strata::{Error, Worker};

const P: u64 = 4;
const C: u64 = 128; // elements per chunk; each rank holds P chunks

fn run() -> Result<String, Error> {
    let mut w = Worker::l3(vec![ChipConfig::default(); P as usize], 0)?;
    let m = P * C;
    let xs: Vec<i32> = (0..P * m).map(|i| (i % 97) as i32 - 40).collect();
    let x = w.shared_tensor_from(&[P, m], &xs)?;
    let y = w.shared_tensor(&[P, m], DataType::I32)?;

    let (xa, ya) = (x.clone(), y.clone());
    let orch = w.register_orchestration("reduce_scatter", move |o, _| {
        let buf = o.alloc_window_buffer(4 * m)?;
        let data = o.window(&buf, 0, &[P, C], DataType::I32)?; // chunk s = data[s, :]
        for r in 0..P {
            let row = xa.view().slice(0, r, r + 1)?;
            o.copy_to_window(xa.arg_view(row, ArgTag::Input)?, &data, r as u32)?;
        }
        o.reduce_scatter(&data, ReduceOp::Sum)?;
        for r in 0..P {
            let row = ya.view().slice(0, r, r + 1)?;
            o.copy_from_window(&data, r as u32, ya.arg_view(row, ArgTag::OutputExisting)?)?;
        }
        Ok(())
    })?;

    w.init()?;
    w.run(orch, &TaskArgs::new())?;
    let got = y.to_vec::<i32>()?;
    w.close()?;

    let (m, c) = (m as usize, C as usize);
    for r in 0..P as usize {
        for s in 0..P as usize {
            let have = &got[r * m + s * c..r * m + (s + 1) * c];
            let golden: Vec<i32> = if s == r {
                // The reduced chunk: the sum over ranks of chunk r.
                (0..c)
                    .map(|i| (0..P as usize).map(|q| xs[q * m + s * c + i]).sum())
                    .collect()
            } else {
                xs[r * m + s * c..r * m + (s + 1) * c].to_vec() // unchanged
            };
            if have != golden.as_slice() {
                return Err(Error::InvalidArgument(format!(
                    "rank {r}, chunk {s}: {:?}..., the host golden is {:?}...",
                    &have[..3],
                    &golden[..3]
                )));
            }
        }
    }
    Ok(format!(
        "ok: comm_reduce_scatter: {P} ranks, rank r holds the sum of chunk r ({C} i32; match the host golden)"
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("comm_reduce_scatter: {e}");
            ExitCode::FAILURE
        }
    }
}
