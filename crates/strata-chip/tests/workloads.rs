//! The reference example workloads (E1–E7, batched matmul, SPMD) against host goldens,
//! and the negative suite (fatal codes).

use strata_chip::ChipConfig;
use strata_fixtures::*;

fn small() -> ChipConfig {
    ChipConfig {
        device_memory_bytes: 1 << 30,
        ..ChipConfig::default()
    }
}

#[test]
fn e1_vector_add_matches_host_golden() {
    let r = e1_vector_add(small()).unwrap();
    assert_eq!((r.runs, r.tasks), (1, 1));
    let last = r.last.unwrap();
    let spans = strata_chip::parse_strace(&last.strace());
    let run = spans.iter().find(|s| s.name == "chip.run").unwrap();
    assert!(run.dur > 0);
    let wall = spans
        .iter()
        .find(|s| s.name == "chip.run.runner_run.device_wall")
        .unwrap();
    assert!(wall.dur > 0 && wall.is_device());
}

#[test]
fn e1b_four_ring_configurations() {
    let r = e1b_ring_configs_run(small()).unwrap();
    assert_eq!(r.runs, 4);
}

#[test]
fn e1c_malloc_copy_round_trips() {
    e1c_malloc(small()).unwrap();
}

#[test]
fn e2_small_dag_with_nested_scope_gives_47() {
    let r = e2_vector_example(small()).unwrap();
    assert_eq!(r.tasks, 5);
}

#[test]
fn e4_mixed_shapes() {
    let r = e4_mixed_example(ChipConfig {
        device_memory_bytes: 1 << 30,
        ..ChipConfig::clusters(2)
    })
    .unwrap();
    assert_eq!(r.tasks, 20);
}

#[test]
fn e5_spmd_context_accessors_exact() {
    e5_spmd_basic(small()).unwrap();
}

#[test]
fn e6_dependency_only_tasks_exact() {
    let r = e6_dummy_task(small()).unwrap();
    assert_eq!(r.runs, 4);
}

#[test]
fn e7_orchestration_data_access() {
    e7_scalar_data(small()).unwrap();
}

#[test]
fn batched_matmul_several_hundred_tasks() {
    let r = batched_matmul(
        ChipConfig {
            device_memory_bytes: 1 << 30,
            ..ChipConfig::clusters(2)
        },
        3,
        128,
        32,
    )
    .unwrap();
    assert_eq!(r.tasks, 3 * 4 * 4 * 4 * 2);
}

#[test]
fn spmd_blocks_more_than_cores_are_queued() {
    spmd_blocks(small(), 37).unwrap();
}

#[test]
fn spmd_barrier_needs_concurrent_blocks() {
    let cfg = ChipConfig {
        aic_cores: 0,
        aiv_cores: 8,
        device_memory_bytes: 1 << 30,
        ..ChipConfig::default()
    };
    spmd_barrier(cfg, 8).unwrap();
}

#[test]
fn negative_suite_reports_reference_codes_and_chip_stays_usable() {
    let cases = negative_suite(small()).unwrap();
    let codes: Vec<i32> = cases.iter().map(|c| c.code).collect();
    assert_eq!(codes, vec![1, 2, 3, 4, 5, 7, 8, 9, 100, 110]);
    let heap = &cases[1].error;
    assert!(
        heap.contains("ring 0") && heap.contains("heap_bytes"),
        "{heap}"
    );
    let flow = &cases[2].error;
    assert!(flow.contains("task_window = 4"), "{flow}");
    let dep = &cases[3].error;
    assert!(dep.contains("dep_pool = 4"), "{dep}");
}

/// Every workload and the negative suite again, with each orchestration run on the thread
/// that calls `run` (`OrchestratorPlacement::Caller`) instead of the orchestrator thread:
/// the same goldens and the same codes.
#[test]
fn every_workload_with_the_orchestration_on_the_callers_thread() {
    use strata_chip::OrchestratorPlacement::Caller;
    let caller = |c: ChipConfig| ChipConfig {
        orchestrator: Caller,
        device_memory_bytes: 1 << 30,
        ..c
    };
    let r = e1_vector_add(caller(small())).unwrap();
    assert_eq!((r.runs, r.tasks), (1, 1));
    assert_eq!(e1b_ring_configs_run(caller(small())).unwrap().runs, 4);
    e1c_malloc(caller(small())).unwrap();
    assert_eq!(e2_vector_example(caller(small())).unwrap().tasks, 5);
    assert_eq!(
        e4_mixed_example(caller(ChipConfig::clusters(2)))
            .unwrap()
            .tasks,
        20
    );
    e5_spmd_basic(caller(small())).unwrap();
    assert_eq!(e6_dummy_task(caller(small())).unwrap().runs, 4);
    e7_scalar_data(caller(small())).unwrap();
    let r = batched_matmul(caller(ChipConfig::clusters(2)), 3, 128, 32).unwrap();
    assert_eq!(r.tasks, 3 * 4 * 4 * 4 * 2);
    spmd_blocks(caller(small()), 37).unwrap();
    let cases = negative_suite(caller(small())).unwrap();
    let codes: Vec<i32> = cases.iter().map(|c| c.code).collect();
    assert_eq!(codes, vec![1, 2, 3, 4, 5, 7, 8, 9, 100, 110]);
}
