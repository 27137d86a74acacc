//! Shared memory the whole worker tree sees: memfd-backed `MAP_SHARED` regions created
//! before the children start.

use crate::error::HostError;
use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use std::ffi::CString;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// One `MAP_SHARED` mapping of a fresh memfd. The descriptor is closed right after
/// mapping (the mapping keeps the object alive), so regions cost no file descriptors and
/// nothing ever appears in `/dev/shm`. Pages are committed lazily, on first touch.
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
        let fd = memfd_create(name.as_c_str(), MemFdCreateFlag::MFD_CLOEXEC)
            .map_err(std::io::Error::from)?;
        let file = File::from(fd);
        file.set_len(len as u64)?;
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        Ok(Mapping { map })
    }

    /// The first byte (page-aligned).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
}

#[derive(Debug)]
struct Region {
    map: Mapping,
    len: usize,
    label: String,
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
/// Regions live as long as the `SharedMemory` (in each process that holds it); nothing is
/// ever written to `/dev/shm`, so nothing can leak when a process is killed.
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
        }
    }
}

impl SharedMemory {
    /// An empty table of regions.
    pub fn new() -> Arc<SharedMemory> {
        Arc::new(SharedMemory::default())
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
}
