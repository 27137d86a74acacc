//! Tensor views: shape, strides (in elements), byte offset and data type over a buffer.

use crate::dtype::DataType;
use crate::error::TypesError;

/// Maximum number of dimensions of a tensor view.
pub const MAX_DIMS: usize = 5;

/// A strided view of up to [`MAX_DIMS`] axes into a byte buffer.
///
/// Element `(i0, .., in)` lives at byte `byte_offset + (Σ i_k · stride_k) · elem_size`.
/// Strides are in elements and always ≥ 1; every axis has at least one element, except in
/// the zero-size views of [`TensorView::contiguous_or_empty`] (no element, no byte). A
/// view knows nothing about its buffer except through [`TensorView::check_fits`].
///
/// ```
/// use strata_types::{DataType, TensorView};
/// let m = TensorView::contiguous(DataType::F32, &[4, 8]).unwrap();
/// assert_eq!(m.strides(), &[8, 1]);
/// let col = m.slice(1, 2, 4).unwrap(); // columns 2..4 of every row
/// assert_eq!(col.shape(), &[4, 2]);
/// assert_eq!(col.byte_offset(), 8);
/// assert!(!col.is_contiguous());
/// assert_eq!(col.byte_span(), (8, 8 + (3 * 8 + 1 + 1) * 4));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorView {
    dtype: DataType,
    ndims: u8,
    shape: [u64; MAX_DIMS],
    strides: [u64; MAX_DIMS],
    byte_offset: u64,
}

impl std::fmt::Debug for TensorView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorView")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("byte_offset", &self.byte_offset)
            .finish()
    }
}

fn row_major_strides(shape: &[u64]) -> Result<[u64; MAX_DIMS], TypesError> {
    let mut strides = [0u64; MAX_DIMS];
    let mut acc: u64 = 1;
    for axis in (0..shape.len()).rev() {
        strides[axis] = acc;
        acc = acc
            .checked_mul(shape[axis])
            .ok_or_else(|| TypesError::GeometryOverflow {
                shape: shape.to_vec(),
                strides: vec![],
            })?;
    }
    Ok(strides)
}

impl TensorView {
    /// A row-major contiguous view of `shape` starting at byte 0.
    ///
    /// # Errors
    /// Rank outside `1..=5`, an empty axis, or a shape whose byte size overflows.
    pub fn contiguous(dtype: DataType, shape: &[u64]) -> Result<Self, TypesError> {
        check_rank(shape.len())?;
        let strides = row_major_strides(shape)?;
        Self::new(dtype, shape, &strides[..shape.len()], 0)
    }

    /// A row-major contiguous view of `shape` starting at byte 0, where an axis may have
    /// length 0: then the view is a zero-size tensor (no element, 0 bytes, contiguous;
    /// its element and run iterators are empty), as the reference runtime accepts them.
    /// Its strides are those of `shape` with every 0 read as 1 (never 0).
    ///
    /// ```
    /// use strata_types::{DataType, TensorView};
    /// let e = TensorView::contiguous_or_empty(DataType::F32, &[3, 0]).unwrap();
    /// assert_eq!((e.numel(), e.nbytes(), e.byte_span()), (0, 0, (0, 0)));
    /// assert!(e.is_contiguous() && e.element_offsets().next().is_none());
    /// assert_eq!(e.check_fits(0), Ok(()));
    /// ```
    ///
    /// # Errors
    /// As [`TensorView::contiguous`], except for empty axes.
    pub fn contiguous_or_empty(dtype: DataType, shape: &[u64]) -> Result<Self, TypesError> {
        if !shape.contains(&0) {
            return Self::contiguous(dtype, shape);
        }
        check_rank(shape.len())?;
        let mut ones = [1u64; MAX_DIMS];
        for (o, &s) in ones.iter_mut().zip(shape) {
            *o = s.max(1);
        }
        let mut v = Self::contiguous(dtype, &ones[..shape.len()])?;
        v.shape[..shape.len()].copy_from_slice(shape);
        Ok(v)
    }

    /// Whether the view has no element (a zero-size tensor).
    pub fn is_empty(&self) -> bool {
        self.shape().contains(&0)
    }

    /// A view with explicit strides (in elements) and byte offset.
    ///
    /// # Errors
    /// Rank outside `1..=5`, mismatched lengths, an empty axis, a zero stride, an offset
    /// not aligned to the element size, or geometry that overflows 64-bit arithmetic.
    pub fn new(
        dtype: DataType,
        shape: &[u64],
        strides: &[u64],
        byte_offset: u64,
    ) -> Result<Self, TypesError> {
        check_rank(shape.len())?;
        if strides.len() != shape.len() {
            return Err(TypesError::StrideCountMismatch {
                shape: shape.len(),
                strides: strides.len(),
            });
        }
        let mut v = TensorView {
            dtype,
            ndims: shape.len() as u8,
            shape: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
            byte_offset,
        };
        for axis in 0..shape.len() {
            if shape[axis] == 0 {
                return Err(TypesError::EmptyAxis { axis });
            }
            if strides[axis] == 0 {
                return Err(TypesError::ZeroStride { axis });
            }
            v.shape[axis] = shape[axis];
            v.strides[axis] = strides[axis];
        }
        let elem = dtype.size_bytes() as u64;
        if byte_offset % elem != 0 {
            return Err(TypesError::MisalignedOffset {
                byte_offset,
                dtype: dtype.name(),
                elem: dtype.size_bytes(),
            });
        }
        // Validate that numel and the byte span are representable.
        v.checked_extent_bytes()
            .and_then(|e| e.checked_add(byte_offset))
            .ok_or_else(|| v.overflow())?;
        v.shape()
            .iter()
            .try_fold(1u64, |a, &s| a.checked_mul(s))
            .and_then(|n| n.checked_mul(elem))
            .ok_or_else(|| v.overflow())?;
        Ok(v)
    }

    fn overflow(&self) -> TypesError {
        TypesError::GeometryOverflow {
            shape: self.shape().to_vec(),
            strides: self.strides().to_vec(),
        }
    }

    fn checked_extent_bytes(&self) -> Option<u64> {
        if self.is_empty() {
            return Some(0);
        }
        let mut last: u64 = 0;
        for axis in 0..self.ndims as usize {
            last = last.checked_add((self.shape[axis] - 1).checked_mul(self.strides[axis])?)?;
        }
        last.checked_add(1)?
            .checked_mul(self.dtype.size_bytes() as u64)
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Number of axes (1..=5).
    pub fn ndims(&self) -> usize {
        self.ndims as usize
    }

    /// Length of each axis.
    pub fn shape(&self) -> &[u64] {
        &self.shape[..self.ndims as usize]
    }

    /// Stride of each axis, in elements.
    pub fn strides(&self) -> &[u64] {
        &self.strides[..self.ndims as usize]
    }

    /// Byte offset of element `(0, .., 0)` from the start of the buffer.
    pub fn byte_offset(&self) -> u64 {
        self.byte_offset
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape().iter().product()
    }

    /// Bytes of the elements themselves (`numel · elem_size`).
    pub fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.size_bytes() as u64
    }

    /// Bytes from the first to one past the last element touched:
    /// `(1 + Σ (shape_k − 1) · stride_k) · elem_size`.
    pub fn extent_bytes(&self) -> u64 {
        // Checked at construction.
        self.checked_extent_bytes().unwrap_or(u64::MAX)
    }

    /// The half-open byte range `[start, end)` this view may touch.
    pub fn byte_span(&self) -> (u64, u64) {
        (self.byte_offset, self.byte_offset + self.extent_bytes())
    }

    /// Whether the view is row-major contiguous (strides are the running products of the
    /// shape), so its elements are one dense byte range.
    pub fn is_contiguous(&self) -> bool {
        if self.is_empty() {
            return true;
        }
        let mut acc = 1u64;
        for axis in (0..self.ndims()).rev() {
            if self.shape[axis] != 1 && self.strides[axis] != acc {
                return false;
            }
            acc *= self.shape[axis];
        }
        true
    }

    /// Checks that the view lies inside a buffer of `buffer_bytes` bytes.
    ///
    /// # Errors
    /// [`TypesError::ViewOutOfBounds`] naming the span and the buffer size.
    pub fn check_fits(&self, buffer_bytes: u64) -> Result<(), TypesError> {
        let (start, end) = self.byte_span();
        if end > buffer_bytes {
            return Err(TypesError::ViewOutOfBounds {
                start,
                end,
                buffer_bytes,
            });
        }
        Ok(())
    }

    fn check_axis(&self, axis: usize) -> Result<(), TypesError> {
        if axis >= self.ndims() {
            return Err(TypesError::AxisOutOfRange {
                axis,
                ndims: self.ndims(),
            });
        }
        Ok(())
    }

    /// Elements `start..end` of `axis` (zero-copy: offset and shape change).
    ///
    /// # Errors
    /// Axis out of range, or an empty or out-of-bounds range.
    pub fn slice(&self, axis: usize, start: u64, end: u64) -> Result<Self, TypesError> {
        self.check_axis(axis)?;
        let len = self.shape[axis];
        if start >= end || end > len {
            return Err(TypesError::RangeOutOfBounds {
                axis,
                start,
                end,
                len,
            });
        }
        let mut v = *self;
        v.shape[axis] = end - start;
        v.byte_offset += start * self.strides[axis] * self.dtype.size_bytes() as u64;
        Ok(v)
    }

    /// The sub-tile starting at `origin` with extent `shape` (one entry per axis).
    ///
    /// # Errors
    /// Wrong number of entries, or a tile that leaves the view.
    pub fn window(&self, origin: &[u64], shape: &[u64]) -> Result<Self, TypesError> {
        if origin.len() != self.ndims() || shape.len() != self.ndims() {
            return Err(TypesError::BadRank {
                got: origin.len().max(shape.len()),
                max: self.ndims(),
            });
        }
        let mut v = *self;
        for axis in 0..self.ndims() {
            v = v.slice(
                axis,
                origin[axis],
                origin[axis]
                    .checked_add(shape[axis])
                    .ok_or_else(|| self.overflow())?,
            )?;
        }
        Ok(v)
    }

    /// Swaps two axes (zero-copy).
    ///
    /// # Errors
    /// An axis out of range.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Self, TypesError> {
        self.check_axis(a)?;
        self.check_axis(b)?;
        let mut v = *self;
        v.shape.swap(a, b);
        v.strides.swap(a, b);
        Ok(v)
    }

    /// Reorders the axes: new axis `k` is old axis `order[k]` (zero-copy).
    ///
    /// # Errors
    /// `order` is not a permutation of `0..ndims`.
    pub fn permute(&self, order: &[usize]) -> Result<Self, TypesError> {
        let n = self.ndims();
        let mut seen = [false; MAX_DIMS];
        let bad = || TypesError::BadPermutation {
            order: order.to_vec(),
            ndims: n,
        };
        if order.len() != n {
            return Err(bad());
        }
        for &o in order {
            if o >= n || seen[o] {
                return Err(bad());
            }
            seen[o] = true;
        }
        let mut v = *self;
        for (k, &o) in order.iter().enumerate() {
            v.shape[k] = self.shape[o];
            v.strides[k] = self.strides[o];
        }
        Ok(v)
    }

    /// The same elements under a new row-major shape (requires a contiguous view).
    ///
    /// # Errors
    /// Non-contiguous view, different element count, or an invalid shape.
    pub fn reshape(&self, shape: &[u64]) -> Result<Self, TypesError> {
        if !self.is_contiguous() {
            return Err(TypesError::BadReshape {
                reason: "the view is not contiguous; copy it first".into(),
            });
        }
        let n: u64 = shape
            .iter()
            .try_fold(1u64, |a, &s| a.checked_mul(s))
            .ok_or_else(|| TypesError::BadReshape {
                reason: format!("shape {shape:?} overflows"),
            })?;
        if n != self.numel() {
            return Err(TypesError::BadReshape {
                reason: format!(
                    "shape {shape:?} has {n} elements but the view has {}",
                    self.numel()
                ),
            });
        }
        let mut v = Self::contiguous(self.dtype, shape)?;
        v.byte_offset = self.byte_offset;
        Ok(v)
    }

    /// The same geometry reinterpreted as another element type of the same size.
    ///
    /// # Errors
    /// [`TypesError::BadReshape`] if the element sizes differ.
    pub fn with_dtype(&self, dtype: DataType) -> Result<Self, TypesError> {
        if dtype.size_bytes() != self.dtype.size_bytes() {
            return Err(TypesError::BadReshape {
                reason: format!("{} and {} have different element sizes", self.dtype, dtype),
            });
        }
        let mut v = *self;
        v.dtype = dtype;
        Ok(v)
    }

    /// Byte offset of the element at `index` (one coordinate per axis).
    ///
    /// # Errors
    /// Wrong number of coordinates or a coordinate past its axis.
    pub fn element_byte_offset(&self, index: &[u64]) -> Result<u64, TypesError> {
        if index.len() != self.ndims() {
            return Err(TypesError::BadRank {
                got: index.len(),
                max: self.ndims(),
            });
        }
        let mut elems = 0u64;
        for (axis, &i) in index.iter().enumerate() {
            if i >= self.shape[axis] {
                return Err(TypesError::RangeOutOfBounds {
                    axis,
                    start: i,
                    end: i + 1,
                    len: self.shape[axis],
                });
            }
            elems += i * self.strides[axis];
        }
        Ok(self.byte_offset + elems * self.dtype.size_bytes() as u64)
    }

    /// Iterates over the byte offsets of every element in row-major logical order.
    ///
    /// ```
    /// use strata_types::{DataType, TensorView};
    /// let v = TensorView::new(DataType::U8, &[2, 2], &[4, 1], 1).unwrap();
    /// assert_eq!(v.element_offsets().collect::<Vec<_>>(), vec![1, 2, 5, 6]);
    /// ```
    pub fn element_offsets(&self) -> ElementOffsets {
        ElementOffsets {
            view: *self,
            index: [0; MAX_DIMS],
            remaining: self.numel(),
        }
    }

    /// Iterates over the maximal contiguous byte runs of the view, in row-major order, as
    /// `(byte_offset, byte_len)`. A contiguous view is one run; a 2-D tile is one run per row.
    ///
    /// ```
    /// use strata_types::{DataType, TensorView};
    /// let m = TensorView::contiguous(DataType::F32, &[3, 4]).unwrap();
    /// let tile = m.window(&[1, 1], &[2, 2]).unwrap();
    /// assert_eq!(tile.contiguous_runs().collect::<Vec<_>>(), vec![(20, 8), (36, 8)]);
    /// ```
    pub fn contiguous_runs(&self) -> ContiguousRuns {
        // Fold the innermost axes that are dense into one run.
        let n = self.ndims();
        let elem = self.dtype.size_bytes() as u64;
        let mut run_elems = 1u64;
        let mut outer = n;
        while outer > 0 {
            let axis = outer - 1;
            if self.strides[axis] == run_elems || self.shape[axis] == 1 {
                run_elems *= self.shape[axis];
                outer -= 1;
            } else {
                break;
            }
        }
        let outer_view = if outer == 0 {
            None
        } else {
            let mut v = *self;
            v.ndims = outer as u8;
            Some(v)
        };
        if self.is_empty() {
            return ContiguousRuns {
                outer: None,
                single: None,
                run_bytes: 0,
            };
        }
        ContiguousRuns {
            outer: outer_view.map(|v| v.element_offsets()),
            single: if outer == 0 {
                Some(self.byte_offset)
            } else {
                None
            },
            run_bytes: run_elems * elem,
        }
    }
}

fn check_rank(n: usize) -> Result<(), TypesError> {
    if n == 0 || n > MAX_DIMS {
        return Err(TypesError::BadRank {
            got: n,
            max: MAX_DIMS,
        });
    }
    Ok(())
}

/// Iterator over element byte offsets; see [`TensorView::element_offsets`].
#[derive(Debug, Clone)]
pub struct ElementOffsets {
    view: TensorView,
    index: [u64; MAX_DIMS],
    remaining: u64,
}

impl Iterator for ElementOffsets {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let v = &self.view;
        let n = v.ndims();
        let mut elems = 0u64;
        for axis in 0..n {
            elems += self.index[axis] * v.strides[axis];
        }
        // Advance the odometer.
        for axis in (0..n).rev() {
            self.index[axis] += 1;
            if self.index[axis] < v.shape[axis] {
                break;
            }
            self.index[axis] = 0;
        }
        Some(v.byte_offset + elems * v.dtype.size_bytes() as u64)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let r = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (r, Some(r))
    }
}

/// Iterator over contiguous byte runs; see [`TensorView::contiguous_runs`].
#[derive(Debug, Clone)]
pub struct ContiguousRuns {
    outer: Option<ElementOffsets>,
    single: Option<u64>,
    run_bytes: u64,
}

impl Iterator for ContiguousRuns {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        if let Some(off) = self.single.take() {
            return Some((off, self.run_bytes));
        }
        self.outer
            .as_mut()
            .and_then(|o| o.next())
            .map(|off| (off, self.run_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_geometry_with_typed_errors() {
        assert!(matches!(
            TensorView::contiguous(DataType::F32, &[]),
            Err(TypesError::BadRank { got: 0, .. })
        ));
        assert!(matches!(
            TensorView::contiguous(DataType::F32, &[1, 1, 1, 1, 1, 1]),
            Err(TypesError::BadRank { got: 6, .. })
        ));
        assert!(matches!(
            TensorView::new(DataType::F32, &[2, 2], &[0, 1], 0),
            Err(TypesError::ZeroStride { axis: 0 })
        ));
        assert!(matches!(
            TensorView::new(DataType::F32, &[2, 0], &[1, 1], 0),
            Err(TypesError::EmptyAxis { axis: 1 })
        ));
        assert!(matches!(
            TensorView::new(DataType::F32, &[2], &[1], 2),
            Err(TypesError::MisalignedOffset { .. })
        ));
        assert!(matches!(
            TensorView::new(DataType::F64, &[u64::MAX / 2, 4], &[4, 1], 0),
            Err(TypesError::GeometryOverflow { .. })
        ));
        let v = TensorView::contiguous(DataType::F32, &[4, 4]).unwrap();
        assert_eq!(v.check_fits(64), Ok(()));
        assert_eq!(
            v.check_fits(63),
            Err(TypesError::ViewOutOfBounds {
                start: 0,
                end: 64,
                buffer_bytes: 63
            })
        );
    }

    #[test]
    fn view_ops_match_hand_computed_offsets() {
        let m = TensorView::contiguous(DataType::I32, &[3, 4]).unwrap();
        let t = m.transpose(0, 1).unwrap();
        assert_eq!(t.shape(), &[4, 3]);
        assert_eq!(t.element_byte_offset(&[1, 2]).unwrap(), (2 * 4 + 1) * 4);
        let p = m.permute(&[1, 0]).unwrap();
        assert_eq!(p, t);
        assert!(m.permute(&[0, 0]).is_err());
        let r = m.reshape(&[2, 6]).unwrap();
        assert_eq!(r.strides(), &[6, 1]);
        assert!(t.reshape(&[12]).is_err());
        let offs: Vec<u64> = t.element_offsets().collect();
        assert_eq!(offs.len(), 12);
        assert_eq!(offs[0..4], [0, 16, 32, 4]);
        assert!(m.slice(0, 2, 2).is_err());
        assert!(m.slice(2, 0, 1).is_err());
    }

    #[test]
    fn contiguous_runs_cover_exactly_the_elements() {
        let m = TensorView::contiguous(DataType::U8, &[4, 5, 6]).unwrap();
        for v in [
            m,
            m.window(&[1, 0, 0], &[2, 5, 6]).unwrap(),
            m.window(&[1, 1, 2], &[2, 3, 3]).unwrap(),
            m.transpose(1, 2).unwrap(),
        ] {
            let mut from_runs = vec![];
            for (off, len) in v.contiguous_runs() {
                from_runs.extend(off..off + len);
            }
            let direct: Vec<u64> = v.element_offsets().collect();
            assert_eq!(from_runs, direct, "{v:?}");
        }
    }
}
