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
//! Run with `cargo run --release --example chip_spmd` (or `cargo xtask sim`). Prints a
//! final line starting with `ok:` and exits non-zero if a result differs from the host
//! golden.

use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata::chip::{ChipConfig, ChipWorker, CoreArgs, KernelCtx, MixedKernels, RunArgs};
use strata::types::{CallConfig, CallbackResult};

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

fn mix_task() -> Result<(), Box<dyn Error>> {
    let mut chip = ChipWorker::new(ChipConfig::default())?;
    let aic = chip.register_kernel_fn("spmd_aic", |ctx| where_am_i(ctx, 0, true))?;
    let aiv = chip.register_kernel_fn("spmd_aiv", |ctx| {
        let slot = 1 + ctx.sub_block_id() as u64;
        where_am_i(ctx, slot, false)
    })?;
    let orch = chip.register_orchestration_fn("spmd_basic", move |o, args| {
        let kernels = MixedKernels::none()
            .with_aic(aic)
            .with_aiv0(aiv)
            .with_aiv1(aiv);
        o.submit(kernels, CoreArgs::new().inout(&args.tensor(0)?))?;
        Ok(())
    })?;
    chip.init()?;
    let mut out = vec![0f32; 48];
    chip.run(
        &orch,
        RunArgs::new().inout(&mut out, &[48]),
        &CallConfig::default(),
    )?;
    chip.close()?;
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

fn queued_blocks(blocks: u32) -> Result<(), Box<dyn Error>> {
    let mut chip = ChipWorker::new(ChipConfig::default())?;
    let k = chip.register_kernel_fn("spmd_blocks", |ctx| {
        let out = ctx.shared::<f32>(0)?;
        let at = 4 * ctx.block_idx() as u64;
        out.store_flat(at, ctx.block_idx() as f32);
        out.store_flat(at + 1, ctx.block_num() as f32);
        out.store_flat(at + 2, 1.0);
        Ok(())
    })?;
    let orch = chip.register_orchestration_fn("spmd_blocks", move |o, args| {
        let blocks: u32 = args.scalar(0)?;
        o.submit_aiv(k, CoreArgs::new().inout(&args.tensor(0)?).block_num(blocks))?;
        Ok(())
    })?;
    chip.init()?;
    let n = 4 * blocks as u64;
    let mut out = vec![-1f32; n as usize];
    let mut args = RunArgs::new();
    args.inout(&mut out, &[n]).scalar(blocks);
    chip.run(&orch, &mut args, &CallConfig::default())?;
    chip.close()?;
    let golden: Vec<f32> = (0..blocks)
        .flat_map(|b| [b as f32, blocks as f32, 1.0, -1.0])
        .collect();
    if out != golden {
        return Err(format!("{blocks} blocks wrote {out:?}").into());
    }
    println!("{blocks} blocks on 2 AIV cores: every block ran once");
    Ok(())
}

fn barrier(blocks: u32) -> Result<(), Box<dyn Error>> {
    let mut chip = ChipWorker::new(ChipConfig {
        aic_cores: 0,
        aiv_cores: blocks,
        ..ChipConfig::default()
    })?;
    let arrived = Arc::new(AtomicU32::new(0));
    let k = chip.register_kernel_fn("merge_pipeline_barrier", move |ctx| {
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
    })?;
    let orch = chip.register_orchestration_fn("merge_pipeline_barrier", move |o, args| {
        let mut task = CoreArgs::new();
        task.input(&args.tensor(0)?)
            .output(&args.tensor(1)?)
            .block_num(args.scalar::<u32>(0)?)
            .require_sync_start(true);
        o.submit_aiv(k, &task)?;
        Ok(())
    })?;
    chip.init()?;
    let x: Vec<f32> = (0..1024).map(|i| i as f32 * 0.5).collect();
    let mut out = vec![0f32; 1024];
    let mut args = RunArgs::new();
    args.input(&x, &[1024])
        .output(&mut out, &[1024])
        .scalar(blocks);
    chip.run(&orch, &mut args, &CallConfig::default())?;
    chip.close()?;
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
