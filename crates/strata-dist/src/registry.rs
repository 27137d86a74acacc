//! Registered callables: host orchestrations, sub-worker closures, and the chip callables
//! (kernels and chip orchestrations) that chip children install.
//!
//! Everything is registered before `init`, so children — forked after registration — find
//! callables by digest in the tables they inherited; function pointers and closures never
//! cross a process boundary and nothing is serialized.

use crate::error::DistError;
use crate::orch::Orch;
use std::collections::HashMap;
use std::sync::Arc;
use strata_types::{CallableDescriptor, CallableId, CallableKind, CallbackResult, TaskArgs};

/// A host orchestration: builds a run on the worker that runs it. Its error (any error,
/// boxed) cancels the run's unstarted tasks and is returned as
/// [`DistError::Orchestration`](crate::DistError::Orchestration).
pub type HostOrchFn = Arc<dyn Fn(&mut Orch<'_>, &TaskArgs) -> CallbackResult + Send + Sync>;

/// A registered host orchestration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostOrchHandle {
    pub(crate) id: CallableId,
}

impl HostOrchHandle {
    /// Its digest.
    pub fn id(&self) -> CallableId {
        self.id
    }

    /// The handle of the host orchestration with digest `id` (e.g. one named by a task
    /// that came from another process of the same program). Running it fails with
    /// `UnknownCallable` if nothing is registered under `id`.
    pub fn from_id(id: CallableId) -> Self {
        HostOrchHandle { id }
    }

    /// The handle a host orchestration registered under `name` has (on any worker: the
    /// digest depends on the name alone); using it where nothing is registered under that
    /// name is an error then.
    pub fn named(name: &str) -> HostOrchHandle {
        HostOrchHandle {
            id: CallableDescriptor::new(CallableKind::HostOrchestration, name).digest(),
        }
    }
}

/// A registered sub-worker callable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubHandle {
    pub(crate) id: CallableId,
}

impl SubHandle {
    /// Its digest.
    pub fn id(&self) -> CallableId {
        self.id
    }

    /// The handle a sub-worker callable registered under `name` has (the digest depends
    /// on the name alone); submitting it where nothing is registered under that name is an
    /// error then.
    pub fn named(name: &str) -> SubHandle {
        SubHandle {
            id: strata_host::SubRegistry::id_of(name),
        }
    }
}

/// What a next-level task runs: a chip orchestration (on a chip child) or a host
/// orchestration (on a level-3 child of a level-4 worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NextLevelCallable {
    /// A chip orchestration.
    Chip(strata_chip::OrchHandle),
    /// A host orchestration.
    Host(HostOrchHandle),
}

impl NextLevelCallable {
    pub(crate) fn id(&self) -> CallableId {
        match self {
            NextLevelCallable::Chip(h) => h.id(),
            NextLevelCallable::Host(h) => h.id,
        }
    }

    pub(crate) fn kind_name(&self) -> &'static str {
        match self {
            NextLevelCallable::Chip(_) => "a chip orchestration",
            NextLevelCallable::Host(_) => "a host orchestration",
        }
    }
}

impl From<strata_chip::OrchHandle> for NextLevelCallable {
    fn from(h: strata_chip::OrchHandle) -> Self {
        NextLevelCallable::Chip(h)
    }
}

impl From<HostOrchHandle> for NextLevelCallable {
    fn from(h: HostOrchHandle) -> Self {
        NextLevelCallable::Host(h)
    }
}

impl From<&strata_chip::OrchHandle> for NextLevelCallable {
    fn from(h: &strata_chip::OrchHandle) -> Self {
        NextLevelCallable::Chip(*h)
    }
}

impl From<&HostOrchHandle> for NextLevelCallable {
    fn from(h: &HostOrchHandle) -> Self {
        NextLevelCallable::Host(*h)
    }
}

/// The programs of a worker tree.
#[derive(Clone, Default)]
pub(crate) struct Programs {
    pub(crate) host: HashMap<CallableId, (Arc<str>, HostOrchFn)>,
    pub(crate) subs: strata_host::SubRegistry,
    pub(crate) chip: strata_chip::Registry,
}

impl std::fmt::Debug for Programs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Programs")
            .field("host_orchestrations", &self.host.len())
            .field("sub_callables", &self.subs.len())
            .field("chip", &self.chip)
            .finish()
    }
}

impl Programs {
    pub(crate) fn register_host(&mut self, name: &str, f: HostOrchFn) -> HostOrchHandle {
        let h = HostOrchHandle::named(name);
        // The same name again replaces the function (as for sub callables): the handle
        // stays valid.
        self.host.insert(h.id, (Arc::from(name), f));
        h
    }

    /// Adds everything `other` has that `self` lacks (a parent's programs cascading into
    /// its level-3 children).
    pub(crate) fn absorb(&mut self, other: &Programs) -> Result<(), DistError> {
        for (id, (name, f)) in &other.host {
            self.host
                .entry(*id)
                .or_insert_with(|| (name.clone(), f.clone()));
        }
        self.subs.absorb(&other.subs);
        self.chip.absorb(&other.chip)?;
        Ok(())
    }

    /// A digest of every registered callable's identity: host orchestrations, sub-worker
    /// callables (sorted, so registration order does not matter), then the chip
    /// registry's own digest.
    pub(crate) fn digest(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut host: Vec<&CallableId> = self.host.keys().collect();
        host.sort_by_key(|id| id.0);
        let mut subs: Vec<CallableId> = self.subs.ids().collect();
        subs.sort_by_key(|id| id.0);
        let mut h = Sha256::new();
        h.update(b"strata registry digest v1\0");
        h.update((host.len() as u64).to_le_bytes());
        for id in host {
            h.update(id.0);
        }
        h.update((subs.len() as u64).to_le_bytes());
        for id in &subs {
            h.update(id.0);
        }
        h.update(self.chip.digest().0);
        h.finalize().into()
    }

    pub(crate) fn host_name(&self, id: &CallableId) -> Option<&str> {
        self.host.get(id).map(|(n, _)| &**n)
    }
}
