//! The error type of this crate, and the reference runtime's fatal codes.

use std::time::Duration;
use strata_types::WaitFor;
use thiserror::Error;

/// The reference runtime's fatal codes (orchestrator 1..=11, scheduler 100+), plus the
/// codes strata adds where the reference has none.
pub mod codes {
    /// Tasks in the current scope fill the ring's task window.
    pub const SCOPE_DEADLOCK: i32 = 1;
    /// A heap allocation can never (or did not in time) find room in its ring.
    pub const HEAP_RING_DEADLOCK: i32 = 2;
    /// The task window of a ring is full and does not drain.
    pub const FLOW_CONTROL_DEADLOCK: i32 = 3;
    /// A ring's dependency pool cannot hold a task's edges.
    pub const DEP_POOL_OVERFLOW: i32 = 4;
    /// Invalid task arguments (argument build error, bad explicit dependency, ...).
    pub const INVALID_ARGS: i32 = 5;
    /// A `require_sync_start` task needs more cores than the chip has.
    pub const REQUIRE_SYNC_START_INVALID: i32 = 7;
    /// `get_tensor_data` / `set_tensor_data` waited too long for producers.
    pub const TENSOR_WAIT_TIMEOUT: i32 = 8;
    /// The orchestration reported a fatal error itself.
    pub const EXPLICIT_ORCH_FATAL: i32 = 9;
    /// A kernel (or the orchestration) made no progress within the run's timeout.
    pub const SCHEDULER_TIMEOUT: i32 = 100;
    /// strata: a kernel returned an error or panicked (the reference has no kernel error
    /// channel; a crash there kills the process).
    pub const KERNEL_FAILED: i32 = 110;
    /// strata: the orchestration function returned an error or panicked.
    pub const ORCHESTRATION_FAILED: i32 = 111;

    /// The reference name of a code (`"SCOPE_DEADLOCK"`, ...), or `"UNKNOWN"`.
    ///
    /// ```
    /// assert_eq!(strata_chip::codes::name(2), "HEAP_RING_DEADLOCK");
    /// ```
    pub fn name(code: i32) -> &'static str {
        match code {
            SCOPE_DEADLOCK => "SCOPE_DEADLOCK",
            HEAP_RING_DEADLOCK => "HEAP_RING_DEADLOCK",
            FLOW_CONTROL_DEADLOCK => "FLOW_CONTROL_DEADLOCK",
            DEP_POOL_OVERFLOW => "DEP_POOL_OVERFLOW",
            INVALID_ARGS => "INVALID_ARGS",
            REQUIRE_SYNC_START_INVALID => "REQUIRE_SYNC_START_INVALID",
            TENSOR_WAIT_TIMEOUT => "TENSOR_WAIT_TIMEOUT",
            EXPLICIT_ORCH_FATAL => "EXPLICIT_ORCH_FATAL",
            10 => "SCOPE_TASKS_OVERFLOW",
            11 => "TENSORMAP_OVERFLOW",
            SCHEDULER_TIMEOUT => "SCHEDULER_TIMEOUT",
            KERNEL_FAILED => "KERNEL_FAILED",
            ORCHESTRATION_FAILED => "ORCHESTRATION_FAILED",
            _ => "UNKNOWN",
        }
    }
}

/// Everything that can go wrong with a chip. Every variant says what was wrong and how to
/// fix it; variants that come from a run carry the reference runtime's fatal code
/// ([`ChipError::code`]).
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum ChipError {
    /// An invalid [`crate::ChipConfig`] or [`strata_types::CallConfig`].
    #[error("invalid chip configuration: {0}")]
    InvalidConfig(String),

    /// An operation that needs `init()` first.
    #[error("{op} needs an initialized chip; call ChipWorker::init() first")]
    NotInitialized {
        /// The operation.
        op: &'static str,
    },
    /// `init()` twice.
    #[error("the chip is already initialized")]
    AlreadyInitialized,
    /// Use after `close()`.
    #[error("{op} on a closed chip; create a new ChipWorker")]
    Closed {
        /// The operation.
        op: &'static str,
    },
    /// A registration after `init()`.
    #[error("cannot register {name:?} after init(): register every callable before init() (children are forked with the registry)")]
    RegisterAfterInit {
        /// The callable's name.
        name: String,
    },
    /// A callable that is not registered (or was unregistered).
    #[error("{what} is not registered on this chip; register it before init()")]
    UnknownCallable {
        /// What was looked up.
        what: String,
    },
    /// A registration with a descriptor of the wrong kind.
    #[error("callable {name:?} has kind {got} but {expected} was expected")]
    WrongKind {
        /// The callable's name.
        name: String,
        /// The kind it has.
        got: String,
        /// The kind required.
        expected: &'static str,
    },
    /// The same descriptor registered twice with a different kind of callable, or too many
    /// kernels.
    #[error("registration of {name:?} rejected: {reason}")]
    Registration {
        /// The callable's name.
        name: String,
        /// Why.
        reason: String,
    },

    /// Device memory is exhausted.
    #[error("out of device memory: {requested} bytes requested (1024-aligned), {committed} of {capacity} bytes committed, largest free block {largest_free}; free buffers or raise ChipConfig::device_memory_bytes")]
    OutOfDeviceMemory {
        /// Aligned request.
        requested: u64,
        /// Bytes held by the allocator.
        committed: u64,
        /// Arena size.
        capacity: u64,
        /// Largest free block.
        largest_free: u64,
    },
    /// A zero-byte allocation.
    #[error("cannot allocate 0 bytes of device memory")]
    ZeroSizedAlloc,
    /// A free of a buffer that was already freed.
    #[error(
        "double free of device buffer at {addr:#x} (generation {generation}): it was already freed"
    )]
    DoubleFree {
        /// Device address.
        addr: u64,
        /// Generation of the handle.
        generation: u64,
    },
    /// A handle whose allocation was freed and whose address now belongs to another one.
    #[error("stale device handle: address {addr:#x} generation {generation} was freed and the address now belongs to generation {current}; stop using the old handle")]
    StaleHandle {
        /// Device address.
        addr: u64,
        /// Generation of the handle.
        generation: u64,
        /// Generation of the live allocation at that address.
        current: u64,
    },
    /// `free` of a pointer into the middle of an allocation.
    #[error("cannot free interior pointer {addr:#x}: it is {offset} bytes into the allocation at {base:#x}; free the base pointer")]
    InteriorFree {
        /// The pointer.
        addr: u64,
        /// Base of its allocation.
        base: u64,
        /// Offset into it.
        offset: u64,
    },
    /// A byte range that leaves its allocation.
    #[error("device range [{addr:#x}, +{len}) leaves its allocation [{base:#x}, +{size}); stay inside one live allocation")]
    OutOfRange {
        /// Start of the range.
        addr: u64,
        /// Length.
        len: u64,
        /// Base of the allocation.
        base: u64,
        /// Size of the allocation.
        size: u64,
    },
    /// A handle minted by another chip.
    #[error("{what} belongs to another chip (chip nonce {handle_chip:#x}, this chip {this_chip:#x}); device memory is private to its chip")]
    ForeignHandle {
        /// What was passed.
        what: &'static str,
        /// The handle's chip.
        handle_chip: u64,
        /// This chip.
        this_chip: u64,
    },
    /// A [`crate::ChipTensor`] kept from an earlier run: its bytes may belong to another
    /// buffer now (the rings and the staging are reused by every run).
    #[error("stale tensor handle: it belongs to run {handle_run} of this chip, the current run is {current_run}; a ChipTensor is valid only in the run that produced it (pass a DeviceTensor in the run's arguments to reuse resident data)")]
    StaleTensor {
        /// The run the handle belongs to.
        handle_run: u64,
        /// The run it was used in.
        current_run: u64,
    },
    /// A [`crate::ChipTensor`] produced by another chip's run: its device address means
    /// nothing here.
    #[error("tensor handle of another chip (chip nonce {handle_chip:#x}, this chip {this_chip:#x}); device memory is private to its chip: pass the data through the run's arguments")]
    ForeignTensor {
        /// The handle's chip.
        handle_chip: u64,
        /// This chip.
        this_chip: u64,
    },
    /// Device memory a kernel abandoned after its timeout may still be writing (it was an
    /// argument of that kernel's run): copies and runs that name it are refused until the
    /// kernel returns ([`crate::ChipWorker::lost_cores`] is empty).
    #[error("{what} at {base:#x} (+{size}) may still be written by a kernel abandoned after its timeout; wait until ChipWorker::lost_cores() is empty (the kernel returned) before using it")]
    Quarantined {
        /// What was passed.
        what: &'static str,
        /// Base of the allocation.
        base: u64,
        /// Its size.
        size: u64,
    },
    /// A host buffer too small for a copy.
    #[error("host buffer of {have} bytes is too small: the copy needs bytes [{offset}, {end})")]
    HostRange {
        /// Host buffer size.
        have: usize,
        /// Start offset.
        offset: usize,
        /// End offset.
        end: usize,
    },
    /// A typed access with the wrong element type.
    #[error("tensor holds {have} elements but {want} was requested")]
    DtypeMismatch {
        /// The tensor's data type.
        have: strata_types::DataType,
        /// The requested type.
        want: strata_types::DataType,
    },
    /// Bad run arguments (host side, before anything runs).
    #[error("invalid run arguments: {0}")]
    InvalidRunArgs(String),
    /// A tensor view / argument list error.
    #[error(transparent)]
    Types(#[from] strata_types::TypesError),

    /// A fatal error latched by the orchestration (reference codes 1..=11): ring
    /// deadlocks, invalid arguments, sync-start, tensor-wait timeout, explicit fatal.
    #[error("chip run failed with code {code} ({}): {message}{}", codes::name(*code), shown(.wait_for))]
    Fatal {
        /// The reference fatal code.
        code: i32,
        /// What happened and how to fix it.
        message: String,
        /// What the run waited for, when the error ended a stall (a heap ring that could
        /// not make room).
        wait_for: Option<Box<WaitFor>>,
    },
    /// A kernel returned an error or panicked.
    #[error("kernel {kernel:?} failed (task {task}, block {block}, core {core}): {message}{}", shown(.wait_for))]
    KernelFailed {
        /// The kernel's registered name.
        kernel: String,
        /// The task id.
        task: u64,
        /// The SPMD block.
        block: u32,
        /// The core it ran on.
        core: u32,
        /// The kernel's message.
        message: String,
        /// What the run waited for, when the kernel gave up a signal wait.
        wait_for: Option<Box<WaitFor>>,
    },
    /// A kernel did not finish within the run's timeout (SCHEDULER_TIMEOUT, 100).
    #[error("kernel {kernel:?} (task {task}, block {block}) made no progress on core {core} for {} ms: SCHEDULER_TIMEOUT (100, running-stalled); the core is taken out of service and its kernel was asked to stop (KernelCtx::cancelled). Raise CallConfig::timeout or ChipConfig::kernel_timeout if the kernel is just slow{}", .after.as_millis(), shown(.wait_for))]
    KernelTimeout {
        /// The kernel's registered name.
        kernel: String,
        /// The task id.
        task: u64,
        /// The SPMD block.
        block: u32,
        /// The core.
        core: u32,
        /// How long it ran.
        after: Duration,
        /// What the run waited for when the kernel was given up on.
        wait_for: Option<Box<WaitFor>>,
    },
    /// The orchestration function returned an error or panicked.
    #[error("orchestration {orchestration:?} failed: {message}")]
    OrchestrationFailed {
        /// The orchestration's registered name.
        orchestration: String,
        /// What it reported.
        message: String,
    },
    /// A run failure carried through the graph whose typed origin is not known (a
    /// cancelled or poisoned task).
    #[error("chip run failed with code {code} ({}): {message}", codes::name(*code))]
    RunFailed {
        /// The code (0 if none applies).
        code: i32,
        /// The message.
        message: String,
    },
    /// An error inside a kernel, returned by a [`crate::KernelCtx`] accessor.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The chip cannot run anything any more.
    #[error("the chip is unusable: {0}")]
    Unusable(String),
    /// An internal invariant failed (a bug in strata-chip; please report it).
    #[error("internal error in strata-chip: {0}")]
    Internal(String),
}

impl ChipError {
    /// The reference runtime's fatal code for this error, where one applies.
    ///
    /// ```
    /// use strata_chip::{ChipError, codes};
    /// let e = ChipError::Fatal { code: codes::SCOPE_DEADLOCK, message: "..".into(), wait_for: None };
    /// assert_eq!(e.code(), Some(1));
    /// assert!(e.to_string().contains("SCOPE_DEADLOCK"));
    /// ```
    pub fn code(&self) -> Option<i32> {
        Some(match self {
            ChipError::Fatal { code, .. } | ChipError::RunFailed { code, .. } => *code,
            ChipError::KernelFailed { .. } => codes::KERNEL_FAILED,
            ChipError::KernelTimeout { .. } => codes::SCHEDULER_TIMEOUT,
            ChipError::OrchestrationFailed { .. } => codes::ORCHESTRATION_FAILED,
            ChipError::StaleTensor { .. } | ChipError::ForeignTensor { .. } => codes::INVALID_ARGS,
            _ => return None,
        })
    }

    pub(crate) fn fatal(code: i32, message: impl Into<String>) -> Self {
        ChipError::Fatal {
            code,
            message: message.into(),
            wait_for: None,
        }
    }

    /// The wait-for state of the stall this error ended (a kernel past its timeout, a
    /// kernel that gave up a signal wait, a heap ring that could not make room): which
    /// tasks wait for which producers, which run on which core, which signal cells the
    /// kernels wait on and their values. Its text is also the end of the error's message.
    pub fn wait_for(&self) -> Option<&WaitFor> {
        match self {
            ChipError::Fatal { wait_for, .. }
            | ChipError::KernelFailed { wait_for, .. }
            | ChipError::KernelTimeout { wait_for, .. } => wait_for.as_deref(),
            _ => None,
        }
    }

    /// The message without the wait-for state's text (one line, for a place that carries
    /// the state as data beside it).
    pub fn headline(&self) -> String {
        let text = self.to_string();
        match self.wait_for() {
            Some(w) => text
                .strip_suffix(&shown(&Some(Box::new(w.clone()))))
                .map(str::to_owned)
                .unwrap_or(text),
            None => text,
        }
    }
}

/// The wait-for state's text, on the lines after a message (nothing without one).
fn shown(w: &Option<Box<WaitFor>>) -> String {
    w.as_ref().map_or_else(String::new, |w| format!("\n{w}"))
}

/// The error a kernel returns; it fails the task (downstream tasks are poisoned and the
/// run reports it with the kernel's name).
///
/// ```
/// use strata_chip::KernelError;
/// let e = KernelError::new("tile 3 is empty");
/// assert_eq!(e.to_string(), "tile 3 is empty");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KernelError(pub(crate) String);

impl KernelError {
    /// An error with a message.
    pub fn new(msg: impl Into<String>) -> Self {
        KernelError(msg.into())
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl From<String> for KernelError {
    fn from(s: String) -> Self {
        KernelError(s)
    }
}

impl From<&str> for KernelError {
    fn from(s: &str) -> Self {
        KernelError(s.to_owned())
    }
}
