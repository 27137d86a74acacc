//! Contracts of the execution API, written once over the execution mode of the workers'
//! children. State a callback shares with the test goes through shared memory
//! (`SharedTensor`), never an `Arc`, so it is the same state in a forked child as in a
//! thread.
#![allow(dead_code)]

use strata::prelude::*;
use strata::host::ExecMode;
use strata_testkit::suite::Variant;
use strata_testkit::{check, contracts, Ctx, Outcome, Scenario};

/// An execution mode as a suite variant.
pub trait Mode: Variant<Value = ExecMode> {}
impl<V: Variant<Value = ExecMode>> Mode for V {}

/// Children as forked processes.
pub struct Process;
impl Variant for Process {
    type Value = ExecMode;
    const VALUE: ExecMode = ExecMode::Process;
    const NAME: &'static str = "process";
}

/// Children as threads.
pub struct Threads;
impl Variant for Threads {
    type Value = ExecMode;
    const VALUE: ExecMode = ExecMode::Threads;
    const NAME: &'static str = "threads";
}

/// Every contract, for mode `M`.
pub fn suite<M: Mode>() -> Vec<Scenario> {
    contracts![M;
        a_program_adds_one_per_rank_in_one_shot_and_prepared,
        s12_multi_program_kv_cache_on_one_resident_tensor,
    ]
}

/// A level-3 target of `chips` chips in mode `M`.
fn l3<M: Mode>(chips: usize) -> Target {
    Target::l3(chips).configure(|c| c.exec_mode = M::VALUE)
}

/// `y[r] = x[r] + 1` on every chip `r`: a kernel, a chip orchestration per rank, a host
/// orchestration looping over the ranks.
fn add_one_program(n: u64) -> Program {
    let mut p = Program::new(
        "add_one",
        Signature::new()
            .input("x", DataType::F32, [Dim::World, Dim::Fixed(n)])
            .output("y", DataType::F32, [Dim::World, Dim::Fixed(n)]),
    );
    let add = p.kernel("add", |ctx| {
        let x = ctx.input::<f32>(0)?.to_vec();
        let mut y = ctx.output::<f32>(1)?;
        for (i, v) in x.iter().enumerate() {
            y.set_flat(i as u64, v + 1.0);
        }
        Ok(())
    });
    let per_chip = p.chip_orchestration("add_on_chip", move |o, a| {
        o.submit_aiv(add, CoreArgs::new().input(&a.tensor(0)?).output(&a.tensor(1)?))?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let (x, y) = (args.tensor("x")?, args.tensor("y")?);
        for r in 0..o.world_size() {
            let mut a = TaskArgs::new();
            a.push_tensor(x.row(r)?)?.push_tensor(y.row(r)?)?;
            o.submit_next_level(per_chip, &a, r)?;
        }
        Ok(())
    });
    p
}

pub fn a_program_adds_one_per_rank_in_one_shot_and_prepared<M: Mode>() -> Outcome {
    let compiled = add_one_program(8).compile(&l3::<M>(2)).ctx("compile")?;
    check!(
        compiled.describe() == "x: in F32[2, 8], y: out F32[2, 8]",
        "the world dimension is bound to 2 chips: {}",
        compiled.describe()
    );
    let xs: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let golden: Vec<f32> = xs.iter().map(|v| v + 1.0).collect();
    let x = SharedTensor::from_data(&[2, 8], &xs).ctx("x")?;
    let y = SharedTensor::zeroed(&[2, 8], DataType::F32).ctx("y")?;
    compiled.run_once((&x, &y)).ctx("run_once")?;
    check!(y.to_vec::<f32>().ctx("y")? == golden, "one shot: y = x + 1");

    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    for round in 0..3 {
        y.write(&[0f32; 16]).ctx("reset y")?;
        rt.call((&x, &y)).ctx("call")?;
        check!(y.to_vec::<f32>().ctx("y")? == golden, "round {round}: y = x + 1");
    }
    rt.close().ctx("close")
}

/// S12: one worker prepared with two programs sharing one resident tensor: prefill
/// writes `kv = 2 · prompt`; each decode step reads it into `logits = kv + token`.
pub fn s12_multi_program_kv_cache_on_one_resident_tensor<M: Mode>() -> Outcome {
    const N: u64 = 128 * 128;
    let mut prefill = Program::new(
        "prefill",
        Signature::new()
            .scalar("prompt", DataType::F32)
            .inout("kv", DataType::F32, [128u64, 128]),
    );
    let fill = prefill.kernel("fill", |ctx| {
        let v: f32 = ctx.scalar(0)?;
        ctx.output::<f32>(0)?.fill(2.0 * v);
        Ok(())
    });
    let fill_chip = prefill.chip_orchestration("fill", move |o, a| {
        o.submit_aiv(
            fill,
            CoreArgs::new().output(&a.tensor(0)?).scalar(a.scalar::<f32>(0)?),
        )?;
        Ok(())
    });
    prefill.orchestrate(move |o, args| {
        let mut a = TaskArgs::new();
        a.push_tensor(args.tensor("kv")?.arg()?)?
            .push_scalar(args.scalar::<f32>("prompt")?)?;
        o.submit_next_level(fill_chip, &a, 0)?;
        Ok(())
    });
    let mut decode = Program::new(
        "decode",
        Signature::new()
            .scalar("token", DataType::F32)
            .input("kv", DataType::F32, [128u64, 128])
            .output("logits", DataType::F32, [128u64, 128]),
    );
    let step = decode.kernel("step", |ctx| {
        let t: f32 = ctx.scalar(0)?;
        let kv = ctx.input::<f32>(0)?.to_vec();
        let mut out = ctx.output::<f32>(1)?;
        for (i, v) in kv.iter().enumerate() {
            out.set_flat(i as u64, v + t);
        }
        Ok(())
    });
    let step_chip = decode.chip_orchestration("step", move |o, a| {
        o.submit_aiv(
            step,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .output(&a.tensor(1)?)
                .scalar(a.scalar::<f32>(0)?),
        )?;
        Ok(())
    });
    decode.orchestrate(move |o, args| {
        let mut a = TaskArgs::new();
        a.push_tensor(args.tensor("kv")?.arg()?)?
            .push_tensor(args.tensor("logits")?.arg()?)?
            .push_scalar(args.scalar::<f32>("token")?)?;
        o.submit_next_level(step_chip, &a, 0)?;
        Ok(())
    });
    let target = l3::<M>(1);
    let prefill = prefill.compile(&target).ctx("compile prefill")?;
    let decode = decode.compile(&target).ctx("compile decode")?;
    let logits = SharedTensor::zeroed(&[128, 128], DataType::F32).ctx("logits")?;
    let rt = prefill
        .prepare(Prepare::new().program(&decode))
        .ctx("prepare both")?;
    let kv = rt
        .alloc_tensor(&[128, 128], DataType::F32, 0)
        .ctx("alloc kv")?;
    rt.run(&prefill, (2.0f32, &kv)).ctx("prefill")?;
    let mut back = vec![0f32; N as usize];
    rt.copy_from(&mut back, &kv, CopyRange::bytes(4 * N))
        .ctx("read kv")?;
    check!(back.iter().all(|&v| v == 4.0), "prefill: kv = 2 * 2.0 everywhere");
    for s in 0..2 {
        rt.run(&decode, (s as f32, &kv, &logits)).ctx("decode")?;
        let got = logits.to_vec::<f32>().ctx("logits")?;
        check!(
            got.iter().all(|&v| v == s as f32 + 4.0),
            "decode step {s}: logits = {} everywhere, got {}",
            s as f32 + 4.0,
            got[0]
        );
    }
    // Negative cases: call() is ambiguous with two programs; a program not prepared here.
    let e = rt.call((0.0f32, &kv, &logits)).unwrap_err();
    check!(
        matches!(&e, Error::Program(m) if m.contains("ambiguous") && m.contains("prefill") && m.contains("decode")),
        "call() on a two-program worker names the programs: {e}"
    );
    let other = add_one_program(8).compile(&target).ctx("compile other")?;
    let e = rt.run(&other, ()).unwrap_err();
    check!(
        matches!(&e, Error::Program(m) if m.contains("not prepared on this worker")),
        "an unprepared program: {e}"
    );
    rt.free_tensor(&kv).ctx("free kv")?;
    rt.close().ctx("close")
}
