//! E1 vector_add and its four ring configurations (E1b).

use crate::kernels::add_kernel;
use crate::support::{check_close, timed, Rng, WorkloadError, WorkloadReport};
use strata_chip::*;
use strata_types::{CallConfig, RingOverride};

struct E1 {
    chip: ChipWorker,
    orch: OrchHandle,
}

fn e1_chip(config: ChipConfig) -> Result<E1, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let add = chip.register_kernel_fn("vector_add", add_kernel(0))?;
    let orch = chip.register_orchestration(
        strata_types::CallableDescriptor::new(
            strata_types::CallableKind::ChipOrchestration,
            "vector_add_orchestration",
        )
        .with_signature(&[
            strata_types::ParamDirection::In,
            strata_types::ParamDirection::In,
            strata_types::ParamDirection::Out,
        ]),
        move |o: &mut ChipOrch, args: &ChipArgs| {
            let mut a = CoreArgs::new();
            a.input(&args.tensor(0)?)
                .input(&args.tensor(1)?)
                .output(&args.tensor(2)?);
            o.submit_aiv(add, &a)?;
            Ok(())
        },
    )?;
    chip.init()?;
    Ok(E1 { chip, orch })
}

fn e1_once(e: &mut E1, cfg: &CallConfig, rep: &mut WorkloadReport) -> Result<(), WorkloadError> {
    let mut rng = Rng::new(42);
    let a = rng.randn(128 * 128, 1.0);
    let b = rng.randn(128 * 128, 1.0);
    let mut out = vec![0f32; 128 * 128];
    let mut args = RunArgs::new();
    args.input(&a, &[128, 128])
        .input(&b, &[128, 128])
        .output(&mut out, &[128, 128]);
    timed(&mut e.chip, &e.orch, &mut args, cfg, rep)?;
    let golden: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    check_close("out", &out, &golden, 1e-5, 1e-5)
}

/// E1: one AIV task `out = a + b` over 128×128 f32 (randn, seed 42).
///
/// # Errors
/// A chip error or a mismatch.
pub fn e1_vector_add(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    let mut e = e1_chip(config)?;
    let mut rep = WorkloadReport::default();
    e1_once(&mut e, &CallConfig::default(), &mut rep)?;
    e.chip.close()?;
    Ok(rep)
}

/// The four ring configurations of E1b: `{window 16, heap 1 MiB, dep 64}`, `{128, 8 MiB,
/// 256}`, per-ring `{[128,64,32,16], [8,4,2,1] MiB, [256,128,64,64]}`, and defaults.
pub fn e1b_ring_configs() -> Vec<CallConfig> {
    let all = |w, h, d| {
        CallConfig::default().with_rings(
            RingOverride::default()
                .with_task_window(w)
                .with_heap_bytes(h)
                .with_dep_pool(d),
        )
    };
    let mut per_ring = CallConfig::default();
    for (i, r) in per_ring.rings.iter_mut().enumerate() {
        *r = RingOverride::default()
            .with_task_window([128, 64, 32, 16][i])
            .with_heap_bytes([8u64, 4, 2, 1][i] << 20)
            .with_dep_pool([256, 128, 64, 64][i]);
    }
    vec![
        all(16, 1 << 20, 64),
        all(128, 8 << 20, 256),
        per_ring,
        CallConfig::default(),
    ]
}

/// E1b: E1 under each of [`e1b_ring_configs`] on one chip.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e1b_ring_configs_run(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    let mut e = e1_chip(config)?;
    let mut rep = WorkloadReport::default();
    for cfg in e1b_ring_configs() {
        e1_once(&mut e, &cfg, &mut rep)?;
    }
    e.chip.close()?;
    Ok(rep)
}
