//! E6: dependency-only (dummy) tasks in the reference's four cases, including explicit dependencies and an 18-wide fan of dummies; compared exactly.
//!
//! Run with `cargo run --release --example chip_dummy_task` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the
//! host golden.

use std::process::ExitCode;
use strata::chip::workloads::*;
use strata::chip::ChipConfig;

fn main() -> ExitCode {
    match e6_dummy_task(ChipConfig::default()) {
        Ok(r) => {
            println!("ok: dependency-only tasks, {} cases exact", r.runs);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_dummy_task: {e}");
            ExitCode::FAILURE
        }
    }
}
