//! E1b: the vector add under the reference's four ring configurations (tiny uniform rings, larger uniform rings, per-ring sizes, defaults) on one chip.
//!
//! Run with `cargo run --release --example chip_ring_configs` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the
//! host golden.

use std::process::ExitCode;
use strata::chip::workloads::*;
use strata::chip::ChipConfig;

fn main() -> ExitCode {
    match e1b_ring_configs_run(ChipConfig::default()) {
        Ok(r) => {
            println!("ok: vector_add passed under {} ring configurations", r.runs);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_ring_configs: {e}");
            ExitCode::FAILURE
        }
    }
}
