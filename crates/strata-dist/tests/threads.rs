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
    ];
    run(&[
        contracts::suite::<Threads>().as_slice(),
        identity::suite::<Threads>().as_slice(),
        threads_only,
    ]
    .concat());
}
