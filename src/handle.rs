//! Dispatch handles: a dispatch in flight and its outcome, shared by the caller's handle
//! and the worker's queue of dispatches in flight.

use crate::error::Error;
use crate::program::args::HeldArg;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The longest a dispatch may be waited for in one call; use `None` to wait without a
/// bound. (A longer `Some` is almost certainly a unit mistake.)
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A dispatch and its outcome, shared by its handle and the worker's queue.
pub(crate) struct DispatchState {
    id: u64,
    program: String,
    inner: Mutex<StateInner>,
    done: Condvar,
}

struct StateInner {
    /// The arguments, kept alive until the dispatch is done (then dropped).
    args: Vec<HeldArg>,
    /// What the chips that ran the dispatch recorded: one launch per chip run.
    trace: Vec<crate::bench::Invocation>,
    run: Option<strata_dist::RunHandle>,
    outcome: Option<Result<(), Error>>,
    /// A thread is waiting on `run` (others wait on `done`).
    waiting: bool,
    /// A caller saw the outcome through the handle.
    observed: bool,
}

impl DispatchState {
    pub(crate) fn running(
        id: u64,
        program: String,
        run: strata_dist::RunHandle,
        args: Vec<HeldArg>,
    ) -> Self {
        DispatchState {
            id,
            program,
            inner: Mutex::new(StateInner {
                args,
                trace: Vec::new(),
                run: Some(run),
                outcome: None,
                waiting: false,
                observed: false,
            }),
            done: Condvar::new(),
        }
    }

    pub(crate) fn finished(
        id: u64,
        program: String,
        outcome: Result<(), Error>,
        args: Vec<HeldArg>,
    ) -> Self {
        Self::finished_traced(id, program, outcome, args, Vec::new())
    }

    /// A dispatch that ran before its handle was made, with what its chip recorded.
    pub(crate) fn finished_traced(
        id: u64,
        program: String,
        outcome: Result<(), Error>,
        args: Vec<HeldArg>,
        trace: Vec<crate::bench::Invocation>,
    ) -> Self {
        DispatchState {
            id,
            program,
            inner: Mutex::new(StateInner {
                args: {
                    drop(args);
                    Vec::new()
                },
                trace,
                run: None,
                outcome: Some(outcome),
                waiting: false,
                observed: false,
            }),
            done: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, StateInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn observed(&self) -> bool {
        self.lock().observed
    }

    /// Whether it is finished, finishing it if its run is done (never blocks on the run).
    pub(crate) fn try_finish(&self) -> bool {
        {
            let g = self.lock();
            if g.outcome.is_some() {
                return true;
            }
            if g.waiting || !g.run.as_ref().is_some_and(|r| r.is_done()) {
                return false;
            }
        }
        self.finish(Some(Duration::ZERO)).is_ok() || self.lock().outcome.is_some()
    }

    /// Waits for the outcome (at most `timeout`, or without a bound); one thread waits on
    /// the run, the others for it.
    pub(crate) fn finish(&self, timeout: Option<Duration>) -> Result<(), Error> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut g = self.lock();
        loop {
            if let Some(o) = &g.outcome {
                return o.clone();
            }
            if !g.waiting {
                let Some(mut run) = g.run.take() else {
                    return Err(Error::Internal(
                        "a dispatch without a run or an outcome".into(),
                    ));
                };
                g.waiting = true;
                drop(g);
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                let r = run.wait(left);
                g = self.lock();
                g.waiting = false;
                match r {
                    Err(strata_dist::DistError::WaitTimeout { wait_for, .. }) => {
                        g.run = Some(run);
                        self.done.notify_all();
                        return Err(Error::Timeout {
                            after: timeout.unwrap_or_default(),
                            wait_for,
                        });
                    }
                    r => {
                        g.outcome = Some(r.map_err(Error::from));
                        g.args.clear();
                        self.done.notify_all();
                    }
                }
                continue;
            }
            match deadline {
                None => g = self.done.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        // Another thread waits on the run (and holds it): no snapshot here.
                        return Err(Error::Timeout {
                            after: timeout.unwrap_or_default(),
                            wait_for: None,
                        });
                    }
                    g = self
                        .done
                        .wait_timeout(g, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }
}

/// A dispatch in flight (see [`PreparedWorker::submit`](crate::PreparedWorker::submit)). Its outcome, once known, is
/// returned by every later [`DispatchHandle::result`]; it keeps the dispatch's arguments
/// alive until then. Cheap to clone; any clone may wait, from any thread.
#[derive(Clone)]
pub struct DispatchHandle {
    state: Arc<DispatchState>,
}

impl std::fmt::Debug for DispatchHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchHandle")
            .field("id", &self.state.id)
            .field("program", &self.state.program)
            .finish()
    }
}

impl DispatchHandle {
    pub(crate) fn new(state: Arc<DispatchState>) -> DispatchHandle {
        DispatchHandle { state }
    }

    /// The dispatch's number on its worker (1, 2, ...).
    pub fn id(&self) -> u64 {
        self.state.id
    }

    /// Waits for the dispatch (at most `timeout`; `None`: without a bound) and returns its
    /// outcome — the same on every call. A timeout leaves the dispatch running.
    ///
    /// # Errors
    /// The dispatch's error; [`Error::Timeout`] (wait again); [`Error::InvalidArgument`]
    /// for a timeout above [`MAX_WAIT`] (use `None`).
    pub fn result(&self, timeout: Option<Duration>) -> Result<(), Error> {
        if let Some(t) = timeout {
            if t > MAX_WAIT {
                return Err(Error::InvalidArgument(format!(
                    "a wait of {t:?} is longer than a year ({MAX_WAIT:?}); pass None to wait without a bound"
                )));
            }
        }
        let r = self.state.finish(timeout);
        if !matches!(r, Err(Error::Timeout { .. })) {
            self.state.lock().observed = true;
        }
        r
    }

    /// The same as [`DispatchHandle::result`].
    ///
    /// # Errors
    /// As `result`.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<(), Error> {
        self.result(timeout)
    }

    /// What the chips that ran the dispatch recorded, one [`Invocation`](crate::Invocation)
    /// (the spans of one chip run: host spans, and device spans on the run's device clock)
    /// per chip run; empty until the dispatch is done. Level 2 records every dispatch;
    /// level 3 and 4 record their chips' runs too (see `docs/benchmarks.md`).
    pub fn invocations(&self) -> Vec<crate::bench::Invocation> {
        self.state.lock().trace.clone()
    }

    /// Whether the dispatch has finished, successfully or not. Never blocks: while another
    /// thread is waiting for it, it says `false` until that wait has seen the end.
    pub fn is_done(&self) -> bool {
        self.state.try_finish()
    }
}
