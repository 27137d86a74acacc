//! # strata
//!
//! A runtime for hierarchical task graphs on (emulated) AI accelerators: kernels on
//! emulated cores (L1), a chip that orchestrates and schedules them (L2), a host that
//! drives chips and sub-workers as child processes (L3), hosts of hosts (L4). Dependencies
//! are inferred from how tasks tag their tensors; every level gives the result of running
//! its tasks one by one in submit order.
//!
//! [`Worker`] is the one facade for every level; the layers are re-exported below.

mod worker;

pub use strata_chip as chip;
pub use strata_comm as comm;
pub use strata_dist as dist;
pub use strata_graph as graph;
pub use strata_host as host;
pub use strata_mailbox as mailbox;
pub use strata_types as types;
pub use worker::{Callable, Error, PendingRun, Worker, WorkerConfig};
