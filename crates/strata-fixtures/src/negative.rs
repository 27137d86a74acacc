//! The negative suite: runs that must fail with the reference runtime's fatal codes, as a
//! table ([`NEGATIVE_CASES`]: one row per case — its orchestration, its call
//! configuration and arguments, the code and the words its error must carry) run by one
//! loop on one chip, which must stay usable after every case.

use crate::kernels::add_kernel;
use crate::support::{check_close, WorkloadError};
use std::time::Duration;
use strata_chip::*;
use strata_types::{CallConfig, CallbackResult, DataType, RingOverride};

/// Elements of each host tensor a case runs with.
const LEN: u64 = 128;

/// The kernels a case's orchestration may submit, registered once for the suite.
#[derive(Debug, Clone, Copy)]
pub struct CaseKernels {
    /// `out = a + b` over args 0, 1 (inputs) and 2 (output).
    pub add: KernelHandle,
    /// Runs until cancelled, then fails.
    pub hang: KernelHandle,
    /// Fails at once with a "deliberate failure".
    pub fail: KernelHandle,
}

/// The host tensors a case runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseArgs {
    /// No arguments.
    None,
    /// `x`: 128 f32 of 1.0, INOUT.
    X,
    /// `x` as above, then `y`: 128 f32 of 0.0, INOUT.
    XY,
}

/// One row of the negative suite.
#[derive(Debug, Clone, Copy)]
pub struct NegativeCase {
    /// Case name (as in the reference's `runtime_fatal_codes`).
    pub name: &'static str,
    /// The chip orchestration the case runs.
    pub orchestration: fn(&mut ChipOrch, &ChipArgs, CaseKernels) -> CallbackResult,
    /// The call configuration of its run.
    pub call: fn() -> CallConfig,
    /// Its host arguments.
    pub args: CaseArgs,
    /// The fatal code the run must fail with ([`codes`]).
    pub code: i32,
    /// Words the error message must contain (what the code alone does not say).
    pub mentions: &'static [&'static str],
}

/// What one case produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegativeOutcome {
    /// Case name.
    pub name: &'static str,
    /// The fatal code (the expected one: a case with another code fails the suite).
    pub code: i32,
    /// The run's error message.
    pub error: String,
}

/// Every ring with the same override.
fn rings(ring: RingOverride) -> CallConfig {
    CallConfig::default().with_rings(ring)
}

fn timeout(ms: u64) -> CallConfig {
    CallConfig::default().with_timeout(Duration::from_millis(ms))
}

fn out16() -> TensorCreateInfo {
    TensorCreateInfo::new(DataType::F32, &[16])
}

/// Eight live outputs in a task window of four, none retired before the scope ends.
fn scope_deadlock(o: &mut ChipOrch, _: &ChipArgs, _: CaseKernels) -> CallbackResult {
    for _ in 0..8 {
        o.submit_dummy(CoreArgs::new().output_new(out16()))?;
    }
    Ok(())
}

/// One output larger than a 1 KiB heap ring.
fn heap_ring_deadlock(o: &mut ChipOrch, _: &ChipArgs, _: CaseKernels) -> CallbackResult {
    o.submit_dummy(CoreArgs::new().output_new(TensorCreateInfo::new(DataType::F32, &[8192])))?;
    Ok(())
}

/// Nested scopes that keep more tasks live than the window holds.
fn flow_control_deadlock(o: &mut ChipOrch, _: &ChipArgs, _: CaseKernels) -> CallbackResult {
    for _ in 0..8 {
        o.scope_begin()?;
        for _ in 0..3 {
            o.submit_dummy(CoreArgs::new().output_new(out16()))?;
        }
    }
    Ok(())
}

/// A reader of 128 live producers against a dependency pool of four.
fn dep_pool_overflow(o: &mut ChipOrch, args: &ChipArgs, _: CaseKernels) -> CallbackResult {
    let x = args.tensor(0)?;
    for i in 0..LEN {
        // Producers that own a created tensor stay live (retained by the scope).
        o.submit_dummy(
            CoreArgs::new()
                .output(&x.slice(0, i, i + 1)?)
                .output_new(out16()),
        )?;
    }
    o.submit_dummy(CoreArgs::new().input(&x))?;
    Ok(())
}

fn invalid_args(o: &mut ChipOrch, _: &ChipArgs, _: CaseKernels) -> CallbackResult {
    o.submit_dummy(CoreArgs::new().set_dependencies(&[ChipTaskId::INVALID; 4]))?;
    Ok(())
}

/// More blocks started together than the chip has cores.
fn require_sync_start_invalid(o: &mut ChipOrch, args: &ChipArgs, k: CaseKernels) -> CallbackResult {
    o.submit_aiv(
        k.add,
        CoreArgs::new()
            .input(&args.tensor(0)?)
            .block_num(1000)
            .require_sync_start(true),
    )?;
    Ok(())
}

/// The orchestration reads a tensor whose producer never finishes.
fn tensor_wait_timeout(o: &mut ChipOrch, args: &ChipArgs, k: CaseKernels) -> CallbackResult {
    let x = args.tensor(0)?;
    o.submit_aiv(k.hang, CoreArgs::new().inout(&x))?;
    let _: f32 = o.get_tensor_data(&x, &[0])?;
    Ok(())
}

fn explicit_fatal(o: &mut ChipOrch, _: &ChipArgs, _: CaseKernels) -> CallbackResult {
    let e = o.report_fatal(codes::EXPLICIT_ORCH_FATAL, "deliberate fatal");
    // Later calls are no-ops that return the latched error.
    let again = o.submit_dummy(&CoreArgs::new());
    if !matches!(again, Err(ChipError::Fatal { code: 9, .. })) {
        return Err(ChipError::Internal("API call after a fatal was not a no-op".into()).into());
    }
    Err(e.into())
}

fn aicore_hang(o: &mut ChipOrch, args: &ChipArgs, k: CaseKernels) -> CallbackResult {
    o.submit_aiv(k.hang, CoreArgs::new().inout(&args.tensor(0)?))?;
    Ok(())
}

fn kernel_failure(o: &mut ChipOrch, args: &ChipArgs, k: CaseKernels) -> CallbackResult {
    let x = args.tensor(0)?;
    o.submit_aiv(k.fail, CoreArgs::new().inout(&x))?;
    // Downstream of the failure: poisoned, never runs.
    o.submit_aiv(
        k.add,
        CoreArgs::new().input(&x).input(&x).output(&args.tensor(1)?),
    )
    .map(|_| ())
    .or_else(|e| match e {
        ChipError::RunFailed { .. } => Ok(()),
        e => Err(e.into()),
    })
}

/// The negative suite, in the reference's order.
pub const NEGATIVE_CASES: &[NegativeCase] = &[
    NegativeCase {
        name: "scope_deadlock",
        orchestration: scope_deadlock,
        call: || rings(RingOverride::default().with_task_window(4)),
        args: CaseArgs::None,
        code: codes::SCOPE_DEADLOCK,
        mentions: &[],
    },
    NegativeCase {
        name: "heap_ring_deadlock",
        orchestration: heap_ring_deadlock,
        call: || rings(RingOverride::default().with_heap_bytes(1024)),
        args: CaseArgs::None,
        code: codes::HEAP_RING_DEADLOCK,
        mentions: &["ring 0", "heap_bytes"],
    },
    NegativeCase {
        name: "flow_control_deadlock",
        orchestration: flow_control_deadlock,
        call: || rings(RingOverride::default().with_task_window(4)),
        args: CaseArgs::None,
        code: codes::FLOW_CONTROL_DEADLOCK,
        mentions: &["task_window = 4"],
    },
    NegativeCase {
        name: "dep_pool_overflow",
        orchestration: dep_pool_overflow,
        call: || rings(RingOverride::default().with_dep_pool(4)),
        args: CaseArgs::X,
        code: codes::DEP_POOL_OVERFLOW,
        mentions: &["dep_pool = 4"],
    },
    NegativeCase {
        name: "invalid_args",
        orchestration: invalid_args,
        call: CallConfig::default,
        args: CaseArgs::None,
        code: codes::INVALID_ARGS,
        mentions: &[],
    },
    NegativeCase {
        name: "require_sync_start_invalid",
        orchestration: require_sync_start_invalid,
        call: CallConfig::default,
        args: CaseArgs::X,
        code: codes::REQUIRE_SYNC_START_INVALID,
        mentions: &[],
    },
    NegativeCase {
        name: "tensor_wait_timeout",
        orchestration: tensor_wait_timeout,
        call: || timeout(1500),
        args: CaseArgs::X,
        code: codes::TENSOR_WAIT_TIMEOUT,
        mentions: &[],
    },
    NegativeCase {
        name: "explicit_fatal",
        orchestration: explicit_fatal,
        call: CallConfig::default,
        args: CaseArgs::None,
        code: codes::EXPLICIT_ORCH_FATAL,
        mentions: &["deliberate fatal"],
    },
    NegativeCase {
        name: "aicore_hang",
        orchestration: aicore_hang,
        call: || timeout(200),
        args: CaseArgs::X,
        code: codes::SCHEDULER_TIMEOUT,
        mentions: &["hang"],
    },
    NegativeCase {
        name: "kernel_failure",
        orchestration: kernel_failure,
        call: CallConfig::default,
        args: CaseArgs::XY,
        code: codes::KERNEL_FAILED,
        mentions: &["fails", "deliberate failure"],
    },
];

/// Checks a case's run result against its row.
fn judge(
    case: &NegativeCase,
    r: Result<RunReport, ChipError>,
) -> Result<NegativeOutcome, WorkloadError> {
    let wrong = |got: String| WorkloadError::WrongCode {
        case: case.name,
        want: case.code,
        got,
    };
    let e = match r {
        Ok(_) => return Err(wrong("the run succeeded".into())),
        Err(e) => e,
    };
    if e.code() != Some(case.code) {
        return Err(wrong(format!("code {:?}: {e}", e.code())));
    }
    let error = e.to_string();
    if let Some(missing) = case.mentions.iter().find(|m| !error.contains(*m)) {
        return Err(wrong(format!("an error without {missing:?}: {error}")));
    }
    Ok(NegativeOutcome {
        name: case.name,
        code: case.code,
        error,
    })
}

/// Runs every row of [`NEGATIVE_CASES`] on one chip (a tensor-wait timeout of 300 ms):
/// each run must fail with its code and mention its words, must not copy its outputs
/// back, and must leave the chip usable — a vector add run after every case must still
/// succeed.
///
/// # Errors
/// [`WorkloadError::WrongCode`] if a case does not fail as its row says, a mismatch if a
/// failed run wrote its outputs back or the vector add after it is wrong, or a chip error.
pub fn negative_suite(mut config: ChipConfig) -> Result<Vec<NegativeOutcome>, WorkloadError> {
    config.tensor_wait_timeout = Duration::from_millis(300);
    let mut chip = ChipWorker::new(config)?;
    let kernels = CaseKernels {
        add: chip.register_kernel_fn("vector_add", add_kernel(0))?,
        hang: chip.register_kernel_fn("hang", |ctx| {
            while !ctx.cancelled() {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err("cancelled".into())
        })?,
        fail: chip.register_kernel_fn("fails", |_| Err("deliberate failure".into()))?,
    };
    let mut orchestrations = Vec::with_capacity(NEGATIVE_CASES.len());
    for case in NEGATIVE_CASES {
        let f = case.orchestration;
        orchestrations
            .push(chip.register_orchestration_fn(case.name, move |o, a| f(o, a, kernels))?);
    }
    let add = kernels.add;
    let vector_add = chip.register_orchestration_fn("vector_add", move |o, args| {
        o.submit_aiv(
            add,
            CoreArgs::new()
                .input(&args.tensor(0)?)
                .input(&args.tensor(1)?)
                .output(&args.tensor(2)?),
        )?;
        Ok(())
    })?;
    chip.init()?;

    let mut outcomes = Vec::with_capacity(NEGATIVE_CASES.len());
    for (case, orch) in NEGATIVE_CASES.iter().zip(&orchestrations) {
        let (mut x, mut y) = (vec![1.0f32; LEN as usize], vec![0.0f32; LEN as usize]);
        let result = {
            let mut args = RunArgs::new();
            match case.args {
                CaseArgs::None => {}
                CaseArgs::X => {
                    args.inout(&mut x, &[LEN]);
                }
                CaseArgs::XY => {
                    args.inout(&mut x, &[LEN]).inout(&mut y, &[LEN]);
                }
            }
            chip.run(orch, &mut args, &(case.call)())
        };
        outcomes.push(judge(case, result)?);
        // Outputs are not copied back after a failed run.
        check_close(
            &format!("{}: x", case.name),
            &x,
            &[1.0; LEN as usize],
            0.0,
            0.0,
        )?;
        check_close(
            &format!("{}: y", case.name),
            &y,
            &[0.0; LEN as usize],
            0.0,
            0.0,
        )?;
        // The chip stays usable.
        let a = vec![1.5f32; 64];
        let mut out = vec![0f32; 64];
        let mut args = RunArgs::new();
        args.input(&a, &[64])
            .input(&a, &[64])
            .output(&mut out, &[64]);
        chip.run(&vector_add, &mut args, &CallConfig::default())?;
        check_close(
            &format!("vector add after {}", case.name),
            &out,
            &[3.0; 64],
            0.0,
            0.0,
        )?;
    }
    chip.close()?;
    Ok(outcomes)
}
