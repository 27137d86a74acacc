//! Prepare once, dispatch many: a level-3 worker with two emulated chips serves a stream of
//! matrix-vector requests `y = W · x` against a weight matrix that stays **resident** in
//! device memory, **sharded** by rows (chip 0 holds the top half of `W`, chip 1 the bottom
//! half), with **bounded asynchronous submission** (at most two runs in flight; the host
//! stages the next request while the previous ones execute).
//!
//! - The weights are copied to the chips once, after `init`, with `alloc_child_tensor` +
//!   `copy_to`; every run names them as device tensors (`ChildTensor::arg`) and never
//!   copies them again.
//! - Requests go through two staging slots (one input `x`, one output `y` each): request
//!   `k` uses slot `k % 2`, so before staging it the host waits for request `k − 2`, checks
//!   its `y` against a host golden, and reuses the slot.
//!
//! Run with `cargo run --release --example l3_resident_weights` (or `cargo xtask sim`).
//! Prints a final line starting with `ok:`; exits non-zero on a mismatch.

use std::collections::VecDeque;
use std::process::ExitCode;
use strata::chip::{ChipConfig, CoreArgs, KernelError};
use strata::dist::DistConfig;
use strata::host::SharedTensor;
use strata::types::{DataType, TaskArgs};
use strata::{Error, PendingRun, Worker, WorkerConfig};

/// `W` is `ROWS × COLS`; each chip holds `ROWS / 2` rows.
const ROWS: u64 = 256;
const COLS: u64 = 192;
const REQUESTS: usize = 32;
const SLOTS: usize = 2;

/// The weights, small integers so that every sum is exact in f32.
fn weight(r: u64, c: u64) -> f32 {
    ((r * 7 + c * 3) % 11) as f32 - 5.0
}

/// Request `k`'s input.
fn input(k: usize) -> Vec<f32> {
    (0..COLS).map(|c| ((c + k as u64) % 5) as f32).collect()
}

fn golden(x: &[f32]) -> Vec<f32> {
    (0..ROWS)
        .map(|r| (0..COLS).map(|c| weight(r, c) * x[c as usize]).sum())
        .collect()
}

fn run() -> Result<String, Error> {
    let mut w = Worker::new(
        3,
        WorkerConfig::Dist(DistConfig::l3(vec![ChipConfig::default(); 2], 0)),
    )?;

    // y[rows] = W[rows, COLS] · x[COLS] on one AIV core.
    let matvec = w.register_kernel("matvec", |ctx| {
        let wt = ctx.input::<f32>(0)?.to_vec();
        let x = ctx.input::<f32>(1)?.to_vec();
        let mut y = ctx.output::<f32>(2)?;
        let y = y
            .as_mut_slice()
            .ok_or_else(|| KernelError::new("matvec needs a contiguous output"))?;
        for (r, out) in y.iter_mut().enumerate() {
            let row = &wt[r * x.len()..(r + 1) * x.len()];
            *out = row.iter().zip(&x).map(|(a, b)| a * b).sum();
        }
        Ok(())
    })?;
    let shard = w.register_chip_orchestration("matvec_shard", move |o, a| {
        o.submit_aiv(
            matvec,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .input(&a.tensor(1)?)
                .output(&a.tensor(2)?),
        )?;
        Ok(())
    })?;

    // Staging slots, created before init (children map shared memory at fork).
    let xs: Vec<SharedTensor> = (0..SLOTS)
        .map(|_| w.shared_tensor(&[COLS], DataType::F32))
        .collect::<Result<_, _>>()?;
    let ys: Vec<SharedTensor> = (0..SLOTS)
        .map(|_| w.shared_tensor(&[ROWS], DataType::F32))
        .collect::<Result<_, _>>()?;
    let staging = w.shared_tensor(&[ROWS / 2, COLS], DataType::F32)?;

    // One request: run tensors 0 and 1 are the two weight shards (device tensors of chip 0
    // and chip 1), scalar 0 the staging slot.
    let (xo, yo) = (xs.clone(), ys.clone());
    let request = w.register_orchestration("request", move |o, a| {
        let slot = a.scalar_at::<u64>(0).ok_or("the slot scalar")? as usize;
        let (x, y) = (&xo[slot], &yo[slot]);
        for chip in 0..2u64 {
            let half = y.slice(0, chip * ROWS / 2, (chip + 1) * ROWS / 2);
            let t = TaskArgs::new()
                .input(a.tensors()[chip as usize])
                .input(x)
                .output_existing(half);
            o.submit_next_level(shard, &t, chip as usize)?;
        }
        Ok(())
    })?;

    w.init()?;

    // Prepare once: each chip receives its half of W and keeps it.
    let mut shards = Vec::new();
    for chip in 0..2u64 {
        let rows: Vec<f32> = (chip * ROWS / 2..(chip + 1) * ROWS / 2)
            .flat_map(|r| (0..COLS).map(move |c| weight(r, c)))
            .collect();
        staging.write(&rows)?;
        let t = w.alloc_child_tensor(chip as usize, &[ROWS / 2, COLS], DataType::F32)?;
        w.copy_to(&t, &staging)?;
        shards.push(t);
    }

    // Dispatch many: at most SLOTS runs in flight.
    let start = std::time::Instant::now();
    let mut in_flight: VecDeque<(usize, PendingRun)> = VecDeque::new();
    let mut checked = 0;
    let check = |k: usize, h: PendingRun| -> Result<(), Error> {
        h.result()?;
        let got = ys[k % SLOTS].to_vec::<f32>()?;
        let want = golden(&input(k));
        if got != want {
            let i = (0..got.len()).find(|&i| got[i] != want[i]).unwrap_or(0);
            return Err(Error::InvalidArgs(format!(
                "request {k}: y[{i}] = {}, the host golden is {}",
                got[i], want[i]
            )));
        }
        Ok(())
    };
    for k in 0..REQUESTS {
        if in_flight.len() == SLOTS {
            if let Some((done, h)) = in_flight.pop_front() {
                check(done, h)?;
                checked += 1;
            }
        }
        xs[k % SLOTS].write(&input(k))?;
        let a = TaskArgs::new()
            .input(&shards[0])
            .input(&shards[1])
            .scalar((k % SLOTS) as u64);
        in_flight.push_back((k, w.submit(request, &a)?));
    }
    while let Some((k, h)) = in_flight.pop_front() {
        check(k, h)?;
        checked += 1;
    }
    let per_request = start.elapsed() / REQUESTS as u32;

    for t in shards {
        w.free(t)?;
    }
    w.close()?;
    Ok(format!(
        "ok: l3_resident_weights: a {ROWS}x{COLS} weight sharded over 2 chips and kept resident, {checked} requests with at most {SLOTS} in flight, every y matches the host golden ({per_request:.2?} per request)"
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("l3_resident_weights: {e}");
            ExitCode::FAILURE
        }
    }
}
