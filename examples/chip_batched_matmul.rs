//! A batched tiled matmul (3 × 128×128, 32×32 tiles): 384 tasks — AIC tile products into runtime-created tensors, AIV accumulation into INOUT tile views — checked against a host matmul.
//!
//! Run with `cargo run --release --example chip_batched_matmul` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the
//! host golden.

use std::process::ExitCode;
use strata::chip::workloads::*;
use strata::chip::ChipConfig;

fn main() -> ExitCode {
    match batched_matmul(ChipConfig::clusters(2), 3, 128, 32) {
        Ok(r) => {
            println!(
                "ok: batched matmul matches the host ({} tasks in {:.1} ms)",
                r.tasks,
                r.elapsed.as_secs_f64() * 1e3
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_batched_matmul: {e}");
            ExitCode::FAILURE
        }
    }
}
