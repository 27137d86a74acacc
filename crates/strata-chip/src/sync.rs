//! Synchronisation primitives of the scheduler ↔ core hand-off, swapped for loom's
//! model-checked versions under `cfg(loom)`.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
