//! The `/proc` probes of every test and bench (one copy for the workspace): descendant
//! processes, process state, threads, `/dev/shm` entries and CPU time — of a process, of
//! every thread of a process, or of this process's threads by name.
//!
//! They read Linux's `/proc`; where a file is missing they report nothing (an empty list,
//! `None`, zero) rather than fail, except [`process_cpu_ns`] and [`cpu_ns`], which a
//! caller asked about one live process.

use crate::Ctx;

/// The command name and the fields after it of a `/proc/<pid>/stat` line: the name is in
/// parentheses and may itself contain spaces and `)`, so it ends at the *last* `)`. Field
/// 0 of the rest is the state (field 3 of the full line).
fn split_stat(stat: &str) -> Option<(&str, Vec<&str>)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?;
    Some((name, stat[close + 1..].split_whitespace().collect()))
}

/// utime + stime of a parsed stat line (fields 14 and 15 of the full line), in ns.
fn stat_ticks_ns(fields: &[&str]) -> u64 {
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    (ticks(11) + ticks(12)) * 1_000_000_000 / hz
}

/// The first field of a `schedstat` file: time spent on a CPU, in ns.
fn read_schedstat(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Pids of every descendant of this process (children, grandchildren, … including
/// zombies), from `/proc/*/stat`.
pub fn descendants() -> Vec<i32> {
    descendants_of(std::process::id() as i32)
}

/// Pids of every descendant of `root`, sorted.
pub fn descendants_of(root: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = split_stat(&stat).and_then(|(_, f)| f.get(1)?.parse::<i32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((pid, ppid));
        }
    }
    let mut found = vec![root];
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

/// The scheduler state letter of a process (`R`, `S`, `Z`, …).
pub fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    split_stat(&stat)?.1.first()?.chars().next()
}

/// Threads of this process besides the caller (entries of `/proc/self/task` minus one).
pub fn other_threads() -> Option<usize> {
    Some(
        std::fs::read_dir("/proc/self/task")
            .ok()?
            .count()
            .saturating_sub(1),
    )
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

/// CPU time of `pid`'s main thread in ns, from `/proc/<pid>/schedstat` (precise), or
/// `None` where the kernel has no schedstat.
pub fn schedstat_ns(pid: i32) -> Option<u64> {
    read_schedstat(std::path::Path::new(&format!("/proc/{pid}/schedstat")))
}

/// CPU time (user + system) of the whole process `pid` in ns, from utime + stime of
/// `/proc/<pid>/stat` (clock ticks, so 10 ms steps at the usual 100 Hz).
pub fn stat_cpu_ns(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat_ticks_ns(&split_stat(&stat)?.1))
}

/// CPU time of a process in ns ([`schedstat_ns`], else [`stat_cpu_ns`]).
///
/// # Errors
/// Neither file can be read (no such process).
pub fn cpu_ns(pid: i32) -> Result<u64, String> {
    schedstat_ns(pid)
        .or_else(|| stat_cpu_ns(pid))
        .ok_or_else(|| format!("no CPU time for process {pid} (/proc/{pid}/stat unreadable)"))
}

/// CPU time of every live thread of `pid`, in ns (`/proc/<pid>/task/*/schedstat`).
///
/// # Errors
/// The task directory cannot be read (no such process).
pub fn process_cpu_ns(pid: i32) -> Result<u64, String> {
    let mut total = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ctx("task dir")?
        .flatten()
    {
        total += read_schedstat(&e.path().join("schedstat")).unwrap_or(0);
    }
    Ok(total)
}

/// CPU time (ns) used so far by this process's live threads whose name starts with
/// `prefix` (`/proc/self/task/*`: the name from `stat`, the time from `schedstat`, else
/// utime + stime), so a test can measure its own threads while other tests run.
pub fn threads_cpu_ns(prefix: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut total = 0;
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((name, fields)) = split_stat(&stat) else {
            continue;
        };
        if name.starts_with(prefix) {
            total += read_schedstat(&e.path().join("schedstat"))
                .unwrap_or_else(|| stat_ticks_ns(&fields));
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_splits_at_the_last_parenthesis() {
        let (name, f) = split_stat("42 (a (b) c) S 1 42 42 0 -1 0 0 0 0 0 7 3").unwrap();
        assert_eq!(name, "a (b) c");
        assert_eq!((f[0], f[1]), ("S", "1"));
        assert_eq!(f.len(), 13);
    }

    #[test]
    fn this_process_has_a_state_and_its_threads_add_up() {
        let me = std::process::id() as i32;
        assert!(proc_state(me).is_some());
        assert!(cpu_ns(me).is_ok());
        // Read the main thread first: CPU time only grows.
        let main_thread = schedstat_ns(me).unwrap_or(0);
        assert!(process_cpu_ns(me).unwrap() >= main_thread);
        assert!(cpu_ns(i32::MAX).is_err());
    }

    #[test]
    fn a_named_thread_is_measured_by_its_prefix() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::Builder::new()
            .name("probe-spinner".into())
            .spawn(move || {
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    strata_sync::sync::spin_hint();
                }
            })
            .unwrap();
        let t0 = std::time::Instant::now();
        while threads_cpu_ns("probe-spin") == 0 && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let used = threads_cpu_ns("probe-spin");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        t.join().unwrap();
        assert!(used > 0);
        assert_eq!(threads_cpu_ns("no-thread-has-this-name"), 0);
    }
}
