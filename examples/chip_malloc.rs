//! E1c: device memory from the host, on a prepared chip worker — `alloc_tensor`,
//! `copy_to`, `copy_from` and `free_tensor` round trips of 4096, 65536 and 12345 bytes
//! (three live allocations at distinct device addresses), eight alloc/copy/free rounds
//! with a device offset, `committed_device_memory` back where it started, and the emulated
//! card's `device_memory_info` (free space falls by what is allocated; more than the card
//! holds is refused). Then a dispatch reads a resident allocation: a level-2 program sums
//! its bytes on the chip.
//!
//! The reference's E1c makes no run, but a worker is prepared for a program, so this one
//! has a small program (`byte_sum`) and dispatches it once at the end. The device tensors
//! stand for the reference's `malloc` buffers: a `DeviceTensor` of `n` bytes carries its
//! device address (`ptr().addr()`); a bare pointer from `malloc` exists only on the raw
//! `strata::chip::ChipWorker`, and nothing here needs one.
//!
//! Run with `cargo run --release --example chip_malloc` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if a byte or the accounting differs
//! from what was written.

use std::process::ExitCode;
use strata::prelude::*;

/// `sum[0] = Σ data[i]` over a byte tensor of any length (`n`, bound at dispatch).
fn byte_sum() -> Program {
    let mut p = Program::new(
        "byte_sum",
        Signature::new()
            .input("data", DataType::U8, ["n"])
            .output("sum", DataType::U64, [1u64]),
    );
    let sum = p.kernel("byte_sum", |ctx| {
        let total: u64 = ctx.input::<u8>(0)?.to_vec().iter().map(|&b| b as u64).sum();
        ctx.output::<u64>(1)?.set_flat(0, total)?;
        Ok(())
    });
    p.orchestrate_chip(move |o, args| {
        o.submit_aiv(
            sum,
            CoreArgs::new()
                .input(&args.tensor(0)?)
                .output(&args.tensor(1)?),
        )?;
        Ok(())
    });
    p
}

fn pattern(n: usize, k: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 7 + k * 13) % 251) as u8).collect()
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let config = ChipConfig::default();
    let compiled = byte_sum().compile(&Target::chip(config.clone()))?;
    let sum = SharedTensor::zeroed(&[1], DataType::U64)?;
    let rt = compiled.prepare(Prepare::new())?;
    let base = rt.committed_device_memory(0)?;
    let (free_at_start, total) = rt.device_memory_info(0)?;
    if total != config.device_memory_bytes {
        return Err(format!(
            "the card reports {total} bytes, configured {}",
            config.device_memory_bytes
        )
        .into());
    }

    let sizes = [4096usize, 65536, 12345];
    let mut live = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let t = rt.alloc_tensor(&[n as u64], DataType::U8, 0)?;
        let committed = rt.committed_device_memory(0)?;
        if committed < base + n as u64 {
            return Err(format!("{n} bytes allocated but only {committed} committed").into());
        }
        let pattern = pattern(n, k);
        rt.copy_to(&t, &pattern, CopyRange::bytes(n as u64))?;
        let mut back = vec![0u8; n];
        rt.copy_from(&mut back, &t, CopyRange::bytes(n as u64))?;
        if let Some(i) = (0..n).find(|&i| back[i] != pattern[i]) {
            return Err(format!("byte {i} of {n}: read {}, wrote {}", back[i], pattern[i]).into());
        }
        println!(
            "{n:>6} bytes at device address {:#x}: round trip ok",
            t.ptr().addr()
        );
        live.push(t);
    }
    let mut addrs: Vec<u64> = live.iter().map(|t| t.ptr().addr()).collect();
    addrs.sort_unstable();
    addrs.dedup();
    if addrs.len() != live.len() {
        return Err("two live allocations share an address".into());
    }
    let (free, _) = rt.device_memory_info(0)?;
    let allocated: u64 = sizes.iter().map(|&n| n as u64).sum();
    if free_at_start - free < allocated {
        return Err(format!(
            "{allocated} bytes live but the card's free space fell by only {}",
            free_at_start - free
        )
        .into());
    }
    // More than the card holds.
    match rt.alloc_tensor(&[total + 1], DataType::U8, 0) {
        Err(Error::Memory(m)) => println!("{} bytes refused: {m}", total + 1),
        Err(e) => return Err(format!("an oversized allocation failed otherwise: {e}").into()),
        Ok(_) => return Err("an allocation larger than the card succeeded".into()),
    }
    for t in live {
        let before = rt.committed_device_memory(0)?;
        rt.free_tensor(&t)?;
        if rt.committed_device_memory(0)? >= before {
            return Err("free did not lower the committed memory".into());
        }
    }

    // Churn: the same size again and again, written at an offset inside the block.
    for round in 0..8u8 {
        let t = rt.alloc_tensor(&[65536], DataType::U8, 0)?;
        let at = CopyRange::new(64, 1000, 0);
        rt.copy_to(&t, &[round; 64], at)?;
        let mut back = [0u8; 64];
        rt.copy_from(&mut back, &t, at)?;
        if back != [round; 64] {
            return Err(format!("churn round {round}: read back {back:?}").into());
        }
        rt.free_tensor(&t)?;
    }
    let end = rt.committed_device_memory(0)?;
    if end != base {
        return Err(format!("committed memory {end} after the churn, {base} before").into());
    }

    // A resident allocation as a dispatch argument: the chip sums its bytes.
    let data = pattern(12345, 5);
    let t = rt.alloc_tensor_from(&[data.len() as u64], &data, 0)?;
    rt.call((&t, &sum))?;
    let want: u64 = data.iter().map(|&b| b as u64).sum();
    let got = sum.to_vec::<u64>()?[0];
    if got != want {
        return Err(format!("the chip summed {got}, the host {want}").into());
    }
    rt.free_tensor(&t)?;
    rt.close()?;
    Ok("ok: device memory round trips of 4096, 65536 and 12345 bytes; 8 churn rounds; committed memory restored; a resident tensor summed on the chip".into())
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
