//! What the graph carries for each task: the callable, the encoded configuration and, per
//! member, the target and the encoded argument blob (encoded on the orchestration's thread,
//! so the scheduler only copies bytes into a mailbox).

use std::sync::Arc;
use strata_mailbox::EncodedConfig;
use strata_types::CallableId;

/// Route word of a sub-worker task.
pub(crate) const ROUTE_SUB: u64 = u64::MAX;
/// Route word of a next-level group (targets are in the payload).
pub(crate) const ROUTE_GROUP: u64 = u64::MAX - 1;

/// Where one member runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The next-level child with this worker id.
    Worker(usize),
    /// Any idle sub-worker.
    Sub,
}

/// One member of a task (a single task has one).
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) target: Target,
    pub(crate) blob: Vec<u8>,
}

/// The payload of a task in the graph.
#[derive(Debug)]
pub(crate) struct DistTask {
    pub(crate) callable: CallableId,
    pub(crate) config: Arc<EncodedConfig>,
    pub(crate) members: Vec<Member>,
}

impl DistTask {
    /// The next-level targets of a group (empty for sub groups).
    pub(crate) fn worker_targets(&self) -> Vec<usize> {
        self.members
            .iter()
            .filter_map(|m| match m.target {
                Target::Worker(w) => Some(w),
                Target::Sub => None,
            })
            .collect()
    }
}
