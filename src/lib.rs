//! # strata
//!
//! A runtime for hierarchical task graphs on (emulated) AI accelerators: kernels on
//! emulated cores (L1), a chip that orchestrates and schedules them (L2), a host that
//! drives chips and sub-workers as child processes (L3), hosts of hosts (L4). Dependencies
//! are inferred from how tasks tag their tensors; every level gives the result of running
//! its tasks one by one in submit order.
//!
//! What a user writes (`docs/guide.md`): a [`Program`] — a signature and an orchestration,
//! with the kernels, chip orchestrations and sub-worker callbacks it uses —
//! [compiled](Program::compile) for a [`Target`], then [run once](Compiled::run_once) or
//! [prepared](Compiled::prepare) into a [`PreparedWorker`] and dispatched many times, with
//! resident [`DeviceTensor`]s and [`StackedDeviceTensor`]s. [`Worker`] is the lower-level
//! facade of the engine itself (register, init, submit, close). The layers are re-exported
//! below; [`prelude`] brings what programs use into scope.

pub mod bench;
mod error;
mod handle;
pub mod prelude;
mod prepared;
pub mod program;
mod progress;
mod tensors;
mod worker;

pub use bench::{benchmark, BenchmarkStats, Invocation};
pub use error::Error;
pub use handle::{DispatchHandle, MAX_WAIT};
pub use prepared::{CopyRange, Prepare, PreparedWorker, Registration};
pub use program::args::{Arg, IntoArgs, ProgramArgs, ProgramTensor};
pub use program::{Compiled, Program, Signature, Target};
pub use progress::Progress;
pub use strata_chip as chip;
pub use strata_chip::DeviceTensor;
pub use strata_comm as comm;
pub use strata_dist as dist;
pub use strata_graph as graph;
pub use strata_graph::FailureKind;
pub use strata_host as host;
pub use strata_mailbox as mailbox;
pub use strata_net as net;
pub use strata_types as types;
pub use strata_types::{Executor, PendingTask, RingWait, RunningTask, SignalWait, WaitFor};
pub use tensors::StackedDeviceTensor;
pub use worker::{Callable, Worker};

#[cfg(test)]
mod tests {
    /// A prepared worker and its handles can be shared with and moved to other threads
    /// (dispatch from one thread, wait from another).
    #[test]
    fn prepared_workers_and_handles_are_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<crate::PreparedWorker>();
        both::<crate::DispatchHandle>();
        both::<crate::Registration>();
        both::<crate::Compiled>();
        both::<crate::Error>();
    }

    /// A remote level-3 worker is a child of a level-4 target, never a target of its own;
    /// as a child its chips are the world the level-4 program's own dimension counts.
    #[test]
    fn a_remote_target_is_a_level_4_child() {
        use crate::net::RemoteSpec;
        use crate::program::{Dim, Program, Signature, Target};
        use crate::types::DataType;
        let program = || {
            let mut p = Program::new(
                "p",
                Signature::new().output("y", DataType::F32, [Dim::World, Dim::Fixed(4)]),
            );
            p.orchestrate(|_, _| Ok(()));
            p
        };
        let alone = program().compile(&Target::remote(RemoteSpec::new("h:1").chips(2)));
        assert!(
            matches!(&alone, Err(crate::Error::Config(m)) if m.contains("child of a level-4 target")),
            "{alone:?}"
        );
        let child = Target::remote(RemoteSpec::new("h:1").chips(3)).sub_workers(1);
        assert_eq!((child.level(), child.world_size()), (3, 3));
        let top = Target::l4(vec![Target::l3(2), child]);
        let compiled = program()
            .compile(&top)
            .expect("a level-4 target with a remote child");
        assert_eq!(compiled.describe(), "y: out F32[2, 4]");
    }
}
