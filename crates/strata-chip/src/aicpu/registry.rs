//! The callable registry: kernels and chip orchestrations, addressed by the SHA-256 digest
//! of their descriptor (and kernels also by a small `func_id`, as in the reference).
//!
//! A registry is plain data (function objects behind `Arc`s): cloning it is cheap, and a
//! clone taken before forking chip children finds every callable by digest.

use crate::aicore::kernel::{KernelCtx, KernelFn};
use crate::aicore::kernels::{KernelEntry, KernelHandle, KernelTable, MAX_KERNELS};
use crate::aicpu::orch::{ChipArgs, ChipOrch, OrchCallable};
use crate::error::ChipError;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use strata_types::{CallableDescriptor, CallableId, CallableKind, CallbackResult};

/// Most chip orchestrations a chip can hold (the reference's registered-callable limit).
pub const MAX_ORCHESTRATIONS: usize = 64;

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

#[derive(Clone)]
pub(crate) struct OrchEntry {
    pub(crate) desc: CallableDescriptor,
    /// The function and the descriptor's name, shared with each run request.
    pub(crate) callable: Arc<OrchCallable>,
}

/// Kernels and chip orchestrations, by digest.
///
/// ```
/// use strata_chip::{Registry, KernelCtx};
/// use strata_types::{CallableDescriptor, CallableKind, CallbackResult};
/// fn noop(_: &mut KernelCtx) -> CallbackResult { Ok(()) }
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
    kernels: KernelTable,
    orchs: HashMap<CallableId, OrchEntry>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("kernels", &self.kernels.len())
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
        F: Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync + 'static,
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
        if let Some(func_id) = self.kernels.func_of(&id) {
            return Ok(KernelHandle::new(id, func_id));
        }
        let entry = KernelEntry {
            id,
            name: Arc::from(desc.name()),
            f,
        };
        self.kernels
            .insert(entry)
            .ok_or_else(|| ChipError::Registration {
                name: desc.name().to_owned(),
                reason: format!("a chip addresses at most {MAX_KERNELS} kernels; unregister some"),
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
        F: Fn(&mut ChipOrch, &ChipArgs) -> CallbackResult + Send + Sync + 'static,
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
                callable: Arc::new(OrchCallable {
                    name: desc.name().into(),
                    f: Arc::new(f),
                }),
                desc,
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
        for e in other.kernels.entries() {
            if self.kernels.func_of(&e.id).is_none() && self.kernels.insert(e.clone()).is_none() {
                return Err(ChipError::Registration {
                    name: e.name.to_string(),
                    reason: format!("a chip addresses at most {MAX_KERNELS} kernels"),
                });
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
        if self.kernels.remove(id) {
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
        self.kernels.name(id)
    }

    /// The descriptor of the orchestration registered under `id`.
    pub fn orchestration(&self, id: &CallableId) -> Option<&CallableDescriptor> {
        self.orchs.get(id).map(|e| &e.desc)
    }

    /// Every registered orchestration: its id and descriptor (in no particular order).
    pub fn orchestrations(&self) -> impl Iterator<Item = (CallableId, &CallableDescriptor)> + '_ {
        self.orchs.iter().map(|(id, e)| (*id, &e.desc))
    }

    /// Number of registered kernels.
    pub fn kernel_count(&self) -> usize {
        self.kernels.len()
    }

    /// Number of registered orchestrations.
    pub fn orchestration_count(&self) -> usize {
        self.orchs.len()
    }

    /// A digest of the whole registry (every callable id, sorted): two processes with the
    /// same digest can exchange callables by id.
    pub fn digest(&self) -> CallableId {
        let mut ids: Vec<&CallableId> = self.kernels.ids().chain(self.orchs.keys()).collect();
        ids.sort();
        let mut h = Sha256::new();
        for id in ids {
            h.update(id.as_bytes());
        }
        CallableId(h.finalize().into())
    }

    /// The kernel half of the registry (what a run snapshots for its cores).
    pub(crate) fn kernels(&self) -> &KernelTable {
        &self.kernels
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
