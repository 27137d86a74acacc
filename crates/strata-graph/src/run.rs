//! Runs: admission (at most `depth` ≤ 2 in flight), the run FIFO, per-run task accounting,
//! first-error recording and the run fence.

use crate::access::FxHashMap;
use crate::error::{Failure, GraphError};
use crossbeam_utils::CachePadded;
use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};
use strata_sync::sync::{
    wait_timeout, AtomicBool, AtomicU64, Condvar, Mutex, MutexGuard, Ordering,
};

/// Maximum number of runs in flight (one executing while the next one is being built).
pub const MAX_PIPELINE_DEPTH: usize = 2;

/// A run's id: monotonic from 1 for the life of the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(pub u64);

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run#{}", self.0)
    }
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunPhase {
    /// Its graph is being built and it is not at the head of the run FIFO.
    Building,
    /// Its graph is closed and it waits for the run ahead of it.
    Prepared,
    /// At the head of the FIFO: its tasks may be dispatched (its graph may still be open).
    Executing,
    /// Every task finished and none failed.
    Completed,
    /// Some task failed, or its orchestration failed.
    Failed,
}

/// Hot-path accounting of the run holding one pipeline lease. The orchestrator counts
/// submitted tasks and whoever consumes a task counts consumed ones, each on its own cache
/// line, so the two threads never write the same line per task; the run is drained when
/// the counts meet after submission closed.
#[derive(Debug, Default)]
pub(crate) struct RunCell {
    id: AtomicU64,
    closed: AtomicBool,
    failed: AtomicBool,
    submitted: CachePadded<AtomicU64>,
    consumed: CachePadded<AtomicU64>,
}

impl RunCell {
    fn active(&self) -> u64 {
        let consumed = self.consumed.load(Ordering::SeqCst);
        self.submitted.load(Ordering::SeqCst) - consumed
    }
}

#[derive(Debug)]
struct RunRec {
    id: u64,
    lease: usize,
    closed: bool,
    submission_failed: bool,
    first_error: Option<Failure>,
}

#[derive(Debug)]
struct Inner {
    fifo: VecDeque<RunRec>,
    building: Option<u64>,
    next_id: u64,
    depth: usize,
    done: FxHashMap<u64, Result<(), Failure>>,
    /// Runs whose outcome nobody will ask for: forgotten as soon as they finish.
    auto_release: Vec<u64>,
    shutdown: bool,
    /// Threads waiting on the condition variable: a run that finishes with nobody waiting
    /// (its caller drives the scheduler and sees it finish) makes no wake-up system call.
    waiters: usize,
}

/// The run table.
#[derive(Debug)]
pub(crate) struct Runs {
    inner: Mutex<Inner>,
    cv: Condvar,
    cells: [RunCell; MAX_PIPELINE_DEPTH],
    head: AtomicU64,
}

/// Packs a run id and its lease into a slot's `run` word.
pub(crate) fn run_word(id: u64, lease: usize) -> u64 {
    (id << 1) | lease as u64
}

fn unpack(word: u64) -> (u64, usize) {
    (word >> 1, (word & 1) as usize)
}

impl Runs {
    pub(crate) fn new(depth: usize) -> Self {
        Runs {
            inner: Mutex::new(Inner {
                fifo: VecDeque::new(),
                building: None,
                next_id: 1,
                depth,
                done: FxHashMap::default(),
                auto_release: Vec::new(),
                shutdown: false,
                waiters: 0,
            }),
            cv: Condvar::new(),
            cells: std::array::from_fn(|_| RunCell::default()),
            head: AtomicU64::new(0),
        }
    }

    /// Admits a new run, waiting while `depth` runs are in flight.
    pub(crate) fn begin(&self, timeout: Option<Duration>) -> Result<(RunId, usize), GraphError> {
        // A timeout past what an `Instant` holds is no deadline.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut g = self.inner.lock();
        if let Some(b) = g.building {
            return Err(GraphError::RunAlreadyBuilding { building: b });
        }
        while g.fifo.len() >= g.depth && !g.shutdown {
            let slice = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(GraphError::Timeout {
                            what: format!(
                                "a pipeline lease ({} runs already in flight)",
                                g.fifo.len()
                            ),
                            after: timeout.unwrap_or_default(),
                        });
                    }
                    (d - now).min(Duration::from_millis(100))
                }
                None => Duration::from_millis(100),
            };
            g = Self::wait_slice(&self.cv, g, slice);
        }
        if g.shutdown {
            return Err(GraphError::Shutdown);
        }
        let used: Vec<usize> = g.fifo.iter().map(|r| r.lease).collect();
        let lease = (0..MAX_PIPELINE_DEPTH)
            .find(|l| !used.contains(l))
            .ok_or_else(|| GraphError::InvalidConfig("no free pipeline lease".into()))?;
        let id = g.next_id;
        g.next_id += 1;
        let cell = &self.cells[lease];
        cell.submitted.store(0, Ordering::SeqCst);
        cell.consumed.store(0, Ordering::SeqCst);
        cell.closed.store(false, Ordering::SeqCst);
        cell.failed.store(false, Ordering::SeqCst);
        cell.id.store(id, Ordering::Release);
        g.fifo.push_back(RunRec {
            id,
            lease,
            closed: false,
            submission_failed: false,
            first_error: None,
        });
        g.building = Some(id);
        if g.fifo.len() == 1 {
            self.head.store(id, Ordering::Release);
        }
        Ok((RunId(id), lease))
    }

    /// The run whose tasks may be dispatched now (the FIFO head), if any.
    pub(crate) fn dispatchable(&self) -> Option<RunId> {
        match self.head.load(Ordering::Acquire) {
            0 => None,
            id => Some(RunId(id)),
        }
    }

    pub(crate) fn add_task(&self, lease: usize) {
        self.cells[lease].submitted.fetch_add(1, Ordering::SeqCst);
    }

    /// Live (not yet consumed) tasks of the run on `lease`.
    pub(crate) fn active(&self, lease: usize) -> u64 {
        self.cells[lease].active()
    }

    /// Whether the run in `word` has a recorded error (fast path for fail-fast submits).
    pub(crate) fn has_failed(&self, word: u64) -> bool {
        let (id, lease) = unpack(word);
        let c = &self.cells[lease];
        c.failed.load(Ordering::Acquire) && c.id.load(Ordering::Acquire) == id
    }

    /// The run's first error, if any.
    pub(crate) fn first_error(&self, id: u64) -> Option<Failure> {
        let g = self.inner.lock();
        g.fifo
            .iter()
            .find(|r| r.id == id)
            .and_then(|r| r.first_error.clone())
            .or_else(|| g.done.get(&id).and_then(|r| r.clone().err()))
    }

    /// Records a task failure as the run's first error if it has none. Reports for runs
    /// that already retired are ignored.
    pub(crate) fn record_error(&self, word: u64, failure: &Failure) {
        let (id, lease) = unpack(word);
        if self.cells[lease].id.load(Ordering::Acquire) != id {
            return;
        }
        let mut g = self.inner.lock();
        if let Some(r) = g.fifo.iter_mut().find(|r| r.id == id) {
            if r.first_error.is_none() {
                r.first_error = Some(failure.clone());
            }
            self.cells[lease].failed.store(true, Ordering::Release);
        }
    }

    /// A task of the run was consumed. Returns true if the run became terminal.
    pub(crate) fn task_consumed(&self, word: u64) -> bool {
        let (id, lease) = unpack(word);
        let cell = &self.cells[lease];
        if cell.id.load(Ordering::Acquire) != id {
            return false;
        }
        let consumed = cell.consumed.fetch_add(1, Ordering::SeqCst) + 1;
        if cell.closed.load(Ordering::SeqCst) && consumed == cell.submitted.load(Ordering::SeqCst) {
            let mut g = self.inner.lock();
            return self.maybe_finish(&mut g, id);
        }
        false
    }

    /// Closes submission of the building run `id`. Returns true if it became terminal.
    pub(crate) fn close(&self, id: u64) -> Result<bool, GraphError> {
        let mut g = self.inner.lock();
        if g.building != Some(id) {
            return Err(GraphError::NoBuildingRun { op: "close_run" });
        }
        g.building = None;
        if let Some(r) = g.fifo.iter_mut().find(|r| r.id == id) {
            r.closed = true;
            self.cells[r.lease].closed.store(true, Ordering::SeqCst);
        }
        Ok(self.maybe_finish(&mut g, id))
    }

    /// Marks the building run `id` as failed during graph construction: its submission is
    /// closed and its first error recorded. The caller then cancels its unstarted tasks
    /// and calls [`Runs::settle`].
    pub(crate) fn fail_submission(&self, id: u64, failure: &Failure) -> Result<usize, GraphError> {
        let mut g = self.inner.lock();
        if g.building != Some(id) {
            return Err(GraphError::NoBuildingRun {
                op: "fail_run_submission",
            });
        }
        g.building = None;
        let r = g
            .fifo
            .iter_mut()
            .find(|r| r.id == id)
            .ok_or(GraphError::UnknownRun(id))?;
        r.closed = true;
        r.submission_failed = true;
        self.cells[r.lease].closed.store(true, Ordering::SeqCst);
        if r.first_error.is_none() {
            r.first_error = Some(failure.clone());
        }
        let lease = r.lease;
        self.cells[lease].failed.store(true, Ordering::Release);
        Ok(lease)
    }

    /// Re-evaluates whether run `id` is terminal.
    pub(crate) fn settle(&self, id: u64) -> bool {
        let mut g = self.inner.lock();
        self.maybe_finish(&mut g, id)
    }

    fn maybe_finish(&self, g: &mut MutexGuard<'_, Inner>, id: u64) -> bool {
        let Some(pos) = g.fifo.iter().position(|r| r.id == id) else {
            return false;
        };
        let r = &g.fifo[pos];
        if !r.closed || self.cells[r.lease].active() != 0 {
            return false;
        }
        if pos != 0 && !r.submission_failed {
            // A prepared run finishes only once it is at the head.
            return false;
        }
        let r = g.fifo.remove(pos).unwrap_or_else(|| unreachable!());
        let outcome = match r.first_error {
            Some(f) => Err(f),
            None => Ok(()),
        };
        if let Some(i) = g.auto_release.iter().position(|&a| a == r.id) {
            g.auto_release.swap_remove(i);
        } else {
            g.done.insert(r.id, outcome);
        }
        if pos == 0 {
            let next = g.fifo.front().map_or(0, |n| n.id);
            self.head.store(next, Ordering::Release);
            if next != 0 {
                // An empty run that was waiting for the head finishes now.
                self.maybe_finish(g, next);
            }
        }
        if g.waiters > 0 {
            self.cv.notify_all();
        }
        true
    }

    /// Waits on `cv` for at most `slice`, counted in `waiters` meanwhile.
    fn wait_slice<'a>(
        cv: &Condvar,
        mut g: MutexGuard<'a, Inner>,
        slice: Duration,
    ) -> MutexGuard<'a, Inner> {
        g.waiters += 1;
        let mut g = wait_timeout(cv, g, slice);
        g.waiters -= 1;
        g
    }

    /// The phase of run `id`, or `None` if it is unknown or released.
    pub(crate) fn phase(&self, id: u64) -> Option<RunPhase> {
        let g = self.inner.lock();
        if let Some(d) = g.done.get(&id) {
            return Some(if d.is_ok() {
                RunPhase::Completed
            } else {
                RunPhase::Failed
            });
        }
        let pos = g.fifo.iter().position(|r| r.id == id)?;
        Some(if pos == 0 {
            RunPhase::Executing
        } else if g.fifo[pos].closed {
            RunPhase::Prepared
        } else {
            RunPhase::Building
        })
    }

    /// Waits until run `id` is terminal. `Ok(None)` means the timeout elapsed (the run
    /// goes on; wait again later).
    pub(crate) fn wait(
        &self,
        id: u64,
        timeout: Option<Duration>,
    ) -> Result<Option<Result<(), Failure>>, GraphError> {
        // A timeout past what an `Instant` holds is no deadline.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut g = self.inner.lock();
        loop {
            if let Some(d) = g.done.get(&id) {
                return Ok(Some(d.clone()));
            }
            if !g.fifo.iter().any(|r| r.id == id) {
                return Err(GraphError::UnknownRun(id));
            }
            let slice = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    (d - now).min(Duration::from_millis(100))
                }
                None => Duration::from_millis(100),
            };
            g = Self::wait_slice(&self.cv, g, slice);
        }
    }

    /// Forgets a terminal run's outcome.
    pub(crate) fn release(&self, id: u64) -> Result<(), GraphError> {
        let mut g = self.inner.lock();
        if g.done.remove(&id).is_some() {
            Ok(())
        } else if g.fifo.iter().any(|r| r.id == id) {
            Err(GraphError::InvalidArgs(format!(
                "run {id} is still in flight; wait for it before releasing it"
            )))
        } else {
            Err(GraphError::UnknownRun(id))
        }
    }

    /// Forgets run `id`'s outcome as soon as it is known (now, if it already finished).
    pub(crate) fn release_when_done(&self, id: u64) {
        let mut g = self.inner.lock();
        if g.done.remove(&id).is_none() && g.fifo.iter().any(|r| r.id == id) {
            g.auto_release.push(id);
        }
    }

    /// Number of runs in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.inner.lock().fifo.len()
    }

    pub(crate) fn shutdown(&self) {
        self.inner.lock().shutdown = true;
        self.cv.notify_all();
    }
}
