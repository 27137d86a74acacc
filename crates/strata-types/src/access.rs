//! Typed, bounds-checked views of raw memory through a [`TensorView`]: [`TensorRef`] (read)
//! and [`TensorMut`] (read-write). They are what a kernel gets for its tensor arguments in
//! device memory (`strata_chip::KernelCtx::input` / `output`) and what a host sub-worker
//! gets for its arguments in shared memory (`strata_host::SubCall::tensor` /
//! `tensor_mut`): the same types, built by the runtime layer that owns the memory.
//!
//! The aliasing contract that makes them sound is documented on [`TensorRef`].

use crate::dtype::Element;
use crate::error::TypesError;
use crate::view::{ElementOffsets, TensorView};
use std::marker::PhantomData;

/// The layer that lent a view its bytes and counts the views it lent (see the aliasing
/// contract on [`TensorRef`]): told once, when a view that holds a [`ViewLoan`] drops.
pub trait ViewLender {
    /// The view that was lent under `token` ended.
    fn release(&self, token: u64);
}

/// What a view holds of the layer that lent it its bytes: the lender and the token to
/// release on drop.
pub struct ViewLoan<'a> {
    lender: &'a dyn ViewLender,
    token: u64,
}

impl<'a> ViewLoan<'a> {
    /// A loan that calls `lender.release(token)` when the view holding it drops.
    pub fn new(lender: &'a dyn ViewLender, token: u64) -> Self {
        ViewLoan { lender, token }
    }
}

impl std::fmt::Debug for ViewLoan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewLoan")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Drop for ViewLoan<'_> {
    fn drop(&mut self) {
        self.lender.release(self.token);
    }
}

/// Geometry shared by both views: the buffer's first byte and the view over it.
#[derive(Clone, Copy)]
struct Raw {
    /// First byte of the buffer (element `[0, ..]` lives at `base + view.byte_offset()`).
    base: *mut u8,
    view: TensorView,
}

impl Raw {
    #[inline(always)]
    fn at<T>(&self, byte: u64) -> *mut T {
        // Every `byte` passed here comes from the view's own geometry (checked offsets,
        // `element_offsets`, `contiguous_runs`), which lies inside the memory the view was
        // created over; `wrapping_add` keeps the arithmetic itself defined regardless.
        self.base.wrapping_add(byte as usize).cast::<T>()
    }

    fn offset_of(&self, index: &[u64]) -> Result<u64, TypesError> {
        self.view
            .element_byte_offset(index)
            .map_err(|_| TypesError::IndexOutOfBounds {
                index: index.to_vec(),
                shape: self.view.shape().to_vec(),
            })
    }

    fn offset_of_flat(&self, flat: u64) -> Result<u64, TypesError> {
        let v = &self.view;
        if flat >= v.numel() {
            return Err(TypesError::FlatIndexOutOfBounds {
                index: flat,
                numel: v.numel(),
            });
        }
        let mut rest = flat;
        let mut elems = 0u64;
        for axis in (0..v.ndims()).rev() {
            let len = v.shape()[axis];
            elems += (rest % len) * v.strides()[axis];
            rest /= len;
        }
        Ok(v.byte_offset() + elems * v.dtype().size_bytes() as u64)
    }

    fn contiguous_start<T>(&self) -> Option<*mut T> {
        self.view
            .is_contiguous()
            .then(|| self.at::<T>(self.view.byte_offset()))
    }

    fn numel(&self) -> usize {
        usize::try_from(self.view.numel()).unwrap_or(usize::MAX)
    }
}

/// Whether no two elements of `view` share an address (a sufficient test: sorted by
/// stride, each stride exceeds the extent of the smaller axes).
fn injective(view: &TensorView) -> bool {
    let mut axes: Vec<(u64, u64)> = view
        .shape()
        .iter()
        .zip(view.strides())
        .filter(|(s, _)| **s > 1)
        .map(|(s, st)| (*st, *s))
        .collect();
    axes.sort_unstable();
    let mut extent = 0u64; // largest element offset the axes so far reach
    for (stride, len) in axes {
        if stride <= extent {
            return false;
        }
        extent += (len - 1) * stride;
    }
    true
}

/// Iterator over a tensor's elements in row-major logical order; see [`TensorRef::iter`].
#[derive(Debug)]
pub struct TensorIter<'a, T: Element> {
    inner: IterInner<'a, T>,
}

// Short-lived and on the stack: boxing the strided state would cost an allocation per
// iteration instead of a few bytes of stack.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum IterInner<'a, T: Element> {
    Slice(std::slice::Iter<'a, T>),
    Strided {
        base: *mut u8,
        offsets: ElementOffsets,
        _m: PhantomData<&'a T>,
    },
}

impl<T: Element> Iterator for TensorIter<'_, T> {
    type Item = T;

    #[inline]
    fn next(&mut self) -> Option<T> {
        match &mut self.inner {
            IterInner::Slice(s) => s.next().copied(),
            IterInner::Strided { base, offsets, .. } => {
                let off = offsets.next()?;
                // SAFETY: `off` is an element offset of the view, inside the memory the
                // view was created over and aligned for T (the view's contract); the view
                // this iterator borrows excludes writers while it lives.
                Some(unsafe { base.wrapping_add(off as usize).cast::<T>().read() })
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.inner {
            IterInner::Slice(s) => s.size_hint(),
            IterInner::Strided { offsets, .. } => offsets.size_hint(),
        }
    }
}

macro_rules! read_methods {
    () => {
        /// The view (shape, strides in elements, byte offset, data type).
        pub fn view(&self) -> &TensorView {
            &self.raw.view
        }

        /// Length of each axis.
        pub fn shape(&self) -> &[u64] {
            self.raw.view.shape()
        }

        /// The strides, in elements.
        pub fn strides(&self) -> &[u64] {
            self.raw.view.strides()
        }

        /// Number of elements.
        pub fn numel(&self) -> usize {
            self.raw.numel()
        }

        /// Whether the view has no element (an axis of length 0).
        pub fn is_empty(&self) -> bool {
            self.raw.numel() == 0
        }

        /// Whether the elements are one dense row-major range (then
        /// [`Self::as_slice`] is `Some`).
        pub fn is_contiguous(&self) -> bool {
            self.raw.view.is_contiguous()
        }

        /// The element at `index` (one coordinate per axis).
        ///
        /// # Errors
        /// [`TypesError::IndexOutOfBounds`], naming the index and the shape.
        pub fn get(&self, index: &[u64]) -> Result<T, TypesError> {
            let off = self.raw.offset_of(index)?;
            // SAFETY: `off` is a checked element offset of the view (inside its memory,
            // aligned for T); the view's contract excludes concurrent writers.
            Ok(unsafe { self.raw.at::<T>(off).read() })
        }

        /// The element at a row-major flat index (`0..numel`).
        ///
        /// # Errors
        /// [`TypesError::FlatIndexOutOfBounds`].
        pub fn get_flat(&self, flat: u64) -> Result<T, TypesError> {
            let off = self.raw.offset_of_flat(flat)?;
            // SAFETY: as `get`.
            Ok(unsafe { self.raw.at::<T>(off).read() })
        }

        /// The elements as a slice, when the view is contiguous.
        pub fn as_slice(&self) -> Option<&[T]> {
            let p = self.raw.contiguous_start::<T>()?;
            // SAFETY: a contiguous view's `numel` elements from `p` lie inside its memory,
            // aligned for T; the view's contract excludes writers for as long as `&self`
            // (and so the slice) lives.
            Some(unsafe { std::slice::from_raw_parts(p, self.raw.numel()) })
        }

        /// Iterates over the elements in row-major logical order (a slice iterator when
        /// contiguous).
        pub fn iter(&self) -> TensorIter<'_, T> {
            match self.as_slice() {
                Some(s) => TensorIter {
                    inner: IterInner::Slice(s.iter()),
                },
                None => TensorIter {
                    inner: IterInner::Strided {
                        base: self.raw.base,
                        offsets: self.raw.view.element_offsets(),
                        _m: PhantomData,
                    },
                },
            }
        }

        /// The view's maximal contiguous runs (e.g. the rows of a 2-D window), in
        /// row-major order.
        pub fn runs(&self) -> impl Iterator<Item = &[T]> + '_ {
            let elem = std::mem::size_of::<T>() as u64;
            let raw = self.raw;
            self.raw.view.contiguous_runs().map(move |(off, len)| {
                // SAFETY: each run lies inside the view (strata-types computes runs from
                // the view's own geometry), so inside its memory, aligned for T; no writer
                // while `&self` lives.
                unsafe { std::slice::from_raw_parts(raw.at::<T>(off), (len / elem) as usize) }
            })
        }

        /// Copies the elements out, in row-major logical order.
        pub fn to_vec(&self) -> Vec<T> {
            match self.as_slice() {
                Some(s) => s.to_vec(),
                None => {
                    let mut v = Vec::with_capacity(self.numel());
                    for run in self.runs() {
                        v.extend_from_slice(run);
                    }
                    v
                }
            }
        }
    };
}

/// A read-only typed view of a tensor: element access by index (`get`, `get_flat`),
/// row-major iteration, contiguous runs, and a slice when the view is contiguous. It is
/// what a kernel gets for an `INPUT` argument in device memory and what a host sub-worker
/// gets for an argument in shared memory.
///
/// # Aliasing contract
///
/// A view is built (with the `unsafe` [`TensorRef::new`] / [`TensorMut::new`]) only by a
/// runtime layer that guarantees nobody writes the viewed bytes while a `TensorRef` lives,
/// and nobody else reads or writes them while a `TensorMut` lives: between tasks the
/// engine orders every pair of conflicting accesses (read-after-write, write-after-read,
/// write-after-write; `NO_DEP` arguments are reached only through `unsafe` accessors), and
/// within one task the layer checks borrows at run time. A view may hold a [`ViewLoan`]: the
/// layer that lent it the bytes is told when it drops ([`ViewLender::release`]), so the
/// layer can refuse an overlapping view while this one lives. So `as_slice` /
/// `as_mut_slice` never create aliasing references.
///
/// Every index is checked: an index outside the view is a [`TypesError`], never an access
/// out of bounds.
pub struct TensorRef<'a, T: Element> {
    raw: Raw,
    _loan: Option<ViewLoan<'a>>,
    _m: PhantomData<&'a [T]>,
}

impl<T: Element> std::fmt::Debug for TensorRef<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorRef")
            .field("view", &self.raw.view)
            .finish()
    }
}

impl<'a, T: Element> TensorRef<'a, T> {
    /// A view of `view`'s elements in the buffer that starts at `base`.
    ///
    /// # Safety
    /// - Every byte of `view` (`base + view.byte_span()`) is memory valid for reads for
    ///   `'a`, and the element at `base + view.byte_offset()` is aligned for `T`.
    /// - `T`'s size is the view's element size (every bit pattern is a valid `T`:
    ///   [`Element`]).
    /// - Nobody writes those bytes while the returned view lives.
    /// - `loan`'s lender, if any, counts this view until its `release` is called.
    pub unsafe fn new(base: *const u8, view: TensorView, loan: Option<ViewLoan<'a>>) -> Self {
        debug_assert_eq!(std::mem::size_of::<T>(), view.dtype().size_bytes());
        TensorRef {
            raw: Raw {
                base: base.cast_mut(),
                view,
            },
            _loan: loan,
            _m: PhantomData,
        }
    }

    read_methods!();
}

/// A mutable typed view of a tensor: everything [`TensorRef`] offers plus `set`,
/// `set_flat`, `fill`, `copy_from_slice`, `update`, mutable runs, and a mutable slice when
/// the view is contiguous. See [`TensorRef`] for the aliasing contract.
pub struct TensorMut<'a, T: Element> {
    raw: Raw,
    _loan: Option<ViewLoan<'a>>,
    _m: PhantomData<&'a mut [T]>,
}

impl<T: Element> std::fmt::Debug for TensorMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorMut")
            .field("view", &self.raw.view)
            .finish()
    }
}

impl<'a, T: Element> TensorMut<'a, T> {
    /// A mutable view of `view`'s elements in the buffer that starts at `base`.
    ///
    /// # Safety
    /// As [`TensorRef::new`], with the memory valid for writes too, and nobody else may
    /// read or write those bytes while the returned view lives.
    pub unsafe fn new(base: *mut u8, view: TensorView, loan: Option<ViewLoan<'a>>) -> Self {
        debug_assert_eq!(std::mem::size_of::<T>(), view.dtype().size_bytes());
        TensorMut {
            raw: Raw { base, view },
            _loan: loan,
            _m: PhantomData,
        }
    }

    read_methods!();

    /// Stores `value` at `index` (one coordinate per axis).
    ///
    /// # Errors
    /// [`TypesError::IndexOutOfBounds`], naming the index and the shape.
    pub fn set(&mut self, index: &[u64], value: T) -> Result<(), TypesError> {
        let off = self.raw.offset_of(index)?;
        // SAFETY: a checked element offset (inside the memory, aligned); the view is the
        // only access to its bytes while it lives.
        unsafe { self.raw.at::<T>(off).write(value) };
        Ok(())
    }

    /// Stores `value` at a row-major flat index (`0..numel`).
    ///
    /// # Errors
    /// [`TypesError::FlatIndexOutOfBounds`].
    pub fn set_flat(&mut self, flat: u64, value: T) -> Result<(), TypesError> {
        let off = self.raw.offset_of_flat(flat)?;
        // SAFETY: as `set`.
        unsafe { self.raw.at::<T>(off).write(value) };
        Ok(())
    }

    /// The elements as a mutable slice, when the view is contiguous.
    pub fn as_mut_slice(&mut self) -> Option<&mut [T]> {
        let p = self.raw.contiguous_start::<T>()?;
        // SAFETY: as `as_slice`, and the view's exclusive access plus `&mut self` make
        // this the only reference to these elements while the slice lives.
        Some(unsafe { std::slice::from_raw_parts_mut(p, self.raw.numel()) })
    }

    /// The contiguous runs (e.g. rows of a 2-D window) as mutable slices, in row-major
    /// order; `None` if the view addresses some element twice (a self-overlapping view).
    pub fn runs_mut(&mut self) -> Option<impl Iterator<Item = &mut [T]> + '_> {
        if !injective(&self.raw.view) {
            return None;
        }
        let elem = std::mem::size_of::<T>() as u64;
        let raw = self.raw;
        Some(self.raw.view.contiguous_runs().map(move |(off, len)| {
            // SAFETY: runs lie inside the view; the view is injective, so the runs are
            // pairwise disjoint and each `&mut` is unique; exclusive access + `&mut self`.
            unsafe { std::slice::from_raw_parts_mut(raw.at::<T>(off), (len / elem) as usize) }
        }))
    }

    /// Stores `value` into every element.
    pub fn fill(&mut self, value: T) {
        if let Some(s) = self.as_mut_slice() {
            s.fill(value);
            return;
        }
        for off in self.raw.view.element_offsets() {
            // SAFETY: element offsets of the view; exclusive access.
            unsafe { self.raw.at::<T>(off).write(value) };
        }
    }

    /// Copies `src` into the elements, in row-major logical order.
    ///
    /// # Errors
    /// [`TypesError::LengthMismatch`] if `src.len()` differs from the element count.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<(), TypesError> {
        if src.len() != self.raw.numel() {
            return Err(TypesError::LengthMismatch {
                got: src.len(),
                shape: self.raw.view.shape().to_vec(),
                numel: self.raw.view.numel(),
            });
        }
        if let Some(s) = self.as_mut_slice() {
            s.copy_from_slice(src);
            return Ok(());
        }
        for (off, v) in self.raw.view.element_offsets().zip(src) {
            // SAFETY: element offsets of the view; exclusive access.
            unsafe { self.raw.at::<T>(off).write(*v) };
        }
        Ok(())
    }

    /// Applies `f` to every element in place, in row-major logical order.
    pub fn update(&mut self, mut f: impl FnMut(T) -> T) {
        if let Some(s) = self.as_mut_slice() {
            s.iter_mut().for_each(|x| *x = f(*x));
            return;
        }
        for off in self.raw.view.element_offsets() {
            let p = self.raw.at::<T>(off);
            // SAFETY: element offsets of the view; exclusive access.
            unsafe { p.write(f(p.read())) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DataType;
    use std::cell::Cell;

    #[test]
    fn strided_and_contiguous_access_agree_with_the_geometry() {
        let mut buf = vec![0f32; 12];
        let base = buf.as_mut_ptr().cast::<u8>();
        let whole = TensorView::contiguous(DataType::F32, &[3, 4]).unwrap();
        let col = whole.slice(1, 1, 3).unwrap(); // 3x2, strided
        {
            // SAFETY: `buf` holds 12 f32s, the views lie inside it, nothing else touches it.
            let mut m = unsafe { TensorMut::<f32>::new(base, whole, None) };
            m.copy_from_slice(&(0..12).map(|x| x as f32).collect::<Vec<_>>())
                .unwrap();
            assert!(m.copy_from_slice(&[1.0]).is_err());
            assert_eq!(m.get(&[2, 3]).unwrap(), 11.0);
            assert_eq!(m.get_flat(11).unwrap(), 11.0);
            assert!(m.get(&[3, 0]).unwrap_err().to_string().contains("[3, 4]"));
            assert!(m.get(&[1]).is_err());
            assert!(m.get_flat(12).is_err());
            assert_eq!(m.as_slice().unwrap().len(), 12);
        }
        {
            // SAFETY: as above.
            let mut c = unsafe { TensorMut::<f32>::new(base, col, None) };
            assert!(!c.is_contiguous() && c.as_mut_slice().is_none());
            assert_eq!(c.to_vec(), vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
            assert_eq!(c.get_flat(3).unwrap(), 6.0);
            c.update(|x| -x);
            c.set(&[0, 0], 100.0).unwrap();
            c.set_flat(5, 50.0).unwrap();
            assert!(c.set(&[0, 2], 1.0).is_err());
            assert_eq!(c.numel(), 6);
            assert_eq!(c.runs_mut().unwrap().count(), 3);
        }
        assert_eq!(buf[1], 100.0);
        assert_eq!(buf[2], -2.0);
        assert_eq!(buf[3], 3.0);
        assert_eq!(buf[10], 50.0);
        // SAFETY: as above.
        let r = unsafe { TensorRef::<f32>::new(base, col, None) };
        assert_eq!(r.iter().count(), 6);
        assert_eq!(r.iter().size_hint(), (6, Some(6)));
        assert_eq!(r.runs().map(<[f32]>::len).collect::<Vec<_>>(), [2, 2, 2]);
        assert_eq!(r.shape(), &[3, 2]);
        assert_eq!(r.strides(), &[4, 1]);
        assert!(!r.is_empty());
    }

    struct Counter(Cell<u64>);

    impl ViewLender for Counter {
        fn release(&self, token: u64) {
            self.0.set(self.0.get() + token);
        }
    }

    #[test]
    fn loans_are_released_once_on_drop() {
        let mut buf = [0u8; 4];
        let view = TensorView::contiguous(DataType::U8, &[4]).unwrap();
        let lender = Counter(Cell::new(0));
        {
            // SAFETY: `buf` is 4 bytes and only read here.
            let _a = unsafe {
                TensorRef::<u8>::new(buf.as_ptr(), view, Some(ViewLoan::new(&lender, 1)))
            };
            // SAFETY: as above.
            let _b = unsafe {
                TensorRef::<u8>::new(buf.as_ptr(), view, Some(ViewLoan::new(&lender, 10)))
            };
        }
        assert_eq!(lender.0.get(), 11);
        {
            // SAFETY: as above; exclusive use.
            let mut m = unsafe {
                TensorMut::<u8>::new(buf.as_mut_ptr(), view, Some(ViewLoan::new(&lender, 100)))
            };
            m.fill(3);
        }
        assert_eq!(lender.0.get(), 111);
        assert_eq!(buf, [3; 4]);
    }

    #[test]
    fn self_overlapping_views_have_no_mutable_runs() {
        let cases: &[(&[u64], &[u64])] = &[
            (&[4, 4], &[4, 1]),
            (&[4, 4], &[1, 4]),
            (&[2, 4], &[1, 1]),
            (&[3, 3], &[2, 1]),
            (&[3, 2], &[2, 1]),
            (&[2, 2, 2], &[4, 2, 1]),
            (&[2, 3], &[3, 2]),
        ];
        for (shape, strides) in cases {
            let v = TensorView::new(DataType::F32, shape, strides, 0).unwrap();
            let offs: Vec<u64> = v.element_offsets().collect();
            let mut dedup = offs.clone();
            dedup.sort_unstable();
            dedup.dedup();
            // The test is sufficient: it never calls an overlapping view injective.
            if injective(&v) {
                assert_eq!(dedup.len(), offs.len(), "{shape:?} {strides:?}");
            }
        }
        let v = TensorView::contiguous(DataType::F32, &[8, 8]).unwrap();
        assert!(injective(&v.window(&[2, 2], &[3, 4]).unwrap()));
        assert!(injective(&v.transpose(0, 1).unwrap()));
    }
}
