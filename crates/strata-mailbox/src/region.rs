//! Shared-memory regions: anonymous (memfd) or named (POSIX `shm_open`), mapped
//! `MAP_SHARED` so a `fork`ed child shares them with its parent.

use crate::error::MailboxError;
use memmap2::{MmapOptions, MmapRaw};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::mman::{shm_open, shm_unlink};
use nix::sys::stat::Mode;
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Prefix of every name [`SharedRegion::create_named`] generates:
/// `/strata-<pid>-<counter>` (visible as `/dev/shm/strata-<pid>-<counter>`).
pub const NAMED_REGION_PREFIX: &str = "strata-";

/// Longest POSIX shared-memory name, including the leading `/`.
const NAME_MAX: usize = 255;

static NAME_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A `MAP_SHARED`, read-write mapping of a shared-memory object.
///
/// * [`SharedRegion::anonymous`] — a memfd: nothing appears in `/dev/shm`, nothing can
///   leak; other processes reach it only by inheriting the mapping across `fork` (or the
///   descriptor). Its size is sealed: nobody can `ftruncate` it.
/// * [`SharedRegion::create_named`] — a POSIX shm object with a unique name, created with
///   `O_CREAT | O_EXCL`; another process can [`SharedRegion::open_named`] it. Only the
///   creating process unlinks it (when the creator's value is dropped, or by
///   [`SharedRegion::unlink`]); copies inherited by forked children never do, because the
///   unlink is tied to the creator's pid.
///
/// The mapping is unmapped when the value is dropped. Mappings survive `fork`: a child
/// that inherits the value (or its memory) sees the same bytes.
///
/// ```
/// use strata_mailbox::SharedRegion;
/// let r = SharedRegion::create_named(4096)?;
/// let name = r.name().unwrap().to_owned();
/// assert!(name.starts_with("/strata-"));
/// let peer = SharedRegion::open_named(&name)?;
/// assert_eq!(peer.len(), 4096);
/// drop(r); // the creator unlinks the name; `peer`'s mapping stays valid
/// assert!(SharedRegion::open_named(&name).is_err());
/// # Ok::<(), strata_mailbox::MailboxError>(())
/// ```
#[derive(Debug)]
pub struct SharedRegion {
    map: MmapRaw,
    file: File,
    name: Option<String>,
    /// The pid of the creating process, for named regions this process created.
    owner_pid: Option<u32>,
    unlinked: bool,
}

fn region_err(
    op: &'static str,
    name: Option<&str>,
    errno: Errno,
    hint: &'static str,
) -> MailboxError {
    MailboxError::Region {
        op,
        name: name.map(str::to_owned),
        source: std::io::Error::from(errno),
        hint,
    }
}

fn io_region_err(
    op: &'static str,
    name: Option<&str>,
    source: std::io::Error,
    hint: &'static str,
) -> MailboxError {
    MailboxError::Region {
        op,
        name: name.map(str::to_owned),
        source,
        hint,
    }
}

const SIZE_HINT: &str =
    "check the size and the space in /dev/shm (df /dev/shm) or the memory cgroup limit";
const MAP_HINT: &str = "check `ulimit -v` and vm.max_map_count";

fn validate_name(name: &str) -> Result<(), MailboxError> {
    let bad = |reason| {
        Err(MailboxError::InvalidRegionName {
            name: name.to_owned(),
            reason,
        })
    };
    if !name.starts_with('/') {
        return bad("it must start with '/' (e.g. \"/strata-demo\")");
    }
    if name.len() < 2 {
        return bad("it needs at least one character after the '/'");
    }
    if name.len() > NAME_MAX {
        return bad("it is longer than 255 bytes");
    }
    if name[1..].contains('/') {
        return bad("it may contain '/' only as its first character");
    }
    if name.contains('\0') {
        return bad("it contains a NUL byte");
    }
    Ok(())
}

/// Seals a memfd's size for good: `F_SEAL_SHRINK | F_SEAL_GROW`, and `F_SEAL_SEAL` so no
/// holder of the descriptor can add more seals.
///
/// # Errors
/// The `fcntl` error.
pub fn seal_size(file: &File) -> std::io::Result<()> {
    // SAFETY: F_ADD_SEALS takes an int of seal bits and only changes the file's seals; the
    // descriptor is valid for as long as `file` is borrowed.
    let r = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl SharedRegion {
    fn map(file: File, len: usize, name: Option<&str>) -> Result<MmapRaw, MailboxError> {
        MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| io_region_err("map", name, e, MAP_HINT))
    }

    /// Creates an anonymous region of `len` zeroed bytes (a memfd named `strata-region`,
    /// sealed against shrinking and growing: see [`SharedRegion::anonymous_as`]).
    ///
    /// # Errors
    /// [`MailboxError::RegionTooSmall`] for `len == 0`; [`MailboxError::Region`] if
    /// `memfd_create`, `ftruncate`, sealing or `mmap` fail.
    pub fn anonymous(len: usize) -> Result<SharedRegion, MailboxError> {
        Self::anonymous_as(c"strata-region", len)
    }

    /// Creates an anonymous region of `len` zeroed bytes in a memfd called `name`
    /// (`/memfd:<name>` in `/proc/<pid>/maps` and `/proc/<pid>/fd`).
    ///
    /// The memfd is created with `MFD_ALLOW_SEALING`, sized, and then sealed with
    /// `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`: every process that inherits the
    /// descriptor (a forked child) gets `EPERM` from `ftruncate`, so none can cut the
    /// pages out from under the others' mappings (a later access would be a `SIGBUS`),
    /// and none can add seals of its own (`F_SEAL_FUTURE_WRITE` would stop the parent
    /// from mapping it again).
    ///
    /// # Errors
    /// As [`SharedRegion::anonymous`].
    pub fn anonymous_as(name: &CStr, len: usize) -> Result<SharedRegion, MailboxError> {
        if len == 0 {
            return Err(MailboxError::RegionTooSmall {
                needed: 1,
                actual: 0,
            });
        }
        let fd = memfd_create(
            name,
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .map_err(|e| {
            region_err(
                "create",
                None,
                e,
                "memfd_create needs Linux >= 3.17; if it is blocked (seccomp), use SharedRegion::create_named",
            )
        })?;
        let file = File::from(fd);
        file.set_len(len as u64)
            .map_err(|e| io_region_err("size", None, e, SIZE_HINT))?;
        seal_size(&file).map_err(|e| {
            io_region_err(
                "seal",
                None,
                e,
                "F_ADD_SEALS on a fresh memfd failed; the kernel or a seccomp filter refuses fcntl(F_ADD_SEALS)",
            )
        })?;
        let map = Self::map(
            file.try_clone()
                .map_err(|e| io_region_err("map", None, e, MAP_HINT))?,
            len,
            None,
        )?;
        Ok(SharedRegion {
            map,
            file,
            name: None,
            owner_pid: None,
            unlinked: false,
        })
    }

    /// Creates a named region of `len` zeroed bytes under a fresh unique name
    /// `/strata-<pid>-<counter>`.
    ///
    /// # Errors
    /// As [`SharedRegion::create_named_as`]; if 64 consecutive names already exist (stale
    /// objects of an earlier process with the same pid), the last `EEXIST` error.
    pub fn create_named(len: usize) -> Result<SharedRegion, MailboxError> {
        let pid = std::process::id();
        let mut last = None;
        for _ in 0..64 {
            let n = NAME_COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("/{NAMED_REGION_PREFIX}{pid}-{n}");
            match Self::create_named_as(&name, len) {
                Err(MailboxError::Region { source, .. })
                    if source.raw_os_error() == Some(libc::EEXIST) =>
                {
                    last = Some(source);
                }
                other => return other,
            }
        }
        Err(MailboxError::Region {
            op: "create",
            name: None,
            source: last.unwrap_or_else(|| std::io::Error::from(Errno::EEXIST)),
            hint: "64 consecutive names already exist; remove stale /dev/shm/strata-* objects",
        })
    }

    /// Creates a named region of `len` zeroed bytes called `name` (`O_CREAT | O_EXCL`,
    /// mode 0600). This process becomes its owner and unlinks it on drop.
    ///
    /// # Errors
    /// [`MailboxError::InvalidRegionName`] for a malformed name;
    /// [`MailboxError::RegionTooSmall`] for `len == 0`; [`MailboxError::Region`] if the
    /// name exists already (`EEXIST`) or `shm_open`/`ftruncate`/`mmap` fail.
    pub fn create_named_as(name: &str, len: usize) -> Result<SharedRegion, MailboxError> {
        validate_name(name)?;
        if len == 0 {
            return Err(MailboxError::RegionTooSmall {
                needed: 1,
                actual: 0,
            });
        }
        let fd = shm_open(
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR | OFlag::O_CLOEXEC,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(|e| {
            region_err(
                "create",
                Some(name),
                e,
                if e == Errno::EEXIST {
                    "the name is taken; pick another name or unlink the stale object in /dev/shm"
                } else {
                    "check that /dev/shm is mounted and writable"
                },
            )
        })?;
        let file = File::from(fd);
        let setup = || -> Result<MmapRaw, MailboxError> {
            file.set_len(len as u64)
                .map_err(|e| io_region_err("size", Some(name), e, SIZE_HINT))?;
            Self::map(
                file.try_clone()
                    .map_err(|e| io_region_err("map", Some(name), e, MAP_HINT))?,
                len,
                Some(name),
            )
        };
        match setup() {
            Ok(map) => Ok(SharedRegion {
                map,
                file,
                name: Some(name.to_owned()),
                owner_pid: Some(std::process::id()),
                unlinked: false,
            }),
            Err(e) => {
                // Do not leave a half-made object behind.
                let _ = shm_unlink(name);
                Err(e)
            }
        }
    }

    /// Maps an existing named region (its whole current size). This process does not own
    /// it and never unlinks it.
    ///
    /// # Errors
    /// [`MailboxError::InvalidRegionName`]; [`MailboxError::Region`] if it does not exist
    /// (`ENOENT`) or cannot be opened or mapped; [`MailboxError::RegionTooSmall`] if it
    /// is empty.
    pub fn open_named(name: &str) -> Result<SharedRegion, MailboxError> {
        validate_name(name)?;
        let fd = shm_open(name, OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty()).map_err(|e| {
            region_err(
                "open",
                Some(name),
                e,
                "check the name (it must exist in /dev/shm and be readable and writable by this user)",
            )
        })?;
        let file = File::from(fd);
        let len = file
            .metadata()
            .map_err(|e| io_region_err("size", Some(name), e, SIZE_HINT))?
            .len();
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len == 0 {
            return Err(MailboxError::RegionTooSmall {
                needed: 1,
                actual: 0,
            });
        }
        let map = Self::map(
            file.try_clone()
                .map_err(|e| io_region_err("map", Some(name), e, MAP_HINT))?,
            len,
            Some(name),
        )?;
        Ok(SharedRegion {
            map,
            file,
            name: Some(name.to_owned()),
            owner_pid: None,
            unlinked: false,
        })
    }

    /// Maps the same object once more (a new mapping of the same bytes, e.g. for a
    /// thread that plays the child's part). The new value never unlinks anything.
    ///
    /// # Errors
    /// [`MailboxError::Region`] if the descriptor cannot be duplicated or mapped.
    pub fn try_clone(&self) -> Result<SharedRegion, MailboxError> {
        let name = self.name.as_deref();
        let dup = |e| io_region_err("map", name, e, MAP_HINT);
        let file = self.file.try_clone().map_err(dup)?;
        let map = Self::map(self.file.try_clone().map_err(dup)?, self.len(), name)?;
        Ok(SharedRegion {
            map,
            file,
            name: self.name.clone(),
            owner_pid: None,
            unlinked: false,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always `false`: regions are never empty.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The name of a named region (with its leading `/`), `None` for an anonymous one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether this process created the (named) region and will unlink it.
    pub fn is_owner(&self) -> bool {
        self.name.is_some() && !self.unlinked && self.owner_pid == Some(std::process::id())
    }

    /// The first byte of the mapping. Reading or writing through it is `unsafe` and must
    /// follow whatever protocol the processes sharing the region agreed on.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The descriptor of the underlying object (e.g. to pass it to another process).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Unlinks the name now (the owner only; the mapping stays valid). Idempotent.
    ///
    /// # Errors
    /// [`MailboxError::Region`] if `shm_unlink` fails for a reason other than the name
    /// being gone already.
    pub fn unlink(&mut self) -> Result<(), MailboxError> {
        if !self.is_owner() {
            return Ok(());
        }
        self.unlinked = true;
        match self.name.as_deref().map(shm_unlink) {
            Some(Err(e)) if e != Errno::ENOENT => Err(region_err(
                "unlink",
                self.name.as_deref(),
                e,
                "remove it by hand from /dev/shm",
            )),
            _ => Ok(()),
        }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // Best effort: a failure here leaves a name in /dev/shm, which `unlink` reports
        // to callers who want to know.
        let _ = self.unlink();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exists(name: &str) -> bool {
        std::path::Path::new("/dev/shm").join(&name[1..]).exists()
    }

    #[test]
    fn anonymous_regions_are_zeroed_and_shared_between_mappings() {
        let r = SharedRegion::anonymous(8192).unwrap();
        assert_eq!(r.len(), 8192);
        assert!(r.name().is_none() && !r.is_owner() && !r.is_empty());
        // SAFETY: the mapping is 8192 bytes and private to this test.
        let first = unsafe { *r.as_ptr().add(8191) };
        assert_eq!(first, 0);
        assert!(matches!(
            SharedRegion::anonymous(0),
            Err(MailboxError::RegionTooSmall { .. })
        ));
    }

    #[test]
    fn anonymous_regions_refuse_to_shrink_or_grow() {
        let r = SharedRegion::anonymous(8192).unwrap();
        let file = File::from(r.as_fd().try_clone_to_owned().unwrap());
        for len in [0, 4096, 16384] {
            let e = file.set_len(len).expect_err("the size is sealed");
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "set_len({len})");
        }
        // SAFETY: F_GET_SEALS only reads the seals of a valid descriptor.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        let want = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        assert_eq!(seals & want, want);
        // SAFETY: the mapping is 8192 bytes and private to this test.
        unsafe { *r.as_ptr().add(8191) = 1 };
    }

    #[test]
    fn named_regions_are_unique_exclusive_and_unlinked_by_their_owner() {
        let a = SharedRegion::create_named(4096).unwrap();
        let b = SharedRegion::create_named(4096).unwrap();
        let (na, nb) = (a.name().unwrap().to_owned(), b.name().unwrap().to_owned());
        assert_ne!(na, nb);
        assert!(na.starts_with(&format!("/{NAMED_REGION_PREFIX}{}-", std::process::id())));
        assert!(a.is_owner() && exists(&na));
        // O_EXCL: the same name cannot be created twice.
        match SharedRegion::create_named_as(&na, 4096) {
            Err(MailboxError::Region { source, op, .. }) => {
                assert_eq!(op, "create");
                assert_eq!(source.raw_os_error(), Some(libc::EEXIST));
            }
            other => panic!("expected EEXIST, got {other:?}"),
        }
        let peer = SharedRegion::open_named(&na).unwrap();
        assert!(!peer.is_owner());
        // SAFETY: both mappings are 4096 bytes of the same object, used only here.
        unsafe {
            *a.as_ptr().add(100) = 42;
            assert_eq!(*peer.as_ptr().add(100), 42);
        }
        drop(peer);
        assert!(exists(&na), "a non-owner never unlinks");
        drop(a);
        assert!(!exists(&na), "the owner unlinks on drop");
        let mut b = b;
        b.unlink().unwrap();
        assert!(!exists(&nb));
        b.unlink().unwrap();
    }

    #[test]
    fn bad_names_and_missing_regions_are_typed_errors() {
        for bad in ["noslash", "/", "/a/b", "/nul\0"] {
            assert!(
                matches!(
                    SharedRegion::create_named_as(bad, 64),
                    Err(MailboxError::InvalidRegionName { .. })
                ),
                "{bad:?}"
            );
        }
        let long = format!("/{}", "x".repeat(255));
        assert!(matches!(
            SharedRegion::open_named(&long),
            Err(MailboxError::InvalidRegionName { .. })
        ));
        match SharedRegion::open_named("/strata-definitely-missing-region") {
            Err(e @ MailboxError::Region { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("could not open"), "{msg}");
                assert!(msg.contains("strata-definitely-missing-region"), "{msg}");
            }
            other => panic!("expected a Region error, got {other:?}"),
        }
    }
}
