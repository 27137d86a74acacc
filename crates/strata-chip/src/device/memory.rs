//! Device memory: a per-chip arena with a first-fit allocator (1024-byte aligned blocks,
//! coalescing free list, committed-bytes accounting) and handles that carry a generation,
//! so every misuse — double free, stale handle, interior free, out-of-range copy, a handle
//! of another chip — is a typed error.

use crate::device::arena::Arena;
use crate::error::ChipError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use strata_types::{BufferIdentity, DataType, OwnerNonce, TensorView};

/// Alignment (and size granularity) of device allocations.
pub const DEVICE_ALIGN: u64 = 1024;
/// The first bytes of the arena are never handed out, so no buffer has address 0.
const GUARD: u64 = 64 * 1024;
/// Freed blocks at least this large give their pages back to the OS.
const DISCARD_MIN: u64 = 256 * 1024;

/// A pointer into this chip's device memory: an address (possibly inside an allocation),
/// the generation of the allocation it was derived from, and the chip that issued it.
///
/// Device addresses mean nothing on another chip or after the allocation is freed; every
/// use is checked against both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevicePtr {
    pub(crate) chip: u64,
    pub(crate) addr: u64,
    pub(crate) generation: u64,
}

impl DevicePtr {
    /// The device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The generation of the allocation this pointer belongs to (unique per allocation
    /// on its chip).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The nonce of the chip that issued it.
    pub fn chip(&self) -> u64 {
        self.chip
    }

    /// A pointer `bytes` further into the same allocation (checked when used).
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr {
            addr: self.addr.saturating_add(bytes),
            ..self
        }
    }
}

/// A tensor resident in device memory: an allocation plus a view of it. Passed to runs
/// in place (never copied back implicitly); free it with
/// [`crate::ChipWorker::free_tensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceTensor {
    pub(crate) ptr: DevicePtr,
    pub(crate) size: u64,
    pub(crate) view: TensorView,
    /// The worker id of the chip that holds it (its `ChipConfig::chip_id`; under a
    /// level-3 worker, the chip's next-level worker id).
    pub(crate) worker: u32,
}

impl DeviceTensor {
    /// A handle for memory a chip in another process allocated, issued by the engine that
    /// asked for it: `issuer` is that engine's nonce and `generation` unique among the
    /// handles it issues, so every later use can be checked against the engine's own
    /// table of live allocations (a handle it did not issue, or one whose allocation was
    /// freed, is refused there). Not for user code: a handle built from a raw address
    /// names nothing its engine knows of.
    ///
    /// # Safety
    /// `addr .. addr + size` must be a live allocation of chip `worker` that the issuing
    /// engine tracks under `(issuer, generation)`, and `view` must fit `size` bytes.
    #[doc(hidden)]
    pub unsafe fn from_raw_parts(
        issuer: u64,
        generation: u64,
        worker: u32,
        addr: u64,
        size: u64,
        view: TensorView,
    ) -> DeviceTensor {
        DeviceTensor {
            ptr: DevicePtr {
                chip: issuer,
                addr,
                generation,
            },
            size,
            view,
            worker,
        }
    }

    /// The worker id of the chip that holds it.
    pub fn worker(&self) -> u32 {
        self.worker
    }

    /// The whole tensor as a task argument of a level-3 orchestration (for a task on the
    /// chip that holds it).
    pub fn arg(&self, tag: strata_types::ArgTag) -> strata_types::TensorArg {
        strata_types::TensorArg {
            buffer: self.buffer(),
            view: self.view,
            tag,
        }
    }

    /// A view of the tensor as a task argument.
    ///
    /// # Errors
    /// [`ChipError::Types`] if the view does not fit the allocation.
    pub fn arg_view(
        &self,
        view: TensorView,
        tag: strata_types::ArgTag,
    ) -> Result<strata_types::TensorArg, ChipError> {
        Ok(strata_types::TensorArg::new(self.buffer(), view, tag)?)
    }

    /// Elements `start..end` of axis `axis`, to pass to a task with a tag
    /// ([`strata_types::TaskArgs`]' chaining methods record its error).
    ///
    /// # Errors
    /// As [`TensorView::slice`].
    pub fn slice(
        &self,
        axis: usize,
        start: u64,
        end: u64,
    ) -> Result<strata_types::BufferView, strata_types::TypesError> {
        strata_types::BufferView::new(self.buffer(), self.view)?.slice(axis, start, end)
    }

    /// The allocation's descriptor: its identity, size and place in device memory.
    fn buffer(&self) -> strata_types::BufferDesc {
        // SAFETY: the descriptor names exactly this allocation (its identity, size and
        // address on its chip); whoever receives it checks it against the live
        // allocations of the worker it is given to.
        unsafe {
            strata_types::BufferDesc::from_parts(
                self.identity(),
                self.size,
                strata_types::BufferLocation::Device {
                    worker: self.worker,
                    addr: self.ptr.addr,
                },
            )
        }
    }
    /// The allocation's base pointer.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The allocation size in bytes.
    pub fn nbytes(&self) -> u64 {
        self.size
    }

    /// The view of the allocation this tensor denotes.
    pub fn view(&self) -> &TensorView {
        &self.view
    }

    /// The data type.
    pub fn dtype(&self) -> DataType {
        self.view.dtype()
    }

    /// The shape.
    pub fn shape(&self) -> &[u64] {
        self.view.shape()
    }

    /// The same allocation seen through another view (checked to fit).
    ///
    /// # Errors
    /// [`ChipError::Types`] if the view does not fit the allocation.
    pub fn with_view(&self, view: TensorView) -> Result<DeviceTensor, ChipError> {
        view.check_fits(self.size)?;
        Ok(DeviceTensor { view, ..*self })
    }

    /// The dependency identity of the allocation (unique per allocation and issuer).
    pub fn identity(&self) -> BufferIdentity {
        identity_of(self.ptr.chip, self.ptr.generation)
    }
}

/// The whole tensor, for [`strata_types::TaskArgs`]' chaining methods.
impl strata_types::IntoTensorArg for &DeviceTensor {
    fn into_tensor_arg(
        self,
        tag: strata_types::ArgTag,
    ) -> Result<strata_types::TensorArg, strata_types::TypesError> {
        Ok(self.arg(tag))
    }
}

/// The dependency identity of allocation `generation` of chip `chip`.
pub(crate) fn identity_of(chip: u64, generation: u64) -> BufferIdentity {
    BufferIdentity::new(OwnerNonce(chip), generation, 1).expect("generation 1 is valid")
}

#[derive(Debug, Clone, Copy)]
struct Live {
    size: u64,
    generation: u64,
    quarantine: Quarantine,
}

/// Whether a kernel abandoned after its timeout may still touch an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quarantine {
    /// No abandoned kernel was given it.
    Clear,
    /// A run whose kernel was abandoned could reach it: copies and runs that name it are
    /// refused, and freeing it holds it, until the abandoned kernels have returned.
    Suspect,
    /// Freed (or given up by the runtime) while suspect: not handed out again until the
    /// abandoned kernels have returned. Still counted as committed.
    Held,
}

#[derive(Debug)]
struct Allocator {
    capacity: u64,
    /// Free blocks by address (coalesced: no two are adjacent).
    free: BTreeMap<u64, u64>,
    live: BTreeMap<u64, Live>,
    committed: u64,
    next_generation: u64,
    /// Allocations not [`Quarantine::Clear`], by base.
    quarantined: Vec<u64>,
}

impl Allocator {
    fn new(capacity: u64) -> Self {
        let mut free = BTreeMap::new();
        if capacity > GUARD {
            free.insert(GUARD, (capacity - GUARD) / DEVICE_ALIGN * DEVICE_ALIGN);
        }
        Allocator {
            capacity,
            free,
            live: BTreeMap::new(),
            committed: 0,
            next_generation: 1,
            quarantined: Vec::new(),
        }
    }

    fn largest_free(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }

    fn alloc(&mut self, bytes: u64) -> Result<(u64, u64, u64), ChipError> {
        if bytes == 0 {
            return Err(ChipError::ZeroSizedAlloc);
        }
        let size = bytes
            .checked_add(DEVICE_ALIGN - 1)
            .map(|b| b / DEVICE_ALIGN * DEVICE_ALIGN)
            .ok_or(ChipError::OutOfDeviceMemory {
                requested: bytes,
                committed: self.committed,
                capacity: self.capacity,
                largest_free: self.largest_free(),
            })?;
        let Some((&addr, &len)) = self.free.iter().find(|(_, &len)| len >= size) else {
            return Err(ChipError::OutOfDeviceMemory {
                requested: size,
                committed: self.committed,
                capacity: self.capacity,
                largest_free: self.largest_free(),
            });
        };
        self.free.remove(&addr);
        if len > size {
            self.free.insert(addr + size, len - size);
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        self.live.insert(
            addr,
            Live {
                size,
                generation,
                quarantine: Quarantine::Clear,
            },
        );
        self.committed += size;
        Ok((addr, size, generation))
    }

    /// The live allocation containing `ptr`, checked for generation: `(base, size)`.
    fn resolve(&self, ptr: &DevicePtr) -> Result<(u64, u64), ChipError> {
        match self.live.range(..=ptr.addr).next_back() {
            Some((&base, live))
                if ptr.addr < base + live.size && live.quarantine != Quarantine::Held =>
            {
                if live.generation != ptr.generation {
                    return Err(ChipError::StaleHandle {
                        addr: ptr.addr,
                        generation: ptr.generation,
                        current: live.generation,
                    });
                }
                Ok((base, live.size))
            }
            _ => Err(ChipError::DoubleFree {
                addr: ptr.addr,
                generation: ptr.generation,
            }),
        }
    }

    fn free(&mut self, ptr: &DevicePtr) -> Result<(u64, u64), ChipError> {
        let (base, size) = match self.resolve(ptr) {
            Ok(x) => x,
            Err(ChipError::DoubleFree { .. }) if ptr.generation >= self.next_generation => {
                return Err(ChipError::Internal(format!(
                    "device pointer {:#x} carries generation {} that this chip never issued",
                    ptr.addr, ptr.generation
                )))
            }
            Err(e) => return Err(e),
        };
        if base != ptr.addr {
            return Err(ChipError::InteriorFree {
                addr: ptr.addr,
                base,
                offset: ptr.addr - base,
            });
        }
        if let Some(l) = self.live.get_mut(&base) {
            if l.quarantine == Quarantine::Suspect {
                // An abandoned kernel may still write it: keep it out of the free list.
                l.quarantine = Quarantine::Held;
                return Ok((base, 0));
            }
        }
        self.release_block(base, size);
        Ok((base, size))
    }

    /// Returns the block at `base` to the free list (coalescing).
    fn release_block(&mut self, base: u64, size: u64) {
        self.live.remove(&base);
        self.committed -= size;
        let (mut start, mut len) = (base, size);
        if let Some((&prev, &plen)) = self.free.range(..start).next_back() {
            if prev + plen == start {
                self.free.remove(&prev);
                start = prev;
                len += plen;
            }
        }
        if let Some(&nlen) = self.free.get(&(base + size)) {
            self.free.remove(&(base + size));
            len += nlen;
        }
        self.free.insert(start, len);
    }

    /// Marks the live allocation at `base` as `q` (suspect or held).
    fn quarantine(&mut self, base: u64, q: Quarantine) {
        if let Some(l) = self.live.get_mut(&base) {
            if l.quarantine == Quarantine::Clear {
                self.quarantined.push(base);
            }
            if l.quarantine != Quarantine::Held {
                l.quarantine = q;
            }
        }
    }

    /// Ends every quarantine (no abandoned kernel lives any more): held blocks go back
    /// to the free list, suspects become ordinary allocations. Returns the blocks freed.
    fn end_quarantine(&mut self) -> Vec<(u64, u64)> {
        let mut freed = Vec::new();
        for base in std::mem::take(&mut self.quarantined) {
            let Some(l) = self.live.get_mut(&base) else {
                continue;
            };
            match l.quarantine {
                Quarantine::Held => {
                    let size = l.size;
                    self.release_block(base, size);
                    freed.push((base, size));
                }
                _ => l.quarantine = Quarantine::Clear,
            }
        }
        freed
    }

    fn held_bytes(&self) -> u64 {
        self.quarantined
            .iter()
            .filter_map(|b| self.live.get(b))
            .filter(|l| l.quarantine == Quarantine::Held)
            .map(|l| l.size)
            .sum()
    }

    /// Refuses an access to a suspect allocation.
    fn check_clear(&self, base: u64, what: &'static str) -> Result<(), ChipError> {
        match self.live.get(&base) {
            Some(l) if l.quarantine == Quarantine::Suspect => Err(ChipError::Quarantined {
                what,
                base,
                size: l.size,
            }),
            _ => Ok(()),
        }
    }
}

/// The device memory of one chip: the arena and its allocator.
#[derive(Debug)]
pub(crate) struct DeviceMemory {
    pub(crate) arena: Arc<Arena>,
    alloc: Mutex<Allocator>,
    pub(crate) chip: u64,
    /// Whether anything is quarantined (read without the lock by every device call).
    any_quarantine: AtomicBool,
}

impl DeviceMemory {
    pub(crate) fn new(
        bytes: u64,
        chip: u64,
        external: Option<crate::device::arena::ExternalMemory>,
    ) -> Result<Self, ChipError> {
        let arena = Arc::new(Arena::new(bytes, external)?);
        Ok(DeviceMemory {
            alloc: Mutex::new(Allocator::new(arena.len())),
            arena,
            chip,
            any_quarantine: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Allocator> {
        self.alloc.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn malloc(&self, bytes: u64) -> Result<(DevicePtr, u64), ChipError> {
        let (addr, size, generation) = self.lock().alloc(bytes)?;
        Ok((
            DevicePtr {
                chip: self.chip,
                addr,
                generation,
            },
            size,
        ))
    }

    fn check_chip(&self, ptr: &DevicePtr, what: &'static str) -> Result<(), ChipError> {
        if ptr.chip != self.chip {
            return Err(ChipError::ForeignHandle {
                what,
                handle_chip: ptr.chip,
                this_chip: self.chip,
            });
        }
        Ok(())
    }

    pub(crate) fn free(&self, ptr: &DevicePtr) -> Result<(), ChipError> {
        self.check_chip(ptr, "device pointer")?;
        let (base, size) = self.lock().free(ptr)?;
        if size >= DISCARD_MIN {
            self.arena.discard(base, size);
        }
        Ok(())
    }

    /// Quarantines every live allocation that intersects one of `ranges` (device bytes
    /// an abandoned kernel may still touch): those whose base is in `runtime_owned` (ring
    /// heaps, staging, which the runtime gives up) are held at once; the others (user
    /// allocations) become suspect — refused in copies and runs, held when freed.
    /// Returns the runtime-owned bases that were held.
    pub(crate) fn quarantine_ranges(
        &self,
        ranges: &[(u64, u64)],
        runtime_owned: &[u64],
    ) -> Vec<u64> {
        let mut a = self.lock();
        let mut hit = Vec::new();
        for &(start, end) in ranges {
            // Allocations are disjoint: the candidates start before `end`, and the first
            // one below `start` may reach into the range.
            let first = a
                .live
                .range(..=start)
                .next_back()
                .map_or(start, |(&b, _)| b);
            for (&base, l) in a.live.range(first..end) {
                if base + l.size > start && !hit.contains(&base) {
                    hit.push(base);
                }
            }
        }
        let mut held = Vec::new();
        for base in hit {
            if runtime_owned.contains(&base) {
                a.quarantine(base, Quarantine::Held);
                held.push(base);
            } else {
                a.quarantine(base, Quarantine::Suspect);
            }
            self.any_quarantine.store(true, Ordering::Relaxed);
        }
        held
    }

    /// Whether any allocation is quarantined.
    pub(crate) fn has_quarantine(&self) -> bool {
        self.any_quarantine.load(Ordering::Relaxed)
    }

    /// Ends every quarantine: call only once no abandoned kernel can still run.
    pub(crate) fn end_quarantine(&self) {
        let mut a = self.lock();
        let freed = a.end_quarantine();
        self.any_quarantine.store(false, Ordering::Relaxed);
        drop(a);
        for (base, size) in freed {
            if size >= DISCARD_MIN {
                self.arena.discard(base, size);
            }
        }
    }

    /// Bytes held in quarantine (freed, but not reusable yet).
    pub(crate) fn held_bytes(&self) -> u64 {
        self.lock().held_bytes()
    }

    /// Checks that `[ptr, ptr + len)` lies in one live allocation; returns its
    /// `(base, size)`.
    pub(crate) fn check_range(
        &self,
        ptr: &DevicePtr,
        len: u64,
        what: &'static str,
    ) -> Result<(u64, u64), ChipError> {
        self.check_chip(ptr, what)?;
        let a = self.lock();
        let (base, size) = a.resolve(ptr)?;
        a.check_clear(base, what)?;
        drop(a);
        match ptr.addr.checked_add(len) {
            Some(end) if end <= base + size => Ok((base, size)),
            _ => Err(ChipError::OutOfRange {
                addr: ptr.addr,
                len,
                base,
                size,
            }),
        }
    }

    /// Checks that `offset .. offset + len` bytes past `ptr` lie in `ptr`'s live
    /// allocation; returns the device address of the range. The allocation is found from
    /// `ptr` itself, so an offset at or past its end is [`ChipError::OutOfRange`] (not a
    /// lookup of whatever allocation happens to lie there).
    pub(crate) fn check_range_at(
        &self,
        ptr: &DevicePtr,
        offset: u64,
        len: u64,
        what: &'static str,
    ) -> Result<u64, ChipError> {
        self.check_chip(ptr, what)?;
        let a = self.lock();
        let (base, size) = a.resolve(ptr)?;
        a.check_clear(base, what)?;
        drop(a);
        let start = (ptr.addr - base).checked_add(offset);
        match start.and_then(|s| s.checked_add(len).map(|e| (s, e))) {
            Some((s, e)) if e <= size => Ok(base + s),
            _ => Err(ChipError::OutOfRange {
                addr: ptr.addr.saturating_add(offset),
                len,
                base,
                size,
            }),
        }
    }

    /// The live allocation starting at `addr`: its pointer (with its current generation)
    /// and size.
    pub(crate) fn allocation_at(&self, addr: u64) -> Result<(DevicePtr, u64), ChipError> {
        let a = self.lock();
        match a.live.get(&addr) {
            Some(l) if l.quarantine != Quarantine::Held => Ok((
                DevicePtr {
                    chip: self.chip,
                    addr,
                    generation: l.generation,
                },
                l.size,
            )),
            _ => Err(ChipError::DoubleFree {
                addr,
                generation: 0,
            }),
        }
    }

    pub(crate) fn committed(&self) -> u64 {
        self.lock().committed
    }

    /// The emulated card's free bytes (the sum of its free blocks: what allocations could
    /// still take, fragmentation aside) and its capacity.
    pub(crate) fn info(&self) -> (u64, u64) {
        let a = self.lock();
        (a.free.values().sum(), a.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_coalesces_and_detects_misuse() {
        let mut a = Allocator::new(GUARD + 16 * DEVICE_ALIGN);
        let (x, xs, xg) = a.alloc(1).unwrap();
        assert_eq!((x, xs), (GUARD, DEVICE_ALIGN));
        let (y, _, yg) = a.alloc(3000).unwrap();
        let (z, _, _) = a.alloc(1024).unwrap();
        assert_eq!(y, x + 1024);
        assert_eq!(z, y + 3072);
        assert_eq!(a.committed, 5 * 1024);
        let px = DevicePtr {
            chip: 1,
            addr: x,
            generation: xg,
        };
        a.free(&px).unwrap();
        assert!(matches!(a.free(&px), Err(ChipError::DoubleFree { .. })));
        let py = DevicePtr {
            chip: 1,
            addr: y + 8,
            generation: yg,
        };
        assert!(matches!(
            a.free(&py),
            Err(ChipError::InteriorFree { offset: 8, .. })
        ));
        a.free(&DevicePtr { addr: y, ..py }).unwrap();
        // x and y coalesced: a 4 KiB request fits at x.
        let (w, _, wg) = a.alloc(4096).unwrap();
        assert_eq!(w, x);
        assert!(
            matches!(a.resolve(&px), Err(ChipError::StaleHandle { current, .. }) if current == wg)
        );
        assert!(matches!(
            a.alloc(1 << 30),
            Err(ChipError::OutOfDeviceMemory { .. })
        ));
        assert!(matches!(a.alloc(0), Err(ChipError::ZeroSizedAlloc)));
    }
}
