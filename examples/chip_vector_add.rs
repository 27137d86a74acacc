//! E1 (reference/chip.md §8): one AIV task `out = a + b` over 128×128 f32 on the default chip (one cluster), checked against the host sum; prints the run's [STRACE] span tree.
//!
//! Run with `cargo run --release --example chip_vector_add` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the
//! host golden.

use std::process::ExitCode;
use strata::chip::workloads::*;
use strata::chip::ChipConfig;

fn main() -> ExitCode {
    match e1_vector_add(ChipConfig::default()) {
        Ok(r) => {
            if let Some(last) = &r.last {
                for tree in strata::chip::span_tree(&last.spans()) {
                    print!("{}", tree.render());
                }
            }
            println!(
                "ok: vector_add 128x128 matches the host golden ({} task)",
                r.tasks
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_vector_add: {e}");
            ExitCode::FAILURE
        }
    }
}
