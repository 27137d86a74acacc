//! The reference runtime's fatal codes: ten dispatches that must fail, each with its code —
//! scope deadlock 1, heap-ring deadlock 2, flow-control deadlock 3, dependency-pool
//! overflow 4, invalid arguments 5, sync-start 7, tensor-wait timeout 8, explicit fatal 9,
//! a hanging kernel 100, a failing kernel 110 — and after each, a vector add on the same
//! chip that must succeed: a failed dispatch leaves the chip usable. A failed dispatch does
//! not copy its outputs back either.
//!
//! Each case is its own level-2 program; all eleven are prepared on one chip worker
//! (multi-program mode) and dispatched by name with `run_with`, each case with the
//! `CallConfig` that provokes it (small rings, a short deadline). A chip's failure is
//! `strata::Error::Chip`, whose `code` is the reference's code.
//!
//! Run with `cargo run --release --example chip_fatal_codes` (or `cargo xtask sim`). Prints
//! one line per case and a final line starting with `ok:`; exits non-zero if a case fails
//! otherwise or the chip is not usable after it.

use std::process::ExitCode;
use std::time::Duration;
use strata::chip::{codes, ChipError, ChipTaskId, KernelHandle, TensorCreateInfo};
use strata::prelude::*;
use strata::types::RingOverride;

const LEN: u64 = 128;

/// A small runtime-created output.
fn small() -> TensorCreateInfo {
    TensorCreateInfo::new(DataType::F32, &[16])
}

/// A case: a program over `x` (1.0 × 128) and `y` (0.0 × 128), both INOUT.
fn case(name: &str) -> Program {
    Program::new(
        name,
        Signature::new()
            .inout("x", DataType::F32, [LEN])
            .inout("y", DataType::F32, [LEN]),
    )
}

/// `out(2) = a(0) + b(1)`.
fn add_kernel(p: &mut Program) -> KernelHandle {
    p.kernel("vector_add", |ctx| {
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
    })
}

/// A kernel that only ends when the chip cancels it.
fn hang_kernel(p: &mut Program) -> KernelHandle {
    p.kernel("hang", |ctx| {
        while !ctx.cancelled() {
            std::thread::sleep(Duration::from_micros(200));
        }
        Err("cancelled".into())
    })
}

fn rings(f: impl Fn(RingOverride) -> RingOverride) -> CallConfig {
    CallConfig::default().with_rings(f(RingOverride::default()))
}

/// The ten cases: name, expected code, the dispatch's configuration, the program.
fn cases() -> Vec<(&'static str, i32, CallConfig, Program)> {
    let mut all = Vec::new();

    // Eight live outputs in a task window of four.
    let mut p = case("scope_deadlock");
    p.orchestrate_chip(|o, _| {
        for _ in 0..8 {
            o.submit_dummy(CoreArgs::new().output_new(small()))?;
        }
        Ok(())
    });
    let config = rings(|r| r.with_task_window(4));
    all.push(("scope_deadlock", codes::SCOPE_DEADLOCK, config, p));

    // One output larger than a 1 KiB heap ring.
    let mut p = case("heap_ring_deadlock");
    p.orchestrate_chip(|o, _| {
        o.submit_dummy(CoreArgs::new().output_new(TensorCreateInfo::new(DataType::F32, &[8192])))?;
        Ok(())
    });
    let config = rings(|r| r.with_heap_bytes(1024));
    all.push(("heap_ring_deadlock", codes::HEAP_RING_DEADLOCK, config, p));

    // Nested scopes keep more tasks live than the window holds.
    let mut p = case("flow_control_deadlock");
    p.orchestrate_chip(|o, _| {
        for _ in 0..8 {
            o.scope_begin()?;
            for _ in 0..3 {
                o.submit_dummy(CoreArgs::new().output_new(small()))?;
            }
        }
        Ok(())
    });
    let config = rings(|r| r.with_task_window(4));
    all.push((
        "flow_control_deadlock",
        codes::FLOW_CONTROL_DEADLOCK,
        config,
        p,
    ));

    // A reader of 128 live producers, a dependency pool of four.
    let mut p = case("dep_pool_overflow");
    p.orchestrate_chip(|o, args| {
        let x = args.tensor(0)?;
        for i in 0..LEN {
            o.submit_dummy(
                CoreArgs::new()
                    .output(&x.slice(0, i, i + 1)?)
                    .output_new(small()),
            )?;
        }
        o.submit_dummy(CoreArgs::new().input(&x))?;
        Ok(())
    });
    let config = rings(|r| r.with_dep_pool(4));
    all.push(("dep_pool_overflow", codes::DEP_POOL_OVERFLOW, config, p));

    let mut p = case("invalid_args");
    p.orchestrate_chip(|o, _| {
        o.submit_dummy(CoreArgs::new().set_dependencies(&[ChipTaskId::INVALID; 4]))?;
        Ok(())
    });
    all.push((
        "invalid_args",
        codes::INVALID_ARGS,
        CallConfig::default(),
        p,
    ));

    // 1000 blocks to start together, more than the chip has AIV cores.
    let mut p = case("require_sync_start_invalid");
    let add = add_kernel(&mut p);
    p.orchestrate_chip(move |o, args| {
        o.submit_aiv(
            add,
            CoreArgs::new()
                .input(&args.tensor(0)?)
                .block_num(1000)
                .require_sync_start(true),
        )?;
        Ok(())
    });
    let code = codes::REQUIRE_SYNC_START_INVALID;
    all.push(("require_sync_start_invalid", code, CallConfig::default(), p));

    // The orchestration reads a tensor whose producer never finishes.
    let mut p = case("tensor_wait_timeout");
    let hang = hang_kernel(&mut p);
    p.orchestrate_chip(move |o, args| {
        let x = args.tensor(0)?;
        o.submit_aiv(hang, CoreArgs::new().inout(&x))?;
        let _: f32 = o.get_tensor_data(&x, &[0])?;
        Ok(())
    });
    let config = CallConfig::default().with_timeout(Duration::from_millis(1500));
    all.push(("tensor_wait_timeout", codes::TENSOR_WAIT_TIMEOUT, config, p));

    let mut p = case("explicit_fatal");
    p.orchestrate_chip(|o, _| {
        Err(o
            .report_fatal(codes::EXPLICIT_ORCH_FATAL, "deliberate fatal")
            .into())
    });
    let code = codes::EXPLICIT_ORCH_FATAL;
    all.push(("explicit_fatal", code, CallConfig::default(), p));

    let mut p = case("aicore_hang");
    let hang = hang_kernel(&mut p);
    p.orchestrate_chip(move |o, args| {
        o.submit_aiv(hang, CoreArgs::new().inout(&args.tensor(0)?))?;
        Ok(())
    });
    let config = CallConfig::default().with_timeout(Duration::from_millis(200));
    all.push(("aicore_hang", codes::SCHEDULER_TIMEOUT, config, p));

    // The task after the failing one is poisoned and never runs.
    let mut p = case("kernel_failure");
    let fail = p.kernel("fails", |_| Err("deliberate failure".into()));
    let add = add_kernel(&mut p);
    p.orchestrate_chip(move |o, args| {
        let x = args.tensor(0)?;
        o.submit_aiv(fail, CoreArgs::new().inout(&x))?;
        match o.submit_aiv(
            add,
            CoreArgs::new().input(&x).input(&x).output(&args.tensor(1)?),
        ) {
            Ok(_) | Err(ChipError::RunFailed { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    });
    all.push((
        "kernel_failure",
        codes::KERNEL_FAILED,
        CallConfig::default(),
        p,
    ));
    all
}

/// `out = a + b` over 64 floats: the dispatch that must succeed after every failure.
fn vector_add() -> Program {
    let mut p = Program::new(
        "vector_add",
        Signature::new()
            .input("a", DataType::F32, [64u64])
            .input("b", DataType::F32, [64u64])
            .output("out", DataType::F32, [64u64]),
    );
    let add = add_kernel(&mut p);
    p.orchestrate_chip(move |o, args| {
        o.submit_aiv(
            add,
            CoreArgs::new()
                .input(&args.tensor(0)?)
                .input(&args.tensor(1)?)
                .output(&args.tensor(2)?),
        )?;
        Ok(())
    });
    p
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let target = Target::chip(ChipConfig {
        tensor_wait_timeout: Duration::from_millis(300),
        ..ChipConfig::default()
    });
    let vector_add = vector_add().compile(&target)?;
    let mut cases_compiled = Vec::new();
    let mut options = Prepare::new();
    for (name, code, config, program) in cases() {
        let compiled = program.compile(&target)?;
        options = options.program(&compiled);
        cases_compiled.push((name, code, config, compiled));
    }
    let (x, y) = (
        SharedTensor::zeroed(&[LEN], DataType::F32)?,
        SharedTensor::zeroed(&[LEN], DataType::F32)?,
    );
    let a = SharedTensor::from_data(&[64], &[1.5f32; 64])?;
    let out = SharedTensor::zeroed(&[64], DataType::F32)?;
    let rt = vector_add.prepare(options)?;

    for (name, code, config, program) in &cases_compiled {
        x.write(&[1.0f32; LEN as usize])?;
        y.write(&[0.0f32; LEN as usize])?;
        match rt.run_with(program, (&x, &y), config) {
            Err(e @ Error::Chip { code: Some(c), .. }) if c == *code => {
                println!("{name:<28} code {code:>3}: {e}")
            }
            Err(e) => return Err(format!("{name}: {e:?} instead of code {code}").into()),
            Ok(()) => return Err(format!("{name}: the dispatch succeeded").into()),
        }
        let (xs, ys) = (x.to_vec::<f32>()?, y.to_vec::<f32>()?);
        if xs.iter().any(|&v| v != 1.0) || ys.iter().any(|&v| v != 0.0) {
            return Err(format!("{name}: a failed dispatch copied its outputs back").into());
        }
        out.write(&[0f32; 64])?;
        rt.run(&vector_add, (&a, &a, &out))
            .map_err(|e| format!("the chip is not usable after {name}: {e}"))?;
        if out.to_vec::<f32>()? != [3.0; 64] {
            return Err(format!("vector add after {name} is wrong").into());
        }
    }
    rt.close()?;
    Ok(format!(
        "ok: {} fatal-code cases, chip usable after each",
        cases_compiled.len()
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
