//! Host-level allgather at 4 ranks: rank `r` contributes its row of `x` (its `stage`
//! window); afterwards every rank's `target` window holds all rows, `target[s, :]` = rank
//! `s`'s stage.
//!
//! The orchestration stages each rank's row (`Orch::copy_to_window`), runs the builtin
//! collective (`Orch::allgather`: a group task on every chip; each rank copies every rank's
//! stage into its own target, then a barrier) and stages every target out
//! (`Orch::copy_from_window`).
//!
//! Run with `cargo run --release --example comm_allgather` (or `cargo xtask sim`). Prints
//! a final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::chip::ChipConfig;
use strata::types::{ArgTag, DataType, TaskArgs};
use strata::{Error, Worker};

const P: u64 = 4;
const M: u64 = 256; // elements each rank contributes

fn run() -> Result<String, Error> {
    let mut w = Worker::l3(vec![ChipConfig::default(); P as usize], 0)?;
    let xs: Vec<f32> = (0..P * M).map(|i| i as f32 * 0.25).collect();
    let x = w.shared_tensor_from(&[P, M], &xs)?;
    // y[r, :] = rank r's whole target (P x M elements).
    let y = w.shared_tensor(&[P, P * M], DataType::F32)?;

    let (xa, ya) = (x.clone(), y.clone());
    let orch = w.register_orchestration("allgather", move |o, _| {
        let sbuf = o.alloc_window_buffer(4 * M)?;
        let stage = o.window(&sbuf, 0, &[M], DataType::F32)?;
        let tbuf = o.alloc_window_buffer(4 * P * M)?;
        let target = o.window(&tbuf, 0, &[P, M], DataType::F32)?;
        for r in 0..P {
            let row = xa.view().slice(0, r, r + 1)?;
            o.copy_to_window(xa.arg_view(row, ArgTag::Input)?, &stage, r as u32)?;
        }
        o.allgather(&stage, &target)?;
        for r in 0..P {
            let row = ya.view().slice(0, r, r + 1)?;
            o.copy_from_window(&target, r as u32, ya.arg_view(row, ArgTag::OutputExisting)?)?;
        }
        Ok(())
    })?;

    w.init()?;
    w.run(orch, &TaskArgs::new())?;
    let got = y.to_vec::<f32>()?;
    w.close()?;

    // Every rank holds every row, in rank order: all of x.
    for (r, target) in got.chunks((P * M) as usize).enumerate() {
        if target != xs.as_slice() {
            let bad = (0..xs.len()).find(|&i| target[i] != xs[i]).unwrap_or(0);
            return Err(Error::InvalidArgument(format!(
                "rank {r}: target[{}, {}] = {}, the host golden is {}",
                bad / M as usize,
                bad % M as usize,
                target[bad],
                xs[bad]
            )));
        }
    }
    Ok(format!(
        "ok: comm_allgather: {P} ranks x {M} f32 gathered on every rank (match the host golden)"
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("comm_allgather: {e}");
            ExitCode::FAILURE
        }
    }
}
