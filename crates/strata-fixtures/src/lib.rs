//! # strata-fixtures
//!
//! What strata's tests and benches run against the chip, kept out of the libraries (not
//! published): the reference runtime's example workloads (reference/chip.md §8) ported to
//! the emulator, each checked against a golden computed on the host, and the negative
//! suite.
//!
//! - [`vector_add`]: E1 vector_add and its four ring configurations (E1b);
//!   [`memory`]: the device-memory round trips (E1c);
//! - [`vector_example`]: E2, a small DAG with a nested scope;
//! - [`mixed`]: E4, the five task shapes;
//! - [`spmd`]: E5 context accessors, more blocks than cores, an intra-task barrier;
//! - [`dummy`]: E6, dependency-only tasks; [`scalar_data`]: E7, orchestration data access;
//! - [`matmul`]: a batched tiled matmul of several hundred tasks;
//! - [`negative`]: the fatal codes, one table row per case;
//! - [`idle`]: the CPU an idle chip uses; [`kernels`]: the kernels they share.
//!
//! Each workload builds its own [`ChipWorker`](strata_chip::ChipWorker) from the given
//! configuration, runs, checks, closes, and returns a short [`WorkloadReport`].
//!
//! ```no_run
//! let r = strata_fixtures::e1_vector_add(strata_chip::ChipConfig::default())?;
//! assert_eq!(r.tasks, 1);
//! # Ok::<(), strata_fixtures::WorkloadError>(())
//! ```

pub mod dummy;
pub mod idle;
pub mod kernels;
pub mod matmul;
pub mod memory;
pub mod mixed;
pub mod negative;
pub mod scalar_data;
pub mod spmd;
mod support;
pub mod vector_add;
pub mod vector_example;

pub use dummy::e6_dummy_task;
pub use idle::idle_cpu;
pub use kernels::{add_kernel, add_scalar_kernel, host_matmul, matmul_kernel, mul_kernel};
pub use matmul::batched_matmul;
pub use memory::e1c_malloc;
pub use mixed::e4_mixed_example;
pub use negative::{
    negative_suite, CaseArgs, CaseKernels, NegativeCase, NegativeOutcome, NEGATIVE_CASES,
};
pub use scalar_data::e7_scalar_data;
pub use spmd::{e5_spmd_basic, spmd_barrier, spmd_blocks};
pub use support::{check_close, Rng, WorkloadError, WorkloadReport};
pub use vector_add::{e1_vector_add, e1b_ring_configs, e1b_ring_configs_run};
pub use vector_example::e2_vector_example;
