//! Prepare once, dispatch many: a weight matrix uploaded once to a chip stays resident
//! there, and requests `y = W · x` are dispatched against it — two submitted back to back,
//! both in flight at once, then a stream of them through `call`.
//!
//! - The program's signature says what a dispatch passes: the resident weight `w`, the
//!   request `x` and the answer `y` (host tensors in shared memory, made before prepare).
//! - `alloc_tensor_from` uploads `W` from ordinary host memory (staged through the
//!   worker's shared staging memory); no dispatch copies it again.
//!
//! Run with `cargo run --release --example l3_resident_weights` (or `cargo xtask sim`).
//! Prints a final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::prelude::*;

const ROWS: u64 = 256;
const COLS: u64 = 192;

/// The weights: small integers, so every sum is exact in f32.
fn weight(r: u64, c: u64) -> f32 {
    ((r * 7 + c * 3) % 11) as f32 - 5.0
}

fn input(k: usize) -> Vec<f32> {
    (0..COLS).map(|c| ((c + k as u64) % 5) as f32).collect()
}

fn golden(x: &[f32]) -> Vec<f32> {
    (0..ROWS)
        .map(|r| (0..COLS).map(|c| weight(r, c) * x[c as usize]).sum())
        .collect()
}

/// `y = w · x` on chip 0, one AIV task.
fn matvec_program() -> Program {
    let mut p = Program::new(
        "matvec",
        Signature::new()
            .input("w", DataType::F32, [ROWS, COLS])
            .input("x", DataType::F32, [COLS])
            .output("y", DataType::F32, [ROWS]),
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
    let on_chip = p.chip_orchestration("matvec", move |o, a| {
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
        let a = TaskArgs::new()
            .input(args.tensor("w")?)
            .input(args.tensor("x")?)
            .output_existing(args.tensor("y")?);
        o.submit_next_level(on_chip, &a, 0)?;
        Ok(())
    });
    p
}

fn check(k: usize, y: &SharedTensor) -> Result<(), Error> {
    let got = y.to_vec::<f32>()?;
    let want = golden(&input(k));
    match (0..got.len()).find(|&i| got[i] != want[i]) {
        None => Ok(()),
        Some(i) => Err(Error::InvalidArgument(format!(
            "request {k}: y[{i}] = {}, the host golden is {}",
            got[i], want[i]
        ))),
    }
}

fn run() -> Result<String, Error> {
    let compiled = matvec_program().compile(&Target::l3(1))?;
    // Host tensors for the dispatches: shared memory, made before prepare.
    let xs = [
        SharedTensor::from_data(&[COLS], &input(0))?,
        SharedTensor::from_data(&[COLS], &input(1))?,
    ];
    let ys = [
        SharedTensor::zeroed(&[ROWS], DataType::F32)?,
        SharedTensor::zeroed(&[ROWS], DataType::F32)?,
    ];
    let rt = compiled.prepare(Prepare::new())?;

    // Once: the weight goes to chip 0 and stays there.
    let w_host: Vec<f32> = (0..ROWS)
        .flat_map(|r| (0..COLS).map(move |c| weight(r, c)))
        .collect();
    let w = rt.alloc_tensor_from(&[ROWS, COLS], &w_host, 0)?;

    // Twice, both in flight: the handles keep their arguments alive until done.
    let first = rt.submit(&compiled, (&w, &xs[0], &ys[0]))?;
    let second = rt.submit(&compiled, (&w, &xs[1], &ys[1]))?;
    first.result(None)?;
    second.result(None)?;
    check(0, &ys[0])?;
    check(1, &ys[1])?;

    // Then a stream of blocking calls against the same resident weight.
    let start = std::time::Instant::now();
    let requests = 32;
    for k in 2..requests {
        xs[0].write(&input(k))?;
        rt.call((&w, &xs[0], &ys[0]))?;
        check(k, &ys[0])?;
    }
    let per_request = start.elapsed() / (requests - 2) as u32;
    rt.free_tensor(&w)?;
    rt.close()?;
    Ok(format!(
        "ok: l3_resident_weights: a {ROWS}x{COLS} weight uploaded once and kept on chip 0; 2 requests submitted back to back and {} more called, every y matches the host golden ({per_request:.2?} per call)",
        requests - 2
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
