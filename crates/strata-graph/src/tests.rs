//! Behaviour tests of the orchestrator and scheduler handles: ports of the reference
//! engine's test_orchestrator / test_scheduler / test_ring cases whose semantics apply,
//! plus strata's own (sequential semantics, deadlock detection, fatal codes).

use crate::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_types::{ArgTag, DataType, IdentityMinter, TensorView};

struct H {
    orch: Orchestrator<u32>,
    sched: Scheduler<u32>,
    minter: IdentityMinter,
    ready: Vec<ReadyTask>,
}

fn h() -> H {
    h_with(GraphConfig::default())
}

fn h_with(cfg: GraphConfig) -> H {
    let (orch, sched) = graph(cfg).unwrap();
    H {
        orch,
        sched,
        minter: IdentityMinter::new(),
        ready: vec![],
    }
}

fn small_rings(heap_kib: u64, window: Option<u64>, pool: Option<u64>) -> GraphConfig {
    GraphConfig {
        rings: [RingConfig {
            heap_bytes: heap_kib * 1024,
            task_window: window,
            dep_pool: pool,
        }; RING_COUNT],
        wait_timeout: Duration::from_millis(300),
        pipeline_depth: 2,
    }
}

fn consumed(s: Option<TaskState>) -> bool {
    matches!(s, None | Some(TaskState::Consumed))
}

fn whole(k: BufferKey, tag: ArgTag) -> Access {
    Access::new(k, Footprint::WHOLE, tag)
}

impl H {
    fn key(&self) -> BufferKey {
        BufferKey::new(self.minter.mint(), KeySpace::Host)
    }
    fn submit(&mut self, payload: u32, acc: &[Access]) -> Submitted {
        self.orch.submit(TaskSpec::new(payload, acc)).unwrap()
    }
    /// Submits a task that owns a heap slab (and is therefore retained by its scope).
    fn submit_heap(&mut self, payload: u32, acc: &[Access]) -> Submitted {
        self.orch
            .submit(TaskSpec::new(payload, acc).with_heap(1024, &[]))
            .unwrap()
    }
    fn debug(&self, t: TaskRef) -> crate::core::DebugSlot {
        self.orch.core().debug(t)
    }
    fn run_one(&mut self, t: TaskRef) {
        self.sched.claim(t).expect("task is ready");
        self.sched.complete(t, Ok(()), &mut self.ready).unwrap();
    }
    fn fail_one(&mut self, t: TaskRef, msg: &str) {
        self.sched.claim(t).expect("task is ready");
        self.sched
            .complete(
                t,
                Err(Failure::new(FailureKind::Task, msg)),
                &mut self.ready,
            )
            .unwrap();
    }
    /// Runs every ready task (FIFO) until nothing is ready; returns the payload order.
    fn drain(&mut self, mut ready: Vec<TaskRef>) -> Vec<u32> {
        let mut order = vec![];
        let mut i = 0;
        while i < ready.len() {
            let t = ready[i];
            i += 1;
            if let Some(c) = self.sched.claim(t) {
                order.push(c.payload);
                self.sched.complete(t, Ok(()), &mut self.ready).unwrap();
                ready.extend(self.ready.drain(..).map(|r| r.task));
            }
        }
        order
    }
}

fn rows2() -> (TensorView, impl Fn(u64) -> Footprint) {
    let m = TensorView::contiguous(DataType::F32, &[2, 16]).unwrap();
    (m, move |r| {
        Footprint::of_view(&m.slice(0, r, r + 1).unwrap())
    })
}

fn tile16(r0: u64, rows: u64, c0: u64, cols: u64) -> Footprint {
    Footprint::of_view(
        &TensorView::contiguous(DataType::U8, &[16, 16])
            .unwrap()
            .window(&[r0, c0], &[rows, cols])
            .unwrap(),
    )
}

// ---------------------------------------------------------------- test_orchestrator ports

#[test]
fn independent_task_is_immediately_ready() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let s = h.submit(1, &[whole(k, ArgTag::Output)]);
    assert!(s.ready && !s.poisoned);
    assert_eq!(h.orch.task_state(s.task), Some(TaskState::Ready));
}

#[test]
fn dependent_task_is_pending_with_one_live_fanin() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    let b = h.submit(2, &[whole(k, ArgTag::Input)]);
    assert!(!b.ready);
    let d = h.debug(b.task);
    assert_eq!(d.state, Some(TaskState::Pending));
    assert_eq!(d.fanin_count, Some(1));
    assert_eq!(d.producers, vec![a.task]);
}

#[test]
fn group_duplicate_inputs_keep_one_producer() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let p = h.submit(1, &[whole(k, ArgTag::Output)]);
    let m = [whole(k, ArgTag::Input)];
    let g = h
        .orch
        .submit(TaskSpec::group(2, &[&m[..], &m[..]]))
        .unwrap();
    let d = h.debug(g.task);
    assert_eq!(d.fanin_count, Some(1));
    assert_eq!(d.producers, vec![p.task]);
    assert_eq!(
        h.debug(p.task).refs_total,
        1,
        "one consumer edge (no heap: no scope ref)"
    );
}

#[test]
fn submit_after_failed_producer_poisons_consumer() {
    let mut h = h();
    let run = h.orch.begin_run().unwrap();
    let k = h.key();
    let p = h.submit(1, &[whole(k, ArgTag::Output)]);
    // An independent task submitted before the failure still runs.
    let other = h.key();
    let ind = h.submit(9, &[whole(other, ArgTag::Output)]);
    h.fail_one(p.task, "producer failed");
    // Fail-fast: the run has an error, so a later submit is refused with it.
    let err = h
        .orch
        .submit(TaskSpec::new(2, &[whole(k, ArgTag::Input)]))
        .unwrap_err();
    assert_eq!(err.to_string(), "producer failed");
    h.run_one(ind.task);
    h.orch.close_run().unwrap();
    assert_eq!(
        h.orch.wait_run(run, None).unwrap(),
        Some(Err(Failure::new(FailureKind::Task, "producer failed")))
    );
}

#[test]
fn tensormap_tracks_producer_and_consumption_cleans_up() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    assert_eq!(h.orch.writers_of(&k), vec![a.task]);
    h.orch.scope_end().unwrap(); // drop the run scope's reference
    h.run_one(a.task);
    assert!(consumed(h.orch.task_state(a.task)));
    assert!(h.orch.writers_of(&k).is_empty());
    assert_eq!(h.orch.tensormap_entries(), 0);
}

#[test]
fn consuming_a_superseded_writer_keeps_the_newer_mapping() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    let b = h.submit(2, &[whole(k, ArgTag::Output)]);
    assert!(!b.ready, "write-after-write: b waits for a");
    h.run_one(a.task);
    assert_eq!(h.orch.writers_of(&k), vec![b.task]);
    let c = h.submit(3, &[whole(k, ArgTag::Input)]);
    assert_eq!(h.debug(c.task).producers, vec![b.task]);
    assert_eq!(h.debug(c.task).fanin_count, Some(1));
}

#[test]
fn disjoint_views_of_one_backing_do_not_serialize() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let (_, row) = rows2();
    let a = h.submit(1, &[Access::new(k, row(0), ArgTag::InOut)]);
    let b = h.submit(2, &[Access::new(k, row(1), ArgTag::InOut)]);
    assert!(a.ready && b.ready);
    assert!(h.debug(b.task).producers.is_empty());
    // Column blocks and quadrant tiles.
    let k2 = h.key();
    let c1 = h.submit(3, &[Access::new(k2, tile16(0, 16, 0, 4), ArgTag::InOut)]);
    let c2 = h.submit(4, &[Access::new(k2, tile16(0, 16, 8, 4), ArgTag::InOut)]);
    assert!(c1.ready && c2.ready);
    let k3 = h.key();
    for (i, (r, c)) in [(0, 0), (0, 8), (8, 0), (8, 8)].into_iter().enumerate() {
        let s = h.submit(
            10 + i as u32,
            &[Access::new(k3, tile16(r, 8, c, 8), ArgTag::InOut)],
        );
        assert!(s.ready && h.debug(s.task).producers.is_empty());
    }
    assert_eq!(h.orch.writers_of(&k3).len(), 4);
}

#[test]
fn intersecting_and_overlapping_views_still_serialize() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(1, &[Access::new(k, tile16(0, 8, 0, 8), ArgTag::InOut)]);
    let b = h.submit(2, &[Access::new(k, tile16(4, 8, 4, 8), ArgTag::InOut)]);
    assert_eq!(h.debug(b.task).producers, vec![a.task]);
    let k2 = h.key();
    let (_, row) = rows2();
    let w = h.submit(3, &[Access::new(k2, row(1), ArgTag::InOut)]);
    let r = h.submit(4, &[Access::new(k2, row(1), ArgTag::Input)]);
    assert_eq!(h.debug(r.task).producers, vec![w.task]);
}

#[test]
fn a_reader_of_the_whole_backing_depends_on_every_disjoint_writer() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let (m, row) = rows2();
    let a = h.submit(1, &[Access::new(k, row(0), ArgTag::OutputExisting)]);
    let b = h.submit(2, &[Access::new(k, row(1), ArgTag::OutputExisting)]);
    let c = h.submit(3, &[Access::new(k, Footprint::of_view(&m), ArgTag::Input)]);
    let d = h.debug(c.task);
    assert_eq!(d.fanin_count, Some(2));
    assert_eq!(d.producers, vec![a.task, b.task]);
    // Consuming one disjoint writer leaves the other mapped.
    h.run_one(a.task);
    let whole_writers = h.orch.writers_of(&k);
    assert_eq!(
        whole_writers,
        vec![a.task, b.task],
        "a still retained by c and the scope"
    );
}

#[test]
fn a_task_without_runtime_memory_is_not_retained_by_its_scope() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    h.orch.scope_begin().unwrap();
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    assert_eq!(h.debug(a.task).refs_total, 0);
    h.run_one(a.task);
    assert!(
        consumed(h.orch.task_state(a.task)),
        "reclaimed at completion"
    );
    // A later reader finds nothing to wait for.
    assert!(h.submit(2, &[whole(k, ArgTag::Input)]).ready);
}

#[test]
fn scope_registers_and_releases_its_reference() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    h.orch.scope_begin().unwrap();
    let k = h.key();
    let a = h.submit_heap(1, &[whole(k, ArgTag::Output)]);
    assert_eq!(h.debug(a.task).refs_total, 1);
    h.run_one(a.task);
    assert_eq!(h.orch.task_state(a.task), Some(TaskState::Completed));
    h.orch.scope_end().unwrap();
    assert!(consumed(h.orch.task_state(a.task)), "consumed at scope end");
}

#[test]
fn no_dep_tag_skips_dependency_tracking() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    h.submit(1, &[whole(k, ArgTag::Output)]);
    let b = h.submit(2, &[whole(k, ArgTag::NoDep)]);
    assert!(b.ready);
    assert!(h.debug(b.task).producers.is_empty());
}

#[test]
fn group_members_outputs_map_to_the_group() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let (k0, k1) = (h.key(), h.key());
    let m0 = [whole(k0, ArgTag::Output)];
    let m1 = [whole(k1, ArgTag::Output)];
    let g = h
        .orch
        .submit(TaskSpec::group(7, &[&m0[..], &m1[..]]))
        .unwrap();
    assert_eq!(h.orch.writers_of(&k0), vec![g.task]);
    assert_eq!(h.orch.writers_of(&k1), vec![g.task]);
    let c = h.sched.claim(g.task).unwrap();
    assert_eq!(c.group_size, 2);
}

#[test]
fn inout_wires_a_completed_creator_without_delay_but_retains_it() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let c = h.submit_heap(1, &[whole(k, ArgTag::Output)]);
    h.run_one(c.task);
    let w = h.submit(2, &[whole(k, ArgTag::InOut)]);
    assert!(w.ready);
    let d = h.debug(w.task);
    assert_eq!(d.fanin_count, Some(0));
    assert_eq!(d.producers, vec![c.task]);
    assert_eq!(h.debug(c.task).refs_total, 2, "scope + the writer's edge");
    assert!(h.debug(c.task).consumers.is_empty(), "nothing to notify");
    assert_eq!(h.orch.writers_of(&k), vec![w.task]);
}

#[test]
fn empty_run_completes_when_submission_closes() {
    let mut h = h();
    let run = h.orch.begin_run().unwrap();
    assert_eq!(h.orch.wait_run(run, Some(Duration::ZERO)).unwrap(), None);
    h.orch.close_run().unwrap();
    assert_eq!(h.orch.run_phase(run), Some(RunPhase::Completed));
    assert_eq!(
        h.orch.wait_run(run, Some(Duration::ZERO)).unwrap(),
        Some(Ok(()))
    );
    h.orch.release_run(run).unwrap();
    assert!(matches!(
        h.orch.wait_run(run, None),
        Err(GraphError::UnknownRun(_))
    ));
}

#[test]
fn one_task_run_completes_after_consumption() {
    let mut h = h();
    let run = h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    h.orch.close_run().unwrap();
    assert_eq!(h.orch.run_phase(run), Some(RunPhase::Executing));
    h.run_one(a.task);
    assert_eq!(h.orch.wait_run(run, None).unwrap(), Some(Ok(())));
}

#[test]
fn sequential_runs_have_distinct_ids_and_errors_do_not_leak() {
    let mut h = h();
    let r1 = h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    h.orch.close_run().unwrap();
    h.fail_one(a.task, "boom");
    assert!(matches!(h.orch.wait_run(r1, None).unwrap(), Some(Err(_))));
    let r2 = h.orch.begin_run().unwrap();
    assert_ne!(r1, r2);
    let b = h.submit(2, &[whole(k, ArgTag::Input)]);
    assert!(b.ready, "runs never see each other's producers");
    h.orch.close_run().unwrap();
    h.run_one(b.task);
    assert_eq!(h.orch.wait_run(r2, None).unwrap(), Some(Ok(())));
}

#[test]
fn failed_submission_carries_its_message_and_cancels_unstarted_tasks() {
    let mut h = h();
    let run = h.orch.begin_run().unwrap();
    let k = h.key();
    let p = h.submit(1, &[whole(k, ArgTag::Output)]);
    let running = h.submit(2, &[whole(h.key(), ArgTag::Output)]);
    h.sched.claim(running.task).unwrap();
    let pending = h.submit(3, &[whole(k, ArgTag::Input)]);
    let p_released_before = h.debug(p.task).refs_released;
    h.orch
        .fail_run(Failure::new(
            FailureKind::Cancelled,
            "orchestration: ValueError: bad arg",
        ))
        .unwrap();
    // The unstarted producer and consumer are cancelled; the running task is not.
    assert!(h.sched.claim(p.task).is_none());
    assert!(
        consumed(h.orch.task_state(pending.task)),
        "cancelled and consumed"
    );
    assert!(h.debug(p.task).refs_released > p_released_before);
    assert_eq!(h.orch.task_state(running.task), Some(TaskState::Running));
    assert_eq!(h.orch.wait_run(run, Some(Duration::ZERO)).unwrap(), None);
    h.sched
        .complete(running.task, Ok(()), &mut h.ready)
        .unwrap();
    let out = h.orch.wait_run(run, None).unwrap().unwrap();
    assert_eq!(
        out.unwrap_err().message(),
        "orchestration: ValueError: bad arg"
    );
}

#[test]
fn cancel_keeps_producer_refs_held_by_a_running_consumer() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let p = h.submit_heap(1, &[whole(k, ArgTag::Output)]);
    h.run_one(p.task);
    let c = h.submit(2, &[whole(k, ArgTag::Input)]);
    h.sched.claim(c.task).unwrap();
    let before = h.debug(p.task).refs_released;
    h.orch
        .fail_run(Failure::new(FailureKind::Cancelled, "cancel"))
        .unwrap();
    // Only the scope's reference on p came back; c still holds its edge while running.
    assert_eq!(h.debug(p.task).refs_released, before + 1);
    assert_eq!(h.orch.task_state(c.task), Some(TaskState::Running));
    h.sched.complete(c.task, Ok(()), &mut h.ready).unwrap();
    assert!(consumed(h.orch.task_state(p.task)));
}

#[test]
fn fifo_head_executes_while_building_and_successor_waits() {
    let mut h = h();
    let r1 = h.orch.begin_run().unwrap();
    assert_eq!(h.orch.dispatchable_run(), Some(r1));
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    h.orch.close_run().unwrap();
    let r2 = h.orch.begin_run().unwrap();
    assert_eq!(h.orch.run_phase(r2), Some(RunPhase::Building));
    let b = h.submit(2, &[whole(k, ArgTag::Output)]);
    assert!(b.ready, "ready, but its run is not dispatchable yet");
    assert_eq!(h.orch.ready_task(b.task).run, r2);
    h.orch.close_run().unwrap();
    assert_eq!(h.orch.run_phase(r2), Some(RunPhase::Prepared));
    assert_eq!(h.orch.dispatchable_run(), Some(r1));
    h.run_one(a.task);
    assert_eq!(h.orch.run_phase(r1), Some(RunPhase::Completed));
    assert_eq!(h.orch.dispatchable_run(), Some(r2));
    h.run_one(b.task);
    assert_eq!(
        h.orch.dispatchable_run(),
        None,
        "released lease: nothing dispatchable"
    );
}

#[test]
fn third_admission_waits_for_the_oldest_run() {
    let mut h = h();
    let r1 = h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    h.orch.close_run().unwrap();
    h.orch.begin_run().unwrap();
    h.orch.close_run().unwrap();
    assert!(matches!(
        h.orch.begin_run_timeout(Some(Duration::from_millis(50))),
        Err(GraphError::Timeout { .. })
    ));
    let H {
        mut orch,
        mut sched,
        ..
    } = h;
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let t = std::thread::spawn(move || {
        let r3 = orch.begin_run().unwrap();
        d2.store(true, Ordering::SeqCst);
        (orch, r3)
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(!done.load(Ordering::SeqCst), "third begin_run blocks");
    sched.claim(a.task).unwrap();
    sched.complete(a.task, Ok(()), &mut vec![]).unwrap();
    let (orch, r3) = t.join().unwrap();
    assert_eq!(r3, RunId(r1.0 + 2));
    assert_eq!(
        orch.dispatchable_run(),
        Some(r3),
        "the empty second run finished at once"
    );
}

#[test]
fn heap_freed_by_a_failure_is_not_handed_to_a_waiting_submit_of_the_failed_run() {
    // A failed task's slab may still be written (a chip kernel abandoned after its
    // timeout): a submit of the same run that was waiting for heap space when the task
    // failed must not get it.
    let mut h = h_with(small_rings(2, None, None));
    h.orch.begin_run().unwrap();
    h.orch.scope_begin().unwrap();
    let a = h
        .orch
        .submit(TaskSpec::new(1, &[]).with_heap(2048, &[]))
        .unwrap();
    h.orch.scope_end().unwrap();
    h.sched.claim(a.task).unwrap();
    let H {
        mut orch,
        mut sched,
        ..
    } = h;
    let waiter = std::thread::spawn(move || {
        orch.scope_begin().unwrap();
        let r = orch.submit(TaskSpec::new(2, &[]).with_heap(2048, &[]));
        let alloc = orch.alloc(
            BufferKey::new(IdentityMinter::new().mint(), KeySpace::Host),
            2048,
        );
        (r.map(|s| s.task), alloc.map(|(t, _)| t))
    });
    std::thread::sleep(Duration::from_millis(50));
    sched
        .complete(
            a.task,
            Err(Failure::new(FailureKind::Task, "timed out")),
            &mut vec![],
        )
        .unwrap();
    let (submitted, allocated) = waiter.join().unwrap();
    assert!(
        matches!(submitted, Err(GraphError::RunFailed(_))),
        "{submitted:?}"
    );
    assert!(
        matches!(allocated, Err(GraphError::RunFailed(_))),
        "{allocated:?}"
    );
}

#[test]
fn depth_one_admission_always_wakes_the_waiter() {
    let cfg = GraphConfig {
        pipeline_depth: 1,
        ..GraphConfig::default()
    };
    let (mut orch, mut sched) = graph::<u32>(cfg).unwrap();
    let minter = IdentityMinter::new();
    let k = BufferKey::new(minter.mint(), KeySpace::Host);
    let acc = [whole(k, ArgTag::InOut)];
    let (tx, rx) = std::sync::mpsc::channel::<TaskRef>();
    let sched_thread = std::thread::spawn(move || {
        let mut ready = vec![];
        for t in rx {
            sched.claim(t).unwrap();
            sched.complete(t, Ok(()), &mut ready).unwrap();
        }
    });
    for i in 0..200 {
        let run = orch
            .begin_run_timeout(Some(Duration::from_secs(5)))
            .expect("admission wakes within 5 s");
        let s = orch.submit(TaskSpec::new(i, &acc)).unwrap();
        orch.close_run().unwrap();
        tx.send(s.task).unwrap();
        let _ = run;
    }
    drop(tx);
    sched_thread.join().unwrap();
}

#[test]
fn timed_wait_can_retry_after_timeout() {
    let mut h = h();
    let run = h.orch.begin_run().unwrap();
    assert_eq!(h.orch.wait_run(run, Some(Duration::ZERO)).unwrap(), None);
    h.orch.close_run().unwrap();
    assert!(h
        .orch
        .wait_run(run, Some(Duration::ZERO))
        .unwrap()
        .is_some());
}

#[test]
fn submit_outside_a_run_and_close_without_run_are_errors() {
    let mut h = h();
    let k = h.key();
    assert!(matches!(
        h.orch.submit(TaskSpec::new(1, &[whole(k, ArgTag::Output)])),
        Err(GraphError::NoBuildingRun { .. })
    ));
    assert!(matches!(
        h.orch.close_run(),
        Err(GraphError::NoBuildingRun { .. })
    ));
    h.orch.begin_run().unwrap();
    assert!(matches!(
        h.orch.begin_run(),
        Err(GraphError::RunAlreadyBuilding { .. })
    ));
}

#[test]
fn a_write_aliasing_a_later_argument_is_rejected() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let err = h
        .orch
        .submit(TaskSpec::new(
            1,
            &[whole(k, ArgTag::Output), whole(k, ArgTag::Input)],
        ))
        .unwrap_err();
    assert_eq!(err.fatal_code(), Some(5));
    assert!(err.to_string().contains("tag one INOUT"));
    // An earlier read of a later-written view is accepted (the reference's asymmetry).
    h.orch
        .submit(TaskSpec::new(
            2,
            &[whole(k, ArgTag::Input), whole(k, ArgTag::Output)],
        ))
        .unwrap();
    assert!(h.orch.submit(TaskSpec::group(3, &[])).is_err());
}

#[test]
fn aliasing_is_detected_among_many_arguments() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let keys: Vec<BufferKey> = (0..1000).map(|_| h.key()).collect();
    let mut args: Vec<Access> = keys.iter().map(|k| whole(*k, ArgTag::Input)).collect();
    h.orch.submit(TaskSpec::new(1, &args)).unwrap();
    // A write of key 500 before a later read of the same key.
    args[10] = whole(keys[500], ArgTag::Output);
    let e = h.orch.submit(TaskSpec::new(2, &args)).unwrap_err();
    assert!(
        e.to_string()
            .contains("argument 10 (OUTPUT) overlaps argument 500"),
        "{e}"
    );
}

#[test]
fn different_keys_over_the_same_bytes_alias_when_placed() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let (stale, fresh) = (h.key(), h.key());
    let region = AddressDomain::HostShared { region: 7 };
    let at = |k: BufferKey, base: u64, start: u64, end: u64, tag: ArgTag| {
        Access::new(k, Footprint::bytes(start, end).unwrap(), tag).placed(Placement {
            domain: region,
            base,
        })
    };
    // Same base, different keys (a stale key over reused bytes): footprints compared.
    let e = h
        .orch
        .submit(TaskSpec::new(
            1,
            &[
                at(stale, 4096, 0, 1024, ArgTag::InOut),
                at(fresh, 4096, 0, 1024, ArgTag::Input),
            ],
        ))
        .unwrap_err();
    assert_eq!(e.fatal_code(), Some(5));
    assert!(e.to_string().contains("overlaps argument 1"), "{e}");
    // Different bases whose dense ranges intersect.
    assert!(h
        .orch
        .submit(TaskSpec::new(
            2,
            &[
                at(stale, 4096, 0, 1024, ArgTag::Output),
                at(fresh, 4608, 0, 1024, ArgTag::Input)
            ],
        ))
        .is_err());
    // Adjacent ranges, another domain, or unplaced accesses: no proof of shared bytes.
    h.submit(
        3,
        &[
            at(stale, 4096, 0, 512, ArgTag::Output),
            at(fresh, 4608, 0, 512, ArgTag::Input),
        ],
    );
    let other =
        Access::new(fresh, Footprint::bytes(0, 1024).unwrap(), ArgTag::Input).placed(Placement {
            domain: AddressDomain::HostShared { region: 8 },
            base: 4096,
        });
    h.submit(4, &[at(stale, 4096, 0, 1024, ArgTag::Output), other]);
    h.submit(
        5,
        &[
            at(stale, 4096, 0, 1024, ArgTag::Output),
            Access::new(fresh, Footprint::bytes(0, 1024).unwrap(), ArgTag::Input),
        ],
    );
    // Among many arguments (the grouped path) too.
    let keys: Vec<BufferKey> = (0..40).map(|_| h.key()).collect();
    let mut args: Vec<Access> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            at(
                *k,
                1 << 20,
                i as u64 * 1024,
                (i as u64 + 1) * 1024,
                ArgTag::Input,
            )
        })
        .collect();
    h.submit(6, &args);
    args[3] = at(h.key(), 1 << 20, 30 * 1024, 31 * 1024, ArgTag::Output);
    let e = h.orch.submit(TaskSpec::new(7, &args)).unwrap_err();
    assert!(
        e.to_string()
            .contains("argument 3 (OUTPUT) overlaps argument 30"),
        "{e}"
    );
}

// ---------------------------------------------------------------- test_scheduler ports

#[test]
fn only_a_ready_task_can_be_claimed_once() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    let b = h.submit(2, &[whole(k, ArgTag::Input)]);
    assert!(h.sched.claim(b.task).is_none(), "pending");
    assert_eq!(h.sched.claim(a.task).unwrap().payload, 1);
    assert!(h.sched.claim(a.task).is_none(), "second claim");
    h.sched.complete(a.task, Ok(()), &mut h.ready).unwrap();
    assert!(
        h.sched.complete(a.task, Ok(()), &mut h.ready).is_err(),
        "duplicate completion"
    );
    assert!(h.sched.claim(a.task).is_none(), "completed");
}

#[test]
fn dependent_task_becomes_ready_after_its_producer() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(10, &[whole(k, ArgTag::Output)]);
    let b = h.submit(11, &[whole(k, ArgTag::Input)]);
    let order = h.drain(vec![a.task]);
    assert_eq!(order, vec![10, 11]);
    let _ = b;
}

#[test]
fn failed_producer_poisons_the_whole_downstream_chain() {
    let mut h = h();
    let run = h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    let mut chain = vec![];
    for i in 0..1000 {
        chain.push(h.submit(2 + i, &[whole(k, ArgTag::InOut)]).task);
    }
    let other = h.submit(5000, &[whole(h.key(), ArgTag::Output)]);
    h.orch.close_run().unwrap();
    h.fail_one(a.task, "root task boom");
    assert!(h.ready.is_empty());
    for t in &chain {
        assert!(consumed(h.orch.task_state(*t)), "poisoned and consumed");
    }
    h.run_one(other.task); // independent work keeps running
    let out = h.orch.wait_run(run, None).unwrap().unwrap();
    assert_eq!(out.unwrap_err().message(), "root task boom");
}

#[test]
fn group_completes_only_when_all_members_are_done() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let m = [whole(k, ArgTag::Output)];
    let m2 = [whole(h.key(), ArgTag::Output)];
    let g = h
        .orch
        .submit(TaskSpec::group(1, &[&m[..], &m2[..]]))
        .unwrap();
    let c = h.submit(2, &[whole(k, ArgTag::Input)]);
    h.sched.claim(g.task).unwrap();
    assert!(h.sched.start_member(g.task, 0).unwrap());
    assert!(h.sched.start_member(g.task, 1).unwrap());
    assert!(!h
        .sched
        .complete_member(g.task, 0, Ok(()), &mut h.ready)
        .unwrap());
    assert_eq!(h.orch.task_state(g.task), Some(TaskState::Running));
    assert!(h.ready.is_empty());
    assert!(
        !h.sched
            .complete_member(g.task, 0, Ok(()), &mut h.ready)
            .unwrap(),
        "duplicate report ignored"
    );
    assert!(h
        .sched
        .complete_member(g.task, 1, Ok(()), &mut h.ready)
        .unwrap());
    assert_eq!(h.ready.len(), 1);
    assert_eq!(h.ready[0].task, c.task);
}

#[test]
fn group_failure_waits_for_running_members_and_skips_undispatched() {
    let mut h = h();
    let run = h.orch.begin_run().unwrap();
    let ms: Vec<[Access; 1]> = (0..3).map(|_| [whole(h.key(), ArgTag::Output)]).collect();
    let refs: Vec<&[Access]> = ms.iter().map(|m| &m[..]).collect();
    let g = h.orch.submit(TaskSpec::group(1, &refs)).unwrap();
    h.orch.close_run().unwrap();
    h.sched.claim(g.task).unwrap();
    h.sched.start_member(g.task, 0).unwrap();
    h.sched.start_member(g.task, 1).unwrap();
    let f = Failure::new(FailureKind::Task, "member A failed");
    assert!(!h
        .sched
        .complete_member(g.task, 0, Err(f.clone()), &mut h.ready)
        .unwrap());
    // The run reports the failure at once; the group waits for member 1.
    assert_eq!(h.orch.run_phase(run), Some(RunPhase::Executing));
    assert_eq!(
        h.sched.member_states(g.task),
        vec![
            MemberState::Failed,
            MemberState::Running,
            MemberState::Skipped
        ]
    );
    assert!(
        !h.sched.start_member(g.task, 2).unwrap(),
        "skipped member is not dispatched"
    );
    assert!(h
        .sched
        .complete_member(g.task, 1, Ok(()), &mut h.ready)
        .unwrap());
    assert_eq!(h.orch.wait_run(run, None).unwrap(), Some(Err(f)));
}

#[test]
fn invalid_group_index_fails_and_consumes_the_group() {
    let mut h = h();
    let run = h.orch.begin_run().unwrap();
    let m = [whole(h.key(), ArgTag::Output)];
    let g = h
        .orch
        .submit(TaskSpec::group(1, &[&m[..], &m[..]]))
        .unwrap();
    h.orch.close_run().unwrap();
    h.sched.claim(g.task).unwrap();
    assert!(h
        .sched
        .complete_member(g.task, 99, Ok(()), &mut h.ready)
        .unwrap());
    let out = h.orch.wait_run(run, None).unwrap().unwrap();
    assert!(out.unwrap_err().message().contains("member 99"));
}

#[test]
fn group_dependency_chain() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let (k0, k1) = (h.key(), h.key());
    let m0 = [whole(k0, ArgTag::Output)];
    let m1 = [whole(k1, ArgTag::Output)];
    let g = h
        .orch
        .submit(TaskSpec::group(1, &[&m0[..], &m1[..]]))
        .unwrap();
    let c = h.submit(2, &[whole(k0, ArgTag::Input), whole(k1, ArgTag::Input)]);
    assert_eq!(h.debug(c.task).fanin_count, Some(1));
    h.sched.claim(g.task).unwrap();
    h.sched
        .complete_member(g.task, 1, Ok(()), &mut h.ready)
        .unwrap();
    assert!(h.ready.is_empty());
    h.sched
        .complete_member(g.task, 0, Ok(()), &mut h.ready)
        .unwrap();
    assert_eq!(h.ready.len(), 1);
}

// ---------------------------------------------------------------- sequential semantics

#[test]
fn writer_waits_for_earlier_readers() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let w0 = h.submit(0, &[whole(k, ArgTag::Output)]);
    let r1 = h.submit(1, &[whole(k, ArgTag::Input)]);
    let r2 = h.submit(2, &[whole(k, ArgTag::Input)]);
    let w3 = h.submit(3, &[whole(k, ArgTag::OutputExisting)]);
    assert_eq!(
        h.debug(r2.task).producers,
        vec![w0.task],
        "readers do not wait for readers"
    );
    assert_eq!(h.debug(w3.task).producers, vec![w0.task, r1.task, r2.task]);
    let order = h.drain(vec![w0.task]);
    assert_eq!(*order.last().unwrap(), 3);
}

#[test]
fn explicit_deps_and_bad_dep_ids() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let a = h.submit(1, &[]);
    let b = h
        .orch
        .submit(TaskSpec::new(2, &[]).with_deps(&[a.task]))
        .unwrap();
    assert!(!b.ready);
    let forged = TaskRef { index: 0, id: 999 };
    assert!(matches!(
        h.orch.submit(TaskSpec::new(3, &[]).with_deps(&[forged])),
        Err(GraphError::InvalidArgs(_))
    ));
}

// ---------------------------------------------------------------- rings

#[test]
fn alloc_routes_to_the_ring_of_the_scope_depth() {
    let mut h = h_with(small_rings(64, None, None));
    h.orch.begin_run().unwrap();
    let mut rings = vec![];
    for depth in 0..5 {
        let (_, slab) = h.orch.alloc(h.key(), 100).unwrap();
        rings.push(slab.ring);
        assert_eq!(slab.len, 1024);
        assert_eq!(slab.offset % 1024, 0);
        if depth < 4 {
            h.orch.scope_begin().unwrap();
        }
    }
    assert_eq!(rings, vec![0, 1, 2, 3, 3]);
    assert_eq!(h.orch.ring_live(), [1, 1, 1, 2]);
}

#[test]
fn heap_request_errors_are_immediate_and_typed() {
    let mut h = h_with(small_rings(8, None, None));
    h.orch.begin_run().unwrap();
    let e = h.orch.alloc(h.key(), 8 * 1024 + 1).unwrap_err();
    assert!(matches!(e, GraphError::HeapRequestTooLarge { ring: 0, .. }));
    assert_eq!(e.fatal_code(), Some(2));
    let mut cfg = small_rings(8, None, None);
    cfg.rings[0].heap_bytes = 0;
    let mut h = h_with(cfg);
    h.orch.begin_run().unwrap();
    assert!(matches!(
        h.orch.alloc(h.key(), 32),
        Err(GraphError::HeapDisabled { .. })
    ));
    // Slot-only submits still work on a heap-less ring.
    let k = h.key();
    assert!(h.submit(1, &[whole(k, ArgTag::Output)]).ready);
}

#[test]
fn heap_held_by_an_open_scope_is_a_structural_deadlock() {
    let mut h = h_with(small_rings(2, None, None));
    h.orch.begin_run().unwrap();
    h.orch.alloc(h.key(), 1024).unwrap();
    h.orch.alloc(h.key(), 1024).unwrap();
    let t0 = std::time::Instant::now();
    let e = h.orch.alloc(h.key(), 1024).unwrap_err();
    assert!(
        matches!(
            e,
            GraphError::HeapDeadlock {
                cause: DeadlockCause::ScopeHeld,
                ring: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(250),
        "detected without waiting out the deadline"
    );
    assert!(e.to_string().contains("raise the ring's heap size"));
}

#[test]
fn heap_back_pressure_unblocks_when_another_thread_reclaims() {
    let mut h = h_with(GraphConfig {
        wait_timeout: Duration::from_secs(10),
        ..small_rings(2, None, None)
    });
    h.orch.begin_run().unwrap();
    // Two slabs owned by tasks outside any scope but still running.
    h.orch.scope_end().unwrap();
    let (ka, kb) = (h.key(), h.key());
    let a = h
        .orch
        .submit(TaskSpec::new(1, &[]).with_heap(1024, &[ka]))
        .unwrap();
    let b = h
        .orch
        .submit(TaskSpec::new(2, &[]).with_heap(1024, &[kb]))
        .unwrap();
    let H {
        mut orch,
        mut sched,
        minter,
        ..
    } = h;
    sched.claim(a.task).unwrap();
    sched.claim(b.task).unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        let mut r = vec![];
        sched.complete(a.task, Ok(()), &mut r).unwrap();
        sched.complete(b.task, Ok(()), &mut r).unwrap();
        sched
    });
    let (_, slab) = orch
        .alloc(BufferKey::new(minter.mint(), KeySpace::Host), 1024)
        .unwrap();
    assert_eq!(slab.offset, 0, "the drained ring rebased");
    t.join().unwrap();
}

#[test]
fn heap_wait_without_progress_times_out_naming_the_ring() {
    let mut h = h_with(small_rings(2, None, None));
    h.orch.begin_run().unwrap();
    h.orch.scope_end().unwrap();
    let (ka, kb) = (h.key(), h.key());
    for (p, k) in [(1, ka), (2, kb)] {
        let s = h
            .orch
            .submit(TaskSpec::new(p, &[]).with_heap(1024, &[k]))
            .unwrap();
        h.sched.claim(s.task).unwrap(); // running forever
    }
    let e = h.orch.alloc(h.key(), 1024).unwrap_err();
    match e {
        GraphError::HeapDeadlock {
            ring: 0,
            ring_bytes: 2048,
            request: 1024,
            cause: DeadlockCause::NoProgress(_),
            ..
        } => {}
        other => panic!("{other}"),
    }
}

#[test]
fn rings_reclaim_independently() {
    let mut h = h_with(small_rings(2, None, None));
    h.orch.begin_run().unwrap();
    h.orch.scope_begin().unwrap(); // ring 1
    h.orch.alloc(h.key(), 2048).unwrap();
    assert!(h.orch.alloc(h.key(), 1024).is_err(), "ring 1 full");
    h.orch.scope_begin().unwrap();
    h.orch.scope_begin().unwrap(); // ring 3
    h.orch.alloc(h.key(), 1024).unwrap();
    h.orch.scope_end().unwrap();
    h.orch.scope_end().unwrap();
    h.orch.scope_end().unwrap(); // back to ring 0
    h.orch.alloc(h.key(), 2048).unwrap();
    assert_eq!(
        h.orch.ring_live(),
        [1, 0, 0, 0],
        "inner rings reclaimed at scope end"
    );
}

#[test]
fn runtime_buffers_are_retained_by_their_readers_and_checked_for_use_after_free() {
    let mut h = h_with(small_rings(8, None, None));
    h.orch.begin_run().unwrap();
    h.orch.scope_begin().unwrap();
    let buf = h.key();
    let (alloc_task, _) = h.orch.alloc(buf, 4096).unwrap();
    let w = h.submit(1, &[whole(buf, ArgTag::Output)]);
    let r = h.submit(2, &[whole(buf, ArgTag::Input)]);
    assert!(
        h.debug(r.task).producers.contains(&alloc_task),
        "creator edge"
    );
    h.orch.scope_end().unwrap(); // scope ends while r has not run
    h.run_one(w.task);
    assert!(
        h.orch.task_state(alloc_task).is_some(),
        "still retained by r"
    );
    h.run_one(r.task);
    assert!(consumed(h.orch.task_state(alloc_task)));
    let e = h
        .orch
        .submit(TaskSpec::new(3, &[whole(buf, ArgTag::Input)]))
        .unwrap_err();
    assert!(
        matches!(e, GraphError::BufferReclaimed { arg: 0, .. }),
        "{e}"
    );
}

#[test]
fn wait_for_access_waits_for_the_producer() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let a = h.submit(1, &[whole(k, ArgTag::Output)]);
    h.sched.claim(a.task).unwrap();
    let e = h
        .orch
        .wait_for_access(&whole(k, ArgTag::Input), Some(Duration::from_millis(20)))
        .unwrap_err();
    assert!(matches!(e, GraphError::Timeout { .. }));
    let H {
        mut orch,
        mut sched,
        ..
    } = h;
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        sched.complete(a.task, Ok(()), &mut vec![]).unwrap();
    });
    orch.wait_for_access(&whole(k, ArgTag::Input), None)
        .unwrap();
    t.join().unwrap();
}

// ---------------------------------------------------------------- fatal codes (chip suite)

#[test]
fn scope_deadlock_is_code_1() {
    let mut h = h_with(small_rings(64, Some(4), None));
    h.orch.begin_run().unwrap();
    h.orch.scope_begin().unwrap();
    let mut err = None;
    for i in 0..8 {
        let k = h.key();
        match h
            .orch
            .submit(TaskSpec::new(i, &[whole(k, ArgTag::Output)]).with_heap(64, &[]))
        {
            Ok(_) => {}
            Err(e) => {
                err = Some((i, e));
                break;
            }
        }
    }
    let (i, e) = err.expect("the window fills");
    assert_eq!(i, 3, "window 4 holds 3 live tasks");
    assert_eq!(e.fatal_code(), Some(1), "{e}");
}

#[test]
fn flow_control_deadlock_is_code_3() {
    let mut h = h_with(small_rings(64, Some(4), None));
    h.orch.begin_run().unwrap();
    let mut err = None;
    'outer: for s in 0..8 {
        h.orch.scope_begin().unwrap();
        for i in 0..3 {
            let k = h.key();
            if let Err(e) = h
                .orch
                .submit(TaskSpec::new(s * 3 + i, &[whole(k, ArgTag::Output)]).with_heap(64, &[]))
            {
                err = Some(e);
                break 'outer;
            }
        }
    }
    let e = err.expect("ring 3 fills");
    assert_eq!(e.fatal_code(), Some(3), "{e}");
    assert!(matches!(
        e,
        GraphError::FlowControlDeadlock {
            ring: 3,
            window: 4,
            cause: DeadlockCause::ScopeHeld
        }
    ));
}

#[test]
fn heap_ring_deadlock_is_code_2() {
    let mut h = h_with(small_rings(1, None, None));
    h.orch.begin_run().unwrap();
    let k = h.key();
    let e = h
        .orch
        .submit(TaskSpec::new(1, &[]).with_heap(32 * 1024, &[k]))
        .unwrap_err();
    assert_eq!(e.fatal_code(), Some(2));
}

#[test]
fn dep_pool_overflow_is_code_4() {
    let mut h = h_with(small_rings(64, None, Some(4)));
    h.orch.begin_run().unwrap();
    let keys: Vec<_> = (0..128).map(|_| h.key()).collect();
    for (i, k) in keys.iter().enumerate() {
        h.submit(i as u32, &[whole(*k, ArgTag::Output)]);
    }
    let reads: Vec<_> = keys.iter().map(|k| whole(*k, ArgTag::Input)).collect();
    let e = h.orch.submit(TaskSpec::new(999, &reads)).unwrap_err();
    assert_eq!(e.fatal_code(), Some(4), "{e}");
}

#[test]
fn dep_pool_edges_are_refunded_when_consumers_finish() {
    let mut h = h_with(small_rings(64, None, Some(4)));
    h.orch.begin_run().unwrap();
    let k = h.key();
    let p = h.submit(0, &[whole(k, ArgTag::Output)]);
    for i in 0..64 {
        // Each consumer takes one edge; finishing it returns the edge.
        let c = h.submit(1 + i, &[whole(k, ArgTag::Input)]);
        if i == 0 {
            h.run_one(p.task);
        }
        h.run_one(c.task);
    }
}

// ---------------------------------------------------------------- threads

/// Orchestrator and scheduler on two threads: a random DAG over a few buffers; each
/// task records the order in which it ran; every producer/consumer pair (from a
/// brute-force byte-overlap oracle) must run in submit order.
#[test]
fn threaded_random_dags_respect_every_dependency() {
    use std::sync::mpsc;
    for seed in 0..20u64 {
        let (mut orch, mut sched) = graph::<usize>(GraphConfig::default()).unwrap();
        let minter = IdentityMinter::new();
        let keys: Vec<_> = (0..3)
            .map(|_| BufferKey::new(minter.mint(), KeySpace::Host))
            .collect();
        let mut rng = oracle::Rng(seed * 7919 + 1);
        let tasks: Vec<Vec<oracle::Acc>> =
            (0..400).map(|_| oracle::random_task(&mut rng, 3)).collect();
        let (tx, rx) = mpsc::channel::<Option<TaskRef>>();
        let n = tasks.len();
        let sched_t = std::thread::spawn(move || {
            let mut order = vec![usize::MAX; n];
            let mut next = 0;
            let mut ready: Vec<ReadyTask> = vec![];
            let mut queue: std::collections::VecDeque<TaskRef> = Default::default();
            let mut closed = false;
            let handle = |m: Option<TaskRef>,
                          queue: &mut std::collections::VecDeque<TaskRef>,
                          closed: &mut bool| match m {
                Some(t) => queue.push_back(t),
                None => *closed = true,
            };
            loop {
                while let Ok(m) = rx.try_recv() {
                    handle(m, &mut queue, &mut closed);
                }
                if let Some(t) = queue.pop_front() {
                    if let Some(c) = sched.claim(t) {
                        order[c.payload] = next;
                        next += 1;
                        sched.complete(t, Ok(()), &mut ready).unwrap();
                        queue.extend(ready.drain(..).map(|r| r.task));
                    }
                } else if closed {
                    break;
                } else {
                    match rx.recv() {
                        Ok(m) => handle(m, &mut queue, &mut closed),
                        Err(_) => break,
                    }
                }
            }
            order
        });
        let run = orch.begin_run().unwrap();
        for (i, accs) in tasks.iter().enumerate() {
            let a: Vec<Access> = accs.iter().map(|x| x.access(&keys)).collect();
            let s = orch.submit(TaskSpec::new(i, &a)).unwrap();
            if s.ready {
                tx.send(Some(s.task)).unwrap();
            }
        }
        orch.close_run().unwrap();
        tx.send(None).unwrap();
        let order = sched_t.join().unwrap();
        assert_eq!(orch.wait_run(run, None).unwrap(), Some(Ok(())));
        for j in 0..n {
            for i in 0..j {
                if oracle::conflict(&tasks[i], &tasks[j]) {
                    assert!(
                        order[i] < order[j],
                        "seed {seed}: task {j} ran before its producer {i}"
                    );
                }
            }
        }
    }
}

pub(crate) mod oracle {
    //! A brute-force dependency oracle over small byte-addressed buffers.
    use crate::{Access, BufferKey, Footprint};
    use strata_types::{ArgTag, DataType, TensorView};

    /// Buffers are 8x8 u8 matrices.
    pub(crate) const ROWS: u64 = 8;
    pub(crate) const COLS: u64 = 8;

    #[derive(Debug, Clone)]
    pub(crate) struct Acc {
        pub(crate) buf: usize,
        pub(crate) view: TensorView,
        pub(crate) tag: ArgTag,
    }

    impl Acc {
        pub(crate) fn access(&self, keys: &[BufferKey]) -> Access {
            Access::new(keys[self.buf], Footprint::of_view(&self.view), self.tag)
        }
        pub(crate) fn bytes(&self) -> Vec<u64> {
            self.view.element_offsets().collect()
        }
    }

    pub(crate) struct Rng(pub(crate) u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    pub(crate) fn random_view(rng: &mut Rng) -> TensorView {
        let m = TensorView::contiguous(DataType::U8, &[ROWS, COLS]).unwrap();
        match rng.below(4) {
            0 => m,
            1 => {
                let r = rng.below(ROWS);
                let n = 1 + rng.below(ROWS - r);
                m.slice(0, r, r + n).unwrap()
            }
            2 => {
                let (r, c) = (rng.below(ROWS), rng.below(COLS));
                let (nr, nc) = (1 + rng.below(ROWS - r), 1 + rng.below(COLS - c));
                m.window(&[r, c], &[nr, nc]).unwrap()
            }
            _ => {
                let flat = m.reshape(&[ROWS * COLS]).unwrap();
                let s = rng.below(ROWS * COLS);
                let n = 1 + rng.below(ROWS * COLS - s);
                flat.slice(0, s, s + n).unwrap()
            }
        }
    }

    pub(crate) fn random_task(rng: &mut Rng, nbufs: u64) -> Vec<Acc> {
        let n = 1 + rng.below(3);
        let mut accs: Vec<Acc> = vec![];
        for _ in 0..n {
            let tag = [
                ArgTag::Input,
                ArgTag::Output,
                ArgTag::InOut,
                ArgTag::OutputExisting,
            ][rng.below(4) as usize];
            let acc = Acc {
                buf: rng.below(nbufs) as usize,
                view: random_view(rng),
                tag,
            };
            // Keep the task valid: no written view may alias a later argument.
            let aliases = accs.iter().any(|p| {
                p.buf == acc.buf
                    && (p.tag.writes() || acc.tag.writes())
                    && p.bytes().iter().any(|b| acc.bytes().contains(b))
            });
            if !aliases {
                accs.push(acc);
            }
        }
        accs
    }

    /// Whether task `b` (later) must follow task `a` (earlier) in a sequential execution.
    pub(crate) fn conflict(a: &[Acc], b: &[Acc]) -> bool {
        a.iter().any(|x| {
            b.iter().any(|y| {
                x.buf == y.buf
                    && (x.tag.writes() || y.tag.writes())
                    && x.bytes().iter().any(|bx| y.bytes().contains(bx))
            })
        })
    }
}

#[test]
fn release_when_done_forgets_an_in_flight_run_once_it_finishes() {
    let mut h = h();
    let waiter = h.orch.run_waiter();
    let run = h.orch.begin_run().unwrap();
    let t = h.submit(1, &[whole(h.key(), ArgTag::Output)]);
    h.orch.close_run().unwrap();
    waiter.release_when_done(run);
    assert_eq!(waiter.wait(run, Some(Duration::ZERO)).unwrap(), None);
    h.run_one(t.task);
    assert!(
        matches!(h.orch.wait_run(run, None), Err(GraphError::UnknownRun(_))),
        "the outcome was dropped instead of kept for a waiter that will never come"
    );
    // A run that already finished is forgotten at once.
    let run2 = h.orch.begin_run().unwrap();
    h.orch.close_run().unwrap();
    assert_eq!(waiter.phase(run2), Some(RunPhase::Completed));
    waiter.release_when_done(run2);
    assert!(matches!(
        waiter.wait(run2, None),
        Err(GraphError::UnknownRun(_))
    ));
}

#[test]
fn peek_reads_a_ready_payload_without_claiming_it() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let k = h.key();
    let p = h.submit(7, &[whole(k, ArgTag::Output)]);
    let c = h.submit(8, &[whole(k, ArgTag::Input)]);
    assert_eq!(h.sched.peek(p.task, |v| *v), Some(7));
    assert_eq!(
        h.sched.peek(c.task, |v| *v),
        None,
        "a pending task is not READY"
    );
    assert_eq!(
        h.orch.task_state(p.task),
        Some(TaskState::Ready),
        "peek did not claim"
    );
    h.sched.claim(p.task).unwrap();
    assert_eq!(
        h.sched.peek(p.task, |v| *v),
        None,
        "a running task is not READY"
    );
}

// ---------------------------------------------------------------- stall snapshots

#[test]
fn unfinished_lists_each_task_with_the_producers_it_still_waits_for() {
    let mut h = h();
    h.orch.begin_run().unwrap();
    let (a, b) = (h.key(), h.key());
    let p1 = h.submit(1, &[whole(a, ArgTag::Output)]).task;
    let p2 = h.submit(2, &[whole(b, ArgTag::Output)]).task;
    let c = h
        .submit(3, &[whole(a, ArgTag::Input), whole(b, ArgTag::Input)])
        .task;
    h.sched.claim(p1).unwrap();
    h.run_one(p2);
    let (all, total) = h.sched.unfinished(16);
    assert_eq!(total, 2);
    let got: Vec<_> = all
        .iter()
        .map(|u| (u.task, u.state, u.waits_on.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (p1, TaskState::Running, vec![]),
            (c, TaskState::Pending, vec![p1]),
        ]
    );
    let (first, total) = h.orch.unfinished(1);
    assert_eq!((first.len(), first[0].task, total), (1, p1, 2));
}

#[test]
fn ring_holders_are_the_live_allocations_oldest_first() {
    let mut h = h_with(small_rings(4, None, None));
    h.orch.begin_run().unwrap();
    let k = h.key();
    let s1 = h.submit_heap(1, &[whole(k, ArgTag::Output)]);
    let t1 = s1.task;
    let t2 = h.submit_heap(2, &[whole(k, ArgTag::InOut)]).task;
    let ring = s1.heap.unwrap().ring;
    assert_eq!(h.orch.ring_holders(ring, 8), vec![t1, t2]);
    assert_eq!(h.orch.ring_holders(ring, 1), vec![t1]);
    assert!(h.orch.ring_holders(RING_COUNT, 8).is_empty());
}
