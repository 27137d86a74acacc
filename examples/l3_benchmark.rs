//! `benchmark()` on a level-3 program: two emulated chips (forked child processes), each
//! running two chip orchestrations per dispatch — `scale` (`y = 2·x`) then `bias`
//! (`out = y + 1`, reading `y`: a dependency the engine infers from the tags). The
//! program is dispatched 3 times to warm up and 20 times measured; the statistics come
//! from the spans every chip sent back with its completions (`docs/tracing.md`).
//!
//! Prints the per-round figures, the per-dispatch view (one slot per rank and position)
//! and `print_mean_tree` — one mean span tree per slot, each node's mean ± stdev
//! [min..max] — then checks `out` against the host golden. Run with
//! `cargo run --release --example l3_benchmark` (or `cargo xtask sim`; `cargo xtask trace
//! l3_benchmark` for its Perfetto trace and swimlane picture).

use std::process::ExitCode;
use strata::bench::{Metric, Spread};
use strata::prelude::*;

const CHIPS: usize = 2;
const N: u64 = 1 << 14;
const ROUNDS: usize = 20;
const WARMUP: usize = 3;

/// A kernel `out[i] = f(in[i])` and the chip orchestration that runs it once.
fn elementwise(p: &mut Program, name: &str, f: fn(f32) -> f32) -> strata::chip::OrchHandle {
    let k = p.kernel(name, move |ctx| {
        let x = ctx.input::<f32>(0)?.to_vec();
        let mut o = ctx.output::<f32>(1)?;
        let out = o
            .as_mut_slice()
            .ok_or_else(|| KernelError::new("a contiguous output"))?;
        for (o, x) in out.iter_mut().zip(x) {
            *o = f(x);
        }
        Ok(())
    });
    p.chip_orchestration(name, move |o, a| {
        o.submit_aiv(
            k,
            CoreArgs::new().input(&a.tensor(0)?).output(&a.tensor(1)?),
        )?;
        Ok(())
    })
}

/// `out[r] = 2·x[r] + 1` on chip `r`, in two chip tasks per rank.
fn scale_bias() -> Program {
    let mut p = Program::new(
        "scale_bias",
        Signature::new()
            .input("x", DataType::F32, [Dim::World, Dim::Fixed(N)])
            .output("out", DataType::F32, [Dim::World, Dim::Fixed(N)]),
    );
    let scale = elementwise(&mut p, "scale", |x| 2.0 * x);
    let bias = elementwise(&mut p, "bias", |y| y + 1.0);
    p.orchestrate(move |o, args| {
        let (x, out) = (args.tensor("x")?, args.tensor("out")?);
        for r in 0..o.world_size() {
            let y = o.alloc(&[1, N], DataType::F32)?;
            o.submit_next_level(scale, &TaskArgs::new().input(x.row(r)).output(&y), r)?;
            o.submit_next_level(
                bias,
                &TaskArgs::new().input(&y).output_existing(out.row(r)),
                r,
            )?;
        }
        Ok(())
    });
    p
}

fn run() -> Result<String, Error> {
    let compiled = scale_bias().compile(&Target::l3(CHIPS))?;
    let xs: Vec<f32> = (0..CHIPS as u64 * N).map(|i| (i % 977) as f32).collect();
    let x = SharedTensor::from_data(&[CHIPS as u64, N], &xs)?;
    let out = SharedTensor::zeroed(&[CHIPS as u64, N], DataType::F32)?;

    let stats = strata::benchmark(&compiled, (&x, &out), ROUNDS, WARMUP)?;

    println!("{stats}");
    println!("per dispatch (rank pid, slot) → task, median host wall:");
    let tasks = stats.dispatch_tasks();
    for (slot, v) in stats.per_dispatch(Metric::Host) {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        println!(
            "  {slot:?} {:<20} {:8.1} µs",
            tasks.get(&slot).map_or("?", String::as_str),
            v[v.len() / 2]
        );
    }
    stats.print_mean_tree(true, Spread::Both, None, None);

    let got = out.to_vec::<f32>()?;
    if let Some(i) = (0..got.len()).find(|&i| got[i] != 2.0 * xs[i] + 1.0) {
        return Err(Error::InvalidArgument(format!(
            "out[{i}] = {}, the host golden is {}",
            got[i],
            2.0 * xs[i] + 1.0
        )));
    }
    if stats.invocations.len() != ROUNDS * 2 * CHIPS || tasks.len() != 2 * CHIPS {
        return Err(Error::InvalidArgument(format!(
            "{} launches in {} slots; want {} in {}",
            stats.invocations.len(),
            tasks.len(),
            ROUNDS * 2 * CHIPS,
            2 * CHIPS
        )));
    }
    Ok(format!(
        "ok: l3_benchmark: {ROUNDS} rounds on {CHIPS} chips, median round {:.1} µs device wall, out matches the host golden",
        stats.device_us_median()
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("l3_benchmark: {e}");
            ExitCode::FAILURE
        }
    }
}
