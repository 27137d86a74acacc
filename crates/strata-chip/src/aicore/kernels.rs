//! The kernel table: every registered kernel by `func_id` and by digest, and the run
//! environment ([`RunEnv`]) the cores run them in.
//!
//! The table is the kernel half of the chip's [`Registry`](crate::Registry); a run
//! snapshots it (behind an `Arc`) into its environment, so cores and the scheduler look
//! kernels up without ever seeing chip orchestrations.

use crate::aicore::kernel::KernelFn;
use crate::error::ChipError;
use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use strata_types::CallableId;

/// Most kernels a chip can address (the reference's `RUNTIME_MAX_FUNC_ID`).
pub const MAX_KERNELS: usize = 1024;

/// The handle of a registered kernel: its digest and its `func_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelHandle {
    id: CallableId,
    func_id: u32,
}

impl KernelHandle {
    pub(crate) fn new(id: CallableId, func_id: u32) -> Self {
        KernelHandle { id, func_id }
    }

    /// The callable digest (the kernel's identity across processes).
    pub fn id(&self) -> CallableId {
        self.id
    }

    /// A handle for a digest (a kernel registered elsewhere, found by digest when used).
    pub fn from_id(id: CallableId) -> Self {
        KernelHandle {
            id,
            func_id: u32::MAX,
        }
    }

    /// The kernel's `func_id` on this registry (registration order, lowest free first).
    pub fn func_id(&self) -> u32 {
        self.func_id
    }
}

/// How an orchestration names a kernel: by handle, by `func_id`, or by digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelRef {
    /// A handle returned by registration.
    Handle(KernelHandle),
    /// A `func_id`, as reference examples use.
    FuncId(u32),
    /// A callable digest.
    Digest(CallableId),
}

impl From<KernelHandle> for KernelRef {
    fn from(h: KernelHandle) -> Self {
        KernelRef::Handle(h)
    }
}

impl From<&KernelHandle> for KernelRef {
    fn from(h: &KernelHandle) -> Self {
        KernelRef::Handle(*h)
    }
}

impl From<u32> for KernelRef {
    fn from(f: u32) -> Self {
        KernelRef::FuncId(f)
    }
}

impl From<CallableId> for KernelRef {
    fn from(id: CallableId) -> Self {
        KernelRef::Digest(id)
    }
}

/// One registered kernel.
#[derive(Clone)]
pub(crate) struct KernelEntry {
    pub(crate) id: CallableId,
    pub(crate) name: Arc<str>,
    pub(crate) f: KernelFn,
}

impl std::fmt::Debug for KernelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KernelEntry({})", self.name)
    }
}

/// Kernels by `func_id` (a slot per id, lowest free first) and by digest.
#[derive(Clone, Default)]
pub(crate) struct KernelTable {
    kernels: Vec<Option<KernelEntry>>,
    ids: HashMap<CallableId, u32>,
}

impl KernelTable {
    /// The `func_id` of the kernel registered under `id`.
    pub(crate) fn func_of(&self, id: &CallableId) -> Option<u32> {
        self.ids.get(id).copied()
    }

    /// Adds `entry` under the lowest free `func_id`; `None` past [`MAX_KERNELS`] (the
    /// caller words the error).
    pub(crate) fn insert(&mut self, entry: KernelEntry) -> Option<KernelHandle> {
        let func_id = match self.kernels.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.kernels.len() < MAX_KERNELS => {
                self.kernels.push(None);
                self.kernels.len() - 1
            }
            None => return None,
        };
        let id = entry.id;
        self.kernels[func_id] = Some(entry);
        self.ids.insert(id, func_id as u32);
        Some(KernelHandle {
            id,
            func_id: func_id as u32,
        })
    }

    /// Removes the kernel registered under `id`; whether there was one.
    pub(crate) fn remove(&mut self, id: &CallableId) -> bool {
        match self.ids.remove(id) {
            Some(func_id) => {
                self.kernels[func_id as usize] = None;
                true
            }
            None => false,
        }
    }

    /// Every registered kernel, by `func_id`.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &KernelEntry> {
        self.kernels.iter().flatten()
    }

    /// Every registered kernel's digest.
    pub(crate) fn ids(&self) -> impl Iterator<Item = &CallableId> {
        self.ids.keys()
    }

    /// Number of registered kernels.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// The name of the kernel registered under `id`.
    pub(crate) fn name(&self, id: &CallableId) -> Option<&str> {
        let f = self.func_of(id)?;
        self.kernels[f as usize].as_ref().map(|e| &*e.name)
    }

    pub(crate) fn resolve_kernel(&self, k: KernelRef) -> Result<&KernelEntry, ChipError> {
        let func_id = match k {
            KernelRef::Handle(h) => {
                return match self.kernels.get(h.func_id as usize) {
                    Some(Some(e)) if e.id == h.id => Ok(e),
                    _ => self.resolve_kernel(KernelRef::Digest(h.id)),
                }
            }
            KernelRef::FuncId(f) => f,
            KernelRef::Digest(id) => {
                self.func_of(&id)
                    .ok_or_else(|| ChipError::UnknownCallable {
                        what: format!("kernel {id}"),
                    })?
            }
        };
        self.kernels
            .get(func_id as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| ChipError::UnknownCallable {
                what: format!("kernel func_id {func_id}"),
            })
    }

    pub(crate) fn kernel_by_func(&self, f: u32) -> Option<&KernelEntry> {
        self.kernels.get(f as usize).and_then(Option::as_ref)
    }

    /// Resolves a kernel reference to its `func_id`.
    pub(crate) fn resolve_func(&self, k: KernelRef) -> Result<u32, ChipError> {
        let id = self.resolve_kernel(k)?.id;
        Ok(self.func_of(&id).expect("resolved kernels are registered"))
    }
}

/// What every thread of a chip shares for one run: the kernel table snapshot and the comm
/// context. Cores and the scheduler hold it per run, never per task, so dispatching a
/// task touches no shared reference count.
pub(crate) struct RunEnv {
    pub(crate) epoch: u64,
    pub(crate) kernels: Arc<KernelTable>,
    pub(crate) comm: Option<Arc<dyn Any + Send + Sync>>,
}

impl RunEnv {
    pub(crate) fn new(
        epoch: u64,
        kernels: Arc<KernelTable>,
        comm: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Self {
        RunEnv {
            epoch,
            kernels,
            comm,
        }
    }

    /// The environment before a chip's first run: epoch 0, no kernels, no comm context
    /// (the first run always installs its own).
    pub(crate) fn empty() -> Self {
        RunEnv::new(0, Arc::new(KernelTable::default()), None)
    }

    /// The name of kernel `func` (for messages).
    pub(crate) fn func_name(&self, func: Option<u32>) -> &str {
        func.and_then(|f| self.kernels.kernel_by_func(f))
            .map_or("?", |k| &k.name)
    }
}
