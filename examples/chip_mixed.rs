//! E4: the five task shapes (AIC+AIV0+AIV1, AIC, AIV, AIV0+AIV1, AIC+AIV0) over four scoped iterations on a two-cluster chip, checked against host matmul / add / mul.
//!
//! Run with `cargo run --release --example chip_mixed` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the
//! host golden.

use std::process::ExitCode;
use strata::chip::workloads::*;
use strata::chip::ChipConfig;

fn main() -> ExitCode {
    match e4_mixed_example(ChipConfig::clusters(2)) {
        Ok(r) => {
            println!(
                "ok: mixed-shape tasks match the host goldens ({} tasks)",
                r.tasks
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_mixed: {e}");
            ExitCode::FAILURE
        }
    }
}
