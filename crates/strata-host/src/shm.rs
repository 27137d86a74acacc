//! Shared memory the whole worker tree sees: memfd-backed `MAP_SHARED` regions created
//! before the children start.

use crate::error::HostError;
use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use std::ffi::CString;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use strata_types::BufferIdentity;

/// One `MAP_SHARED` mapping of a fresh memfd, its size sealed (`F_SEAL_SHRINK |
/// F_SEAL_GROW | F_SEAL_SEAL`). The descriptor is closed right after mapping (the
/// mapping keeps the object alive), so regions cost no file descriptors, no child
/// inherits a descriptor to `ftruncate`, and nothing ever appears in `/dev/shm`. Pages
/// are committed lazily, on first touch.
#[derive(Debug)]
pub(crate) struct Mapping {
    map: Backing,
}

/// What a region's bytes are: a memfd mapping of the runtime's own, or memory the caller
/// mapped `MAP_SHARED` and handed over ([`SharedMemory::adopt_region`]), which the
/// runtime neither unmaps nor discards.
#[derive(Debug)]
enum Backing {
    Owned(MmapRaw),
    Adopted { ptr: *mut u8 },
}

// SAFETY: an adopted mapping is a plain address range; `adopt_region`'s contract keeps it
// mapped while the region is reachable, and every access through it is as (un)synchronised
// as through an owned mapping (the callers of `SharedMemory::ptr` take care).
unsafe impl Send for Backing {}
// SAFETY: as above; the type holds no interior state of its own.
unsafe impl Sync for Backing {}

impl Mapping {
    /// A zeroed mapping of `len > 0` bytes; `label` names the memfd
    /// (`/memfd:strata-<label>` in `/proc/<pid>/maps`).
    pub(crate) fn new(len: usize, label: &str) -> std::io::Result<Mapping> {
        let clean: String = label
            .chars()
            .map(|c| if c == '\0' || c == '/' { '_' } else { c })
            .take(200)
            .collect();
        let name = CString::new(format!("strata-{clean}"))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let fd = memfd_create(
            name.as_c_str(),
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .map_err(std::io::Error::from)?;
        let file = File::from(fd);
        file.set_len(len as u64)?;
        // A region never changes size, so its size is sealed: even a process that gets
        // hold of the memfd (it is closed below, but /proc/<pid>/map_files reaches it with
        // privileges) cannot truncate the pages out from under the tree's mappings.
        strata_mailbox::seal_size(&file)?;
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        Ok(Mapping {
            map: Backing::Owned(map),
        })
    }

    /// The first byte (page-aligned for the runtime's own mappings).
    pub(crate) fn ptr(&self) -> *mut u8 {
        match &self.map {
            Backing::Owned(m) => m.as_mut_ptr(),
            Backing::Adopted { ptr } => *ptr,
        }
    }

    /// Gives the pages back to the kernel; the mapping stays and reads as zeros. Memory
    /// the caller handed over is the caller's: left as it is.
    fn discard_pages(&self) {
        if let Backing::Owned(m) = &self.map {
            // SAFETY: the range is exactly this mapping. MADV_REMOVE frees the memfd's
            // backing pages (later accesses see fresh zero pages), so nothing dangles;
            // callers only discard regions no task uses any more.
            unsafe {
                libc::madvise(m.as_mut_ptr().cast(), m.len(), libc::MADV_REMOVE);
            }
        }
    }
}

/// Whether every byte of `[start, start + len)` lies in `MAP_SHARED` mappings of this
/// process (`/proc/self/maps`: a `s` in the permissions column): `Err` says what is not.
fn check_map_shared(start: usize, len: usize) -> Result<(), String> {
    let end = start
        .checked_add(len)
        .ok_or_else(|| format!("{start:#x} + {len} overflows the address space"))?;
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("cannot read /proc/self/maps: {e}"))?;
    let mut covered = start;
    for line in maps.lines() {
        let mut cols = line.split_whitespace();
        let (Some(range), Some(perms)) = (cols.next(), cols.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if hi <= covered || lo > covered {
            continue;
        }
        if !perms.contains('s') {
            return Err(format!(
                "bytes from {covered:#x} lie in a private mapping ({perms} {range}); a child forked later would see a copy-on-write snapshot, not this memory: map it MAP_SHARED (a shared file mapping) or use a SharedTensor"
            ));
        }
        covered = hi;
        if covered >= end {
            return Ok(());
        }
    }
    Err(format!(
        "bytes from {covered:#x} to {end:#x} are not mapped in this process"
    ))
}

/// In use.
const LIVE: u8 = 0;
/// Returned by a [`RegionLease`]: pages discarded, ready to be leased again.
const POOLED: u8 = 1;
/// Released by its owner for good (a dropped [`crate::SharedTensor`]): pages discarded.
const RELEASED: u8 = 2;
/// Released by its owner while tasks that name it were in flight: new tasks are refused,
/// the pages stay until the last of those tasks ends (then [`RELEASED`]).
const DRAINING: u8 = 3;
/// Quarantined ([`SharedMemory::quarantine`]): a writer that can no longer be stopped (a
/// detached thread child) may still touch it, so it is never pooled, discarded or reused.
const QUARANTINED: u8 = 4;

/// One task in flight names the region (low half of [`Region::uses`]).
const TASK_USE: u64 = 1;
/// One host-side access is copying the region (high half of [`Region::uses`]).
const HOST_USE: u64 = 1 << 32;

fn task_uses(word: u64) -> u32 {
    (word & 0xffff_ffff) as u32
}

#[derive(Debug)]
struct Region {
    map: Mapping,
    len: usize,
    label: String,
    state: AtomicU8,
    /// Tasks in flight that name the region (low 32 bits) and host-side copies running
    /// now (high 32 bits); the two exclude each other (see [`SharedMemory::acquire_task_use`]).
    uses: AtomicU64,
    /// The identity of the [`crate::SharedTensor`] that owns the region, if one does.
    tensor: OnceLock<BufferIdentity>,
    /// Adopted read-only ([`SharedMemory::adopt_region`]): no copy may write it.
    read_only: bool,
    /// The process that created it. Only that process discards its pages or reuses it:
    /// the memfd is shared with every forked descendant, and a child dropping its copy of
    /// a tensor or worker must not pull the memory out from under its parent.
    creator: u32,
}

impl Region {
    fn ours(&self) -> bool {
        self.creator == std::process::id()
    }
}

/// Regions per directory chunk; the directory has [`CHUNKS`] chunks.
const CHUNK: usize = 1024;
/// Directory chunks (so at most `CHUNK * CHUNKS` = 65 536 regions per table).
const CHUNKS: usize = 64;

/// Shared memory every process of a worker tree can see.
///
/// [`SharedMemory::create_region`] maps a fresh memfd `MAP_SHARED` (zeroed, lazily
/// committed) and appends it to an append-only table. Children forked after a region was
/// created inherit its mapping at the same address; thread children share every region. A
/// region is named by a small integer id (1, 2, …, in creation order), which is what
/// `BufferLocation::HostShared { region, .. }` carries. Regions created after a child was
/// forked are not mapped in that child: the engine checks visibility before it sends one.
/// Nothing is ever written to `/dev/shm`, so nothing can leak when a process is killed.
/// A region's memory goes back to the kernel when its owner releases it
/// ([`SharedMemory::release_region`], which a dropped [`crate::SharedTensor`] calls) or
/// returns its [`RegionLease`]; leased regions are reused by later leases of the same size
/// (a worker's heap rings, re-created by every `init`), so repeated init/close cycles do
/// not grow the table. The table itself (ids and address space) only grows.
///
/// Lookups ([`SharedMemory::ptr`]) are lock-free. [`SharedMemory::freeze`] optionally
/// closes the table.
///
/// ```
/// use strata_host::SharedMemory;
/// let mem = SharedMemory::new();
/// let r = mem.create_region(4096, "scratch")?;
/// assert_eq!(mem.region_len(r), Some(4096));
/// let p = mem.ptr(r, 4000, 96)?;          // bounds-checked
/// assert!(mem.ptr(r, 4000, 97).is_err());
/// // SAFETY: p points at 96 bytes of the region, which nobody else uses here.
/// unsafe { p.write(7) };
/// mem.freeze();
/// assert!(mem.create_region(64, "late").is_err()); // "allocate shared tensors before init()"
/// # Ok::<(), strata_host::HostError>(())
/// ```
#[derive(Debug)]
pub struct SharedMemory {
    frozen: AtomicBool,
    /// Serialises creators; readers never take it.
    create: Mutex<()>,
    count: AtomicUsize,
    chunks: Box<[OnceLock<Chunk>]>,
    /// Returned leases, ready for reuse.
    pool: Mutex<Vec<u64>>,
    /// Regions adopted from the caller's own mappings ([`SharedMemory::adopt_region`]).
    adopted: Mutex<Vec<u64>>,
}

/// A fixed block of region slots, each written once; chunks are allocated on demand so
/// readers index the table without a lock.
type Chunk = Box<[OnceLock<Arc<Region>>]>;

impl Default for SharedMemory {
    fn default() -> Self {
        SharedMemory {
            frozen: AtomicBool::new(false),
            create: Mutex::new(()),
            count: AtomicUsize::new(0),
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
            pool: Mutex::new(Vec::new()),
            adopted: Mutex::new(Vec::new()),
        }
    }
}

impl SharedMemory {
    /// An empty table of regions.
    pub fn new() -> Arc<SharedMemory> {
        Arc::new(SharedMemory::default())
    }

    /// The table every worker of this process shares. Region ids are only meaningful
    /// within one table, and a tensor may be handed from one worker to another (a level-4
    /// worker's tensor to its level-3 children, a level-2 run's output to a level-3 run),
    /// so workers use this one rather than tables of their own.
    ///
    /// ```
    /// # use strata_host::SharedMemory;
    /// assert!(std::sync::Arc::ptr_eq(SharedMemory::process(), SharedMemory::process()));
    /// ```
    pub fn process() -> &'static Arc<SharedMemory> {
        static PROCESS: std::sync::OnceLock<Arc<SharedMemory>> = std::sync::OnceLock::new();
        PROCESS.get_or_init(SharedMemory::new)
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        // The guarded data is `()`: a poisoned lock is still usable.
        self.create.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates a region of `bytes` zeroed bytes and returns its id.
    ///
    /// # Errors
    /// [`HostError::SharedMemoryFrozen`] after [`SharedMemory::freeze`] ("allocate shared
    /// tensors before init()"); [`HostError::EmptyRegion`] for 0 bytes;
    /// [`HostError::RegionCreate`] if the OS refuses or the table is full.
    pub fn create_region(&self, bytes: usize, label: &str) -> Result<u64, HostError> {
        let frozen = || HostError::SharedMemoryFrozen {
            label: label.to_owned(),
            bytes,
        };
        if self.is_frozen() {
            return Err(frozen());
        }
        if bytes == 0 {
            return Err(HostError::EmptyRegion {
                label: label.to_owned(),
            });
        }
        let map = Mapping::new(bytes, label).map_err(|source| HostError::RegionCreate {
            label: label.to_owned(),
            bytes,
            source,
        })?;
        let _guard = self.lock();
        // Re-check under the lock: `freeze` takes the same lock.
        if self.is_frozen() {
            return Err(frozen());
        }
        let i = self.count.load(Ordering::Relaxed);
        if i >= CHUNK * CHUNKS {
            return Err(HostError::RegionCreate {
                label: label.to_owned(),
                bytes,
                source: std::io::Error::other(format!(
                    "the shared-memory table is full ({} regions); allocate fewer, larger shared tensors",
                    CHUNK * CHUNKS
                )),
            });
        }
        let chunk =
            self.chunks[i / CHUNK].get_or_init(|| (0..CHUNK).map(|_| OnceLock::new()).collect());
        let _ = chunk[i % CHUNK].set(Arc::new(Region {
            map,
            len: bytes,
            label: label.to_owned(),
            state: AtomicU8::new(LIVE),
            uses: AtomicU64::new(0),
            tensor: OnceLock::new(),
            read_only: false,
            creator: std::process::id(),
        }));
        // Publish the slot only once it is filled.
        self.count.store(i + 1, Ordering::Release);
        Ok(i as u64 + 1)
    }

    /// Adopts `len` bytes at `ptr`, memory this process mapped `MAP_SHARED` itself (a
    /// shared file mapping, say), as a region: children forked afterwards inherit the
    /// mapping at the same address, so the engine can read or write it in place — no
    /// staging copy. The runtime never unmaps it or discards its pages; a `read_only`
    /// region refuses every write the engine would make into it
    /// ([`SharedMemory::is_read_only`]). Returns the region's id.
    ///
    /// ```
    /// use strata_host::SharedMemory;
    /// let mem = SharedMemory::new();
    /// // A shared file mapping (MAP_SHARED).
    /// let path = std::env::temp_dir().join(format!("adopt-doc-{}", std::process::id()));
    /// let file = std::fs::OpenOptions::new().read(true).write(true).create(true).open(&path)?;
    /// std::fs::remove_file(&path)?;
    /// file.set_len(8192)?;
    /// // SAFETY: nobody else maps or truncates the (unlinked) file.
    /// let mut shared = unsafe { memmap2::MmapMut::map_mut(&file)? };
    /// shared[..4].copy_from_slice(&[1, 2, 3, 4]);
    /// // A private (copy-on-write) mapping is refused.
    /// let mut private = memmap2::MmapOptions::new().len(4096).map_anon()?;
    /// // SAFETY: the mapping is not adopted (the call fails).
    /// assert!(unsafe { mem.adopt_region(private.as_mut_ptr(), 4096, "private", false) }.is_err());
    /// // SAFETY: `shared` stays mapped until the region is released below.
    /// let r = unsafe { mem.adopt_region(shared.as_mut_ptr(), 8192, "weights", true)? };
    /// assert!(mem.is_read_only(r));
    /// // SAFETY: nothing writes the first 4 bytes meanwhile.
    /// let first = unsafe { std::slice::from_raw_parts(mem.ptr(r, 0, 4)?, 4) };
    /// assert_eq!(first, &[1, 2, 3, 4]);
    /// assert_eq!(mem.region_containing(shared.as_ptr() as usize + 100, 8), Some((r, 100)));
    /// mem.release_region(r)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must stay mapped (and not be remapped) until the region is
    /// released ([`SharedMemory::release_region`]) and no task that names it is in flight
    /// any more ([`SharedMemory::task_uses`] is 0).
    ///
    /// # Errors
    /// [`HostError::NotShared`] if any byte of the range is not in a `MAP_SHARED` mapping
    /// of this process (a private or copy-on-write mapping would be a frozen snapshot in
    /// a child); [`HostError::EmptyRegion`]; [`HostError::SharedMemoryFrozen`] and a full
    /// table as for [`SharedMemory::create_region`].
    pub unsafe fn adopt_region(
        &self,
        ptr: *mut u8,
        len: usize,
        label: &str,
        read_only: bool,
    ) -> Result<u64, HostError> {
        if len == 0 {
            return Err(HostError::EmptyRegion {
                label: label.to_owned(),
            });
        }
        check_map_shared(ptr as usize, len).map_err(|reason| HostError::NotShared {
            label: label.to_owned(),
            reason,
        })?;
        let _guard = self.lock();
        if self.is_frozen() {
            return Err(HostError::SharedMemoryFrozen {
                label: label.to_owned(),
                bytes: len,
            });
        }
        let i = self.count.load(Ordering::Relaxed);
        if i >= CHUNK * CHUNKS {
            return Err(HostError::RegionCreate {
                label: label.to_owned(),
                bytes: len,
                source: std::io::Error::other("the shared-memory table is full"),
            });
        }
        let chunk =
            self.chunks[i / CHUNK].get_or_init(|| (0..CHUNK).map(|_| OnceLock::new()).collect());
        let _ = chunk[i % CHUNK].set(Arc::new(Region {
            map: Mapping {
                map: Backing::Adopted { ptr },
            },
            len,
            label: label.to_owned(),
            state: AtomicU8::new(LIVE),
            uses: AtomicU64::new(0),
            tensor: OnceLock::new(),
            read_only,
            creator: std::process::id(),
        }));
        self.count.store(i + 1, Ordering::Release);
        let id = i as u64 + 1;
        self.adopted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(id);
        Ok(id)
    }

    /// Whether region `region` was adopted read-only (false for an unknown region).
    pub fn is_read_only(&self, region: u64) -> bool {
        self.with_region(region, |r| r.read_only).unwrap_or(false)
    }

    /// The live adopted region ([`SharedMemory::adopt_region`]) that holds all of
    /// `[addr, addr + len)`, and the range's offset in it.
    pub fn region_containing(&self, addr: usize, len: usize) -> Option<(u64, u64)> {
        let end = addr.checked_add(len)?;
        let adopted = self.adopted.lock().unwrap_or_else(PoisonError::into_inner);
        adopted.iter().find_map(|&id| {
            self.with_region(id, |r| {
                let base = r.map.ptr() as usize;
                let live = r.state.load(Ordering::Acquire) == LIVE;
                (live && addr >= base && end <= base + r.len).then(|| (id, (addr - base) as u64))
            })
            .ok()
            .flatten()
        })
    }

    /// Closes the table: later [`SharedMemory::create_region`] calls fail. Idempotent.
    pub fn freeze(&self) {
        let _guard = self.lock();
        self.frozen.store(true, Ordering::Release);
    }

    /// Whether [`SharedMemory::freeze`] was called.
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::Acquire)
    }

    fn with_region<R>(&self, region: u64, f: impl FnOnce(&Region) -> R) -> Result<R, HostError> {
        let count = self.count.load(Ordering::Acquire);
        let unknown = HostError::UnknownRegion { region, count };
        let i = usize::try_from(region)
            .ok()
            .and_then(|r| r.checked_sub(1))
            .filter(|&i| i < count)
            .ok_or(unknown)?;
        let r = self.chunks[i / CHUNK]
            .get()
            .and_then(|c| c[i % CHUNK].get())
            .ok_or(HostError::UnknownRegion { region, count })?;
        Ok(f(r))
    }

    /// The size in bytes of region `region`, if it exists.
    pub fn region_len(&self, region: u64) -> Option<usize> {
        self.with_region(region, |r| r.len).ok()
    }

    /// The label region `region` was created with, if it exists.
    pub fn region_label(&self, region: u64) -> Option<String> {
        self.with_region(region, |r| r.label.clone()).ok()
    }

    /// A pointer to byte `offset` of region `region`, after checking that
    /// `[offset, offset + len)` lies inside it.
    ///
    /// Reading or writing through the pointer is `unsafe`: the region is shared with
    /// every process of the worker tree, so the caller must make sure nobody writes the
    /// bytes it reads (or touches the bytes it writes) at the same time. Between tasks
    /// the engine guarantees this for tracked arguments.
    ///
    /// # Errors
    /// [`HostError::UnknownRegion`], [`HostError::OutOfBounds`].
    pub fn ptr(&self, region: u64, offset: u64, len: u64) -> Result<*mut u8, HostError> {
        self.with_region(region, |r| {
            // A draining region still holds the pages of the tasks in flight that name it,
            // and a quarantined one those of a writer that may still live.
            if !matches!(
                r.state.load(Ordering::Acquire),
                LIVE | DRAINING | QUARANTINED
            ) {
                return Err(HostError::RegionReleased {
                    region,
                    label: r.label.clone(),
                });
            }
            let end = offset.checked_add(len);
            match end {
                Some(end) if end <= r.len as u64 => {
                    // SAFETY: offset <= end <= r.len, so the result stays inside (or one
                    // past the end of) the mapping.
                    Ok(unsafe { r.map.ptr().add(offset as usize) })
                }
                _ => Err(HostError::OutOfBounds {
                    region,
                    offset,
                    len,
                    region_len: r.len,
                }),
            }
        })?
    }

    /// A region of `bytes` bytes for as long as the lease lives: a pooled region of that
    /// size (returned by an earlier lease, zeroed) if there is one, else a new region.
    /// Dropping the lease discards the pages and pools the region.
    ///
    /// ```
    /// # use strata_host::SharedMemory;
    /// let mem = SharedMemory::new();
    /// let first = mem.lease_region(1 << 16, "heap")?.id();   // dropped at once
    /// let again = mem.lease_region(1 << 16, "heap")?;
    /// assert_eq!(again.id(), first, "reused");
    /// assert_eq!(mem.regions(), 1);
    /// # Ok::<(), strata_host::HostError>(())
    /// ```
    ///
    /// # Errors
    /// As [`SharedMemory::create_region`].
    pub fn lease_region(
        self: &Arc<Self>,
        bytes: usize,
        label: &str,
    ) -> Result<RegionLease, HostError> {
        let reused = {
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            let me = std::process::id();
            let fits = |r: u64| {
                self.with_region(r, |reg| reg.len == bytes && reg.creator == me)
                    .unwrap_or(false)
            };
            let hit = pool.iter().position(|&r| fits(r));
            hit.map(|i| pool.swap_remove(i))
        };
        let region = match reused {
            Some(r) => {
                self.with_region(r, |reg| reg.state.store(LIVE, Ordering::Release))?;
                r
            }
            None => self.create_region(bytes, label)?,
        };
        Ok(RegionLease {
            mem: self.clone(),
            region,
        })
    }

    /// Releases region `region` for good: its pages go back to the kernel, and later
    /// lookups fail with [`HostError::RegionReleased`]. Idempotent.
    ///
    /// While tasks that name the region are in flight ([`SharedMemory::acquire_task_use`])
    /// the release is deferred: new tasks are refused at once, but the pages stay until
    /// the last of those tasks ends ([`SharedMemory::release_task_use`]), so a child never
    /// writes into memory pulled out from under it. A quarantined region is never
    /// released.
    ///
    /// # Errors
    /// [`HostError::UnknownRegion`].
    pub fn release_region(&self, region: u64) -> Result<(), HostError> {
        self.with_region(region, |r| {
            if r.state
                .compare_exchange(LIVE, DRAINING, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
                && task_uses(r.uses.load(Ordering::SeqCst)) == 0
            {
                Self::finish_draining(r);
            }
        })
    }

    /// The last use of a draining region is gone: release it (exactly one caller wins).
    fn finish_draining(r: &Region) {
        if r.state
            .compare_exchange(DRAINING, RELEASED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
            && r.ours()
        {
            r.map.discard_pages();
        }
    }

    /// Marks region `region` in use by one more task in flight: the scheduler calls it
    /// when it dispatches a task that names the region, and [`SharedMemory::release_task_use`]
    /// when the task ended. While any task holds it, host-side copies
    /// ([`crate::SharedTensor::to_vec`], [`crate::SharedTensor::write`]) are refused with
    /// [`HostError::Busy`] and a release by the owner is deferred. One atomic increment;
    /// if a host-side copy is running at that moment, waits for it to finish (a bounded
    /// memory copy, no user code).
    ///
    /// # Errors
    /// [`HostError::RegionReleased`] if the owner released it (the tensor was dropped
    /// before the task was dispatched); [`HostError::UnknownRegion`].
    pub fn acquire_task_use(&self, region: u64) -> Result<(), HostError> {
        self.with_region(region, |r| {
            let before = r.uses.fetch_add(TASK_USE, Ordering::SeqCst);
            if !matches!(r.state.load(Ordering::SeqCst), LIVE | QUARANTINED) {
                Self::drop_task_use(r);
                return Err(HostError::RegionReleased {
                    region,
                    label: r.label.clone(),
                });
            }
            if before >= HOST_USE {
                // A host copy started before this task: it is a plain memcpy, so wait.
                while r.uses.load(Ordering::SeqCst) >= HOST_USE {
                    std::thread::yield_now();
                }
            }
            Ok(())
        })?
    }

    /// Ends one task use taken with [`SharedMemory::acquire_task_use`]; the last use of a
    /// region its owner released completes the release.
    pub fn release_task_use(&self, region: u64) {
        let _ = self.with_region(region, Self::drop_task_use);
    }

    fn drop_task_use(r: &Region) {
        let before = r.uses.fetch_sub(TASK_USE, Ordering::SeqCst);
        if task_uses(before) == 1 && r.state.load(Ordering::SeqCst) == DRAINING {
            Self::finish_draining(r);
        }
    }

    /// Tasks in flight that name region `region` (0 for an unknown region).
    pub fn task_uses(&self, region: u64) -> u32 {
        self.with_region(region, |r| task_uses(r.uses.load(Ordering::Acquire)))
            .unwrap_or(0)
    }

    /// Starts a host-side copy of region `region`: refused while tasks that name it are
    /// in flight; one copy at a time (a second waits for the first, a bounded memcpy, so
    /// two host writes from different threads never interleave).
    pub(crate) fn host_access(&self, region: u64) -> Result<HostAccess<'_>, HostError> {
        self.with_region(region, |r| loop {
            let cur = r.uses.load(Ordering::SeqCst);
            if task_uses(cur) != 0 {
                return Err(HostError::Busy {
                    region,
                    label: r.label.clone(),
                    tasks: task_uses(cur),
                });
            }
            if cur != 0 {
                std::thread::yield_now();
                continue;
            }
            if r.uses
                .compare_exchange_weak(0, HOST_USE, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return Ok(());
            }
        })??;
        Ok(HostAccess { mem: self, region })
    }

    /// Records that `identity` owns region `region` (a new [`crate::SharedTensor`]).
    pub(crate) fn set_tensor_identity(&self, region: u64, identity: BufferIdentity) {
        let _ = self.with_region(region, |r| r.tensor.set(identity));
    }

    /// The identity of the [`crate::SharedTensor`] that owns region `region`, if a shared
    /// tensor owns it. The engine checks a task's shared-tensor descriptor against it, so
    /// a descriptor naming the region under another identity (forged) is refused.
    pub fn tensor_identity(&self, region: u64) -> Option<BufferIdentity> {
        self.with_region(region, |r| r.tensor.get().copied())
            .ok()
            .flatten()
    }

    /// Quarantines a leased region a writer that cannot be stopped may still touch (a
    /// thread child detached at shutdown, still running its task): the lease is never
    /// returned, so the region is never discarded, pooled or handed to another worker.
    /// Leaked on purpose; [`SharedMemory::quarantined`] counts it.
    pub fn quarantine(&self, lease: RegionLease) {
        let region = lease.region;
        std::mem::forget(lease);
        let _ = self.with_region(region, |r| {
            r.state.store(QUARANTINED, Ordering::Release);
        });
    }

    /// How many regions are quarantined and their total bytes.
    pub fn quarantined(&self) -> (usize, usize) {
        (1..=self.regions() as u64)
            .filter_map(|id| {
                self.with_region(id, |r| {
                    (r.state.load(Ordering::Acquire) == QUARANTINED).then_some(r.len)
                })
                .ok()
                .flatten()
            })
            .fold((0, 0), |(n, b), len| (n + 1, b + len))
    }

    /// Whether region `region` exists and is in use (not released, not pooled).
    pub fn is_live(&self, region: u64) -> bool {
        self.with_region(region, |r| r.state.load(Ordering::Acquire) == LIVE)
            .unwrap_or(false)
    }

    fn return_lease(&self, region: u64) {
        let returned = self.with_region(region, |r| {
            if r.ours() {
                r.map.discard_pages();
            }
            r.state.store(POOLED, Ordering::Release);
        });
        if returned.is_ok() {
            self.pool
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(region);
        }
    }

    /// How many regions exist.
    pub fn regions(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Total bytes of all regions.
    pub fn total_bytes(&self) -> usize {
        (1..=self.regions() as u64)
            .filter_map(|r| self.region_len(r))
            .sum()
    }
}

/// A host-side copy in progress ([`SharedMemory::host_access`]); tasks that name the
/// region wait at dispatch until it drops.
#[derive(Debug)]
pub(crate) struct HostAccess<'a> {
    mem: &'a SharedMemory,
    region: u64,
}

impl Drop for HostAccess<'_> {
    fn drop(&mut self) {
        let _ = self.mem.with_region(self.region, |r| {
            r.uses.fetch_sub(HOST_USE, Ordering::SeqCst);
        });
    }
}

/// A region leased with [`SharedMemory::lease_region`]; dropping it discards the pages
/// and returns the region to the pool.
#[derive(Debug)]
pub struct RegionLease {
    mem: Arc<SharedMemory>,
    region: u64,
}

impl RegionLease {
    /// The region id.
    pub fn id(&self) -> u64 {
        self.region
    }
}

impl Drop for RegionLease {
    fn drop(&mut self) {
        self.mem.return_lease(self.region);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_zeroed_numbered_from_one_and_bounds_checked() {
        let mem = SharedMemory::new();
        assert_eq!(mem.regions(), 0);
        let a = mem.create_region(100, "a").unwrap();
        let b = mem.create_region(1 << 20, "b/with\0odd chars").unwrap();
        assert_eq!((a, b), (1, 2));
        assert_eq!(mem.region_len(a), Some(100));
        assert_eq!(mem.region_label(b).as_deref(), Some("b/with\0odd chars"));
        assert_eq!(mem.total_bytes(), 100 + (1 << 20));
        let p = mem.ptr(b, (1 << 20) - 8, 8).unwrap();
        // SAFETY: 8 bytes inside region b, used only by this test.
        unsafe {
            assert_eq!(p.cast::<u64>().read_unaligned(), 0);
            p.write(9);
        }
        assert!(matches!(
            mem.ptr(a, 50, 51),
            Err(HostError::OutOfBounds { region: 1, .. })
        ));
        assert!(matches!(
            mem.ptr(a, u64::MAX, 2),
            Err(HostError::OutOfBounds { .. })
        ));
        assert!(mem.ptr(a, 100, 0).is_ok());
        for bad in [0, 3, u64::MAX] {
            assert!(matches!(
                mem.ptr(bad, 0, 1),
                Err(HostError::UnknownRegion { count: 2, .. })
            ));
        }
        assert!(matches!(
            mem.create_region(0, "zero"),
            Err(HostError::EmptyRegion { .. })
        ));
    }

    #[test]
    fn freezing_closes_the_table_and_keeps_lookups_working() {
        let mem = SharedMemory::new();
        let a = mem.create_region(64, "a").unwrap();
        assert!(!mem.is_frozen());
        mem.freeze();
        mem.freeze();
        assert!(mem.is_frozen());
        let e = mem.create_region(64, "late").unwrap_err();
        assert!(
            e.to_string()
                .contains("allocate shared tensors before init()"),
            "{e}"
        );
        assert_eq!(mem.regions(), 1);
        assert!(mem.ptr(a, 0, 64).is_ok());
    }

    #[test]
    fn task_uses_exclude_host_copies_and_defer_the_owners_release() {
        let mem = SharedMemory::new();
        let r = mem.create_region(4096, "t").unwrap();
        mem.acquire_task_use(r).unwrap();
        mem.acquire_task_use(r).unwrap();
        assert_eq!(mem.task_uses(r), 2);
        assert!(matches!(
            mem.host_access(r),
            Err(HostError::Busy { tasks: 2, .. })
        ));
        // SAFETY: 8 bytes of a region only this test uses.
        unsafe { mem.ptr(r, 0, 8).unwrap().cast::<u64>().write(42) };
        mem.release_region(r).unwrap();
        assert!(!mem.is_live(r), "no new task may name it");
        assert!(mem.acquire_task_use(r).is_err());
        assert_eq!(mem.task_uses(r), 2, "a refused acquisition leaves no mark");
        let p = mem.ptr(r, 0, 8).expect("the pages stay while tasks run");
        mem.release_task_use(r);
        // SAFETY: as above; the region is still draining.
        assert_eq!(unsafe { p.cast::<u64>().read() }, 42);
        mem.release_task_use(r);
        assert_eq!(mem.task_uses(r), 0);
        assert!(matches!(
            mem.ptr(r, 0, 8),
            Err(HostError::RegionReleased { .. })
        ));

        let q = mem.create_region(4096, "q").unwrap();
        let guard = mem.host_access(q).unwrap();
        let other = std::thread::scope(|s| {
            let h = s.spawn(|| mem.acquire_task_use(q));
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(mem.task_uses(q), 1, "the task is counted at once");
            drop(guard);
            h.join().unwrap()
        });
        other.unwrap();
        assert!(mem.host_access(q).is_err());
        mem.release_task_use(q);
        drop(mem.host_access(q).unwrap());
    }

    #[test]
    fn quarantined_leases_are_never_pooled() {
        let mem = SharedMemory::new();
        let lease = mem.lease_region(8192, "heap").unwrap();
        let id = lease.id();
        mem.quarantine(lease);
        assert_eq!(mem.quarantined(), (1, 8192));
        assert!(
            mem.ptr(id, 0, 8).is_ok(),
            "a live writer may still reach it"
        );
        assert_ne!(mem.lease_region(8192, "heap").unwrap().id(), id);
    }

    #[test]
    fn leases_are_reused_zeroed_and_released_regions_refuse_lookups() {
        let mem = SharedMemory::new();
        let lease = mem.lease_region(8192, "heap").unwrap();
        let id = lease.id();
        let p = mem.ptr(id, 0, 8).unwrap();
        // SAFETY: 8 bytes of a region only this test uses.
        unsafe { p.cast::<u64>().write(0xfeed) };
        let other = mem.lease_region(4096, "small").unwrap();
        drop(lease);
        assert!(matches!(
            mem.ptr(id, 0, 8),
            Err(HostError::RegionReleased { .. })
        ));
        let again = mem.lease_region(8192, "heap").unwrap();
        assert_eq!(again.id(), id, "a pooled region of the same size is reused");
        let p = mem.ptr(id, 0, 8).unwrap();
        // SAFETY: as above.
        let v = unsafe { p.cast::<u64>().read() };
        assert_eq!(v, 0, "zeroed");
        let fresh = mem.lease_region(8192, "heap").unwrap();
        assert_ne!(fresh.id(), id, "a leased region is not handed out twice");
        assert_eq!(mem.regions(), 3);

        mem.release_region(other.id()).unwrap();
        mem.release_region(other.id()).unwrap();
        let e = mem.ptr(other.id(), 0, 1).unwrap_err().to_string();
        assert!(e.contains("released") && e.contains("small"), "{e}");
        assert!(mem.release_region(99).is_err());
    }
}
