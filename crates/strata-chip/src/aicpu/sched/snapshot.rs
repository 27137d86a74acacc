//! The scheduler's wait-for snapshot of a stalled run: the kernels running on each core
//! (and for how long), the signal cells they wait on, and the tasks that have not started
//! with the producers each still waits for. Taken only when a run gives up on a kernel.

use super::Sched;
use crate::task::Meta;
use std::collections::HashSet;
use std::time::Instant;
use strata_graph::TaskState;
use strata_types::{Executor, PendingTask, RunningTask, SignalWait, WaitFor};

/// Most unfinished tasks read from the graph for one snapshot.
const SCAN: usize = 64;

impl Sched {
    /// The wait-for state now. `extra` is a kernel that just gave up a signal wait (its
    /// dispatch is no longer outstanding): listed first.
    pub(super) fn wait_for(&self, stalled: String, extra: Option<SignalWait>) -> WaitFor {
        let now = Instant::now();
        let mut w = WaitFor {
            place: "chip".into(),
            stalled,
            ..WaitFor::default()
        };
        // The kernel that gave up has left its core but its task is not finished: it is
        // listed by its signal wait, not as a task waiting for a core.
        let mut on_core: HashSet<u64> = extra.iter().map(|s| s.task).collect();
        w.signals.extend(extra);
        for (c, core) in self.cores.iter().enumerate() {
            let Some(o) = core.outstanding.front() else {
                continue;
            };
            on_core.insert(o.task.id().0);
            w.running.push(RunningTask {
                task: o.task.id().0,
                name: self
                    .ctl
                    .env
                    .func_name(o.meta.funcs[o.lane as usize])
                    .to_owned(),
                on: Executor::Core(c as u32),
                for_ms: core
                    .busy_since
                    .map(|s| now.saturating_duration_since(s).as_millis() as u64),
            });
            if let Some(n) = self.links[c].signal.read(o.seq) {
                w.signals.push(SignalWait {
                    task: o.task.id().0,
                    core: c as u32,
                    rank: n.rank,
                    cell: n.cell,
                    cmp: n.cmp.to_owned(),
                    expected: n.expected,
                    value: n.value,
                    gave_up: n.gave_up,
                });
            }
        }
        let (unfinished, total) = self.graph.unfinished(SCAN);
        let mut listed = 0;
        for u in &unfinished {
            if on_core.contains(&u.task.id().0) {
                listed += 1;
                continue;
            }
            let meta = Meta::decode(u.route);
            let func = meta.funcs.iter().copied().find(Option::is_some).flatten();
            w.pending.push(PendingTask {
                task: u.task.id().0,
                name: if func.is_some() {
                    self.ctl.env.func_name(func).to_owned()
                } else {
                    String::new()
                },
                // Claimed by this scheduler (RUNNING in the graph) but on no core yet:
                // it waits for a core.
                ready: u.state != TaskState::Pending,
                producers: u.waits_on.iter().map(|p| p.id().0).collect(),
                workers: Vec::new(),
            });
            listed += 1;
        }
        w.omitted = total.saturating_sub(listed) as u32;
        w.bound();
        w
    }
}
