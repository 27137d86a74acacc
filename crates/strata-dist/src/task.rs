//! What the graph carries for each task: the callable, the encoded configuration and, per
//! member, the target and the encoded argument blob (encoded on the orchestration's thread,
//! so the scheduler only copies bytes into a mailbox).

use std::sync::Arc;
use strata_mailbox::EncodedConfig;
use strata_types::CallableId;

/// Which scheduler FIFO a ready task joins. The graph carries it as a `u64` route word
/// ([`Route::word`], [`Route::from_word`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A single task for the next-level child with this worker id.
    Worker(usize),
    /// A next-level group of two or more members (the targets are in the payload).
    Group,
    /// A sub-worker task or sub group.
    Sub,
}

impl Route {
    const SUB: u64 = u64::MAX;
    const GROUP: u64 = u64::MAX - 1;

    /// The route word the graph carries.
    pub(crate) fn word(self) -> u64 {
        match self {
            Route::Worker(w) => w as u64,
            Route::Group => Self::GROUP,
            Route::Sub => Self::SUB,
        }
    }

    /// The route a word written by [`Route::word`] names.
    pub(crate) fn from_word(word: u64) -> Route {
        match word {
            Self::SUB => Route::Sub,
            Self::GROUP => Route::Group,
            // Worker ids are lane indices, far below the two reserved words; a word that
            // does not fit a usize is out of range like any other unknown worker.
            w => Route::Worker(usize::try_from(w).unwrap_or(usize::MAX)),
        }
    }
}

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
    /// The shared-tensor regions the member names (each once): the scheduler holds each
    /// in use from dispatch until the member ends, so host-side copies refuse meanwhile
    /// and a tensor dropped meanwhile keeps its pages (`SharedMemory::acquire_task_use`).
    pub(crate) uses: Vec<u64>,
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

#[cfg(test)]
mod tests {
    use super::Route;

    #[test]
    fn route_words_round_trip() {
        for r in [
            Route::Sub,
            Route::Group,
            Route::Worker(0),
            Route::Worker(17),
        ] {
            assert_eq!(Route::from_word(r.word()), r);
        }
    }
}
