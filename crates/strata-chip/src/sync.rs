//! Synchronisation primitives of the chip's hand-offs (scheduler ↔ core, host ↔
//! orchestrator ↔ scheduler), swapped for loom's model-checked versions under `cfg(loom)`.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;

#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
