//! The kernels the workloads share (element-wise add / mul, add-a-scalar, a matmul) and
//! the host matmul their goldens use.

use strata_chip::{KernelCtx, KernelError};
use strata_types::CallbackResult;

/// `out = a + b` over args `base`, `base+1` (inputs) and `base+2` (output), any shape.
pub fn add_kernel(
    base: usize,
) -> impl Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static {
    move |ctx| binary(ctx, base, |x, y| x + y)
}

/// `out = a * b` over args `base..base+3`.
pub fn mul_kernel(
    base: usize,
) -> impl Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static {
    move |ctx| binary(ctx, base, |x, y| x * y)
}

fn binary(ctx: &mut KernelCtx<'_>, base: usize, op: impl Fn(f32, f32) -> f32) -> CallbackResult {
    let a = ctx.input::<f32>(base)?;
    let b = ctx.input::<f32>(base + 1)?;
    let mut out = ctx.output::<f32>(base + 2)?;
    if let (Some(a), Some(b), Some(o)) = (a.as_slice(), b.as_slice(), out.as_mut_slice()) {
        if a.len() != o.len() || b.len() != o.len() {
            return Err(KernelError::new(format!(
                "length mismatch: {} + {} -> {}",
                a.len(),
                b.len(),
                o.len()
            ))
            .into());
        }
        for ((o, x), y) in o.iter_mut().zip(a).zip(b) {
            *o = op(*x, *y);
        }
        return Ok(());
    }
    let (av, bv) = (a.to_vec(), b.to_vec());
    if av.len() != out.numel() || bv.len() != out.numel() {
        return Err("length mismatch".into());
    }
    for i in 0..av.len() {
        out.set_flat(i as u64, op(av[i], bv[i]))?;
    }
    Ok(())
}

/// `out(1) = in(0) + scalar 0 (f32)`.
pub fn add_scalar_kernel(ctx: &mut KernelCtx<'_>) -> CallbackResult {
    let s: f32 = ctx.scalar(0)?;
    let a = ctx.input::<f32>(0)?;
    let mut out = ctx.output::<f32>(1)?;
    let a = a.as_slice().ok_or("input must be contiguous")?;
    for (o, x) in out
        .as_mut_slice()
        .ok_or("output must be contiguous")?
        .iter_mut()
        .zip(a)
    {
        *o = x + s;
    }
    Ok(())
}

/// `C(base+2) = A(base) @ B(base+1)`; 2-D views, or 1-D views read as square matrices.
pub fn matmul_kernel(
    base: usize,
) -> impl Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static {
    move |ctx| {
        let a = ctx.input::<f32>(base)?;
        let b = ctx.input::<f32>(base + 1)?;
        let mut c = ctx.output::<f32>(base + 2)?;
        let dims = |v: &[u64], n: usize| -> Option<(usize, usize)> {
            match v {
                [r, c] => Some((*r as usize, *c as usize)),
                [len] => {
                    let s = (*len as f64).sqrt() as usize;
                    (s * s == n).then_some((s, s))
                }
                _ => None,
            }
        };
        let (m, k) = dims(a.shape(), a.numel()).ok_or("A must be 2-D")?;
        let (k2, n) = dims(b.shape(), b.numel()).ok_or("B must be 2-D")?;
        if k != k2 || c.numel() != m * n {
            return Err(KernelError::new(format!(
                "shape mismatch {m}x{k} @ {k2}x{n} -> {}",
                c.numel()
            ))
            .into());
        }
        let av = a.to_vec();
        let bv = b.to_vec();
        let mut acc = vec![0f32; m * n];
        for i in 0..m {
            for p in 0..k {
                let x = av[i * k + p];
                let brow = &bv[p * n..p * n + n];
                for (o, y) in acc[i * n..i * n + n].iter_mut().zip(brow) {
                    *o += x * y;
                }
            }
        }
        match c.runs_mut() {
            Some(runs) => {
                let mut pos = 0;
                for run in runs {
                    run.copy_from_slice(&acc[pos..pos + run.len()]);
                    pos += run.len();
                }
            }
            None => return Err("C must not overlap itself".into()),
        }
        Ok(())
    }
}

/// `C = A @ B` on the host, row-major `m×k` by `k×n`: the goldens' matmul.
pub fn host_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}
