//! `cargo xtask fuzz`: coverage-guided fuzzing of the decoders of foreign bytes, on
//! stable Rust, with libFuzzer (the `libfuzzer-sys` crate builds it from source with the
//! machine's C++ compiler) and rustc's stable SanitizerCoverage flags. The harness crate
//! is `fuzz/` (its own workspace); see docs/reliability.md ("Fuzzing").
//!
//! - `cargo xtask fuzz --list` names the targets.
//! - `cargo xtask fuzz <target>|all [--seconds N]` builds the instrumented targets and
//!   fuzzes each for N seconds (default 60), starting from the committed seed corpus
//!   `fuzz/corpus/<target>/`; new inputs go to `fuzz/target/corpus/<target>/`, crashing
//!   ones to `fuzz/target/artifacts/<target>/`. Each target ends with one line:
//!   `fuzz <target>: <E> executions in <S> s, <C> crashes, ...`.
//! - `cargo xtask fuzz --seeds` rewrites the seed corpus from the real encoders.
//! - `cargo xtask fuzz --replay [<target>|all] [<path>...]` runs inputs (default: the
//!   seed corpus) through the targets without instrumentation.

use crate::{run_step, workspace_root};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// A fuzz target of `fuzz/` and the longest input libFuzzer generates for it.
struct Target {
    name: &'static str,
    max_len: usize,
    what: &'static str,
}

const TARGETS: &[Target] = &[
    Target {
        name: "args_blob",
        max_len: 40_000,
        what: "task-frame argument blob: wire::decode_args (host and chip limits), round trip",
    },
    Target {
        name: "call_config",
        max_len: 1152,
        what: "task-frame call config: wire::decode_config, round trip",
    },
    Target {
        name: "task_args",
        max_len: 40_000,
        what: "chip child: decode_args then RunArgs::from_task_args on a live chip + shared memory",
    },
    Target {
        name: "sub_task",
        max_len: 40_000,
        what: "sub-worker child: decode_args then SubHandler::task (views over shared memory), every element touched",
    },
    Target {
        name: "control_request",
        max_len: 512,
        what: "control frame: ControlCommand::from_request and the chip child's serve_chip_control",
    },
    Target {
        name: "mailbox_parent",
        max_len: 8192,
        what: "frames a hostile child wrote, read by Parent (poll/wait_task/wait_init/control reply)",
    },
    Target {
        name: "mailbox_child",
        max_len: 8192,
        what: "frames a hostile parent wrote, served by Child::serve (identity, config, blob, control)",
    },
    Target {
        name: "net_frame",
        max_len: 70_000,
        what: "bytes a network peer sent: strata_net::wire::decode_frame (header bounds, checksum, every body), round trip",
    },
];

/// rustc flags of the instrumented build: libFuzzer's coverage feedback (8-bit counters,
/// PC table, comparison tracing) through the stable `-C passes` / `-C llvm-args`, plus
/// debug assertions (checked `unsafe` preconditions) and overflow checks.
const RUSTFLAGS: &str = "-Cpasses=sancov-module \
     -Cllvm-args=-sanitizer-coverage-level=4 \
     -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
     -Cllvm-args=-sanitizer-coverage-pc-table \
     -Cllvm-args=-sanitizer-coverage-trace-compares \
     --cfg fuzzing -Cdebug-assertions -Coverflow-checks";

fn fuzz_dir() -> PathBuf {
    workspace_root().join("fuzz")
}

fn cargo_in_fuzz() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(fuzz_dir());
    // The fuzz workspace keeps its own target directory and flags.
    c.env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    c
}

pub(crate) fn usage() -> &'static str {
    "cargo xtask fuzz --list | <target>|all [--seconds N] | --seeds | --replay [<target>|all] [<path>...]"
}

pub(crate) fn fuzz(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        None => Err(format!("usage: {}", usage())),
        Some("--list") => {
            for t in TARGETS {
                println!("{:<16} {}", t.name, t.what);
            }
            Ok(())
        }
        Some("--seeds") => seeds(),
        Some("--replay") => replay(&args[1..]),
        Some(name) => {
            let mut seconds = 60u64;
            let mut rest = args[1..].iter();
            while let Some(a) = rest.next() {
                match a.as_str() {
                    "--seconds" => {
                        seconds = rest
                            .next()
                            .and_then(|s| s.parse().ok())
                            .filter(|&s| s > 0)
                            .ok_or("--seconds takes a positive whole number")?;
                    }
                    other => return Err(format!("unknown argument {other:?}; {}", usage())),
                }
            }
            let chosen = select(name)?;
            run(&chosen, seconds)
        }
    }
}

fn select(name: &str) -> Result<Vec<&'static Target>, String> {
    if name == "all" {
        return Ok(TARGETS.iter().collect());
    }
    TARGETS
        .iter()
        .find(|t| t.name == name)
        .map(|t| vec![t])
        .ok_or_else(|| {
            let names: Vec<_> = TARGETS.iter().map(|t| t.name).collect();
            format!(
                "unknown fuzz target {name:?}; known: {}, all",
                names.join(", ")
            )
        })
}

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// libfuzzer-sys compiles libFuzzer (C++) from source: install a C++ compiler through
/// the system's package manager when there is none.
fn ensure_cxx() -> Result<(), String> {
    if let Ok(cxx) = std::env::var("CXX") {
        if have(&cxx) {
            return Ok(());
        }
    }
    if ["c++", "g++", "clang++"].iter().any(|c| have(c)) {
        return Ok(());
    }
    if !have("apt-get") {
        return Err("libFuzzer needs a C++ compiler (g++ or clang++) and none was found".into());
    }
    eprintln!("xtask fuzz: no C++ compiler found; installing g++ with apt-get");
    run_step(
        "apt-get update",
        Command::new("apt-get").args(["update", "-q"]),
    )?;
    run_step(
        "apt-get install g++",
        Command::new("apt-get")
            .args(["install", "-y", "-q", "g++"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn host_triple() -> Result<String, String> {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .map_err(|e| format!("rustc -vV: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .ok_or_else(|| "rustc -vV printed no host triple".into())
}

/// Builds the instrumented targets. `--target` keeps the flags off build scripts and
/// proc macros (they would not link without libFuzzer's runtime).
fn build(targets: &[&Target]) -> Result<PathBuf, String> {
    ensure_cxx()?;
    let triple = host_triple()?;
    let mut cmd = cargo_in_fuzz();
    cmd.args([
        "build",
        "--release",
        "--features",
        "libfuzzer",
        "--target",
        &triple,
    ]);
    for t in targets {
        cmd.args(["--bin", t.name]);
    }
    run_step(
        "build fuzz targets (instrumented)",
        cmd.env("RUSTFLAGS", RUSTFLAGS),
    )?;
    Ok(fuzz_dir().join("target").join(&triple).join("release"))
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.flatten().count())
}

fn artifacts(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                ["crash-", "timeout-", "oom-", "leak-", "slow-unit-"]
                    .iter()
                    .any(|k| n.starts_with(k))
            })
        })
        .collect();
    v.sort();
    v
}

/// The value of libFuzzer's final `stat::<key>: N` line.
fn final_stat(log: &str, key: &str) -> Option<u64> {
    log.lines().rev().find_map(|l| {
        l.trim()
            .strip_prefix(&format!("stat::{key}:"))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// The execution count of libFuzzer's last status line (`#N ...`), for a run that
/// ended without final stats (a crash).
fn last_status_count(log: &str) -> Option<u64> {
    log.lines().rev().find_map(|l| {
        let rest = l.strip_prefix('#')?;
        let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
        n.parse().ok()
    })
}

struct Outcome {
    executions: u64,
    crashes: usize,
}

fn run(targets: &[&Target], seconds: u64) -> Result<(), String> {
    let bin_dir = build(targets)?;
    let work = fuzz_dir().join("target");
    let mut totals = Outcome {
        executions: 0,
        crashes: 0,
    };
    let mut failed = Vec::new();
    for t in targets {
        match run_one(t, &bin_dir, &work, seconds) {
            Ok(o) => {
                totals.executions += o.executions;
                totals.crashes += o.crashes;
                if o.crashes > 0 {
                    failed.push(t.name);
                }
            }
            Err(e) => {
                eprintln!("xtask fuzz: {}: {e}", t.name);
                failed.push(t.name);
            }
        }
    }
    if targets.len() > 1 {
        println!(
            "fuzz total: {} executions in {} targets x {seconds} s, {} crashes",
            totals.executions,
            targets.len(),
            totals.crashes
        );
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("fuzzing found problems in: {}", failed.join(", ")))
    }
}

fn run_one(t: &Target, bin_dir: &Path, work: &Path, seconds: u64) -> Result<Outcome, String> {
    let seeds = fuzz_dir().join("corpus").join(t.name);
    let corpus = work.join("corpus").join(t.name);
    let artifact_dir = work.join("artifacts").join(t.name);
    let log_dir = work.join("logs");
    for d in [&corpus, &artifact_dir, &log_dir] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let before = artifacts(&artifact_dir).len();
    let log_path = log_dir.join(format!("{}.log", t.name));
    let log =
        std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let bin = bin_dir.join(t.name);
    // Low priority: the fuzzer shares the machine with whatever else runs.
    let mut cmd = if have("nice") {
        let mut c = Command::new("nice");
        c.args(["-n", "19"]).arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    cmd.arg(format!("-max_total_time={seconds}"))
        .arg("-print_final_stats=1")
        .arg("-timeout=10")
        .arg("-rss_limit_mb=2048")
        .arg(format!("-max_len={}", t.max_len))
        .arg(format!("-artifact_prefix={}/", artifact_dir.display()))
        .arg(&corpus)
        .arg(&seeds)
        .current_dir(work)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    eprintln!(
        "\n==> fuzz {} for {seconds} s (log: {})",
        t.name,
        log_path.display()
    );
    let started = Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("could not start {}: {e}", bin.display()))?;
    let elapsed = started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let executions = final_stat(&text, "number_of_executed_units")
        .or_else(|| last_status_count(&text))
        .unwrap_or(0);
    let found = artifacts(&artifact_dir);
    let crashes = found.len().saturating_sub(before);
    let crashes = if crashes == 0 && !status.success() {
        1 // died without writing an artifact (e.g. killed): still a finding
    } else {
        crashes
    };
    if crashes > 0 {
        let tail: Vec<_> = text.lines().rev().take(40).collect();
        for l in tail.into_iter().rev() {
            eprintln!("  | {l}");
        }
        for a in &found[before.min(found.len())..] {
            eprintln!("  crash input: {}", a.display());
        }
    }
    println!(
        "fuzz {}: {executions} executions in {elapsed:.0} s, {crashes} crashes, corpus {} inputs (+{} seeds){}",
        t.name,
        count_files(&corpus),
        count_files(&seeds),
        if crashes > 0 {
            format!(", artifacts in {}", artifact_dir.display())
        } else {
            String::new()
        }
    );
    Ok(Outcome {
        executions,
        crashes,
    })
}

fn seeds() -> Result<(), String> {
    run_step(
        "fuzz seed corpus (seedgen)",
        cargo_in_fuzz().args(["run", "--release", "--bin", "seedgen"]),
    )
}

fn replay(args: &[String]) -> Result<(), String> {
    let (name, paths) = match args.split_first() {
        Some((n, p)) => (n.as_str(), p),
        None => ("all", &[][..]),
    };
    let targets = select(name)?;
    run_step(
        "build fuzz replayer",
        cargo_in_fuzz().args(["build", "--release", "--bin", "replay"]),
    )?;
    let bin = fuzz_dir().join("target/release/replay");
    for t in targets {
        let mut cmd = Command::new(&bin);
        cmd.arg(t.name);
        if paths.is_empty() {
            cmd.arg(fuzz_dir().join("corpus").join(t.name));
        } else {
            cmd.args(paths);
        }
        run_step(&format!("replay {}", t.name), &mut cmd)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_xtask_lists_exactly_the_harness_targets() {
        let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
        for t in TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{}\"", t.name)),
                "{} has no [[bin]] in fuzz/Cargo.toml",
                t.name
            );
            assert!(
                fuzz_dir().join("corpus").join(t.name).is_dir(),
                "{} has no seed corpus",
                t.name
            );
        }
        let bins = manifest
            .matches("required-features = [\"libfuzzer\"]")
            .count();
        assert_eq!(
            bins,
            TARGETS.len(),
            "a fuzz target is missing from the xtask"
        );
    }

    #[test]
    fn libfuzzer_figures_are_parsed() {
        let log = "#4096\tpulse  cov: 10\n#8192\tNEW    cov: 11\nDone 9000 runs in 2 second(s)\nstat::number_of_executed_units: 9000\nstat::peak_rss_mb: 40\n";
        assert_eq!(final_stat(log, "number_of_executed_units"), Some(9000));
        assert_eq!(last_status_count(log), Some(8192));
        assert_eq!(
            final_stat("#12\tINITED\n", "number_of_executed_units"),
            None
        );
    }
}
