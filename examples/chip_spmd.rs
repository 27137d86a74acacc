//! E5 and SPMD: a MIX task whose kernels write their block index, block count and sub-block id (exact); an AIV task of 37 blocks on two cores; and the reference merge_pipeline_barrier (8 blocks started together wait for each other at an intra-task barrier) on an 8-core chip.
//!
//! Run with `cargo run --release --example chip_spmd` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if the result differs from the
//! host golden.

use std::process::ExitCode;
use strata::chip::workloads::*;
use strata::chip::ChipConfig;

fn main() -> ExitCode {
    let barrier_chip = ChipConfig {
        aic_cores: 0,
        aiv_cores: 8,
        ..ChipConfig::default()
    };
    let result = e5_spmd_basic(ChipConfig::default())
        .and_then(|_| spmd_blocks(ChipConfig::default(), 37))
        .and_then(|_| spmd_barrier(barrier_chip, 8));
    match result {
        Ok(_) => {
            println!("ok: SPMD context accessors exact; 37 queued blocks; 8-block barrier");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_spmd: {e}");
            ExitCode::FAILURE
        }
    }
}
