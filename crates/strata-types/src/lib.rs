//! # strata-types
//!
//! The vocabulary every strata crate shares: element [`DataType`]s, strided
//! [`TensorView`]s of up to five axes and the typed views of memory through them
//! ([`TensorRef`], [`TensorMut`]: what kernels and sub-workers read and write), argument
//! tags ([`ArgTag`]) from which dependencies are inferred, task arguments ([`TaskArgs`],
//! built by chaining, [`IntoTensorArg`]), per-call configuration ([`CallConfig`]),
//! buffer identities ([`BufferIdentity`]) and callable identities ([`CallableId`], a
//! SHA-256 digest of a stable descriptor), plus their wire encodings ([`wire`]), and the
//! error convention of every user callback ([`CallbackResult`]).
//!
//! Bad input — too many dimensions, zero strides, a view that does not fit its buffer,
//! too many arguments — is a typed [`TypesError`], never a panic.
//!
//! ```
//! use strata_types::*;
//! let minter = IdentityMinter::new();
//! // Descriptors come from the runtime (a `SharedTensor`, a run's intermediate, …); a
//! // layer below it builds one with the unsafe `from_parts`.
//! // SAFETY: a doc example: the descriptor is never given to a task.
//! let buffer = unsafe {
//!     BufferDesc::from_parts(minter.mint(), 128 * 128 * 4, BufferLocation::HostShared { region: 1, offset: 0 })
//! };
//! let whole = BufferView::new(buffer, TensorView::contiguous(DataType::F32, &[128, 128])?)?;
//! let args = TaskArgs::new().inout(whole.slice(0, 0, 64)).scalar(0.5f32);
//! args.check()?; // an invalid argument would be reported here (and by every consumer)
//! assert_eq!(args.len(), 2);
//! # Ok::<(), TypesError>(())
//! ```

mod access;
mod args;
mod callback;
mod config;
mod dtype;
mod error;
mod identity;
mod stall;
mod tag;
mod view;
pub mod wire;

pub use access::{TensorIter, TensorMut, TensorRef, ViewLender, ViewLoan};
pub use args::{
    ArgLimits, ArgSlot, BufferDesc, BufferLocation, BufferView, IntoTensorArg, Scalar, TaskArgs,
    TensorArg,
};
pub use callback::{error_chain, BoxError, CallbackResult};
pub use config::{CallConfig, RingOverride, MAX_CALL_TIMEOUT, OUTPUT_PREFIX_MAX, RING_COUNT};
pub use dtype::{DataType, Element};
pub use error::TypesError;
pub use half::{bf16, f16};
pub use identity::{
    BufferIdentity, CallableDescriptor, CallableId, CallableKind, IdentityMinter, OwnerNonce,
    ParamDirection, CALLABLE_DESCRIPTOR_SCHEMA,
};
pub use stall::{
    Executor, PendingTask, RingWait, RunningTask, SignalWait, WaitFor, WAIT_FOR_MAX_BYTES,
    WAIT_FOR_MAX_ENTRIES, WAIT_FOR_MAX_HEADING, WAIT_FOR_MAX_IDS, WAIT_FOR_MAX_TEXT,
};
pub use tag::ArgTag;
pub use view::{ContiguousRuns, ElementOffsets, TensorView, MAX_DIMS};
