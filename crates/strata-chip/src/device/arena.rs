//! The one module of this crate that turns device addresses into memory: the device arena
//! (an anonymous mapping) and the typed views kernels get of their tensors.
//!
//! # Why the views are sound
//!
//! Device memory is one mapping that lives as long as any thread that can reach it (every
//! core thread, the orchestrator thread and the worker hold an `Arc<Arena>`), so an address
//! that passed the bounds check always points into mapped memory.
//!
//! Aliasing between *tasks* is ruled out by the graph: strata-graph orders every pair of
//! tasks whose tracked accesses overlap and at least one of which writes (read-after-write,
//! write-after-read, write-after-write), so while a task runs no other task reads bytes it
//! may write, and no other task writes bytes it reads. Runtime-created tensors live in
//! ring heaps whose bytes are reused only after every task that names them was consumed.
//! The host touches device memory only between runs, and the orchestration only after
//! waiting for every producer (and, to write, every consumer) of the bytes.
//!
//! Aliasing *inside* a task is ruled out here: the submit rejects a written argument that
//! may overlap another argument of the same task, and the blocks and subtasks of one task
//! (which share its arguments and run concurrently) claim each written argument: one
//! (block, subtask) may hold it exclusively (slices, `&mut`), or any number may share it
//! through element-wise relaxed atomics. Read-only arguments are never written while the
//! task runs, so `&[T]` over them is sound for every block.
//!
//! What the graph cannot see is untracked access (`NO_DEP` arguments, `manual_dep` views):
//! kernels reach those only through atomics (always sound) or an `unsafe` accessor whose
//! contract puts the ordering on the caller. A kernel that ignored cancellation after a
//! timeout keeps running on its leaked thread: the memory stays mapped, but its writes may
//! race with later use of its buffers — the emulated equivalent of a runaway core, which
//! the chip reports when it takes the core out of service.

use crate::error::ChipError;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use strata_types::{Element, TensorView};

/// Device memory: one anonymous mapping, addressed by byte offsets ("device addresses").
pub(crate) struct Arena {
    base: *mut u8,
    len: u64,
    _map: memmap2::MmapMut,
}

// SAFETY: the arena is a plain byte region; the raw pointer is only dereferenced through
// the bounds-checked methods below, whose concurrent use is ordered as the module
// documentation explains. MmapMut itself is Send + Sync.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("len", &self.len).finish()
    }
}

impl Arena {
    /// Maps `len` bytes of virtual memory (no swap reservation; pages are committed when
    /// first touched).
    pub(crate) fn new(len: u64) -> Result<Arena, ChipError> {
        let n = usize::try_from(len)
            .map_err(|_| ChipError::InvalidConfig(format!("device arena of {len} bytes")))?;
        let mut map = memmap2::MmapOptions::new()
            .len(n)
            .no_reserve_swap()
            .map_anon()
            .map_err(|e| {
                ChipError::InvalidConfig(format!(
                    "could not map a device arena of {len} bytes ({e}); lower ChipConfig::device_memory_bytes"
                ))
            })?;
        let base = map.as_mut_ptr();
        Ok(Arena {
            base,
            len,
            _map: map,
        })
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    fn check(&self, addr: u64, len: u64) -> Result<(), ChipError> {
        match addr.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(ChipError::Internal(format!(
                "device range [{addr:#x}, +{len}) outside the {}-byte arena",
                self.len
            ))),
        }
    }

    fn ptr(&self, addr: u64) -> *mut u8 {
        // SAFETY: callers checked `addr` (+ their length) against the arena size, so the
        // offset stays inside the mapping.
        unsafe { self.base.add(addr as usize) }
    }

    /// Copies host bytes to device address `addr`.
    pub(crate) fn write(&self, addr: u64, src: &[u8]) -> Result<(), ChipError> {
        self.check(addr, src.len() as u64)?;
        // SAFETY: in bounds (checked); the host writes only between runs or after the
        // orchestration waited for every accessor of these bytes (module docs), so no one
        // else touches them; `src` is host memory, disjoint from the mapping.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr(addr), src.len()) };
        Ok(())
    }

    /// Copies `len` bytes from raw host memory to device address `addr`.
    ///
    /// # Safety
    /// `src .. src + len` must be readable and disjoint from the arena.
    pub(crate) unsafe fn write_raw(
        &self,
        addr: u64,
        src: *const u8,
        len: u64,
    ) -> Result<(), ChipError> {
        self.check(addr, len)?;
        // SAFETY: in bounds (checked); `src` readable per this function's contract; no one
        // else touches these device bytes while the host stages them (module docs).
        unsafe { std::ptr::copy_nonoverlapping(src, self.ptr(addr), len as usize) };
        Ok(())
    }

    /// Copies `len` device bytes at `addr` to raw host memory.
    ///
    /// # Safety
    /// `dst .. dst + len` must be writable and disjoint from the arena.
    pub(crate) unsafe fn read_raw(
        &self,
        addr: u64,
        dst: *mut u8,
        len: u64,
    ) -> Result<(), ChipError> {
        self.check(addr, len)?;
        // SAFETY: in bounds; no writer runs concurrently (module docs); `dst` writable per
        // this function's contract.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(addr), dst, len as usize) };
        Ok(())
    }

    /// Copies device bytes at `addr` to host memory.
    pub(crate) fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), ChipError> {
        self.check(addr, dst.len() as u64)?;
        // SAFETY: in bounds; no writer runs concurrently (module docs); disjoint from `dst`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(addr), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Fills `len` bytes at `addr` with repetitions of `pattern` (one element).
    pub(crate) fn fill(&self, addr: u64, len: u64, pattern: &[u8]) -> Result<(), ChipError> {
        self.check(addr, len)?;
        let p = self.ptr(addr);
        if pattern.iter().all(|&b| b == pattern[0]) {
            // SAFETY: in bounds; the bytes are owned by the caller (a new allocation or a
            // fresh heap slab nobody else can name yet).
            unsafe { std::ptr::write_bytes(p, pattern[0], len as usize) };
            return Ok(());
        }
        let n = pattern.len() as u64;
        if n == 0 || len % n != 0 {
            return Err(ChipError::Internal(format!(
                "fill of {len} bytes with a {n}-byte pattern"
            )));
        }
        // SAFETY: as above; the slice covers exactly the checked range.
        let dst = unsafe { std::slice::from_raw_parts_mut(p, len as usize) };
        for chunk in dst.chunks_exact_mut(pattern.len()) {
            chunk.copy_from_slice(pattern);
        }
        Ok(())
    }

    /// Reads one element.
    pub(crate) fn read_elem<T: Element>(&self, addr: u64) -> Result<T, ChipError> {
        self.check(addr, std::mem::size_of::<T>() as u64)?;
        // SAFETY: in bounds; `T: Element` is plain old data, so any bytes are a valid T;
        // the orchestration waited for the element's writers (module docs).
        Ok(unsafe { std::ptr::read_unaligned(self.ptr(addr) as *const T) })
    }

    /// Writes one element.
    pub(crate) fn write_elem<T: Element>(&self, addr: u64, v: T) -> Result<(), ChipError> {
        self.check(addr, std::mem::size_of::<T>() as u64)?;
        // SAFETY: in bounds; the orchestration waited for the element's readers and
        // writers (module docs).
        unsafe { std::ptr::write_unaligned(self.ptr(addr) as *mut T, v) };
        Ok(())
    }

    /// Returns the physical pages of `[addr, addr + len)` to the OS (the range reads as
    /// zeros afterwards). Only whole pages inside the range are released.
    pub(crate) fn discard(&self, addr: u64, len: u64) {
        const PAGE: u64 = 4096;
        let start = addr.div_ceil(PAGE) * PAGE;
        let end = (addr + len) / PAGE * PAGE;
        if end <= start || self.check(start, end - start).is_err() {
            return;
        }
        // SAFETY: a page-aligned range inside the mapping that the allocator just freed:
        // no handle or task can reach it. MADV_DONTNEED on private anonymous memory only
        // drops its contents.
        unsafe {
            libc::madvise(
                self.ptr(start) as *mut libc::c_void,
                (end - start) as usize,
                libc::MADV_DONTNEED,
            );
        }
    }
}

/// Views a slice of elements as bytes.
pub(crate) fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: `T: Element` is plain old data without padding; the byte view covers exactly
    // the slice's memory and borrows it immutably.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// Views a mutable slice of elements as bytes.
pub(crate) fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; every byte pattern is a valid `T`, so writes through the byte
    // view cannot create an invalid value.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}

// ----- argument claims -------------------------------------------------------------------

const CLAIM_FREE: u32 = 0;
const CLAIM_SHARED: u32 = 1;

fn claim_idle(owner: u32) -> u32 {
    (owner + 1) << 1
}

fn claim_active(owner: u32) -> u32 {
    ((owner + 1) << 1) | 1
}

/// Per-argument access claims of one task, shared by its blocks and subtasks.
///
/// A written argument is claimed either exclusively by one owner (block × subtask; the
/// claim is sticky for the task, and active while a view is alive) or shared (element-wise
/// atomics only).
pub(crate) struct Claims {
    words: [AtomicU32; strata_types::ArgLimits::CHIP_TASK.max_tensors],
}

impl Default for Claims {
    fn default() -> Self {
        Claims {
            words: std::array::from_fn(|_| AtomicU32::new(CLAIM_FREE)),
        }
    }
}

impl std::fmt::Debug for Claims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Claims")
    }
}

/// Why a claim was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimError {
    /// This owner already holds a live exclusive view of the argument.
    AlreadyBorrowed,
    /// Another block or subtask holds it exclusively.
    OtherOwner(u32),
    /// It is shared (element-wise) by some block or subtask.
    Shared,
}

impl Claims {
    /// Frees the first `n` claims (for a recycled task).
    pub(crate) fn reset(&self, n: usize) {
        for w in self.words.iter().take(n) {
            w.store(CLAIM_FREE, Ordering::Relaxed);
        }
    }

    fn exclusive(&self, arg: usize, owner: u32) -> Result<(), ClaimError> {
        let w = &self.words[arg];
        let mut cur = w.load(Ordering::Acquire);
        loop {
            if cur == claim_active(owner) {
                return Err(ClaimError::AlreadyBorrowed);
            }
            if cur == CLAIM_SHARED {
                return Err(ClaimError::Shared);
            }
            if cur != CLAIM_FREE && cur != claim_idle(owner) {
                return Err(ClaimError::OtherOwner((cur >> 1) - 1));
            }
            match w.compare_exchange(
                cur,
                claim_active(owner),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    fn release(&self, arg: usize, owner: u32) {
        self.words[arg].store(claim_idle(owner), Ordering::Release);
    }

    fn shared(&self, arg: usize) -> Result<(), ClaimError> {
        let w = &self.words[arg];
        match w.compare_exchange(
            CLAIM_FREE,
            CLAIM_SHARED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Ok(()),
            Err(CLAIM_SHARED) => Ok(()),
            Err(cur) => Err(ClaimError::OtherOwner((cur >> 1) - 1)),
        }
    }
}

// ----- views -----------------------------------------------------------------------------

/// Whether no two elements of `view` share an address (sufficient test: sorted by stride,
/// each stride exceeds the extent of the smaller axes).
fn injective(view: &TensorView) -> bool {
    let mut axes: Vec<(u64, u64)> = view
        .shape()
        .iter()
        .zip(view.strides())
        .filter(|(s, _)| **s > 1)
        .map(|(s, st)| (*st, *s))
        .collect();
    axes.sort_unstable();
    let mut extent = 0u64; // max element offset reachable by the axes so far
    for (stride, len) in axes {
        if stride <= extent {
            return false;
        }
        extent += (len - 1) * stride;
    }
    true
}

fn flat_to_offset(view: &TensorView, mut flat: u64) -> Option<u64> {
    let n = view.ndims();
    if flat >= view.numel() {
        return None;
    }
    let mut off = 0u64;
    for axis in (0..n).rev() {
        let len = view.shape()[axis];
        off += (flat % len) * view.strides()[axis];
        flat /= len;
    }
    Some(off)
}

fn index_to_offset(view: &TensorView, index: &[u64]) -> Option<u64> {
    if index.len() != view.ndims() {
        return None;
    }
    let mut off = 0u64;
    for (axis, &i) in index.iter().enumerate() {
        if i >= view.shape()[axis] {
            return None;
        }
        off += i * view.strides()[axis];
    }
    Some(off)
}

/// Where a view's elements are: the address of element `[0, ..., 0]`.
fn elem0<T>(
    arena: &Arena,
    buffer_addr: u64,
    buffer_len: u64,
    view: &TensorView,
) -> Result<*mut T, ChipError> {
    view.check_fits(buffer_len)?;
    arena.check(buffer_addr, buffer_len)?;
    Ok(arena.ptr(buffer_addr + view.byte_offset()) as *mut T)
}

/// A read-only typed view of a tensor argument in device memory.
///
/// Derefs to nothing; use [`TensorRef::as_slice`] (contiguous views), [`TensorRef::get`],
/// [`TensorRef::runs`] or [`TensorRef::to_vec`].
pub struct TensorRef<'a, T: Element> {
    ptr: *const T,
    view: TensorView,
    _life: PhantomData<&'a [T]>,
}

impl<T: Element> std::fmt::Debug for TensorRef<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorRef")
            .field("view", &self.view)
            .finish()
    }
}

impl<'a, T: Element> TensorRef<'a, T> {
    pub(crate) fn new(
        arena: &'a Arena,
        buffer_addr: u64,
        buffer_len: u64,
        view: TensorView,
    ) -> Result<Self, ChipError> {
        Ok(TensorRef {
            ptr: elem0::<T>(arena, buffer_addr, buffer_len, &view)?,
            view,
            _life: PhantomData,
        })
    }

    /// The view (shape, strides in elements, byte offset in the buffer).
    pub fn view(&self) -> &TensorView {
        &self.view
    }

    /// The shape.
    pub fn shape(&self) -> &[u64] {
        self.view.shape()
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[u64] {
        self.view.strides()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.view.numel() as usize
    }

    /// The elements as one slice, if the view is contiguous (row-major, dense).
    pub fn as_slice(&self) -> Option<&'a [T]> {
        if !self.view.is_contiguous() {
            return None;
        }
        // SAFETY: a contiguous view's elements are `numel` consecutive `T`s inside the
        // buffer (checked at construction); nobody writes them while the task runs (module
        // docs).
        Some(unsafe { std::slice::from_raw_parts(self.ptr, self.numel()) })
    }

    /// The element at a multi-dimensional index (`None` if out of range).
    pub fn get(&self, index: &[u64]) -> Option<T> {
        let off = index_to_offset(&self.view, index)?;
        // SAFETY: the offset addresses an element of the view, inside the buffer.
        Some(unsafe { self.ptr.add(off as usize).read() })
    }

    /// The element at a row-major flat index (`None` if out of range).
    pub fn get_flat(&self, flat: u64) -> Option<T> {
        let off = flat_to_offset(&self.view, flat)?;
        // SAFETY: as `get`.
        Some(unsafe { self.ptr.add(off as usize).read() })
    }

    /// The view's contiguous runs (e.g. the rows of a 2-D window), in row-major order.
    pub fn runs(&self) -> impl Iterator<Item = &'a [T]> + 'a {
        let elem = std::mem::size_of::<T>() as u64;
        let origin = self.view.byte_offset();
        let ptr = self.ptr;
        self.view.contiguous_runs().map(move |(off, len)| {
            // SAFETY: each run lies inside the view (strata-types computes runs from the
            // view's own geometry), hence inside the checked buffer.
            unsafe {
                std::slice::from_raw_parts(
                    ptr.add(((off - origin) / elem) as usize),
                    (len / elem) as usize,
                )
            }
        })
    }

    /// The elements in row-major order, copied out.
    pub fn to_vec(&self) -> Vec<T> {
        let mut v = Vec::with_capacity(self.numel());
        for run in self.runs() {
            v.extend_from_slice(run);
        }
        v
    }
}

/// An exclusive, writable typed view of a tensor argument in device memory.
///
/// Obtained from [`crate::KernelCtx::output`]; while it lives, no other block or subtask of
/// the task can view the argument.
pub struct TensorMut<'a, T: Element> {
    ptr: *mut T,
    view: TensorView,
    claim: Option<(&'a Claims, usize, u32)>,
    _life: PhantomData<&'a mut [T]>,
}

impl<T: Element> std::fmt::Debug for TensorMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorMut")
            .field("view", &self.view)
            .finish()
    }
}

impl<T: Element> Drop for TensorMut<'_, T> {
    fn drop(&mut self) {
        if let Some((c, arg, owner)) = self.claim {
            c.release(arg, owner);
        }
    }
}

impl<'a, T: Element> TensorMut<'a, T> {
    /// An exclusive view after claiming argument `arg` for `owner` (or, with `claims =
    /// None`, an untracked view whose ordering the caller of the `unsafe` accessor
    /// guarantees).
    pub(crate) fn new(
        arena: &'a Arena,
        buffer_addr: u64,
        buffer_len: u64,
        view: TensorView,
        claims: Option<(&'a Claims, usize, u32)>,
    ) -> Result<Result<Self, ClaimError>, ChipError> {
        let ptr = elem0::<T>(arena, buffer_addr, buffer_len, &view)?;
        if let Some((c, arg, owner)) = claims {
            if let Err(e) = c.exclusive(arg, owner) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(TensorMut {
            ptr,
            view,
            claim: claims,
            _life: PhantomData,
        }))
    }

    /// The view.
    pub fn view(&self) -> &TensorView {
        &self.view
    }

    /// The shape.
    pub fn shape(&self) -> &[u64] {
        self.view.shape()
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[u64] {
        self.view.strides()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.view.numel() as usize
    }

    /// The elements as one slice, if the view is contiguous.
    pub fn as_slice(&self) -> Option<&[T]> {
        if !self.view.is_contiguous() {
            return None;
        }
        // SAFETY: contiguous elements inside the buffer; this view holds the exclusive
        // claim, and the graph keeps other tasks away (module docs).
        Some(unsafe { std::slice::from_raw_parts(self.ptr, self.numel()) })
    }

    /// The elements as one mutable slice, if the view is contiguous.
    pub fn as_mut_slice(&mut self) -> Option<&mut [T]> {
        if !self.view.is_contiguous() {
            return None;
        }
        // SAFETY: as `as_slice`; `&mut self` makes the slice unique within the kernel.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.numel()) })
    }

    /// The element at a multi-dimensional index.
    pub fn get(&self, index: &[u64]) -> Option<T> {
        let off = index_to_offset(&self.view, index)?;
        // SAFETY: an element of the view, inside the buffer; exclusive claim.
        Some(unsafe { self.ptr.add(off as usize).read() })
    }

    /// The element at a row-major flat index.
    pub fn get_flat(&self, flat: u64) -> Option<T> {
        let off = flat_to_offset(&self.view, flat)?;
        // SAFETY: as `get`.
        Some(unsafe { self.ptr.add(off as usize).read() })
    }

    /// Writes the element at a multi-dimensional index; false if out of range.
    pub fn set(&mut self, index: &[u64], v: T) -> bool {
        let Some(off) = index_to_offset(&self.view, index) else {
            return false;
        };
        // SAFETY: an element of the view, inside the buffer; exclusive claim and `&mut self`.
        unsafe { self.ptr.add(off as usize).write(v) };
        true
    }

    /// Writes the element at a row-major flat index; false if out of range.
    pub fn set_flat(&mut self, flat: u64, v: T) -> bool {
        let Some(off) = flat_to_offset(&self.view, flat) else {
            return false;
        };
        // SAFETY: as `set`.
        unsafe { self.ptr.add(off as usize).write(v) };
        true
    }

    /// The contiguous runs (e.g. rows of a 2-D window) as mutable slices, in row-major
    /// order. `None` if the view addresses some element twice (a self-overlapping view).
    pub fn runs_mut(&mut self) -> Option<impl Iterator<Item = &mut [T]> + '_> {
        if !injective(&self.view) {
            return None;
        }
        let elem = std::mem::size_of::<T>() as u64;
        let origin = self.view.byte_offset();
        let ptr = self.ptr;
        Some(self.view.contiguous_runs().map(move |(off, len)| {
            // SAFETY: runs lie inside the view; the view is injective, so the runs are
            // pairwise disjoint and each `&mut` is unique; exclusive claim + `&mut self`.
            unsafe {
                std::slice::from_raw_parts_mut(
                    ptr.add(((off - origin) / elem) as usize),
                    (len / elem) as usize,
                )
            }
        }))
    }

    /// Sets every element to `v`.
    pub fn fill(&mut self, v: T) {
        let n = self.numel() as u64;
        for i in 0..n {
            self.set_flat(i, v);
        }
    }

    /// The elements in row-major order, copied out.
    pub fn to_vec(&self) -> Vec<T> {
        (0..self.numel() as u64)
            .filter_map(|i| self.get_flat(i))
            .collect()
    }
}

/// A view of a tensor argument that several blocks or subtasks of one task may use at
/// once: every access is one relaxed atomic load or store of one element, so concurrent
/// use is always sound (racing writes to the same element leave one of the values).
pub struct SharedTensor<'a, T: Element> {
    ptr: *mut T,
    view: TensorView,
    writable: bool,
    _life: PhantomData<&'a [T]>,
}

impl<T: Element> std::fmt::Debug for SharedTensor<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedTensor")
            .field("view", &self.view)
            .field("writable", &self.writable)
            .finish()
    }
}

fn atomic_load<T: Element>(p: *mut T) -> T {
    // SAFETY: `p` is an aligned element address inside the mapping (device addresses of
    // buffers are 1024-aligned and views are element-aligned); `T` is plain old data of
    // size 1, 2, 4 or 8, so reinterpreting the loaded bits as `T` is valid.
    unsafe {
        match std::mem::size_of::<T>() {
            1 => {
                std::mem::transmute_copy(&AtomicU8::from_ptr(p as *mut u8).load(Ordering::Relaxed))
            }
            2 => std::mem::transmute_copy(
                &AtomicU16::from_ptr(p as *mut u16).load(Ordering::Relaxed),
            ),
            4 => std::mem::transmute_copy(
                &AtomicU32::from_ptr(p as *mut u32).load(Ordering::Relaxed),
            ),
            _ => std::mem::transmute_copy(
                &AtomicU64::from_ptr(p as *mut u64).load(Ordering::Relaxed),
            ),
        }
    }
}

fn atomic_store<T: Element>(p: *mut T, v: T) {
    // SAFETY: as `atomic_load`; the element is only ever accessed atomically while shared
    // (the claim excludes exclusive views).
    unsafe {
        match std::mem::size_of::<T>() {
            1 => AtomicU8::from_ptr(p as *mut u8)
                .store(std::mem::transmute_copy(&v), Ordering::Relaxed),
            2 => AtomicU16::from_ptr(p as *mut u16)
                .store(std::mem::transmute_copy(&v), Ordering::Relaxed),
            4 => AtomicU32::from_ptr(p as *mut u32)
                .store(std::mem::transmute_copy(&v), Ordering::Relaxed),
            _ => AtomicU64::from_ptr(p as *mut u64)
                .store(std::mem::transmute_copy(&v), Ordering::Relaxed),
        }
    }
}

impl<'a, T: Element> SharedTensor<'a, T> {
    pub(crate) fn new(
        arena: &'a Arena,
        buffer_addr: u64,
        buffer_len: u64,
        view: TensorView,
        claim: Option<(&'a Claims, usize)>,
        writable: bool,
    ) -> Result<Result<Self, ClaimError>, ChipError> {
        let ptr = elem0::<T>(arena, buffer_addr, buffer_len, &view)?;
        if ptr as usize % std::mem::align_of::<T>() != 0 {
            return Err(ChipError::Internal("misaligned shared tensor".into()));
        }
        if let Some((c, arg)) = claim {
            if let Err(e) = c.shared(arg) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(SharedTensor {
            ptr,
            view,
            writable,
            _life: PhantomData,
        }))
    }

    /// The view.
    pub fn view(&self) -> &TensorView {
        &self.view
    }

    /// The shape.
    pub fn shape(&self) -> &[u64] {
        self.view.shape()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.view.numel() as usize
    }

    /// Whether [`SharedTensor::store`] is allowed (the argument is written by the task).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Loads the element at a multi-dimensional index.
    pub fn load(&self, index: &[u64]) -> Option<T> {
        let off = index_to_offset(&self.view, index)?;
        // SAFETY: an element of the view, inside the buffer.
        Some(atomic_load(unsafe { self.ptr.add(off as usize) }))
    }

    /// Loads the element at a row-major flat index.
    pub fn load_flat(&self, flat: u64) -> Option<T> {
        let off = flat_to_offset(&self.view, flat)?;
        // SAFETY: as `load`.
        Some(atomic_load(unsafe { self.ptr.add(off as usize) }))
    }

    /// Stores the element at a multi-dimensional index; false if out of range or the
    /// argument is read-only.
    pub fn store(&self, index: &[u64], v: T) -> bool {
        let Some(off) = index_to_offset(&self.view, index).filter(|_| self.writable) else {
            return false;
        };
        // SAFETY: as `load`.
        atomic_store(unsafe { self.ptr.add(off as usize) }, v);
        true
    }

    /// Stores the element at a row-major flat index; false if out of range or read-only.
    pub fn store_flat(&self, flat: u64, v: T) -> bool {
        let Some(off) = flat_to_offset(&self.view, flat).filter(|_| self.writable) else {
            return false;
        };
        // SAFETY: as `load`.
        atomic_store(unsafe { self.ptr.add(off as usize) }, v);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_types::DataType;

    #[test]
    fn injectivity_test_matches_brute_force() {
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
            let truly = dedup.len() == offs.len();
            // The test is sufficient: it never calls an overlapping view injective.
            if injective(&v) {
                assert!(truly, "{shape:?} {strides:?}");
            }
        }
        let v = TensorView::contiguous(DataType::F32, &[8, 8]).unwrap();
        assert!(injective(&v.window(&[2, 2], &[3, 4]).unwrap()));
        assert!(injective(&v.transpose(0, 1).unwrap()));
    }

    #[test]
    fn claims_are_exclusive_sticky_and_reentrant_after_release() {
        let c = Claims::default();
        assert_eq!(c.exclusive(0, 3), Ok(()));
        assert_eq!(c.exclusive(0, 3), Err(ClaimError::AlreadyBorrowed));
        assert_eq!(c.exclusive(0, 4), Err(ClaimError::OtherOwner(3)));
        c.release(0, 3);
        assert_eq!(c.exclusive(0, 4), Err(ClaimError::OtherOwner(3)));
        assert_eq!(c.exclusive(0, 3), Ok(()));
        assert_eq!(c.shared(1), Ok(()));
        assert_eq!(c.shared(1), Ok(()));
        assert_eq!(c.exclusive(1, 0), Err(ClaimError::Shared));
        assert_eq!(c.shared(0), Err(ClaimError::OtherOwner(3)));
    }
}
