//! # strata-mailbox
//!
//! The IPC ABI between a strata worker and each of its child processes: a mailbox of
//! three 64 KiB `#[repr(C)]` frames in `MAP_SHARED` memory (one control frame, two task
//! frames), a state-word protocol with acquire/release ordering, and spin-then-park
//! waiting on shared futexes so that a busy hand-off costs a cache-line transfer while an
//! idle worker costs no CPU.
//!
//! * [`layout`] — the byte map (compile-time checked; see `docs/mailbox.md`).
//! * [`MailboxState`], [`PrepareDisposition`], [`FrameId`], [`TaskSlot`],
//!   [`FrameIdentity`] — what the words mean.
//! * [`SharedRegion`] — anonymous (memfd) or named (POSIX shm) shared memory.
//! * [`Mailbox`] — one mailbox in a region.
//! * [`Parent`] — publish tasks, poll or wait for completions, run control commands,
//!   request shutdown; [`Liveness`] checks ([`ChildProcess`]) bound every wait.
//! * [`Child`] — `init_ready`/`init_failed`, then [`Child::serve`] with a [`Handler`];
//!   exits on shutdown or when the parent dies. A [`PublishHook`] in [`ServeOptions`]
//!   runs after every publication the parent acts on (e.g. to ring a doorbell).
//!
//! Everything read from shared memory is validated; bad data is a [`MailboxError`] (or,
//! in the child, a [`codes::BAD_REQUEST`] answer), never a panic. The protocol core
//! (publication, waiter counts, parking) is model-checked with loom: run
//! `RUSTFLAGS="--cfg loom" cargo test --release -p strata-mailbox --lib loom`.
//!
//! ```
//! use strata_mailbox::*;
//! use strata_types::{CallableId, TaskArgs};
//!
//! struct Adder;
//! impl Handler for Adder {
//!     fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
//!         let sum: u64 = req.args.scalars().iter().sum();
//!         if sum == 3 { Ok(()) } else { Err(FailureReport::new(1, format!("sum is {sum}"))) }
//!     }
//! }
//!
//! // In real use the parent creates the mailbox, forks, and the child serves it; a
//! // thread with a second mapping of the same memory plays the child here.
//! let mailbox = Mailbox::create()?;
//! let child_side = mailbox.try_clone()?;
//! let child = std::thread::spawn(move || {
//!     let mut child = Child::with_parent(child_side, std::process::id());
//!     child.init_ready(0)?;
//!     child.serve(&mut Adder)
//! });
//!
//! let mut parent = Parent::new(mailbox);
//! parent.wait_init(&WaitOptions::default(), &mut AssumeAlive)?;
//! let args = TaskArgs::new().scalar(1u64).scalar(2u64);
//! let blob = encode_args_blob(&args).expect("two scalars encode");
//! let config = EncodedConfig::default();
//! let identity = FrameIdentity { run_id: 1, lease_slot: 0, lease_generation: 1, dispatch_id: 1 };
//! let task = TaskPublication::run(CallableId([7; 32]), identity, &config, &blob);
//! let done = parent.run_task(TaskSlot::Slot0, &task, &WaitOptions::default(), &mut AssumeAlive)?;
//! assert_eq!(done.outcome, Ok(()));
//! parent.request_shutdown();
//! assert_eq!(child.join().unwrap()?, ServeExit::Shutdown);
//! # Ok::<(), MailboxError>(())
//! ```

#![cfg_attr(loom, allow(dead_code, unused_imports))]

mod error;
mod state;
mod wait;

#[cfg(not(loom))]
mod child;
#[cfg(not(loom))]
pub mod layout;
#[cfg(not(loom))]
mod liveness;
#[cfg(not(loom))]
mod mailbox;
#[cfg(not(loom))]
mod outcome;
#[cfg(not(loom))]
mod parent;
#[cfg(not(loom))]
mod region;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod protocol_tests;

pub use error::{ChildExit, MailboxError};
pub use state::{
    FrameId, FrameIdentity, MailboxState, PrepareDisposition, TaskSlot, UnknownStateValue,
};
pub use wait::{WaitOptions, WakeCounter, YIELD_AFTER};

#[cfg(not(loom))]
pub use child::{Child, Handler, PublishHook, ServeExit, ServeOptions, TaskPhase, TaskRequest};
#[cfg(not(loom))]
pub use liveness::{AssumeAlive, ChildProcess, Liveness, ParentWatch};
#[cfg(not(loom))]
pub use mailbox::{
    release_foreign_mailboxes, ForeignRelease, Mailbox, Snapshot, MAILBOX_MEMFD_NAME,
};
#[cfg(not(loom))]
pub use outcome::{codes, FailureReport};
#[cfg(not(loom))]
pub use parent::{
    encode_args_blob, ControlReply, ControlRequest, EncodedConfig, Parent, PublishKind,
    TaskCompletion, TaskPoll, TaskPublication,
};
#[cfg(not(loom))]
pub use region::{seal_size, SharedRegion, NAMED_REGION_PREFIX};
