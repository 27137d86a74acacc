//! The callable registry: kernels and chip orchestrations, addressed by the SHA-256 digest
//! of their descriptor (and kernels also by a small `func_id`, as in the reference).
//!
//! A registry is plain data (function objects behind `Arc`s): cloning it is cheap, and a
//! clone taken before forking chip children finds every callable by digest.

use crate::error::ChipError;
use crate::kernel::{KernelCtx, KernelError};
use crate::orch::{ChipArgs, ChipOrch};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use strata_types::{CallableDescriptor, CallableId, CallableKind};

/// Most kernels a chip can address (the reference's `RUNTIME_MAX_FUNC_ID`).
pub const MAX_KERNELS: usize = 1024;
/// Most chip orchestrations a chip can hold (the reference's registered-callable limit).
pub const MAX_ORCHESTRATIONS: usize = 64;

/// A kernel: runs on an emulated AICore.
pub type KernelFn = Arc<dyn Fn(&mut KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync>;

/// A chip orchestration: runs on the emulated AICPU and submits kernel tasks.
pub type OrchestrationFn =
    Arc<dyn Fn(&mut ChipOrch, &ChipArgs) -> Result<(), ChipError> + Send + Sync>;

/// The handle of a registered kernel: its digest and its `func_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelHandle {
    id: CallableId,
    func_id: u32,
}

impl KernelHandle {
    /// The callable digest (the kernel's identity across processes).
    pub fn id(&self) -> CallableId {
        self.id
    }

    /// The kernel's `func_id` on this registry (registration order, lowest free first).
    pub fn func_id(&self) -> u32 {
        self.func_id
    }
}

/// The handle of a registered chip orchestration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OrchHandle {
    id: CallableId,
}

impl OrchHandle {
    /// The callable digest.
    pub fn id(&self) -> CallableId {
        self.id
    }

    /// A handle for a digest (e.g. received from another process); checked when used.
    pub fn from_id(id: CallableId) -> Self {
        OrchHandle { id }
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

#[derive(Clone)]
pub(crate) struct OrchEntry {
    pub(crate) desc: CallableDescriptor,
    pub(crate) f: OrchestrationFn,
}

/// Kernels and chip orchestrations, by digest.
///
/// ```
/// use strata_chip::{Registry, KernelCtx, KernelError};
/// use strata_types::{CallableDescriptor, CallableKind};
/// fn noop(_: &mut KernelCtx) -> Result<(), KernelError> { Ok(()) }
/// let mut r = Registry::new();
/// let d = CallableDescriptor::new(CallableKind::Kernel, "noop");
/// let a = r.register_kernel(d.clone(), noop).unwrap();
/// let b = r.register_kernel(d, noop).unwrap();
/// assert_eq!(a, b); // same descriptor, same identity
/// assert!(r.kernel_name(&a.id()).is_some());
/// r.unregister(&a.id()).unwrap();
/// assert!(r.kernel_name(&a.id()).is_none());
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    kernels: Vec<Option<KernelEntry>>,
    kernel_ids: HashMap<CallableId, u32>,
    orchs: HashMap<CallableId, OrchEntry>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("kernels", &self.kernel_ids.len())
            .field("orchestrations", &self.orchs.len())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers a kernel under `desc` (kind [`CallableKind::Kernel`]). Registering the
    /// same descriptor again returns the same handle (the first function is kept).
    ///
    /// # Errors
    /// [`ChipError::WrongKind`], or [`ChipError::Registration`] past [`MAX_KERNELS`].
    pub fn register_kernel<F>(
        &mut self,
        desc: CallableDescriptor,
        f: F,
    ) -> Result<KernelHandle, ChipError>
    where
        F: Fn(&mut KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync + 'static,
    {
        self.register_kernel_arc(desc, Arc::new(f))
    }

    /// [`Registry::register_kernel`] for an already boxed kernel.
    ///
    /// # Errors
    /// As `register_kernel`.
    pub fn register_kernel_arc(
        &mut self,
        desc: CallableDescriptor,
        f: KernelFn,
    ) -> Result<KernelHandle, ChipError> {
        check_kind(&desc, CallableKind::Kernel, "Kernel")?;
        let id = desc.digest();
        if let Some(&func_id) = self.kernel_ids.get(&id) {
            return Ok(KernelHandle { id, func_id });
        }
        let func_id = match self.kernels.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.kernels.len() < MAX_KERNELS => {
                self.kernels.push(None);
                self.kernels.len() - 1
            }
            None => {
                return Err(ChipError::Registration {
                    name: desc.name().to_owned(),
                    reason: format!(
                        "a chip addresses at most {MAX_KERNELS} kernels; unregister some"
                    ),
                })
            }
        };
        self.kernels[func_id] = Some(KernelEntry {
            id,
            name: Arc::from(desc.name()),
            f,
        });
        self.kernel_ids.insert(id, func_id as u32);
        Ok(KernelHandle {
            id,
            func_id: func_id as u32,
        })
    }

    /// Registers a chip orchestration under `desc` (kind
    /// [`CallableKind::ChipOrchestration`]). The descriptor's signature, if not empty, is
    /// checked against each run's arguments. Registering the same descriptor again returns
    /// the same handle.
    ///
    /// # Errors
    /// [`ChipError::WrongKind`], or [`ChipError::Registration`] past
    /// [`MAX_ORCHESTRATIONS`].
    pub fn register_orchestration<F>(
        &mut self,
        desc: CallableDescriptor,
        f: F,
    ) -> Result<OrchHandle, ChipError>
    where
        F: Fn(&mut ChipOrch, &ChipArgs) -> Result<(), ChipError> + Send + Sync + 'static,
    {
        check_kind(&desc, CallableKind::ChipOrchestration, "ChipOrchestration")?;
        let id = desc.digest();
        if self.orchs.contains_key(&id) {
            return Ok(OrchHandle { id });
        }
        if self.orchs.len() >= MAX_ORCHESTRATIONS {
            return Err(ChipError::Registration {
                name: desc.name().to_owned(),
                reason: format!(
                    "a chip holds at most {MAX_ORCHESTRATIONS} orchestrations; unregister some"
                ),
            });
        }
        self.orchs.insert(
            id,
            OrchEntry {
                desc,
                f: Arc::new(f),
            },
        );
        Ok(OrchHandle { id })
    }

    /// Adds every kernel and orchestration of `other` that this registry lacks (a parent
    /// worker's registrations cascading into a child's). Kernels keep the ids they have
    /// here.
    ///
    /// # Errors
    /// Past the kernel or orchestration limits.
    pub fn absorb(&mut self, other: &Registry) -> Result<(), ChipError> {
        for e in other.kernels.iter().flatten() {
            if !self.kernel_ids.contains_key(&e.id) {
                let func_id = match self.kernels.iter().position(Option::is_none) {
                    Some(i) => i,
                    None if self.kernels.len() < MAX_KERNELS => {
                        self.kernels.push(None);
                        self.kernels.len() - 1
                    }
                    None => {
                        return Err(ChipError::Registration {
                            name: e.name.to_string(),
                            reason: format!("a chip addresses at most {MAX_KERNELS} kernels"),
                        })
                    }
                };
                self.kernels[func_id] = Some(e.clone());
                self.kernel_ids.insert(e.id, func_id as u32);
            }
        }
        for (id, o) in &other.orchs {
            if !self.orchs.contains_key(id) {
                if self.orchs.len() >= MAX_ORCHESTRATIONS {
                    return Err(ChipError::Registration {
                        name: o.desc.name().to_owned(),
                        reason: format!("a chip holds at most {MAX_ORCHESTRATIONS} orchestrations"),
                    });
                }
                self.orchs.insert(*id, o.clone());
            }
        }
        Ok(())
    }

    /// Removes a kernel or orchestration.
    ///
    /// # Errors
    /// [`ChipError::UnknownCallable`] if nothing is registered under `id`.
    pub fn unregister(&mut self, id: &CallableId) -> Result<(), ChipError> {
        if let Some(func_id) = self.kernel_ids.remove(id) {
            self.kernels[func_id as usize] = None;
            return Ok(());
        }
        if self.orchs.remove(id).is_some() {
            return Ok(());
        }
        Err(ChipError::UnknownCallable {
            what: format!("callable {id}"),
        })
    }

    /// The name of the kernel registered under `id`.
    pub fn kernel_name(&self, id: &CallableId) -> Option<&str> {
        let f = *self.kernel_ids.get(id)?;
        self.kernels[f as usize].as_ref().map(|e| &*e.name)
    }

    /// The descriptor of the orchestration registered under `id`.
    pub fn orchestration(&self, id: &CallableId) -> Option<&CallableDescriptor> {
        self.orchs.get(id).map(|e| &e.desc)
    }

    /// Number of registered kernels.
    pub fn kernel_count(&self) -> usize {
        self.kernel_ids.len()
    }

    /// Number of registered orchestrations.
    pub fn orchestration_count(&self) -> usize {
        self.orchs.len()
    }

    /// A digest of the whole registry (every callable id, sorted): two processes with the
    /// same digest can exchange callables by id.
    pub fn digest(&self) -> CallableId {
        let mut ids: Vec<&CallableId> = self.kernel_ids.keys().chain(self.orchs.keys()).collect();
        ids.sort();
        let mut h = Sha256::new();
        for id in ids {
            h.update(id.as_bytes());
        }
        CallableId(h.finalize().into())
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
                *self
                    .kernel_ids
                    .get(&id)
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
        Ok(*self
            .kernel_ids
            .get(&id)
            .expect("resolved kernels are registered"))
    }

    pub(crate) fn orch_entry(&self, id: &CallableId) -> Result<&OrchEntry, ChipError> {
        self.orchs
            .get(id)
            .ok_or_else(|| ChipError::UnknownCallable {
                what: format!("chip orchestration {id}"),
            })
    }
}

fn check_kind(
    desc: &CallableDescriptor,
    want: CallableKind,
    name: &'static str,
) -> Result<(), ChipError> {
    if desc.kind() != want {
        return Err(ChipError::WrongKind {
            name: desc.name().to_owned(),
            got: format!("{:?}", desc.kind()),
            expected: name,
        });
    }
    Ok(())
}
