//! Worker configuration.

use crate::error::DistError;
use std::time::Duration;
use strata_chip::ChipConfig;
use strata_host::ExecMode;

/// The level of a worker in the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// A host driving chips and sub-workers.
    L3,
    /// A worker whose next-level children are level-3 workers.
    L4,
}

impl Level {
    /// The level number (3 or 4).
    pub fn number(self) -> u8 {
        match self {
            Level::L3 => 3,
            Level::L4 => 4,
        }
    }
}

/// Configuration of a [`crate::DistWorker`].
///
/// ```
/// use strata_dist::{DistConfig, Level};
/// use strata_chip::ChipConfig;
/// let c = DistConfig::l3(vec![ChipConfig::default(); 2], 1);
/// assert_eq!(c.level, Level::L3);
/// c.validate().unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct DistConfig {
    /// Level 3 (chips + sub-workers) or 4 (level-3 children added with `add_worker`).
    pub level: Level,
    /// One chip child per entry (level 3 only): next-level worker ids `0..chips.len()`.
    pub chips: Vec<ChipConfig>,
    /// Host sub-worker children.
    pub num_sub_workers: usize,
    /// Children as forked processes (default) or as threads of this process.
    pub exec_mode: ExecMode,
    /// Allow forking while this process runs other threads (forking a multi-threaded
    /// process can deadlock the child if another thread held a lock; only opt in if you
    /// know the other threads hold none).
    pub allow_fork_with_threads: bool,
    /// Bytes of each of the four heap rings that back `Orch::alloc` (shared memory,
    /// committed lazily).
    pub heap_ring_bytes: u64,
    /// Bound on the whole tree's startup.
    pub startup_timeout: Duration,
    /// How long `close` waits for children to exit before killing them. A grace too large
    /// for an `Instant` (e.g. `Duration::MAX`) is clamped to a century.
    pub close_grace: Duration,
    /// How long a control request (`alloc_child_tensor`, `free`, `copy_to`, `copy_from`,
    /// `committed_device_memory`) waits for the child's reply once the child is idle. A
    /// child that misses it is declared unresponsive: the request fails naming it, the
    /// child is killed (`SIGKILL`, which also ends a stopped process) and the worker
    /// becomes unusable. Too large for an `Instant`: no deadline.
    pub control_timeout: Duration,
    /// The deadline of a task on a sub-worker or a next-level level-3 worker, from its
    /// dispatch, when its [`strata_types::CallConfig::timeout`] is `None`; a call's
    /// `timeout` replaces it for those tasks. On a chip, `timeout` bounds each
    /// kernel (the chip enforces it) and this is the backstop for the whole chip task. A
    /// task past its deadline fails with a timeout naming the child
    /// ([`strata_graph::FailureKind::Timeout`]), its dependents are poisoned, and the
    /// child is killed (a thread child is abandoned) so the worker can close; the worker
    /// becomes unusable. Too large for an `Instant`: no deadline.
    pub task_timeout: Duration,
    /// Runs in flight at once (1 or 2).
    pub pipeline_depth: usize,
    /// Bytes of the comm arena the chips' window buffers are carved from (level 3 with
    /// chips; shared memory created at `init`, committed lazily). A window buffer of `b`
    /// bytes over `n` ranks takes about `n × b`.
    pub comm_arena_bytes: u64,
    /// How long a kernel's signal wait (and so a collective) waits for a peer before it
    /// fails naming the rank and the cell: a dead or absent peer ends a run, never hangs
    /// it. Keep it below the chips' kernel timeout.
    pub comm_wait_timeout: Duration,
    /// Whether window buffers live for one run (default) or are kept across runs.
    pub windows: WindowLifetime,
    /// Bytes of shared memory (created at `init`, committed lazily, used in two halves)
    /// through which copies between ordinary host memory and chip tensors travel
    /// ([`crate::DistWorker::copy_bytes_to`]); 0: no staging (such copies must use a
    /// shared tensor or an adopted mapping). An even number of bytes, at most 1 GiB.
    pub staging_bytes: u64,
}

/// [`DistConfig::control_timeout`]'s default: 30 s (a control request moves at most one
/// copy chunk, which takes milliseconds).
pub const DEFAULT_CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// [`DistConfig::task_timeout`]'s default: 10 minutes.
pub const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(600);

/// [`DistConfig::staging_bytes`]'s default: 8 MiB (two 4 MiB halves, enough to keep a
/// copy's two processes busy at memory speed).
pub const DEFAULT_STAGING_BYTES: u64 = 8 << 20;

/// How long window buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WindowLifetime {
    /// Allocated in a run, freed after it (the next window-using run reuses the memory).
    #[default]
    PerRun,
    /// Kept across runs: the `k`-th window buffer a run allocates is the `k`-th of the
    /// first run again (same domain and size), optionally zero-filled before each run.
    Persistent {
        /// Zero-fill the kept buffers at the start of each later run.
        zero_between_runs: bool,
    },
}

impl DistConfig {
    /// A level-3 worker with these chips and `num_sub_workers` sub-workers.
    pub fn l3(chips: Vec<ChipConfig>, num_sub_workers: usize) -> Self {
        DistConfig {
            level: Level::L3,
            chips,
            num_sub_workers,
            exec_mode: ExecMode::Process,
            allow_fork_with_threads: false,
            heap_ring_bytes: 64 << 20,
            startup_timeout: Duration::from_secs(120),
            close_grace: Duration::from_secs(10),
            control_timeout: DEFAULT_CONTROL_TIMEOUT,
            task_timeout: DEFAULT_TASK_TIMEOUT,
            pipeline_depth: 2,
            comm_arena_bytes: 256 << 20,
            comm_wait_timeout: Duration::from_secs(5),
            windows: WindowLifetime::PerRun,
            staging_bytes: DEFAULT_STAGING_BYTES,
        }
    }

    /// A level-4 worker with `num_sub_workers` sub-workers; add level-3 children with
    /// `add_worker`.
    pub fn l4(num_sub_workers: usize) -> Self {
        DistConfig {
            level: Level::L4,
            ..DistConfig::l3(Vec::new(), num_sub_workers)
        }
    }

    /// Sets how long window buffers live.
    pub fn with_windows(mut self, windows: WindowLifetime) -> Self {
        self.windows = windows;
        self
    }

    /// Sets the execution mode.
    pub fn with_exec_mode(mut self, mode: ExecMode) -> Self {
        self.exec_mode = mode;
        self
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`DistError::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<(), DistError> {
        if self.level == Level::L4 && !self.chips.is_empty() {
            return Err(DistError::InvalidConfig(
                "chips (device_ids) are only supported on level-3 workers; give them to the level-3 children"
                    .into(),
            ));
        }
        for (i, c) in self.chips.iter().enumerate() {
            c.validate()
                .map_err(|e| DistError::InvalidConfig(format!("chip {i}: {e}")))?;
        }
        if !(1..=2).contains(&self.pipeline_depth) {
            return Err(DistError::InvalidConfig(format!(
                "pipeline_depth = {} (must be 1 or 2)",
                self.pipeline_depth
            )));
        }
        if self.heap_ring_bytes % 1024 != 0 || self.heap_ring_bytes == 0 {
            return Err(DistError::InvalidConfig(format!(
                "heap_ring_bytes = {} (must be a positive multiple of 1024)",
                self.heap_ring_bytes
            )));
        }
        for (name, d) in [
            ("startup_timeout", self.startup_timeout),
            ("control_timeout", self.control_timeout),
            ("task_timeout", self.task_timeout),
        ] {
            if d.is_zero() {
                return Err(DistError::InvalidConfig(format!("{name} must be positive")));
            }
        }
        if self.heap_ring_bytes > strata_chip::MAX_DEVICE_MEMORY_BYTES {
            return Err(DistError::InvalidConfig(format!(
                "heap_ring_bytes = {} (at most 2^46 = {})",
                self.heap_ring_bytes,
                strata_chip::MAX_DEVICE_MEMORY_BYTES
            )));
        }
        let min_arena = strata_comm::layout::MIN_ARENA_BYTES as u64;
        if self.comm_arena_bytes < min_arena || self.comm_arena_bytes % 4096 != 0 {
            return Err(DistError::InvalidConfig(format!(
                "comm_arena_bytes = {} (must be a multiple of 4096 and at least {min_arena}: the header and domain table need {} bytes)",
                self.comm_arena_bytes,
                strata_comm::layout::DATA_OFFSET
            )));
        }
        if self.staging_bytes % 2 != 0 || self.staging_bytes > 1 << 30 {
            return Err(DistError::InvalidConfig(format!(
                "staging_bytes = {} (must be even and at most 1 GiB = {}; 0 disables staging)",
                self.staging_bytes,
                1u64 << 30
            )));
        }
        if self.comm_wait_timeout.is_zero() {
            return Err(DistError::InvalidConfig(
                "comm_wait_timeout must be positive".into(),
            ));
        }
        if self.chips.len() > strata_comm::layout::MAX_RANKS {
            return Err(DistError::InvalidConfig(format!(
                "{} chips: a level-3 worker has at most {} (the comm arena's rank limit)",
                self.chips.len(),
                strata_comm::layout::MAX_RANKS
            )));
        }
        Ok(())
    }
}
