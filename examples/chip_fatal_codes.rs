//! The negative suite: runs that must fail with the reference runtime's fatal codes (scope deadlock 1, heap-ring deadlock 2, flow-control deadlock 3, dependency-pool overflow 4, invalid arguments 5, sync-start 7, tensor-wait timeout 8, explicit fatal 9, a hanging kernel 100, a failing kernel 110), each followed by a run that must succeed on the same chip.
//!
//! Run with `cargo run --release --example chip_fatal_codes` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the
//! host golden.

use std::process::ExitCode;
use strata::chip::workloads::*;
use strata::chip::ChipConfig;

fn main() -> ExitCode {
    match negative_suite(ChipConfig::default()) {
        Ok(cases) => {
            for c in &cases {
                println!("{:<28} code {:>3}: {}", c.name, c.want, c.got);
            }
            println!(
                "ok: {} fatal-code cases, chip usable after each",
                cases.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_fatal_codes: {e}");
            ExitCode::FAILURE
        }
    }
}
