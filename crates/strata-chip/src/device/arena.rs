//! The one module of this crate that turns device addresses into memory: the device arena
//! (an anonymous mapping), the checked base addresses of the typed views kernels get of
//! their tensors (`strata_types::TensorRef` / `TensorMut`, built in `KernelCtx`), the
//! per-argument claims those views hold, and the element-wise atomic view ([`AtomicView`]).
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
//! **External memory** (windows of distributed memory, `docs/chip.md`): an attached
//! [`ExternalMemory`] appears at device addresses from [`EXTERNAL_BASE`] and is resolved
//! by the same bounds check as the arena. Peers (other chips, other processes) may write
//! it while a kernel runs, which no dependency edge of this chip can prevent: kernels never
//! get `&[T]` / `&mut [T]` of it (`KernelCtx::input` / `output` refuse such arguments);
//! they reach it through element-wise atomics ([`AtomicView`]) or through raw copies
//! (strata-comm's windows), and the orchestration's data access and the host's staging
//! copies do not reach it at all.
//!
//! What the graph cannot see is untracked access (`NO_DEP` arguments, `manual_dep` views):
//! kernels reach those only through atomics (always sound) or an `unsafe` accessor whose
//! contract puts the ordering on the caller. A kernel that ignored cancellation after a
//! timeout keeps running on its leaked thread: the memory stays mapped, but its writes may
//! race with later use of its buffers — the emulated equivalent of a runaway core, which
//! the chip reports when it takes the core out of service.

use crate::error::ChipError;
use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use strata_types::{BufferIdentity, Element, OwnerNonce, TensorView, ViewLender};

/// The device address at which a chip's [`ExternalMemory`] begins: byte `o` of the
/// external memory is device address `EXTERNAL_BASE + o`. It lies far above any device
/// arena (at most [`crate::MAX_DEVICE_MEMORY_BYTES`] = 2^46 bytes), so the two ranges
/// never meet.
pub const EXTERNAL_BASE: u64 = 1 << 48;

/// Memory outside a chip's device arena that its kernels address in place: the memory of
/// distributed windows (strata-comm's arena), shared with other chips — other processes —
/// that may write it while a kernel of this chip runs. Attached with
/// [`crate::ChipWorker::attach_external_memory`] before `init`; byte `o` of it is device
/// address [`EXTERNAL_BASE`]` + o`.
///
/// Tensors in the shared-memory region it stands for are passed to runs in place (never
/// staged: peers write them), as [`crate::RunArgs::external`] arguments. A kernel reaches
/// such an argument through element-wise atomics ([`crate::KernelCtx::shared`]) or, with
/// strata-comm, as a window (`ctx.window(i)`); `ctx.input` / `ctx.output` refuse it, since
/// a slice over memory a peer may write at any time would be a data race.
#[derive(Clone)]
pub struct ExternalMemory {
    region: u64,
    base: *mut u8,
    len: u64,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: a description of shared memory: the pointer is only dereferenced through the
// arena's bounds-checked resolution, by atomics and raw copies (module docs); the owner
// keeps the mapping alive and is Send + Sync itself.
unsafe impl Send for ExternalMemory {}
// SAFETY: as above.
unsafe impl Sync for ExternalMemory {}

impl std::fmt::Debug for ExternalMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalMemory")
            .field("region", &self.region)
            .field("len", &self.len)
            .finish()
    }
}

impl ExternalMemory {
    /// External memory of `len` bytes at `base` in this process, standing for shared-memory
    /// region `region` (a tensor argument located at `HostShared { region, offset }` is
    /// passed in place at device address `EXTERNAL_BASE + offset`). `owner` is kept alive
    /// as long as the chip can reach the memory (hold the mapping in it, or anything whose
    /// life spans the mapping's).
    ///
    /// # Safety
    /// `base..base + len` must be mapped readable and writable, 64-byte aligned, for as
    /// long as `owner` lives, and must not overlap the chip's device arena. Other threads
    /// and processes may access it only through atomics and raw copies (never through Rust
    /// references), as the kernels of this chip do.
    ///
    /// # Errors
    /// [`ChipError::InvalidConfig`] for a null or misaligned base, or a length of 0 or one
    /// that does not fit the device address space above [`EXTERNAL_BASE`].
    pub unsafe fn new(
        region: u64,
        base: *mut u8,
        len: u64,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Result<ExternalMemory, ChipError> {
        if base.is_null() || base as usize % 64 != 0 {
            return Err(ChipError::InvalidConfig(format!(
                "external memory at {base:p}: the base must be non-null and 64-byte aligned"
            )));
        }
        if len == 0 || len > u64::MAX - EXTERNAL_BASE || usize::try_from(len).is_err() {
            return Err(ChipError::InvalidConfig(format!(
                "external memory of {len} bytes: the length must be at least 1 and fit the device address space above {EXTERNAL_BASE:#x}"
            )));
        }
        Ok(ExternalMemory {
            region,
            base,
            len,
            _owner: owner,
        })
    }

    /// The shared-memory region it stands for.
    pub fn region(&self) -> u64 {
        self.region
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never true: external memory has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Whether a device address is in the external memory's range.
pub(crate) fn is_external(addr: u64) -> bool {
    addr >= EXTERNAL_BASE
}

/// The dependency identity of an external buffer: its place in the external memory (one
/// buffer per offset while it is live; the graph keys are per chip and per run).
pub(crate) fn external_identity(offset: u64) -> BufferIdentity {
    const EXTERNAL_OWNER: OwnerNonce = OwnerNonce(u64::from_le_bytes(*b"EXTERNAL"));
    BufferIdentity::new(EXTERNAL_OWNER, offset, 1).expect("generation 1 is not zero")
}

/// The identity of an external buffer's ordering key (at device address `addr`): every
/// task that names the buffer writes it, so tasks on one window buffer run one at a time.
pub(crate) fn external_order_identity(addr: u64) -> BufferIdentity {
    const ORDER_OWNER: OwnerNonce = OwnerNonce(u64::from_le_bytes(*b"EXTORDER"));
    BufferIdentity::new(ORDER_OWNER, addr, 1).expect("generation 1 is not zero")
}

/// Device memory: one anonymous mapping, addressed by byte offsets ("device addresses"),
/// and the external memory attached to the chip, if any (device addresses from
/// [`EXTERNAL_BASE`]).
pub(crate) struct Arena {
    base: *mut u8,
    len: u64,
    _map: memmap2::MmapMut,
    external: Option<ExternalMemory>,
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
    pub(crate) fn new(len: u64, external: Option<ExternalMemory>) -> Result<Arena, ChipError> {
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
            external,
        })
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The attached external memory, if any.
    pub(crate) fn external(&self) -> Option<&ExternalMemory> {
        self.external.as_ref()
    }

    /// The address of device range `[addr, addr + len)`, in the arena or in the external
    /// memory, checked to lie inside it (what kernels' views and atomics are built on).
    pub(crate) fn resolve(&self, addr: u64, len: u64) -> Result<*mut u8, ChipError> {
        if !is_external(addr) {
            self.check(addr, len)?;
            return Ok(self.ptr(addr));
        }
        let off = addr - EXTERNAL_BASE;
        let ext = self.external.as_ref().ok_or_else(|| {
            ChipError::Internal(format!(
                "device address {addr:#x} is in the external range, but the chip has no external memory"
            ))
        })?;
        match off.checked_add(len) {
            // SAFETY: `off + len <= ext.len`, so the offset stays inside the external
            // mapping (its constructor's contract).
            Some(end) if end <= ext.len => Ok(unsafe { ext.base.add(off as usize) }),
            _ => Err(ChipError::Internal(format!(
                "external range [{off:#x}, +{len}) outside the {}-byte external memory",
                ext.len
            ))),
        }
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

    pub(crate) fn exclusive(&self, arg: usize, owner: u32) -> Result<(), ClaimError> {
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

    fn release_claim(&self, arg: usize, owner: u32) {
        self.words[arg].store(claim_idle(owner), Ordering::Release);
    }

    /// The token an exclusive view of `arg` held by `owner` releases on drop.
    pub(crate) fn token(arg: usize, owner: u32) -> u64 {
        ((arg as u64) << 32) | u64::from(owner)
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

/// An exclusive view (a `TensorMut` from `KernelCtx::output`) releases its claim here
/// when it drops; the token is [`Claims::token`].
impl ViewLender for Claims {
    fn release(&self, token: u64) {
        self.release_claim((token >> 32) as usize, token as u32);
    }
}

// ----- views -----------------------------------------------------------------------------

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

/// The address of a view's buffer, checked: the view fits the buffer and the buffer lies
/// inside the arena (what [`strata_types::TensorRef::new`] takes as its base).
pub(crate) fn buffer_base(
    arena: &Arena,
    buffer_addr: u64,
    buffer_len: u64,
    view: &TensorView,
) -> Result<*mut u8, ChipError> {
    view.check_fits(buffer_len)?;
    arena.resolve(buffer_addr, buffer_len)
}

/// Where a view's elements are: the address of element `[0, ..., 0]`.
fn elem0<T>(
    arena: &Arena,
    buffer_addr: u64,
    buffer_len: u64,
    view: &TensorView,
) -> Result<*mut T, ChipError> {
    view.check_fits(buffer_len)?;
    let base = arena.resolve(buffer_addr, buffer_len)?;
    // SAFETY: the view fits the buffer (checked), so its first element is inside it.
    Ok(unsafe { base.add(view.byte_offset() as usize) } as *mut T)
}

/// A view of a tensor argument that several blocks or subtasks of one task may use at
/// once: every access is one relaxed atomic load or store of one element, so concurrent
/// use is always sound (racing writes to the same element leave one of the values).
pub struct AtomicView<'a, T: Element> {
    ptr: *mut T,
    view: TensorView,
    writable: bool,
    _life: PhantomData<&'a [T]>,
}

impl<T: Element> std::fmt::Debug for AtomicView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtomicView")
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

impl<'a, T: Element> AtomicView<'a, T> {
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
        Ok(Ok(AtomicView {
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

    /// Whether [`AtomicView::store`] is allowed (the argument is written by the task).
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

    #[test]
    fn claims_are_exclusive_sticky_and_reentrant_after_release() {
        let c = Claims::default();
        assert_eq!(c.exclusive(0, 3), Ok(()));
        assert_eq!(c.exclusive(0, 3), Err(ClaimError::AlreadyBorrowed));
        assert_eq!(c.exclusive(0, 4), Err(ClaimError::OtherOwner(3)));
        c.release_claim(0, 3);
        assert_eq!(c.exclusive(0, 4), Err(ClaimError::OtherOwner(3)));
        assert_eq!(c.exclusive(0, 3), Ok(()));
        assert_eq!(c.shared(1), Ok(()));
        assert_eq!(c.shared(1), Ok(()));
        assert_eq!(c.exclusive(1, 0), Err(ClaimError::Shared));
        assert_eq!(c.shared(0), Err(ClaimError::OtherOwner(3)));
    }
}
