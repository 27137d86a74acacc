//! A mailbox: one shared-memory region laid out as [`MailboxLayout`].

use crate::error::MailboxError;
use crate::layout::{Frame, MailboxLayout, ABI_VERSION, MAGIC, MAILBOX_BYTES};
use crate::region::SharedRegion;
use crate::state::{FrameId, MailboxState, TaskSlot};
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
    /// Creates a mailbox in a fresh anonymous (memfd) region.
    ///
    /// # Errors
    /// [`MailboxError::Region`] if the region cannot be created or mapped.
    pub fn create() -> Result<Mailbox, MailboxError> {
        Self::initialize(SharedRegion::anonymous(MAILBOX_BYTES)?)
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
