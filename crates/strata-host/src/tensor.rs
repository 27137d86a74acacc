//! Host tensors in shared memory: zero-copy for every child.

use crate::error::HostError;
use crate::shm::SharedMemory;
use crate::sub::dtype_compatible;
use std::sync::Arc;
use strata_types::{
    ArgTag, BufferDesc, BufferLocation, BufferView, DataType, Element, IdentityMinter,
    IntoTensorArg, TensorArg, TensorView, TypesError,
};

/// A host tensor in its own shared-memory region: every child of the worker tree (forked
/// or thread) reads and writes the same bytes, so passing it to a task copies nothing and
/// a child's writes are visible to the parent with no copy-back.
///
/// Create it **before** the children start (its region must exist when they fork);
/// afterwards [`SharedTensor::new`] fails with "allocate shared tensors before init()".
/// Cloning is cheap and shares the bytes. When the last clone (in the process that
/// created it) drops, the memory goes back to the kernel — once the tasks in flight that
/// name it have ended (their children keep writing into live pages until then); a task
/// dispatched after the drop fails with [`HostError::RegionReleased`].
///
/// Reading and writing from the host ([`SharedTensor::to_vec`], [`SharedTensor::write`])
/// never races a task: while tasks that name the tensor are in flight (dispatched to a
/// child and not yet ended, whatever their tag, NO_DEP included) both **refuse** with
/// [`HostError::Busy`] rather than wait — waiting could block forever on a task of a run
/// the caller itself must drive; wait for the run, then copy. A task dispatched while a
/// copy runs waits for the copy (a plain memcpy) before its child is told to start. The
/// `unsafe` [`SharedTensor::as_slice`] / [`SharedTensor::as_mut_slice`] skip the check.
///
/// ```
/// use strata_host::{SharedMemory, SharedTensor};
/// use strata_types::{ArgTag, IdentityMinter};
/// let mem = SharedMemory::new();
/// let minter = IdentityMinter::new();
/// let t = SharedTensor::from_slice(&mem, &minter, &[2, 3], &[1f32, 2., 3., 4., 5., 6.])?;
/// assert_eq!(t.nbytes(), 24);
/// let arg = t.arg(ArgTag::Input);
/// assert_eq!(arg.view.shape(), &[2, 3]);
/// let row1 = t.arg_view(t.view().slice(0, 1, 2)?, ArgTag::Output)?;
/// assert_eq!(row1.view.byte_offset(), 12);
/// t.write(&[0f32; 6])?;
/// assert_eq!(t.to_vec::<f32>()?, vec![0.0; 6]);
/// assert!(t.to_vec::<i32>().is_err()); // dtype-checked
/// # Ok::<(), strata_host::HostError>(())
/// ```
#[derive(Debug, Clone)]
pub struct SharedTensor {
    mem: Arc<SharedMemory>,
    buffer: BufferDesc,
    view: TensorView,
    region: u64,
    _owner: Arc<RegionOwner>,
}

/// Releases the tensor's region when its last handle (in the creating process) drops.
#[derive(Debug)]
struct RegionOwner {
    mem: Arc<SharedMemory>,
    region: u64,
}

impl Drop for RegionOwner {
    fn drop(&mut self) {
        let _ = self.mem.release_region(self.region);
    }
}

/// The minter of the tensors [`SharedTensor::zeroed`] and [`SharedTensor::from_data`]
/// create.
fn process_minter() -> &'static IdentityMinter {
    static MINTER: std::sync::OnceLock<IdentityMinter> = std::sync::OnceLock::new();
    MINTER.get_or_init(IdentityMinter::new)
}

impl SharedTensor {
    /// A zero-filled tensor of `shape` and `dtype` in a new region, with a fresh buffer
    /// identity from `minter`.
    ///
    /// # Errors
    /// [`HostError::Types`] for a bad shape; [`HostError::SharedMemoryFrozen`] after the
    /// children started; [`HostError::RegionCreate`].
    pub fn new(
        mem: &Arc<SharedMemory>,
        minter: &IdentityMinter,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<SharedTensor, HostError> {
        let view = TensorView::contiguous(dtype, shape)?;
        let nbytes = view.nbytes();
        let bytes = usize::try_from(nbytes).map_err(|_| HostError::RegionCreate {
            label: format!("tensor {shape:?} {dtype}"),
            bytes: usize::MAX,
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the tensor is larger than the address space",
            ),
        })?;
        let region = mem.create_region(bytes, &format!("tensor-{dtype}-{shape:?}"))?;
        let identity = minter.mint();
        mem.set_tensor_identity(region, identity);
        // SAFETY: the region was just created for this tensor alone and is owned by it
        // (released when its last handle drops, after the tasks that name it); the
        // identity is fresh and recorded as the region's owner, which the engine checks.
        let buffer = unsafe {
            BufferDesc::from_parts(
                identity,
                nbytes,
                BufferLocation::HostShared { region, offset: 0 },
            )
        };
        Ok(SharedTensor {
            _owner: Arc::new(RegionOwner {
                mem: mem.clone(),
                region,
            }),
            mem: mem.clone(),
            buffer,
            view,
            region,
        })
    }

    /// A zero-filled tensor in this process's shared memory ([`SharedMemory::process`]),
    /// with an identity from the process-wide minter: what a program's host tensors are.
    /// Create it before the worker that uses it starts its children (before `prepare` or
    /// `init`).
    ///
    /// ```
    /// use strata_host::SharedTensor;
    /// use strata_types::DataType;
    /// let t = SharedTensor::zeroed(&[2, 4], DataType::F32)?;
    /// assert_eq!(t.to_vec::<f32>()?, vec![0.0; 8]);
    /// # Ok::<(), strata_host::HostError>(())
    /// ```
    ///
    /// # Errors
    /// As [`SharedTensor::new`].
    pub fn zeroed(shape: &[u64], dtype: DataType) -> Result<SharedTensor, HostError> {
        Self::new(SharedMemory::process(), process_minter(), shape, dtype)
    }

    /// A tensor in this process's shared memory holding `data` (row-major); see
    /// [`SharedTensor::zeroed`].
    ///
    /// ```
    /// use strata_host::SharedTensor;
    /// let t = SharedTensor::from_data(&[3], &[1i32, 2, 3])?;
    /// assert_eq!(t.to_vec::<i32>()?, vec![1, 2, 3]);
    /// assert!(SharedTensor::from_data(&[4], &[1i32, 2, 3]).is_err()); // 3 values for 4 places
    /// # Ok::<(), strata_host::HostError>(())
    /// ```
    ///
    /// # Errors
    /// As [`SharedTensor::from_slice`].
    pub fn from_data<T: Element>(shape: &[u64], data: &[T]) -> Result<SharedTensor, HostError> {
        Self::from_slice(SharedMemory::process(), process_minter(), shape, data)
    }

    /// A zero-filled tensor of element type `T` (same as [`SharedTensor::new`] with
    /// `T::DTYPE`).
    ///
    /// # Errors
    /// As [`SharedTensor::new`].
    pub fn zeros<T: Element>(
        mem: &Arc<SharedMemory>,
        minter: &IdentityMinter,
        shape: &[u64],
    ) -> Result<SharedTensor, HostError> {
        Self::new(mem, minter, shape, T::DTYPE)
    }

    /// A tensor of element type `T` holding `data` (row-major).
    ///
    /// # Errors
    /// As [`SharedTensor::new`]; [`HostError::LengthMismatch`] if `data` does not have
    /// one element per position of `shape`.
    pub fn from_slice<T: Element>(
        mem: &Arc<SharedMemory>,
        minter: &IdentityMinter,
        shape: &[u64],
        data: &[T],
    ) -> Result<SharedTensor, HostError> {
        let view = TensorView::contiguous(T::DTYPE, shape)?;
        if view.numel() != data.len() as u64 {
            return Err(HostError::LengthMismatch {
                expected: view.numel(),
                got: data.len(),
            });
        }
        let t = Self::new(mem, minter, shape, T::DTYPE)?;
        t.write(data)?;
        Ok(t)
    }

    /// The whole-tensor view (row-major contiguous, byte offset 0).
    pub fn view(&self) -> TensorView {
        self.view
    }

    /// The buffer: identity, size and `HostShared { region, offset: 0 }` location.
    pub fn buffer(&self) -> BufferDesc {
        self.buffer
    }

    /// The region id.
    pub fn region(&self) -> u64 {
        self.region
    }

    /// The shared memory the tensor lives in.
    pub fn memory(&self) -> &Arc<SharedMemory> {
        &self.mem
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> u64 {
        self.buffer.nbytes()
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.view.dtype()
    }

    /// Shape.
    pub fn shape(&self) -> &[u64] {
        self.view.shape()
    }

    /// A task argument naming the whole tensor.
    pub fn arg(&self, tag: ArgTag) -> TensorArg {
        TensorArg {
            buffer: self.buffer,
            view: self.view,
            tag,
        }
    }

    /// A task argument naming part of the tensor: `view` must lie inside the buffer
    /// (build it from [`SharedTensor::view`] with `slice`, `window`, `transpose`, …).
    ///
    /// # Errors
    /// [`HostError::Types`] (`ViewOutOfBounds`) if it does not.
    pub fn arg_view(&self, view: TensorView, tag: ArgTag) -> Result<TensorArg, HostError> {
        Ok(TensorArg::new(self.buffer, view, tag)?)
    }

    /// The whole tensor as an untagged view, to slice further.
    pub fn as_view(&self) -> BufferView {
        // The whole-tensor view fits the tensor's buffer by construction.
        BufferView::new(self.buffer, self.view)
            .unwrap_or_else(|_| unreachable!("a tensor's own view fits its buffer"))
    }

    /// Part of the tensor under another view (built from [`SharedTensor::view`] with
    /// `transpose`, `reshape`, …), to pass to a task with a tag.
    ///
    /// # Errors
    /// [`TypesError::ViewOutOfBounds`] if `view` leaves the tensor's bytes.
    pub fn with_view(&self, view: TensorView) -> Result<BufferView, TypesError> {
        BufferView::new(self.buffer, view)
    }

    /// Elements `start..end` of axis `axis`, to pass to a task with a tag: its error can
    /// be left to [`strata_types::TaskArgs`]' chaining methods, which record it.
    ///
    /// ```
    /// use strata_host::{SharedMemory, SharedTensor};
    /// use strata_types::{IdentityMinter, TaskArgs};
    /// let mem = SharedMemory::new();
    /// let t = SharedTensor::zeros::<f32>(&mem, &IdentityMinter::new(), &[4, 8])?;
    /// let args = TaskArgs::new().input(t.slice(0, 0, 2)).output(t.slice(0, 2, 4));
    /// assert_eq!(args.tensors()[1].view.byte_offset(), 64);
    /// assert!(TaskArgs::new().input(t.slice(0, 3, 5)).check().is_err());
    /// # Ok::<(), strata_host::HostError>(())
    /// ```
    ///
    /// # Errors
    /// As [`TensorView::slice`].
    pub fn slice(&self, axis: usize, start: u64, end: u64) -> Result<BufferView, TypesError> {
        self.as_view().slice(axis, start, end)
    }

    /// The box of `shape` at `origin`, to pass to a task with a tag (see
    /// [`SharedTensor::slice`]).
    ///
    /// # Errors
    /// As [`TensorView::window`].
    pub fn window(&self, origin: &[u64], shape: &[u64]) -> Result<BufferView, TypesError> {
        self.as_view().window(origin, shape)
    }

    fn base(&self) -> Result<*mut u8, HostError> {
        self.mem.ptr(self.region, 0, self.buffer.nbytes())
    }

    fn check<T: Element>(&self) -> Result<(), HostError> {
        if dtype_compatible::<T>(self.dtype()) {
            Ok(())
        } else {
            Err(HostError::DtypeMismatch {
                tensor: self.dtype(),
                requested: T::DTYPE,
            })
        }
    }

    fn numel(&self) -> usize {
        // The region exists, so the element count fits in memory.
        self.view.numel() as usize
    }

    /// Copies the elements out.
    ///
    /// # Errors
    /// [`HostError::DtypeMismatch`] unless `T` is the tensor's element type;
    /// [`HostError::Busy`] while tasks that name the tensor are in flight.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, HostError> {
        self.check::<T>()?;
        let base = self.base()?;
        let _access = self.mem.host_access(self.region)?;
        let mut out = Vec::<T>::with_capacity(self.numel());
        // SAFETY: the region holds `numel` elements of T from `base` (page-aligned, so
        // aligned for T); `out` has capacity for them and does not overlap shared memory;
        // every bit pattern is a valid T (`Element`). No task that names the tensor is in
        // flight, and none is dispatched while `_access` lives; only the unsafe slices
        // could write it now, and their callers promised not to.
        unsafe {
            std::ptr::copy_nonoverlapping(base.cast::<T>(), out.as_mut_ptr(), self.numel());
            out.set_len(self.numel());
        }
        Ok(out)
    }

    /// Overwrites every element with `data` (row-major).
    ///
    /// # Errors
    /// [`HostError::DtypeMismatch`], [`HostError::LengthMismatch`]; [`HostError::Busy`]
    /// while tasks that name the tensor are in flight.
    pub fn write<T: Element>(&self, data: &[T]) -> Result<(), HostError> {
        self.check::<T>()?;
        if data.len() != self.numel() {
            return Err(HostError::LengthMismatch {
                expected: self.view.numel(),
                got: data.len(),
            });
        }
        let base = self.base()?;
        let _access = self.mem.host_access(self.region)?;
        // SAFETY: the region holds exactly `data.len()` elements of T from `base`
        // (aligned); `data` is ordinary memory, so the ranges do not overlap. No task that
        // names the tensor is in flight or dispatched while `_access` lives, and host copies
        // exclude each other.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.cast::<T>(), data.len()) };
        Ok(())
    }

    /// The elements as a slice, without copying.
    ///
    /// # Safety
    /// The bytes are shared with every process of the worker tree. The caller must make
    /// sure nobody writes them while the slice lives: no running task may have the
    /// tensor as an OUTPUT/INOUT/OUTPUT_EXISTING (or NO_DEP) argument, and no
    /// [`SharedTensor::write`] or `as_mut_slice` on any clone may overlap it. Violating
    /// this is a data race (undefined behaviour), which Rust cannot check across
    /// processes.
    ///
    /// # Errors
    /// [`HostError::DtypeMismatch`].
    pub unsafe fn as_slice<T: Element>(&self) -> Result<&[T], HostError> {
        self.check::<T>()?;
        let base = self.base()?;
        // SAFETY: `numel` elements of T at an aligned `base` inside the live region (kept
        // alive by `self.mem`); exclusion of writers is the caller's obligation.
        Ok(unsafe { std::slice::from_raw_parts(base.cast::<T>(), self.numel()) })
    }

    /// The elements as a mutable slice, without copying.
    ///
    /// # Safety
    /// As [`SharedTensor::as_slice`], and additionally nobody may *read* the bytes either
    /// while the slice lives (no running task using the tensor at all, no other slice
    /// from any clone): this must be the only access.
    ///
    /// # Errors
    /// [`HostError::DtypeMismatch`].
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice<T: Element>(&self) -> Result<&mut [T], HostError> {
        self.check::<T>()?;
        let base = self.base()?;
        // SAFETY: as `as_slice`; exclusivity is the caller's obligation.
        Ok(unsafe { std::slice::from_raw_parts_mut(base.cast::<T>(), self.numel()) })
    }
}

/// The whole tensor, for [`strata_types::TaskArgs`]' chaining methods.
impl IntoTensorArg for &SharedTensor {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError> {
        Ok(self.arg(tag))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_types::f16;

    #[test]
    fn tensors_round_trip_and_check_types_and_lengths() {
        let mem = SharedMemory::new();
        let m = IdentityMinter::new();
        let a = SharedTensor::from_slice(&mem, &m, &[4], &[1u64, 2, 3, 4]).unwrap();
        let b = SharedTensor::zeros::<f16>(&mem, &m, &[2, 2]).unwrap();
        assert_ne!(a.buffer().identity(), b.buffer().identity());
        assert_eq!(a.region(), 1);
        assert_eq!(b.region(), 2);
        assert_eq!(b.to_vec::<f16>().unwrap(), vec![f16::ZERO; 4]);
        assert!(matches!(
            a.write(&[1u64]),
            Err(HostError::LengthMismatch {
                expected: 4,
                got: 1
            })
        ));
        assert!(matches!(
            a.to_vec::<i64>(),
            Err(HostError::DtypeMismatch { .. })
        ));
        assert!(matches!(
            SharedTensor::from_slice(&mem, &m, &[3], &[1u8]),
            Err(HostError::LengthMismatch { .. })
        ));
        assert!(matches!(
            SharedTensor::new(&mem, &m, &[], DataType::F32),
            Err(HostError::Types(_))
        ));
        let c = a.clone();
        c.write(&[9u64, 8, 7, 6]).unwrap();
        // SAFETY: nothing else touches `a` in this test.
        assert_eq!(unsafe { a.as_slice::<u64>() }.unwrap(), &[9, 8, 7, 6]);
        // SAFETY: as above; the slice is the only access while it lives.
        unsafe { a.as_mut_slice::<u64>() }.unwrap()[0] = 1;
        assert_eq!(c.to_vec::<u64>().unwrap(), vec![1, 8, 7, 6]);
        let bad = TensorView::contiguous(DataType::U64, &[5]).unwrap();
        assert!(a.arg_view(bad, ArgTag::Input).is_err());
        let bools = SharedTensor::new(&mem, &m, &[3], DataType::Bool).unwrap();
        bools.write(&[1u8, 0, 1]).unwrap();
        assert_eq!(bools.to_vec::<u8>().unwrap(), vec![1, 0, 1]);
        mem.freeze();
        let e = SharedTensor::zeros::<f32>(&mem, &m, &[1]).unwrap_err();
        assert!(e.to_string().contains("before init()"), "{e}");
    }
}
