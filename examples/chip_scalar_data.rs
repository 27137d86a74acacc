//! E7: orchestration data access — get/set_tensor_data on external and runtime tensors, alloc_tensors with an initial value, INOUT re-registration and the waits they imply; check == [2, 102, 77, 77, 79, 42, 12, 88, 55].
//!
//! Run with `cargo run --release --example chip_scalar_data` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the
//! host golden.

use std::process::ExitCode;
use strata::chip::workloads::*;
use strata::chip::ChipConfig;

fn main() -> ExitCode {
    match e7_scalar_data(ChipConfig::default()) {
        Ok(r) => {
            println!(
                "ok: result == a + b and check == [2, 102, 77, 77, 79, 42, 12, 88, 55] ({} tasks)",
                r.tasks
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_scalar_data: {e}");
            ExitCode::FAILURE
        }
    }
}
