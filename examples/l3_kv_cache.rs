//! Two programs on one worker sharing one resident tensor — the prefill/decode pattern of a
//! KV cache: `prefill` writes the cache from a prompt (`kv = 2 · prompt`), then each
//! `decode` step reads it (`logits = kv + token`) without the cache ever leaving the chip.
//! The worker is prepared once with both programs (multi-program mode): dispatch names the
//! program (`run(&prefill, ..)`, `run(&decode, ..)`), and `call` — which would not know
//! which — is refused.
//!
//! Run with `cargo run --release --example l3_kv_cache` (or `cargo xtask sim`).
//! Prints a final line starting with `ok:`; exits non-zero on a mismatch.

use std::process::ExitCode;
use strata::prelude::*;

const N: u64 = 128;

fn prefill() -> Program {
    let mut p = Program::new(
        "prefill",
        Signature::new()
            .scalar("prompt", DataType::F32)
            .inout("kv", DataType::F32, [N, N]),
    );
    let fill = p.kernel("fill", |ctx| {
        let v: f32 = ctx.scalar(0)?;
        ctx.output::<f32>(0)?.fill(2.0 * v);
        Ok(())
    });
    let on_chip = p.chip_orchestration("fill", move |o, a| {
        o.submit_aiv(
            fill,
            CoreArgs::new()
                .output(&a.tensor(0)?)
                .scalar(a.scalar::<f32>(0)?),
        )?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let a = TaskArgs::new()
            .output_existing(args.tensor("kv")?)
            .scalar(args.scalar::<f32>("prompt")?);
        o.submit_next_level(on_chip, &a, 0)?;
        Ok(())
    });
    p
}

fn decode() -> Program {
    let mut p = Program::new(
        "decode",
        Signature::new()
            .scalar("token", DataType::F32)
            .input("kv", DataType::F32, [N, N])
            .output("logits", DataType::F32, [N, N]),
    );
    let step = p.kernel("step", |ctx| {
        let t: f32 = ctx.scalar(0)?;
        let kv = ctx.input::<f32>(0)?.to_vec();
        let mut out = ctx.output::<f32>(1)?;
        for (i, v) in kv.iter().enumerate() {
            out.set_flat(i as u64, v + t)?;
        }
        Ok(())
    });
    let on_chip = p.chip_orchestration("step", move |o, a| {
        o.submit_aiv(
            step,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .output(&a.tensor(1)?)
                .scalar(a.scalar::<f32>(0)?),
        )?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let a = TaskArgs::new()
            .input(args.tensor("kv")?)
            .output_existing(args.tensor("logits")?)
            .scalar(args.scalar::<f32>("token")?);
        o.submit_next_level(on_chip, &a, 0)?;
        Ok(())
    });
    p
}

fn run() -> Result<String, Error> {
    let target = Target::l3(1);
    let (prefill, decode) = (prefill().compile(&target)?, decode().compile(&target)?);
    let logits = SharedTensor::zeroed(&[N, N], DataType::F32)?;
    let rt = prefill.prepare(Prepare::new().program(&decode))?;
    let kv = rt.alloc_tensor(&[N, N], DataType::F32, 0)?;

    rt.run(&prefill, (2.0f32, &kv))?;
    let steps = 4;
    for s in 0..steps {
        rt.run(&decode, (s as f32, &kv, &logits))?;
        let want = 2.0 * 2.0 + s as f32;
        if let Some(bad) = logits.to_vec::<f32>()?.iter().find(|&&v| v != want) {
            return Err(Error::InvalidArgument(format!(
                "decode step {s}: a logit is {bad}, the host golden is {want}"
            )));
        }
    }
    // With two programs prepared, `call` cannot know which to run.
    let ambiguous = matches!(rt.call((0.0f32, &kv, &logits)), Err(Error::Program(_)));
    rt.free_tensor(&kv)?;
    rt.close()?;
    if !ambiguous {
        return Err(Error::InvalidArgument(
            "call() on a two-program worker should have been refused".into(),
        ));
    }
    Ok(format!(
        "ok: l3_kv_cache: prefill wrote a {N}x{N} cache resident on chip 0 (kv = 4); {steps} decode steps read it (logits = 4 + token), every value matches; call() refused as ambiguous"
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("l3_kv_cache: {e}");
            ExitCode::FAILURE
        }
    }
}
