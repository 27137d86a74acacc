//! E1c: device memory from the host — `malloc`, `copy_to`, `copy_from` and `free` round
//! trips of 4096, 65536 and 12345 bytes (three live allocations at distinct addresses),
//! eight alloc/copy/free rounds with a device offset, and `committed_device_memory`
//! back where it started.
//!
//! Run with `cargo run --release --example chip_malloc` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if a byte or the accounting differs
//! from what was written.

use std::error::Error;
use std::process::ExitCode;
use strata::chip::{ChipConfig, ChipWorker, CopyOffsets};

fn run() -> Result<String, Box<dyn Error>> {
    let mut chip = ChipWorker::new(ChipConfig::default())?;
    chip.init()?;
    let base = chip.committed_device_memory()?;

    let sizes = [4096usize, 65536, 12345];
    let mut live = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let ptr = chip.malloc(n as u64)?;
        let committed = chip.committed_device_memory()?;
        if committed < base + n as u64 {
            return Err(format!("{n} bytes allocated but only {committed} committed").into());
        }
        let pattern: Vec<u8> = (0..n).map(|i| ((i * 7 + k * 13) % 251) as u8).collect();
        chip.copy_to(ptr, &pattern, n, CopyOffsets::default())?;
        let mut back = vec![0u8; n];
        chip.copy_from(&mut back, ptr, n, CopyOffsets::default())?;
        if let Some(i) = (0..n).find(|&i| back[i] != pattern[i]) {
            return Err(format!("byte {i} of {n}: read {}, wrote {}", back[i], pattern[i]).into());
        }
        println!(
            "{n:>6} bytes at device address {:#x}: round trip ok",
            ptr.addr()
        );
        live.push(ptr);
    }
    let mut addrs: Vec<u64> = live.iter().map(|p| p.addr()).collect();
    addrs.sort_unstable();
    addrs.dedup();
    if addrs.len() != live.len() {
        return Err("two live allocations share an address".into());
    }
    for ptr in live {
        let before = chip.committed_device_memory()?;
        chip.free(ptr)?;
        if chip.committed_device_memory()? >= before {
            return Err("free did not lower the committed memory".into());
        }
    }

    // Churn: the same size again and again, written at an offset inside the block.
    for round in 0..8u8 {
        let ptr = chip.malloc(65536)?;
        let at = CopyOffsets {
            device: 1000,
            host: 0,
        };
        chip.copy_to(ptr, &[round; 64], 64, at)?;
        let mut back = [0u8; 64];
        chip.copy_from(&mut back, ptr, 64, at)?;
        if back != [round; 64] {
            return Err(format!("churn round {round}: read back {back:?}").into());
        }
        chip.free(ptr)?;
    }
    let end = chip.committed_device_memory()?;
    if end != base {
        return Err(format!("committed memory {end} after the churn, {base} before").into());
    }
    chip.close()?;
    Ok("ok: malloc/copy round trips of 4096, 65536 and 12345 bytes; 8 churn rounds; committed memory restored".into())
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_malloc: {e}");
            ExitCode::FAILURE
        }
    }
}
