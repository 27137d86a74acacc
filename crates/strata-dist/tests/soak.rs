//! The soak: many tasks in many runs through one Process-mode level-3 worker (2 chips and
//! a sub-worker), with the process tree's footprint — resident memory, open descriptors,
//! `/dev/shm/strata-*` entries, threads — sampled after the first tenth of the runs and
//! after the last, which must stay flat (within a small tolerance).
//!
//! As a test it runs scaled down (10⁴ tasks in 100 runs); `cargo xtask soak` runs it in
//! release at full scale (10⁶ tasks in 10⁴ runs, `--tasks N --runs M` to change).
//!
//! Each run allocates a run-owned tensor, chains its sub tasks through it (zero it, bump
//! it InOut, copy it out: every task depends on the previous one, so the tensormap, the
//! heap rings and the slot rings all turn over), and sends one empty kernel to each chip.
//! Every run's count is checked, so the soak also checks that every task ran.
//!
//! `harness = false`: it forks.

mod common;

use common::*;
use std::time::Instant;
use strata_chip::CoreArgs;
use strata_dist::*;
use strata_host::ExecMode;
use strata_types::{ArgTag, DataType, TaskArgs};

/// The tree's footprint at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Resident memory of this process and its descendants, KiB.
    rss_kib: u64,
    /// Open descriptors of this process and its descendants.
    fds: usize,
    /// `/dev/shm/strata-*` entries.
    shm: usize,
    /// Threads of this process and its descendants.
    threads: usize,
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn count_dir(path: String) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

fn sample() -> Sample {
    let me = std::process::id() as i32;
    let mut pids = descendants();
    pids.push(me);
    Sample {
        rss_kib: pids.iter().map(|&p| rss_kib(p)).sum(),
        fds: pids
            .iter()
            .map(|&p| count_dir(format!("/proc/{p}/fd")))
            .sum(),
        shm: shm_entries().len(),
        threads: pids
            .iter()
            .map(|&p| count_dir(format!("/proc/{p}/task")))
            .sum(),
    }
}

/// Growth allowed between the two samples: resident memory may grow by 4 MiB plus 10 %
/// (allocator and page-cache noise); descriptors, `/dev/shm` entries and threads not at
/// all.
fn flat(first: &Sample, last: &Sample) -> Result<(), String> {
    let rss_limit = first.rss_kib + 4096 + first.rss_kib / 10;
    let mut grew = Vec::new();
    if last.rss_kib > rss_limit {
        grew.push(format!(
            "RSS {} KiB -> {} KiB (limit {rss_limit} KiB)",
            first.rss_kib, last.rss_kib
        ));
    }
    if last.fds > first.fds {
        grew.push(format!("descriptors {} -> {}", first.fds, last.fds));
    }
    if last.shm > first.shm {
        grew.push(format!("/dev/shm entries {} -> {}", first.shm, last.shm));
    }
    if last.threads > first.threads {
        grew.push(format!("threads {} -> {}", first.threads, last.threads));
    }
    if grew.is_empty() {
        Ok(())
    } else {
        Err(format!("the footprint grew: {}", grew.join(", ")))
    }
}

fn flag(args: &[String], name: &str, default: u64) -> Result<u64, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.replace('_', "").parse().ok())
            .ok_or_else(|| format!("{name} takes a number")),
    }
}

fn soak(tasks: u64, runs: u64) -> Outcome {
    check!(
        runs >= 10,
        "--runs must be at least 10 (tenths are sampled)"
    );
    let per_run = tasks / runs;
    check!(per_run >= 4, "--tasks must be at least 4 × --runs");
    // Two chip tasks per run, the rest a chain of sub tasks.
    let chain = per_run - 2;
    let mut w = DistWorker::new(l3_config(ExecMode::Process, 2, 1)).ctx("new")?;
    let empty = w.register_kernel("empty", |_| Ok(())).ctx("kernel")?;
    let chip_empty = w
        .register_chip_orchestration("empty", move |o, _| {
            o.submit_aiv(empty, &CoreArgs::new())?;
            Ok(())
        })
        .ctx("chip orchestration")?;
    let zero = w.register_sub("zero", |call| {
        call.tensor_mut::<u64>(0)?.set(&[0], 0)?;
        Ok(())
    });
    let bump = w.register_sub("bump", |call| {
        call.tensor_mut::<u64>(0)?.update(|v| v + 1);
        Ok(())
    });
    let copy_out = w.register_sub("copy_out", |call| {
        let v = call.tensor::<u64>(0)?.to_vec();
        call.tensor_mut::<u64>(1)?.set(&[0], v[0])?;
        Ok(())
    });
    let result = w.shared_tensor(&[1], DataType::U64).ctx("result")?;
    let ra = result.clone();
    let orch = w.register_orchestration("soak", move |o, _| {
        let t = o.alloc(&[16], DataType::U64)?;
        o.submit_next_level(chip_empty, &TaskArgs::new(), 0)?;
        o.submit_next_level(chip_empty, &TaskArgs::new(), 1)?;
        o.submit_sub(&zero, &args(&[t.arg(ArgTag::Output)], &[]))?;
        for _ in 0..chain - 2 {
            o.submit_sub(&bump, &args(&[t.arg(ArgTag::InOut)], &[]))?;
        }
        o.submit_sub(
            &copy_out,
            &args(&[t.arg(ArgTag::Input), ra.arg(ArgTag::OutputExisting)], &[]),
        )?;
        Ok(())
    });
    w.init().ctx("init")?;
    let tenth = runs / 10;
    let t0 = Instant::now();
    let mut first = None;
    let mut last_start = Instant::now();
    let mut first_tenth_time = None;
    for r in 1..=runs {
        if r == runs - tenth + 1 {
            last_start = Instant::now();
        }
        w.run(&orch, &TaskArgs::new()).ctx(&format!("run {r}"))?;
        let got = result.to_vec::<u64>().ctx("result")?[0];
        check!(
            got == chain - 2,
            "run {r}: the chain counted {got}, want {}",
            chain - 2
        );
        if r == tenth {
            first = Some(sample());
            first_tenth_time = Some(t0.elapsed());
        }
    }
    let last = sample();
    let total = t0.elapsed();
    let first = first.ok_or("no first sample")?;
    let last_tenth = last_start.elapsed();
    println!("soak: {tasks} tasks in {runs} runs ({per_run} per run: 2 chip tasks, a chain of {chain} sub tasks) in {total:.2?}");
    println!(
        "  µs per task: first tenth {:.2}, last tenth {:.2}",
        first_tenth_time.unwrap_or_default().as_secs_f64() * 1e6 / (tenth * per_run) as f64,
        last_tenth.as_secs_f64() * 1e6 / (tenth * per_run) as f64
    );
    println!("| sampled after | RSS (KiB, tree) | descriptors (tree) | /dev/shm strata-* | threads (tree) |");
    println!("|---|---|---|---|---|");
    for (when, s) in [("first tenth", first), ("last tenth", last)] {
        println!(
            "| {when} | {} | {} | {} | {} |",
            s.rss_kib, s.fds, s.shm, s.threads
        );
    }
    flat(&first, &last)?;
    w.close().ctx("close")?;
    Ok(())
}

fn main() {
    become_subreaper();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = flag(&args, "--tasks", 10_000).and_then(|t| Ok((t, flag(&args, "--runs", 100)?)));
    let (tasks, runs) = match parsed {
        Ok(v) => v,
        Err(e) => {
            eprintln!("soak: {e}");
            std::process::exit(2);
        }
    };
    let before = (descendants(), shm_entries());
    let outcome = soak(tasks, runs);
    let after = (descendants(), shm_entries());
    let outcome = outcome.and_then(|()| {
        if after == before {
            Ok(())
        } else {
            Err(format!("leak after close: {before:?} -> {after:?}"))
        }
    });
    match outcome {
        Ok(()) => println!("test soak ... ok\n\ntest result: ok. 1 passed; 0 failed"),
        Err(e) => {
            println!("test soak ... FAILED\n    {e}\n\ntest result: FAILED. 0 passed; 1 failed");
            std::process::exit(1);
        }
    }
}
