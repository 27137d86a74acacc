//! The reference runtime's fatal codes: ten runs that must fail, each with its code —
//! scope deadlock 1, heap-ring deadlock 2, flow-control deadlock 3, dependency-pool
//! overflow 4, invalid arguments 5, sync-start 7, tensor-wait timeout 8, explicit fatal 9,
//! a hanging kernel 100, a failing kernel 110 — and after each, a vector add on the same
//! chip that must succeed: a failed run leaves the chip usable. A failed run does not copy
//! its outputs back either.
//!
//! Run with `cargo run --release --example chip_fatal_codes` (or `cargo xtask sim`). Prints
//! one line per case and a final line starting with `ok:`; exits non-zero if a case fails
//! otherwise or the chip is not usable after it.

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;
use strata::chip::{
    codes, ChipConfig, ChipError, ChipTaskId, ChipWorker, CoreArgs, OrchHandle, RunArgs,
    TensorCreateInfo,
};
use strata::types::{CallConfig, DataType, RingOverride};

const LEN: u64 = 128;

fn run() -> Result<String, Box<dyn Error>> {
    let mut chip = ChipWorker::new(ChipConfig {
        tensor_wait_timeout: Duration::from_millis(300),
        ..ChipConfig::default()
    })?;
    let add = chip.register_kernel_fn("vector_add", |ctx| {
        let a = ctx.input::<f32>(0)?;
        let b = ctx.input::<f32>(1)?;
        let mut out = ctx.output::<f32>(2)?;
        let (Some(a), Some(b), Some(out)) = (a.as_slice(), b.as_slice(), out.as_mut_slice()) else {
            return Err("contiguous tensors expected".into());
        };
        for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
            *o = x + y;
        }
        Ok(())
    })?;
    // A kernel that only ends when the chip cancels it.
    let hang = chip.register_kernel_fn("hang", |ctx| {
        while !ctx.cancelled() {
            std::thread::sleep(Duration::from_micros(200));
        }
        Err("cancelled".into())
    })?;
    let fail = chip.register_kernel_fn("fails", |_| Err("deliberate failure".into()))?;
    let small = TensorCreateInfo::new(DataType::F32, &[16]);

    // Every case runs with x (1.0 × 128) and y (0.0 × 128), both INOUT.
    let mut cases: Vec<(&str, i32, CallConfig, OrchHandle)> = Vec::new();
    let mut case = |name: &'static str,
                    code: i32,
                    config: CallConfig,
                    orch: Result<OrchHandle, ChipError>|
     -> Result<(), ChipError> {
        cases.push((name, code, config, orch?));
        Ok(())
    };
    // Eight live outputs in a task window of four.
    case(
        "scope_deadlock",
        codes::SCOPE_DEADLOCK,
        CallConfig::default().with_rings(RingOverride::default().with_task_window(4)),
        chip.register_orchestration_fn("scope_deadlock", move |o, _| {
            for _ in 0..8 {
                o.submit_dummy(CoreArgs::new().output_new(small))?;
            }
            Ok(())
        }),
    )?;
    // One output larger than a 1 KiB heap ring.
    case(
        "heap_ring_deadlock",
        codes::HEAP_RING_DEADLOCK,
        CallConfig::default().with_rings(RingOverride::default().with_heap_bytes(1024)),
        chip.register_orchestration_fn("heap_ring_deadlock", |o, _| {
            o.submit_dummy(
                CoreArgs::new().output_new(TensorCreateInfo::new(DataType::F32, &[8192])),
            )?;
            Ok(())
        }),
    )?;
    // Nested scopes keep more tasks live than the window holds.
    case(
        "flow_control_deadlock",
        codes::FLOW_CONTROL_DEADLOCK,
        CallConfig::default().with_rings(RingOverride::default().with_task_window(4)),
        chip.register_orchestration_fn("flow_control_deadlock", move |o, _| {
            for _ in 0..8 {
                o.scope_begin()?;
                for _ in 0..3 {
                    o.submit_dummy(CoreArgs::new().output_new(small))?;
                }
            }
            Ok(())
        }),
    )?;
    // A reader of 128 live producers, a dependency pool of four.
    case(
        "dep_pool_overflow",
        codes::DEP_POOL_OVERFLOW,
        CallConfig::default().with_rings(RingOverride::default().with_dep_pool(4)),
        chip.register_orchestration_fn("dep_pool_overflow", move |o, args| {
            let x = args.tensor(0)?;
            for i in 0..LEN {
                o.submit_dummy(
                    CoreArgs::new()
                        .output(&x.slice(0, i, i + 1)?)
                        .output_new(small),
                )?;
            }
            o.submit_dummy(CoreArgs::new().input(&x))?;
            Ok(())
        }),
    )?;
    case(
        "invalid_args",
        codes::INVALID_ARGS,
        CallConfig::default(),
        chip.register_orchestration_fn("invalid_args", |o, _| {
            o.submit_dummy(CoreArgs::new().set_dependencies(&[ChipTaskId::INVALID; 4]))?;
            Ok(())
        }),
    )?;
    // 1000 blocks to start together, more than the chip has AIV cores.
    case(
        "require_sync_start_invalid",
        codes::REQUIRE_SYNC_START_INVALID,
        CallConfig::default(),
        chip.register_orchestration_fn("require_sync_start_invalid", move |o, args| {
            o.submit_aiv(
                add,
                CoreArgs::new()
                    .input(&args.tensor(0)?)
                    .block_num(1000)
                    .require_sync_start(true),
            )?;
            Ok(())
        }),
    )?;
    // The orchestration reads a tensor whose producer never finishes.
    case(
        "tensor_wait_timeout",
        codes::TENSOR_WAIT_TIMEOUT,
        CallConfig::default().with_timeout(Duration::from_millis(1500)),
        chip.register_orchestration_fn("tensor_wait_timeout", move |o, args| {
            let x = args.tensor(0)?;
            o.submit_aiv(hang, CoreArgs::new().inout(&x))?;
            let _: f32 = o.get_tensor_data(&x, &[0])?;
            Ok(())
        }),
    )?;
    case(
        "explicit_fatal",
        codes::EXPLICIT_ORCH_FATAL,
        CallConfig::default(),
        chip.register_orchestration_fn("explicit_fatal", |o, _| {
            Err(o
                .report_fatal(codes::EXPLICIT_ORCH_FATAL, "deliberate fatal")
                .into())
        }),
    )?;
    case(
        "aicore_hang",
        codes::SCHEDULER_TIMEOUT,
        CallConfig::default().with_timeout(Duration::from_millis(200)),
        chip.register_orchestration_fn("aicore_hang", move |o, args| {
            o.submit_aiv(hang, CoreArgs::new().inout(&args.tensor(0)?))?;
            Ok(())
        }),
    )?;
    // The task after the failing one is poisoned and never runs.
    case(
        "kernel_failure",
        codes::KERNEL_FAILED,
        CallConfig::default(),
        chip.register_orchestration_fn("kernel_failure", move |o, args| {
            let x = args.tensor(0)?;
            o.submit_aiv(fail, CoreArgs::new().inout(&x))?;
            match o.submit_aiv(
                add,
                CoreArgs::new().input(&x).input(&x).output(&args.tensor(1)?),
            ) {
                Ok(_) | Err(ChipError::RunFailed { .. }) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }),
    )?;
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

    for (name, code, config, orch) in &cases {
        let (mut x, mut y) = (vec![1.0f32; LEN as usize], vec![0.0f32; LEN as usize]);
        let mut args = RunArgs::new();
        args.inout(&mut x, &[LEN]).inout(&mut y, &[LEN]);
        match chip.run(orch, &mut args, config) {
            Err(e) if e.code() == Some(*code) => println!("{name:<28} code {code:>3}: {e}"),
            Err(e) => {
                return Err(format!("{name}: code {:?} instead of {code}: {e}", e.code()).into())
            }
            Ok(_) => return Err(format!("{name}: the run succeeded").into()),
        }
        if x.iter().any(|&v| v != 1.0) || y.iter().any(|&v| v != 0.0) {
            return Err(format!("{name}: a failed run copied its outputs back").into());
        }
        let a = vec![1.5f32; 64];
        let mut out = vec![0f32; 64];
        let mut args = RunArgs::new();
        args.input(&a, &[64])
            .input(&a, &[64])
            .output(&mut out, &[64]);
        chip.run(&vector_add, &mut args, &CallConfig::default())
            .map_err(|e| format!("the chip is not usable after {name}: {e}"))?;
        if out != [3.0; 64] {
            return Err(format!("vector add after {name} is wrong").into());
        }
    }
    chip.close()?;
    Ok(format!(
        "ok: {} fatal-code cases, chip usable after each",
        cases.len()
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_fatal_codes: {e}");
            ExitCode::FAILURE
        }
    }
}
