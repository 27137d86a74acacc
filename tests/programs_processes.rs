//! The execution API (programs, prepare, dispatch, resident and stacked tensors) with
//! children as forked processes: the contracts of `programs/`, shared with
//! `programs_threads.rs`.
//!
//! `harness = false`: a process that forks must be single-threaded at the fork. Every
//! scenario runs inside strata-testkit's leak check (descendant processes,
//! `/dev/shm/strata-*`, threads of this process).

mod programs;

fn main() {
    strata_testkit::become_subreaper();
    strata_testkit::run(&programs::suite::<programs::Process>());
}
