//! # strata-host
//!
//! Everything about a worker's children except what they run (DESIGN.md §5):
//!
//! * [`Children::spawn`] — forks every child **before any engine thread exists**
//!   (refusing when other threads run, unless the caller opts in), or runs them as
//!   threads ([`ExecMode::Threads`]); waits for every child's `INIT_READY`; rolls
//!   everything back if one fails.
//! * [`Lane`] — one child's parent-side endpoint: its mailbox ([`strata_mailbox::Parent`])
//!   and its liveness ([`Lane::check_alive`]).
//! * [`Children::shutdown`] — graceful request, grace period, `SIGKILL` of each
//!   survivor's process group, reaping; run on drop. Children die with their parent, busy
//!   or not (`PR_SET_PDEATHSIG`; an idle serve loop also watches `getppid()`), and see
//!   only their own mailbox (the others are unmapped and closed after the fork; every
//!   memfd's size is sealed).
//! * [`SharedMemory`] / [`SharedTensor`] — memfd regions created before the children
//!   start, seen zero-copy by every process of the tree.
//! * [`Doorbell`] — one word a scheduler thread parks on; children ring it after every
//!   completion (through [`strata_mailbox::ServeOptions::on_publish`]).
//! * [`SubRegistry`] / [`SubProgram`] — host sub-workers: registered closures, found in
//!   children by digest, never serialized.
//!
//! What a chip child or a nested worker runs is supplied from above through
//! [`ChildProgram`]; this crate names neither.
//!
//! See `docs/host.md` for the process tree, the startup sequence, the lane state machine
//! and the failure model.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use strata_host::*;
//! use strata_mailbox::{encode_args_blob, EncodedConfig, FrameIdentity, TaskPublication, TaskSlot};
//! use strata_types::{IdentityMinter, TaskArgs};
//!
//! // Before the children start: shared tensors and registered closures.
//! let mem = SharedMemory::new();
//! let minter = IdentityMinter::new();
//! let data = SharedTensor::from_slice(&mem, &minter, &[4], &[1u32, 2, 3, 4])?;
//! let calls = Arc::new(AtomicU64::new(0));
//! let mut registry = SubRegistry::new();
//! let seen = calls.clone();
//! let double = registry.register_fn("double", move |call| {
//!     seen.fetch_add(1, Ordering::Relaxed);
//!     let mut t = call.tensor_mut::<u32>(0)?;
//!     t.update(|x| 2 * x);
//!     Ok(())
//! });
//!
//! // Threads here (a doctest may run beside other threads); ExecMode::Process forks.
//! let programs: Vec<Box<dyn ChildProgram>> =
//!     vec![Box::new(SubProgram::new(registry).with_index(0))];
//! let mut children = Children::spawn(&mem, programs, SpawnOptions::new(ExecMode::Threads))?;
//!
//! let args = TaskArgs::new().inout(&data);
//! let blob = encode_args_blob(&args)?;
//! let config = EncodedConfig::default();
//! let id = FrameIdentity { run_id: 1, lease_slot: 0, lease_generation: 1, dispatch_id: 1 };
//! let task = TaskPublication::run(double, id, &config, &blob);
//! let done = children.lane(0).run_task(TaskSlot::Slot0, &task, None)?;
//! assert_eq!(done.outcome, Ok(()));
//! assert_eq!(data.to_vec::<u32>()?, vec![2, 4, 6, 8]); // zero-copy: no copy-back
//! assert_eq!(calls.load(Ordering::Relaxed), 1);
//!
//! assert!(children.shutdown(std::time::Duration::from_secs(5))?.is_clean());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod children;
mod doorbell;
mod error;
mod shm;
mod sub;
mod tensor;

pub use children::{
    exit_codes, other_threads, ChildEnv, ChildProgram, ChildReport, Children, ExecMode, Lane,
    ShutdownReport, SpawnOptions, ABORT_GRACE, DROP_GRACE, INIT_FAILED_CODE,
    LIVENESS_POLL_INTERVAL,
};
pub use doorbell::Doorbell;
pub use error::{ChildEnd, HostError};
pub use shm::{RegionLease, SharedMemory};
pub use sub::{sub_codes, SubCall, SubFn, SubHandler, SubProgram, SubRegistry};
pub use tensor::SharedTensor;
