//! The CPU an idle chip uses.

use crate::support::WorkloadError;
use std::time::Duration;
use strata_chip::{ChipConfig, ChipWorker};

/// The CPU time (user + system) the threads of an initialised, idle chip consumed during
/// `idle` — about zero when its threads park. Only the chip's own threads are counted (by
/// thread name, `chip<id>-…`), so other threads of the process do not disturb it.
///
/// # Errors
/// A chip error.
pub fn idle_cpu(config: ChipConfig, idle: Duration) -> Result<Duration, WorkloadError> {
    let prefix = format!("chip{}-", config.chip_id);
    let mut chip = ChipWorker::new(config)?;
    chip.init()?;
    std::thread::sleep(Duration::from_millis(50)); // let the threads park
    let before = strata_testkit::threads_cpu_ns(&prefix);
    std::thread::sleep(idle);
    let used = strata_testkit::threads_cpu_ns(&prefix).saturating_sub(before);
    chip.close()?;
    Ok(Duration::from_nanos(used))
}
