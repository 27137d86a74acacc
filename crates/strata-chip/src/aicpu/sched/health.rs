//! The cores' health: a core whose running kernel exceeded the run's timeout is taken out
//! of service (its kernel asked to stop, its task failed with SCHEDULER_TIMEOUT, its
//! pending dispatch re-placed); placement skips it until its kernel returns.

use super::{Retry, Sched};
use crate::aicore::link::CoreMsg;
use crate::error::{codes, ChipError};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use strata_sync::sync::Ordering as SyncOrdering;

impl Sched {
    pub(super) fn healthy(&self, c: u32) -> bool {
        !self.cores[c as usize].lost
    }

    pub(super) fn check_timeouts(&mut self) {
        let now = Instant::now();
        let timeout = self.ctl.timeout;
        let mut stuck = Vec::new();
        for &c in &self.busy {
            let s = &mut self.cores[c as usize];
            if s.lost {
                continue;
            }
            if s.completed != s.checked_completed || s.busy_since.is_none() {
                s.checked_completed = s.completed;
                s.busy_since = Some(now);
                continue;
            }
            if let Some(since) = s.busy_since {
                if now.duration_since(since) >= timeout {
                    stuck.push((c, now.duration_since(since)));
                }
            }
        }
        for (c, after) in stuck {
            self.lose_core(c as usize, after);
        }
    }

    /// Takes a core whose running kernel exceeded the timeout out of service: its kernel
    /// is asked to stop, its task fails with SCHEDULER_TIMEOUT, its pending dispatch (if
    /// the core has not taken it) is re-placed elsewhere.
    fn lose_core(&mut self, c: usize, after: Duration) {
        let mut stolen = None;
        if self.cores[c].outstanding.len() == 2 {
            match self.links[c].dispatch.pop() {
                Some(CoreMsg::Run(d)) => stolen = Some(d),
                Some(CoreMsg::Exit) => {}
                None => {
                    // The core took its pending dispatch: it finished the running one.
                    self.cores[c].busy_since = Some(Instant::now());
                    return;
                }
            }
        }
        let s = &mut self.cores[c];
        s.lost = true;
        self.shared.lost[c].store(true, Ordering::Release);
        self.shared.abandoned.fetch_add(1, Ordering::AcqRel);
        let front = s.outstanding.front_mut().expect("a busy core has work");
        front.abandoned = true;
        // The abandoned kernel may keep touching its task's arguments: publish their
        // device ranges before the task fails (the host quarantines them).
        // SAFETY: `front` is outstanding, so its payload is alive (see `DescPtr`); only
        // shared reads of immutable fields and an atomic.
        let desc = unsafe { front.desc.0.as_ref() };
        {
            let mut ranges = self
                .shared
                .abandoned_ranges
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for t in &desc.tensors {
                let start = desc.addr_of(t);
                ranges.push((c as u32, start, start.saturating_add(t.size)));
            }
        }
        let (task, block, seq) = (front.task, front.block, front.seq);
        let (func, total) = (
            front.meta.funcs[front.lane as usize],
            front.meta.total_subtasks(),
        );
        self.links[c].cancel.store(seq, SyncOrdering::Relaxed);
        if let Some(d) = stolen {
            if let Some(pending) = self.cores[c].outstanding.pop_back() {
                self.retry.push_back(Retry {
                    task: pending.task,
                    meta: pending.meta,
                    desc: d.desc,
                    block: d.block,
                    lane: d.lane,
                    sub_block_id: d.sub_block_id,
                });
            }
        }
        let kernel = self.ctl.env.func_name(func).to_owned();
        self.report.notes.push(format!(
            "core {c} taken out of service: kernel {kernel:?} of task {} ran for {} ms",
            task.id().0,
            after.as_millis()
        ));
        let stalled = format!(
            "kernel {kernel:?} (task {}) made no progress on core {c} for {} ms",
            task.id().0,
            after.as_millis()
        );
        let wait_for = Some(Box::new(self.wait_for(stalled, None)));
        let err = ChipError::KernelTimeout {
            kernel,
            task: task.id().0,
            block,
            core: c as u32,
            after,
            wait_for,
        };
        let f = self.record_error(codes::SCHEDULER_TIMEOUT, err);
        self.subtask_done(task, total, Some(f), 1);
        self.shared.progress.fetch_add(1, Ordering::Relaxed);
    }
}
