//! # strata-net
//!
//! Level-3 workers on other hosts, as ordinary next-level children of a level-4 worker
//! (DESIGN.md §8): the same orchestration code, dependency inference and failure model
//! as for local level-3 children.
//!
//! - [`add_remote_worker`] adds a worker served by a `strata-node serve` daemon;
//!   [`add_launched_workers`] adds the other ranks of a job started with `strata-node
//!   launch` under `mpirun` or `srun`. Ids come from the engine's one counter.
//! - **The user's own program is the node.** Closures cannot cross hosts, so every
//!   process of a job runs the same `main` and makes the same registrations (the
//!   registry digest and the ELF build-id prove it). In the root, the level-4 worker's
//!   `init` connects to its remote children; in a process started as remote worker `k`,
//!   the same `init` builds the level-3 worker, serves the root with it, and exits.
//! - The wire ([`wire`]): a fixed 32-byte versioned header with a checksum, postcard
//!   bodies, every length bounded before allocation; a handshake with an HMAC
//!   challenge–response over nonces from both sides ([`auth`], [`handshake`]).
//! - A session pipelines two tasks (as a local child's two frames), ships shared-tensor
//!   arguments in 256 KiB chunks into the node's own shared memory before a task and the
//!   written bytes back after it, sends heartbeats apart from task traffic, and ends with
//!   an acknowledged shutdown (the node confirms its subtree was reaped).
//!
//! See `docs/net.md` for the byte map, the session state machine and the failure table.

pub mod auth;
mod client;
pub mod daemon;
mod error;
pub mod handshake;
pub mod identity;
pub mod io;
pub mod launch;
mod memory;
#[cfg(feature = "mpi")]
pub mod mpi_link;
mod node;
mod spec;
mod tcp;
pub mod wire;

pub use auth::Secret;
pub use client::{RemoteEndpoint, HEARTBEAT_INTERVAL};
pub use error::{MemoryFault, NetError, WireError};
pub use memory::{RemoteTensor, RemoteWorker};
pub use spec::{
    add_launched_workers, add_remote_worker, launch_rank, RemoteSpec, DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_STAGING_BYTES, ENV_LAUNCH_RANK, ENV_LAUNCH_ROOT, ENV_LAUNCH_SECRET, ENV_LAUNCH_SIZE,
    ENV_NODE_FD, ENV_NODE_SESSION, ENV_NODE_WORKER, ENV_SECRET_FILE,
};
