//! Typed, shape/stride-aware element access to a tensor in shared memory. The aliasing
//! contract is documented on [`TensorRef`].

use std::cell::Cell;
use std::marker::PhantomData;
use strata_types::{DataType, Element, ElementOffsets, TensorView};

/// Whether elements of `tensor` may be accessed as `T` (same type; `u8` also reads
/// `bool` tensors, whose bytes are 0 or 1).
pub(crate) fn dtype_compatible<T: Element>(tensor: DataType) -> bool {
    T::DTYPE == tensor || (tensor == DataType::Bool && T::DTYPE == DataType::U8)
}

/// The borrow a view holds on its argument slot; released on drop.
#[derive(Debug)]
enum Borrow<'a> {
    None,
    Shared(&'a Cell<i32>),
    Exclusive(&'a Cell<i32>),
}

impl Drop for Borrow<'_> {
    fn drop(&mut self) {
        match self {
            Borrow::None => {}
            Borrow::Shared(c) => c.set(c.get() - 1),
            Borrow::Exclusive(c) => c.set(0),
        }
    }
}

/// Raw geometry shared by both views: the buffer's first byte and the view over it.
#[derive(Debug, Clone, Copy)]
struct Raw {
    /// First byte of the buffer (element `(0, ..)` lives at `base + view.byte_offset()`).
    base: *mut u8,
    view: TensorView,
}

impl Raw {
    #[inline(always)]
    fn at<T>(&self, byte: u64) -> *mut T {
        // SAFETY (of the callers' use): every `byte` passed here comes from the view's
        // own geometry (`element_byte_offset`, `element_offsets`), which lies inside the
        // buffer the view was checked against when the view was created.
        self.base.wrapping_add(byte as usize).cast::<T>()
    }

    fn offset_of(&self, index: &[u64]) -> Result<u64, String> {
        self.view.element_byte_offset(index).map_err(|e| {
            format!(
                "index {index:?} is outside a tensor of shape {:?}: {e}",
                self.view.shape()
            )
        })
    }

    fn contiguous_start<T>(&self) -> Option<*mut T> {
        self.view
            .is_contiguous()
            .then(|| self.at::<T>(self.view.byte_offset()))
    }

    fn len(&self) -> usize {
        usize::try_from(self.view.numel()).unwrap_or(usize::MAX)
    }
}

/// Iterator over a tensor's elements in row-major logical order; see
/// [`TensorRef::iter`].
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
        raw: Raw,
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
            IterInner::Strided { raw, offsets, .. } => {
                let off = offsets.next()?;
                // SAFETY: `off` is an element offset of the view, inside the buffer and
                // aligned for T (checked when the view was created); the borrow held by
                // the view this iterator came from excludes overlapping writers.
                Some(unsafe { raw.at::<T>(off).read() })
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
        /// The view (shape, strides in elements, byte offset, dtype).
        pub fn view(&self) -> &TensorView {
            &self.raw.view
        }

        /// Length of each axis.
        pub fn shape(&self) -> &[u64] {
            self.raw.view.shape()
        }

        /// Number of elements.
        pub fn len(&self) -> usize {
            self.raw.len()
        }

        /// Always `false`: tensors have at least one element.
        pub fn is_empty(&self) -> bool {
            self.raw.len() == 0
        }

        /// Whether the elements are one dense row-major range (then
        /// [`Self::as_slice`] is `Some`).
        pub fn is_contiguous(&self) -> bool {
            self.raw.view.is_contiguous()
        }

        /// The element at `index` (one coordinate per axis).
        ///
        /// # Errors
        /// A message naming the index and the shape if it is out of range.
        pub fn get(&self, index: &[u64]) -> Result<T, String> {
            let off = self.raw.offset_of(index)?;
            // SAFETY: `off` is a checked element offset of the view (inside the buffer,
            // aligned for T); the view's borrow excludes overlapping writers.
            Ok(unsafe { self.raw.at::<T>(off).read() })
        }

        /// The elements as a slice, when the view is contiguous.
        pub fn as_slice(&self) -> Option<&[T]> {
            let p = self.raw.contiguous_start::<T>()?;
            // SAFETY: a contiguous view's `len` elements from `p` lie inside the buffer,
            // aligned for T (checked at creation); the borrow excludes overlapping
            // mutable views for as long as `&self` (and so the slice) lives.
            Some(unsafe { std::slice::from_raw_parts(p, self.raw.len()) })
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
                        raw: self.raw,
                        offsets: self.raw.view.element_offsets(),
                        _m: PhantomData,
                    },
                },
            }
        }

        /// Copies the elements out, in row-major logical order.
        pub fn to_vec(&self) -> Vec<T> {
            match self.as_slice() {
                Some(s) => s.to_vec(),
                None => self.iter().collect(),
            }
        }
    };
}

/// A read-only typed view of one tensor argument, obtained from
/// [`crate::SubCall::tensor`]: element access by index (`get`), row-major iteration,
/// and a slice when the view is contiguous.
///
/// # Aliasing contract
///
/// A `TensorRef` / [`TensorMut`] views bytes in shared memory that other processes of
/// the worker tree can also reach. Two rules keep every access race-free:
///
/// * **Between tasks, the engine orders conflicting accesses.** A task that writes a
///   tensor (OUTPUT, OUTPUT_EXISTING, INOUT) does not run while an earlier task that
///   reads or writes overlapping bytes is still running, and vice versa. Arguments
///   tagged NO_DEP are not tracked, so the safe [`crate::SubCall::tensor`] refuses them;
///   only the `unsafe` [`crate::SubCall::tensor_untracked`] reads one, and ordering it is
///   then the caller's responsibility. The host's own copies
///   ([`crate::SharedTensor::to_vec`], `write`) refuse with
///   [`crate::HostError::Busy`] while a task that names the tensor is in flight.
/// * **Within one task, [`crate::SubCall`] checks borrows.** A mutable view of an
///   argument is refused while any argument whose bytes overlap it is borrowed, and a
///   shared view is refused while an overlapping argument is borrowed mutably (the check
///   compares byte spans, so two interleaved but disjoint strided views count as
///   overlapping; take them one after the other). So `as_slice`/`as_mut_slice` never
///   create aliasing references.
#[derive(Debug)]
pub struct TensorRef<'a, T: Element> {
    raw: Raw,
    _borrow: Borrow<'a>,
    _m: PhantomData<&'a [T]>,
}

impl<'a, T: Element> TensorRef<'a, T> {
    /// # Safety
    /// `base + view.byte_span()` must lie inside live memory, aligned for `T`, `T`'s size
    /// must equal the view's element size, and nobody may write those bytes while the
    /// returned value lives (the `borrow` cell, if any, must already count this view).
    pub(crate) unsafe fn new(
        base: *mut u8,
        view: TensorView,
        borrow: Option<&'a Cell<i32>>,
    ) -> Self {
        TensorRef {
            raw: Raw { base, view },
            _borrow: borrow.map_or(Borrow::None, Borrow::Shared),
            _m: PhantomData,
        }
    }

    read_methods!();
}

/// A mutable typed view of one OUTPUT / INOUT / OUTPUT_EXISTING tensor argument,
/// obtained from [`crate::SubCall::tensor_mut`]: everything [`TensorRef`] offers plus
/// `set`, `fill`, `copy_from_slice`, `update` and a mutable slice when contiguous. See
/// [`TensorRef`] for the aliasing contract.
#[derive(Debug)]
pub struct TensorMut<'a, T: Element> {
    raw: Raw,
    _borrow: Borrow<'a>,
    _m: PhantomData<&'a mut [T]>,
}

impl<'a, T: Element> TensorMut<'a, T> {
    /// # Safety
    /// As [`TensorRef::new`], and nobody else may read or write the bytes while the
    /// returned value lives (the `borrow` cell, if any, must already be marked
    /// exclusive).
    pub(crate) unsafe fn new(
        base: *mut u8,
        view: TensorView,
        borrow: Option<&'a Cell<i32>>,
    ) -> Self {
        TensorMut {
            raw: Raw { base, view },
            _borrow: borrow.map_or(Borrow::None, Borrow::Exclusive),
            _m: PhantomData,
        }
    }

    read_methods!();

    /// Stores `value` at `index` (one coordinate per axis).
    ///
    /// # Errors
    /// A message naming the index and the shape if it is out of range.
    pub fn set(&mut self, index: &[u64], value: T) -> Result<(), String> {
        let off = self.raw.offset_of(index)?;
        // SAFETY: a checked element offset (inside the buffer, aligned); the exclusive
        // borrow excludes every other access to overlapping bytes.
        unsafe { self.raw.at::<T>(off).write(value) };
        Ok(())
    }

    /// The elements as a mutable slice, when the view is contiguous.
    pub fn as_mut_slice(&mut self) -> Option<&mut [T]> {
        let p = self.raw.contiguous_start::<T>()?;
        // SAFETY: as `as_slice`, and the exclusive borrow plus `&mut self` make this the
        // only reference to these elements while the slice lives.
        Some(unsafe { std::slice::from_raw_parts_mut(p, self.raw.len()) })
    }

    /// Stores `value` into every element.
    pub fn fill(&mut self, value: T) {
        if let Some(s) = self.as_mut_slice() {
            s.fill(value);
            return;
        }
        for off in self.raw.view.element_offsets() {
            // SAFETY: element offsets of the view; exclusive borrow.
            unsafe { self.raw.at::<T>(off).write(value) };
        }
    }

    /// Copies `src` into the elements, in row-major logical order.
    ///
    /// # Errors
    /// A message if `src.len()` differs from the element count.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<(), String> {
        if src.len() != self.raw.len() {
            return Err(format!(
                "cannot copy {} elements into a tensor of shape {:?} ({} elements)",
                src.len(),
                self.raw.view.shape(),
                self.raw.len()
            ));
        }
        if let Some(s) = self.as_mut_slice() {
            s.copy_from_slice(src);
            return Ok(());
        }
        for (off, v) in self.raw.view.element_offsets().zip(src) {
            // SAFETY: element offsets of the view; exclusive borrow.
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
            // SAFETY: element offsets of the view; exclusive borrow.
            unsafe { p.write(f(p.read())) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(m.get(&[3, 0]).unwrap_err().contains("[3, 4]"));
            assert_eq!(m.as_slice().unwrap().len(), 12);
        }
        {
            // SAFETY: as above.
            let mut c = unsafe { TensorMut::<f32>::new(base, col, None) };
            assert!(!c.is_contiguous() && c.as_mut_slice().is_none());
            assert_eq!(c.to_vec(), vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
            c.update(|x| -x);
            c.set(&[0, 0], 100.0).unwrap();
            assert_eq!(c.len(), 6);
        }
        assert_eq!(buf[1], 100.0);
        assert_eq!(buf[2], -2.0);
        assert_eq!(buf[3], 3.0);
        // SAFETY: as above.
        let r = unsafe { TensorRef::<f32>::new(base, col, None) };
        assert_eq!(r.iter().count(), 6);
        assert_eq!(r.iter().size_hint(), (6, Some(6)));
        assert_eq!(r.shape(), &[3, 2]);
        assert!(!r.is_empty());
    }

    #[test]
    fn borrows_are_released_on_drop() {
        let mut buf = [0u8; 4];
        let view = TensorView::contiguous(DataType::U8, &[4]).unwrap();
        let cell = Cell::new(0);
        cell.set(2);
        {
            // SAFETY: `buf` is 4 bytes and only read here.
            let _a = unsafe { TensorRef::<u8>::new(buf.as_mut_ptr(), view, Some(&cell)) };
            // SAFETY: as above.
            let _b = unsafe { TensorRef::<u8>::new(buf.as_mut_ptr(), view, Some(&cell)) };
        }
        assert_eq!(cell.get(), 0);
        cell.set(-1);
        {
            // SAFETY: as above; exclusive use.
            let mut m = unsafe { TensorMut::<u8>::new(buf.as_mut_ptr(), view, Some(&cell)) };
            m.fill(3);
        }
        assert_eq!(cell.get(), 0);
        assert_eq!(buf, [3; 4]);
        assert!(dtype_compatible::<u8>(DataType::Bool));
        assert!(!dtype_compatible::<i8>(DataType::Bool));
    }
}
