//! # strata-fuzz
//!
//! Fuzz harnesses for every decoder that reads bytes another process wrote:
//!
//! | target | foreign bytes | the code under test (what the runtime runs on them) |
//! |---|---|---|
//! | `args_blob` | a task frame's argument blob | `strata_types::wire::decode_args` (host and chip limits), re-encoded |
//! | `call_config` | a task frame's 1152 config bytes | `strata_types::wire::decode_config`, re-encoded |
//! | `task_args` | an argument blob a chip child receives | `decode_args` then `RunArgs::from_task_args` on a live chip and shared memory |
//! | `sub_task` | an argument blob a sub-worker child receives | `decode_args` then `SubHandler::task` (views over shared memory) and a closure touching every element |
//! | `net_frame` | bytes a network peer sent | `strata_net::wire::decode_frame` (header bounds, checksum, every body type); a decoded frame re-encodes to the same bytes |
//! | `control_request` | a control frame's command, arg0 and payload | `ControlCommand::from_request` and the chip child's `serve_chip_control` |
//! | `mailbox_parent` | a frame a (hostile) child wrote | `Parent::poll` / `wait_task` / `reset` / `wait_init` / `control` / `snapshot` |
//! | `mailbox_child` | a frame a (hostile) parent wrote | `Child::serve` (state words, identity, digest, config, blob, control payload) |
//!
//! Each target is a plain function of `&[u8]` in [`targets`] that never panics on any
//! input unless a decoder has a bug: a panic, an abort, a failed debug assertion (the
//! fuzz build enables them, so `unsafe` preconditions are checked) or an allocation
//! larger than [`alloc_guard::LIMIT`] made while a target runs is a finding. The
//! libFuzzer binaries (`fuzz_targets/*.rs`) only call these functions; the `replay`
//! binary runs the committed corpus through them without libFuzzer, and `seedgen`
//! writes that corpus from the real encoders.
//!
//! Frames are fuzzed in a compact [`image`] form (the fields a peer may write, without
//! the 63 KiB of unused payload area), applied to a real mapped mailbox.

#![allow(clippy::missing_panics_doc)]

pub mod alloc_guard;
pub mod fixture;
pub mod image;
pub mod targets;

/// The target names, in the order `cargo xtask fuzz --list` prints them.
pub const TARGETS: &[&str] = &[
    "args_blob",
    "call_config",
    "task_args",
    "sub_task",
    "control_request",
    "mailbox_parent",
    "mailbox_child",
    "net_frame",
];

/// Runs target `name` on `data`; `false` if there is no such target.
pub fn run_target(name: &str, data: &[u8]) -> bool {
    match name {
        "args_blob" => targets::args_blob(data),
        "call_config" => targets::call_config(data),
        "task_args" => targets::task_args(data),
        "sub_task" => targets::sub_task(data),
        "control_request" => targets::control_request(data),
        "mailbox_parent" => targets::mailbox_parent(data),
        "mailbox_child" => targets::mailbox_child(data),
        "net_frame" => targets::net_frame(data),
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    /// Every committed seed runs through its target without a finding (what the fuzzer
    /// does first, without libFuzzer).
    #[test]
    fn every_seed_runs_clean() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        for target in super::TARGETS {
            let dir = root.join(target);
            let seeds: Vec<_> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .flatten()
                .collect();
            assert!(!seeds.is_empty(), "{target} has no seeds");
            for seed in seeds {
                let data = std::fs::read(seed.path()).unwrap();
                assert!(super::run_target(target, &data));
            }
        }
    }
}
