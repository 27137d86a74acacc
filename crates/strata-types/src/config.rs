//! Per-call configuration.

use crate::error::TypesError;
use std::time::Duration;

/// Number of scope-depth rings (depth ≥ 3 shares the last one).
pub const RING_COUNT: usize = 4;

/// Per-ring overrides of a chip's ring sizing for one call; `None` keeps the worker's
/// configured value.
///
/// ```
/// use strata_types::RingOverride;
/// let r = RingOverride::default().with_task_window(64).with_heap_bytes(1 << 20);
/// assert_eq!((r.task_window, r.heap_bytes, r.dep_pool), (Some(64), Some(1 << 20), None));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct RingOverride {
    /// Task window (slots): a power of two in `[4, 2^31 − 1]`.
    pub task_window: Option<u64>,
    /// Heap bytes: at least 1024.
    pub heap_bytes: Option<u64>,
    /// Dependency pool (edges): in `[4, 2^31 − 1]`.
    pub dep_pool: Option<u64>,
}

impl RingOverride {
    /// The same override with the task window set.
    #[must_use]
    pub fn with_task_window(mut self, slots: u64) -> Self {
        self.task_window = Some(slots);
        self
    }

    /// The same override with the heap size set.
    #[must_use]
    pub fn with_heap_bytes(mut self, bytes: u64) -> Self {
        self.heap_bytes = Some(bytes);
        self
    }

    /// The same override with the dependency pool set.
    #[must_use]
    pub fn with_dep_pool(mut self, edges: u64) -> Self {
        self.dep_pool = Some(edges);
        self
    }
}

/// Largest byte length of [`CallConfig::output_prefix`].
pub const OUTPUT_PREFIX_MAX: usize = 1023;

/// Largest [`CallConfig::timeout`] (about 584 million years): the wire carries a timeout
/// as a `u64` count of milliseconds.
pub const MAX_CALL_TIMEOUT: Duration = Duration::from_millis(u64::MAX);

/// Configuration of one call (one run of an orchestration). `None` (the default of every
/// optional field) means "the worker's configured value".
///
/// ```
/// use std::time::Duration;
/// use strata_types::{CallConfig, RingOverride};
/// let mut c = CallConfig::default()
///     .with_timeout(Duration::from_secs(2))
///     .with_ring(1, RingOverride { task_window: Some(64), heap_bytes: Some(1 << 20), dep_pool: Some(256) });
/// c.validate().unwrap();
/// c.rings[2].task_window = Some(100); // not a power of two
/// assert!(c.validate().unwrap_err().to_string().contains("ring 2 task_window = 100"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct CallConfig {
    /// AICPU threads for a chip run: `None` chooses automatically, else 2..=4 (one
    /// orchestrator plus one to three schedulers).
    pub aicpu_threads: Option<u32>,
    /// Clusters a chip run may use: `None` for all, else at least 1.
    pub block_dim: Option<u32>,
    /// Whether a chip run collects its swimlane (per-task core records). At level 3 and
    /// up it implies [`CallConfig::trace`]: the records travel back with the spans.
    pub swimlane: bool,
    /// Whether the call is traced at every level: each level records its spans (level 3
    /// and up: submit, schedule, dispatch, wait; chips: their `[STRACE]` spans) and every
    /// child sends its trace to its parent with the task's completion, so the call yields
    /// one trace of every process (see `docs/tracing.md`). Off, nothing is recorded or
    /// sent beyond what a level-2 run always keeps (a few timestamps).
    pub trace: bool,
    /// Per-ring sizing overrides for chip runs.
    pub rings: [RingOverride; RING_COUNT],
    /// Run deadline: `None` for the worker's default, else a positive duration of at most
    /// [`MAX_CALL_TIMEOUT`]. Across a process boundary it travels in whole milliseconds,
    /// rounded up (so a sub-millisecond deadline stays a deadline).
    pub timeout: Option<Duration>,
    /// Directory prefix for diagnostic output files, if any.
    pub output_prefix: Option<String>,
}

impl CallConfig {
    /// The same configuration with a run deadline.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The same configuration with a number of AICPU threads (2..=4).
    #[must_use]
    pub fn with_aicpu_threads(mut self, threads: u32) -> Self {
        self.aicpu_threads = Some(threads);
        self
    }

    /// The same configuration limited to `clusters` clusters.
    #[must_use]
    pub fn with_block_dim(mut self, clusters: u32) -> Self {
        self.block_dim = Some(clusters);
        self
    }

    /// The same configuration with swimlane collection on or off.
    #[must_use]
    pub fn with_swimlane(mut self, on: bool) -> Self {
        self.swimlane = on;
        self
    }

    /// The same configuration with tracing at every level on or off
    /// ([`CallConfig::trace`]).
    #[must_use]
    pub fn with_trace(mut self, on: bool) -> Self {
        self.trace = on;
        self
    }

    /// Whether children send their trace back: [`CallConfig::trace`] or
    /// [`CallConfig::swimlane`].
    pub fn traced(&self) -> bool {
        self.trace || self.swimlane
    }

    /// The same configuration with ring `ring`'s overrides replaced. Rings are
    /// `0..RING_COUNT` by scope depth and depths ≥ 3 share the last one, so an index past
    /// it addresses the last ring.
    #[must_use]
    pub fn with_ring(mut self, ring: usize, overrides: RingOverride) -> Self {
        self.rings[ring.min(RING_COUNT - 1)] = overrides;
        self
    }

    /// The same configuration with every ring's overrides set to `overrides`.
    #[must_use]
    pub fn with_rings(mut self, overrides: RingOverride) -> Self {
        self.rings = [overrides; RING_COUNT];
        self
    }

    /// The same configuration with a diagnostic output prefix.
    #[must_use]
    pub fn with_output_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.output_prefix = Some(prefix.into());
        self
    }

    /// The timeout in whole milliseconds as the wire carries it: 0 for `None`, else the
    /// duration rounded up to the next millisecond.
    ///
    /// # Errors
    /// [`TypesError::InvalidConfig`] for a zero timeout or one past [`MAX_CALL_TIMEOUT`].
    pub fn timeout_ms(&self) -> Result<u64, TypesError> {
        let Some(t) = self.timeout else {
            return Ok(0);
        };
        if t.is_zero() {
            return Err(TypesError::InvalidConfig(
                "timeout = 0ns (must be positive; use None for the worker's default)".into(),
            ));
        }
        u64::try_from(t.as_nanos().div_ceil(1_000_000)).map_err(|_| {
            TypesError::InvalidConfig(format!(
                "timeout = {t:?} (at most {} ms, the largest timeout the wire carries; use None for the worker's default)",
                u64::MAX
            ))
        })
    }

    /// Checks every field against its documented range.
    ///
    /// # Errors
    /// [`TypesError::InvalidConfig`] naming the field, the value and the valid range.
    pub fn validate(&self) -> Result<(), TypesError> {
        let bad = |m: String| Err(TypesError::InvalidConfig(m));
        if let Some(n) = self.aicpu_threads {
            if !(2..=4).contains(&n) {
                return bad(format!(
                    "aicpu_threads = {n} (use None for automatic, or 2..=4)"
                ));
            }
        }
        if self.block_dim == Some(0) {
            return bad("block_dim = 0 (use None for all clusters, or at least 1)".into());
        }
        const I31: u64 = (1 << 31) - 1;
        for (i, r) in self.rings.iter().enumerate() {
            if let Some(w) = r.task_window {
                if !w.is_power_of_two() || !(4..=I31).contains(&w) {
                    return bad(format!(
                        "ring {i} task_window = {w} (must be a power of two in [4, 2^31-1], or None for the default)"
                    ));
                }
            }
            if let Some(h) = r.heap_bytes {
                if h < 1024 {
                    return bad(format!(
                        "ring {i} heap_bytes = {h} (must be >= 1024, or None for the default)"
                    ));
                }
            }
            if let Some(d) = r.dep_pool {
                if !(4..=I31).contains(&d) {
                    return bad(format!(
                        "ring {i} dep_pool = {d} (must be in [4, 2^31-1], or None for the default)"
                    ));
                }
            }
        }
        self.timeout_ms()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_round_up_to_whole_milliseconds_and_refuse_zero_and_overflow() {
        let ms = |t: Duration| CallConfig::default().with_timeout(t).timeout_ms();
        assert_eq!(CallConfig::default().timeout_ms(), Ok(0));
        assert_eq!(ms(Duration::from_nanos(1)), Ok(1));
        assert_eq!(ms(Duration::from_micros(1500)), Ok(2));
        assert_eq!(ms(Duration::from_millis(7)), Ok(7));
        assert_eq!(ms(MAX_CALL_TIMEOUT), Ok(u64::MAX));
        let zero = ms(Duration::ZERO).unwrap_err().to_string();
        assert!(zero.contains("timeout = 0ns"), "{zero}");
        let e = ms(MAX_CALL_TIMEOUT + Duration::from_nanos(1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("timeout = ") && e.contains(&u64::MAX.to_string()),
            "{e}"
        );
        assert!(CallConfig::default()
            .with_timeout(Duration::MAX)
            .validate()
            .is_err());
    }

    #[test]
    fn every_field_is_checked_and_named() {
        let named = |c: CallConfig, what: &str| {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        };
        named(
            CallConfig::default().with_aicpu_threads(1),
            "aicpu_threads = 1",
        );
        named(CallConfig::default().with_block_dim(0), "block_dim = 0");
        named(
            CallConfig::default().with_rings(RingOverride::default().with_heap_bytes(10)),
            "ring 0 heap_bytes = 10",
        );
        named(
            CallConfig::default().with_ring(3, RingOverride::default().with_dep_pool(2)),
            "ring 3 dep_pool = 2",
        );
        named(
            CallConfig::default().with_output_prefix(""),
            "output_prefix",
        );
        let ok = CallConfig::default()
            .with_aicpu_threads(4)
            .with_block_dim(2)
            .with_swimlane(true)
            .with_output_prefix("/tmp/x");
        ok.validate().unwrap();
    }
}
