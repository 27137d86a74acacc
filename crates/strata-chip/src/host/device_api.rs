//! The device API of a [`ChipWorker`]: allocating, freeing and copying device memory and
//! resident [`DeviceTensor`]s between runs.

use super::args::{CopyOffsets, TensorInit};
use super::worker::{ChipWorker, Live};
use crate::device::arena::{as_bytes, as_bytes_mut};
use crate::device::memory::{DevicePtr, DeviceTensor};
use crate::error::ChipError;
use strata_types::{DataType, Element, TensorView};

impl ChipWorker {
    /// Allocates `bytes` of device memory (rounded up to 1024, 1024-aligned).
    ///
    /// # Errors
    /// [`ChipError::OutOfDeviceMemory`], [`ChipError::ZeroSizedAlloc`].
    pub fn malloc(&self, bytes: u64) -> Result<DevicePtr, ChipError> {
        Ok(self.live("malloc")?.mem.malloc(bytes)?.0)
    }

    /// Frees an allocation by its base pointer. If a kernel abandoned after its timeout
    /// may still write it, it is quarantined instead: freed for the caller (a second free
    /// is a [`ChipError::DoubleFree`]) but not reused, and still committed, until that
    /// kernel returns.
    ///
    /// # Errors
    /// [`ChipError::DoubleFree`], [`ChipError::StaleHandle`], [`ChipError::InteriorFree`],
    /// [`ChipError::ForeignHandle`].
    pub fn free(&self, ptr: DevicePtr) -> Result<(), ChipError> {
        self.live("free")?.mem.free(&ptr)
    }

    /// Copies `nbytes` from `src` (starting at byte `offsets.host`) to device memory at
    /// `dst + offsets.device`. The range must stay inside `dst`'s live allocation.
    ///
    /// # Errors
    /// [`ChipError::OutOfRange`] if `offsets.device + nbytes` reaches past the end of
    /// `dst`'s allocation (an offset at or past its end included, however large);
    /// [`ChipError::HostRange`], and the handle errors of [`ChipWorker::free`] for `dst`
    /// itself.
    pub fn copy_to<T: Element>(
        &self,
        dst: DevicePtr,
        src: &[T],
        nbytes: usize,
        offsets: CopyOffsets,
    ) -> Result<(), ChipError> {
        let live = self.live("copy_to")?;
        let bytes = as_bytes(src);
        let end = offsets
            .host
            .checked_add(nbytes)
            .filter(|&e| e <= bytes.len())
            .ok_or(ChipError::HostRange {
                have: bytes.len(),
                offset: offsets.host,
                end: offsets.host.saturating_add(nbytes),
            })?;
        let addr =
            live.mem
                .check_range_at(&dst, offsets.device, nbytes as u64, "device pointer")?;
        live.mem.arena.write(addr, &bytes[offsets.host..end])
    }

    /// Copies `nbytes` from device memory at `src + offsets.device` into `dst` (starting at
    /// byte `offsets.host`).
    ///
    /// # Errors
    /// As [`ChipWorker::copy_to`].
    pub fn copy_from<T: Element>(
        &self,
        dst: &mut [T],
        src: DevicePtr,
        nbytes: usize,
        offsets: CopyOffsets,
    ) -> Result<(), ChipError> {
        let live = self.live("copy_from")?;
        let bytes = as_bytes_mut(dst);
        let have = bytes.len();
        let end = offsets
            .host
            .checked_add(nbytes)
            .filter(|&e| e <= have)
            .ok_or(ChipError::HostRange {
                have,
                offset: offsets.host,
                end: offsets.host.saturating_add(nbytes),
            })?;
        let addr =
            live.mem
                .check_range_at(&src, offsets.device, nbytes as u64, "device pointer")?;
        live.mem.arena.read(addr, &mut bytes[offsets.host..end])
    }

    /// The device tensor whose allocation starts at `addr`, seen through `view` (for a
    /// process that received a device address from its parent, which tracks the
    /// allocation's provenance).
    ///
    /// # Errors
    /// [`ChipError::DoubleFree`] if no live allocation starts at `addr`;
    /// [`ChipError::Types`] if the view does not fit it.
    pub fn device_tensor_at(&self, addr: u64, view: TensorView) -> Result<DeviceTensor, ChipError> {
        let live = self.live("device_tensor_at")?;
        let (ptr, size) = live.mem.allocation_at(addr)?;
        view.check_fits(size)?;
        Ok(DeviceTensor {
            ptr,
            size,
            view,
            worker: self.config().chip_id,
        })
    }

    /// Copies `nbytes` from raw host memory to device memory at `dst`.
    ///
    /// # Safety
    /// `src .. src + nbytes` must be readable, and not written concurrently.
    ///
    /// # Errors
    /// As [`ChipWorker::copy_to`].
    pub unsafe fn copy_to_raw(
        &self,
        dst: DevicePtr,
        src: *const u8,
        nbytes: u64,
    ) -> Result<(), ChipError> {
        let live = self.live("copy_to")?;
        live.mem.check_range(&dst, nbytes, "device pointer")?;
        // SAFETY: forwarded from this function's contract; the device range was checked.
        unsafe { live.mem.arena.write_raw(dst.addr, src, nbytes) }
    }

    /// Copies `nbytes` of device memory at `src` to raw host memory.
    ///
    /// # Safety
    /// `dst .. dst + nbytes` must be writable, and not accessed concurrently.
    ///
    /// # Errors
    /// As [`ChipWorker::copy_from`].
    pub unsafe fn copy_from_raw(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        nbytes: u64,
    ) -> Result<(), ChipError> {
        let live = self.live("copy_from")?;
        live.mem.check_range(&src, nbytes, "device pointer")?;
        // SAFETY: forwarded from this function's contract; the device range was checked.
        unsafe { live.mem.arena.read_raw(src.addr, dst, nbytes) }
    }

    /// Allocates a device-resident tensor of `shape` × `dtype`, initialised per `init`.
    /// It stays on the device across runs (never copied back implicitly).
    ///
    /// # Errors
    /// [`ChipError::Types`] for a bad shape, [`ChipError::DtypeMismatch`] for an initial
    /// value of another type, and allocation errors.
    pub fn alloc_tensor(
        &self,
        shape: &[u64],
        dtype: DataType,
        init: TensorInit,
    ) -> Result<DeviceTensor, ChipError> {
        let live = self.live("alloc_tensor")?;
        let view = TensorView::contiguous(dtype, shape)?;
        if let TensorInit::Value(d, _) = init {
            if d != dtype {
                return Err(ChipError::DtypeMismatch {
                    have: dtype,
                    want: d,
                });
            }
        }
        let (ptr, size) = live.mem.malloc(view.nbytes())?;
        match init {
            TensorInit::Undefined => {}
            TensorInit::Zeros => live.mem.arena.fill(ptr.addr, size, &[0])?,
            TensorInit::Value(_, b) => {
                live.mem
                    .arena
                    .fill(ptr.addr, view.nbytes(), &b[..dtype.size_bytes()])?
            }
        }
        Ok(DeviceTensor {
            ptr,
            size,
            view,
            worker: self.config().chip_id,
        })
    }

    /// Frees a device tensor.
    ///
    /// # Errors
    /// As [`ChipWorker::free`].
    pub fn free_tensor(&self, t: DeviceTensor) -> Result<(), ChipError> {
        self.live("free_tensor")?.mem.free(&t.ptr)
    }

    fn check_tensor(&self, t: &DeviceTensor, op: &'static str) -> Result<&Live, ChipError> {
        let live = self.live(op)?;
        live.mem.check_range(&t.ptr, t.size, "device tensor")?;
        Ok(live)
    }

    /// Writes a device tensor's elements (row-major over its view).
    ///
    /// # Errors
    /// Handle errors, [`ChipError::DtypeMismatch`], or a length mismatch.
    pub fn write_tensor<T: Element>(&self, t: &DeviceTensor, data: &[T]) -> Result<(), ChipError> {
        let live = self.check_tensor(t, "write_tensor")?;
        if t.view.dtype() != T::DTYPE {
            return Err(ChipError::DtypeMismatch {
                have: t.view.dtype(),
                want: T::DTYPE,
            });
        }
        if data.len() as u64 != t.view.numel() {
            return Err(ChipError::InvalidRunArgs(format!(
                "write_tensor: {} values for a tensor of {} elements",
                data.len(),
                t.view.numel()
            )));
        }
        let bytes = as_bytes(data);
        let mut pos = 0usize;
        for (off, len) in t.view.contiguous_runs() {
            live.mem
                .arena
                .write(t.ptr.addr + off, &bytes[pos..pos + len as usize])?;
            pos += len as usize;
        }
        Ok(())
    }

    /// Reads a device tensor's elements (row-major over its view).
    ///
    /// # Errors
    /// Handle errors, [`ChipError::DtypeMismatch`].
    pub fn read_tensor<T: Element>(&self, t: &DeviceTensor) -> Result<Vec<T>, ChipError> {
        let live = self.check_tensor(t, "read_tensor")?;
        if t.view.dtype() != T::DTYPE {
            return Err(ChipError::DtypeMismatch {
                have: t.view.dtype(),
                want: T::DTYPE,
            });
        }
        let n = t.view.numel() as usize;
        let mut out: Vec<T> = Vec::with_capacity(n);
        // Fill from zeroed bytes first: every bit pattern is a valid `T`.
        out.resize(
            n,
            live.mem
                .arena
                .read_elem::<T>(t.ptr.addr + t.view.byte_offset())?,
        );
        let bytes = as_bytes_mut(&mut out);
        let mut pos = 0usize;
        for (off, len) in t.view.contiguous_runs() {
            live.mem
                .arena
                .read(t.ptr.addr + off, &mut bytes[pos..pos + len as usize])?;
            pos += len as usize;
        }
        Ok(out)
    }

    /// Bytes this chip's allocator holds: user allocations, ring heaps, the retained
    /// staging buffer, and memory quarantined because a kernel abandoned after its
    /// timeout may still write it ([`ChipWorker::quarantined_device_memory`]).
    ///
    /// # Errors
    /// [`ChipError::NotInitialized`].
    pub fn committed_device_memory(&self) -> Result<u64, ChipError> {
        Ok(self.live("committed_device_memory")?.mem.committed())
    }

    /// Bytes freed (or given up by the runtime: old ring heaps, old staging) that are not
    /// reusable yet because a kernel abandoned after its timeout may still write them.
    /// They are part of [`ChipWorker::committed_device_memory`] and return to the
    /// allocator once [`ChipWorker::lost_cores`] is empty.
    ///
    /// # Errors
    /// [`ChipError::NotInitialized`].
    pub fn quarantined_device_memory(&self) -> Result<u64, ChipError> {
        Ok(self.live("quarantined_device_memory")?.mem.held_bytes())
    }

    /// `(free, total)` bytes of this emulated card: `total` is its configured capacity
    /// ([`ChipConfig::device_memory_bytes`](crate::ChipConfig::device_memory_bytes)),
    /// `free` what its allocator could still hand out (the sum of its free blocks; one
    /// allocation may need a contiguous block, see [`ChipError::OutOfDeviceMemory`]'s
    /// `largest_free`). These are emulated figures: the arena is virtual memory committed
    /// on touch, so they say what this card would have, not what the host has. The first
    /// 64 KiB of every card are never handed out (no buffer has address 0).
    ///
    /// ```
    /// use strata_chip::{ChipConfig, ChipWorker};
    /// let mut chip = ChipWorker::new(ChipConfig { device_memory_bytes: 1 << 29, ..ChipConfig::default() })?;
    /// chip.init()?;
    /// let (free, total) = chip.device_memory_info()?;
    /// assert_eq!(total, 1 << 29);
    /// let p = chip.malloc(4096)?;
    /// assert_eq!(chip.device_memory_info()?.0, free - 4096);
    /// chip.free(p)?;
    /// # Ok::<(), strata_chip::ChipError>(())
    /// ```
    ///
    /// # Errors
    /// [`ChipError::NotInitialized`].
    pub fn device_memory_info(&self) -> Result<(u64, u64), ChipError> {
        Ok(self.live("device_memory_info")?.mem.info())
    }
}
