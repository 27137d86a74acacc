//! Per-call configuration.

use crate::error::TypesError;

/// Number of scope-depth rings (depth ≥ 3 shares the last one).
pub const RING_COUNT: usize = 4;

/// Per-ring overrides of a chip's ring sizing for one call. Zero means "use the worker's
/// configured value".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct RingOverride {
    /// Task window (slots): a power of two in `[4, 2^31 − 1]`.
    pub task_window: u64,
    /// Heap bytes: at least 1024.
    pub heap_bytes: u64,
    /// Dependency pool (edges): in `[4, 2^31 − 1]`.
    pub dep_pool: u64,
}

/// Largest byte length of [`CallConfig::output_prefix`].
pub const OUTPUT_PREFIX_MAX: usize = 1023;

/// Configuration of one call (one run of an orchestration).
///
/// ```
/// use strata_types::{CallConfig, RingOverride};
/// let mut c = CallConfig::default();
/// c.rings[1] = RingOverride { task_window: 64, heap_bytes: 1 << 20, dep_pool: 256 };
/// c.validate().unwrap();
/// c.rings[2].task_window = 100; // not a power of two
/// assert!(c.validate().unwrap_err().to_string().contains("ring 2"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct CallConfig {
    /// AICPU threads for a chip run (0 = automatic, else 2..=4: one orchestrator plus
    /// one to three schedulers).
    pub aicpu_thread_num: u32,
    /// Clusters a chip run may use (0 = all).
    pub block_dim: u32,
    /// Chip swimlane collection level (0 = off, 1 = per-task core records).
    pub swimlane: u8,
    /// Per-ring sizing overrides for chip runs.
    pub rings: [RingOverride; RING_COUNT],
    /// Run deadline in milliseconds (0 = the worker's default).
    pub timeout_ms: u64,
    /// Directory prefix for diagnostic output files, if any.
    pub output_prefix: Option<String>,
}

impl CallConfig {
    /// Checks every field against its documented range.
    ///
    /// # Errors
    /// [`TypesError::InvalidConfig`] naming the field, the value and the valid range.
    pub fn validate(&self) -> Result<(), TypesError> {
        let bad = |m: String| Err(TypesError::InvalidConfig(m));
        if self.aicpu_thread_num != 0 && !(2..=4).contains(&self.aicpu_thread_num) {
            return bad(format!(
                "aicpu_thread_num = {} (use 0 for automatic, or 2..=4)",
                self.aicpu_thread_num
            ));
        }
        if self.swimlane > 1 {
            return bad(format!("swimlane = {} (use 0 or 1)", self.swimlane));
        }
        const I31: u64 = (1 << 31) - 1;
        for (i, r) in self.rings.iter().enumerate() {
            if r.task_window != 0
                && (!r.task_window.is_power_of_two() || !(4..=I31).contains(&r.task_window))
            {
                return bad(format!(
                    "ring {i} task_window = {} (must be a power of two in [4, 2^31-1], or 0 for the default)",
                    r.task_window
                ));
            }
            if r.heap_bytes != 0 && r.heap_bytes < 1024 {
                return bad(format!(
                    "ring {i} heap_bytes = {} (must be >= 1024, or 0 for the default)",
                    r.heap_bytes
                ));
            }
            if r.dep_pool != 0 && !(4..=I31).contains(&r.dep_pool) {
                return bad(format!(
                    "ring {i} dep_pool = {} (must be in [4, 2^31-1], or 0 for the default)",
                    r.dep_pool
                ));
            }
        }
        if let Some(p) = &self.output_prefix {
            if p.is_empty() || p.len() > OUTPUT_PREFIX_MAX || p.contains('\0') {
                return bad(format!(
                    "output_prefix must be 1..={OUTPUT_PREFIX_MAX} bytes without NUL (got {} bytes)",
                    p.len()
                ));
            }
        }
        Ok(())
    }
}
