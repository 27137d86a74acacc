//! A mailbox: one shared-memory region laid out as [`MailboxLayout`].

use crate::error::MailboxError;
use crate::layout::{Frame, MailboxLayout, ABI_VERSION, MAGIC, MAILBOX_BYTES};
use crate::region::SharedRegion;
use crate::state::{FrameId, MailboxState, TaskSlot};
use std::ffi::CStr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

/// One parent↔child mailbox: a control frame and two task frames in shared memory.
///
/// Create it in the parent **before forking** (every field starts IDLE/zero), then hand
/// it to a [`crate::Parent`] in the parent process and to a [`crate::Child`] in the
/// child. A named mailbox can instead be attached from an unrelated process with
/// [`Mailbox::open_named`].
///
/// ```
/// use strata_mailbox::{FrameId, Mailbox, MailboxState};
/// let mb = Mailbox::create()?;
/// assert_eq!(mb.state(FrameId::Control)?, MailboxState::Idle);
/// assert!(mb.name().is_none()); // anonymous: nothing in /dev/shm
/// # Ok::<(), strata_mailbox::MailboxError>(())
/// ```
#[derive(Debug)]
pub struct Mailbox {
    region: SharedRegion,
}

impl Mailbox {
    /// Creates a mailbox in a fresh anonymous region: a memfd called
    /// [`MAILBOX_MEMFD_NAME`] whose size is sealed ([`SharedRegion::anonymous_as`]), so a
    /// child that inherits it cannot `ftruncate` it under its parent.
    ///
    /// # Errors
    /// [`MailboxError::Region`] if the region cannot be created, sealed or mapped.
    pub fn create() -> Result<Mailbox, MailboxError> {
        Self::initialize(SharedRegion::anonymous_as(
            MAILBOX_MEMFD_NAME,
            MAILBOX_BYTES,
        )?)
    }

    /// Creates a mailbox in a fresh named region `/strata-<pid>-<n>`, unlinked when the
    /// creating process drops it.
    ///
    /// # Errors
    /// [`MailboxError::Region`] if the region cannot be created or mapped.
    pub fn create_named() -> Result<Mailbox, MailboxError> {
        Self::initialize(SharedRegion::create_named(MAILBOX_BYTES)?)
    }

    /// Attaches to a named mailbox another process created, validating its frames.
    ///
    /// # Errors
    /// As [`SharedRegion::open_named`] and [`Mailbox::from_region`].
    pub fn open_named(name: &str) -> Result<Mailbox, MailboxError> {
        Self::from_region(SharedRegion::open_named(name)?)
    }

    /// Wraps a region that already holds a mailbox, validating the size and every frame's
    /// descriptor (magic, ABI version, index).
    ///
    /// # Errors
    /// [`MailboxError::RegionTooSmall`], [`MailboxError::BadMagic`],
    /// [`MailboxError::AbiMismatch`].
    pub fn from_region(region: SharedRegion) -> Result<Mailbox, MailboxError> {
        if region.len() < MAILBOX_BYTES {
            return Err(MailboxError::RegionTooSmall {
                needed: MAILBOX_BYTES,
                actual: region.len(),
            });
        }
        let mb = Mailbox { region };
        for id in FrameId::ALL {
            let f = mb.frame(id);
            let magic = f.magic.load(Ordering::Acquire);
            if magic != MAGIC {
                return Err(MailboxError::BadMagic {
                    frame: id,
                    found: magic,
                });
            }
            let version = f.abi_version.load(Ordering::Relaxed);
            let index = f.frame_index.load(Ordering::Relaxed);
            if version != ABI_VERSION || index as usize != id.index() {
                return Err(MailboxError::AbiMismatch {
                    frame: id,
                    found_version: version,
                    expected_version: ABI_VERSION,
                    found_index: index,
                    expected_index: id.index() as u32,
                });
            }
        }
        Ok(mb)
    }

    /// Writes the frame descriptors into a zeroed region.
    fn initialize(region: SharedRegion) -> Result<Mailbox, MailboxError> {
        if region.len() < MAILBOX_BYTES {
            return Err(MailboxError::RegionTooSmall {
                needed: MAILBOX_BYTES,
                actual: region.len(),
            });
        }
        let mb = Mailbox { region };
        let pid = std::process::id();
        for id in FrameId::ALL {
            let f = mb.frame(id);
            f.abi_version.store(ABI_VERSION, Ordering::Relaxed);
            f.frame_index.store(id.index() as u32, Ordering::Relaxed);
            f.creator_pid.store(pid, Ordering::Relaxed);
            f.magic.store(MAGIC, Ordering::Release);
        }
        Ok(mb)
    }

    /// Maps the same mailbox once more (see [`SharedRegion::try_clone`]): for a thread
    /// that plays the child's part, as in a threads-only execution mode.
    ///
    /// # Errors
    /// [`MailboxError::Region`] if the region cannot be mapped again.
    pub fn try_clone(&self) -> Result<Mailbox, MailboxError> {
        Ok(Mailbox {
            region: self.region.try_clone()?,
        })
    }

    /// The underlying region.
    pub fn region(&self) -> &SharedRegion {
        &self.region
    }

    /// The region's name, for a named mailbox.
    pub fn name(&self) -> Option<&str> {
        self.region.name()
    }

    /// The pid of the process that created the mailbox (as recorded in it).
    pub fn creator_pid(&self) -> u32 {
        self.frame(FrameId::Control)
            .creator_pid
            .load(Ordering::Relaxed)
    }

    /// The current state of `frame` (an acquire load), decoded.
    ///
    /// # Errors
    /// [`MailboxError::UnknownState`] if the word holds no valid state.
    pub fn state(&self, frame: FrameId) -> Result<MailboxState, MailboxError> {
        MailboxState::decode(self.frame(frame).word().load(), frame)
    }

    /// Whether the sticky shutdown word is set.
    pub fn shutdown_requested(&self) -> bool {
        self.frame(FrameId::Control)
            .shutdown
            .load(Ordering::Acquire)
            != 0
    }

    #[inline(always)]
    fn layout(&self) -> &MailboxLayout {
        // SAFETY: the mapping is at least MAILBOX_BYTES long (checked when `self` was
        // built), page-aligned (so aligned for `MailboxLayout`), and lives as long as
        // `self`. Every field of `MailboxLayout` is an atomic or an `UnsafeCell` byte
        // array, for which every bit pattern is valid and which may be mutated (by this
        // or another process) through a shared reference.
        unsafe { &*self.region.as_ptr().cast::<MailboxLayout>() }
    }

    #[inline(always)]
    pub(crate) fn frame(&self, id: FrameId) -> &Frame {
        &self.layout().frames[id.index()]
    }

    #[inline(always)]
    pub(crate) fn task(&self, slot: TaskSlot) -> &Frame {
        &self.layout().frames[1 + slot.index()]
    }

    #[inline(always)]
    pub(crate) fn control(&self) -> &Frame {
        &self.layout().frames[0]
    }
}

/// The memfd name of every [`Mailbox::create`]d mailbox (`/memfd:strata-mailbox` in
/// `/proc/<pid>/maps` and `/proc/<pid>/fd`), by which [`release_foreign_mailboxes`]
/// finds them.
pub const MAILBOX_MEMFD_NAME: &CStr = c"strata-mailbox";

/// What [`release_foreign_mailboxes`] dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForeignRelease {
    /// Mappings unmapped.
    pub mappings: usize,
    /// Descriptors closed.
    pub descriptors: usize,
}

/// In a freshly forked child: unmaps every mapping and closes every descriptor of an
/// anonymous mailbox ([`Mailbox::create`]) other than `own`, so the child cannot read or
/// scribble on its siblings' (or its parent's own) frames, nor hold their memfds.
///
/// A fork copies all of the parent's mailboxes into the child — those of the siblings
/// forked earlier and later, and, below the top level, the mailbox the parent serves for
/// its own parent. They are found by reading `/proc/self/maps` and `/proc/self/fd`: a
/// mapping or descriptor of a memfd called [`MAILBOX_MEMFD_NAME`] of exactly
/// [`MAILBOX_BYTES`] bytes (a mapping must also carry the frame magic) that is not `own`'s.
///
/// # Safety
/// Every other [`Mailbox`] (and [`crate::Parent`] or [`crate::Child`] holding one) this
/// process has — its copies of the parent's values — must never be used or dropped
/// afterwards: their memory is gone (the address range may be reused by a later mapping)
/// and their descriptor numbers may be reused by later files. A forked child that never
/// returns into its parent's frames and leaves through `_exit` meets this.
///
/// # Errors
/// [`MailboxError::Os`] if `/proc/self/maps` or `/proc/self/fd` cannot be read, or an
/// `munmap` fails; whatever was released before the error stays released.
pub unsafe fn release_foreign_mailboxes(own: &Mailbox) -> Result<ForeignRelease, MailboxError> {
    let os = |op: &'static str| move |source: std::io::Error| MailboxError::Os { op, source };
    let own_start = own.region.as_ptr() as usize;
    let own_end = own_start + own.region.len();
    let own_fd = own.region.as_fd().as_raw_fd();
    let name = MAILBOX_MEMFD_NAME.to_str().unwrap_or("strata-mailbox");
    let memfd = format!("/memfd:{name}");
    // A memfd's link and maps path is `/memfd:<name> (deleted)`.
    let is_mailbox_path = |p: &str| p.strip_prefix(memfd.as_str()) == Some(" (deleted)");
    let mut released = ForeignRelease::default();

    let maps = std::fs::read_to_string("/proc/self/maps").map_err(os("reading /proc/self/maps"))?;
    let mut foreign = Vec::new();
    for line in maps.lines() {
        let mut fields = line.splitn(6, ' ');
        let range = fields.next().unwrap_or("");
        let path = fields.nth(4).map(str::trim_start).unwrap_or("");
        if !is_mailbox_path(path) {
            continue;
        }
        let Some((start, end)) = range.split_once('-').and_then(|(a, b)| {
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        }) else {
            continue;
        };
        if end - start != MAILBOX_BYTES || (start < own_end && own_start < end) {
            continue;
        }
        // SAFETY: `start` is the first byte of a live, readable shared mapping of at least
        // MAILBOX_BYTES (the kernel just listed it); the magic is an aligned u64 inside it.
        let magic = unsafe {
            (*(start as *const MailboxLayout)).frames[0]
                .magic
                .load(Ordering::Relaxed)
        };
        if magic == MAGIC {
            foreign.push((start, end - start));
        }
    }
    for (start, len) in foreign {
        // SAFETY: the range is a whole mapping of another mailbox; the caller promises no
        // value of this process refers to it any more.
        if unsafe { libc::munmap(start as *mut libc::c_void, len) } != 0 {
            return Err(os("munmap of another child's mailbox")(
                std::io::Error::last_os_error(),
            ));
        }
        released.mappings += 1;
    }

    let mut fds = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")
        .map_err(os("reading /proc/self/fd"))?
        .flatten()
    {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if fd == own_fd {
            continue;
        }
        let is_mailbox = std::fs::read_link(entry.path())
            .ok()
            .is_some_and(|l| l.to_str().is_some_and(is_mailbox_path));
        if is_mailbox {
            fds.push(fd);
        }
    }
    for fd in fds {
        // SAFETY: fstat only writes into `st`; a stale fd number fails with EBADF.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size != MAILBOX_BYTES as i64 {
            continue;
        }
        // SAFETY: the descriptor is another mailbox's memfd; the caller promises no value
        // of this process uses (or closes) it any more.
        if unsafe { libc::close(fd) } == 0 {
            released.descriptors += 1;
        }
    }
    Ok(released)
}

/// The decoded states of all three frames at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// The control frame's state.
    pub control: MailboxState,
    /// The task frames' states, by slot.
    pub tasks: [MailboxState; 2],
}

impl Snapshot {
    /// The state of one task frame.
    pub fn task(&self, slot: TaskSlot) -> MailboxState {
        self.tasks[slot.index()]
    }

    /// The state of any frame.
    pub fn get(&self, frame: FrameId) -> MailboxState {
        match frame {
            FrameId::Control => self.control,
            FrameId::Task(s) => self.task(s),
        }
    }

    pub(crate) fn decode(raw: &[u32; 3]) -> Result<Snapshot, MailboxError> {
        Ok(Snapshot {
            control: MailboxState::decode(raw[0], FrameId::Control)?,
            tasks: [
                MailboxState::decode(raw[1], FrameId::Task(TaskSlot::Slot0))?,
                MailboxState::decode(raw[2], FrameId::Task(TaskSlot::Slot1))?,
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_mailbox_is_idle_and_validates() {
        let mb = Mailbox::create_named().unwrap();
        for id in FrameId::ALL {
            assert_eq!(mb.state(id).unwrap(), MailboxState::Idle);
        }
        assert!(!mb.shutdown_requested());
        assert_eq!(mb.creator_pid(), std::process::id());
        let peer = Mailbox::open_named(mb.name().unwrap()).unwrap();
        assert_eq!(peer.state(FrameId::Control).unwrap(), MailboxState::Idle);
    }

    #[test]
    fn foreign_regions_are_rejected_with_typed_errors() {
        let small = SharedRegion::anonymous(4096).unwrap();
        assert!(matches!(
            Mailbox::from_region(small),
            Err(MailboxError::RegionTooSmall {
                needed: MAILBOX_BYTES,
                actual: 4096
            })
        ));
        let zeroed = SharedRegion::anonymous(MAILBOX_BYTES).unwrap();
        assert!(matches!(
            Mailbox::from_region(zeroed),
            Err(MailboxError::BadMagic {
                frame: FrameId::Control,
                found: 0
            })
        ));
        let mb = Mailbox::create_named().unwrap();
        mb.task(TaskSlot::Slot1)
            .abi_version
            .store(9, Ordering::Relaxed);
        match Mailbox::open_named(mb.name().unwrap()) {
            Err(MailboxError::AbiMismatch {
                frame,
                found_version,
                expected_version,
                ..
            }) => {
                assert_eq!(frame, FrameId::Task(TaskSlot::Slot1));
                assert_eq!((found_version, expected_version), (9, ABI_VERSION));
            }
            other => panic!("expected AbiMismatch, got {other:?}"),
        }
    }

    #[test]
    fn garbage_states_decode_to_typed_errors() {
        let mb = Mailbox::create().unwrap();
        mb.task(TaskSlot::Slot0).state.store(77, Ordering::Release);
        assert!(matches!(
            mb.state(FrameId::Task(TaskSlot::Slot0)),
            Err(MailboxError::UnknownState { value: 77, .. })
        ));
        assert!(Snapshot::decode(&[0, 77, 0]).is_err());
        let s = Snapshot::decode(&[6, 1, 2]).unwrap();
        assert_eq!(s.get(FrameId::Control), MailboxState::InitReady);
        assert_eq!(s.task(TaskSlot::Slot1), MailboxState::TaskDone);
    }
}
