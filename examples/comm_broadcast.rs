//! Host-level broadcast at 4 ranks: every rank stages its own row into a window, then
//! `Orch::broadcast` from root 2 leaves root 2's row in every rank's copy.
//!
//! The orchestration stages each rank's input (`Orch::copy_to_window`, a task on that
//! rank's chip), runs the builtin collective (a group task on every chip of the window's
//! domain: non-roots copy root's copy, then a barrier keeps root's data in place until
//! everyone has it) and stages every copy out (`Orch::copy_from_window`).
//!
//! Run with `cargo run --release --example comm_broadcast` (or `cargo xtask sim`). Prints
//! a final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::chip::ChipConfig;
use strata::types::{ArgTag, DataType, TaskArgs};
use strata::{Error, Worker};

const P: u64 = 4;
const M: u64 = 1000; // elements per rank
const ROOT: u32 = 2;

fn run() -> Result<String, Error> {
    let mut w = Worker::l3(vec![ChipConfig::default(); P as usize], 0)?;
    // Row r = 1000 r + i: every rank starts with different data.
    let xs: Vec<i32> = (0..P * M).map(|i| i as i32).collect();
    let x = w.shared_tensor_from(&[P, M], &xs)?;
    let y = w.shared_tensor(&[P, M], DataType::I32)?;

    let (xa, ya) = (x.clone(), y.clone());
    let orch = w.register_orchestration("broadcast", move |o, _| {
        let buf = o.alloc_window_buffer(4 * M)?;
        let data = o.window(&buf, 0, &[M], DataType::I32)?;
        for r in 0..P {
            let row = xa.view().slice(0, r, r + 1)?;
            o.copy_to_window(xa.arg_view(row, ArgTag::Input)?, &data, r as u32)?;
        }
        o.broadcast(&data, ROOT)?;
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

    let golden = &xs[(ROOT as usize) * M as usize..(ROOT as usize + 1) * M as usize];
    for (r, row) in got.chunks(M as usize).enumerate() {
        if row != golden {
            return Err(Error::InvalidArgument(format!(
                "rank {r} holds {:?}..., root {ROOT}'s row is {:?}...",
                &row[..3],
                &golden[..3]
            )));
        }
    }
    Ok(format!(
        "ok: comm_broadcast: root {ROOT}'s {M} i32 reached all {P} ranks (match the host golden)"
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("comm_broadcast: {e}");
            ExitCode::FAILURE
        }
    }
}
