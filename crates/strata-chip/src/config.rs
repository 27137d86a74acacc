//! Chip configuration: cores, ring sizing, device memory, timeouts.

use crate::error::ChipError;
use std::time::Duration;
use strata_graph::RingConfig;
use strata_types::{CallConfig, RING_COUNT};

/// Most AIC (cube) cores a chip may have: the reference's 24 clusters.
pub const MAX_AIC_CORES: u32 = 24;
/// Most AIV (vector) cores a chip may have: two per cluster.
pub const MAX_AIV_CORES: u32 = 48;
/// The reference's per-ring task window default.
pub const REFERENCE_TASK_WINDOW: u64 = 16_384;
/// The reference's per-ring heap default (256 MiB). strata defaults to
/// [`DEFAULT_RING_HEAP_BYTES`] instead.
pub const REFERENCE_RING_HEAP_BYTES: u64 = 256 << 20;
/// strata's per-ring heap default on the emulator: 64 MiB (a quarter of the reference's;
/// the emulator runs on small machines). Pages are committed only when touched.
pub const DEFAULT_RING_HEAP_BYTES: u64 = 64 << 20;
/// The most device memory a chip (and so one ring heap) may have: 2^46 bytes.
pub const MAX_DEVICE_MEMORY_BYTES: u64 = 1 << 46;
/// The reference's per-ring dependency pool default.
pub const REFERENCE_DEP_POOL: u64 = 16_384;

const I31: u64 = (1 << 31) - 1;

/// The two kinds of emulated AICore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CoreType {
    /// A cube (matrix) core.
    Aic,
    /// A vector core.
    Aiv,
}

impl CoreType {
    /// `"AIC"` or `"AIV"`.
    pub fn name(self) -> &'static str {
        match self {
            CoreType::Aic => "AIC",
            CoreType::Aiv => "AIV",
        }
    }
}

/// Sizing of one scope-depth ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RingSizing {
    /// Task slots: a power of two in `[4, 2^31 − 1]` (at most `window − 1` live tasks).
    pub task_window: u64,
    /// Heap bytes for runtime-created tensors: at least 1024 (rounded up to a multiple of
    /// 1024).
    pub heap_bytes: u64,
    /// Dependency edges held by live tasks: in `[4, 2^31 − 1]`.
    pub dep_pool: u64,
}

impl Default for RingSizing {
    fn default() -> Self {
        RingSizing {
            task_window: REFERENCE_TASK_WINDOW,
            heap_bytes: DEFAULT_RING_HEAP_BYTES,
            dep_pool: REFERENCE_DEP_POOL,
        }
    }
}

impl RingSizing {
    /// Checks the sizing with the reference runtime's limits and messages.
    ///
    /// # Errors
    /// [`ChipError::InvalidConfig`] naming the ring, the field, the value and the range.
    pub fn validate(&self, ring: usize) -> Result<(), ChipError> {
        let bad = |m: String| Err(ChipError::InvalidConfig(m));
        if !self.task_window.is_power_of_two() || !(4..=I31).contains(&self.task_window) {
            return bad(format!(
                "ring {ring} task_window = {} (must be a power of two in [4, 2^31-1])",
                self.task_window
            ));
        }
        if self.heap_bytes > MAX_DEVICE_MEMORY_BYTES {
            return Err(ChipError::InvalidConfig(format!(
                "ring {ring} heap_bytes = {} (at most 2^46 = {MAX_DEVICE_MEMORY_BYTES}, the device memory limit)",
                self.heap_bytes
            )));
        }
        if self.heap_bytes < 1024 {
            return bad(format!(
                "ring {ring} heap_bytes = {} (must be >= 1024)",
                self.heap_bytes
            ));
        }
        if !(4..=I31).contains(&self.dep_pool) {
            return bad(format!(
                "ring {ring} dep_pool = {} (must be in [4, 2^31-1])",
                self.dep_pool
            ));
        }
        Ok(())
    }

    /// The heap size actually mapped: rounded up to a multiple of 1024 (saturating at the
    /// largest multiple of 1024 for a size [`RingSizing::validate`] refuses).
    pub fn heap_bytes_aligned(&self) -> u64 {
        self.heap_bytes
            .checked_next_multiple_of(1024)
            .unwrap_or(u64::MAX - 1023)
    }

    pub(crate) fn graph(&self) -> RingConfig {
        RingConfig {
            heap_bytes: self.heap_bytes_aligned(),
            task_window: Some(self.task_window),
            dep_pool: Some(self.dep_pool),
        }
    }
}

/// Configuration of a [`crate::ChipWorker`].
///
/// ```
/// use strata_chip::ChipConfig;
/// let mut c = ChipConfig::default();
/// assert_eq!((c.aic_cores, c.aiv_cores), (1, 2)); // one cluster
/// c.aiv_cores = 100;
/// assert!(c.validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChipConfig {
    /// AIC (cube) cores, `0..=24`. AIC core `i` heads cluster `i`.
    pub aic_cores: u32,
    /// AIV (vector) cores, `0..=48`. AIV core `j` is lane `j % 2` of cluster `j / 2`.
    pub aiv_cores: u32,
    /// Per-ring sizing (ring = scope depth clamped at 3). A run's
    /// [`CallConfig::rings`] overrides individual fields.
    pub rings: [RingSizing; RING_COUNT],
    /// Size of the device memory arena (virtual; pages are committed when touched).
    pub device_memory_bytes: u64,
    /// How long a dispatched kernel may run without finishing before it is declared stuck
    /// (SCHEDULER_TIMEOUT, 100). A run's [`CallConfig::timeout`] overrides it. The same
    /// budget bounds an orchestration that makes no progress.
    pub kernel_timeout: Duration,
    /// How long `get_tensor_data`/`set_tensor_data` wait for producers (TENSOR_WAIT_TIMEOUT, 8).
    pub tensor_wait_timeout: Duration,
    /// How long a submit waits for ring space (task window, heap, dependency pool) without
    /// any reclamation before failing with the ring's fatal code. Structural deadlocks
    /// (the space is held by a scope that is still open) fail at once.
    pub ring_wait_timeout: Duration,
    /// How long an idle core, the scheduler, the orchestrator thread between runs, and a
    /// caller of `run` waiting for its reply spin (yielding after a few µs) before they
    /// park. Back-to-back runs hand over within it at cache-line latency; an idle chip
    /// parks every thread once it has passed.
    pub idle_spin: Duration,
    /// The chip's worker id: device buffers are keyed in `KeySpace::Device(chip_id)`.
    pub chip_id: u32,
    /// Print each run's `[STRACE]` lines to stderr (otherwise a run only records its
    /// timestamps, and [`crate::RunReport::spans`] / [`crate::RunReport::strace`] build the
    /// spans when asked). Also enabled by the environment variable `STRATA_STRACE=1`, read
    /// when the chip is initialised.
    pub print_strace: bool,
    /// Which thread runs a chip orchestration: the chip's own orchestrator thread, or the
    /// thread that calls `run`. See [`OrchestratorPlacement`]; the default (`Auto`) is the
    /// orchestrator thread, except in a chip process of the level-3 engine.
    pub orchestrator: OrchestratorPlacement,
    /// Builds the run arenas (ring heaps in device memory, the graph's task windows and
    /// dependency pools) for this call configuration's ring sizing at `init`, so the first
    /// run with a matching sizing does not; see [`crate::ChipWorker::prewarm`].
    pub prewarm: Option<CallConfig>,
}

/// Which thread runs a chip orchestration (`ChipConfig::orchestrator`).
///
/// ```
/// use strata_chip::{ChipConfig, OrchestratorPlacement};
/// let c = ChipConfig::default();
/// assert_eq!(c.orchestrator, OrchestratorPlacement::Auto);
/// assert_eq!(c.orchestrator.resolve(false), OrchestratorPlacement::Thread);
/// assert_eq!(c.orchestrator.resolve(true), OrchestratorPlacement::Caller);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OrchestratorPlacement {
    /// `Thread` for a chip in the caller's process; `Caller` for a chip that a parent
    /// hosts in a process of its own and watches (the level-3 engine's chip children in
    /// `Process` mode resolve it so).
    #[default]
    Auto,
    /// The chip's own orchestrator thread (the AICPU orchestrator of the reference): `run`
    /// posts the request and waits for the reply. An orchestration that stops making
    /// progress fails its run with SCHEDULER_TIMEOUT and leaves the chip unusable, but
    /// `run` returns.
    Thread,
    /// The thread that calls `run`: no hand-off between threads, which saves about a
    /// context switch per run where cores are few (a one-task run round trip through the
    /// level-3 engine drops from ~4.8 µs to ~2 µs on the development machine). A stuck
    /// orchestration cannot be abandoned by the thread that runs it, so a watchdog thread
    /// ends the **process** — a line on stderr, then
    /// `_exit(`[`EXIT_ORCHESTRATION_STALLED`]`)` — once a run made no progress for its
    /// budget (twice the longest of the kernel, tensor-wait and ring-wait timeouts, plus
    /// a second). Use it only in a process whose parent watches it.
    Caller,
}

impl OrchestratorPlacement {
    /// The placement `Auto` stands for: `Caller` in a process hosted and watched by a
    /// parent (`hosted`), `Thread` otherwise. `Thread` and `Caller` stay as they are.
    pub fn resolve(self, hosted: bool) -> OrchestratorPlacement {
        match self {
            OrchestratorPlacement::Auto if hosted => OrchestratorPlacement::Caller,
            OrchestratorPlacement::Auto => OrchestratorPlacement::Thread,
            explicit => explicit,
        }
    }
}

/// The exit status of a process whose chip orchestration stalled under
/// [`OrchestratorPlacement::Caller`] (`EX_SOFTWARE`).
pub const EXIT_ORCHESTRATION_STALLED: i32 = 70;

impl Default for ChipConfig {
    fn default() -> Self {
        ChipConfig {
            aic_cores: 1,
            aiv_cores: 2,
            rings: [RingSizing::default(); RING_COUNT],
            device_memory_bytes: 4 << 30,
            kernel_timeout: Duration::from_secs(10),
            tensor_wait_timeout: Duration::from_secs(15),
            ring_wait_timeout: Duration::from_secs(5),
            idle_spin: Duration::from_micros(50),
            chip_id: 0,
            print_strace: false,
            orchestrator: OrchestratorPlacement::Auto,
            prewarm: None,
        }
    }
}

impl ChipConfig {
    /// A configuration with `clusters` full clusters (1 AIC + 2 AIV each).
    ///
    /// ```
    /// let c = strata_chip::ChipConfig::clusters(8);
    /// assert_eq!((c.aic_cores, c.aiv_cores), (8, 16));
    /// ```
    pub fn clusters(clusters: u32) -> Self {
        ChipConfig {
            aic_cores: clusters,
            aiv_cores: 2 * clusters,
            ..ChipConfig::default()
        }
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`ChipError::InvalidConfig`] naming the field, the value and the valid range.
    pub fn validate(&self) -> Result<(), ChipError> {
        let bad = |m: String| Err(ChipError::InvalidConfig(m));
        if self.aic_cores > MAX_AIC_CORES {
            return bad(format!(
                "aic_cores = {} (at most {MAX_AIC_CORES})",
                self.aic_cores
            ));
        }
        if self.aiv_cores > MAX_AIV_CORES {
            return bad(format!(
                "aiv_cores = {} (at most {MAX_AIV_CORES})",
                self.aiv_cores
            ));
        }
        if self.aic_cores + self.aiv_cores == 0 {
            return bad("aic_cores + aiv_cores = 0 (a chip needs at least one core)".into());
        }
        for (i, r) in self.rings.iter().enumerate() {
            r.validate(i)?;
        }
        // Each heap is at most 2^46 (validated above), so the sum of the four fits.
        let heaps: u64 = self.rings.iter().map(|r| r.heap_bytes_aligned()).sum();
        if self.device_memory_bytes < heaps {
            return bad(format!(
                "device_memory_bytes = {} is smaller than the ring heaps ({heaps} bytes)",
                self.device_memory_bytes
            ));
        }
        if usize::try_from(self.device_memory_bytes).is_err()
            || self.device_memory_bytes > MAX_DEVICE_MEMORY_BYTES
        {
            return bad(format!(
                "device_memory_bytes = {} (at most 2^46 = {MAX_DEVICE_MEMORY_BYTES})",
                self.device_memory_bytes
            ));
        }
        for (name, d) in [
            ("kernel_timeout", self.kernel_timeout),
            ("tensor_wait_timeout", self.tensor_wait_timeout),
            ("ring_wait_timeout", self.ring_wait_timeout),
        ] {
            if d.is_zero() {
                return bad(format!("{name} = 0 (must be positive)"));
            }
        }
        if let Some(p) = &self.prewarm {
            self.effective_rings(p)?;
        }
        Ok(())
    }

    /// Total cores.
    pub fn num_cores(&self) -> u32 {
        self.aic_cores + self.aiv_cores
    }

    /// The ring sizing of one run: this configuration with `call`'s overrides.
    ///
    /// # Errors
    /// [`ChipError::InvalidConfig`] with [`CallConfig::validate`]'s message.
    pub fn effective_rings(
        &self,
        call: &CallConfig,
    ) -> Result<[RingSizing; RING_COUNT], ChipError> {
        call.validate()
            .map_err(|e| ChipError::InvalidConfig(e.to_string()))?;
        let mut rings = self.rings;
        for (r, o) in rings.iter_mut().zip(call.rings.iter()) {
            r.task_window = o.task_window.unwrap_or(r.task_window);
            r.heap_bytes = o.heap_bytes.unwrap_or(r.heap_bytes);
            r.dep_pool = o.dep_pool.unwrap_or(r.dep_pool);
        }
        for (i, r) in rings.iter().enumerate() {
            r.validate(i)?;
        }
        Ok(rings)
    }
}

#[cfg(test)]
mod tests {
    use super::{ChipConfig, MAX_DEVICE_MEMORY_BYTES};

    #[test]
    fn a_ring_heap_past_the_device_memory_limit_is_refused_naming_the_limit() {
        for heap in [u64::MAX, u64::MAX - 1000, MAX_DEVICE_MEMORY_BYTES + 1] {
            let mut c = ChipConfig::default();
            c.rings[1].heap_bytes = heap;
            let err = c.validate().unwrap_err().to_string();
            assert!(
                err.contains("ring 1") && err.contains("2^46"),
                "heap {heap}: {err}"
            );
        }
    }
}
