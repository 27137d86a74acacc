//! Shared scaffolding of the `harness = false` test binaries: a sequential scenario
//! runner with leak checks, and task helpers.
#![allow(dead_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};
use strata_host::*;
use strata_mailbox::{
    encode_args_blob, EncodedConfig, FrameIdentity, TaskCompletion, TaskPublication, TaskSlot,
};
use strata_types::{CallableId, TaskArgs};

/// The safety net of every wait in these tests (never a performance expectation).
pub const BOUND: Duration = Duration::from_secs(30);

pub type Outcome = Result<(), String>;
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
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::fmt::Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Pids of every descendant of this process (children, grandchildren, … including
/// zombies), from `/proc/*/stat`.
pub fn descendants() -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some(close) = stat.rfind(')') else {
                continue;
            };
            let ppid = stat[close + 1..]
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<i32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![me];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        for &(c, pp) in &parent_of {
            if pp == p && !found.contains(&c) {
                found.push(c);
            }
        }
        i += 1;
    }
    found.remove(0);
    found.sort_unstable();
    found
}

/// `/dev/shm` entries with the `strata-` prefix.
pub fn shm_entries() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| n.starts_with("strata-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The scheduler state letter of a process (`R`, `S`, `Z`, …).
pub fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
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
            Err(p) => Err(format!(
                "panicked: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
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

/// Builds task publications with fresh identities.
pub struct Tasks {
    pub config: EncodedConfig,
    next: u64,
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks {
            config: EncodedConfig::default(),
            next: 0,
        }
    }

    pub fn identity(&mut self, slot: TaskSlot) -> FrameIdentity {
        self.next += 1;
        FrameIdentity {
            run_id: 1,
            lease_slot: slot.index() as u32,
            lease_generation: 1,
            dispatch_id: self.next,
        }
    }

    /// Publishes, waits (liveness-checked, bounded) and resets.
    pub fn run(
        &mut self,
        lane: &mut Lane,
        slot: TaskSlot,
        callable: CallableId,
        args: &TaskArgs,
    ) -> Result<TaskCompletion, HostError> {
        let blob = encode_args_blob(args);
        let id = self.identity(slot);
        let task = TaskPublication::run(callable, id, &self.config, &blob);
        lane.run_task(slot, &task, Some(BOUND))
    }

    /// Publishes without waiting.
    pub fn publish(
        &mut self,
        lane: &mut Lane,
        slot: TaskSlot,
        callable: CallableId,
        args: &TaskArgs,
    ) -> Result<(), String> {
        let blob = encode_args_blob(args);
        let id = self.identity(slot);
        let task = TaskPublication::run(callable, id, &self.config, &blob);
        lane.parent().publish(slot, &task).ctx("publish")
    }
}

/// Expects a successful completion.
pub fn ok(c: Result<TaskCompletion, HostError>) -> Outcome {
    match c {
        Ok(c) => c.outcome.map_err(|f| format!("task failed: {f}")),
        Err(e) => Err(format!("task error: {e}")),
    }
}

/// Expects a failed completion and returns its (code, message).
pub fn failed(c: Result<TaskCompletion, HostError>) -> Result<(i32, String), String> {
    match c {
        Ok(c) => match c.outcome {
            Ok(()) => Err("the task succeeded but was expected to fail".into()),
            Err(f) => Ok((f.code, f.message)),
        },
        Err(e) => Err(format!("task error: {e}")),
    }
}

pub fn subs(registry: &SubRegistry, n: usize) -> Vec<Box<dyn ChildProgram>> {
    (0..n)
        .map(|i| Box::new(SubProgram::new(registry.clone()).with_index(i)) as Box<dyn ChildProgram>)
        .collect()
}

/// Nanoseconds of CLOCK_MONOTONIC (the same clock in every process).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

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
