//! A batched tiled matmul.

use crate::kernels::{host_matmul, matmul_kernel};
use crate::support::{check_close, timed, Rng, WorkloadError, WorkloadReport};
use strata_chip::*;
use strata_types::{CallConfig, DataType};

/// A batched tiled matmul `C[b] = A[b] @ B[b]` (`batch` × `n`×`n`, tiles of `tile`): per
/// output tile and k-step an AIC task multiplies two tile views into a runtime-created
/// partial product and an AIV task accumulates it into the INOUT tile view of C — several
/// hundred tasks whose independence comes from disjoint tile views of the same buffers.
///
/// # Errors
/// A chip error or a mismatch against a host matmul.
pub fn batched_matmul(
    config: ChipConfig,
    batch: u64,
    n: u64,
    tile: u64,
) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let mm = chip.register_kernel_fn("tile_matmul", matmul_kernel(0))?;
    let acc = chip.register_kernel_fn("tile_accumulate", |ctx| {
        let p = ctx.input::<f32>(0)?;
        let mut c = ctx.output::<f32>(1)?;
        let p = p.as_slice().ok_or("partial product must be contiguous")?;
        let mut pos = 0;
        for run in c.runs_mut().ok_or("C tile overlaps itself")? {
            for (o, v) in run.iter_mut().zip(&p[pos..]) {
                *o += v;
            }
            pos += run.len();
        }
        Ok(())
    })?;
    let orch = chip.register_orchestration_fn("batched_matmul", move |o, args| {
        let (a, b, c) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let tiles = n / tile;
        let ci = TensorCreateInfo::new(DataType::F32, &[tile, tile]);
        let tile_of = |t: &ChipTensor, bi: u64, r: u64, k: u64| -> Result<ChipTensor, ChipError> {
            let w = t.window(&[bi, r * tile, k * tile], &[1, tile, tile])?;
            let v = w.view();
            // Drop the unit batch axis: a strided 2-D view of the tile.
            let view = strata_types::TensorView::new(
                v.dtype(),
                &[tile, tile],
                &v.strides()[1..],
                v.byte_offset(),
            )?;
            w.with_view(view)
        };
        for bi in 0..batch {
            for i in 0..tiles {
                for j in 0..tiles {
                    let c_tile = tile_of(&c, bi, i, j)?;
                    o.scope(|o| {
                        for k in 0..tiles {
                            let mut x = CoreArgs::new();
                            x.input(&tile_of(&a, bi, i, k)?)
                                .input(&tile_of(&b, bi, k, j)?)
                                .output_new(ci);
                            let p = o.submit_aic(mm, &x)?.get(0)?;
                            o.submit_aiv(acc, CoreArgs::new().input(&p).inout(&c_tile))?;
                        }
                        Ok(())
                    })?;
                }
            }
        }
        Ok(())
    })?;
    chip.init()?;
    let mut rng = Rng::new(7);
    let len = (batch * n * n) as usize;
    let a = rng.randn(len, 0.1);
    let b = rng.randn(len, 0.1);
    let mut c = vec![0f32; len];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.input(&a, &[batch, n, n])
        .input(&b, &[batch, n, n])
        .inout(&mut c, &[batch, n, n]);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    let m = (n * n) as usize;
    for bi in 0..batch as usize {
        let golden = host_matmul(
            &a[bi * m..(bi + 1) * m],
            &b[bi * m..(bi + 1) * m],
            n as usize,
            n as usize,
            n as usize,
        );
        check_close(
            &format!("C[{bi}]"),
            &c[bi * m..(bi + 1) * m],
            &golden,
            1e-3,
            1e-4,
        )?;
    }
    chip.close()?;
    Ok(rep)
}
