//! # strata
//!
//! A runtime for hierarchical task graphs on (emulated) AI accelerators. This facade
//! re-exports the layered crates.

pub use strata_chip as chip;
pub use strata_graph as graph;
pub use strata_mailbox as mailbox;
pub use strata_types as types;
