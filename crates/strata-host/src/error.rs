//! The error type of this crate, and how a child ended.

use std::fmt;
use strata_mailbox::{ChildExit, MailboxError};
use strata_types::{CallableId, DataType, TypesError};
use thiserror::Error;

/// How a child ended: a process's exit status or signal, or a thread's return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildEnd {
    /// A child process ended (as reported by `waitpid`).
    Process(ChildExit),
    /// A child thread ([`crate::ExecMode::Threads`]) returned with this exit code (see
    /// [`crate::exit_codes`]).
    ThreadReturned(i32),
    /// A child thread panicked outside the code that catches panics.
    ThreadPanicked(String),
}

impl ChildEnd {
    /// Whether this is a normal end: exit status 0, or a thread that returned 0.
    pub fn is_normal(&self) -> bool {
        matches!(
            self,
            ChildEnd::Process(ChildExit::Exited(0)) | ChildEnd::ThreadReturned(0)
        )
    }

    /// The signal that killed the process, if a signal did.
    pub fn signal(&self) -> Option<i32> {
        match self {
            ChildEnd::Process(ChildExit::Signaled { signal, .. }) => Some(*signal),
            _ => None,
        }
    }

    /// The exit status of a process, or the return code of a thread.
    pub fn code(&self) -> Option<i32> {
        match self {
            ChildEnd::Process(ChildExit::Exited(c)) | ChildEnd::ThreadReturned(c) => Some(*c),
            _ => None,
        }
    }
}

impl fmt::Display for ChildEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildEnd::Process(ChildExit::Signaled {
                signal,
                core_dumped,
            }) => {
                write!(f, "killed by signal {signal} ({})", signal_name(*signal))?;
                if *core_dumped {
                    f.write_str(" (core dumped)")?;
                }
                Ok(())
            }
            ChildEnd::Process(exit) => write!(f, "{exit}"),
            ChildEnd::ThreadReturned(code) => write!(f, "thread returned with code {code}"),
            ChildEnd::ThreadPanicked(msg) => write!(f, "thread panicked: {msg}"),
        }
    }
}

/// `SIGKILL`, `SIGSEGV`, ... for the usual signals; `signal N` otherwise.
pub(crate) fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {signal}"),
    };
    name.to_owned()
}

/// `"sub_worker 1 (pid 1234)"` or `"sub_worker 1 (thread)"`.
pub(crate) fn who(label: &str, pid: &Option<i32>) -> String {
    match pid {
        Some(pid) => format!("{label} (pid {pid})"),
        None => format!("{label} (thread)"),
    }
}

/// Everything that can go wrong in this crate. Every variant says what failed and how
/// to fix it.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HostError {
    /// `Children::spawn` in process mode found other threads in this process.
    #[error(
        "refusing to fork: this process runs {count} other thread(s), and a fork in a \
         multi-threaded process can deadlock the child (a lock another thread held is \
         copied locked); create the worker before starting any thread, use \
         ExecMode::Threads, or opt in with SpawnOptions::allow_fork_with_threads = true"
    )]
    ThreadsRunning {
        /// Threads besides the caller.
        count: usize,
    },
    /// A shared-memory region was requested after the children started.
    #[error(
        "shared memory is frozen (the children have started): allocate shared tensors \
         before init() (region {label:?} of {bytes} bytes)"
    )]
    SharedMemoryFrozen {
        /// The region's label.
        label: String,
        /// Its requested size.
        bytes: usize,
    },
    /// A region of zero bytes was requested.
    #[error("shared-memory region {label:?} would be empty: regions need at least one byte")]
    EmptyRegion {
        /// The region's label.
        label: String,
    },
    /// The OS refused to create or map a shared-memory region.
    #[error("could not create shared-memory region {label:?} of {bytes} bytes: {source}; check available memory (memory cgroup, `ulimit -v`, vm.max_map_count)")]
    RegionCreate {
        /// The region's label.
        label: String,
        /// Its requested size.
        bytes: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A region id that names no region.
    #[error("shared-memory region {region} does not exist (this worker has {count} region(s), ids 1..={count}); pass a buffer from a SharedTensor of this worker")]
    UnknownRegion {
        /// The id given.
        region: u64,
        /// How many regions exist.
        count: usize,
    },
    /// A region whose owner released it (a dropped `SharedTensor`, a returned lease).
    #[error("shared-memory region {region} ({label}) was released: its SharedTensor was dropped (or its lease returned); keep the tensor alive while tasks use it")]
    RegionReleased {
        /// The region.
        region: u64,
        /// Its label.
        label: String,
    },
    /// A host-side access ([`crate::SharedTensor::to_vec`], [`crate::SharedTensor::write`])
    /// refused because tasks that name the tensor are in flight: copying now would race
    /// with them. Wait for the run (or runs) that use it, then try again.
    #[error("shared tensor in region {region} ({label}) is busy: {tasks} task(s) that name it are in flight; wait for their run before reading or writing it from the host")]
    Busy {
        /// The region.
        region: u64,
        /// Its label.
        label: String,
        /// Tasks in flight that name it.
        tasks: u32,
    },
    /// Memory handed to [`crate::SharedMemory::adopt_region`] that is not (all) mapped
    /// `MAP_SHARED` in this process.
    #[error("cannot adopt {label} as shared memory: {reason}")]
    NotShared {
        /// The label it was offered under.
        label: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A byte range that leaves its region.
    #[error("bytes [{offset}, {offset} + {len}) are outside shared-memory region {region} of {region_len} bytes")]
    OutOfBounds {
        /// The region.
        region: u64,
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// The region's size.
        region_len: usize,
    },
    /// A typed access with the wrong element type.
    #[error("element type mismatch: the tensor holds {tensor} elements, the access asked for {requested}")]
    DtypeMismatch {
        /// The tensor's element type.
        tensor: DataType,
        /// The requested element type.
        requested: DataType,
    },
    /// A copy whose length is not the tensor's element count.
    #[error("length mismatch: the tensor has {expected} elements but {got} were given")]
    LengthMismatch {
        /// The tensor's element count.
        expected: u64,
        /// The count given.
        got: usize,
    },
    /// Bad tensor geometry (shape, view, arguments).
    #[error("invalid tensor geometry: {0}")]
    Types(#[from] TypesError),
    /// A sub-worker callable registered twice under the same name.
    #[error("sub callable {name:?} ({id}) is registered already; register each name once (or use SubRegistry::register to replace it)")]
    DuplicateCallable {
        /// The name.
        name: String,
        /// Its digest.
        id: CallableId,
    },
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Os {
        /// What was called.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A mailbox operation failed.
    #[error("{what}: {source}")]
    Mailbox {
        /// What was being done.
        what: String,
        /// The mailbox error.
        #[source]
        source: MailboxError,
    },
    /// A child could not be started at all (fork or thread creation failed).
    #[error("could not start {label}: {reason}")]
    SpawnFailed {
        /// The child's label.
        label: String,
        /// Why.
        reason: String,
    },
    /// A child did not become ready: it reported `INIT_FAILED`, exited, or missed the
    /// startup deadline. Every child of the same spawn was shut down and reaped.
    #[error("{} failed during init: {reason}", who(.label, .pid))]
    StartupFailed {
        /// The child's label.
        label: String,
        /// Its pid (`None` for a thread).
        pid: Option<i32>,
        /// What happened: the child's message, its exit status, or the timeout.
        reason: String,
    },
    /// A child is gone.
    #[error("{} died: {exit}; its in-flight tasks are lost (shut the children down and start new ones)", who(.label, .pid))]
    ChildDied {
        /// The child's label.
        label: String,
        /// Its pid (`None` for a thread).
        pid: Option<i32>,
        /// How it ended.
        exit: ChildEnd,
    },
    /// A control command failed, timed out, or found its channel unusable.
    #[error("control command {command} on {label}: {source}")]
    Control {
        /// The child's label.
        label: String,
        /// The sub-command.
        command: u64,
        /// The mailbox error (e.g. `ControlFailed` with the child's message).
        #[source]
        source: MailboxError,
    },
    /// Children could not be reaped (still running after `SIGKILL`, or a thread that
    /// would not stop).
    #[error("could not reap {what}; {hint}")]
    Reap {
        /// Which children.
        what: String,
        /// What to do.
        hint: &'static str,
    },
    /// Children ended abnormally (signal, non-zero status, killed after the grace
    /// period); see `ShutdownReport::into_result`.
    #[error("children ended abnormally: {summary}")]
    AbnormalExit {
        /// One line per abnormal child.
        summary: String,
    },
}

impl HostError {
    pub(crate) fn mailbox(what: impl Into<String>, source: MailboxError) -> HostError {
        HostError::Mailbox {
            what: what.into(),
            source,
        }
    }
}
