//! E5 and SPMD: context accessors, more blocks than cores, an intra-task barrier.

use crate::support::{check_close, timed, WorkloadError, WorkloadReport};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_chip::*;
use strata_types::{CallConfig, CallbackResult};

fn spmd_writer(
    slot_of: fn(&KernelCtx<'_>) -> u64,
    aic: bool,
) -> impl Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static {
    move |ctx| {
        let out = ctx.shared::<f32>(0)?;
        let base = 16 * slot_of(ctx);
        out.store_flat(base, ctx.block_idx() as f32);
        out.store_flat(base + 1, ctx.block_num() as f32);
        if !aic {
            out.store_flat(base + 2, ctx.sub_block_id() as f32);
        }
        Ok(())
    }
}

/// E5: one MIX task (AIC, AIV0, AIV1) whose kernels write `[block_idx, block_num,
/// sub_block_id]` at float offset 16·slot of one INOUT tensor; compared exactly.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e5_spmd_basic(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let k0 = chip.register_kernel_fn("spmd_aic", spmd_writer(|_| 0, true))?;
    let k1 = chip.register_kernel_fn(
        "spmd_aiv0",
        spmd_writer(|c| 1 + c.sub_block_id() as u64, false),
    )?;
    let k2 = chip.register_kernel_fn(
        "spmd_aiv1",
        spmd_writer(|c| 1 + c.sub_block_id() as u64, false),
    )?;
    let orch = chip.register_orchestration_fn("spmd_basic", move |o, args| {
        let mut x = CoreArgs::new();
        x.inout(&args.tensor(0)?);
        o.submit(
            MixedKernels::none()
                .with_aic(k0)
                .with_aiv0(k1)
                .with_aiv1(k2),
            &x,
        )?;
        Ok(())
    })?;
    chip.init()?;
    let mut out = vec![0f32; 48];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.inout(&mut out, &[48]);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    let mut golden = vec![0f32; 48];
    golden[..2].copy_from_slice(&[0.0, 1.0]);
    golden[16..19].copy_from_slice(&[0.0, 1.0, 0.0]);
    golden[32..35].copy_from_slice(&[0.0, 1.0, 1.0]);
    check_close("out", &out, &golden, 0.0, 0.0)?;
    chip.close()?;
    Ok(rep)
}

/// SPMD with many blocks: an AIV task with `block_num` blocks where each block writes
/// `[block_idx, block_num, 1]` at offset 4·block_idx (element-wise shared access).
///
/// # Errors
/// A chip error or a mismatch.
pub fn spmd_blocks(config: ChipConfig, block_num: u32) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let k = chip.register_kernel_fn("spmd_blocks", |ctx| {
        let out = ctx.shared::<f32>(0)?;
        let b = ctx.block_idx() as u64;
        out.store_flat(4 * b, ctx.block_idx() as f32);
        out.store_flat(4 * b + 1, ctx.block_num() as f32);
        out.store_flat(4 * b + 2, 1.0);
        Ok(())
    })?;
    let orch = chip.register_orchestration_fn("spmd_blocks", move |o, args| {
        let mut x = CoreArgs::new();
        x.inout(&args.tensor(0)?).block_num(args.scalar::<u32>(0)?);
        o.submit_aiv(k, &x)?;
        Ok(())
    })?;
    chip.init()?;
    let n = 4 * block_num as usize;
    let mut out = vec![-1f32; n];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.inout(&mut out, &[n as u64]).scalar(block_num);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    let golden: Vec<f32> = (0..block_num)
        .flat_map(|b| [b as f32, block_num as f32, 1.0, -1.0])
        .collect();
    check_close("out", &out, &golden, 0.0, 0.0)?;
    chip.close()?;
    Ok(rep)
}

/// The reference's `merge_pipeline_barrier`: one AIV task of `blocks` blocks started
/// together (`require_sync_start`); every block waits at an intra-task barrier for all
/// its siblings (so they must run concurrently), then writes `2x + 3` over its chunk of
/// 1024 f32.
///
/// # Errors
/// A chip error or a mismatch.
pub fn spmd_barrier(config: ChipConfig, blocks: u32) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let arrived = Arc::new(AtomicU32::new(0));
    let arr = arrived.clone();
    let k = chip.register_kernel_fn("merge_pipeline_barrier", move |ctx| {
        let n = ctx.block_num();
        arr.fetch_add(1, Ordering::AcqRel);
        let t = Instant::now();
        while arr.load(Ordering::Acquire) < n {
            if ctx.cancelled() || t.elapsed() > Duration::from_secs(60) {
                return Err("barrier: a sibling block never arrived".into());
            }
            std::thread::yield_now();
        }
        let x = ctx.input::<f32>(0)?;
        let out = ctx.shared::<f32>(1)?;
        let len = x.numel() as u64;
        let chunk = len / n as u64;
        let start = ctx.block_idx() as u64 * chunk;
        let xs = x.as_slice().ok_or("x must be contiguous")?;
        for i in start..start + chunk {
            out.store_flat(i, 2.0 * xs[i as usize] + 3.0);
        }
        Ok(())
    })?;
    let orch = chip.register_orchestration_fn("merge_pipeline_barrier", move |o, args| {
        let mut x = CoreArgs::new();
        x.input(&args.tensor(0)?)
            .output(&args.tensor(1)?)
            .block_num(args.scalar::<u32>(0)?)
            .require_sync_start(true);
        o.submit_aiv(k, &x)?;
        Ok(())
    })?;
    chip.init()?;
    let x: Vec<f32> = (0..1024).map(|i| i as f32 * 0.5).collect();
    let mut out = vec![0f32; 1024];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.input(&x, &[1024])
        .output(&mut out, &[1024])
        .scalar(blocks);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    let golden: Vec<f32> = x.iter().map(|v| 2.0 * v + 3.0).collect();
    check_close("out", &out, &golden, 0.0, 0.0)?;
    chip.close()?;
    Ok(rep)
}
