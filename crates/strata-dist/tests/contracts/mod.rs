//! The contracts of strata-dist's engine, written once over the execution mode and run by
//! both `processes.rs` (`ExecMode::Process`) and `threads.rs` (`ExecMode::Threads`):
//! goldens, ordering (INOUT chains, write-after-read), poisoning and fail-fast, groups and
//! their reservations, lifecycle misuse, closing with runs in flight, device memory, level 4
//! over level 3. Where the mode shows (pids, where a closure's state lives) the contract
//! states both expectations.
//!
//! State a callable shares with the test goes through shared memory
//! (`common::SharedWords`, `common::Lab`), never an `Arc`, so that it is the same state
//! in a forked child as in a thread.

use crate::common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, CoreArgs};
use strata_dist::*;
use strata_host::{ExecMode, SharedTensor};
use strata_types::{ArgTag, DataType, TaskArgs};

/// Every contract, instantiated for the mode `M`.
pub fn suite<M: Mode>() -> Vec<Scenario> {
    contracts![M;
        l3_two_chips_and_a_sub_worker_match_the_host_golden,
        l4_with_two_level_3_children_matches_the_host_golden,
        closures_capture_state_and_run_in_the_children,
        three_sub_workers_sleeping_50ms_overlap,
        thousands_of_rounds_reuse_the_same_children,
        init_close_cycles_reuse_the_heap_rings_and_dropped_tensors_are_refused,
        an_idle_worker_with_4_chips_and_2_sub_workers_barely_uses_the_cpu,
        sub_tasks_run_and_dependencies_order_them,
        readers_of_one_buffer_run_concurrently_and_a_writer_waits_for_them,
        a_failing_sub_task_poisons_downstream_and_the_run_reports_it,
        orchestration_errors_are_synchronous_and_the_worker_stays_usable,
        a_submit_after_a_failure_rethrows_the_runs_first_error,
        groups_launch_together_and_dependents_wait_for_every_member,
        submit_returns_before_completion_and_a_wait_timeout_is_retryable,
        two_runs_are_in_flight_and_results_follow_submit_order,
        runtime_intermediates_carry_data_between_tasks,
        bad_arguments_are_typed_errors,
        chips_and_a_sub_worker_compute_against_a_host_golden,
        device_tensors_stay_resident_on_their_chip,
        host_bytes_copy_to_and_from_chip_tensors_at_offsets,
        an_adopted_shared_mapping_is_copied_in_place,
        a_level_4_worker_drives_level_3_children,
        lifecycle_misuse_is_refused,
        a_blocked_group_reserves_its_targets_and_precedes_conflicting_singles,
        a_group_never_overtakes_a_single_submitted_before_it_on_a_worker,
        a_later_single_never_overtakes_a_group_behind_another_blocked_group,
        a_task_a_completion_makes_ready_never_overtakes_a_batched_earlier_one,
        group_members_run_on_the_worker_ids_they_name,
        a_busy_worker_does_not_hold_up_other_workers_or_sub_tasks,
        a_sub_worker_failure_two_levels_down_surfaces_at_level_4,
        overlapping_writes_within_one_task_are_refused_at_submit,
        close_with_a_run_in_flight_drains_it,
        a_failed_run_reports_its_error_on_every_wait,
        alloc_hands_over_batched_tasks_before_waiting_for_ring_space,
        re_registering_a_name_replaces_the_callable,
    ]
}

// -------------------------------------------------------------------------------------
// Goldens, closures, concurrency, rounds, init/close cycles, idle cost
// -------------------------------------------------------------------------------------

pub fn l3_two_chips_and_a_sub_worker_match_the_host_golden<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = DistWorker::new(l3_config(mode, 2, 1)).ctx("new")?;
    let p = register_pair_sum(&mut w)?;
    let (inputs, golden) = pair_inputs(&w, 1.5)?;
    let out = w.shared_tensor(&[N], DataType::F32).ctx("out")?;
    w.init().ctx("init")?;
    check!(
        w.child_pids().len() == expected_pids(mode, 3),
        "2 chips + 1 sub-worker = 3 child processes (none in threads): {:?}",
        w.child_pids()
    );
    for round in 0..5 {
        out.write(&vec![f32::NAN; N as usize]).ctx("poison out")?;
        w.run(&p.orch, &pair_args(&inputs, &out)).ctx("run")?;
        same(&out.to_vec::<f32>().ctx("read")?, &golden)
            .map_err(|e| format!("round {round}: {e}"))?;
    }
    w.close().ctx("close")?;
    Ok(())
}

pub fn l4_with_two_level_3_children_matches_the_host_golden<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut top = DistWorker::new(DistConfig::l4(1).with_exec_mode(mode)).ctx("new l4")?;
    let p = register_pair_sum(&mut top)?;
    let add = top.register_sub("add", |call| {
        let x = call.tensor::<f32>(0)?.to_vec();
        let y = call.tensor::<f32>(1)?.to_vec();
        let mut o = call.tensor_mut::<f32>(2)?;
        for (i, (x, y)) in x.iter().zip(&y).enumerate() {
            o.set(&[i as u64], x + y)?;
        }
        Ok(())
    });
    let (in0, g0) = pair_inputs(&top, 1.0)?;
    let (in1, g1) = pair_inputs(&top, -2.0)?;
    let o0 = top.shared_tensor(&[N], DataType::F32).ctx("o0")?;
    let o1 = top.shared_tensor(&[N], DataType::F32).ctx("o1")?;
    let total = top.shared_tensor(&[N], DataType::F32).ctx("total")?;
    let c0 = top
        .add_worker(DistWorker::new(l3_config(mode, 2, 1)).ctx("child 0")?)
        .ctx("add 0")?;
    let c1 = top
        .add_worker(DistWorker::new(l3_config(mode, 2, 1)).ctx("child 1")?)
        .ctx("add 1")?;
    let (a0, a1) = (pair_args(&in0, &o0), pair_args(&in1, &o1));
    let (o0a, o1a, ta) = (o0.clone(), o1.clone(), total.clone());
    let outer = top.register_orchestration("outer", move |o, _| {
        o.submit_next_level(p.orch, &a0, c0)?;
        o.submit_next_level(p.orch, &a1, c1)?;
        o.submit_sub(
            &add,
            &args(
                &[
                    o0a.arg(ArgTag::Input),
                    o1a.arg(ArgTag::Input),
                    ta.arg(ArgTag::OutputExisting),
                ],
                &[],
            ),
        )?;
        Ok(())
    });
    top.init().ctx("init")?;
    check!(
        top.child_pids().len() == expected_pids(mode, 3),
        "2 level-3 children + 1 sub-worker, got {:?}",
        top.child_pids()
    );
    let golden: Vec<f32> = g0.iter().zip(&g1).map(|(a, b)| a + b).collect();
    for round in 0..3 {
        total.write(&vec![f32::NAN; N as usize]).ctx("poison")?;
        top.run(&outer, &TaskArgs::new()).ctx("run")?;
        same(&o0.to_vec::<f32>().ctx("o0")?, &g0)
            .map_err(|e| format!("round {round} child 0: {e}"))?;
        same(&o1.to_vec::<f32>().ctx("o1")?, &g1)
            .map_err(|e| format!("round {round} child 1: {e}"))?;
        same(&total.to_vec::<f32>().ctx("total")?, &golden)
            .map_err(|e| format!("round {round} total: {e}"))?;
    }
    top.close().ctx("close")?;
    Ok(())
}

/// A sub callable's captured state (never serialized) runs where its child runs: in each
/// forked child's copy of the address space (the parent's counter never moves), or in
/// this process with threads (the parent's counter counts every call).
pub fn closures_capture_state_and_run_in_the_children<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = DistWorker::new(l3_config(mode, 0, 2)).ctx("new")?;
    // Captured state: a table the parent built and a counter the calls increment.
    let table: Vec<u64> = (0..64).map(|i| i * i + 7).collect();
    let calls_here = Arc::new(AtomicU64::new(0));
    let c = calls_here.clone();
    let lookup = w.register_sub("lookup", move |call| {
        c.fetch_add(1, Ordering::SeqCst);
        let i: u64 = call.scalar(0).ok_or("index")?;
        let pid = std::process::id() as u64;
        let mut o = call.tensor_mut::<u64>(0)?;
        o.set(&[0], table[i as usize])?;
        o.set(&[1], pid)?;
        Ok(())
    });
    let outs: Vec<SharedTensor> = (0..8)
        .map(|_| w.shared_tensor(&[2], DataType::U64))
        .collect::<Result<_, _>>()
        .ctx("outs")?;
    let oa = outs.clone();
    let orch = w.register_orchestration("lookups", move |o, _| {
        for (i, t) in oa.iter().enumerate() {
            o.submit_sub(
                &lookup,
                &args(&[t.arg(ArgTag::OutputExisting)], &[i as u64 * 5]),
            )?;
        }
        Ok(())
    });
    w.init().ctx("init")?;
    w.run(&orch, &TaskArgs::new()).ctx("run")?;
    let me = std::process::id() as u64;
    let children: Vec<u64> = w.child_pids().iter().map(|&p| p as u64).collect();
    for (i, t) in outs.iter().enumerate() {
        let v = t.to_vec::<u64>().ctx("read")?;
        let k = i as u64 * 5;
        check!(v[0] == k * k + 7, "task {i}: captured table gave {}", v[0]);
        match mode {
            ExecMode::Process => check!(
                v[1] != me && children.contains(&v[1]),
                "task {i} ran in pid {} (children {children:?})",
                v[1]
            ),
            ExecMode::Threads => check!(v[1] == me, "task {i} ran in pid {}", v[1]),
        }
    }
    let calls = calls_here.load(Ordering::SeqCst);
    match mode {
        ExecMode::Process => check!(
            calls == 0,
            "the parent's counter changed ({calls}): the closure ran in the parent"
        ),
        ExecMode::Threads => check!(calls == 8, "threads share the parent's counter: {calls}"),
    }
    w.close().ctx("close")?;
    Ok(())
}

pub fn three_sub_workers_sleeping_50ms_overlap<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = DistWorker::new(l3_config(mode, 0, 3)).ctx("new")?;
    let marks = w.shared_tensor(&[3, 2], DataType::U64).ctx("marks")?;
    let nap = w.register_sub("nap", |call| {
        let start = mono_ns();
        std::thread::sleep(Duration::from_millis(50));
        let mut t = call.tensor_mut::<u64>(0)?;
        t.set(&[0, 0], start)?;
        t.set(&[0, 1], mono_ns())?;
        Ok(())
    });
    let ma = marks.clone();
    let parallel = w.register_orchestration("parallel", move |o, _| {
        for i in 0..3 {
            let v = ma.view().slice(0, i, i + 1)?;
            o.submit_sub(&nap, &args(&[ma.arg_view(v, ArgTag::OutputExisting)?], &[]))?;
        }
        Ok(())
    });
    w.init().ctx("init")?;
    w.run(&parallel, &TaskArgs::new()).ctx("warm-up")?;
    let t0 = Instant::now();
    w.run(&parallel, &TaskArgs::new()).ctx("run")?;
    let wall = t0.elapsed();
    let m = marks.to_vec::<u64>().ctx("read")?;
    let latest_start = m.iter().step_by(2).max().copied().unwrap_or(0);
    let earliest_end = m.iter().skip(1).step_by(2).min().copied().unwrap_or(0);
    println!(
        "    3 × 50 ms sub tasks: {wall:.2?} wall, {:.2} × the 150 ms serial time",
        wall.as_secs_f64() / 0.150
    );
    check!(
        latest_start < earliest_end,
        "the three naps did not overlap: starts/ends {m:?}"
    );
    w.close().ctx("close")?;
    Ok(())
}

pub fn thousands_of_rounds_reuse_the_same_children<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = DistWorker::new(l3_config(mode, 1, 2)).ctx("new")?;
    let x = w.shared_tensor_from(&[2], &[0u64, 0]).ctx("x")?;
    let inc = w.register_sub("inc", |call| {
        call.tensor_mut::<u64>(0)?.update(|v| v + 1);
        Ok(())
    });
    let noop = w
        .register_chip_orchestration("noop", |_, _| Ok(()))
        .ctx("chip noop")?;
    let xa = x.clone();
    let orch = w.register_orchestration("round", move |o, _| {
        let v0 = xa.view().slice(0, 0, 1)?;
        let v1 = xa.view().slice(0, 1, 2)?;
        o.submit_sub(&inc, &args(&[xa.arg_view(v0, ArgTag::InOut)?], &[]))?;
        o.submit_sub(&inc, &args(&[xa.arg_view(v1, ArgTag::InOut)?], &[]))?;
        o.submit_next_level(noop, &TaskArgs::new(), 0)?;
        o.submit_sub(&inc, &args(&[xa.arg_view(v0, ArgTag::InOut)?], &[]))?;
        Ok(())
    });
    w.init().ctx("init")?;
    let rounds = 2000u64;
    let t0 = Instant::now();
    let mut in_flight = std::collections::VecDeque::new();
    for _ in 0..rounds {
        in_flight.push_back(w.submit(&orch, &TaskArgs::new()).ctx("submit")?);
        if in_flight.len() == 2 {
            in_flight
                .pop_front()
                .map(|h| h.result())
                .transpose()
                .ctx("run")?;
        }
    }
    for h in in_flight {
        h.result().ctx("run")?;
    }
    println!(
        "    {rounds} runs of 4 tasks: {:.1} µs per task",
        t0.elapsed().as_secs_f64() * 1e6 / (rounds * 4) as f64
    );
    check!(
        x.to_vec::<u64>().ctx("read")? == vec![2 * rounds, rounds],
        "counts {:?}",
        x.to_vec::<u64>()
    );
    w.close().ctx("close")?;
    Ok(())
}

pub fn init_close_cycles_reuse_the_heap_rings_and_dropped_tensors_are_refused<M: Mode>() -> Outcome
{
    let mode = M::VALUE;
    let mem = strata_host::SharedMemory::process();
    let mut regions_after_first = 0;
    for cycle in 0..5 {
        let mut w = DistWorker::new(l3_config(mode, 1, 1)).ctx("new")?;
        let x = w.shared_tensor_from(&[4], &[1u32, 2, 3, 4]).ctx("x")?;
        let dropped = w.shared_tensor(&[4], DataType::U32).ctx("dropped")?;
        let stale = dropped.arg(ArgTag::Input);
        let noop = w.register_sub("noop", |_| Ok(()));
        let xa = x.clone();
        let orch = w.register_orchestration("use", move |o, a| {
            let use_stale: u64 = a.scalar_at(0).ok_or("which")?;
            let t = if use_stale == 1 {
                stale
            } else {
                xa.arg(ArgTag::Input)
            };
            let scratch = o.alloc(&[1024], DataType::U8)?;
            o.submit_sub(&noop, &args(&[t, scratch.arg(ArgTag::Output)], &[]))?;
            Ok(())
        });
        w.init().ctx("init")?;
        drop(dropped);
        w.run(&orch, &args(&[], &[0])).ctx("run")?;
        let e = w
            .run(&orch, &args(&[], &[1]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        check!(
            e.contains("was released"),
            "a dropped tensor is refused: {e:?}"
        );
        w.close().ctx("close")?;
        // Each cycle creates two tensors; the four heap rings come from the pool.
        if cycle == 0 {
            regions_after_first = mem.regions();
        } else {
            check!(
                mem.regions() == regions_after_first + 2 * cycle,
                "cycle {cycle}: {} regions, expected {} (heap rings reused)",
                mem.regions(),
                regions_after_first + 2 * cycle
            );
        }
    }
    Ok(())
}

/// Parked children cost (almost) nothing: the CPU of every child process and of this
/// one, which with threads holds every child.
pub fn an_idle_worker_with_4_chips_and_2_sub_workers_barely_uses_the_cpu<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = DistWorker::new(l3_config(mode, 4, 2)).ctx("new")?;
    let noop = w.register_sub("noop", |_| Ok(()));
    let chip_noop = w
        .register_chip_orchestration("noop", |_, _| Ok(()))
        .ctx("chip noop")?;
    let orch = w.register_orchestration("touch_all", move |o, _| {
        for c in 0..4 {
            o.submit_next_level(chip_noop, &TaskArgs::new(), c)?;
        }
        o.submit_sub(&noop, &TaskArgs::new())?;
        o.submit_sub(&noop, &TaskArgs::new())?;
        Ok(())
    });
    let t0 = Instant::now();
    w.init().ctx("init")?;
    let init = t0.elapsed();
    w.run(&orch, &TaskArgs::new()).ctx("run")?;
    std::thread::sleep(Duration::from_millis(300)); // past every spin budget: parked
    let mut pids = w.child_pids();
    pids.push(std::process::id() as i32);
    let before: u64 = pids
        .iter()
        .map(|&p| process_cpu_ns(p))
        .sum::<Result<_, _>>()?;
    let t1 = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let after: u64 = pids
        .iter()
        .map(|&p| process_cpu_ns(p))
        .sum::<Result<_, _>>()?;
    let percent = (after - before) as f64 / t1.elapsed().as_nanos() as f64 * 100.0;
    let t2 = Instant::now();
    w.close().ctx("close")?;
    println!(
        "    idle 4 chips + 2 subs (+ this process): {percent:.3} % of one core; init {init:.2?}, close {:.2?}",
        t2.elapsed()
    );
    check!(
        percent < 10.0,
        "an idle worker used {percent:.2} % of a core"
    );
    Ok(())
}

// -------------------------------------------------------------------------------------
// Ordering, failures, groups, lifecycle, device memory, level 4
// -------------------------------------------------------------------------------------

pub fn sub_tasks_run_and_dependencies_order_them<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 2);
    let x = w.shared_tensor_from(&[1], &[0u64]).unwrap();
    // Each task appends its scalar as a digit: x = x * 10 + d. Ordered by INOUT deps.
    let append = w.register_sub("append", |call| {
        let d: u64 = call.scalar(0).ok_or("missing digit")?;
        let mut t = call.tensor_mut::<u64>(0)?;
        t.update(|v| v * 10 + d);
        Ok(())
    });
    let xa = x.clone();
    let orch = w.register_orchestration("digits", move |o, _| {
        for d in 1..=9u64 {
            o.submit_sub(&append, &args(&[xa.arg(ArgTag::InOut)], &[d]))?;
        }
        Ok(())
    });
    w.init().unwrap();
    w.run(&orch, &TaskArgs::new()).unwrap();
    assert_eq!(x.to_vec::<u64>().unwrap(), vec![123_456_789]);
    // Many runs reuse everything.
    for _ in 0..20 {
        x.write(&[0u64]).unwrap();
        w.run(&orch, &TaskArgs::new()).unwrap();
        assert_eq!(x.to_vec::<u64>().unwrap(), vec![123_456_789]);
    }
    w.close().unwrap();
    Ok(())
}

pub fn readers_of_one_buffer_run_concurrently_and_a_writer_waits_for_them<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 3);
    let x = w.shared_tensor_from(&[1], &[7u64]).unwrap();
    let out = w.shared_tensor(&[3], DataType::U64).unwrap();
    // Each reader waits (bounded) until all three readers have started: it only gets
    // past the rendezvous if the engine runs readers of one buffer side by side.
    let arrived = SharedWords::new(&w, 1);
    let seen = arrived.clone();
    let read = w.register_sub("read", move |call| {
        seen.bump(0);
        seen.wait_at_least(0, 3, Duration::from_secs(10))
            .map_err(|e| format!("readers did not run concurrently: {e}"))?;
        let v = call.tensor::<u64>(0)?.get(&[0])?;
        call.tensor_mut::<u64>(1)?.set(&[0], v)?;
        Ok(())
    });
    let set = w.register_sub("set", |call| {
        call.tensor_mut::<u64>(0)?.set(&[0], 99)?;
        Ok(())
    });
    let (xa, oa) = (x.clone(), out.clone());
    let orch = w.register_orchestration("war", move |o, _| {
        for i in 0..3u64 {
            let v = oa.view().slice(0, i, i + 1)?;
            o.submit_sub(
                &read,
                &args(
                    &[
                        xa.arg(ArgTag::Input),
                        oa.arg_view(v, ArgTag::OutputExisting)?,
                    ],
                    &[i],
                ),
            )?;
        }
        // Write-after-read: must wait for all three readers.
        o.submit_sub(&set, &args(&[xa.arg(ArgTag::OutputExisting)], &[]))?;
        Ok(())
    });
    w.init().unwrap();
    w.run(&orch, &TaskArgs::new()).unwrap();
    assert_eq!(arrived.get(0), 3);
    assert_eq!(out.to_vec::<u64>().unwrap(), vec![7, 7, 7]);
    assert_eq!(x.to_vec::<u64>().unwrap(), vec![99]);
    Ok(())
}

pub fn a_failing_sub_task_poisons_downstream_and_the_run_reports_it<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 2);
    let x = w.shared_tensor(&[1], DataType::U32).unwrap();
    let ran = SharedWords::new(&w, 1);
    let boom = w.register_sub("boom", |_| Err("SentinelError: boom-from-sub".into()));
    let r2 = ran.clone();
    let count = w.register_sub("count", move |_| {
        r2.bump(0);
        Ok(())
    });
    let xa = x.clone();
    let orch = w.register_orchestration("fail", move |o, _| {
        o.submit_sub(&boom, &args(&[xa.arg(ArgTag::OutputExisting)], &[]))?;
        o.submit_sub(&count, &args(&[xa.arg(ArgTag::Input)], &[]))?;
        Ok(())
    });
    let ok = w.register_orchestration("ok", move |o, _| {
        o.submit_sub(&count, &TaskArgs::new())?;
        Ok(())
    });
    w.init().unwrap();
    let e = w.run(&orch, &TaskArgs::new()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("sub_worker") && msg.contains("SentinelError: boom-from-sub"),
        "{msg}"
    );
    assert_eq!(ran.get(0), 0, "the consumer was poisoned");
    // A failed run does not stop the next one.
    w.run(&ok, &TaskArgs::new()).unwrap();
    assert_eq!(ran.get(0), 1);
    Ok(())
}

pub fn orchestration_errors_are_synchronous_and_the_worker_stays_usable<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 1);
    let counter = SharedWords::new(&w, 1);
    let c = counter.clone();
    let inc = w.register_sub("inc", move |_| {
        c.bump(0);
        Ok(())
    });
    let bad = w.register_orchestration("bad", move |o, _| {
        o.submit_sub(&inc, &TaskArgs::new())?;
        Err("graph-build-failure".into())
    });
    let good = w.register_orchestration("good", move |o, _| {
        o.submit_sub(&inc, &TaskArgs::new())?;
        Ok(())
    });
    w.init().unwrap();
    let e = w.run(&bad, &TaskArgs::new()).unwrap_err();
    assert!(matches!(e, DistError::Orchestration(_)), "{e}");
    assert!(e.to_string().contains("graph-build-failure"));
    w.run(&good, &TaskArgs::new()).unwrap();
    w.run(&good, &TaskArgs::new()).unwrap();
    // The cancelled task of the failed run may or may not have started; the two good runs
    // both ran.
    assert!(counter.get(0) >= 2);
    Ok(())
}

pub fn a_submit_after_a_failure_rethrows_the_runs_first_error<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 1);
    let boom = w.register_sub("boom", |_| Err("SentinelError: fail-fast".into()));
    let orch = w.register_orchestration("ff", move |o, _| {
        o.submit_sub(&boom, &TaskArgs::new())?;
        std::thread::sleep(Duration::from_millis(200));
        o.submit_sub(&boom, &TaskArgs::new())?;
        Ok(())
    });
    w.init().unwrap();
    let e = w.run(&orch, &TaskArgs::new()).unwrap_err();
    assert!(e.to_string().contains("SentinelError: fail-fast"), "{e}");
    Ok(())
}

pub fn groups_launch_together_and_dependents_wait_for_every_member<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 2);
    let t = w.shared_tensor(&[2], DataType::U32).unwrap();
    let marker = w.shared_tensor(&[1], DataType::U32).unwrap();
    let both = w.register_sub("both", |call| {
        let sum: u32 = call.tensor::<u32>(0)?.to_vec().iter().sum();
        call.tensor_mut::<u32>(1)?.set(&[0], sum + 1)?;
        Ok(())
    });
    // Each member waits (bounded) until both members have started: the group only
    // succeeds if its members are launched together.
    let started = SharedWords::new(&w, 1);
    let seen = started.clone();
    let write_i = w.register_sub("write_i", move |call| {
        let i: u64 = call.scalar(0).ok_or("index")?;
        seen.bump(0);
        seen.wait_at_least(0, 2, Duration::from_secs(10))
            .map_err(|e| format!("group members did not launch together: {e}"))?;
        call.tensor_mut::<u32>(0)?.set(&[0], 10 + i as u32)?;
        Ok(())
    });
    let (ta, ma) = (t.clone(), marker.clone());
    let orch = w.register_orchestration("group", move |o, _| {
        let members: Vec<TaskArgs> = (0..2u64)
            .map(|i| {
                let v = ta.view().slice(0, i, i + 1).unwrap();
                args(&[ta.arg_view(v, ArgTag::OutputExisting).unwrap()], &[i])
            })
            .collect();
        o.submit_sub_group(&write_i, &members)?;
        o.submit_sub(
            &both,
            &args(
                &[ta.arg(ArgTag::Input), ma.arg(ArgTag::OutputExisting)],
                &[],
            ),
        )?;
        Ok(())
    });
    w.init().unwrap();
    w.run(&orch, &TaskArgs::new()).unwrap();
    assert_eq!(t.to_vec::<u32>().unwrap(), vec![10, 11]);
    assert_eq!(marker.to_vec::<u32>().unwrap(), vec![22]);
    Ok(())
}

pub fn submit_returns_before_completion_and_a_wait_timeout_is_retryable<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 1);
    let slow = w.register_sub("slow", |_| {
        std::thread::sleep(Duration::from_millis(300));
        Ok(())
    });
    let orch = w.register_orchestration("slow", move |o, _| {
        o.submit_sub(&slow, &TaskArgs::new())?;
        Ok(())
    });
    w.init().unwrap();
    let mut h = w.submit(&orch, &TaskArgs::new()).unwrap();
    assert!(!h.is_done());
    assert!(matches!(
        h.wait(Some(Duration::from_millis(10))),
        Err(DistError::WaitTimeout { .. })
    ));
    h.wait(None).unwrap();
    assert!(h.is_done());
    Ok(())
}

pub fn two_runs_are_in_flight_and_results_follow_submit_order<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 1);
    let x = w.shared_tensor_from(&[1], &[0u64]).unwrap();
    let step = w.register_sub("step", |call| {
        std::thread::sleep(Duration::from_millis(5));
        let k: u64 = call.scalar(0).ok_or("k")?;
        call.tensor_mut::<u64>(0)?.update(|v| v * 3 + k);
        Ok(())
    });
    let xa = x.clone();
    let orch = w.register_orchestration("step", move |o, a| {
        let k: u64 = a.scalar_at(0).ok_or("k")?;
        o.submit_sub(&step, &args(&[xa.arg(ArgTag::InOut)], &[k]))?;
        Ok(())
    });
    w.init().unwrap();
    let mut handles = vec![];
    let mut expected = 0u64;
    for k in 1..=6u64 {
        handles.push(w.submit(&orch, &args(&[], &[k])).unwrap());
        expected = expected * 3 + k;
    }
    for mut h in handles {
        h.wait(None).unwrap();
    }
    assert_eq!(x.to_vec::<u64>().unwrap(), vec![expected]);
    Ok(())
}

pub fn runtime_intermediates_carry_data_between_tasks<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 2);
    let out = w.shared_tensor(&[4], DataType::F32).unwrap();
    let fill = w.register_sub("fill", |call| {
        let v: f32 = call.scalar(0).ok_or("v")?;
        call.tensor_mut::<f32>(0)?.fill(v);
        Ok(())
    });
    let add = w.register_sub("add", |call| {
        let a = call.tensor::<f32>(0)?.to_vec();
        let b = call.tensor::<f32>(1)?.to_vec();
        let mut o = call.tensor_mut::<f32>(2)?;
        for i in 0..4 {
            o.set(&[i as u64], a[i] + b[i])?;
        }
        Ok(())
    });
    let oa = out.clone();
    let orch = w.register_orchestration("tmp", move |o, _| {
        o.scope(|o| {
            let a = o.alloc(&[4], DataType::F32)?;
            let b = o.alloc(&[4], DataType::F32)?;
            o.submit_sub(
                &fill,
                &args(&[a.arg(ArgTag::Output)], &[1.5f32.to_bits() as u64]),
            )?;
            o.submit_sub(
                &fill,
                &args(&[b.arg(ArgTag::Output)], &[2.0f32.to_bits() as u64]),
            )?;
            o.submit_sub(
                &add,
                &args(
                    &[
                        a.arg(ArgTag::Input),
                        b.arg(ArgTag::Input),
                        oa.arg(ArgTag::OutputExisting),
                    ],
                    &[],
                ),
            )?;
            Ok(())
        })
    });
    w.init().unwrap();
    for _ in 0..10 {
        w.run(&orch, &TaskArgs::new()).unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![3.5; 4]);
    }
    Ok(())
}

pub fn bad_arguments_are_typed_errors<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 1, 1);
    let early = w.shared_tensor(&[4], DataType::F32).unwrap();
    let early_run = early.clone();
    let noop = w.register_sub("noop", |_| Ok(()));
    let chip_orch = w
        .register_chip_orchestration("empty", |_, _| Ok(()))
        .unwrap();
    let probe = w.register_orchestration("probe", move |o, a| {
        let which: u64 = a.scalar_at(0).ok_or("which")?;
        match which {
            0 => o.submit_next_level(chip_orch, &TaskArgs::new(), 5)?,
            1 => o.submit_next_level(chip_orch, &args(&[], &[]), 0)?,
            2 => o.submit_sub(&noop, &args(&[early.arg(ArgTag::Input)], &[]))?,
            // A view outside its tensor, recorded by the builder, reported by the submit.
            3 => o.submit_sub(
                &noop,
                &TaskArgs::new()
                    .input(&early)
                    .output_existing(early.slice(0, 2, 6)),
            )?,
            // Member 1 adds a tensor after a scalar; reported before the group's own
            // checks (it has more members than the worker has sub-workers).
            4 => o.submit_sub_group(
                &noop,
                &[
                    TaskArgs::new().input(&early),
                    TaskArgs::new().scalar(1u8).input(&early),
                ],
            )?,
            _ => {}
        }
        Ok(())
    });
    w.init().unwrap();
    let late = w.shared_tensor(&[4], DataType::F32).unwrap();
    let late_orch = w.register_orchestration("late", |_, _| Ok(()));
    let e = w.run(&probe, &args(&[], &[0])).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    w.run(&probe, &args(&[], &[1])).unwrap();
    w.run(&probe, &args(&[], &[2])).unwrap();
    let mut bad_argument = |which: u64| match w.run(&probe, &args(&[], &[which])) {
        Err(DistError::Orchestration(e)) => match e.downcast_ref::<DistError>() {
            Some(DistError::BadArgument { member, error }) => Ok((*member, error.to_string())),
            _ => Err(format!("case {which}: expected BadArgument, got {e}")),
        },
        other => Err(format!(
            "case {which}: expected the orchestration's error, got {other:?}"
        )),
    };
    let (member, e) = bad_argument(3)?;
    assert_eq!(member, None);
    assert!(e.starts_with("tensor argument 1: range 2..6"), "{e}");
    let (member, e) = bad_argument(4)?;
    assert_eq!(member, Some(1));
    assert!(
        e.starts_with(
            "tensor argument 0: tensor arguments must all be added before the first scalar"
        ),
        "{e}"
    );
    // The run's own arguments are checked before the orchestration runs (case 0 would
    // fail with "out of range").
    match w.run(&probe, &TaskArgs::new().scalar(0u64).input(&early_run)) {
        Err(DistError::BadArgument {
            member: None,
            error,
        }) => {
            assert!(
                error.to_string().starts_with("tensor argument 0: "),
                "{error}"
            )
        }
        other => return Err(format!("expected BadArgument, got {other:?}")),
    }
    w.run(&probe, &args(&[], &[2])).unwrap();
    // A callable registered after init is unknown to the running tree.
    assert!(matches!(
        w.run(&late_orch, &TaskArgs::new()),
        Err(DistError::UnknownCallable(_))
    ));
    let _ = late;
    Ok(())
}

/// The two-chip sum again with the chips writing shared tensors the caller owns
/// (`OUTPUT_EXISTING`), where `l3_two_chips_and_a_sub_worker_match_the_host_golden` uses
/// run-owned intermediates.
pub fn chips_and_a_sub_worker_compute_against_a_host_golden<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let n = 1024u64;
    let mut w = l3(mode, 2, 1);
    let PairSum { vadd, sum, .. } = register_pair_sum(&mut w).unwrap();
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    let c: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    let d: Vec<f32> = (0..n).map(|i| 100.0 - i as f32).collect();
    let ta = w.shared_tensor_from(&[n], &a).unwrap();
    let tb = w.shared_tensor_from(&[n], &b).unwrap();
    let tc = w.shared_tensor_from(&[n], &c).unwrap();
    let td = w.shared_tensor_from(&[n], &d).unwrap();
    let r0 = w.shared_tensor(&[n], DataType::F32).unwrap();
    let r1 = w.shared_tensor(&[n], DataType::F32).unwrap();
    let out = w.shared_tensor(&[n], DataType::F32).unwrap();
    let (ta2, tb2, tc2, td2, r0a, r1a, outa) = (
        ta.clone(),
        tb.clone(),
        tc.clone(),
        td.clone(),
        r0.clone(),
        r1.clone(),
        out.clone(),
    );
    let orch = w.register_orchestration("l3", move |o, _| {
        o.submit_next_level(
            vadd,
            &args(
                &[
                    ta2.arg(ArgTag::Input),
                    tb2.arg(ArgTag::Input),
                    r0a.arg(ArgTag::OutputExisting),
                ],
                &[],
            ),
            0,
        )?;
        o.submit_next_level(
            vadd,
            &args(
                &[
                    tc2.arg(ArgTag::Input),
                    td2.arg(ArgTag::Input),
                    r1a.arg(ArgTag::OutputExisting),
                ],
                &[],
            ),
            1,
        )?;
        o.submit_sub(
            &sum,
            &args(
                &[
                    r0a.arg(ArgTag::Input),
                    r1a.arg(ArgTag::Input),
                    outa.arg(ArgTag::OutputExisting),
                ],
                &[],
            ),
        )?;
        Ok(())
    });
    w.init().unwrap();
    w.run(&orch, &TaskArgs::new()).unwrap();
    let golden: Vec<f32> = (0..n as usize).map(|i| a[i] + b[i] + c[i] + d[i]).collect();
    assert_eq!(out.to_vec::<f32>().unwrap(), golden);
    w.close().unwrap();
    Ok(())
}

pub fn device_tensors_stay_resident_on_their_chip<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 2, 0);
    let chip_scale = register_chip_scale(&mut w);
    let host = w.shared_tensor_from(&[8], &[1.0f32; 8]).unwrap();
    let result = w.shared_tensor(&[8], DataType::F32).unwrap();
    let holder: Arc<std::sync::Mutex<Option<DeviceTensor>>> = Arc::default();
    let h2 = holder.clone();
    let orch = w.register_orchestration("scale_twice", move |o, _| {
        let dev = h2.lock().unwrap().ok_or("no device tensor")?;
        let mut a = TaskArgs::new();
        a.push_tensor(dev.arg(ArgTag::InOut))?.push_scalar(3.0f32)?;
        o.submit_next_level(chip_scale, &a, 0)?;
        o.submit_next_level(chip_scale, &a, 0)?;
        // The same tensor on the other chip is an error.
        match o.submit_next_level(chip_scale, &a, 1) {
            Err(DistError::InvalidArgs(m)) if m.contains("device memory of worker 0") => Ok(()),
            other => Err(format!("expected a device-space error, got {other:?}").into()),
        }
    });
    w.init().unwrap();
    let before = w.committed_device_memory(0).unwrap();
    let dev = w.alloc_child_tensor(0, &[8], DataType::F32).unwrap();
    assert!(w.committed_device_memory(0).unwrap() >= before + 32);
    w.copy_to(&dev, &host).unwrap();
    *holder.lock().unwrap() = Some(dev);
    w.run(&orch, &TaskArgs::new()).unwrap();
    w.copy_from(&result, &dev).unwrap();
    assert_eq!(result.to_vec::<f32>().unwrap(), vec![9.0; 8]);
    w.free(dev).unwrap();
    assert!(w.free(dev).is_err(), "double free is refused");
    let e = w.run(&orch, &TaskArgs::new()).unwrap_err();
    assert!(e.to_string().contains("not a live allocation"), "{e}");
    Ok(())
}

/// Copies between ordinary host memory (created after `init`) and a chip tensor, at
/// offsets, through a staging region small enough that a copy takes many chunks: read
/// back byte for byte against a host model of the device bytes.
pub fn host_bytes_copy_to_and_from_chip_tensors_at_offsets<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut cfg = l3_config(mode, 2, 0);
    cfg.staging_bytes = 8 << 10; // 4 KiB halves
    cfg.chips[1].device_memory_bytes = 1 << 30;
    let capacity = cfg.chips[1].device_memory_bytes;
    let mut w = DistWorker::new(cfg).ctx("new")?;
    w.init().ctx("init")?;
    // 10 001 f32: 40 004 bytes, not a multiple of the 4 KiB half.
    let dev = w
        .alloc_child_tensor(1, &[10_001], DataType::F32)
        .ctx("alloc")?;
    let size = 40_004usize;
    let mut model: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
    let path = w.copy_bytes_to(&dev, 0, &model).ctx("copy whole")?;
    check!(
        path == CopyPath::Staged,
        "a plain Vec is staged, got {path:?}"
    );
    let mut back = vec![0u8; size];
    w.copy_bytes_from(&mut back, &dev, 0).ctx("read whole")?;
    check!(back == model, "the whole tensor reads back as written");

    // Offset writes and reads, including ones that start and end mid-chunk.
    let patch: Vec<u8> = (0..9_000).map(|i| (i % 13 + 200) as u8).collect();
    w.copy_bytes_to(&dev, 1_000, &patch).ctx("offset write")?;
    model[1_000..10_000].copy_from_slice(&patch);
    w.copy_bytes_to(&dev, size as u64 - 3, &[1, 2, 3])
        .ctx("tail write")?;
    model[size - 3..].copy_from_slice(&[1, 2, 3]);
    for (offset, len) in [
        (0usize, size),
        (777, 12_345),
        (4_095, 4_098),
        (size - 1, 1),
        (5, 0),
    ] {
        let mut part = vec![0xAAu8; len];
        w.copy_bytes_from(&mut part, &dev, offset as u64)
            .ctx("offset read")?;
        check!(
            part == model[offset..offset + len],
            "bytes [{offset}, {offset} + {len}) read back as the model has them"
        );
    }

    // Out of range, without overflow.
    for (offset, len) in [
        (size as u64, 1usize),
        (size as u64 - 3, 4),
        (u64::MAX, 1),
        (1, size),
    ] {
        let e = w.copy_bytes_to(&dev, offset, &vec![0; len]);
        check!(
            matches!(&e, Err(DistError::InvalidArgs(m)) if m.contains("leaves the 40004-byte tensor")),
            "copy of {len} bytes at {offset}: {e:?}"
        );
        let e = w.copy_bytes_from(&mut vec![0; len], &dev, offset);
        check!(
            matches!(e, Err(DistError::InvalidArgs(_))),
            "read of {len} bytes at {offset}: {e:?}"
        );
    }

    // The emulated card: its configured capacity, less what is allocated.
    let (free, total) = w.device_memory_info(1).ctx("info")?;
    check!(
        total == capacity,
        "total {total} is the configured {capacity}"
    );
    let big = w
        .alloc_child_tensor(1, &[1 << 20], DataType::U8)
        .ctx("alloc 1 MiB")?;
    let (free2, _) = w.device_memory_info(1).ctx("info after alloc")?;
    check!(
        free2 == free - (1 << 20),
        "free {free} -> {free2} after a 1 MiB allocation"
    );
    w.free(big).ctx("free")?;
    check!(
        matches!(
            w.device_memory_info(2),
            Err(DistError::UnknownWorker { id: 2, count: 2 })
        ),
        "worker 2 does not exist"
    );

    // A freed tensor is refused, whatever its bytes' fate.
    w.free(dev).ctx("free dev")?;
    let e = w.copy_bytes_to(&dev, 0, &[1, 2, 3]);
    check!(
        matches!(e, Err(DistError::StaleTensor { .. })),
        "copy into a freed tensor: {e:?}"
    );
    w.close().ctx("close")
}

/// Memory the caller mapped `MAP_SHARED` before `init` and handed over (adopted) is read
/// and written in place by the chip child, with no staging; a read-only one refuses a
/// copy into it.
pub fn an_adopted_shared_mapping_is_copied_in_place<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    const LEN: usize = 3 * 4096;
    let map = |len: usize| {
        // SAFETY: a fresh anonymous shared mapping; unmapped below, after the regions
        // naming it were released.
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
        p.cast::<u8>()
    };
    let (rw, ro) = (map(LEN), map(LEN));
    let mem = strata_host::SharedMemory::process();
    // SAFETY: both mappings stay mapped until after the regions are released.
    let (rw_region, ro_region) = unsafe {
        (
            mem.adopt_region(rw, LEN, "rw weights", false)
                .ctx("adopt rw")?,
            mem.adopt_region(ro, LEN, "ro weights", true)
                .ctx("adopt ro")?,
        )
    };
    let outcome = (|| -> Outcome {
        let mut cfg = l3_config(mode, 1, 0);
        cfg.staging_bytes = 0; // no staging at all: only the in-place path can work
        let mut w = DistWorker::new(cfg).ctx("new")?;
        w.init().ctx("init")?;
        // SAFETY: the mappings are LEN bytes; nothing else touches them meanwhile.
        let (rw_bytes, ro_bytes) = unsafe {
            (
                std::slice::from_raw_parts_mut(rw, LEN),
                std::slice::from_raw_parts_mut(ro, LEN),
            )
        };
        for (i, b) in ro_bytes.iter_mut().enumerate() {
            *b = (i % 241) as u8;
        }
        let dev = w
            .alloc_child_tensor(0, &[LEN as u64], DataType::U8)
            .ctx("alloc")?;
        let path = w.copy_bytes_to(&dev, 0, &ro_bytes[100..]).ctx("upload")?;
        check!(
            path == CopyPath::InPlace,
            "an adopted mapping is copied in place: {path:?}"
        );
        let path = w
            .copy_bytes_from(&mut rw_bytes[..LEN - 100], &dev, 0)
            .ctx("download")?;
        check!(
            path == CopyPath::InPlace,
            "into a writable adopted mapping in place: {path:?}"
        );
        check!(
            rw_bytes[..LEN - 100] == ro_bytes[100..],
            "the bytes went through the chip"
        );
        let e = w.copy_bytes_from(&mut ro_bytes[..10], &dev, 0);
        check!(
            matches!(&e, Err(DistError::InvalidArgs(m)) if m.contains("read-only")),
            "a copy into the read-only mapping is refused: {e:?}"
        );
        // Without staging, plain memory has no way in.
        let e = w.copy_bytes_to(&dev, 0, &[1, 2, 3]);
        check!(
            matches!(&e, Err(DistError::InvalidArgs(m)) if m.contains("staging")),
            "plain memory without staging: {e:?}"
        );
        w.close().ctx("close")
    })();
    mem.release_region(rw_region).ctx("release rw")?;
    mem.release_region(ro_region).ctx("release ro")?;
    // SAFETY: the regions are released and the worker (and its children) are gone.
    unsafe {
        libc::munmap(rw.cast(), LEN);
        libc::munmap(ro.cast(), LEN);
    }
    outcome
}

pub fn a_level_4_worker_drives_level_3_children<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mk_child = || {
        let mut c = l3(mode, 0, 1);
        c.register_sub("add_one", |call| {
            call.tensor_mut::<u64>(0)?.update(|v| v + 1);
            Ok(())
        });
        c
    };
    let mut top = l4(mode, 1);
    let add_one = top.register_sub("add_one", |call| {
        call.tensor_mut::<u64>(0)?.update(|v| v + 1);
        Ok(())
    });
    let x = top.shared_tensor_from(&[2], &[0u64, 0]).unwrap();
    // The level-3 orchestration the level-4 worker dispatches (inherited by the children).
    let inner = top.register_orchestration("inner", move |o, a| {
        o.submit_sub(&add_one, a)?;
        o.submit_sub(&add_one, a)?;
        Ok(())
    });
    let c0 = top.add_worker(mk_child()).unwrap();
    let c1 = top.add_worker(mk_child()).unwrap();
    let xa = x.clone();
    let outer = top.register_orchestration("outer", move |o, _| {
        for (i, w) in [c0, c1].into_iter().enumerate() {
            let v = xa.view().slice(0, i as u64, i as u64 + 1)?;
            o.submit_next_level(inner, &args(&[xa.arg_view(v, ArgTag::InOut)?], &[]), w)?;
        }
        o.submit_sub(&add_one, &args(&[xa.arg(ArgTag::InOut)], &[]))?;
        Ok(())
    });
    top.init().unwrap();
    for round in 1..=3u64 {
        top.run(&outer, &TaskArgs::new()).unwrap();
        assert_eq!(x.to_vec::<u64>().unwrap(), vec![3 * round, 3 * round]);
    }
    top.close().unwrap();
    Ok(())
}

pub fn lifecycle_misuse_is_refused<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 1);
    let o = w.register_orchestration("o", |_, _| Ok(()));
    assert!(matches!(
        w.run(&o, &TaskArgs::new()),
        Err(DistError::State { .. })
    ));
    let mut top = l4(mode, 0);
    assert!(top.add_worker(l3(mode, 0, 1)).is_ok());
    let mut not4 = l3(mode, 0, 1);
    assert!(matches!(
        not4.add_worker(l3(mode, 0, 1)),
        Err(DistError::InvalidConfig(_))
    ));
    assert!(DistWorker::new(DistConfig {
        level: Level::L4,
        ..DistConfig::l3(vec![ChipConfig::default()], 0)
    })
    .is_err());
    w.init().unwrap();
    assert!(matches!(w.init(), Err(DistError::State { .. })));
    w.close().unwrap();
    w.close().unwrap();
    assert!(matches!(
        w.run(&o, &TaskArgs::new()),
        Err(DistError::State { .. })
    ));
    Ok(())
}

pub fn a_blocked_group_reserves_its_targets_and_precedes_conflicting_singles<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 3, 0);
    let lab = Lab::new(&w);
    let g = gated(&mut w, &lab);
    let l2 = lab.clone();
    let orch = w.register_orchestration("reserve", move |o, _| {
        o.submit_next_level(g, &args(&[], &[1]), 1)?; // holds worker 1
                                                      // An idle scheduler gets a ready task at once, so this returns once it runs (the
                                                      // group must find worker 1 busy, not overtake the single in the same pass).
        l2.wait_started(1);
        o.submit_next_level_group(g, &[args(&[], &[10]), args(&[], &[11])], &[0, 1])?;
        o.submit_next_level(g, &args(&[], &[20]), 0)?; // queued behind the group on 0
        o.submit_next_level(g, &args(&[], &[30]), 2)?; // unrelated worker: runs at once
        Ok(())
    });
    w.init().unwrap();
    lab.hold(1);
    let h = w.submit(&orch, &TaskArgs::new()).unwrap();
    lab.wait_started(1);
    lab.wait_started(30);
    std::thread::sleep(Duration::from_millis(30));
    let mut early = lab.log();
    early.sort_unstable();
    assert_eq!(
        early,
        vec![1, 30],
        "worker 0 is idle but reserved for the blocked group: its single must wait"
    );
    lab.hold(0);
    h.result().unwrap();
    let log = lab.log();
    let pos = |l: u64| log.iter().position(|&x| x == l).unwrap();
    assert!(
        pos(10) < pos(20),
        "the group ran before the single queued behind it: {log:?}"
    );
    assert!(pos(11) > pos(1), "member 1 waited for worker 1: {log:?}");
    Ok(())
}

/// Per-worker submit order, single → group: single X on worker 2, then a group on
/// workers 1 and 2 whose worker-2 member waits for X's signal. Both become ready in the
/// same completion (of P, which holds until the orchestration has submitted them), so one
/// dispatch pass sees both: the group must not start its member on worker 2 before X
/// (it would wait for a signal queued behind it). Run many times.
pub fn a_group_never_overtakes_a_single_submitted_before_it_on_a_worker<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 3, 0);
    let sig = Signals::new(&mut w);
    let token = w.shared_tensor(&[1], DataType::U64).ctx("token")?;
    let (s, t) = (sig.clone(), token.clone());
    const ROUNDS: u64 = 50;
    let orch = w.register_orchestration("single_then_group", move |o, a| {
        let round: u64 = a.scalar_at(0).ok_or("the round is scalar 0")?;
        let read = [t.arg(ArgTag::Input)];
        // P (word 2: the orchestration is done) produces the token X and the group read.
        let p = Signals::task(&[t.arg(ArgTag::InOut)], (2, round), (NO_WORD, 0), None, 0);
        o.submit_next_level(s.orch, &p, 0)?;
        let x = Signals::task(&read, (NO_WORD, 0), (0, round), None, 0);
        o.submit_next_level(s.orch, &x, 2)?;
        let idle = Signals::task(&read, (NO_WORD, 0), (NO_WORD, 0), None, 0);
        let waits = Signals::task(&read, (0, round), (NO_WORD, 0), None, 0);
        o.submit_next_level_group(s.orch, &[idle, waits], &[1, 2])?;
        s.words.at(2).store(round, Ordering::SeqCst);
        Ok(())
    });
    w.init().ctx("init")?;
    for round in 1..=ROUNDS {
        w.run(&orch, &args(&[], &[round]))
            .map_err(|e| format!("round {round}: the group overtook X on worker 2: {e}"))?;
    }
    w.close().ctx("close")?;
    Ok(())
}

/// Per-worker submit order, group → single: a group on workers 1 and 2, then single Y on
/// worker 2 that waits for the signal of the group's worker-2 member. An earlier group
/// (on workers 0 and 3, held up by a task on worker 0) heads the groups; the later group
/// is not the head, yet Y must still wait behind it on worker 2. Run many times.
pub fn a_later_single_never_overtakes_a_group_behind_another_blocked_group<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 4, 0);
    let sig = Signals::new(&mut w);
    let token = w.shared_tensor(&[1], DataType::U64).ctx("token")?;
    let (s, t) = (sig.clone(), token.clone());
    const ROUNDS: u64 = 50;
    let orch = w.register_orchestration("group_then_single", move |o, a| {
        let round: u64 = a.scalar_at(0).ok_or("the round is scalar 0")?;
        let read = [t.arg(ArgTag::Input)];
        let nothing = || Signals::task(&[], (NO_WORD, 0), (NO_WORD, 0), None, 0);
        // H holds worker 0 until Y is done (word 4), so the first group stays blocked.
        let h = Signals::task(&[], (4, round), (NO_WORD, 0), None, 0);
        o.submit_next_level(s.orch, &h, 0)?;
        o.submit_next_level_group(s.orch, &[nothing(), nothing()], &[0, 3])?;
        // P (word 2: the orchestration is done) produces the token the group and Y read.
        let p = Signals::task(&[t.arg(ArgTag::InOut)], (2, round), (NO_WORD, 0), None, 0);
        o.submit_next_level(s.orch, &p, 1)?;
        let idle = Signals::task(&read, (NO_WORD, 0), (NO_WORD, 0), None, 0);
        let signals = Signals::task(&read, (NO_WORD, 0), (0, round), None, 0);
        o.submit_next_level_group(s.orch, &[idle, signals], &[1, 2])?;
        let y = Signals::task(&read, (0, round), (4, round), None, 0);
        o.submit_next_level(s.orch, &y, 2)?;
        s.words.at(2).store(round, Ordering::SeqCst);
        Ok(())
    });
    w.init().ctx("init")?;
    for round in 1..=ROUNDS {
        w.run(&orch, &args(&[], &[round]))
            .map_err(|e| format!("round {round}: Y overtook the group on worker 2: {e}"))?;
    }
    w.close().ctx("close")?;
    Ok(())
}

/// Per-worker submit order across the orchestrator's hand-over batch: while the
/// scheduler has queued work, ready tasks are handed over in batches. T1 (ready at submit,
/// so batched) and then T2 (waiting for P's output) go to worker 2, and T2 waits for T1's
/// signal; P finishes while the orchestration still runs. T2, made ready by P's
/// completion, must not start before T1, which is still in the batch. Run many times.
pub fn a_task_a_completion_makes_ready_never_overtakes_a_batched_earlier_one<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 3, 0);
    let sig = Signals::new(&mut w);
    let token = w.shared_tensor(&[1], DataType::U64).ctx("token")?;
    let (s, t) = (sig.clone(), token.clone());
    const ROUNDS: u64 = 20;
    let orch = w.register_orchestration("batched_then_ready", move |o, a| {
        let round: u64 = a.scalar_at(0).ok_or("the round is scalar 0")?;
        // P (handed over at once: the scheduler is idle): done once T2 is submitted
        // (word 5), then says so (word 6).
        let p = Signals::task(&[t.arg(ArgTag::InOut)], (5, round), (6, round), None, 0);
        o.submit_next_level(s.orch, &p, 1)?;
        // Then work queued on worker 0 until the orchestration ends (word 2): a full
        // batch is handed over, so the scheduler is not idle and later ready tasks are
        // batched.
        for _ in 0..18 {
            let busy = Signals::task(&[], (2, round), (NO_WORD, 0), None, 0);
            o.submit_next_level(s.orch, &busy, 0)?;
        }
        std::thread::sleep(Duration::from_millis(10));
        let t1 = Signals::task(&[], (NO_WORD, 0), (0, round), None, 0);
        o.submit_next_level(s.orch, &t1, 2)?;
        let t2 = Signals::task(&[t.arg(ArgTag::Input)], (0, round), (NO_WORD, 0), None, 0);
        o.submit_next_level(s.orch, &t2, 2)?;
        s.words.at(5).store(round, Ordering::SeqCst);
        // Let P's completion make T2 ready while this orchestration still runs.
        let _ = s.words.wait_at_least(6, round, Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(10));
        s.words.at(2).store(round, Ordering::SeqCst);
        Ok(())
    });
    w.init().ctx("init")?;
    for round in 1..=ROUNDS {
        w.run(&orch, &args(&[], &[round]))
            .map_err(|e| format!("round {round}: T2 overtook the batched T1 on worker 2: {e}"))?;
    }
    w.close().ctx("close")?;
    Ok(())
}

pub fn group_members_run_on_the_worker_ids_they_name<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 2, 0);
    let chip_scale = register_chip_scale(&mut w);
    let ones = w.shared_tensor_from(&[4], &[1.0f32; 4]).unwrap();
    let result = w.shared_tensor(&[4], DataType::F32).unwrap();
    let devs: Arc<std::sync::Mutex<Vec<DeviceTensor>>> = Arc::default();
    let d2 = devs.clone();
    // Member 0 runs on worker 1 with worker 1's tensor, member 1 on worker 0 with worker
    // 0's: a scheduler that used member indices as worker ids would hand each chip an
    // address of the other chip's memory.
    let orch = w.register_orchestration("swap", move |o, _| {
        let d = d2.lock().unwrap().clone();
        let mut m0 = TaskArgs::new();
        m0.push_tensor(d[1].arg(ArgTag::InOut))?
            .push_scalar(2.0f32)?;
        let mut m1 = TaskArgs::new();
        m1.push_tensor(d[0].arg(ArgTag::InOut))?
            .push_scalar(3.0f32)?;
        o.submit_next_level_group(chip_scale, &[m0, m1], &[1, 0])?;
        Ok(())
    });
    w.init().unwrap();
    for chip in 0..2 {
        let d = w.alloc_child_tensor(chip, &[4], DataType::F32).unwrap();
        w.copy_to(&d, &ones).unwrap();
        devs.lock().unwrap().push(d);
    }
    w.run(&orch, &TaskArgs::new()).unwrap();
    let d = devs.lock().unwrap().clone();
    w.copy_from(&result, &d[0]).unwrap();
    assert_eq!(result.to_vec::<f32>().unwrap(), vec![3.0; 4]);
    w.copy_from(&result, &d[1]).unwrap();
    assert_eq!(result.to_vec::<f32>().unwrap(), vec![2.0; 4]);
    Ok(())
}

pub fn a_busy_worker_does_not_hold_up_other_workers_or_sub_tasks<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 2, 1);
    let lab = Lab::new(&w);
    let g = gated(&mut w, &lab);
    let ran = SharedWords::new(&w, 1);
    let r2 = ran.clone();
    let sub = w.register_sub("count", move |_| {
        r2.bump(0);
        Ok(())
    });
    let orch = w.register_orchestration("busy", move |o, _| {
        o.submit_next_level(g, &args(&[], &[1]), 0)?; // held
        o.submit_next_level(g, &args(&[], &[2]), 0)?; // queued behind it
        o.submit_next_level(g, &args(&[], &[3]), 1)?; // another worker
        o.submit_sub(&sub, &TaskArgs::new())?;
        Ok(())
    });
    w.init().unwrap();
    lab.hold(1);
    let h = w.submit(&orch, &TaskArgs::new()).unwrap();
    lab.wait_started(3);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ran.get(0) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sub task waited for chip 0"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!lab.log().contains(&2), "worker 0's FIFO keeps its order");
    lab.hold(0);
    h.result().unwrap();
    assert_eq!(lab.log().iter().filter(|&&l| l == 2).count(), 1);
    Ok(())
}

pub fn a_sub_worker_failure_two_levels_down_surfaces_at_level_4<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut top = l4(mode, 0);
    let boom = top.register_sub("boom", |_| Err("SentinelError: l3-sub-boom".into()));
    let inner = top.register_orchestration("inner", move |o, _| {
        o.submit_sub(&boom, &TaskArgs::new())?;
        Ok(())
    });
    let c = top.add_worker(l3(mode, 0, 1)).unwrap();
    let outer = top.register_orchestration("outer", move |o, _| {
        o.submit_next_level(inner, &TaskArgs::new(), c)?;
        Ok(())
    });
    top.init().unwrap();
    let e = top.run(&outer, &TaskArgs::new()).unwrap_err().to_string();
    assert!(
        e.contains("child_worker")
            && e.contains("sub_worker")
            && e.contains("SentinelError: l3-sub-boom"),
        "{e}"
    );
    // The level-3 child is still usable.
    let e2 = top.run(&outer, &TaskArgs::new()).unwrap_err().to_string();
    assert!(e2.contains("l3-sub-boom"), "{e2}");
    top.close().unwrap();
    Ok(())
}

pub fn overlapping_writes_within_one_task_are_refused_at_submit<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 1);
    let x = w.shared_tensor(&[128], DataType::U8).unwrap();
    let noop = w.register_sub("noop", |_| Ok(()));
    let orch = w.register_orchestration("overlap", move |o, a| {
        let which: u64 = a.scalar_at(0).ok_or("which")?;
        let v = |b: u64, e: u64| {
            x.arg_view(x.view().slice(0, b, e).unwrap(), ArgTag::OutputExisting)
                .unwrap()
        };
        let r = |b: u64, e: u64| {
            x.arg_view(x.view().slice(0, b, e).unwrap(), ArgTag::Input)
                .unwrap()
        };
        let t = match which {
            0 => args(&[v(0, 64), v(32, 96)], &[]),
            1 => args(&[v(0, 64), v(64, 128)], &[]),
            _ => args(&[r(0, 64), r(32, 96)], &[]),
        };
        o.submit_sub(&noop, &t)?;
        Ok(())
    });
    w.init().unwrap();
    let e = w.run(&orch, &args(&[], &[0])).unwrap_err();
    assert!(matches!(e, DistError::Orchestration(_)), "{e:?}");
    w.run(&orch, &args(&[], &[1]))
        .expect("disjoint slices of one buffer are legal");
    w.run(&orch, &args(&[], &[2]))
        .expect("overlapping reads are legal");
    Ok(())
}

pub fn close_with_a_run_in_flight_drains_it<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 2);
    let x = w.shared_tensor_from(&[1], &[0u64]).unwrap();
    let slow = w.register_sub("slow", |call| {
        std::thread::sleep(Duration::from_millis(20));
        call.tensor_mut::<u64>(0)?.update(|v| v + 1);
        Ok(())
    });
    let xa = x.clone();
    let orch = w.register_orchestration("slow", move |o, _| {
        for _ in 0..5 {
            o.submit_sub(&slow, &args(&[xa.arg(ArgTag::InOut)], &[]))?;
        }
        Ok(())
    });
    w.init().unwrap();
    let h = w.submit(&orch, &TaskArgs::new()).unwrap();
    w.close().unwrap();
    assert_eq!(
        x.to_vec::<u64>().unwrap(),
        vec![5],
        "every task ran before close returned"
    );
    h.result().unwrap();
    assert!(matches!(
        w.submit(&orch, &TaskArgs::new()),
        Err(DistError::State { .. })
    ));
    Ok(())
}

pub fn a_failed_run_reports_its_error_on_every_wait<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 1);
    let boom = w.register_sub("boom", |_| Err("SentinelError: twice".into()));
    let orch = w.register_orchestration("boom", move |o, _| {
        o.submit_sub(&boom, &TaskArgs::new())?;
        Ok(())
    });
    w.init().unwrap();
    let mut h = w.submit(&orch, &TaskArgs::new()).unwrap();
    let first = h.wait(None).unwrap_err().to_string();
    let second = h.wait(Some(Duration::ZERO)).unwrap_err().to_string();
    assert!(first.contains("SentinelError: twice"), "{first}");
    assert_eq!(first, second);
    assert!(h.is_done());
    Ok(())
}

pub fn alloc_hands_over_batched_tasks_before_waiting_for_ring_space<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    // Four 16 KiB intermediates fill a 64 KiB ring; every later alloc needs an earlier
    // pair of tasks to have run, so it must not sit on them in the hand-over batch. In the
    // run's own scope the ring would fill for good: that is an immediate error.
    let mut cfg = l3_config(mode, 0, 1);
    cfg.heap_ring_bytes = 64 * 1024;
    let mut w = DistWorker::new(cfg).unwrap();
    let total = w.shared_tensor_from(&[1], &[0u64]).unwrap();
    let fill = w.register_sub("fill", |call| {
        let v: u64 = call.scalar(0).ok_or("v")?;
        call.tensor_mut::<u64>(0)?.fill(v);
        Ok(())
    });
    let add = w.register_sub("add", |call| {
        let s: u64 = call.tensor::<u64>(0)?.to_vec().iter().sum();
        call.tensor_mut::<u64>(1)?.update(|t| t + s);
        Ok(())
    });
    let (ta, tb) = (total.clone(), total.clone());
    let add2 = add;
    let orch = w.register_orchestration("stream", move |o, _| {
        for i in 0..64u64 {
            // A scope per step: its intermediate is reclaimed once both tasks ran.
            o.scope(|o| {
                let t = o.alloc(&[2048], DataType::U64)?;
                o.submit_sub(&fill, &args(&[t.arg(ArgTag::Output)], &[i]))?;
                let a = args(&[t.arg(ArgTag::Input), ta.arg(ArgTag::InOut)], &[]);
                o.submit_sub(&add, &a)?;
                Ok(())
            })?;
        }
        Ok(())
    });
    let unscoped = w.register_orchestration("unscoped", move |o, _| {
        for _ in 0..5 {
            let t = o.alloc(&[2048], DataType::U64)?;
            o.submit_sub(
                &add2,
                &args(&[t.arg(ArgTag::Input), tb.arg(ArgTag::InOut)], &[]),
            )?;
        }
        Ok(())
    });
    w.init().unwrap();
    w.run(&orch, &TaskArgs::new()).unwrap();
    assert_eq!(
        total.to_vec::<u64>().unwrap(),
        vec![2048 * (0..64).sum::<u64>()]
    );
    let e = w.run(&unscoped, &TaskArgs::new()).unwrap_err().to_string();
    assert!(e.contains("heap ring 0") && e.contains("scope"), "{e}");
    Ok(())
}

pub fn re_registering_a_name_replaces_the_callable<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mut w = l3(mode, 0, 1);
    let x = w.shared_tensor_from(&[1], &[0u64]).unwrap();
    let xa = x.clone();
    let set = w.register_sub("set", |call| {
        call.tensor_mut::<u64>(0)?.set(&[0], 1)?;
        Ok(())
    });
    let set2 = w.register_sub("set", |call| {
        call.tensor_mut::<u64>(0)?.set(&[0], 2)?;
        Ok(())
    });
    assert_eq!(set.id(), set2.id());
    let o1 = w.register_orchestration("o", |_, _| Err("the first registration".into()));
    let o2 = w.register_orchestration("o", move |o, _| {
        o.submit_sub(&set, &args(&[xa.arg(ArgTag::OutputExisting)], &[]))?;
        Ok(())
    });
    assert_eq!(o1.id(), o2.id());
    w.init().unwrap();
    w.run(&o1, &TaskArgs::new()).unwrap();
    assert_eq!(x.to_vec::<u64>().unwrap(), vec![2]);
    Ok(())
}

/// Registers a chip orchestration "scale" that multiplies its INOUT tensor 0 by its f32
/// scalar 0 in one AIV kernel task.
fn register_chip_scale(w: &mut DistWorker) -> strata_chip::OrchHandle {
    let scale = w
        .register_kernel("scale", |ctx| {
            let k: f32 = ctx.scalar(0)?;
            let mut t = ctx.output::<f32>(0)?;
            for v in t
                .as_mut_slice()
                .ok_or_else(|| strata_chip::KernelError::new("strided"))?
            {
                *v *= k;
            }
            Ok(())
        })
        .unwrap();
    w.register_chip_orchestration("scale", move |o, a| {
        o.submit_aiv(
            scale,
            CoreArgs::new()
                .inout(&a.tensor(0)?)
                .scalar(a.scalar::<f32>(0)?),
        )?;
        Ok(())
    })
    .unwrap()
}
