//! Host-level all-to-all at 4 ranks: rank `s` prepares one chunk for every rank in its
//! `stage` window (chunk `r` is for rank `r`); afterwards rank `r`'s `target` chunk `s` is
//! what rank `s` prepared for it — a transpose of chunks across ranks.
//!
//! The orchestration stages each rank's chunks (`Orch::copy_to_window`), runs the builtin
//! collective (`Orch::all_to_all`: a group task on every chip; each rank pulls its chunk
//! from every rank's stage, then a barrier) and stages every target out
//! (`Orch::copy_from_window`).
//!
//! Run with `cargo run --release --example comm_all_to_all` (or `cargo xtask sim`). Prints
//! a final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::chip::ChipConfig;
use strata::types::{ArgTag, DataType, TaskArgs};
use strata::{Error, Worker};

const P: u64 = 4;
const C: u64 = 64; // elements per chunk

fn run() -> Result<String, Error> {
    let mut w = Worker::l3(vec![ChipConfig::default(); P as usize], 0)?;
    // Rank s's chunk for rank r holds 1000 s + 100 r + i: its origin is readable.
    let xs: Vec<i32> = (0..P)
        .flat_map(|s| {
            (0..P).flat_map(move |r| (0..C).map(move |i| (1000 * s + 100 * r + i) as i32))
        })
        .collect();
    let x = w.shared_tensor_from(&[P, P * C], &xs)?;
    let y = w.shared_tensor(&[P, P * C], DataType::I32)?;

    let (xa, ya) = (x.clone(), y.clone());
    let orch = w.register_orchestration("all_to_all", move |o, _| {
        let sbuf = o.alloc_window_buffer(4 * P * C)?;
        let stage = o.window(&sbuf, 0, &[P, C], DataType::I32)?;
        let tbuf = o.alloc_window_buffer(4 * P * C)?;
        let target = o.window(&tbuf, 0, &[P, C], DataType::I32)?;
        for r in 0..P {
            let row = xa.view().slice(0, r, r + 1)?;
            o.copy_to_window(xa.arg_view(row, ArgTag::Input)?, &stage, r as u32)?;
        }
        o.all_to_all(&stage, &target)?;
        for r in 0..P {
            let row = ya.view().slice(0, r, r + 1)?;
            o.copy_from_window(&target, r as u32, ya.arg_view(row, ArgTag::OutputExisting)?)?;
        }
        Ok(())
    })?;

    w.init()?;
    w.run(orch, &TaskArgs::new())?;
    let got = y.to_vec::<i32>()?;
    w.close()?;

    let (m, c) = ((P * C) as usize, C as usize);
    for r in 0..P as usize {
        for s in 0..P as usize {
            let have = &got[r * m + s * c..r * m + (s + 1) * c];
            let golden = &xs[s * m + r * c..s * m + (r + 1) * c]; // rank s's chunk for r
            if have != golden {
                return Err(Error::InvalidArgument(format!(
                    "rank {r}, target chunk {s}: {:?}..., the host golden is {:?}...",
                    &have[..3],
                    &golden[..3]
                )));
            }
        }
    }
    Ok(format!(
        "ok: comm_all_to_all: {P} ranks exchanged {C}-element chunks, target[s] on rank r = rank s's chunk for r (match the host golden)"
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("comm_all_to_all: {e}");
            ExitCode::FAILURE
        }
    }
}
