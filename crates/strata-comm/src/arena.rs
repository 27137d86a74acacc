//! [`CommArena`]: the one shared arena per L3 worker, as one process sees it, and its
//! byte map ([`layout`]).

use crate::error::CommError;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use strata_sync::WakeCounter;

/// The arena's byte map (see `docs/comm.md`). Offsets are from the arena base; only
/// offsets are meaningful across processes.
pub mod layout {
    /// Most ranks a world (and a domain) may have (one wake counter each).
    pub const MAX_RANKS: usize = crate::MAX_RANKS;
    /// `b"STRATACM"` read as a little-endian u64, at offset 0.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"STRATACM");
    /// Layout version, a u32 at offset 8 (2: window buffers carry a signal area).
    pub const VERSION: u32 = 2;
    /// Offset of `version: u32`.
    pub const VERSION_OFFSET: usize = 8;
    /// Offset of `world_size: u32`.
    pub const WORLD_SIZE_OFFSET: usize = 12;
    /// Offset of `arena_len: u64`.
    pub const ARENA_LEN_OFFSET: usize = 16;
    /// Offset of `dirty_end: u64` — the allocator's high-water mark: data bytes at or above
    /// it were never handed out (still zero), so a later allocator over the same arena knows
    /// what to clear.
    pub const DIRTY_END_OFFSET: usize = 24;
    /// Offset of `next_generation: u32` — the allocator's next generation, so generations
    /// stay unique across allocators of one arena.
    pub const NEXT_GENERATION_OFFSET: usize = 32;
    /// Offset of `table_high: u32` — one past the highest domain-table slot ever written
    /// (a kernel finding the buffer of an address scans the slots below it).
    pub const TABLE_HIGH_OFFSET: usize = 36;
    /// The header: `[0, 8 KiB)`.
    pub const HEADER_BYTES: usize = 8 << 10;
    /// Offset of world rank 0's wake counter (`value: u32`, `waiters: u32`); one per 64-byte
    /// line.
    pub const WAKE_OFFSET: usize = 64;
    /// Distance between two wake counters.
    pub const WAKE_STRIDE: usize = 64;
    /// Offset of the domain table.
    pub const TABLE_OFFSET: usize = HEADER_BYTES;
    /// Slots of the domain table (each describes one live window buffer).
    pub const TABLE_SLOTS: usize = 256;
    /// Bytes per table slot.
    pub const SLOT_BYTES: usize = 256;
    /// Slot field: `generation: u32` (0 = free; published last, with release).
    pub const SLOT_GENERATION: usize = 0;
    /// Slot field: `nranks: u32`.
    pub const SLOT_NRANKS: usize = 4;
    /// Slot field: `window_bytes: u64` — bytes per rank (a multiple of 64).
    pub const SLOT_WINDOW_BYTES: usize = 8;
    /// Slot field: `base: u64` — arena offset of domain rank 0's slice.
    pub const SLOT_BASE: usize = 16;
    /// Slot field: `domain_id: u32` — the allocator's domain slot (same for every buffer of
    /// one domain).
    pub const SLOT_DOMAIN_ID: usize = 24;
    /// Slot field: `domain_generation: u32`.
    pub const SLOT_DOMAIN_GENERATION: usize = 28;
    /// Slot field: `members: [u8; 64]` — world rank of each domain rank, in domain-rank
    /// order.
    pub const SLOT_MEMBERS: usize = 32;
    /// Slot field: `data_bytes: u64` — the bytes of each rank's window that windows may
    /// view (the request rounded up to 64); the buffer's signal area follows at the next
    /// multiple of 128, up to `window_bytes`.
    pub const SLOT_DATA_BYTES: usize = 96;
    /// Offset of the window data region: `TABLE_OFFSET + TABLE_SLOTS * SLOT_BYTES` = 72 KiB.
    pub const DATA_OFFSET: usize = TABLE_OFFSET + TABLE_SLOTS * SLOT_BYTES;
    /// Alignment of every window buffer's base (and of the data region's end).
    pub const DATA_ALIGN: u64 = 4096;
    /// Alignment (and rounding) of the per-rank window size.
    pub const RANK_ALIGN: u64 = 64;
    /// The smallest arena: header, table and one page of data.
    pub const MIN_ARENA_BYTES: usize = DATA_OFFSET + DATA_ALIGN as usize;

    const _: () = assert!(WAKE_OFFSET + MAX_RANKS * WAKE_STRIDE <= HEADER_BYTES);
    const _: () = assert!(SLOT_MEMBERS + MAX_RANKS <= SLOT_DATA_BYTES);
    const _: () = assert!(SLOT_DATA_BYTES + 8 <= SLOT_BYTES);
    const _: () = assert!(DATA_OFFSET == 72 << 10);
}

use layout::*;

/// The comm arena as one process sees it: a base pointer and a length over a `MAP_SHARED`
/// mapping that every rank process maps (at its own address). `Send + Sync`.
///
/// The parent creates it (a memfd, or [`CommArena::anonymous`]) and writes the header with
/// [`CommArena::init`] before forking; children wrap their mapping with
/// [`CommArena::from_raw`].
///
/// ```
/// use strata_comm::CommArena;
/// let arena = CommArena::anonymous(1 << 20, 4)?;
/// assert_eq!(arena.world_size(), 4);
/// // A second view of the same memory (as a forked child would make):
/// // SAFETY: the mapping outlives `view` (it is dropped first).
/// let view = unsafe { CommArena::from_raw(arena.base_ptr(), arena.len())? };
/// assert_eq!(view.world_size(), 4);
/// # drop(view);
/// # Ok::<(), strata_comm::CommError>(())
/// ```
pub struct CommArena {
    base: NonNull<u8>,
    len: usize,
    world_size: u32,
    /// Unmap on drop (the arena made the mapping itself).
    owned: bool,
}

// SAFETY: the arena is a plain description of shared memory; every access to the memory
// goes through atomics or through copies whose ordering the signal protocol establishes
// (the same contract as memory shared with another process).
unsafe impl Send for CommArena {}
// SAFETY: as above; `&CommArena` only hands out atomics and raw addresses.
unsafe impl Sync for CommArena {}

impl std::fmt::Debug for CommArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommArena")
            .field("base", &self.base)
            .field("len", &self.len)
            .field("world_size", &self.world_size)
            .finish()
    }
}

fn bad(reason: impl Into<String>) -> CommError {
    CommError::BadArena {
        reason: reason.into(),
    }
}

fn check_geometry(base: *mut u8, len: usize) -> Result<NonNull<u8>, CommError> {
    let base = NonNull::new(base).ok_or_else(|| bad("the base pointer is null"))?;
    if base.as_ptr() as usize % 4096 != 0 {
        return Err(bad(format!(
            "the base {:p} is not page-aligned; map the arena with mmap",
            base.as_ptr()
        )));
    }
    if len < MIN_ARENA_BYTES {
        return Err(bad(format!(
            "{len} bytes is too small: the header and domain table take {DATA_OFFSET} bytes and windows need at least one more page ({MIN_ARENA_BYTES} in all)"
        )));
    }
    Ok(base)
}

impl CommArena {
    /// Wraps an arena that [`CommArena::init`] (in this or a parent process) initialised.
    ///
    /// # Errors
    /// [`CommError::BadArena`] if the geometry is invalid, the magic or version differ (the
    /// memory was never initialised, or by another layout), or the header's length differs
    /// from `len`.
    ///
    /// # Safety
    /// `base..base + len` is a `MAP_SHARED` mapping, valid (mapped, readable and writable)
    /// for the whole lifetime of the returned arena and of everything borrowed from it, and
    /// page-aligned.
    pub unsafe fn from_raw(base: *mut u8, len: usize) -> Result<CommArena, CommError> {
        let base = check_geometry(base, len)?;
        let arena = CommArena {
            base,
            len,
            world_size: 0,
            owned: false,
        };
        let magic = arena.u64_at(0).load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(bad(format!(
                "magic {magic:#018x} is not \"STRATACM\": the memory was not initialised with CommArena::init"
            )));
        }
        let version = arena.u32_at(VERSION_OFFSET).load(Ordering::Relaxed);
        if version != VERSION {
            return Err(bad(format!(
                "layout version {version}, this build reads version {VERSION}: parent and children must be the same build"
            )));
        }
        let world = arena.u32_at(WORLD_SIZE_OFFSET).load(Ordering::Relaxed);
        if world == 0 || world as usize > MAX_RANKS {
            return Err(bad(format!(
                "world size {world} in the header is outside 1..={MAX_RANKS}"
            )));
        }
        let hlen = arena.u64_at(ARENA_LEN_OFFSET).load(Ordering::Relaxed);
        if hlen != len as u64 {
            return Err(bad(format!(
                "the header says the arena has {hlen} bytes but {len} were given: map the whole arena"
            )));
        }
        Ok(CommArena {
            world_size: world,
            ..arena
        })
    }

    /// Writes the header (magic, version, world size, length, zeroed wake counters) and
    /// clears the domain table. The parent does this once, before forking its rank children.
    ///
    /// # Errors
    /// [`CommError::BadArena`] for a null or misaligned base, a `len` below
    /// [`layout::MIN_ARENA_BYTES`], or a world size outside `1..=64`.
    ///
    /// # Safety
    /// As [`CommArena::from_raw`]; in addition no other process or thread uses the arena
    /// yet, and the window data region (`[72 KiB, len)`) is zero-filled — as a fresh memfd
    /// or anonymous mapping is — because the allocator hands out never-used bytes without
    /// clearing them.
    pub unsafe fn init(base: *mut u8, len: usize, world_size: u32) -> Result<CommArena, CommError> {
        let base = check_geometry(base, len)?;
        if world_size == 0 || world_size as usize > MAX_RANKS {
            return Err(bad(format!(
                "world size {world_size} is outside 1..={MAX_RANKS}"
            )));
        }
        // SAFETY: the caller guarantees `base..base+len` is a valid writable mapping that
        // nobody else uses yet; `DATA_OFFSET <= len` was checked.
        unsafe { std::ptr::write_bytes(base.as_ptr(), 0, DATA_OFFSET) };
        let arena = CommArena {
            base,
            len,
            world_size,
            owned: false,
        };
        arena
            .u32_at(VERSION_OFFSET)
            .store(VERSION, Ordering::Relaxed);
        arena
            .u32_at(WORLD_SIZE_OFFSET)
            .store(world_size, Ordering::Relaxed);
        arena
            .u64_at(ARENA_LEN_OFFSET)
            .store(len as u64, Ordering::Relaxed);
        arena.u64_at(0).store(MAGIC, Ordering::Release);
        Ok(arena)
    }

    /// Maps a fresh anonymous `MAP_SHARED` region of `len` bytes (rounded up to a page) and
    /// initialises it. The mapping is shared with threads and inherited by children forked
    /// afterwards; it is unmapped when this arena is dropped. Pages are committed only when
    /// touched (`MAP_NORESERVE`).
    ///
    /// # Errors
    /// [`CommError::Os`] if `mmap` fails; as [`CommArena::init`].
    pub fn anonymous(len: usize, world_size: u32) -> Result<CommArena, CommError> {
        let len = len.max(MIN_ARENA_BYTES).div_ceil(4096) * 4096;
        // SAFETY: an anonymous mapping with no address hint has no preconditions.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CommError::Os {
                op: "mmap(MAP_SHARED | MAP_ANONYMOUS)",
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `p..p+len` is the fresh (zero-filled), page-aligned shared mapping just
        // made; it lives until this arena unmaps it in `drop`.
        match unsafe { CommArena::init(p.cast(), len, world_size) } {
            Ok(mut a) => {
                a.owned = true;
                Ok(a)
            }
            Err(e) => {
                // SAFETY: unmapping the mapping made above, which nothing references.
                unsafe { libc::munmap(p, len) };
                Err(e)
            }
        }
    }

    /// Ranks in the world (fixed when the arena was initialised).
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// Bytes of the arena.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: an arena has at least [`layout::MIN_ARENA_BYTES`].
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The arena's base address in this process.
    pub fn base_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Bytes of the window data region (`len - 72 KiB`, rounded down to 4 KiB).
    pub fn data_capacity(&self) -> u64 {
        ((self.len - DATA_OFFSET) as u64) / DATA_ALIGN * DATA_ALIGN
    }

    /// The address of byte `off`.
    ///
    /// Callers keep `off` within the arena (checked in debug builds).
    #[inline(always)]
    pub(crate) fn ptr(&self, off: u64) -> *mut u8 {
        debug_assert!(off as usize <= self.len);
        // SAFETY: `off <= len` (callers validate offsets against the arena length), so the
        // result is within (or one past) the mapping.
        unsafe { self.base.as_ptr().add(off as usize) }
    }

    #[inline(always)]
    pub(crate) fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off % 4 == 0 && off + 4 <= self.len);
        // SAFETY: `off` is 4-aligned and inside the mapping, which lives as long as `self`;
        // shared memory is only accessed through atomics or protocol-ordered copies.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU32) }
    }

    #[inline(always)]
    pub(crate) fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: as `u32_at`, 8-aligned.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU64) }
    }

    /// The allocator's persistent bookkeeping in the header: `(dirty_end, next_generation)`.
    pub(crate) fn alloc_marks(&self) -> (u64, u32) {
        (
            self.u64_at(DIRTY_END_OFFSET).load(Ordering::Relaxed),
            self.u32_at(NEXT_GENERATION_OFFSET).load(Ordering::Relaxed),
        )
    }

    pub(crate) fn set_alloc_marks(&self, dirty_end: u64, next_generation: u32) {
        self.u64_at(DIRTY_END_OFFSET)
            .store(dirty_end, Ordering::Relaxed);
        self.u32_at(NEXT_GENERATION_OFFSET)
            .store(next_generation, Ordering::Relaxed);
    }

    /// World rank `rank`'s wake counter (`rank < 64`).
    #[inline(always)]
    pub(crate) fn wake(&self, rank: u32) -> WakeCounter<'_> {
        let off = WAKE_OFFSET + (rank as usize % MAX_RANKS) * WAKE_STRIDE;
        WakeCounter::new(self.u32_at(off), self.u32_at(off + 4))
    }

    /// Reads table slot `slot` if it holds generation `generation` (seqlock-style: the
    /// generation is read before and after the fields).
    pub(crate) fn read_slot(&self, slot: u32, generation: u32) -> Result<SlotInfo, CommError> {
        if slot as usize >= TABLE_SLOTS {
            return Err(CommError::BadTensor {
                reason: format!("table slot {slot} is outside 0..{TABLE_SLOTS}"),
            });
        }
        let at = TABLE_OFFSET + slot as usize * SLOT_BYTES;
        let g = self.u32_at(at + SLOT_GENERATION);
        let current = g.load(Ordering::Acquire);
        if current == 0 || current != generation {
            return Err(CommError::StaleTensor {
                slot,
                generation,
                current,
            });
        }
        let nranks = self.u32_at(at + SLOT_NRANKS).load(Ordering::Relaxed);
        let window_bytes = self.u64_at(at + SLOT_WINDOW_BYTES).load(Ordering::Relaxed);
        let base = self.u64_at(at + SLOT_BASE).load(Ordering::Relaxed);
        let domain_id = self.u32_at(at + SLOT_DOMAIN_ID).load(Ordering::Relaxed);
        let domain_generation = self
            .u32_at(at + SLOT_DOMAIN_GENERATION)
            .load(Ordering::Relaxed);
        let mut members = [0u8; MAX_RANKS];
        for (i, chunk) in members.chunks_mut(8).enumerate() {
            let w = self
                .u64_at(at + SLOT_MEMBERS + i * 8)
                .load(Ordering::Relaxed);
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        let data_bytes = self.u64_at(at + SLOT_DATA_BYTES).load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let again = g.load(Ordering::Relaxed);
        if again != current {
            return Err(CommError::StaleTensor {
                slot,
                generation,
                current: again,
            });
        }
        // Defensive: a slot is written by our own allocator, but the memory is shared.
        let end = (nranks as u64)
            .checked_mul(window_bytes)
            .and_then(|b| b.checked_add(base));
        if nranks == 0
            || nranks as usize > MAX_RANKS
            || window_bytes % RANK_ALIGN != 0
            || data_bytes % RANK_ALIGN != 0
            || crate::collective::signal_offset(data_bytes)
                .checked_add(crate::collective::signal_area_bytes(nranks))
                .is_none_or(|b| b > window_bytes)
            || base < DATA_OFFSET as u64
            || end.is_none_or(|e| e > self.len as u64)
            || members[..nranks as usize]
                .iter()
                .any(|&m| u32::from(m) >= self.world_size)
        {
            return Err(bad(format!(
                "domain table slot {slot} is corrupt (nranks {nranks}, window_bytes {window_bytes}, data_bytes {data_bytes}, base {base})"
            )));
        }
        Ok(SlotInfo {
            nranks,
            window_bytes,
            data_bytes,
            base,
            domain: (domain_id, domain_generation),
            members,
        })
    }

    /// Publishes table slot `slot` (the parent's allocator; the slot is free).
    pub(crate) fn write_slot(&self, slot: u32, generation: u32, info: &SlotInfo) {
        let at = TABLE_OFFSET + slot as usize * SLOT_BYTES;
        self.u32_at(at + SLOT_NRANKS)
            .store(info.nranks, Ordering::Relaxed);
        self.u64_at(at + SLOT_WINDOW_BYTES)
            .store(info.window_bytes, Ordering::Relaxed);
        self.u64_at(at + SLOT_BASE)
            .store(info.base, Ordering::Relaxed);
        self.u32_at(at + SLOT_DOMAIN_ID)
            .store(info.domain.0, Ordering::Relaxed);
        self.u32_at(at + SLOT_DOMAIN_GENERATION)
            .store(info.domain.1, Ordering::Relaxed);
        for (i, chunk) in info.members.chunks(8).enumerate() {
            let w = u64::from_le_bytes(chunk.try_into().expect("8-byte chunk"));
            self.u64_at(at + SLOT_MEMBERS + i * 8)
                .store(w, Ordering::Relaxed);
        }
        self.u64_at(at + SLOT_DATA_BYTES)
            .store(info.data_bytes, Ordering::Relaxed);
        self.u32_at(TABLE_HIGH_OFFSET)
            .fetch_max(slot + 1, Ordering::Relaxed);
        self.u32_at(at + SLOT_GENERATION)
            .store(generation, Ordering::Release);
    }

    /// The live window buffer whose ranks' copies contain arena offset `off`: its table
    /// slot, generation and fields (a kernel finding the window of a tensor argument by
    /// its address). Scans the slots ever written; a slot changing under the scan is read
    /// again at most once more.
    pub(crate) fn find_slot(&self, off: u64) -> Option<(u32, u32, SlotInfo)> {
        let high =
            (self.u32_at(TABLE_HIGH_OFFSET).load(Ordering::Acquire) as usize).min(TABLE_SLOTS);
        for slot in 0..high as u32 {
            let at = TABLE_OFFSET + slot as usize * SLOT_BYTES;
            let generation = self.u32_at(at + SLOT_GENERATION).load(Ordering::Acquire);
            if generation == 0 {
                continue;
            }
            let Ok(info) = self.read_slot(slot, generation) else {
                continue;
            };
            let end = info.base + u64::from(info.nranks) * info.window_bytes;
            if (info.base..end).contains(&off) {
                return Some((slot, generation, info));
            }
        }
        None
    }

    /// Frees table slot `slot` (generation 0), before its memory is reused.
    pub(crate) fn clear_slot(&self, slot: u32) {
        let at = TABLE_OFFSET + slot as usize * SLOT_BYTES;
        self.u32_at(at + SLOT_GENERATION)
            .store(0, Ordering::Release);
        fence(Ordering::Release);
    }
}

impl Drop for CommArena {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: the arena made this mapping in `anonymous` and is its last user
            // (everything that borrows from the arena borrows from `self`).
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        }
    }
}

/// One domain-table slot: a window buffer of a domain.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotInfo {
    pub(crate) nranks: u32,
    pub(crate) window_bytes: u64,
    pub(crate) data_bytes: u64,
    pub(crate) base: u64,
    pub(crate) domain: (u32, u32),
    pub(crate) members: [u8; MAX_RANKS],
}
