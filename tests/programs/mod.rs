//! Contracts of the execution API, written once over the execution mode of the workers'
//! children. State a callback shares with the test goes through shared memory
//! (`SharedTensor`), never an `Arc`, so it is the same state in a forked child as in a
//! thread.
#![allow(dead_code)]

use strata::host::ExecMode;
use strata::prelude::*;
use strata::Arg;
use strata_testkit::suite::Variant;
use strata_testkit::{check, contracts, Ctx, Outcome, Scenario};

mod comm;
mod level4;
mod stall;
use comm::*;
use level4::*;
use stall::*;

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
        s14_callbacks_are_bound_at_prepare,
        s15_at_most_two_dispatches_are_in_flight,
        s15_handles_cache_their_outcome_and_time_out_without_losing_the_dispatch,
        s15_a_failed_oldest_dispatch_does_not_fail_the_third_submit,
        s15_handles_keep_their_arguments_alive,
        s15_close_drains_pending_dispatches_in_order,
        s16_resident_ownership_and_memory_negatives,
        offset_copies_round_trip_byte_for_byte,
        stacked_tensors_shard_over_the_chips,
        stacked_tensor_placement_is_checked_before_any_upload,
        one_shot_runs_refuse_resident_tensors,
        arguments_are_checked_against_the_signature_before_dispatch,
        registrations_dispatch_and_can_be_released,
        a_level_2_program_runs_on_one_chip,
        prewarm_builds_the_ring_heaps_while_preparing,
        a_chip_failure_is_one_error_at_every_level,
        inherited_host_memory_is_copied_in_place,
        a_level_2_benchmark_measures_every_round_from_its_spans,
        a_level_3_benchmark_builds_every_view_from_the_chips_spans,
        a_level_3_benchmark_flags_unstable_slots_and_flattens_varying_rounds,
        s1_quickstart_allreduce_gives_the_sum_on_every_rank,
        s4_notify_wait_handshake,
        s5_persistent_windows_are_allocated_once_and_reset,
        s6_barrier_tally,
        s9_rank_identity_scale_and_round_trip,
        a_stalled_level_2_dispatch_explains_itself,
        a_group_waiting_for_a_stuck_worker_explains_the_timeout,
        stacked_tensors_shard_over_the_chips_of_level_3_children,
        resident_tensors_on_a_level_3_childs_chip_round_trip,
        a_resident_tensor_goes_only_to_the_child_that_holds_it,
    ]
}

/// A level-3 target of `chips` chips in mode `M`.
pub fn l3<M: Mode>(chips: usize) -> Target {
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
            y.set_flat(i as u64, v + 1.0)?;
        }
        Ok(())
    });
    let per_chip = p.chip_orchestration("add_on_chip", move |o, a| {
        o.submit_aiv(
            add,
            CoreArgs::new().input(&a.tensor(0)?).output(&a.tensor(1)?),
        )?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let (x, y) = (args.tensor("x")?, args.tensor("y")?);
        for r in 0..o.world_size() {
            let a = TaskArgs::new().input(x.row(r)).output_existing(y.row(r));
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
        check!(
            y.to_vec::<f32>().ctx("y")? == golden,
            "round {round}: y = x + 1"
        );
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
            CoreArgs::new()
                .output(&a.tensor(0)?)
                .scalar(a.scalar::<f32>(0)?),
        )?;
        Ok(())
    });
    prefill.orchestrate(move |o, args| {
        let a = TaskArgs::new()
            .output_existing(args.tensor("kv")?)
            .scalar(args.scalar::<f32>("prompt")?);
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
            out.set_flat(i as u64, v + t)?;
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
        let a = TaskArgs::new()
            .input(args.tensor("kv")?)
            .output_existing(args.tensor("logits")?)
            .scalar(args.scalar::<f32>("token")?);
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
    check!(
        back.iter().all(|&v| v == 4.0),
        "prefill: kv = 2 * 2.0 everywhere"
    );
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

/// A shared u32 flag a callback waits for (bounded), so a dispatch stays pending until the
/// test opens it.
fn gate() -> Result<SharedTensor, String> {
    SharedTensor::zeroed(&[1], DataType::U32).ctx("gate")
}

/// Reads a shared u32 without the host-copy check (a task may be writing it).
fn peek(t: &SharedTensor) -> u32 {
    // SAFETY: one aligned word, read while a child may write it: a racy but harmless read
    // of a flag the test only compares (the writer stores whole words).
    unsafe {
        t.as_slice::<u32>()
            .map(|s| std::ptr::read_volatile(s.as_ptr()))
            .unwrap_or(0)
    }
}

fn open_gate(t: &SharedTensor) {
    // SAFETY: as `peek`; the waiting callback reads the word volatile too.
    unsafe {
        if let Ok(s) = t.as_mut_slice::<u32>() {
            std::ptr::write_volatile(s.as_mut_ptr(), 1)
        }
    }
}

/// A sub callable that waits (at most 30 s) until its argument 0 (a gate) is open, then
/// adds 1 to its argument 1.
fn wait_then_count(call: &mut strata::host::SubCall<'_>) -> strata::types::CallbackResult {
    // SAFETY: the gate is a NO_DEP word the test opens while this task runs: it is only
    // read, volatile and whole.
    let g = unsafe { call.tensor_untracked::<u32>(0)? };
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // SAFETY: as above.
    while unsafe { std::ptr::read_volatile(g.as_slice().ok_or("gate")?.as_ptr()) } == 0 {
        if std::time::Instant::now() > end {
            return Err("the gate never opened".into());
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    call.tensor_mut::<u32>(1)?.update(|v| v + 1);
    Ok(())
}

/// A one-sub-worker program: `wait_then_count(gate, count)` on a sub-worker.
fn gated_program() -> Program {
    let mut p = Program::new(
        "gated",
        Signature::new()
            .input("gate", DataType::U32, [1u64])
            .inout("count", DataType::U32, [1u64]),
    );
    let cb = p.sub("wait_then_count", wait_then_count);
    p.orchestrate(move |o, args| {
        let a = TaskArgs::new()
            .no_dep(args.tensor("gate")?)
            .inout(args.tensor("count")?);
        o.submit_sub(&cb, &a)?;
        Ok(())
    });
    p
}

fn l3_subs<M: Mode>(chips: usize, subs: usize) -> Target {
    l3::<M>(chips).sub_workers(subs)
}

/// S14: a callback declared by the program and bound at prepare reads the chip's result.
pub fn s14_callbacks_are_bound_at_prepare<M: Mode>() -> Outcome {
    let mut p = Program::new(
        "add_then_inspect",
        Signature::new()
            .input("a", DataType::F32, [128u64, 128])
            .input("b", DataType::F32, [128u64, 128])
            .output("f", DataType::F32, [128u64, 128])
            .output("seen", DataType::F32, [1u64]),
    );
    let add = p.kernel("add", |ctx| {
        let a = ctx.input::<f32>(0)?.to_vec();
        let b = ctx.input::<f32>(1)?.to_vec();
        let mut f = ctx.output::<f32>(2)?;
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            f.set_flat(i as u64, x + y)?;
        }
        Ok(())
    });
    let chip = p.chip_orchestration("add", move |o, a| {
        o.submit_aiv(
            add,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .input(&a.tensor(1)?)
                .output(&a.tensor(2)?),
        )?;
        Ok(())
    });
    let inspect = p.callback("inspect_result");
    p.orchestrate(move |o, args| {
        let a = TaskArgs::new()
            .input(args.tensor("a")?)
            .input(args.tensor("b")?)
            .output_existing(args.tensor("f")?);
        o.submit_next_level(chip, &a, 0)?;
        let c = TaskArgs::new()
            .input(args.tensor("f")?)
            .output_existing(args.tensor("seen")?);
        o.submit_sub(&inspect, &c)?;
        Ok(())
    });
    let compiled = p.compile(&l3_subs::<M>(1, 1)).ctx("compile")?;
    let a = SharedTensor::from_data(&[128, 128], &vec![2f32; 128 * 128]).ctx("a")?;
    let b = SharedTensor::from_data(&[128, 128], &vec![3f32; 128 * 128]).ctx("b")?;
    let f = SharedTensor::zeroed(&[128, 128], DataType::F32).ctx("f")?;
    let seen = SharedTensor::zeroed(&[1], DataType::F32).ctx("seen")?;

    // Not bound: an error at prepare, not at dispatch.
    let e = compiled.prepare(Prepare::new()).unwrap_err();
    check!(
        matches!(&e, Error::Program(m) if m.contains("inspect_result") && m.contains("must be supplied")),
        "prepare without the callback: {e}"
    );
    // A name no program declares.
    let e = compiled
        .prepare(Prepare::new().callback("typo", |_| Ok(())))
        .unwrap_err();
    check!(
        matches!(&e, Error::Program(m) if m.contains("typo") && m.contains("not a callback")),
        "a callback nobody declares: {e}"
    );
    let rt = compiled
        .prepare(Prepare::new().callback("inspect_result", |call| {
            let f0 = call.tensor::<f32>(0)?.get(&[0, 0])?;
            call.tensor_mut::<f32>(1)?.set(&[0], f0)?;
            Ok(())
        }))
        .ctx("prepare")?;
    rt.call((&a, &b, &f, &seen)).ctx("call")?;
    check!(
        f.to_vec::<f32>().ctx("f")?.iter().all(|&v| v == 5.0),
        "f = a + b = 5 everywhere"
    );
    check!(
        seen.to_vec::<f32>().ctx("seen")? == vec![5.0],
        "the callback observed f[0] = 5"
    );
    rt.close().ctx("close")
}

/// S15 (a): two dispatches in flight return at once; a third waits until the oldest is
/// done, and only then builds its dispatch.
pub fn s15_at_most_two_dispatches_are_in_flight<M: Mode>() -> Outcome {
    let compiled = gated_program()
        .compile(&l3_subs::<M>(0, 2))
        .ctx("compile")?;
    let (g1, g2, g3) = (gate()?, gate()?, gate()?);
    let counts: Vec<SharedTensor> = (0..3)
        .map(|_| SharedTensor::zeroed(&[1], DataType::U32))
        .collect::<Result<_, _>>()
        .ctx("counts")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let h1 = rt.submit(&compiled, (&g1, &counts[0])).ctx("submit 1")?;
    let h2 = rt.submit(&compiled, (&g2, &counts[1])).ctx("submit 2")?;
    check!(
        !h1.is_done() && !h2.is_done(),
        "both dispatches are pending (their gates are closed)"
    );
    open_gate(&g3);
    // Open the first gate a little later, from another thread: the third submit must wait
    // for dispatch 1 to finish, which it cannot before then.
    let opener = {
        let g1 = g1.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            open_gate(&g1);
        })
    };
    let h3 = rt.submit(&compiled, (&g3, &counts[2])).ctx("submit 3")?;
    check!(
        h1.is_done(),
        "the third submit returned only after dispatch 1 finished"
    );
    check!(
        peek(&counts[0]) == 1,
        "dispatch 1 ran its task before dispatch 3 was built"
    );
    opener.join().map_err(|_| "opener panicked".to_string())?;
    open_gate(&g2);
    for (i, h) in [&h1, &h2, &h3].iter().enumerate() {
        h.result(None).ctx("result")?;
        check!(peek(&counts[i]) == 1, "dispatch {} counted once", i + 1);
    }
    rt.close().ctx("close")
}

/// S15 (b): a zero timeout on a pending dispatch is a timeout that leaves it running; an
/// absurd timeout is refused; the outcome is cached.
pub fn s15_handles_cache_their_outcome_and_time_out_without_losing_the_dispatch<M: Mode>() -> Outcome
{
    let compiled = gated_program()
        .compile(&l3_subs::<M>(0, 1))
        .ctx("compile")?;
    let g = gate()?;
    let count = SharedTensor::zeroed(&[1], DataType::U32).ctx("count")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let h = rt.submit(&compiled, (&g, &count)).ctx("submit")?;
    let e = h.result(Some(std::time::Duration::ZERO)).unwrap_err();
    check!(
        matches!(e, Error::Timeout { .. }),
        "pending: a timeout, got {e}"
    );
    let e = h
        .result(Some(std::time::Duration::from_secs(400 * 24 * 3600)))
        .unwrap_err();
    check!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("None")),
        "an absurd timeout is refused: {e}"
    );
    check!(!h.is_done(), "still running after the timeouts");
    open_gate(&g);
    h.result(None).ctx("result")?;
    h.wait(Some(std::time::Duration::ZERO)).ctx("cached")?;
    check!(h.is_done(), "done");
    check!(peek(&count) == 1, "the task ran exactly once");
    // Both frames are free again: two more dispatches go in flight without waiting.
    let (ha, hb) = (
        rt.submit(&compiled, (&g, &count)).ctx("again 1")?,
        rt.submit(&compiled, (&g, &count)).ctx("again 2")?,
    );
    ha.result(None).ctx("a")?;
    hb.result(None).ctx("b")?;
    check!(peek(&count) == 3, "three tasks ran");
    rt.close().ctx("close")
}

/// S15 (c): a failed dispatch gives its error on every wait, and back-pressure that
/// waits for it does not fail the submit that waited.
pub fn s15_a_failed_oldest_dispatch_does_not_fail_the_third_submit<M: Mode>() -> Outcome {
    let mut p = Program::new("maybe_fail", Signature::new().scalar("fail", DataType::U32));
    let cb = p.sub("maybe_fail", |call| {
        if call.scalar::<u32>(0).ok_or("no scalar")? == 1 {
            return Err("deliberate failure of dispatch 1".into());
        }
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let a = TaskArgs::new().scalar(args.scalar::<u32>("fail")?);
        o.submit_sub(&cb, &a)?;
        Ok(())
    });
    let compiled = p.compile(&l3_subs::<M>(0, 1)).ctx("compile")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let h1 = rt.submit(&compiled, (1u32,)).ctx("submit 1")?;
    let h2 = rt.submit(&compiled, (0u32,)).ctx("submit 2")?;
    let h3 = rt
        .submit(&compiled, (0u32,))
        .ctx("submit 3 waits for the failed 1")?;
    for round in 0..3 {
        let e = h1.result(None).unwrap_err();
        check!(
            matches!(&e, Error::SubWorker { message, .. } if message.contains("deliberate failure of dispatch 1")),
            "round {round}: h1 reports its sub-worker's error: {e:?}"
        );
    }
    h2.result(None).ctx("h2")?;
    h3.result(None).ctx("h3")?;
    rt.close().ctx("close (h1's error was reported)")
}

/// S15 (d): a handle keeps its arguments alive: a host tensor the caller dropped after
/// submitting keeps its memory until the dispatch is done.
pub fn s15_handles_keep_their_arguments_alive<M: Mode>() -> Outcome {
    let compiled = gated_program()
        .compile(&l3_subs::<M>(0, 1))
        .ctx("compile")?;
    let g = gate()?;
    let count = SharedTensor::zeroed(&[1], DataType::U32).ctx("count")?;
    let strata::types::BufferLocation::HostShared { region, .. } = count.buffer().location() else {
        return Err("a shared tensor lives in shared memory".into());
    };
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let h = rt.submit(&compiled, (&g, &count)).ctx("submit")?;
    drop(count);
    let mem = strata::host::SharedMemory::process();
    check!(
        mem.is_live(region),
        "the dropped tensor's memory lives while its dispatch runs"
    );
    open_gate(&g);
    h.result(None).ctx("result")?;
    drop(h);
    check!(
        !mem.is_live(region),
        "and is released once the handle is gone"
    );
    rt.close().ctx("close")
}

/// S15 (e): close waits for pending dispatches (oldest first), then closes; a submit after
/// close is refused.
pub fn s15_close_drains_pending_dispatches_in_order<M: Mode>() -> Outcome {
    let compiled = gated_program()
        .compile(&l3_subs::<M>(0, 2))
        .ctx("compile")?;
    let (g1, g2) = (gate()?, gate()?);
    let count = SharedTensor::zeroed(&[1], DataType::U32).ctx("count")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let h1 = rt.submit(&compiled, (&g1, &count)).ctx("submit 1")?;
    let h2 = rt.submit(&compiled, (&g2, &count)).ctx("submit 2")?;
    let opener = {
        let (g1, g2) = (g1.clone(), g2.clone());
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            open_gate(&g1);
            open_gate(&g2);
        })
    };
    rt.close().ctx("close")?;
    opener.join().map_err(|_| "opener panicked".to_string())?;
    check!(
        h1.is_done() && h2.is_done(),
        "close drained both dispatches"
    );
    check!(peek(&count) == 2, "both tasks ran before the worker closed");
    h1.result(None).ctx("h1")?;
    let e = rt.submit(&compiled, (&g1, &count)).unwrap_err();
    check!(
        matches!(e, Error::Closed("submit")),
        "submit after close: {e}"
    );
    let e = rt.alloc_tensor(&[4], DataType::F32, 0).unwrap_err();
    check!(matches!(e, Error::Closed(_)), "memory after close: {e}");
    Ok(())
}

/// A program over one chip that scales a resident tensor in place: `t *= k`.
fn scale_program() -> Program {
    let mut p = Program::new(
        "scale",
        Signature::new()
            .inout("t", DataType::F32, [Dim::named("n")])
            .scalar("k", DataType::F32),
    );
    let scale = p.kernel("scale", |ctx| {
        let k: f32 = ctx.scalar(0)?;
        let mut t = ctx.output::<f32>(0)?;
        for v in t.as_mut_slice().ok_or("contiguous")? {
            *v *= k;
        }
        Ok(())
    });
    let chip = p.chip_orchestration("scale", move |o, a| {
        o.submit_aiv(
            scale,
            CoreArgs::new()
                .inout(&a.tensor(0)?)
                .scalar(a.scalar::<f32>(0)?),
        )?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let t = args.tensor("t")?;
        let w = t.worker().unwrap_or(0);
        let a = TaskArgs::new().inout(t).scalar(args.scalar::<f32>("k")?);
        o.submit_next_level(chip, &a, w)?;
        Ok(())
    });
    p
}

/// S16: resident tensors are owned by the worker that allocated them; stale, foreign and
/// raw handles, private buffers and bad configurations are refused.
pub fn s16_resident_ownership_and_memory_negatives<M: Mode>() -> Outcome {
    let compiled = scale_program().compile(&l3::<M>(1)).ctx("compile")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let old = rt.alloc_tensor_from(&[256], &[1f32; 256], 0).ctx("old")?;
    rt.free_tensor(&old).ctx("free old")?;
    let new = rt.alloc_tensor_from(&[256], &[2f32; 256], 0).ctx("new")?;
    check!(
        new.ptr().addr() == old.ptr().addr(),
        "the allocator reused the address (the scenario needs it)"
    );
    let e = rt.free_tensor(&old).unwrap_err();
    check!(
        matches!(&e, Error::Memory(m) if m.contains("stale DeviceTensor")),
        "free of the stale tensor: {e}"
    );
    let e = rt.call((&old, 3.0f32)).unwrap_err();
    check!(
        matches!(&e, Error::Argument { param, message, .. } if param == "t" && message.contains("stale")),
        "dispatch of the stale tensor: {e}"
    );
    rt.call((&new, 3.0f32))
        .ctx("the newer tensor stays valid")?;
    let mut back = [0f32; 256];
    rt.copy_from(&mut back, &new, CopyRange::bytes(1024))
        .ctx("read new")?;
    check!(back.iter().all(|&v| v == 6.0), "new = 2 * 3");

    // A copy whose device range leaves the tensor (an interior address past its end).
    let e = rt
        .copy_to(&new, &[0u8; 8], CopyRange::new(8, 1020, 0))
        .unwrap_err();
    check!(
        matches!(&e, Error::InvalidArgument(m) | Error::Memory(m) if m.contains("leaves")),
        "a copy past the end: {e}"
    );
    let e = rt
        .copy_to(&new, &[0u8; 8], CopyRange::new(8, u64::MAX - 3, 0))
        .unwrap_err();
    check!(
        matches!(&e, Error::InvalidArgument(m) | Error::Memory(m) if m.contains("leaves")),
        "an offset that would overflow: {e}"
    );

    // A tensor of another worker (a chip of this process: another worker could not fork
    // beside this one's scheduler thread in process mode).
    let mut other = strata::chip::ChipWorker::new(ChipConfig::default()).ctx("other")?;
    other.init().ctx("init other")?;
    let foreign = other
        .alloc_tensor(&[256], DataType::F32, strata::chip::TensorInit::Zeros)
        .ctx("foreign")?;
    let e = rt.call((&foreign, 1.0f32)).unwrap_err();
    check!(
        matches!(&e, Error::Argument { message, .. } if message.contains("not a live allocation owned by this worker")),
        "another worker's tensor: {e}"
    );
    let e = rt.free_tensor(&foreign).unwrap_err();
    check!(
        matches!(&e, Error::Memory(_)),
        "free of another worker's tensor: {e}"
    );
    other.close().ctx("close other")?;

    // A handle built from a raw address names nothing this worker allocated.
    // SAFETY: the handle is only ever passed to the worker, which must refuse it.
    let raw = unsafe {
        DeviceTensor::from_raw_parts(
            1,
            1,
            0,
            0x1000,
            1024,
            strata::types::TensorView::contiguous(DataType::F32, &[256]).ctx("view")?,
        )
    };
    let e = rt.call((&raw, 1.0f32)).unwrap_err();
    check!(matches!(&e, Error::Argument { .. }), "a raw handle: {e}");
    let e = rt.free_tensor(&raw).unwrap_err();
    check!(matches!(&e, Error::Memory(_)), "free of a raw handle: {e}");

    // A private buffer as a dispatch argument.
    let private = vec![0f32; 256];
    let e = rt.call((&private, 1.0f32)).unwrap_err();
    check!(
        matches!(&e, Error::Argument { message, .. } if message.contains("shared memory") && message.contains("before prepare")),
        "a private buffer: {e}"
    );
    // A bad call configuration.
    let mut cfg = CallConfig::default();
    cfg.rings[0].heap_bytes = Some(1000);
    let e = rt.run_with(&compiled, (&new, 1.0f32), &cfg).unwrap_err();
    check!(
        e.to_string().contains("heap_bytes = 1000"),
        "a bad ring heap: {e}"
    );
    rt.close().ctx("close")
}

/// Explicit copies at offsets, ordinary host memory created after prepare, read back byte
/// for byte against a host model.
pub fn offset_copies_round_trip_byte_for_byte<M: Mode>() -> Outcome {
    let compiled = scale_program().compile(&l3::<M>(2)).ctx("compile")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let t = rt.alloc_tensor(&[1000], DataType::U32, 1).ctx("alloc")?;
    check!(t.worker() == 1, "allocated on chip 1");
    let mut model = vec![0u8; 4000];
    let src: Vec<u8> = (0..3000).map(|i| (i * 31 + 7) as u8).collect();
    for (n, dev, host) in [
        (3000u64, 0u64, 0u64),
        (100, 3900, 17),
        (1, 3999, 2999),
        (0, 4000, 0),
        (1234, 555, 1000),
    ] {
        rt.copy_to(&t, &src, CopyRange::new(n, dev, host))
            .ctx("copy_to")?;
        let (n, dev, host) = (n as usize, dev as usize, host as usize);
        model[dev..dev + n].copy_from_slice(&src[host..host + n]);
    }
    let mut whole = vec![0u8; 4000];
    rt.copy_from(&mut whole, &t, CopyRange::bytes(4000))
        .ctx("read all")?;
    check!(whole == model, "the device bytes match the host model");
    let mut part = vec![0xEEu8; 64];
    rt.copy_from(&mut part, &t, CopyRange::new(32, 777, 16))
        .ctx("read part")?;
    check!(
        part[16..48] == model[777..809],
        "an offset read lands at its host offset"
    );
    check!(
        part[..16].iter().chain(&part[48..]).all(|&b| b == 0xEE),
        "and nowhere else"
    );
    let e = rt
        .copy_to(&t, &src, CopyRange::new(10, 0, 2995))
        .unwrap_err();
    check!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("host range")),
        "host range: {e}"
    );
    let (free, total) = rt.device_memory_info(1).ctx("info")?;
    check!(
        total == ChipConfig::default().device_memory_bytes,
        "total is the configured capacity"
    );
    check!(free < total, "some is allocated");
    rt.close().ctx("close")
}

/// `y[r] = w[r] * k` per rank, with `w` stacked (shard `r` wherever it was placed).
/// A program `name` that scales a stacked `w` (`shards` × 4 × 8) by `k` into `y`, its
/// kernel and the chip orchestration running it; the caller routes the shards.
pub(crate) fn scale_shards_parts(name: &str, shards: Dim) -> (Program, strata::chip::OrchHandle) {
    let mut p = Program::new(
        name,
        Signature::new()
            .input(
                "w",
                DataType::F32,
                [shards.clone(), Dim::Fixed(4), Dim::Fixed(8)],
            )
            .output("y", DataType::F32, [shards, Dim::Fixed(4), Dim::Fixed(8)])
            .scalar("k", DataType::F32),
    );
    let mul = p.kernel("mul", |ctx| {
        let k: f32 = ctx.scalar(0)?;
        let w = ctx.input::<f32>(0)?.to_vec();
        let mut y = ctx.output::<f32>(1)?;
        for (i, v) in w.iter().enumerate() {
            y.set_flat(i as u64, v * k)?;
        }
        Ok(())
    });
    let chip = p.chip_orchestration("mul", move |o, a| {
        o.submit_aiv(
            mul,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .output(&a.tensor(1)?)
                .scalar(a.scalar::<f32>(0)?),
        )?;
        Ok(())
    });
    (p, chip)
}

/// The host orchestration of [`scale_shards_parts`]: shard `i`'s task (`w.shard(i)`,
/// `y.row(i)`, `k`) runs `to` on the worker holding the shard.
pub(crate) fn orchestrate_per_shard(p: &mut Program, to: strata::dist::NextLevelCallable) {
    p.orchestrate(move |o, args| {
        let (w, y, k) = (
            args.tensor("w")?,
            args.tensor("y")?,
            args.scalar::<f32>("k")?,
        );
        for i in 0..w.shards() {
            let a = TaskArgs::new()
                .input(w.shard(i))
                .output_existing(y.row(i))
                .scalar(k);
            o.submit_next_level(to, &a, w.shard_worker(i)?)?;
        }
        Ok(())
    });
}

fn stacked_program() -> Program {
    let (mut p, chip) = scale_shards_parts("stacked_scale", Dim::World);
    orchestrate_per_shard(&mut p, chip.into());
    p
}

pub fn stacked_tensors_shard_over_the_chips<M: Mode>() -> Outcome {
    let compiled = stacked_program().compile(&l3::<M>(2)).ctx("compile")?;
    let host: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let y = SharedTensor::zeroed(&[2, 4, 8], DataType::F32).ctx("y")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    for ids in [None, Some(vec![1usize, 0])] {
        let w = rt
            .alloc_stacked_tensor(&[2, 4, 8], &host, ids.as_deref())
            .ctx("alloc stacked")?;
        let want_ids = ids.clone().unwrap_or(vec![0, 1]);
        check!(w.worker_ids() == want_ids, "placement {:?}", w.worker_ids());
        rt.call((&w, &y, 2.0f32)).ctx("call")?;
        let golden: Vec<f32> = host.iter().map(|v| v * 2.0).collect();
        check!(
            y.to_vec::<f32>().ctx("y")? == golden,
            "y = 2 w with placement {want_ids:?}"
        );
        let mut back = vec![0f32; 64];
        rt.copy_stacked_from(&mut back, &[2, 4, 8], &w)
            .ctx("read back")?;
        check!(back == host, "every shard reads back into its place");
        // Shard i is chip ids[i]'s: read it straight from there.
        let mut shard1 = vec![0f32; 32];
        rt.copy_from(&mut shard1, &w.shards()[1], CopyRange::bytes(128))
            .ctx("shard 1")?;
        check!(shard1 == host[32..], "shard 1 holds rows [1, ..]");
        check!(
            w.shards()[1].worker() as usize == want_ids[1],
            "on chip {}",
            want_ids[1]
        );
        rt.free_stacked_tensor(&w).ctx("free")?;
        let e = rt.free_stacked_tensor(&w).unwrap_err();
        check!(
            matches!(e, Error::Memory(_)),
            "a second free is refused: {e}"
        );
    }
    rt.close().ctx("close")
}

pub fn stacked_tensor_placement_is_checked_before_any_upload<M: Mode>() -> Outcome {
    let compiled = stacked_program().compile(&l3::<M>(2)).ctx("compile")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let before = rt.committed_device_memory(0).ctx("committed 0")?
        + rt.committed_device_memory(1).ctx("committed 1")?;
    let host = vec![1f32; 64];
    type Case<'a> = (&'a [u64], Option<&'a [usize]>, &'a str);
    let cases: [Case; 5] = [
        (&[2, 4, 8], Some(&[0, 0]), "appears twice"),
        (&[2, 4, 8], Some(&[0, 2]), "out of range"),
        (&[2, 4, 8], Some(&[0]), "1 worker ids for 2 shards"),
        (&[64], None, "rank >= 2"),
        (&[2, 4, 4], None, "32 elements but the host data has 64"),
    ];
    for (shape, ids, want) in cases {
        let e = rt.alloc_stacked_tensor(shape, &host, ids).unwrap_err();
        check!(
            matches!(&e, Error::InvalidArgument(m) if m.contains(want)),
            "{shape:?} {ids:?}: expected {want:?}, got {e}"
        );
    }
    let after = rt.committed_device_memory(0).ctx("committed 0")?
        + rt.committed_device_memory(1).ctx("committed 1")?;
    check!(
        after == before,
        "nothing was uploaded ({before} -> {after} bytes)"
    );
    rt.close().ctx("close")
}

pub fn one_shot_runs_refuse_resident_tensors<M: Mode>() -> Outcome {
    let compiled = scale_program().compile(&l3::<M>(1)).ctx("compile")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let t = rt.alloc_tensor(&[8], DataType::F32, 0).ctx("alloc")?;
    let e = compiled.run_once((&t, 2.0f32)).unwrap_err();
    check!(
        matches!(&e, Error::Argument { param, message, .. } if param == "t" && message.contains("prepare")),
        "one-shot with a resident tensor: {e}"
    );
    let host = SharedTensor::from_data(&[8], &[1f32; 8]).ctx("host")?;
    drop(rt);
    compiled
        .run_once((&host, 3.0f32))
        .ctx("one-shot with a host tensor")?;
    check!(
        host.to_vec::<f32>().ctx("host")? == vec![3.0; 8],
        "host = 1 * 3"
    );
    Ok(())
}

pub fn arguments_are_checked_against_the_signature_before_dispatch<M: Mode>() -> Outcome {
    let compiled = add_one_program(8).compile(&l3::<M>(2)).ctx("compile")?;
    let x = SharedTensor::zeroed(&[2, 8], DataType::F32).ctx("x")?;
    let y = SharedTensor::zeroed(&[2, 8], DataType::F32).ctx("y")?;
    let x_i32 = SharedTensor::zeroed(&[2, 8], DataType::I32).ctx("x i32")?;
    let x_short = SharedTensor::zeroed(&[2, 7], DataType::F32).ctx("x short")?;
    let x_rank = SharedTensor::zeroed(&[16], DataType::F32).ctx("x rank")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let late = SharedTensor::zeroed(&[2, 8], DataType::F32).ctx("late")?;
    let cases: Vec<(Vec<Arg<'_>>, &str, &str)> = vec![
        (vec![(&x).into()], "", "expects 2 arguments"),
        (
            vec![(&x_i32).into(), (&y).into()],
            "x",
            "expects dtype F32, got I32",
        ),
        (
            vec![(&x_short).into(), (&y).into()],
            "x",
            "dimension 1 = 8, got 7",
        ),
        (vec![(&x_rank).into(), (&y).into()], "x", "expects rank 2"),
        (vec![(&x).into(), 1.0f32.into()], "y", "a scalar was given"),
        (
            vec![(&late).into(), (&y).into()],
            "x",
            "created after prepare()",
        ),
    ];
    for (args, param, want) in cases {
        let e = rt.call(args).unwrap_err();
        let ok = match &e {
            Error::Argument {
                param: p, message, ..
            } => p == param && message.contains(want),
            Error::Program(m) => param.is_empty() && m.contains(want),
            _ => false,
        };
        check!(ok, "expected {want:?} about {param:?}, got {e}");
    }
    rt.call((&x, &y))
        .ctx("a good dispatch after the refused ones")?;
    rt.close().ctx("close")
}

pub fn registrations_dispatch_and_can_be_released<M: Mode>() -> Outcome {
    let compiled = scale_program().compile(&l3::<M>(1)).ctx("compile")?;
    let t = SharedTensor::from_data(&[4], &[1f32; 4]).ctx("t")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let r1 = rt.register(&compiled).ctx("register")?;
    let r2 = rt.register(&compiled).ctx("register again")?;
    check!(
        r1 == r2,
        "registering the same program twice gives the same handle"
    );
    r1.call((&t, 2.0f32)).ctx("call through the registration")?;
    r2.call((&t, 2.0f32)).ctx("and its twin")?;
    check!(t.to_vec::<f32>().ctx("t")? == vec![4.0; 4], "t = 1 * 2 * 2");
    r1.unregister();
    check!(r2.is_closed(), "the twin is released too");
    let e = r2.call((&t, 2.0f32)).unwrap_err();
    check!(
        matches!(&e, Error::Program(m) if m.contains("released")),
        "{e}"
    );
    let r3 = rt.register(&compiled).ctx("register after unregister")?;
    check!(r3 != r1 && !r3.is_closed(), "a new registration");
    rt.close().ctx("close")?;
    check!(r3.is_closed(), "close releases registrations");
    Ok(())
}

/// A level-2 program: a chip orchestration with a signature, on one chip (mode does not
/// apply: the chip runs in this process).
pub fn a_level_2_program_runs_on_one_chip<M: Mode>() -> Outcome {
    let mut p = Program::new(
        "axpy",
        Signature::new()
            .input("x", DataType::F32, [16u64])
            .inout("y", DataType::F32, [16u64])
            .scalar("a", DataType::F32)
            .fixed_scalar("unused", 7u32),
    );
    let axpy = p.kernel("axpy", |ctx| {
        let a: f32 = ctx.scalar(0)?;
        let x = ctx.input::<f32>(0)?.to_vec();
        let mut y = ctx.output::<f32>(1)?;
        for (i, v) in x.iter().enumerate() {
            let cur = y.get_flat(i as u64).unwrap_or(0.0);
            y.set_flat(i as u64, a * v + cur)?;
        }
        Ok(())
    });
    p.orchestrate_chip(move |o, a| {
        check_fixed(a)?;
        o.submit_aiv(
            axpy,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .inout(&a.tensor(1)?)
                .scalar(a.scalar::<f32>(0)?),
        )?;
        Ok(())
    });
    let e = p.compile(&l3::<M>(1)).unwrap_err();
    check!(
        matches!(&e, Error::Program(m) if m.contains("level-2 program")),
        "{e}"
    );
    let compiled = p
        .compile(&Target::chip(ChipConfig::default()))
        .ctx("compile")?;
    let x = SharedTensor::from_data(&[16], &[1f32; 16]).ctx("x")?;
    let y = SharedTensor::from_data(&[16], &[10f32; 16]).ctx("y")?;
    compiled.run_once((&x, &y, 2.0f32)).ctx("one shot")?;
    check!(y.to_vec::<f32>().ctx("y")? == vec![12.0; 16], "y = 2 x + y");
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let dy = rt
        .alloc_tensor_from(&[16], &[1f32; 16], 0)
        .ctx("resident y")?;
    let h = rt.submit(&compiled, (&x, &dy, 3.0f32)).ctx("submit")?;
    check!(h.is_done(), "a chip dispatch is done when submit returns");
    h.result(None).ctx("result")?;
    let mut back = [0f32; 16];
    rt.copy_from(&mut back, &dy, CopyRange::bytes(64))
        .ctx("read")?;
    check!(back == [4.0; 16], "resident y = 3 x + 1");
    let (_, total) = rt.device_memory_info(0).ctx("info")?;
    check!(
        total == ChipConfig::default().device_memory_bytes,
        "the card's capacity"
    );
    let e = rt.alloc_tensor(&[4], DataType::F32, 1).unwrap_err();
    check!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("worker 0")),
        "{e}"
    );
    rt.close().ctx("close")
}

fn check_fixed(a: &ChipArgs) -> Result<(), strata::chip::ChipError> {
    if a.scalar::<u32>(1)? != 7 {
        return Err(strata::chip::ChipError::InvalidRunArgs(
            "the fixed scalar is passed in its place".into(),
        ));
    }
    Ok(())
}

/// `Prepare::prewarm` builds the chips' ring heaps for a sizing while the worker starts:
/// they are committed before any dispatch, and a dispatch with that sizing keeps them.
pub fn prewarm_builds_the_ring_heaps_while_preparing<M: Mode>() -> Outcome {
    let compiled = scale_program().compile(&l3::<M>(1)).ctx("compile")?;
    let mut sizing = CallConfig::default();
    for r in sizing.rings.iter_mut() {
        r.heap_bytes = Some(3 << 20);
    }
    let heaps = 4 * (3u64 << 20);
    let cold = compiled.prepare(Prepare::new()).ctx("prepare cold")?;
    let cold_committed = cold.committed_device_memory(0).ctx("cold")?;
    cold.close().ctx("close cold")?;
    check!(
        cold_committed < heaps,
        "nothing is built before a dispatch ({cold_committed} bytes)"
    );
    let warm = compiled
        .prepare(Prepare::new().prewarm(&sizing))
        .ctx("prepare warm")?;
    let warm_committed = warm.committed_device_memory(0).ctx("warm")?;
    check!(
        warm_committed >= heaps,
        "the four 3 MiB ring heaps are committed while preparing ({warm_committed} bytes)"
    );
    let t = warm.alloc_tensor_from(&[4], &[1f32; 4], 0).ctx("t")?;
    warm.run_with(&compiled, (&t, 2.0f32), &sizing)
        .ctx("dispatch with the sizing")?;
    let after = warm.committed_device_memory(0).ctx("after")?;
    check!(
        after == warm_committed + 1024,
        "the dispatch reused the heaps: {warm_committed} + the 1 KiB tensor, got {after}"
    );
    warm.close().ctx("close warm")
}

/// A kernel that fails, and the chip orchestration that runs it.
fn failing_chip(p: &mut Program) -> strata::chip::OrchHandle {
    let k = p.kernel("fail", |_ctx| {
        Err(KernelError::new("deliberate kernel failure").into())
    });
    p.chip_orchestration("fail", move |o, _a| {
        o.submit_aiv(k, &CoreArgs::new())?;
        Ok(())
    })
}

/// A chip's failure reaches the caller as `Error::Chip`, whether the chip is the worker
/// (level 2), a child of it (level 3), or a child of a level-3 child (level 4).
pub fn a_chip_failure_is_one_error_at_every_level<M: Mode>() -> Outcome {
    let is_chip_failure = |e: &Error| {
        matches!(e, Error::Chip { kind: strata::FailureKind::Task, message, .. }
            if message.contains("deliberate kernel failure"))
    };
    // Level 2.
    let mut p2 = Program::new("fail_l2", Signature::new());
    let k = p2.kernel("fail", |_ctx| {
        Err(KernelError::new("deliberate kernel failure").into())
    });
    p2.orchestrate_chip(move |o, _a| {
        o.submit_aiv(k, &CoreArgs::new())?;
        Ok(())
    });
    let e = p2
        .compile(&Target::chip(ChipConfig::default()))
        .ctx("compile l2")?
        .run_once(())
        .unwrap_err();
    check!(is_chip_failure(&e), "level 2: {e:?}");
    check!(
        matches!(e, Error::Chip { worker: 0, .. }),
        "level 2 names chip 0"
    );

    // Level 3: the failing chip is worker 1.
    let mut p3 = Program::new("fail_l3", Signature::new());
    let chip = failing_chip(&mut p3);
    p3.orchestrate(move |o, _| {
        o.submit_next_level(chip, &TaskArgs::new(), 1)?;
        Ok(())
    });
    let e = p3
        .compile(&l3::<M>(2))
        .ctx("compile l3")?
        .run_once(())
        .unwrap_err();
    check!(is_chip_failure(&e), "level 3: {e:?}");
    check!(
        matches!(e, Error::Chip { worker: 1, .. }),
        "level 3 names chip 1: {e:?}"
    );

    // Level 4: level-3 child 1 runs an orchestration that sends the failing kernel to its
    // chip.
    let mut p4 = Program::new("fail_l4", Signature::new());
    let chip = failing_chip(&mut p4);
    let inner = p4.worker_orchestration("inner", move |o, _| {
        o.submit_next_level(chip, &TaskArgs::new(), 0)?;
        Ok(())
    });
    p4.orchestrate(move |o, _| {
        o.submit_next_level(inner, &TaskArgs::new(), 1)?;
        Ok(())
    });
    let target = Target::l4(vec![l3::<M>(1), l3::<M>(1)]).configure(|c| c.exec_mode = M::VALUE);
    let e = p4
        .compile(&target)
        .ctx("compile l4")?
        .run_once(())
        .unwrap_err();
    check!(is_chip_failure(&e), "level 4: {e:?}");
    check!(
        matches!(e, Error::Chip { worker: 1, .. }),
        "level 4 names level-3 child 1: {e:?}"
    );
    Ok(())
}

/// A `MAP_SHARED` anonymous mapping of `len` bytes, unmapped on drop.
struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

impl SharedMap {
    fn new(len: usize) -> SharedMap {
        // SAFETY: a fresh anonymous shared mapping, owned by the value.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        SharedMap { ptr: p.cast(), len }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes and lives as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped; nothing refers to it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Host memory listed at prepare is used in place (uploads and downloads see the same
/// bytes without a staging copy); a read-only one refuses a download; one range listed
/// both read-only and writable is refused; it is never a dispatch argument.
pub fn inherited_host_memory_is_copied_in_place<M: Mode>() -> Outcome {
    // No staging memory at all: only in-place copies can work.
    let target = l3::<M>(1).configure(|c| c.staging_bytes = 0);
    let compiled = scale_program().compile(&target).ctx("compile")?;
    let (mut weights, mut results) = (SharedMap::new(1 << 16), SharedMap::new(1 << 16));
    for (i, b) in weights.bytes().iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    // SAFETY: the mappings outlive the prepared workers (dropped at the end).
    let both = unsafe {
        Prepare::new()
            .inherit_raw(weights.ptr, 4096, true)
            .inherit_raw(weights.ptr, 4096, false)
    };
    let e = compiled.prepare(both).unwrap_err();
    check!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("both read-only and writable")),
        "one range read-only and writable: {e}"
    );
    // Two views of the weights (overlapping) collapse into one; the results are writable.
    // SAFETY: as above.
    let options = unsafe {
        Prepare::new()
            .inherit_raw(weights.ptr, 1 << 15, true)
            .inherit_raw(weights.ptr.add(1 << 14), (1 << 16) - (1 << 14), true)
            .inherit_raw(results.ptr, 1 << 16, false)
    };
    let rt = compiled.prepare(options).ctx("prepare")?;
    let t = rt
        .alloc_tensor_from(&[1 << 16], &weights.bytes()[..], 0)
        .ctx("alloc with the inherited weights as init")?;
    let e = rt
        .copy_to(&t, &[1u8, 2, 3], CopyRange::bytes(3))
        .unwrap_err();
    check!(
        e.to_string().contains("staging"),
        "plain memory needs staging, which is off: {e}"
    );
    rt.copy_to(&t, &weights.bytes()[..], CopyRange::bytes(1 << 16))
        .ctx("upload from the inherited weights")?;
    rt.copy_from(&mut results.bytes()[..], &t, CopyRange::bytes(1 << 16))
        .ctx("download into the inherited results")?;
    let (w, r) = (weights.bytes().to_vec(), results.bytes().to_vec());
    check!(r == w, "the bytes went through the chip and back");
    let e = rt
        .copy_from(&mut weights.bytes()[..16], &t, CopyRange::bytes(16))
        .unwrap_err();
    check!(
        e.to_string().contains("read-only"),
        "a download into read-only memory: {e}"
    );
    rt.close().ctx("close")?;
    drop((weights, results));

    // A read-only shared file mapping handed over safely (the worker keeps it alive).
    let path = std::env::temp_dir().join(format!("strata-inherit-{}", std::process::id()));
    let data: Vec<u8> = (0..8192).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(&path, &data).ctx("write the weights file")?;
    let file = std::fs::File::open(&path).ctx("open")?;
    std::fs::remove_file(&path).ctx("unlink")?;
    // SAFETY: nobody writes or truncates the (unlinked) file while it is mapped.
    let map = std::sync::Arc::new(unsafe { memmap2::Mmap::map(&file) }.ctx("map")?);
    let rt = compiled
        .prepare(Prepare::new().inherit_read_only(map.clone()))
        .ctx("prepare with a file mapping")?;
    let t = rt
        .alloc_tensor_from(&[8192], &map[..], 0)
        .ctx("upload in place")?;
    let mut back = vec![0u8; 8192];
    let e = rt
        .copy_from(&mut back, &t, CopyRange::bytes(8192))
        .unwrap_err();
    check!(
        e.to_string().contains("staging"),
        "plain memory still needs staging: {e}"
    );
    rt.close().ctx("close")?;
    Ok(())
}

/// `benchmark()` on a level-2 program: one launch per measured round, warm-up rounds left
/// out, every figure the one its raw spans give.
pub fn a_level_2_benchmark_measures_every_round_from_its_spans<M: Mode>() -> Outcome {
    let mut p = Program::new("touch", Signature::new().inout("t", DataType::F32, [64u64]));
    let k = p.kernel("touch", |ctx| {
        let mut t = ctx.output::<f32>(0)?;
        for v in t.as_mut_slice().ok_or("contiguous")? {
            *v += 1.0;
        }
        Ok(())
    });
    p.orchestrate_chip(move |o, a| {
        o.submit_aiv(k, CoreArgs::new().inout(&a.tensor(0)?))?;
        Ok(())
    });
    let compiled = p
        .compile(&Target::chip(ChipConfig::default()))
        .ctx("compile")?;
    let t = SharedTensor::zeroed(&[64], DataType::F32).ctx("t")?;
    let e = strata::benchmark(&compiled, (&t,), 0, 1).unwrap_err();
    check!(e.to_string().contains("rounds must be at least 1"), "{e}");
    let stats = strata::benchmark(&compiled, (&t,), 5, 2).ctx("benchmark")?;
    check!(
        t.to_vec::<f32>().ctx("t")? == vec![7.0; 64],
        "2 warm-up + 5 measured dispatches ran (each adds 1)"
    );
    check!(stats.rounds == 5 && stats.warmup == 2, "{stats:?}");
    check!(
        stats.invocations.len() == 5,
        "one launch per measured round"
    );
    for (i, inv) in stats.invocations.iter().enumerate() {
        let raw = |name: &str| {
            inv.spans
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.dur as f64 / 1000.0)
        };
        check!(
            raw("chip.run.runner_run.device_wall") == Some(stats.device_wall_us[i]),
            "round {i}: the device sample is the device_wall span"
        );
        check!(
            raw("chip.run") == Some(stats.host_wall_us[i]),
            "round {i}: the host sample is the chip.run span"
        );
        check!(
            inv.task_name == "touch",
            "the launch names its program: {}",
            inv.task_name
        );
    }
    check!(
        !stats.all_zero_device(),
        "the emulator times its device phases"
    );
    let mean = stats.format_mean_tree(true, strata::bench::Spread::Stdev, None, None);
    check!(
        mean.starts_with(
            "mean of 5 launches (warmup 2 excluded); each node: mean ±stdev:\nchip.run"
        ),
        "{mean}"
    );
    check!(
        stats
            .to_string()
            .starts_with("BenchmarkStats(rounds=5, warmup=2): device_wall_us min="),
        "{stats}"
    );
    Ok(())
}

/// How the level-3 benchmark program shapes its rounds: rank 0 runs `a` then `b`, rank 1
/// runs `a` (stable); rank 0's order flips every round (unstable slots); rank 0 runs one
/// task in even rounds and two in odd ones (flattened).
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    Stable,
    Flipping,
    Varying,
}

/// Rounds the level-3 benchmark program has run (its host orchestration runs in this
/// process, so a static counts them in both modes).
static ROUND: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A level-3 program of two chips whose rounds have the structure `shape` gives; each task
/// adds 1 (`a`) or 2 (`b`) to its rank's row.
fn shaped_program(shape: Shape) -> Program {
    let mut p = Program::new(
        "shaped",
        Signature::new().inout("t", DataType::F32, [Dim::World, Dim::Fixed(64)]),
    );
    let add = |p: &mut Program, name: &str, by: f32| {
        let k = p.kernel(name, move |ctx| {
            let mut t = ctx.output::<f32>(0)?;
            for v in t.as_mut_slice().ok_or("contiguous")? {
                *v += by;
            }
            Ok(())
        });
        p.chip_orchestration(&format!("{name}_on_chip"), move |o, a| {
            o.submit_aiv(k, CoreArgs::new().inout(&a.tensor(0)?))?;
            Ok(())
        })
    };
    let a = add(&mut p, "a", 1.0);
    let b = add(&mut p, "b", 2.0);
    p.orchestrate(move |o, args| {
        let t = args.tensor("t")?;
        let round = ROUND.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let rank0 = match shape {
            Shape::Stable => vec![a, b],
            Shape::Flipping if round % 2 == 1 => vec![b, a],
            Shape::Flipping => vec![a, b],
            Shape::Varying if round % 2 == 1 => vec![a, b],
            Shape::Varying => vec![a],
        };
        for task in rank0 {
            o.submit_next_level(task, &TaskArgs::new().inout(t.row(0)), 0)?;
        }
        o.submit_next_level(a, &TaskArgs::new().inout(t.row(1)), 1)?;
        Ok(())
    });
    p
}

/// A launch's raw span `name`, µs (the figure every view must be built from).
fn raw_us(inv: &strata::Invocation, name: &str) -> Option<f64> {
    inv.spans
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.dur as f64 / 1000.0)
}

const DEVICE_WALL: &str = "chip.run.runner_run.device_wall";

/// `benchmark()` on a level-3 program whose rounds are known: rank 0 runs `a_on_chip` then
/// `b_on_chip`, rank 1 `a_on_chip`. Every view is recomputed here from the raw spans of
/// the measured launches (three per round, in order of their start): a rank's figure in a
/// round is the sum of its launches' spans, the round's the max across ranks, a slot's the
/// launch at that position of its rank; slots name the registered chip orchestration
/// (`program/name`). Traced and untraced dispatches of the same worker record launches and
/// traces as documented.
pub fn a_level_3_benchmark_builds_every_view_from_the_chips_spans<M: Mode>() -> Outcome {
    let compiled = shaped_program(Shape::Stable)
        .compile(&l3::<M>(2))
        .ctx("compile")?;
    let t = SharedTensor::zeroed(&[2, 64], DataType::F32).ctx("t")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    let (rounds, warmup) = (4, 2);
    let stats = rt
        .benchmark(&compiled, (&t,), rounds, warmup)
        .ctx("benchmark")?;
    let got = t.to_vec::<f32>().ctx("t")?;
    check!(
        got[..64] == [18.0; 64] && got[64..] == [6.0; 64],
        "6 dispatches ran (rank 0 adds 3, rank 1 adds 1 each)"
    );
    check!(
        stats.rounds == rounds && stats.warmup == warmup,
        "{stats:?}"
    );
    check!(
        stats.invocations.len() == 3 * rounds,
        "three launches per measured round, warm-up excluded: {}",
        stats.invocations.len()
    );
    check!(
        !stats.fallback_flattened && !stats.unstable_dispatch_slots,
        "stable shape"
    );
    // Ranks and slots from the raw launches alone.
    let mut ranks: std::collections::BTreeMap<u32, Vec<Vec<&strata::Invocation>>> =
        Default::default();
    for (k, round) in stats.invocations.chunks(3).enumerate() {
        for inv in round {
            let per_round = ranks.entry(inv.pid).or_default();
            per_round.resize(k + 1, Vec::new());
            per_round[k].push(inv);
        }
    }
    check!(
        ranks.len() == 2,
        "two ranks (chip pids): {:?}",
        ranks.keys()
    );
    let (&busy, _) = ranks
        .iter()
        .find(|(_, r)| r.iter().all(|v| v.len() == 2))
        .ok_or("one rank runs two launches every round")?;
    let (&single, _) = ranks
        .iter()
        .find(|(_, r)| r.iter().all(|v| v.len() == 1))
        .ok_or("one rank runs one launch every round")?;
    let want_tasks: std::collections::BTreeMap<(u32, usize), String> = [
        ((busy, 0), "shaped/a_on_chip"),
        ((busy, 1), "shaped/b_on_chip"),
        ((single, 0), "shaped/a_on_chip"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect();
    check!(
        stats.dispatch_tasks() == want_tasks,
        "dispatch_tasks: {:?}",
        stats.dispatch_tasks()
    );
    let groups = stats.dispatch_groups();
    check!(
        groups.len() == 3 && groups.values().all(|g| g.len() == rounds),
        "three slots, one launch per round each"
    );
    // Per rank: the sum of its launches' device walls in each round.
    let rank_sum = |pid: u32, k: usize, name: &str| -> f64 {
        ranks[&pid][k]
            .iter()
            .map(|i| raw_us(i, name).unwrap_or(0.0))
            .sum()
    };
    let per_rank = stats.per_rank(strata::bench::Metric::Device);
    for pid in [busy, single] {
        let want: Vec<f64> = (0..rounds).map(|k| rank_sum(pid, k, DEVICE_WALL)).collect();
        check!(
            per_rank.get(&pid) == Some(&want),
            "per_rank[{pid}] = {:?}, want {want:?}",
            per_rank.get(&pid)
        );
    }
    // Per round: the max across ranks of those sums (device and host).
    for k in 0..rounds {
        let dev = rank_sum(busy, k, DEVICE_WALL).max(rank_sum(single, k, DEVICE_WALL));
        let host = rank_sum(busy, k, "chip.run").max(rank_sum(single, k, "chip.run"));
        check!(
            stats.per_round(strata::bench::RoundMetric::Device)[k] == dev
                && stats.device_wall_us[k] == dev,
            "round {k}: device {} want {dev}",
            stats.device_wall_us[k]
        );
        check!(
            stats.per_round(strata::bench::RoundMetric::Host)[k] == host,
            "round {k}: host want {host}"
        );
        let roots: Vec<&strata::chip::Span> = stats.invocations[3 * k..3 * k + 3]
            .iter()
            .map(|i| i.spans.iter().find(|s| s.name == "chip.run").unwrap())
            .collect();
        let union = (roots.iter().map(|s| s.ts + s.dur).max().unwrap()
            - roots.iter().map(|s| s.ts).min().unwrap()) as f64
            / 1000.0;
        check!(
            stats.per_round(strata::bench::RoundMetric::Union)[k] == union,
            "round {k}: union want {union}"
        );
    }
    // Per dispatch: each slot's own launch, no summing.
    let per_dispatch = stats.per_dispatch(strata::bench::Metric::Host);
    for ((pid, slot), v) in &per_dispatch {
        let want: Vec<f64> = (0..rounds)
            .map(|k| raw_us(ranks[pid][k][*slot], "chip.run").unwrap_or(-1.0))
            .collect();
        check!(
            v == &want,
            "per_dispatch[({pid}, {slot})] = {v:?}, want {want:?}"
        );
    }
    check!(per_dispatch.len() == 3, "three slots in per_dispatch");
    let mean = stats.format_mean_tree(true, strata::bench::Spread::Both, None, None);
    check!(
        mean.matches(&format!(
            "mean of {rounds} launches (warmup {warmup} excluded)"
        ))
        .count()
            == 3,
        "one mean tree per slot:\n{mean}"
    );

    // A traced dispatch records its launches and its whole trace; an untraced one neither.
    let h = rt
        .submit_with(
            &compiled,
            (&t,),
            &strata::types::CallConfig::default().with_trace(true),
        )
        .ctx("traced submit")?;
    h.result(None).ctx("traced dispatch")?;
    let trace = h.trace().ok_or("a traced dispatch has a trace")?;
    check!(
        h.invocations().len() == 3,
        "three chip runs: {:?}",
        h.invocations().len()
    );
    check!(
        trace
            .processes
            .iter()
            .any(|p| p.spans.iter().any(|s| s.name == "l3.run")),
        "the engine's own span"
    );
    let h = rt.submit(&compiled, (&t,)).ctx("untraced submit")?;
    h.result(None).ctx("untraced dispatch")?;
    check!(
        h.trace().is_none() && h.invocations().is_empty(),
        "an untraced level-3 dispatch records nothing"
    );
    rt.close().ctx("close")
}

/// A slot that runs different tasks in different rounds empties the per-dispatch views and
/// says so; rounds of different shapes fall back to a flat pool of every launch.
pub fn a_level_3_benchmark_flags_unstable_slots_and_flattens_varying_rounds<M: Mode>() -> Outcome {
    let t = SharedTensor::zeroed(&[2, 64], DataType::F32).ctx("t")?;
    let compiled = shaped_program(Shape::Flipping)
        .compile(&l3::<M>(2))
        .ctx("compile")?;
    ROUND.store(0, std::sync::atomic::Ordering::Relaxed);
    let stats = strata::benchmark(&compiled, (&t,), 4, 0).ctx("flipping")?;
    check!(
        stats.unstable_dispatch_slots && !stats.fallback_flattened,
        "{stats:?}"
    );
    check!(
        stats.dispatch_groups().is_empty()
            && stats.per_dispatch(strata::bench::Metric::Device).is_empty()
            && stats.dispatch_tasks().is_empty(),
        "the per-dispatch views are empty"
    );
    check!(
        stats.per_rank(strata::bench::Metric::Device).len() == 2 && stats.device_wall_us.len() == 4,
        "the per-rank and per-round views stay"
    );

    let compiled = shaped_program(Shape::Varying)
        .compile(&l3::<M>(2))
        .ctx("compile")?;
    ROUND.store(0, std::sync::atomic::Ordering::Relaxed);
    let stats = strata::benchmark(&compiled, (&t,), 4, 0).ctx("varying")?;
    check!(stats.fallback_flattened, "{stats:?}");
    check!(
        stats.invocations.len() == 2 + 3 + 2 + 3,
        "every launch: {}",
        stats.invocations.len()
    );
    let want: Vec<f64> = stats
        .invocations
        .iter()
        .map(|i| raw_us(i, DEVICE_WALL).unwrap_or(-1.0))
        .collect();
    check!(
        stats.device_wall_us == want,
        "one sample per launch, in order"
    );
    check!(
        stats.per_rank(strata::bench::Metric::Device).is_empty()
            && stats.dispatch_groups().is_empty()
            && stats
                .per_round(strata::bench::RoundMetric::Union)
                .is_empty(),
        "no rank, slot or round views when flattened"
    );
    Ok(())
}
