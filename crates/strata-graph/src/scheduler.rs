//! The scheduler handle: claims ready tasks for dispatch and completes them, which readies
//! or poisons their consumers and releases references. Exactly one exists per graph.

use crate::core::{Core, ReadyTask, Scratch};
use crate::error::{Failure, FailureKind, GraphError};
use crate::run::RunId;
use crate::slot::{MemberState, TaskRef, TaskState};
use crate::waitfor::Unfinished;
use std::time::{Duration, Instant};
use strata_sync::sync::{Arc, Ordering};

/// A task the scheduler claimed for dispatch.
#[derive(Debug)]
pub struct Claimed<P> {
    /// The payload given at submit.
    pub payload: P,
    /// Members of a group task (1 for a single task).
    pub group_size: usize,
    /// The task's route.
    pub route: u64,
    /// The task's run.
    pub run: RunId,
}

/// The scheduler handle of a graph (see [`crate::graph`]).
pub struct Scheduler<P> {
    core: Arc<Core<P>>,
    scratch: Scratch,
}

impl<P> Drop for Scheduler<P> {
    fn drop(&mut self) {
        self.core.flush_retired(&mut self.scratch.retired);
    }
}

impl<P> std::fmt::Debug for Scheduler<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").finish_non_exhaustive()
    }
}

impl<P: Send> Scheduler<P> {
    pub(crate) fn new(core: Arc<Core<P>>) -> Self {
        Scheduler {
            core,
            scratch: Scratch::default(),
        }
    }

    /// Claims a READY task for dispatch (READY → RUNNING) and takes its payload. `None` if
    /// the task is no longer READY (it was poisoned or cancelled, or the reference is
    /// stale): skip it.
    pub fn claim(&mut self, t: TaskRef) -> Option<Claimed<P>> {
        let slot = self.core.arena.get(t.index);
        if !slot.transition(t.id, TaskState::Ready, TaskState::Running) {
            return None;
        }
        let mut inner = slot.inner.lock();
        let payload = inner.payload.take()?;
        let group_size = inner.members().len().max(1);
        drop(inner);
        let rt = self.core.ready_task(t);
        Some(Claimed {
            payload,
            group_size,
            route: rt.route,
            run: rt.run,
        })
    }

    /// Reads the payload of a READY task without claiming it (e.g. to find a group's
    /// targets before deciding to dispatch it). `None` if the task is not READY.
    pub fn peek<R>(&self, t: TaskRef, f: impl FnOnce(&P) -> R) -> Option<R> {
        let slot = self.core.arena.get(t.index);
        let inner = slot.inner.lock();
        if slot.state_of(t.id) != Some(TaskState::Ready) {
            return None;
        }
        inner.payload.as_ref().map(f)
    }

    /// Completes a running single task. On success its consumers whose producers have all
    /// completed are appended to `ready`; on failure every not-yet-running downstream task
    /// is poisoned and the run records its first error.
    ///
    /// # Errors
    /// [`GraphError::InvalidArgs`] if the task is not running (a duplicate or stale
    /// completion) or is a group (use [`Scheduler::complete_member`]).
    pub fn complete(
        &mut self,
        t: TaskRef,
        outcome: Result<(), Failure>,
        ready: &mut Vec<ReadyTask>,
    ) -> Result<(), GraphError> {
        let slot = self.core.arena.get(t.index);
        let inner = slot.inner.lock();
        if slot.state_of(t.id) != Some(TaskState::Running) {
            return Err(GraphError::InvalidArgs(format!(
                "completion of {t}, which is not running"
            )));
        }
        if !inner.members().is_empty() {
            return Err(GraphError::InvalidArgs(format!(
                "{t} is a group task: complete its members with complete_member"
            )));
        }
        self.core
            .finish_locked(t, inner, outcome, ready, &mut self.scratch);
        Ok(())
    }

    /// Marks member `member` of a running group dispatched. Returns false (do not
    /// dispatch it) if the group already failed and the member was skipped.
    ///
    /// # Errors
    /// [`GraphError::InvalidArgs`] if the task is not a running group or the index is out
    /// of range.
    pub fn start_member(&mut self, t: TaskRef, member: usize) -> Result<bool, GraphError> {
        let slot = self.core.arena.get(t.index);
        let mut inner = slot.inner.lock();
        if slot.state_of(t.id) != Some(TaskState::Running) {
            return Err(GraphError::InvalidArgs(format!("{t} is not running")));
        }
        let members = inner
            .group_mut()
            .map_or(&mut [][..], |g| &mut g.members[..]);
        match members.get_mut(member) {
            Some(m @ MemberState::NotDispatched) => {
                *m = MemberState::Running;
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Err(GraphError::InvalidArgs(format!(
                "{t} has no member {member}"
            ))),
        }
    }

    /// Records the outcome of one member of a running group. The group completes (like
    /// [`Scheduler::complete`]) when every member is terminal; a member failure is
    /// recorded as the run's error at once, and members not yet dispatched are skipped.
    /// An out-of-range member index fails the whole group. Returns whether the group
    /// completed with this call; a duplicate report is ignored.
    ///
    /// # Errors
    /// [`GraphError::InvalidArgs`] if the task is not a running group.
    pub fn complete_member(
        &mut self,
        t: TaskRef,
        member: usize,
        outcome: Result<(), Failure>,
        ready: &mut Vec<ReadyTask>,
    ) -> Result<bool, GraphError> {
        let slot = self.core.arena.get(t.index);
        let mut inner = slot.inner.lock();
        if slot.state_of(t.id) != Some(TaskState::Running) || inner.members().is_empty() {
            return Err(GraphError::InvalidArgs(format!(
                "{t} is not a running group task"
            )));
        }
        let Some(group) = inner.group_mut() else {
            unreachable!("checked above");
        };
        if member >= group.members.len() {
            let f = Failure::new(
                FailureKind::Endpoint,
                format!(
                    "completion for member {member} of {t}, which has {} members",
                    group.members.len()
                ),
            );
            for m in &mut group.members {
                if matches!(m, MemberState::NotDispatched | MemberState::Running) {
                    *m = MemberState::Skipped;
                }
            }
            self.core
                .finish_locked(t, inner, Err(f), ready, &mut self.scratch);
            return Ok(true);
        }
        if !group.record(member, &outcome) {
            return Ok(false);
        }
        if let Err(f) = &outcome {
            let run_word = slot.run.load(Ordering::Relaxed);
            self.core.runs.record_error(run_word, f);
        }
        if !group.all_terminal() {
            return Ok(false);
        }
        let aggregate = match &group.first_failure {
            Some((_, f)) => Err(f.clone()),
            None => Ok(()),
        };
        self.core
            .finish_locked(t, inner, aggregate, ready, &mut self.scratch);
        Ok(true)
    }

    /// Member states of a group task (empty for a single task or a stale reference).
    pub fn member_states(&self, t: TaskRef) -> Vec<MemberState> {
        let slot = self.core.arena.get(t.index);
        let inner = slot.inner.lock();
        if slot.state_of(t.id).is_none() {
            return vec![];
        }
        inner.members().to_vec()
    }

    /// The run whose tasks may be dispatched now: the oldest run in flight. Tasks of a
    /// later run that become ready must wait until their run is dispatchable.
    pub fn dispatchable_run(&self) -> Option<RunId> {
        self.core.runs.dispatchable()
    }

    /// The state of a task, or `None` once it was consumed and its slot recycled.
    pub fn task_state(&self, t: TaskRef) -> Option<TaskState> {
        self.core.arena.get(t.index).state_of(t.id)
    }

    /// The failure recorded on a failed task.
    pub fn task_failure(&self, t: TaskRef) -> Option<Failure> {
        let slot = self.core.arena.get(t.index);
        let inner = slot.inner.lock();
        slot.state_of(t.id)?;
        inner.failure.clone()
    }

    /// Waits until some progress happens (a task completes, a run ends or becomes
    /// dispatchable) or `timeout` passes.
    pub fn wait_progress(&self, timeout: Duration) {
        let seen = self.core.progress.seq();
        self.core
            .progress
            .wait(seen, Instant::now().checked_add(timeout));
    }

    /// The progress sequence number (changes whenever tasks complete or runs change
    /// phase); pair with [`Scheduler::wait_progress_since`] to sleep without missing
    /// an event.
    pub fn progress_seq(&self) -> u64 {
        self.core.progress.seq()
    }

    /// Waits until the progress sequence differs from `seen` or `timeout` passes.
    pub fn wait_progress_since(&self, seen: u64, timeout: Duration) -> u64 {
        self.core
            .progress
            .wait(seen, Instant::now().checked_add(timeout))
    }

    /// Hands the slots this scheduler consumed to the orchestrator for recycling now
    /// (otherwise they are handed over in batches). Call it before going idle.
    pub fn flush(&mut self) {
        self.core.flush_retired(&mut self.scratch.retired);
    }

    /// Whether the orchestrator has shut the graph down (or was dropped).
    pub fn is_shut_down(&self) -> bool {
        self.core.shutdown.load(Ordering::Acquire)
    }

    /// Up to `max` unfinished tasks (pending, ready or running), oldest first, with the
    /// producers each still waits for, and how many there are in all: what a stall
    /// snapshot shows. Takes each task's slot lock in turn (not for a hot path).
    pub fn unfinished(&self, max: usize) -> (Vec<Unfinished>, usize) {
        self.core.unfinished(max)
    }
}
