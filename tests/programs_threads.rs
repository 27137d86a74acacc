//! The execution API with children as threads: the contracts of `programs/`, shared with
//! `programs_processes.rs`.

mod programs;

fn main() {
    strata_testkit::run(&programs::suite::<programs::Threads>());
}
