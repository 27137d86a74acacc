//! State words, preparation dispositions, and frame names.

use crate::error::MailboxError;
use std::fmt;

/// The value of a frame's state word.
///
/// The numbering is the reference runtime's (engine.md §7.3) and is part of the ABI.
/// A value read from shared memory is decoded with [`MailboxState::decode`] (or
/// [`TryFrom<u32>`]); an unknown value is a typed error, never a panic.
///
/// ```
/// use strata_mailbox::{FrameId, MailboxState};
/// assert_eq!(MailboxState::TaskDone.as_raw(), 2);
/// assert_eq!(MailboxState::try_from(12), Ok(MailboxState::PrepareReady));
/// assert!(MailboxState::decode(13, FrameId::Control).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MailboxState {
    /// Nothing in flight; the parent owns the frame.
    Idle = 0,
    /// Parent → child: run the task in this frame.
    TaskReady = 1,
    /// Child → parent: the task finished (error code 0 = success).
    TaskDone = 2,
    /// Parent → child (control frame): shut down. Erasable; the sticky shutdown word is not.
    Shutdown = 3,
    /// Parent → child (control frame): run the control command in this frame.
    ControlRequest = 4,
    /// Child → parent (control frame): the control command finished.
    ControlDone = 5,
    /// Child → parent (control frame): startup finished, the child serves.
    InitReady = 6,
    /// Child → parent (control frame): startup failed; error code and message say why.
    InitFailed = 7,
    /// Child → parent: the frame was validated and staged; see its disposition.
    FrameStaged = 8,
    /// Child → parent: the task was launched (the launch-accepted word is set).
    TaskLaunched = 9,
    /// Child → parent: the task failed (two-frame protocol).
    TaskFailed = 10,
    /// Parent → child: launch the staged frame (CAS from [`MailboxState::FrameStaged`]).
    Activate = 11,
    /// Parent → child: validate and stage this successor frame, but do not launch it yet.
    PrepareReady = 12,
}

impl MailboxState {
    /// Every state, in numeric order.
    pub const ALL: [MailboxState; 13] = [
        MailboxState::Idle,
        MailboxState::TaskReady,
        MailboxState::TaskDone,
        MailboxState::Shutdown,
        MailboxState::ControlRequest,
        MailboxState::ControlDone,
        MailboxState::InitReady,
        MailboxState::InitFailed,
        MailboxState::FrameStaged,
        MailboxState::TaskLaunched,
        MailboxState::TaskFailed,
        MailboxState::Activate,
        MailboxState::PrepareReady,
    ];

    /// The raw value stored in the state word.
    pub const fn as_raw(self) -> u32 {
        self as u32
    }

    /// The state with raw value `raw`, if there is one.
    pub const fn from_raw(raw: u32) -> Option<MailboxState> {
        if (raw as usize) < Self::ALL.len() {
            Some(Self::ALL[raw as usize])
        } else {
            None
        }
    }

    /// Decodes a state word read from `frame`.
    ///
    /// # Errors
    /// [`MailboxError::UnknownState`] naming the frame and the value.
    pub fn decode(raw: u32, frame: FrameId) -> Result<MailboxState, MailboxError> {
        Self::from_raw(raw).ok_or(MailboxError::UnknownState { frame, value: raw })
    }

    /// The reference's upper-case name (`TASK_DONE`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            MailboxState::Idle => "IDLE",
            MailboxState::TaskReady => "TASK_READY",
            MailboxState::TaskDone => "TASK_DONE",
            MailboxState::Shutdown => "SHUTDOWN",
            MailboxState::ControlRequest => "CONTROL_REQUEST",
            MailboxState::ControlDone => "CONTROL_DONE",
            MailboxState::InitReady => "INIT_READY",
            MailboxState::InitFailed => "INIT_FAILED",
            MailboxState::FrameStaged => "FRAME_STAGED",
            MailboxState::TaskLaunched => "TASK_LAUNCHED",
            MailboxState::TaskFailed => "TASK_FAILED",
            MailboxState::Activate => "ACTIVATE",
            MailboxState::PrepareReady => "PREPARE_READY",
        }
    }

    /// Whether this is a terminal task state (`TASK_DONE` or `TASK_FAILED`).
    pub const fn is_task_terminal(self) -> bool {
        matches!(self, MailboxState::TaskDone | MailboxState::TaskFailed)
    }

    /// Whether the state may appear in a task frame.
    pub const fn valid_in_task_frame(self) -> bool {
        matches!(
            self,
            MailboxState::Idle
                | MailboxState::TaskReady
                | MailboxState::TaskDone
                | MailboxState::FrameStaged
                | MailboxState::TaskLaunched
                | MailboxState::TaskFailed
                | MailboxState::Activate
                | MailboxState::PrepareReady
        )
    }

    /// Whether the state may appear in the control frame.
    pub const fn valid_in_control_frame(self) -> bool {
        matches!(
            self,
            MailboxState::Idle
                | MailboxState::Shutdown
                | MailboxState::ControlRequest
                | MailboxState::ControlDone
                | MailboxState::InitReady
                | MailboxState::InitFailed
        )
    }
}

impl fmt::Display for MailboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of [`MailboxState::try_from`]: the raw value that names no state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownStateValue(pub u32);

impl fmt::Display for UnknownStateValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown mailbox state value {} (valid: 0..=12)", self.0)
    }
}

impl std::error::Error for UnknownStateValue {}

impl TryFrom<u32> for MailboxState {
    type Error = UnknownStateValue;
    fn try_from(raw: u32) -> Result<Self, Self::Error> {
        MailboxState::from_raw(raw).ok_or(UnknownStateValue(raw))
    }
}

impl From<MailboxState> for u32 {
    fn from(s: MailboxState) -> u32 {
        s.as_raw()
    }
}

/// How far the child got when it staged a frame (written before `FRAME_STAGED`).
///
/// ```
/// use strata_mailbox::PrepareDisposition;
/// assert_eq!(PrepareDisposition::from_raw(2), Some(PrepareDisposition::NativePrepared));
/// assert_eq!(PrepareDisposition::from_raw(3), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum PrepareDisposition {
    /// Not staged (the value a parent writes when it publishes).
    #[default]
    None = 0,
    /// The child validated the request but prepared nothing ahead of the launch.
    ValidatedOnly = 1,
    /// The child prepared the launch natively (e.g. bound the chip run) ahead of activation.
    NativePrepared = 2,
}

impl PrepareDisposition {
    /// The raw value stored in the frame.
    pub const fn as_raw(self) -> u32 {
        self as u32
    }

    /// The disposition with raw value `raw`, if there is one.
    pub const fn from_raw(raw: u32) -> Option<PrepareDisposition> {
        match raw {
            0 => Some(PrepareDisposition::None),
            1 => Some(PrepareDisposition::ValidatedOnly),
            2 => Some(PrepareDisposition::NativePrepared),
            _ => None,
        }
    }
}

/// One of the two task frames of a mailbox (pipeline lease slots 0 and 1).
///
/// Single-frame endpoints use only [`TaskSlot::Slot0`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskSlot {
    /// Task frame 0 (mailbox frame 1).
    Slot0 = 0,
    /// Task frame 1 (mailbox frame 2).
    Slot1 = 1,
}

impl TaskSlot {
    /// Both slots, in order.
    pub const ALL: [TaskSlot; 2] = [TaskSlot::Slot0, TaskSlot::Slot1];

    /// The slot with index `i` (0 or 1).
    pub const fn new(i: usize) -> Option<TaskSlot> {
        match i {
            0 => Some(TaskSlot::Slot0),
            1 => Some(TaskSlot::Slot1),
            _ => None,
        }
    }

    /// The slot index, 0 or 1.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The mailbox frame this slot lives in.
    pub const fn frame(self) -> FrameId {
        FrameId::Task(self)
    }
}

/// One of the three frames of a mailbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameId {
    /// Frame 0: startup, control commands, shutdown.
    Control,
    /// Frame 1 or 2: a task frame.
    Task(TaskSlot),
}

impl FrameId {
    /// All frames in byte order.
    pub const ALL: [FrameId; 3] = [
        FrameId::Control,
        FrameId::Task(TaskSlot::Slot0),
        FrameId::Task(TaskSlot::Slot1),
    ];

    /// The frame's index in the mailbox (0 = control, 1 and 2 = task slots 0 and 1).
    pub const fn index(self) -> usize {
        match self {
            FrameId::Control => 0,
            FrameId::Task(s) => 1 + s.index(),
        }
    }
}

impl fmt::Display for FrameId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameId::Control => f.write_str("control frame"),
            FrameId::Task(s) => write!(f, "task frame {}", s.index()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_values_match_the_reference_numbering() {
        let expected = [
            (MailboxState::Idle, 0, "IDLE"),
            (MailboxState::TaskReady, 1, "TASK_READY"),
            (MailboxState::TaskDone, 2, "TASK_DONE"),
            (MailboxState::Shutdown, 3, "SHUTDOWN"),
            (MailboxState::ControlRequest, 4, "CONTROL_REQUEST"),
            (MailboxState::ControlDone, 5, "CONTROL_DONE"),
            (MailboxState::InitReady, 6, "INIT_READY"),
            (MailboxState::InitFailed, 7, "INIT_FAILED"),
            (MailboxState::FrameStaged, 8, "FRAME_STAGED"),
            (MailboxState::TaskLaunched, 9, "TASK_LAUNCHED"),
            (MailboxState::TaskFailed, 10, "TASK_FAILED"),
            (MailboxState::Activate, 11, "ACTIVATE"),
            (MailboxState::PrepareReady, 12, "PREPARE_READY"),
        ];
        for (s, raw, name) in expected {
            assert_eq!(s.as_raw(), raw);
            assert_eq!(u32::from(s), raw);
            assert_eq!(MailboxState::from_raw(raw), Some(s));
            assert_eq!(MailboxState::try_from(raw), Ok(s));
            assert_eq!(s.to_string(), name);
        }
        for (i, s) in MailboxState::ALL.iter().enumerate() {
            assert_eq!(s.as_raw() as usize, i);
        }
    }

    #[test]
    fn unknown_state_values_are_typed_errors() {
        for raw in [13, 14, 255, 0x8000_0000, u32::MAX] {
            assert_eq!(MailboxState::from_raw(raw), None);
            assert_eq!(MailboxState::try_from(raw), Err(UnknownStateValue(raw)));
            match MailboxState::decode(raw, FrameId::Task(TaskSlot::Slot1)) {
                Err(MailboxError::UnknownState { frame, value }) => {
                    assert_eq!(frame, FrameId::Task(TaskSlot::Slot1));
                    assert_eq!(value, raw);
                }
                other => panic!("expected UnknownState, got {other:?}"),
            }
        }
    }

    #[test]
    fn frame_validity_partitions_the_states() {
        use MailboxState::*;
        let task: Vec<_> = MailboxState::ALL
            .into_iter()
            .filter(|s| s.valid_in_task_frame())
            .collect();
        assert_eq!(
            task,
            [
                Idle,
                TaskReady,
                TaskDone,
                FrameStaged,
                TaskLaunched,
                TaskFailed,
                Activate,
                PrepareReady
            ]
        );
        let control: Vec<_> = MailboxState::ALL
            .into_iter()
            .filter(|s| s.valid_in_control_frame())
            .collect();
        assert_eq!(
            control,
            [
                Idle,
                Shutdown,
                ControlRequest,
                ControlDone,
                InitReady,
                InitFailed
            ]
        );
        assert!(TaskDone.is_task_terminal() && TaskFailed.is_task_terminal());
        assert!(!TaskLaunched.is_task_terminal());
    }

    #[test]
    fn dispositions_and_frames_decode() {
        for d in [
            PrepareDisposition::None,
            PrepareDisposition::ValidatedOnly,
            PrepareDisposition::NativePrepared,
        ] {
            assert_eq!(PrepareDisposition::from_raw(d.as_raw()), Some(d));
        }
        assert_eq!(PrepareDisposition::from_raw(3), None);
        assert_eq!(
            FrameId::ALL.map(FrameId::index),
            [0, 1, 2],
            "control frame first, then task slots 0 and 1"
        );
        assert_eq!(TaskSlot::new(1), Some(TaskSlot::Slot1));
        assert_eq!(TaskSlot::new(2), None);
        assert_eq!(FrameId::Task(TaskSlot::Slot1).to_string(), "task frame 1");
        assert_eq!(FrameId::Control.to_string(), "control frame");
    }
}

/// The identity a parent stamps on every task it publishes (the reference's "identity
/// trailer", here kept in the frame's first cache line next to the state word).
///
/// The frame's protocol version ([`crate::layout::PROTOCOL_VERSION`]) is written with it.
/// `run_id`, `lease_generation` and `dispatch_id` must be non-zero.
///
/// ```
/// use strata_mailbox::FrameIdentity;
/// let id = FrameIdentity { run_id: 1, lease_slot: 0, lease_generation: 1, dispatch_id: 7 };
/// assert!(id.validate().is_ok());
/// assert!(FrameIdentity { dispatch_id: 0, ..id }.validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FrameIdentity {
    /// The run (one dispatch of a host orchestration) the task belongs to.
    pub run_id: u64,
    /// The pipeline lease slot (0 or 1 in two-frame mode).
    pub lease_slot: u32,
    /// The lease generation (bumped every time the slot is leased again).
    pub lease_generation: u64,
    /// The dispatch id, unique per dispatch of a task to a child.
    pub dispatch_id: u64,
}

impl FrameIdentity {
    /// Checks the non-zero rules.
    ///
    /// # Errors
    /// [`MailboxError::InvalidIdentity`] naming the zero field.
    pub fn validate(&self) -> Result<(), MailboxError> {
        let bad = |reason| {
            Err(MailboxError::InvalidIdentity {
                identity: *self,
                reason,
            })
        };
        if self.run_id == 0 {
            return bad("run_id is 0 (run ids start at 1)");
        }
        if self.lease_generation == 0 {
            return bad("lease_generation is 0 (generations start at 1)");
        }
        if self.dispatch_id == 0 {
            return bad("dispatch_id is 0 (dispatch ids start at 1)");
        }
        Ok(())
    }
}

impl fmt::Display for FrameIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "run {} slot {} generation {} dispatch {}",
            self.run_id, self.lease_slot, self.lease_generation, self.dispatch_id
        )
    }
}
