//! `ExecMode::Threads`: strata-host's contracts (`contracts/`, shared with
//! `processes.rs`) with the children as threads of this process over the same mailbox
//! protocol. Every scenario of the threads mode is a contract: what differs from
//! processes (no pids, a thread's return code, detaching instead of killing, shared
//! closure state) is stated inside each contract.
//!
//! `harness = false` like `processes.rs`, so the leak check can count this process's
//! threads exactly: every scenario must leave as many threads as it found.

mod common;
mod contracts;

use common::*;

fn main() {
    common::run(&contracts::suite::<Threads>());
}
