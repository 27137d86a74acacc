//! E1c: device memory round trips — malloc / copy_to / copy_from / free of 4096, 65536 and 12345 bytes, distinct live allocations, alloc/free churn and committed-memory accounting.
//!
//! Run with `cargo run --release --example chip_malloc` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the
//! host golden.

use std::process::ExitCode;
use strata::chip::workloads::*;
use strata::chip::ChipConfig;

fn main() -> ExitCode {
    match e1c_malloc(ChipConfig::default()) {
        Ok(_) => {
            println!("ok: malloc/copy round trips of 4096, 65536 and 12345 bytes");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_malloc: {e}");
            ExitCode::FAILURE
        }
    }
}
