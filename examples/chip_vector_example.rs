//! E2: a small DAG with a nested scope (c = a + b; d = c + 1; e = c + 2; g = d·e; f = g + c) whose every output element must be 47.0.
//!
//! Run with `cargo run --release --example chip_vector_example` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the
//! host golden.

use std::process::ExitCode;
use strata::chip::workloads::*;
use strata::chip::ChipConfig;

fn main() -> ExitCode {
    match e2_vector_example(ChipConfig::default()) {
        Ok(r) => {
            println!("ok: f == 47.0 everywhere ({} tasks, nested scope)", r.tasks);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_vector_example: {e}");
            ExitCode::FAILURE
        }
    }
}
