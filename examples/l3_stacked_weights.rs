//! A weight sharded over the chips, in a loop of bounded asynchronous dispatches: `W`
//! (`[2, ROWS/2, COLS]`: chip `r` holds rows `r·ROWS/2 ..`) is uploaded once with
//! `alloc_stacked_tensor`, then requests `y = W · x` are submitted in a loop. Each dispatch
//! sends rank `r`'s task its own shard; at most two dispatches are in flight (a third
//! submit waits for the oldest), and each request uses one of two staging slots, checked
//! and reused once its dispatch is done.
//!
//! Run with `cargo run --release --example l3_stacked_weights` (or `cargo xtask sim`).
//! Prints a final line starting with `ok:`; exits non-zero on a mismatch.

use std::collections::VecDeque;
use std::process::ExitCode;
use strata::prelude::*;

const RANKS: u64 = 2;
const ROWS: u64 = 256;
const COLS: u64 = 192;
const HALF: u64 = ROWS / RANKS;
const REQUESTS: usize = 32;

fn weight(r: u64, c: u64) -> f32 {
    ((r * 5 + c * 7) % 13) as f32 - 6.0
}

fn input(k: usize) -> Vec<f32> {
    (0..COLS).map(|c| ((3 * c + k as u64) % 7) as f32).collect()
}

fn golden(x: &[f32]) -> Vec<f32> {
    (0..ROWS)
        .map(|r| (0..COLS).map(|c| weight(r, c) * x[c as usize]).sum())
        .collect()
}

/// `y[r] = w[r] · x` on every rank `r`, with `w` stacked (one shard per chip) and `y`
/// viewed as `[ranks, rows per rank]`.
fn sharded_matvec() -> Program {
    let mut p = Program::new(
        "sharded_matvec",
        Signature::new()
            .input(
                "w",
                DataType::F32,
                [Dim::World, Dim::Fixed(HALF), Dim::Fixed(COLS)],
            )
            .input("x", DataType::F32, [COLS])
            .output("y", DataType::F32, [Dim::World, Dim::Fixed(HALF)]),
    );
    let matvec = p.kernel("matvec", |ctx| {
        let w = ctx.input::<f32>(0)?.to_vec();
        let x = ctx.input::<f32>(1)?.to_vec();
        let mut y = ctx.output::<f32>(2)?;
        for (r, row) in w.chunks(x.len()).enumerate() {
            y.set_flat(r as u64, row.iter().zip(&x).map(|(a, b)| a * b).sum())?;
        }
        Ok(())
    });
    let shard = p.chip_orchestration("matvec_shard", move |o, a| {
        o.submit_aiv(
            matvec,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .input(&a.tensor(1)?)
                .output(&a.tensor(2)?),
        )?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let (w, x, y) = (args.tensor("w")?, args.tensor("x")?, args.tensor("y")?);
        for r in 0..w.shards() {
            let a = TaskArgs::new()
                .input(w.shard(r))
                .input(x)
                .output_existing(y.row(r));
            o.submit_next_level(shard, &a, w.shard_worker(r)?)?;
        }
        Ok(())
    });
    p
}

fn run() -> Result<String, Error> {
    let compiled = sharded_matvec().compile(&Target::l3(RANKS as usize))?;
    let xs = [
        SharedTensor::zeroed(&[COLS], DataType::F32)?,
        SharedTensor::zeroed(&[COLS], DataType::F32)?,
    ];
    let ys = [
        SharedTensor::zeroed(&[RANKS, HALF], DataType::F32)?,
        SharedTensor::zeroed(&[RANKS, HALF], DataType::F32)?,
    ];
    let rt = compiled.prepare(Prepare::new())?;
    let w_host: Vec<f32> = (0..ROWS)
        .flat_map(|r| (0..COLS).map(move |c| weight(r, c)))
        .collect();
    let w = rt.alloc_stacked_tensor(&[RANKS, HALF, COLS], &w_host, None)?;

    let start = std::time::Instant::now();
    let mut in_flight: VecDeque<(usize, DispatchHandle)> = VecDeque::new();
    let mut checked = 0;
    let check = |k: usize, h: DispatchHandle| -> Result<(), Error> {
        h.result(None)?;
        let got = ys[k % 2].to_vec::<f32>()?;
        let want = golden(&input(k));
        match (0..got.len()).find(|&i| got[i] != want[i]) {
            None => Ok(()),
            Some(i) => Err(Error::InvalidArgument(format!(
                "request {k}: y[{i}] = {}, the host golden is {}",
                got[i], want[i]
            ))),
        }
    };
    for k in 0..REQUESTS {
        // Slot k % 2 was last used by request k - 2: check it before reusing it.
        if in_flight.len() == 2 {
            if let Some((done, h)) = in_flight.pop_front() {
                check(done, h)?;
                checked += 1;
            }
        }
        xs[k % 2].write(&input(k))?;
        in_flight.push_back((k, rt.submit(&compiled, (&w, &xs[k % 2], &ys[k % 2]))?));
    }
    while let Some((k, h)) = in_flight.pop_front() {
        check(k, h)?;
        checked += 1;
    }
    let per_request = start.elapsed() / REQUESTS as u32;

    // The shards read back into the host layout they came from.
    let mut back = vec![0f32; w_host.len()];
    rt.copy_stacked_from(&mut back, &[RANKS, HALF, COLS], &w)?;
    if back != w_host {
        return Err(Error::InvalidArgument(
            "the stacked weight did not read back as uploaded".into(),
        ));
    }
    rt.free_stacked_tensor(&w)?;
    rt.close()?;
    Ok(format!(
        "ok: l3_stacked_weights: a {ROWS}x{COLS} weight stacked over {RANKS} chips (one shard each), {checked} requests with at most 2 in flight, every y matches the host golden ({per_request:.2?} per request)"
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("l3_stacked_weights: {e}");
            ExitCode::FAILURE
        }
    }
}
