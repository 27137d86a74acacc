//! What a run records about itself for people: `[STRACE]` timing spans (`strace`) and the
//! per-core swimlane (`swimlane`).

pub mod file;
pub(crate) mod strace;
pub(crate) mod swimlane;
