//! The engine's wait-for snapshot: what each child runs and since when, what each ready
//! task waits for (a group: the workers it needs that are busy), and which tasks wait for
//! which producers. Taken when a task runs past its deadline or a caller's wait gives up;
//! never on the dispatch path.

use super::SchedLoop;
use crate::endpoint::{ChildKind, Endpoint};
use std::collections::HashSet;
use std::time::Instant;
use strata_graph::TaskState;
use strata_types::{Executor, PendingTask, RunningTask, WaitFor, WAIT_FOR_MAX_ENTRIES};

/// Most unfinished tasks read from the graph for one snapshot.
const SCAN: usize = 64;

impl<E: Endpoint> SchedLoop<E> {
    /// The wait-for state now, headed by `stalled`.
    pub(crate) fn wait_for(&self, stalled: String) -> WaitFor {
        let now = Instant::now();
        let level = if self.endpoints.iter().any(|e| e.kind() == ChildKind::Worker) {
            4
        } else {
            3
        };
        let mut w = WaitFor {
            place: format!("level-{level} worker"),
            stalled,
            ..WaitFor::default()
        };
        let mut seen = HashSet::new();
        for (lane, state) in self.lanes.iter().enumerate() {
            let on = if lane < self.n_next {
                Executor::Worker(lane as u32)
            } else {
                Executor::SubWorker((lane - self.n_next) as u32)
            };
            for f in state.frames.iter().flatten() {
                seen.insert(f.task.id().0);
                let started = f.deadline.and_then(|d| d.checked_sub(f.budget));
                w.running.push(RunningTask {
                    task: f.task.id().0,
                    name: String::new(),
                    on,
                    for_ms: started.map(|s| now.saturating_duration_since(s).as_millis() as u64),
                });
            }
        }
        // Ready tasks queued for their workers, in submission order: a group waits for
        // every worker it names that is busy or still has older work queued.
        let mut queued: Vec<(u64, PendingTask)> = Vec::new();
        for q in self.queues.values() {
            for (wk, fifo) in q.workers.iter().enumerate() {
                for (pos, e) in fifo.iter().enumerate() {
                    let id = e.task.id().0;
                    let blocked = pos > 0 || !self.idle(wk);
                    if let Some((_, p)) = queued.iter_mut().find(|(t, _)| *t == id) {
                        if blocked {
                            p.workers.push(wk as u32);
                        }
                        continue;
                    }
                    queued.push((
                        id,
                        PendingTask {
                            task: id,
                            name: String::new(),
                            ready: true,
                            producers: Vec::new(),
                            workers: if blocked { vec![wk as u32] } else { Vec::new() },
                        },
                    ));
                }
            }
            for t in &q.subs {
                let id = t.id().0;
                queued.push((
                    id,
                    PendingTask {
                        task: id,
                        name: String::new(),
                        ready: true,
                        producers: Vec::new(),
                        workers: Vec::new(),
                    },
                ));
            }
        }
        // Tasks still waiting for producers (and ready ones not queued yet).
        let (unfinished, total) = self.sched.unfinished(SCAN);
        let mut listed = 0usize;
        for u in &unfinished {
            let id = u.task.id().0;
            if seen.contains(&id) {
                listed += 1;
                continue;
            }
            if let Some(i) = queued.iter().position(|(t, _)| *t == id) {
                let (_, p) = queued.swap_remove(i);
                w.pending.push(p);
                listed += 1;
                continue;
            }
            if u.state == TaskState::Running {
                // Claimed (a group being launched): shown by its running members.
                continue;
            }
            w.pending.push(PendingTask {
                task: id,
                name: String::new(),
                ready: u.state == TaskState::Ready,
                producers: u.waits_on.iter().map(|p| p.id().0).collect(),
                workers: Vec::new(),
            });
            listed += 1;
        }
        w.pending.extend(queued.into_iter().map(|(_, p)| p));
        w.pending.sort_by_key(|p| p.task);
        w.running.sort_by_key(|r| r.task);
        w.omitted = total.saturating_sub(listed) as u32;
        if w.pending.len() > WAIT_FOR_MAX_ENTRIES || w.running.len() > WAIT_FOR_MAX_ENTRIES {
            w.bound();
        }
        w
    }
}
