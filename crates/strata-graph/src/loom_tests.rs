//! Loom models of the races between the orchestrator and the scheduler thread:
//! publication vs producer completion (ready and poison), consumption vs scope end, and
//! cancellation vs dispatch. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p strata-graph --lib loom`.

use crate::*;
use loom::thread;
use strata_types::{ArgTag, IdentityMinter};

fn setup() -> (Orchestrator<u32>, Scheduler<u32>, BufferKey) {
    let (orch, sched) = graph::<u32>(GraphConfig::default()).unwrap();
    let key = BufferKey::new(IdentityMinter::new().mint(), KeySpace::Host);
    (orch, sched, key)
}

fn acc(k: BufferKey, tag: ArgTag) -> [Access; 1] {
    [Access::new(k, Footprint::WHOLE, tag)]
}

fn drain_retired(orch: &mut Orchestrator<u32>, sched: &mut Scheduler<u32>) -> Vec<u32> {
    sched.flush();
    orch.take_unrecycled()
}

/// A consumer published while its producer completes successfully is made ready exactly
/// once: either by its own publication or by the producer's completion.
#[test]
fn loom_publication_vs_completion_readies_exactly_once() {
    loom::model(|| {
        let (mut orch, mut sched, k) = setup();
        orch.begin_run().unwrap();
        let p = orch
            .submit(TaskSpec::new(1, &acc(k, ArgTag::Output)))
            .unwrap();
        sched.claim(p.task).unwrap();
        let t = thread::spawn(move || {
            let mut ready = vec![];
            sched.complete(p.task, Ok(()), &mut ready).unwrap();
            (sched, ready)
        });
        let c = orch
            .submit(TaskSpec::new(2, &acc(k, ArgTag::Input)))
            .unwrap();
        let (mut sched, ready) = t.join().unwrap();
        let by_completion = ready.iter().filter(|r| r.task == c.task).count();
        assert_eq!(c.ready as usize + by_completion, 1, "enqueued exactly once");
        assert_eq!(orch.task_state(c.task), Some(TaskState::Ready));
        assert!(sched.claim(c.task).is_some());
    });
}

/// A consumer published while its producer fails is poisoned exactly once and never
/// becomes ready; every reference is released exactly once.
#[test]
fn loom_publication_vs_failure_poisons_and_releases_once() {
    loom::model(|| {
        let (mut orch, mut sched, k) = setup();
        let run = orch.begin_run().unwrap();
        let p = orch
            .submit(TaskSpec::new(1, &acc(k, ArgTag::Output)))
            .unwrap();
        sched.claim(p.task).unwrap();
        let t = thread::spawn(move || {
            let mut ready = vec![];
            let f = Failure::new(FailureKind::Task, "boom");
            sched.complete(p.task, Err(f), &mut ready).unwrap();
            assert!(ready.is_empty());
            sched
        });
        let c = orch.submit(TaskSpec::new(2, &acc(k, ArgTag::Input)));
        let mut sched = t.join().unwrap();
        match &c {
            Ok(s) => {
                assert!(!s.ready);
                let st = orch.task_state(s.task);
                assert!(
                    matches!(st, Some(TaskState::Failed) | Some(TaskState::Consumed)),
                    "{st:?}"
                );
            }
            Err(GraphError::RunFailed(f)) => assert_eq!(f.message(), "boom"),
            Err(e) => panic!("{e}"),
        }
        orch.close_run().unwrap();
        let retired = drain_retired(&mut orch, &mut sched);
        let mut unique = retired.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), retired.len(), "a slot is consumed once");
        assert_eq!(retired.len(), if c.is_ok() { 2 } else { 1 });
        let out = orch.wait_run(run, None).unwrap().unwrap();
        assert_eq!(out.unwrap_err().message(), "boom");
    });
}

/// The scope's release and the task's completion race to be the last reference: exactly
/// one of them consumes the task.
#[test]
fn loom_completion_vs_scope_end_consumes_once() {
    loom::model(|| {
        let (mut orch, mut sched, k) = setup();
        orch.begin_run().unwrap();
        orch.scope_begin().unwrap();
        // A task owning heap memory: its scope holds a reference on it.
        let a = orch
            .submit(TaskSpec::new(1, &acc(k, ArgTag::Output)).with_heap(1024, &[]))
            .unwrap();
        sched.claim(a.task).unwrap();
        let t = thread::spawn(move || {
            sched.complete(a.task, Ok(()), &mut vec![]).unwrap();
            sched
        });
        orch.scope_end().unwrap();
        let mut sched = t.join().unwrap();
        assert_eq!(orch.task_state(a.task), Some(TaskState::Consumed));
        assert_eq!(
            drain_retired(&mut orch, &mut sched),
            vec![a.task.slot_index()]
        );
        assert_eq!(orch.core().debug(a.task).refs_released, 2);
    });
}

/// Cancellation and dispatch race for a READY task: it either runs or is cancelled,
/// never both, and the run ends failed either way.
#[test]
fn loom_cancellation_vs_claim() {
    loom::model(|| {
        let (mut orch, mut sched, k) = setup();
        let run = orch.begin_run().unwrap();
        let a = orch
            .submit(TaskSpec::new(1, &acc(k, ArgTag::Output)))
            .unwrap();
        let t = thread::spawn(move || {
            let ran = sched.claim(a.task).is_some();
            if ran {
                sched.complete(a.task, Ok(()), &mut vec![]).unwrap();
            }
            (sched, ran)
        });
        orch.fail_run(Failure::new(FailureKind::Cancelled, "orchestration failed"))
            .unwrap();
        let (sched, ran) = t.join().unwrap();
        assert_eq!(sched.task_failure(a.task).is_none(), ran);
        let out = orch.wait_run(run, None).unwrap().unwrap();
        assert_eq!(out.unwrap_err().message(), "orchestration failed");
    });
}
