//! The state shared by the orchestrator and scheduler handles, and the operations either
//! side performs on it: releasing references, consuming slots, completing, poisoning and
//! cancelling tasks.

use crate::error::Failure;
use crate::event::Progress;
use crate::ring::DepPools;
use crate::run::{RunId, Runs};
use crate::slot::{SlotArena, SlotInner, TaskRef, TaskState};
use strata_sync::sync::{AtomicBool, AtomicU32, Mutex, MutexGuard, Ordering};

/// A task that became ready to dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyTask {
    /// The task.
    pub task: TaskRef,
    /// The caller-defined route given at submit.
    pub route: u64,
    /// The run it belongs to (dispatch it only while that run is dispatchable).
    pub run: RunId,
}

pub(crate) struct Core<P> {
    pub(crate) arena: SlotArena<P>,
    /// Slot indices created so far (every index below this exists in the arena).
    pub(crate) created: AtomicU32,
    /// Slots consumed on the scheduler side, handed to the orchestrator (which recycles
    /// them) in batches.
    pub(crate) retired: Mutex<Vec<u32>>,
    pub(crate) retired_pending: AtomicBool,
    pub(crate) runs: Runs,
    pub(crate) progress: Progress,
    pub(crate) deps: DepPools,
    pub(crate) shutdown: AtomicBool,
}

impl<P> Core<P> {
    pub(crate) fn new(depth: usize) -> Self {
        Core {
            arena: SlotArena::new(),
            created: AtomicU32::new(0),
            retired: Mutex::new(Vec::new()),
            retired_pending: AtomicBool::new(false),
            runs: Runs::new(depth),
            progress: Progress::new(),
            deps: DepPools::default(),
            shutdown: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_live(&self, t: &TaskRef) -> bool {
        self.arena.get(t.index).is_live(t.id)
    }

    pub(crate) fn ready_task(&self, t: TaskRef) -> ReadyTask {
        let s = self.arena.get(t.index);
        ReadyTask {
            task: t,
            route: s.route.load(Ordering::Relaxed),
            run: RunId(s.run.load(Ordering::Relaxed) >> 1),
        }
    }

    /// Releases one reference on `t`; the releaser that crosses the threshold consumes it
    /// and appends its slot index to `retired` (to be handed to the orchestrator).
    pub(crate) fn release(&self, t: TaskRef, retired: &mut Vec<u32>) {
        let slot = self.arena.get(t.index);
        if slot.release_ref() {
            self.consume(t, retired);
        }
    }

    /// Hands a batch of consumed slots to the orchestrator.
    pub(crate) fn flush_retired(&self, retired: &mut Vec<u32>) {
        if retired.is_empty() {
            return;
        }
        self.retired.lock().append(retired);
        self.retired_pending.store(true, Ordering::Release);
    }

    /// Takes every slot handed over so far (orchestrator side).
    pub(crate) fn take_retired(&self, into: &mut Vec<u32>) {
        // Read before swapping: most calls find nothing, and a plain load leaves the line
        // shared with the scheduler that sets the flag.
        if self.retired_pending.load(Ordering::Relaxed)
            && self.retired_pending.swap(false, Ordering::AcqRel)
        {
            into.append(&mut self.retired.lock());
        }
    }

    /// Consumes a terminal, unreferenced task: its run's accounting drops, and its slot is
    /// queued for the orchestrator to reclaim its dependency entries and recycle it.
    fn consume(&self, t: TaskRef, retired: &mut Vec<u32>) {
        let slot = self.arena.get(t.index);
        let won = slot.transition(t.id, TaskState::Completed, TaskState::Consumed)
            || slot.transition(t.id, TaskState::Failed, TaskState::Consumed);
        debug_assert!(won, "consume of a non-terminal task {t}");
        if !won {
            return;
        }
        let run_word = slot.run.load(Ordering::Relaxed);
        retired.push(t.index);
        if self.runs.task_consumed(run_word) {
            self.progress.bump();
        }
    }

    /// Returns the dependency-pool edges `t` was charged.
    fn refund_edges(&self, t: TaskRef) {
        let c = self.arena.get(t.index).dep_charge.swap(0, Ordering::AcqRel);
        if c != 0 {
            self.deps.refund((c >> 32) as usize, c & 0xffff_ffff);
        }
    }

    /// Releases the references `t` holds on its producers, and its own edges.
    pub(crate) fn release_producers(
        &self,
        t: TaskRef,
        producers: &mut Vec<TaskRef>,
        retired: &mut Vec<u32>,
    ) {
        self.refund_edges(t);
        for p in producers.drain(..) {
            self.release(p, retired);
        }
    }

    /// One producer of `c` completed successfully. Returns whether `c` became ready.
    fn producer_done(&self, c: TaskRef) -> bool {
        let slot = self.arena.get(c.index);
        let mut inner = slot.inner.lock();
        match slot.state_of(c.id) {
            Some(TaskState::Building) | Some(TaskState::Pending) => {}
            _ => return false, // poisoned, cancelled, or recycled
        }
        inner.fanin_released += 1;
        match inner.fanin_count {
            Some(n) if inner.fanin_released == n => {
                slot.transition(c.id, TaskState::Pending, TaskState::Ready)
            }
            _ => false,
        }
    }

    /// Completes a running task: stores its outcome, readies or poisons its consumers,
    /// and releases its own and its producers' references. `inner` is its locked record.
    pub(crate) fn finish_locked(
        &self,
        t: TaskRef,
        mut inner: MutexGuard<'_, SlotInner<P>>,
        outcome: Result<(), Failure>,
        ready: &mut Vec<ReadyTask>,
        scratch: &mut Scratch,
    ) {
        let slot = self.arena.get(t.index);
        let failed = outcome.is_err();
        if let Err(f) = &outcome {
            inner.failure = Some(f.clone());
        }
        slot.store(
            t.id,
            if failed {
                TaskState::Failed
            } else {
                TaskState::Completed
            },
        );
        std::mem::swap(&mut inner.consumers, &mut scratch.consumers);
        std::mem::swap(&mut inner.producers, &mut scratch.producers);
        drop(inner);
        let run_word = slot.run.load(Ordering::Relaxed);
        match outcome {
            Ok(()) => {
                for i in 0..scratch.consumers.len() {
                    let c = scratch.consumers[i];
                    if self.producer_done(c) {
                        ready.push(self.ready_task(c));
                    }
                }
                scratch.consumers.clear();
            }
            Err(f) => {
                self.runs.record_error(run_word, &f);
                let mut stack = std::mem::take(&mut scratch.consumers);
                self.poison_all(&mut stack, &f, scratch);
                stack.clear();
                scratch.consumers = stack;
            }
        }
        self.release(t, &mut scratch.retired);
        let mut producers = std::mem::take(&mut scratch.producers);
        self.release_producers(t, &mut producers, &mut scratch.retired);
        scratch.producers = producers;
        if scratch.retired.len() >= RETIRE_BATCH {
            self.flush_retired(&mut scratch.retired);
        }
        self.progress.bump();
    }

    /// Poisons every not-yet-running task reachable from `stack` (transitively), without
    /// recursion. Tasks still being built are only claimed: their submitter finishes the
    /// propagation.
    pub(crate) fn poison_all(&self, stack: &mut Vec<TaskRef>, f: &Failure, scratch: &mut Scratch) {
        while let Some(c) = stack.pop() {
            let slot = self.arena.get(c.index);
            let mut inner = slot.inner.lock();
            let Some(prior) = slot.claim_failure(c.id) else {
                continue; // running, terminal, or recycled: left alone
            };
            inner.failure = Some(f.clone());
            inner.skip_undispatched();
            if prior == TaskState::Building {
                slot.debt.store(true, Ordering::Release);
                continue;
            }
            stack.append(&mut inner.consumers);
            std::mem::swap(&mut inner.producers, &mut scratch.poison_producers);
            drop(inner);
            self.release(c, &mut scratch.retired);
            let mut producers = std::mem::take(&mut scratch.poison_producers);
            self.release_producers(c, &mut producers, &mut scratch.retired);
            scratch.poison_producers = producers;
        }
    }

    /// Claims every unstarted task of run `run_word` as failed (cancellation) and
    /// releases what they hold. Running tasks are left to finish.
    pub(crate) fn cancel_run(&self, run_word: u64, f: &Failure, retired: &mut Vec<u32>) -> usize {
        let created = self.created.load(Ordering::Acquire);
        let mut cancelled = Vec::new();
        self.arena.for_each(created, |index, slot| {
            if slot.run.load(Ordering::Relaxed) != run_word {
                return;
            }
            let (id, st) = slot.load();
            if !matches!(
                st,
                TaskState::Pending | TaskState::Ready | TaskState::Building
            ) {
                return;
            }
            let mut inner = slot.inner.lock();
            if slot.run.load(Ordering::Relaxed) != run_word {
                return;
            }
            let Some(prior) = slot.claim_failure(id) else {
                return;
            };
            inner.failure = Some(f.clone());
            inner.skip_undispatched();
            let t = TaskRef { index, id };
            // A slot claimed while building had its debt adopted here: the submit that
            // abandoned it will never settle it.
            if prior == TaskState::Building {
                slot.debt.store(false, Ordering::Release);
            }
            cancelled.push((t, std::mem::take(&mut inner.producers)));
        });
        let n = cancelled.len();
        for (t, mut producers) in cancelled {
            self.release(t, retired);
            self.release_producers(t, &mut producers, retired);
        }
        self.progress.bump();
        n
    }
}

/// Consumed slots the scheduler accumulates before handing them to the orchestrator.
pub(crate) const RETIRE_BATCH: usize = 64;

/// Reusable buffers for completion processing.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pub(crate) consumers: Vec<TaskRef>,
    pub(crate) producers: Vec<TaskRef>,
    pub(crate) poison_producers: Vec<TaskRef>,
    /// Slots consumed by this side, not yet handed over.
    pub(crate) retired: Vec<u32>,
}

/// A snapshot of a slot's bookkeeping, for tests.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DebugSlot {
    pub(crate) state: Option<TaskState>,
    pub(crate) fanin_count: Option<u32>,
    pub(crate) producers: Vec<TaskRef>,
    pub(crate) consumers: Vec<TaskRef>,
    pub(crate) refs_total: u64,
    pub(crate) refs_released: u64,
}

#[cfg(test)]
impl<P> Core<P> {
    pub(crate) fn debug(&self, t: TaskRef) -> DebugSlot {
        let slot = self.arena.get(t.index);
        let inner = slot.inner.lock();
        let refs = slot.refs.load(Ordering::Acquire);
        DebugSlot {
            state: slot.state_of(t.id),
            fanin_count: inner.fanin_count,
            producers: inner.producers.clone(),
            consumers: inner.consumers.clone(),
            refs_total: crate::slot::refs_total(refs),
            refs_released: crate::slot::refs_released(refs),
        }
    }
}
