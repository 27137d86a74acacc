//! E5 and SPMD: a task of `block_num` blocks runs its kernel once per block, and a kernel
//! learns where it runs from its context (`block_idx`, `block_num`, `sub_block_id`).
//!
//! 1. One MIX task (AIC + AIV0 + AIV1 on one cluster) whose three kernels write
//!    `[block_idx, block_num, sub_block_id]` at float offset 16·slot of one INOUT tensor.
//! 2. An AIV task of 37 blocks on a chip of two AIV cores: the blocks queue, each writes
//!    its own four floats of a shared output.
//! 3. The reference's merge_pipeline_barrier on an 8-core chip: 8 blocks started together
//!    (`require_sync_start`) meet at a barrier inside the kernel — which only works if they
//!    really run at once — then each computes `2x + 3` over its chunk.
//!
//! Each part is a level-2 program compiled for its own chip configuration and run once;
//! the block count of part 2 is a scalar parameter given at dispatch, that of part 3 a
//! scalar fixed in the signature (`fixed_scalar`).
//!
//! Run with `cargo run --release --example chip_spmd` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if a result differs from the host
//! golden.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata::chip::MixedKernels;
use strata::prelude::*;
use strata::types::CallbackResult;

/// Writes `[block_idx, block_num, sub_block_id]` (AIC: the first two) at 16·slot.
fn where_am_i(ctx: &mut KernelCtx<'_>, slot: u64, is_aic: bool) -> CallbackResult {
    let out = ctx.shared::<f32>(0)?;
    out.store_flat(16 * slot, ctx.block_idx() as f32);
    out.store_flat(16 * slot + 1, ctx.block_num() as f32);
    if !is_aic {
        out.store_flat(16 * slot + 2, ctx.sub_block_id() as f32);
    }
    Ok(())
}

fn mix_task() -> Result<(), Box<dyn std::error::Error>> {
    let mut p = Program::new(
        "spmd_basic",
        Signature::new().inout("out", DataType::F32, [48u64]),
    );
    let aic = p.kernel("spmd_aic", |ctx| where_am_i(ctx, 0, true));
    let aiv = p.kernel("spmd_aiv", |ctx| {
        let slot = 1 + ctx.sub_block_id() as u64;
        where_am_i(ctx, slot, false)
    });
    p.orchestrate_chip(move |o, args| {
        let kernels = MixedKernels::none()
            .with_aic(aic)
            .with_aiv0(aiv)
            .with_aiv1(aiv);
        o.submit(kernels, CoreArgs::new().inout(&args.tensor(0)?))?;
        Ok(())
    });
    let out_t = SharedTensor::zeroed(&[48], DataType::F32)?;
    p.compile(&Target::chip(ChipConfig::default()))?
        .run_once((&out_t,))?;
    let out = out_t.to_vec::<f32>()?;
    let mut golden = vec![0f32; 48];
    golden[..2].copy_from_slice(&[0.0, 1.0]); // AIC: block 0 of 1
    golden[16..19].copy_from_slice(&[0.0, 1.0, 0.0]); // AIV0: sub-block 0
    golden[32..35].copy_from_slice(&[0.0, 1.0, 1.0]); // AIV1: sub-block 1
    if out != golden {
        return Err(format!("MIX task wrote {out:?}").into());
    }
    println!("MIX task: block index, block count and sub-block id exact");
    Ok(())
}

fn queued_blocks(blocks: u32) -> Result<(), Box<dyn std::error::Error>> {
    let n = 4 * blocks as u64;
    let mut p = Program::new(
        "spmd_blocks",
        Signature::new()
            .inout("out", DataType::F32, [n])
            .scalar("blocks", DataType::U32),
    );
    let k = p.kernel("spmd_blocks", |ctx| {
        let out = ctx.shared::<f32>(0)?;
        let at = 4 * ctx.block_idx() as u64;
        out.store_flat(at, ctx.block_idx() as f32);
        out.store_flat(at + 1, ctx.block_num() as f32);
        out.store_flat(at + 2, 1.0);
        Ok(())
    });
    p.orchestrate_chip(move |o, args| {
        let blocks: u32 = args.scalar(0)?;
        o.submit_aiv(k, CoreArgs::new().inout(&args.tensor(0)?).block_num(blocks))?;
        Ok(())
    });
    let out_t = SharedTensor::from_data(&[n], &vec![-1f32; n as usize])?;
    p.compile(&Target::chip(ChipConfig::default()))?
        .run_once((&out_t, blocks))?;
    let out = out_t.to_vec::<f32>()?;
    let golden: Vec<f32> = (0..blocks)
        .flat_map(|b| [b as f32, blocks as f32, 1.0, -1.0])
        .collect();
    if out != golden {
        return Err(format!("{blocks} blocks wrote {out:?}").into());
    }
    println!("{blocks} blocks on 2 AIV cores: every block ran once");
    Ok(())
}

fn barrier(blocks: u32) -> Result<(), Box<dyn std::error::Error>> {
    let mut p = Program::new(
        "merge_pipeline_barrier",
        Signature::new()
            .input("x", DataType::F32, [1024u64])
            .output("out", DataType::F32, [1024u64])
            .fixed_scalar("blocks", blocks),
    );
    let arrived = Arc::new(AtomicU32::new(0));
    let k = p.kernel("merge_pipeline_barrier", move |ctx| {
        let n = ctx.block_num();
        arrived.fetch_add(1, Ordering::AcqRel);
        let start = Instant::now();
        while arrived.load(Ordering::Acquire) < n {
            if ctx.cancelled() || start.elapsed() > Duration::from_secs(60) {
                return Err("barrier: a sibling block never arrived".into());
            }
            std::thread::yield_now();
        }
        let x = ctx.input::<f32>(0)?;
        let out = ctx.shared::<f32>(1)?;
        let xs = x.as_slice().ok_or("x must be contiguous")?;
        let chunk = xs.len() as u64 / n as u64;
        let first = ctx.block_idx() as u64 * chunk;
        for i in first..first + chunk {
            out.store_flat(i, 2.0 * xs[i as usize] + 3.0);
        }
        Ok(())
    });
    p.orchestrate_chip(move |o, args| {
        let mut task = CoreArgs::new();
        task.input(&args.tensor(0)?)
            .output(&args.tensor(1)?)
            .block_num(args.scalar::<u32>(0)?)
            .require_sync_start(true);
        o.submit_aiv(k, &task)?;
        Ok(())
    });
    let target = Target::chip(ChipConfig {
        aic_cores: 0,
        aiv_cores: blocks,
        ..ChipConfig::default()
    });
    let x: Vec<f32> = (0..1024).map(|i| i as f32 * 0.5).collect();
    let x_t = SharedTensor::from_data(&[1024], &x)?;
    let out_t = SharedTensor::zeroed(&[1024], DataType::F32)?;
    p.compile(&target)?.run_once((&x_t, &out_t))?;
    let out = out_t.to_vec::<f32>()?;
    let golden: Vec<f32> = x.iter().map(|v| 2.0 * v + 3.0).collect();
    if out != golden {
        return Err("merge_pipeline_barrier: out differs from 2x + 3".into());
    }
    println!("{blocks} blocks started together met at their barrier");
    Ok(())
}

fn main() -> ExitCode {
    match mix_task()
        .and_then(|()| queued_blocks(37))
        .and_then(|()| barrier(8))
    {
        Ok(()) => {
            println!("ok: SPMD context accessors exact; 37 queued blocks; 8-block barrier");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_spmd: {e}");
            ExitCode::FAILURE
        }
    }
}
