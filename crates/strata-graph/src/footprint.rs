//! Footprints: the bytes of a buffer a tensor view may touch, and how two footprints of the
//! same buffer overlap.
//!
//! Overlap is judged first on bounding byte ranges; where both views are dense byte ranges
//! the range test is exact; where both views share one regular row-major lattice (same
//! element size, rank and strides, innermost stride 1, each stride a multiple of the next,
//! no axis wrapping into the next row) the test is exact per axis. Anything else that
//! intersects is [`Overlap::Partial`]: a false dependency is possible, a missed one never.

use std::sync::Arc;
use strata_types::{TensorView, TypesError, MAX_DIMS};

/// How a probe footprint relates to an existing entry's footprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Provably no byte in common.
    None,
    /// Some (or possibly some) bytes in common, but the probe does not provably contain
    /// every byte of the entry.
    Partial,
    /// The probe contains every byte the entry may touch.
    Covered,
}

/// Per-axis coordinates of a view on a regular row-major lattice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lattice {
    elem: u8,
    ndims: u8,
    strides: [u64; MAX_DIMS],
    lo: [u64; MAX_DIMS],
    hi: [u64; MAX_DIMS],
}

impl Lattice {
    fn of(view: &TensorView) -> Option<Lattice> {
        let n = view.ndims();
        let strides = view.strides();
        let shape = view.shape();
        if strides[n - 1] != 1 {
            return None;
        }
        for k in 0..n - 1 {
            if strides[k + 1] == 0 || strides[k] % strides[k + 1] != 0 {
                return None;
            }
        }
        let elem = view.dtype().size_bytes() as u64;
        let mut rem = view.byte_offset() / elem;
        let mut lat = Lattice {
            elem: elem as u8,
            ndims: n as u8,
            strides: [0; MAX_DIMS],
            lo: [0; MAX_DIMS],
            hi: [0; MAX_DIMS],
        };
        for k in 0..n {
            let c = rem / strides[k];
            rem %= strides[k];
            // Axis k > 0 must not wrap into the next index of axis k-1.
            if k > 0 {
                let radix = strides[k - 1] / strides[k];
                if c.checked_add(shape[k])? > radix {
                    return None;
                }
            }
            lat.strides[k] = strides[k];
            lat.lo[k] = c;
            lat.hi[k] = c.checked_add(shape[k])?;
        }
        Some(lat)
    }

    /// Whether both views lie on one lattice (same element size, rank and strides), so
    /// that [`Footprint::overlap`] compares them per axis.
    pub(crate) fn same_grid(&self, other: &Lattice) -> bool {
        self.elem == other.elem && self.ndims == other.ndims && self.strides == other.strides
    }

    /// The view's coordinates `[lo, hi)` on the innermost axis.
    pub(crate) fn inner(&self) -> (u64, u64) {
        let k = self.ndims as usize - 1;
        (self.lo[k], self.hi[k])
    }
}

/// The bytes of one buffer that an access may touch.
///
/// ```
/// use strata_graph::{Footprint, Overlap};
/// use strata_types::{DataType, TensorView};
/// let m = TensorView::contiguous(DataType::F32, &[16, 16]).unwrap();
/// let left = Footprint::of_view(&m.slice(1, 0, 4).unwrap());
/// let right = Footprint::of_view(&m.slice(1, 8, 12).unwrap());
/// assert_eq!(left.overlap(&right), Overlap::None); // interleaved rows, disjoint columns
/// assert_eq!(Footprint::of_view(&m).overlap(&left), Overlap::Covered);
/// assert_eq!(Footprint::WHOLE.overlap(&left), Overlap::Covered);
/// ```
///
/// A footprint is 32 bytes; the per-axis description of a regular multi-axis view is
/// shared behind an `Arc`, so cloning never copies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint(Repr);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    Whole,
    View {
        start: u64,
        end: u64,
        /// Every byte in `[start, end)` is an element of the view.
        dense: bool,
        /// Per-axis coordinates, for regular views of two or more axes (a regular 1-D
        /// view is dense, and dense ranges are compared exactly without it).
        lattice: Option<Arc<Lattice>>,
    },
}

impl Footprint {
    /// Every byte of the buffer (an access that does not describe a view).
    pub const WHOLE: Footprint = Footprint(Repr::Whole);

    /// The footprint of a tensor view.
    pub fn of_view(view: &TensorView) -> Footprint {
        let (start, end) = view.byte_span();
        let lattice = if view.ndims() > 1 {
            Lattice::of(view).map(Arc::new)
        } else {
            None
        };
        Footprint(Repr::View {
            start,
            end,
            dense: view.is_contiguous(),
            lattice,
        })
    }

    /// The footprint of a dense byte range `[start, end)` (`start < end`).
    ///
    /// # Errors
    /// [`TypesError::RangeOutOfBounds`] for an empty or reversed range.
    pub fn bytes(start: u64, end: u64) -> Result<Footprint, TypesError> {
        if start >= end {
            return Err(TypesError::RangeOutOfBounds {
                axis: 0,
                start,
                end,
                len: end,
            });
        }
        Ok(Footprint(Repr::View {
            start,
            end,
            dense: true,
            lattice: None,
        }))
    }

    /// The half-open byte range `[start, end)` the access may touch (`[0, u64::MAX)` for
    /// the whole buffer).
    pub fn span(&self) -> (u64, u64) {
        match self.0 {
            Repr::Whole => (0, u64::MAX),
            Repr::View { start, end, .. } => (start, end),
        }
    }

    /// Whether every byte of the span is touched (a dense range; not the whole buffer).
    pub(crate) fn is_dense(&self) -> bool {
        matches!(self.0, Repr::View { dense: true, .. })
    }

    /// The lattice of a regular view of two or more axes.
    ///
    /// Two footprints on one grid ([`Lattice::same_grid`]) that do not provably miss each
    /// other ([`Footprint::overlap`] is not `None`) share an element, so their
    /// coordinates intersect on every axis: the TensorMap's span index relies on this.
    pub(crate) fn lattice(&self) -> Option<&Arc<Lattice>> {
        match &self.0 {
            Repr::View { lattice, .. } => lattice.as_ref(),
            Repr::Whole => None,
        }
    }

    /// How `self` (a new access) relates to `entry` (an earlier access of the same buffer).
    pub fn overlap(&self, entry: &Footprint) -> Overlap {
        let (ps, pe) = self.span();
        let (es, ee) = entry.span();
        if pe <= es || ee <= ps {
            return Overlap::None;
        }
        let span_inside = ps <= es && ee <= pe;
        match (&self.0, &entry.0) {
            (Repr::Whole, _) => Overlap::Covered,
            (_, Repr::Whole) => Overlap::Partial,
            (
                Repr::View {
                    dense: pd,
                    lattice: pl,
                    ..
                },
                Repr::View {
                    dense: ed,
                    lattice: el,
                    ..
                },
            ) => {
                if *pd && span_inside {
                    // A dense probe covers every byte inside its range.
                    return Overlap::Covered;
                }
                if *pd && *ed {
                    // Two dense ranges that intersect but are not nested.
                    return Overlap::Partial;
                }
                if let (Some(p), Some(e)) = (pl, el) {
                    if p.same_grid(e) {
                        let n = p.ndims as usize;
                        let mut covers = true;
                        for k in 0..n {
                            if p.hi[k] <= e.lo[k] || e.hi[k] <= p.lo[k] {
                                return Overlap::None;
                            }
                            covers &= p.lo[k] <= e.lo[k] && e.hi[k] <= p.hi[k];
                        }
                        return if covers {
                            Overlap::Covered
                        } else {
                            Overlap::Partial
                        };
                    }
                }
                Overlap::Partial
            }
        }
    }

    /// Whether the two footprints provably share a byte: both dense ranges that
    /// intersect, both on one lattice and intersecting on every axis, or one of them the
    /// whole buffer. (A conservative [`Overlap::Partial`] from unrelated layouts is not
    /// proof.)
    pub fn certainly_intersects(&self, other: &Footprint) -> bool {
        if self.overlap(other) == Overlap::None {
            return false;
        }
        match (&self.0, &other.0) {
            (Repr::Whole, _) | (_, Repr::Whole) => true,
            (
                Repr::View {
                    dense: d1,
                    lattice: l1,
                    ..
                },
                Repr::View {
                    dense: d2,
                    lattice: l2,
                    ..
                },
            ) => (*d1 && *d2) || matches!((l1, l2), (Some(a), Some(b)) if a.same_grid(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Ports of the reference's overlap cases (test_tensormap.cpp) plus exhaustive checks
    //! against a brute-force byte-set oracle.
    use super::*;
    use proptest::prelude::*;
    use strata_types::DataType;

    fn br(b: u64, e: u64) -> Footprint {
        // 1-D u8 view [b, e) of a 4096-byte backing.
        let v = TensorView::contiguous(DataType::U8, &[4096])
            .unwrap()
            .slice(0, b, e)
            .unwrap();
        Footprint::of_view(&v)
    }

    fn tile(r0: u64, rows: u64, c0: u64, cols: u64, nr: u64, nc: u64) -> Footprint {
        let v = TensorView::contiguous(DataType::U8, &[nr, nc])
            .unwrap()
            .window(&[r0, c0], &[rows, cols])
            .unwrap();
        Footprint::of_view(&v)
    }

    #[test]
    fn touching_ranges_do_not_overlap() {
        assert_eq!(br(64, 128).overlap(&br(0, 64)), Overlap::None);
        assert_ne!(br(63, 128).overlap(&br(0, 64)), Overlap::None);
    }

    #[test]
    fn covering_and_partial_ranges() {
        assert_eq!(br(0, 128).overlap(&br(0, 64)), Overlap::Covered);
        assert_eq!(br(0, 64).overlap(&br(0, 128)), Overlap::Partial);
        assert_eq!(br(32, 96).overlap(&br(0, 64)), Overlap::Partial);
        assert_eq!(Footprint::WHOLE.overlap(&br(8, 16)), Overlap::Covered);
        assert_eq!(br(8, 16).overlap(&Footprint::WHOLE), Overlap::Partial);
    }

    #[test]
    fn disjoint_column_blocks_and_tiles_are_independent() {
        assert_eq!(
            tile(0, 16, 0, 4, 16, 16).overlap(&tile(0, 16, 8, 4, 16, 16)),
            Overlap::None
        );
        let q = [
            tile(0, 8, 0, 8, 16, 16),
            tile(0, 8, 8, 8, 16, 16),
            tile(8, 8, 0, 8, 16, 16),
            tile(8, 8, 8, 8, 16, 16),
        ];
        for i in 0..4 {
            for j in 0..4 {
                let o = q[i].overlap(&q[j]);
                assert_eq!(o == Overlap::None, i != j, "{i} {j}");
            }
        }
        // Tiles sharing a block still depend.
        assert_ne!(tile(4, 8, 4, 8, 16, 16).overlap(&q[0]), Overlap::None);
        assert_eq!(tile(0, 16, 0, 16, 16, 16).overlap(&q[0]), Overlap::Covered);
        // A row block and a column block cross.
        assert_ne!(
            tile(0, 4, 0, 16, 16, 16).overlap(&tile(0, 16, 12, 4, 16, 16)),
            Overlap::None
        );
    }

    #[test]
    fn mismatched_axis_layouts_fall_back_to_conservative() {
        let t = tile(0, 8, 0, 8, 16, 16); // bytes 0..120 of a 256-byte backing, not dense
        let whole_range =
            Footprint::of_view(&TensorView::contiguous(DataType::U8, &[256]).unwrap());
        assert_ne!(t.overlap(&whole_range), Overlap::None);
        let tail = Footprint::of_view(
            &TensorView::contiguous(DataType::U8, &[256])
                .unwrap()
                .slice(0, 200, 256)
                .unwrap(),
        );
        assert_eq!(t.overlap(&tail), Overlap::None);
    }

    /// Brute force: the set of bytes each view touches.
    fn bytes_of(v: &TensorView) -> std::collections::BTreeSet<u64> {
        let e = v.dtype().size_bytes() as u64;
        v.element_offsets().flat_map(|o| o..o + e).collect()
    }

    fn arb_view() -> impl Strategy<Value = TensorView> {
        // Views of a 6x8x4 f16 tensor (or reinterpreted as other shapes).
        let base = TensorView::contiguous(DataType::F16, &[6, 8, 4]).unwrap();
        (
            0u64..6,
            1u64..6,
            0u64..8,
            1u64..8,
            0u64..4,
            1u64..4,
            0usize..4,
        )
            .prop_filter_map("fits", move |(a, da, b, db, c, dc, op)| {
                let w = base.window(&[a, b, c], &[da, db, dc]).ok()?;
                match op {
                    0 => Some(w),
                    1 => w.transpose(0, 2).ok(),
                    2 => w.reshape(&[w.numel()]).ok().or(Some(w)),
                    _ => base
                        .reshape(&[48, 4])
                        .ok()?
                        .window(&[a * 8 + b, c], &[da, dc])
                        .ok(),
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn overlap_is_sound_against_byte_sets(p in arb_view(), e in arb_view()) {
            let (pb, eb) = (bytes_of(&p), bytes_of(&e));
            let o = Footprint::of_view(&p).overlap(&Footprint::of_view(&e));
            let inter = pb.intersection(&eb).next().is_some();
            let covers = eb.is_subset(&pb);
            match o {
                Overlap::None => prop_assert!(!inter, "claimed disjoint but share bytes"),
                Overlap::Covered => prop_assert!(covers, "claimed covered but is not"),
                Overlap::Partial => {}
            }
            // Exactness where the model is exact: same lattice or both dense.
            if p.is_contiguous() && e.is_contiguous() {
                prop_assert_eq!(o == Overlap::None, !inter);
            }
        }
    }
}
