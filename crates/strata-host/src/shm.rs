//! Shared memory the whole worker tree sees: memfd-backed `MAP_SHARED` regions created
//! before the children start.

use crate::error::HostError;
use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use std::ffi::CString;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// One `MAP_SHARED` mapping of a fresh memfd, its size sealed (`F_SEAL_SHRINK |
/// F_SEAL_GROW | F_SEAL_SEAL`). The descriptor is closed right after mapping (the
/// mapping keeps the object alive), so regions cost no file descriptors, no child
/// inherits a descriptor to `ftruncate`, and nothing ever appears in `/dev/shm`. Pages
/// are committed lazily, on first touch.
#[derive(Debug)]
pub(crate) struct Mapping {
    map: MmapRaw,
}

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
        Ok(Mapping { map })
    }

    /// The first byte (page-aligned).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Gives the pages back to the kernel; the mapping stays and reads as zeros.
    fn discard_pages(&self) {
        // SAFETY: the range is exactly this mapping. MADV_REMOVE frees the memfd's backing
        // pages (later accesses see fresh zero pages), so nothing dangles; callers only
        // discard regions no task uses any more.
        unsafe {
            libc::madvise(self.ptr().cast(), self.map.len(), libc::MADV_REMOVE);
        }
    }
}

/// In use.
const LIVE: u8 = 0;
/// Returned by a [`RegionLease`]: pages discarded, ready to be leased again.
const POOLED: u8 = 1;
/// Released by its owner for good (a dropped [`crate::SharedTensor`]): pages discarded.
const RELEASED: u8 = 2;

#[derive(Debug)]
struct Region {
    map: Mapping,
    len: usize,
    label: String,
    state: AtomicU8,
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
            creator: std::process::id(),
        }));
        // Publish the slot only once it is filled.
        self.count.store(i + 1, Ordering::Release);
        Ok(i as u64 + 1)
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
            if r.state.load(Ordering::Acquire) != LIVE {
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
    /// # Errors
    /// [`HostError::UnknownRegion`].
    pub fn release_region(&self, region: u64) -> Result<(), HostError> {
        self.with_region(region, |r| {
            if r.state.swap(RELEASED, Ordering::AcqRel) != RELEASED && r.ours() {
                r.map.discard_pages();
            }
        })
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
