//! What every workload shares: its error, its report, a deterministic RNG, the
//! element-wise comparison against a golden, and a timed run.

use std::time::{Duration, Instant};
use strata_chip::{ChipError, ChipWorker, OrchHandle, RunArgs, RunReport};
use strata_types::CallConfig;

/// A workload that did not produce its golden, or whose chip failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The chip reported an error.
    #[error(transparent)]
    Chip(#[from] ChipError),
    /// A value differs from the host golden.
    #[error("{tensor}[{index}] = {got}, expected {want}")]
    Mismatch {
        /// Which tensor.
        tensor: String,
        /// Flat index.
        index: usize,
        /// The emulator's value.
        got: f64,
        /// The golden.
        want: f64,
    },
    /// A run that should have failed with a fatal code did something else.
    #[error("{case}: expected code {want}, got {got}")]
    WrongCode {
        /// The case.
        case: &'static str,
        /// Expected code.
        want: i32,
        /// What happened.
        got: String,
    },
}

/// What a workload did.
#[derive(Debug, Clone, Default)]
pub struct WorkloadReport {
    /// Runs executed.
    pub runs: u32,
    /// Tasks submitted over all runs.
    pub tasks: u64,
    /// Wall time of the runs.
    pub elapsed: Duration,
    /// The last run's report.
    pub last: Option<RunReport>,
}

impl WorkloadReport {
    fn add(&mut self, r: RunReport, t: Duration) {
        self.runs += 1;
        self.tasks += r.tasks;
        self.elapsed += t;
        self.last = Some(r);
    }
}

/// A deterministic generator of normally distributed f32 (splitmix64 + Box–Muller), so
/// goldens do not depend on an RNG crate.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator with a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// `n` samples of a standard normal distribution, scaled.
    pub fn randn(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (u, v) = (self.uniform(), self.uniform());
                ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32 * scale
            })
            .collect()
    }
}

/// Compares `got` with `want` element-wise (`|g − w| ≤ atol + rtol·|w|`).
///
/// # Errors
/// [`WorkloadError::Mismatch`] at the first difference.
pub fn check_close(
    tensor: &str,
    got: &[f32],
    want: &[f32],
    rtol: f32,
    atol: f32,
) -> Result<(), WorkloadError> {
    if got.len() != want.len() {
        return Err(WorkloadError::Mismatch {
            tensor: format!("{tensor} (length)"),
            index: got.len(),
            got: got.len() as f64,
            want: want.len() as f64,
        });
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let close = (g - w).abs() <= atol + rtol * w.abs();
        if !close {
            return Err(WorkloadError::Mismatch {
                tensor: tensor.into(),
                index: i,
                got: g as f64,
                want: w as f64,
            });
        }
    }
    Ok(())
}

/// One run of `orch`, its report and wall time added to `rep`.
pub(crate) fn timed(
    chip: &mut ChipWorker,
    orch: &OrchHandle,
    args: &mut RunArgs<'_>,
    cfg: &CallConfig,
    rep: &mut WorkloadReport,
) -> Result<(), WorkloadError> {
    let t = Instant::now();
    let r = chip.run(orch, args, cfg)?;
    rep.add(r, t.elapsed());
    Ok(())
}
