//! E1b: the vector add under the reference's four ring configurations on one chip — tiny
//! uniform rings, larger uniform rings, a size per ring, and the defaults. A run's
//! `CallConfig::rings` resizes the chip's task windows, heap rings and dependency pools
//! for that dispatch only (a `None` field keeps the chip's value). The level-2 program is
//! prepared once and dispatched four times, each with its own `CallConfig` (`run_with`).
//!
//! Run with `cargo run --release --example chip_ring_configs` (or `cargo xtask sim`). Prints
//! a final line starting with `ok:` and exits non-zero if a result differs from the host
//! golden.

use std::process::ExitCode;
use strata::prelude::*;
use strata::types::RingOverride;

const N: u64 = 128 * 128;

/// Every ring sized alike.
fn uniform(task_window: u64, heap_bytes: u64, dep_pool: u64) -> CallConfig {
    CallConfig::default().with_rings(RingOverride {
        task_window: Some(task_window),
        heap_bytes: Some(heap_bytes),
        dep_pool: Some(dep_pool),
    })
}

/// `out = a + b`, one AIV task.
fn vector_add() -> Program {
    let mut p = Program::new(
        "vector_add",
        Signature::new()
            .input("a", DataType::F32, [N])
            .input("b", DataType::F32, [N])
            .output("out", DataType::F32, [N]),
    );
    let add = p.kernel("vector_add", |ctx| {
        let a = ctx.input::<f32>(0)?;
        let b = ctx.input::<f32>(1)?;
        let mut out = ctx.output::<f32>(2)?;
        let (a, b) = (a.as_slice(), b.as_slice());
        let (Some(a), Some(b), Some(out)) = (a, b, out.as_mut_slice()) else {
            return Err("vector_add needs contiguous tensors".into());
        };
        for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
            *o = x + y;
        }
        Ok(())
    });
    p.orchestrate_chip(move |o, args| {
        o.submit_aiv(
            add,
            CoreArgs::new()
                .input(&args.tensor(0)?)
                .input(&args.tensor(1)?)
                .output(&args.tensor(2)?),
        )?;
        Ok(())
    });
    p
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let mut per_ring = CallConfig::default();
    for (i, ring) in per_ring.rings.iter_mut().enumerate() {
        *ring = RingOverride::default()
            .with_task_window([128, 64, 32, 16][i])
            .with_heap_bytes([8u64, 4, 2, 1][i] << 20)
            .with_dep_pool([256, 128, 64, 64][i]);
    }
    let configs = [
        (
            "window 16, heap 1 MiB, dep pool 64",
            uniform(16, 1 << 20, 64),
        ),
        (
            "window 128, heap 8 MiB, dep pool 256",
            uniform(128, 8 << 20, 256),
        ),
        ("per ring", per_ring),
        ("defaults", CallConfig::default()),
    ];

    let a: Vec<f32> = (0..N).map(|i| (i % 1000) as f32 * 0.125).collect();
    let b: Vec<f32> = (0..N).map(|i| 3.0 - (i % 7) as f32).collect();
    let golden: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let compiled = vector_add().compile(&Target::chip(ChipConfig::default()))?;
    let (a_t, b_t) = (
        SharedTensor::from_data(&[N], &a)?,
        SharedTensor::from_data(&[N], &b)?,
    );
    let out_t = SharedTensor::zeroed(&[N], DataType::F32)?;
    let rt = compiled.prepare(Prepare::new())?;
    for (name, config) in &configs {
        out_t.write(&vec![0f32; N as usize])?;
        rt.run_with(&compiled, (&a_t, &b_t, &out_t), config)
            .map_err(|e| format!("rings {name}: {e}"))?;
        if out_t.to_vec::<f32>()? != golden {
            return Err(format!("rings {name}: out differs from the host golden").into());
        }
        println!("rings {name:<38} ok");
    }
    rt.close()?;
    Ok(format!(
        "ok: vector_add passed under {} ring configurations",
        configs.len()
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_ring_configs: {e}");
            ExitCode::FAILURE
        }
    }
}
