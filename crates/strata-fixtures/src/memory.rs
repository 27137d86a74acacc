//! E1c: device-memory round trips and committed-memory accounting.

use crate::support::{WorkloadError, WorkloadReport};
use strata_chip::{ChipConfig, ChipWorker, CopyOffsets};

/// E1c: malloc / copy_to / copy_from / free round trips (4096, 65536, 12345 bytes of a
/// deterministic pattern), three distinct live allocations, 8× alloc/free churn, and the
/// committed-memory accounting.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e1c_malloc(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    chip.init()?;
    let base = chip.committed_device_memory()?;
    let sizes = [4096usize, 65536, 12345];
    let mut ptrs = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let p = chip.malloc(n as u64)?;
        let after = chip.committed_device_memory()?;
        if after < base + n as u64 {
            return Err(WorkloadError::Mismatch {
                tensor: "committed_device_memory".into(),
                index: k,
                got: after as f64,
                want: (base + n as u64) as f64,
            });
        }
        let pattern: Vec<u8> = (0..n).map(|i| ((i * 7 + k * 13) % 251) as u8).collect();
        chip.copy_to(p, &pattern, n, CopyOffsets::default())?;
        let mut back = vec![0u8; n];
        chip.copy_from(&mut back, p, n, CopyOffsets::default())?;
        if let Some(i) = back.iter().zip(&pattern).position(|(a, b)| a != b) {
            return Err(WorkloadError::Mismatch {
                tensor: format!("round trip of {n} bytes"),
                index: i,
                got: back[i] as f64,
                want: pattern[i] as f64,
            });
        }
        ptrs.push(p);
    }
    for i in 0..ptrs.len() {
        for j in i + 1..ptrs.len() {
            if ptrs[i].addr() == ptrs[j].addr() {
                return Err(WorkloadError::Mismatch {
                    tensor: "distinct allocations".into(),
                    index: j,
                    got: ptrs[j].addr() as f64,
                    want: -1.0,
                });
            }
        }
    }
    for p in ptrs {
        let before = chip.committed_device_memory()?;
        chip.free(p)?;
        if chip.committed_device_memory()? >= before {
            return Err(WorkloadError::Mismatch {
                tensor: "committed after free".into(),
                index: 0,
                got: chip.committed_device_memory()? as f64,
                want: before as f64,
            });
        }
    }
    for round in 0..8 {
        let p = chip.malloc(65536)?;
        chip.copy_to(
            p,
            &[round as u8; 64],
            64,
            CopyOffsets {
                device: 1000,
                host: 0,
            },
        )?;
        chip.free(p)?;
    }
    if chip.committed_device_memory()? != base {
        return Err(WorkloadError::Mismatch {
            tensor: "committed after churn".into(),
            index: 0,
            got: chip.committed_device_memory()? as f64,
            want: base as f64,
        });
    }
    chip.close()?;
    Ok(WorkloadReport::default())
}
