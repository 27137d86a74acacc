//! Scaffolding of strata's `harness = false` test binaries, which fork and so must stay
//! single-threaded: a sequential scenario runner that wraps every scenario in a leak check
//! (descendant processes, `/dev/shm/strata-*` entries, threads of this process), the
//! `check!` macro, and the `/proc` probes (in [`probe`], re-exported here: descendants,
//! process state, threads, CPU time); contract suites written once over a parameter and
//! run per value ([`suite`]); a one-call seccomp filter that refuses a system call
//! ([`seccomp`]); and, in
//! [`bench`](mod@bench), what the benchmarks share (statistics, pinning, the ping-pong floor);
//! in [`peer`], installing, building and running the benches' peers (Debian packages,
//! C/C++ programs, a Python venv).
//!
//! ```
//! use strata_testkit::{check, Outcome};
//! fn one_plus_one() -> Outcome {
//!     check!(1 + 1 == 2, "arithmetic");
//!     Ok(())
//! }
//! assert!(one_plus_one().is_ok());
//! ```

pub mod bench;
pub mod peer;
pub mod probe;
pub mod seccomp;
pub mod suite;

pub use probe::{
    cpu_ns, descendants, descendants_of, other_threads, proc_state, process_cpu_ns, schedstat_ns,
    shm_entries, stat_cpu_ns, threads_cpu_ns,
};

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};
/// The safety net of every wait in these tests (never a performance expectation).
pub const BOUND: Duration = Duration::from_secs(30);

/// What a scenario returns: `Err` carries the failure message.
pub type Outcome = Result<(), String>;
/// A named scenario.
pub type Scenario = (&'static str, fn() -> Outcome);

/// Returns `Err(message)` from the scenario unless the condition holds.
#[macro_export]
macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !($cond as bool) {
            return Err(format!("{} (at line {})", format!($($fmt)+), line!()));
        }
    };
}

/// Converts any error into the scenario's error string.
pub trait Ctx<T> {
    /// Prefixes the error with `what`.
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::fmt::Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Keeps deliberate panics of the scenarios (and of their children) off the output.
pub fn quiet_deliberate_panics() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info.to_string().contains("deliberate") {
            prev(info);
        }
    }));
}

/// Runs the scenarios in order (filtered by the non-flag arguments), with a leak check
/// around each: the descendant processes, the `/dev/shm/strata-*` entries and the
/// threads of this process must be the same after the scenario as before. Exits
/// non-zero if any scenario fails.
pub fn run(scenarios: &[Scenario]) {
    quiet_deliberate_panics();
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, f) in scenarios {
        if !filters.is_empty() && !filters.iter().any(|flt| name.contains(flt.as_str())) {
            continue;
        }
        ran += 1;
        let before = (descendants(), shm_entries());
        let threads_before = other_threads().unwrap_or(usize::MAX);
        let start = Instant::now();
        let result = match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(p) => Err(format!("panicked: {}", strata_sync::panic_message(&*p))),
        };
        // Detached threads (a threads-mode child stuck past its grace period) finish
        // shortly; give them a bounded moment.
        let end = Instant::now() + Duration::from_secs(10);
        while other_threads().unwrap_or(0) > threads_before && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        let after = (descendants(), shm_entries());
        let threads_after = other_threads().unwrap_or(usize::MAX);
        let leak = if after != before {
            Some(format!(
                "leak: descendants {:?} -> {:?}, /dev/shm strata-* {:?} -> {:?}",
                before.0, after.0, before.1, after.1
            ))
        } else if threads_after != threads_before {
            Some(format!(
                "leak: other threads {threads_before} -> {threads_after}"
            ))
        } else {
            None
        };
        let result = match (result, leak) {
            (Ok(()), None) => Ok(()),
            (Ok(()), Some(l)) => Err(l),
            (Err(e), None) => Err(e),
            (Err(e), Some(l)) => Err(format!("{e}; {l}")),
        };
        match result {
            Ok(()) => println!("test {name} ... ok ({:.2?})", start.elapsed()),
            Err(e) => {
                println!("test {name} ... FAILED\n    {e}");
                failed.push(*name);
            }
        }
    }
    println!();
    if failed.is_empty() {
        println!("test result: ok. {ran} passed; 0 failed");
    } else {
        println!(
            "test result: FAILED. {} passed; {} failed: {failed:?}",
            ran - failed.len(),
            failed.len()
        );
        std::process::exit(1);
    }
}

/// Nanoseconds of CLOCK_MONOTONIC (the same clock in every process).
pub use strata_sync::mono_ns;

/// Spins (with short sleeps) until `cond` holds, at most `BOUND`.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> Outcome {
    let end = Instant::now() + BOUND;
    while !cond() {
        if Instant::now() > end {
            return Err(format!("timed out after {BOUND:?} waiting for {what}"));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

/// Makes this process a child subreaper, so orphaned grandchildren of the scenarios are
/// reparented to it (and counted by the leak check) instead of escaping to init.
pub fn become_subreaper() {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) only sets a flag on this process.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if r != 0 {
        eprintln!(
            "warning: PR_SET_CHILD_SUBREAPER failed: {}",
            std::io::Error::last_os_error()
        );
    }
}
