//! Element-wise reductions for the collectives: a rank-order fold of several sources into
//! a destination, in blocks that stay in L1 and loops the compiler vectorises.

use half::slice::HalfFloatSliceExt;
use strata_types::{bf16, f16, DataType};

/// The reduction of [`crate::Window::allreduce`] and [`crate::Window::reduce_scatter`].
///
/// Floats are combined in f32 (f16 and bf16 are widened, folded, and rounded once per
/// fold); i32 `Sum` and `Prod` wrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `a + b`
    Sum,
    /// `max(a, b)` (for floats, a NaN loses to a number)
    Max,
    /// `min(a, b)` (for floats, a NaN loses to a number)
    Min,
    /// `a * b`
    Prod,
}

impl ReduceOp {
    /// Every op, in code order.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];

    /// The op for a wire code (as carried in a task scalar), if any.
    ///
    /// ```
    /// # use strata_comm::ReduceOp;
    /// assert_eq!(ReduceOp::from_code(ReduceOp::Max.code()), Some(ReduceOp::Max));
    /// assert_eq!(ReduceOp::from_code(0), None);
    /// ```
    pub fn from_code(code: u64) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|o| o.code() == code)
    }

    /// The op's wire code (1..=4).
    pub fn code(self) -> u64 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Prod => 4,
        }
    }
}

/// Dtypes the reducing collectives accept.
pub(crate) const SUPPORTED: &str = "f32, f16, bf16, i32";

pub(crate) fn supported(d: DataType) -> bool {
    matches!(
        d,
        DataType::F32 | DataType::F16 | DataType::BF16 | DataType::I32
    )
}

/// Elements per block: 4 KiB of f32 accumulators (small inputs use a 64-element block,
/// so a tiny reduction does not clear 4 KiB of stack).
const BLOCK: usize = 1024;
const SMALL_BLOCK: usize = 64;

fn combine_f32(op: ReduceOp, acc: &mut [f32], x: &[f32]) {
    match op {
        ReduceOp::Sum => acc.iter_mut().zip(x).for_each(|(a, b)| *a += *b),
        ReduceOp::Max => acc.iter_mut().zip(x).for_each(|(a, b)| *a = a.max(*b)),
        ReduceOp::Min => acc.iter_mut().zip(x).for_each(|(a, b)| *a = a.min(*b)),
        ReduceOp::Prod => acc.iter_mut().zip(x).for_each(|(a, b)| *a *= *b),
    }
}

fn combine_i32(op: ReduceOp, acc: &mut [i32], x: &[i32]) {
    match op {
        ReduceOp::Sum => acc
            .iter_mut()
            .zip(x)
            .for_each(|(a, b)| *a = a.wrapping_add(*b)),
        ReduceOp::Max => acc.iter_mut().zip(x).for_each(|(a, b)| *a = (*a).max(*b)),
        ReduceOp::Min => acc.iter_mut().zip(x).for_each(|(a, b)| *a = (*a).min(*b)),
        ReduceOp::Prod => acc
            .iter_mut()
            .zip(x)
            .for_each(|(a, b)| *a = a.wrapping_mul(*b)),
    }
}

/// # Safety
/// `p` points at `n` readable, aligned `T`s that nobody writes during the call.
unsafe fn src<'x, T>(p: *const u8, n: usize) -> &'x [T] {
    // SAFETY: per the function contract.
    unsafe { std::slice::from_raw_parts(p.cast::<T>(), n) }
}

/// `out[i] = fold(op, srcs[0][i], srcs[1][i], ...)` for `i < numel`, in source order.
/// `out` may be one of the sources (each block is read from every source before it is
/// written).
///
/// # Safety
/// Each source points at `numel` aligned elements of `dtype` that nobody writes during the
/// call (except through `out`, block by block as described); `out` at `numel` writable
/// elements nobody else accesses. `srcs` is not empty; `dtype` is [`supported`].
pub(crate) unsafe fn reduce_into(
    dtype: DataType,
    op: ReduceOp,
    srcs: &[*const u8],
    out: *mut u8,
    numel: usize,
) {
    // SAFETY: forwarded contract.
    unsafe { reduce_into_all(dtype, op, srcs, &[out], numel) }
}

/// Like [`reduce_into`], writing the result into every one of `outs` (the two-phase
/// allreduce's reduce-scatter with a pushed allgather). Any output may be a source.
///
/// # Safety
/// As [`reduce_into`], for every output; `outs` is not empty.
pub(crate) unsafe fn reduce_into_all(
    dtype: DataType,
    op: ReduceOp,
    srcs: &[*const u8],
    outs: &[*mut u8],
    numel: usize,
) {
    debug_assert!(!srcs.is_empty() && !outs.is_empty() && supported(dtype));
    // SAFETY: forwarded contract.
    unsafe {
        if numel <= SMALL_BLOCK {
            reduce_blocks::<SMALL_BLOCK>(dtype, op, srcs, outs, numel)
        } else {
            reduce_blocks::<BLOCK>(dtype, op, srcs, outs, numel)
        }
    }
}

/// Copies `bytes` from `src` to `dst`.
///
/// # Safety
/// Both ranges valid and disjoint.
#[inline(always)]
unsafe fn put(src: *const u8, dst: *mut u8, bytes: usize) {
    // SAFETY: per the function contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
}

/// [`reduce_into_all`] in blocks of `B` elements.
///
/// # Safety
/// As [`reduce_into_all`].
unsafe fn reduce_blocks<const B: usize>(
    dtype: DataType,
    op: ReduceOp,
    srcs: &[*const u8],
    outs: &[*mut u8],
    numel: usize,
) {
    let es = dtype.size_bytes();
    let mut start = 0;
    // SAFETY: (block loop) every pointer below stays within `numel` elements of its
    // source or output; the shared slices of a block are dropped before any output's
    // block is written.
    unsafe {
        match dtype {
            DataType::F32 => {
                let mut acc = [0f32; B];
                while start < numel {
                    let n = B.min(numel - start);
                    let off = start * es;
                    acc[..n].copy_from_slice(src::<f32>(srcs[0].add(off), n));
                    for s in &srcs[1..] {
                        combine_f32(op, &mut acc[..n], src::<f32>(s.add(off), n));
                    }
                    for o in outs {
                        put(acc.as_ptr().cast(), o.add(off), n * es);
                    }
                    start += n;
                }
            }
            DataType::I32 => {
                let mut acc = [0i32; B];
                while start < numel {
                    let n = B.min(numel - start);
                    let off = start * es;
                    acc[..n].copy_from_slice(src::<i32>(srcs[0].add(off), n));
                    for s in &srcs[1..] {
                        combine_i32(op, &mut acc[..n], src::<i32>(s.add(off), n));
                    }
                    for o in outs {
                        put(acc.as_ptr().cast(), o.add(off), n * es);
                    }
                    start += n;
                }
            }
            DataType::F16 => {
                let (mut acc, mut tmp, mut res) = ([0f32; B], [0f32; B], [f16::ZERO; B]);
                while start < numel {
                    let n = B.min(numel - start);
                    let off = start * es;
                    src::<f16>(srcs[0].add(off), n).convert_to_f32_slice(&mut acc[..n]);
                    for s in &srcs[1..] {
                        src::<f16>(s.add(off), n).convert_to_f32_slice(&mut tmp[..n]);
                        combine_f32(op, &mut acc[..n], &tmp[..n]);
                    }
                    res[..n].convert_from_f32_slice(&acc[..n]);
                    for o in outs {
                        put(res.as_ptr().cast(), o.add(off), n * es);
                    }
                    start += n;
                }
            }
            DataType::BF16 => {
                let (mut acc, mut tmp, mut res) = ([0f32; B], [0f32; B], [bf16::ZERO; B]);
                while start < numel {
                    let n = B.min(numel - start);
                    let off = start * es;
                    src::<bf16>(srcs[0].add(off), n).convert_to_f32_slice(&mut acc[..n]);
                    for s in &srcs[1..] {
                        src::<bf16>(s.add(off), n).convert_to_f32_slice(&mut tmp[..n]);
                        combine_f32(op, &mut acc[..n], &tmp[..n]);
                    }
                    res[..n].convert_from_f32_slice(&acc[..n]);
                    for o in outs {
                        put(res.as_ptr().cast(), o.add(off), n * es);
                    }
                    start += n;
                }
            }
            _ => unreachable!("reduce_into called with unsupported dtype {dtype}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_in_source_order_in_place() {
        let a: Vec<f32> = (0..3000).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..3000).map(|i| 2.0 * i as f32).collect();
        let mut out = a.clone();
        let p = out.as_mut_ptr().cast::<u8>();
        // SAFETY: both sources are live slices of 3000 f32; `out` is one of them.
        unsafe {
            reduce_into(
                DataType::F32,
                ReduceOp::Sum,
                &[p as *const u8, b.as_ptr().cast()],
                p,
                3000,
            )
        };
        assert!(out.iter().enumerate().all(|(i, &v)| v == 3.0 * i as f32));
        let x: Vec<i32> = vec![3, -4, i32::MAX];
        let y: Vec<i32> = vec![5, 9, 1];
        let mut o = vec![0i32; 3];
        for (op, want) in [
            (ReduceOp::Sum, vec![8, 5, i32::MIN]),
            (ReduceOp::Max, vec![5, 9, i32::MAX]),
            (ReduceOp::Min, vec![3, -4, 1]),
            (ReduceOp::Prod, vec![15, -36, i32::MAX]),
        ] {
            // SAFETY: live slices of 3 i32.
            unsafe {
                reduce_into(
                    DataType::I32,
                    op,
                    &[x.as_ptr().cast(), y.as_ptr().cast()],
                    o.as_mut_ptr().cast(),
                    3,
                )
            };
            assert_eq!(o, want, "{op:?}");
        }
        let h: Vec<f16> = [1.0f32, 2.5, -3.0]
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        let mut ho = vec![f16::ZERO; 3];
        // SAFETY: live slices of 3 f16.
        unsafe {
            reduce_into(
                DataType::F16,
                ReduceOp::Prod,
                &[h.as_ptr().cast(), h.as_ptr().cast()],
                ho.as_mut_ptr().cast(),
                3,
            )
        };
        assert_eq!(ho, [1.0f32, 6.25, 9.0].map(f16::from_f32));
    }
}
