//! `ExecMode::Threads`: strata-dist's contracts (`contracts/`, shared with
//! `processes.rs`) with the children as threads of this process over the same mailbox
//! protocol, then what only threads allow: several workers initialised side by side in one
//! process.
//!
//! `harness = false` like `processes.rs`: one runner for both modes, whose leak check
//! counts this process's threads, so every scenario must join every thread it started.
//! (A `#[test]` function here would not run: add a scenario to the lists instead.)

mod common;
mod contracts;
mod identity;

use common::*;
use strata_host::ExecMode;
use strata_types::{ArgTag, TaskArgs};

/// Two workers in one process share nothing but the process. (With processes, the
/// second `init` would fork beside the first worker's threads, which the fork guard
/// refuses: see `processes.rs`.)
fn two_workers_in_one_process_are_independent() -> Outcome {
    let mode = ExecMode::Threads;
    let mut a = l3(mode, 0, 1);
    let mut b = l3(mode, 0, 2);
    let xa = a.shared_tensor_from(&[1], &[0u64]).unwrap();
    let xb = b.shared_tensor_from(&[1], &[0u64]).unwrap();
    let mut orchs = vec![];
    for (w, x, k) in [(&mut a, xa.clone(), 1u64), (&mut b, xb.clone(), 100)] {
        let add = w.register_sub("add", move |call| {
            call.tensor_mut::<u64>(0)?.update(|v| v + k);
            Ok(())
        });
        orchs.push(w.register_orchestration("twenty", move |o, _| {
            for _ in 0..20 {
                o.submit_sub(&add, &args(&[x.arg(ArgTag::InOut)], &[]))?;
            }
            Ok(())
        }));
    }
    a.init().unwrap();
    b.init().unwrap();
    let ha = a.submit(&orchs[0], &TaskArgs::new()).unwrap();
    let hb = b.submit(&orchs[1], &TaskArgs::new()).unwrap();
    ha.result().unwrap();
    hb.result().unwrap();
    assert_eq!(xa.to_vec::<u64>().unwrap(), vec![20]);
    assert_eq!(xb.to_vec::<u64>().unwrap(), vec![2000]);
    Ok(())
}

/// Per-worker submit order as a property against a sequential oracle: random programs of
/// independent singles and groups over 4 chips (each task spinning a random few µs, so
/// that completions interleave differently every time) must start, on every worker, in
/// exactly the order they were submitted for that worker — whatever the batching and
/// however a dispatch pass sees them. Threads mode: the log is exact and runs are cheap.
fn random_programs_start_in_submission_order_on_every_worker() -> Outcome {
    const CHIPS: usize = 4;
    const PROGRAMS: u64 = 200;
    let mut w = l3(ExecMode::Threads, CHIPS, 0);
    let sig = Signals::new(&mut w);
    let s = sig.clone();
    // The program for a seed: per task, its workers (one: a single; more: a group).
    fn program(seed: u64) -> Vec<Vec<usize>> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let tasks = 8 + next(24);
        (0..tasks)
            .map(|_| {
                let size = if next(3) == 0 {
                    2 + next(3) as usize
                } else {
                    1
                };
                let mut workers: Vec<usize> = (0..CHIPS).collect();
                for i in (1..CHIPS).rev() {
                    workers.swap(i, next(i as u64 + 1) as usize);
                }
                workers.truncate(size);
                workers
            })
            .collect()
    }
    let orch = w.register_orchestration("random", move |o, a| {
        let seed: u64 = a.scalar_at(0).ok_or("the seed is scalar 0")?;
        for (label, workers) in program(seed).iter().enumerate() {
            let spin = (seed + label as u64) % 7 * 20;
            let member = |w: usize| {
                Signals::task(
                    &[],
                    (NO_WORD, 0),
                    (NO_WORD, 0),
                    Some((w, label as u64)),
                    spin,
                )
            };
            if workers.len() == 1 {
                o.submit_next_level(s.orch, &member(workers[0]), workers[0])?;
            } else {
                let members: Vec<TaskArgs> = workers.iter().map(|&w| member(w)).collect();
                o.submit_next_level_group(s.orch, &members, workers)?;
            }
        }
        Ok(())
    });
    w.init().unwrap();
    for seed in 0..PROGRAMS {
        sig.clear_log();
        w.run(&orch, &args(&[], &[seed]))
            .map_err(|e| format!("program {seed}: {e}"))?;
        let log = sig.log();
        let prog = program(seed);
        for worker in 0..CHIPS {
            let oracle: Vec<u64> = (0..prog.len() as u64)
                .filter(|&l| prog[l as usize].contains(&worker))
                .collect();
            let started: Vec<u64> = log
                .iter()
                .filter(|&&(w, _)| w == worker)
                .map(|&(_, l)| l)
                .collect();
            check!(
                started == oracle,
                "program {seed}, worker {worker}: started {started:?}, submitted {oracle:?} (tasks' workers: {prog:?})"
            );
        }
    }
    w.close().unwrap();
    Ok(())
}

fn main() {
    let threads_only: &[Scenario] = &[
        (
            "two_workers_in_one_process_are_independent",
            two_workers_in_one_process_are_independent,
        ),
        (
            "a_detached_thread_childs_heap_ring_is_quarantined",
            identity::a_detached_thread_childs_heap_ring_is_quarantined,
        ),
        (
            "random_programs_start_in_submission_order_on_every_worker",
            random_programs_start_in_submission_order_on_every_worker,
        ),
    ];
    run(&[
        contracts::suite::<Threads>().as_slice(),
        identity::suite::<Threads>().as_slice(),
        threads_only,
    ]
    .concat());
}
