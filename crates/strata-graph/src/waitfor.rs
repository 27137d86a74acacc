//! What a stalled graph waits for: its unfinished tasks with the producers each still
//! waits on, and the tasks that hold a heap ring's bytes. Read when a level gives up
//! waiting (never on a hot path): it visits every slot and takes each one's lock briefly.

use crate::core::Core;
use crate::run::RunId;
use crate::slot::{TaskRef, TaskState};
use strata_sync::sync::Ordering;

/// A task that has not finished, as a stall snapshot sees it
/// ([`crate::Scheduler::unfinished`], [`crate::Orchestrator::unfinished`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// The task.
    pub task: TaskRef,
    /// [`TaskState::Pending`], [`TaskState::Ready`] or [`TaskState::Running`].
    pub state: TaskState,
    /// Its route (as given at submit).
    pub route: u64,
    /// Its run.
    pub run: RunId,
    /// The producers it still waits for (not finished), oldest first.
    pub waits_on: Vec<TaskRef>,
}

impl<P> Core<P> {
    /// Up to `max` unfinished tasks, oldest first, and how many there are in all.
    pub(crate) fn unfinished(&self, max: usize) -> (Vec<Unfinished>, usize) {
        let created = self.created.load(Ordering::Acquire);
        let mut live = Vec::new();
        self.arena.for_each(created, |index, slot| {
            let (id, state) = slot.load();
            if matches!(
                state,
                TaskState::Pending | TaskState::Ready | TaskState::Running
            ) {
                live.push(TaskRef { index, id });
            }
        });
        let total = live.len();
        live.sort_unstable_by_key(|t| t.id);
        let mut out = Vec::with_capacity(live.len().min(max));
        for t in live.into_iter().take(max) {
            let slot = self.arena.get(t.index);
            let inner = slot.inner.lock();
            // It may have moved on since the scan: report it as it is now.
            let Some(state) = slot.state_of(t.id).filter(|s| !s.is_terminal()) else {
                continue;
            };
            let mut waits_on: Vec<TaskRef> = inner
                .producers
                .iter()
                .filter(|p| {
                    self.arena
                        .get(p.index)
                        .state_of(p.id)
                        .is_some_and(|s| !s.is_terminal())
                })
                .copied()
                .collect();
            drop(inner);
            waits_on.sort_unstable_by_key(|p| p.id);
            out.push(Unfinished {
                task: t,
                state,
                route: slot.route.load(Ordering::Relaxed),
                run: RunId(slot.run.load(Ordering::Relaxed) >> 1),
                waits_on,
            });
        }
        (out, total)
    }
}
