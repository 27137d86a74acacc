//! `cargo xtask`: the project's task runner.
//!
//! - `cargo xtask sim` builds every example and runs it end to end on the emulator, with a
//!   progress bar, then prints a summary table (example, result, time).
//! - `cargo xtask ci` runs what `.ci/run` runs: fmt, clippy, the test suite, strata-net's
//!   `mpi` feature (lints, docs, its tests under `mpirun -n 3`, bounded), loom models, docs,
//!   and a short run of every fuzz target. `cargo xtask ci-mpi` runs its MPI step alone.
//! - `cargo xtask bench <name>` runs one side-by-side benchmark; each prints a human table
//!   and, as its last line, one JSON object with its figures. Each alternates its
//!   variants with its peer or floor in rounds and prints the machine (CPU model, load
//!   average). `cargo xtask bench list` names them. The peers install themselves on first
//!   use (Debian packages by `apt-get`, the iceoryx2 peer by `cargo build`, Ray by `pip`
//!   into a venv under `target/peers/`); one that cannot be had is skipped with its
//!   reason, and its JSON figures are `null`. The criterion benches of the public API's
//!   hot paths are a plain `cargo bench` (`benches/hot_paths.rs`).
//! - `cargo xtask bench-compare <rev> <bench> [--rounds N]` builds `<rev>` in a git
//!   worktree under `target/bench-compare/` and runs its bench and this tree's
//!   alternately, printing per figure both medians, the median of the per-round ratios
//!   head / base and a verdict (module `compare`).
//! - `cargo xtask soak [--tasks N] [--runs M]` pushes N tasks (default 10⁶) in M runs
//!   (default 10⁴) through a Process-mode level-3 worker (strata-dist's `soak` test
//!   binary, in release) and fails if the process tree's resident memory, descriptors,
//!   `/dev/shm` entries or threads grew between the first and the last tenth.
//! - `cargo xtask trace <example>` runs one example with `STRATA_TRACE_OUT` set: every
//!   dispatch traced at every level, written as `target/trace/<example>.json` (Chrome /
//!   Perfetto) and `target/trace/<example>.svg` (swimlanes).
//! - `cargo xtask fuzz --list | <target>|all [--seconds N] | --seeds | --replay` fuzzes
//!   the decoders of bytes another process wrote, on stable Rust (module `fuzz`).

mod compare;
mod fuzz;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// A side-by-side benchmark: a `harness = false` bench target of some package.
struct Bench {
    name: &'static str,
    package: &'static str,
    target: &'static str,
    what: &'static str,
}

const BENCHES: &[Bench] = &[
    Bench {
        name: "trace",
        package: "strata",
        target: "trace_cost",
        what: "a level-3 dispatch with no subscriber, a subscriber not listening to strata, traced, and a subscriber listening (ratios)",
    },
    Bench {
        name: "mailbox",
        package: "strata-mailbox",
        target: "mailbox_rtt",
        what: "no-op task round trip through a mailbox between two processes vs a raw cache-line ping-pong and iceoryx2 (built from benches/peers/iceoryx2 on first use)",
    },
    Bench {
        name: "graph",
        package: "strata-graph",
        target: "graph_dags",
        what: "µs per task through strata-graph for chain / fan-out-fan-in / wavefront DAGs vs GCC OpenMP task depend, oneTBB flow::graph and StarPU (apt-get installs libtbb-dev / libstarpu-dev if missing)",
    },
    Bench {
        name: "chip",
        package: "strata-chip",
        target: "chip_throughput",
        what: "empty-kernel tasks through one emulated chip (chain / fan / independent) vs the graph core alone, 1 MiB vector-add bandwidth vs single-core memcpy, and the cost of a run of one kernel",
    },
    Bench {
        name: "comm",
        package: "strata-comm",
        target: "comm_collectives",
        what: "strata-comm alone: 2-rank allreduce latency (8 B, 256 B, 4 KiB) and bandwidth (1 MiB, 64 MiB) per algorithm, ranks as pinned threads, vs a raw ping-pong and memcpy",
    },
    Bench {
        name: "dispatch",
        package: "strata-dist",
        target: "dispatch",
        what: "L3 engine: one-task run round trip to a forked child vs a raw cache-line ping-pong, strata's mailbox, Python multiprocessing and Ray (venv under target/peers); µs per task for chain / fan / wavefront sub-task DAGs (Process and Threads) vs the graph core; init + close vs six forks",
    },
    Bench {
        name: "scale",
        package: "strata-dist",
        target: "scale",
        what: "parallel efficiency of 1..N chips / sub-workers running 1 ms tasks, and the task length at which efficiency reaches 0.9 (METG) for the graph core, a chip and the L3 engine, each next to N bare spinning threads",
    },
    Bench {
        name: "program",
        package: "strata",
        target: "program",
        what: "the execution API: a 64 MiB weight upload staged and from inherited memory vs memcpy; the first dispatch cold vs prewarmed; PreparedWorker::call vs DistWorker::run round trip",
    },
    Bench {
        name: "allreduce",
        package: "strata-dist",
        target: "allreduce",
        what: "2-rank allreduce through L3 (2 forked chips, a loop inside one dispatch): latency 8 B / 256 B / 4 KiB, bandwidth 1 MiB / 64 MiB, vs Open MPI MPI_Allreduce (vader) and single-core memcpy",
    },
    Bench {
        name: "net",
        package: "strata-net",
        target: "net",
        what: "strata-net over loopback: no-op remote task round trip (L4 -> remote L3 -> chip -> back) vs a raw TCP request/response; remote device copy_to / copy_from throughput vs raw TCP streaming; tasks/s with many in flight; then the MPI transport (mpirun -n 2) next to TCP and a raw MPI_Send/MPI_Recv ping-pong and bulk between the same ranks",
    },
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

fn run_step(name: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("\n==> {name}");
    let t = Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("{name}: could not start: {e}"))?;
    eprintln!("<== {name}: {status} in {:.1}s", t.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(format!("{name} failed ({status})"))
    }
}

fn ci() -> Result<(), String> {
    run_step(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--", "--check"]),
    )?;
    run_step(
        "cargo clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // strata-net's launcher tests run `mpirun -n 3 strata-node launch -- ...` (Debian's
    // Open MPI; its `mpi` feature also builds against libopenmpi-dev through libclang) and
    // its namespace tests `ip`, `tc`, `ss` and `iptables`: installed here so a fresh
    // machine has them.
    ensure_test_tools()?;
    run_step(
        "cargo test --workspace",
        cargo().args(["test", "--workspace"]),
    )?;
    mpi_steps()?;
    // Loom models in their own build (cfg(loom) swaps the sync primitives), with bounded
    // preemptions so the step stays within minutes: every crate that has models.
    let mut loom = cargo();
    loom.args(["test", "--release", "--target-dir", "target/loom"]);
    for krate in loom_crates()? {
        loom.args(["-p", &krate]);
    }
    run_step(
        "loom models",
        loom.args(["--lib", "loom"])
            .env("RUSTFLAGS", "--cfg loom")
            .env("LOOM_MAX_PREEMPTIONS", "3"),
    )?;
    run_step(
        "cargo doc",
        cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    // The fuzz harness is its own workspace: format and lint it here, then a smoke run of
    // every target (the long runs are `cargo xtask fuzz all --seconds N` by hand).
    run_step(
        "cargo fmt --check (fuzz)",
        cargo()
            .current_dir(workspace_root().join("fuzz"))
            .args(["fmt", "--all", "--", "--check"]),
    )?;
    run_step(
        "cargo clippy (fuzz)",
        cargo()
            .current_dir(workspace_root().join("fuzz"))
            .env_remove("CARGO_TARGET_DIR")
            .args(["clippy", "--all-targets", "--", "-D", "warnings"]),
    )?;
    fuzz::fuzz(&[
        "all".into(),
        "--seconds".into(),
        CI_FUZZ_SECONDS.to_string(),
    ])?;
    Ok(())
}

/// Bound of the whole MPI step of `cargo xtask ci` (its build included); each mpirun job
/// of the test has its own, shorter bound.
const CI_MPI_BOUND: Duration = Duration::from_secs(20 * 60);

/// strata-net's `mpi` feature (rsmpi against Debian's Open MPI): lints and docs with the
/// feature, then its end-to-end tests under `mpirun -n 3` (tests/mpi.rs), bounded.
fn mpi_steps() -> Result<(), String> {
    let t = Instant::now();
    run_step(
        "cargo clippy -p strata-net --features mpi",
        cargo().args([
            "clippy",
            "-p",
            "strata-net",
            "--all-targets",
            "--features",
            "mpi",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    run_step(
        "cargo doc -p strata-net --features mpi",
        cargo()
            .args(["doc", "-p", "strata-net", "--no-deps", "--features", "mpi"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    let left = CI_MPI_BOUND.saturating_sub(t.elapsed());
    run_step_bounded(
        "cargo test -p strata-net --features mpi --lib --test mpi (mpirun -n 3)",
        cargo().args([
            "test",
            "-p",
            "strata-net",
            "--features",
            "mpi",
            "--lib",
            "--test",
            "mpi",
        ]),
        left,
    )
}

/// [`run_step`] with a bound: past it the step's process group is killed and it fails.
fn run_step_bounded(name: &str, cmd: &mut Command, bound: Duration) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    eprintln!("\n==> {name} (bounded: {}s)", bound.as_secs());
    let t = Instant::now();
    let mut child = cmd
        .process_group(0)
        .spawn()
        .map_err(|e| format!("{name}: could not start: {e}"))?;
    let status = loop {
        match child.try_wait().map_err(|e| format!("{name}: {e}"))? {
            Some(st) => break st,
            None if t.elapsed() > bound => {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                return Err(format!("{name} did not finish within {}s", bound.as_secs()));
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    eprintln!("<== {name}: {status} in {:.1}s", t.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(format!("{name} failed ({status})"))
    }
}

/// Installs the Debian packages strata-net's tests need when they are missing:
/// `openmpi-bin` (`mpirun`: the launcher tests), `libopenmpi-dev` (`mpicc` and the headers
/// the `mpi` feature builds against) and `libclang-dev` (what rsmpi's bindgen loads),
/// `iproute2` (`ip`, `tc`, `ss`) and `iptables` (the network-namespace tests).
fn ensure_test_tools() -> Result<(), String> {
    let runs = |c: &str, arg: &str| {
        Command::new(c)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let installed = |pkg: &str| {
        Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", pkg])
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
    };
    let missing: Vec<&str> = [
        ("mpirun", "--version", "openmpi-bin"),
        ("mpicc", "--showme:version", "libopenmpi-dev"),
        ("ip", "-V", "iproute2"),
        ("ss", "-V", "iproute2"),
        ("iptables", "--version", "iptables"),
    ]
    .into_iter()
    .filter(|(c, arg, _)| !runs(c, arg))
    .map(|(_, _, p)| p)
    .chain(Some("libclang-dev").filter(|p| !installed(p)))
    .fold(Vec::new(), |mut v, p| {
        if !v.contains(&p) {
            v.push(p);
        }
        v
    });
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {} with apt-get", missing.join(" "));
    run_step(
        "apt-get update",
        Command::new("apt-get").args(["update", "-q"]),
    )?;
    run_step(
        "apt-get install",
        Command::new("apt-get")
            .args(["install", "-y", "-q"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Seconds of fuzzing per target in `cargo xtask ci`.
const CI_FUZZ_SECONDS: u64 = 15;

/// The workspace crates that have loom models: a `crates/*` package whose manifest has
/// `[target.'cfg(loom)'.dependencies]` and whose `src/` holds a `#[cfg(all(test, loom))]`
/// module. Found, not listed, so a crate that gains models is checked without editing
/// this file.
fn loom_crates() -> Result<Vec<String>, String> {
    let dir = workspace_root().join("crates");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let manifest = entry.path().join("Cargo.toml");
        let Ok(toml) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        if !toml.contains("[target.'cfg(loom)'.dependencies]") {
            continue;
        }
        if !dir_has_loom_tests(&entry.path().join("src")) {
            continue;
        }
        let name = toml
            .lines()
            .find_map(|l| {
                let v = l.strip_prefix("name")?.trim_start().strip_prefix('=')?;
                Some(v.trim().trim_matches('"').to_owned())
            })
            .ok_or_else(|| format!("{}: no package name", manifest.display()))?;
        found.push(name);
    }
    found.sort();
    if found.is_empty() {
        return Err("no crate with loom models found under crates/".into());
    }
    Ok(found)
}

/// Whether a `.rs` file under `dir` declares loom tests.
fn dir_has_loom_tests(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let p = e.path();
        if p.is_dir() {
            dir_has_loom_tests(&p)
        } else {
            p.extension().is_some_and(|x| x == "rs")
                && std::fs::read_to_string(&p)
                    .is_ok_and(|src| src.contains("#[cfg(all(test, loom))]"))
        }
    })
}

fn bench(name: &str) -> Result<(), String> {
    if name == "list" {
        for b in BENCHES {
            println!("{:<10} {}", b.name, b.what);
        }
        println!();
        println!(
            "Each runs its variants alternately with its peer or floor in rounds and prints each"
        );
        println!(
            "variant's median, the median of the per-round ratios, the CPU model and the load"
        );
        println!("average; its last line is one JSON object.");
        println!("{}", compare::usage());
        println!(
            "  builds <rev> in target/bench-compare/<short-rev> and runs the two builds' bench"
        );
        println!("  alternately (base, head, ...); per JSON figure: both medians, head/base ratio, verdict.");
        return Ok(());
    }
    let b = BENCHES.iter().find(|b| b.name == name).ok_or_else(|| {
        let names: Vec<_> = BENCHES.iter().map(|b| b.name).collect();
        format!("unknown bench {name:?}; known: {}", names.join(", "))
    })?;
    run_step(
        &format!("bench {}", b.name),
        cargo().args(["bench", "-q", "-p", b.package, "--bench", b.target]),
    )?;
    if b.name == "net" {
        // The MPI transport next to TCP and raw MPI, in one mpirun job of its own.
        ensure_test_tools()?;
        run_step(
            "bench net (MPI transport)",
            cargo().args([
                "bench",
                "-q",
                "-p",
                "strata-net",
                "--features",
                "mpi",
                "--bench",
                "net_mpi",
            ]),
        )?;
    }
    Ok(())
}

/// Names of the runnable examples of the facade package, from `examples/*.rs`.
fn examples() -> Result<Vec<String>, String> {
    let dir = workspace_root().join("examples");
    let mut names = vec![];
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let p = entry.map_err(|e| e.to_string())?.path();
        if p.extension().is_some_and(|e| e == "rs") {
            if let Some(stem) = p.file_stem() {
                names.push(stem.to_string_lossy().into_owned());
            }
        }
    }
    names.sort();
    Ok(names)
}

fn draw_bar(done: usize, total: usize, current: &str) {
    const WIDTH: usize = 30;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH);
    eprint!(
        "\r[{}{}] {done}/{total} {:<40}",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        current
    );
    let _ = std::io::stderr().flush();
}

fn sim() -> Result<(), String> {
    let names = examples()?;
    run_step(
        "build examples (release)",
        cargo().args(["build", "--release", "-q", "-p", "strata", "--examples"]),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let bin_dir = target.join("release/examples");
    let mut rows: Vec<(String, Result<String, String>, Duration)> = vec![];
    for (i, name) in names.iter().enumerate() {
        draw_bar(i, names.len(), name);
        let t = Instant::now();
        let out = Command::new(bin_dir.join(name))
            .current_dir(workspace_root())
            .stdin(Stdio::null())
            .output();
        let elapsed = t.elapsed();
        let result = match out {
            Ok(o) if o.status.success() => {
                let stdout = String::from_utf8_lossy(&o.stdout);
                Ok(stdout.lines().last().unwrap_or("ok").trim().to_owned())
            }
            Ok(o) => Err(format!(
                "{}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
                    .trim()
            )),
            Err(e) => Err(format!("could not start: {e}")),
        };
        rows.push((name.clone(), result, elapsed));
    }
    draw_bar(names.len(), names.len(), "done");
    eprintln!();
    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(7).max(7);
    println!("{:<w$}  {:<6}  {:>9}  detail", "example", "result", "time");
    println!("{}", "-".repeat(w + 40));
    let mut failed = 0;
    for (name, result, t) in &rows {
        let (status, detail) = match result {
            Ok(d) => ("ok", d.as_str()),
            Err(e) => {
                failed += 1;
                ("FAILED", e.as_str())
            }
        };
        println!(
            "{name:<w$}  {status:<6}  {:>7.1}ms  {detail}",
            t.as_secs_f64() * 1e3
        );
    }
    println!(
        "{} examples, {} passed, {failed} failed",
        rows.len(),
        rows.len() - failed
    );
    if failed > 0 {
        Err(format!("{failed} example(s) failed"))
    } else {
        Ok(())
    }
}

/// `cargo xtask trace <example>`: the example (release) with `STRATA_TRACE_OUT` pointing
/// under `target/trace/`, then where its pictures are.
fn trace(args: &[String]) -> Result<(), String> {
    let Some(name) = args.first() else {
        return Err(format!(
            "usage: cargo xtask trace <example>; examples: {}",
            examples()?.join(", ")
        ));
    };
    if !examples()?.contains(name) {
        return Err(format!(
            "no example {name:?}; examples: {}",
            examples()?.join(", ")
        ));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let dir = target.join("trace");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let prefix = dir.join(name);
    for ext in ["json", "svg"] {
        let _ = std::fs::remove_file(prefix.with_extension(ext));
    }
    run_step(
        &format!("example {name} (traced)"),
        cargo()
            .args([
                "run",
                "--release",
                "-q",
                "-p",
                "strata",
                "--example",
                name,
                "--",
            ])
            .args(&args[1..])
            .env("STRATA_TRACE_OUT", &prefix),
    )?;
    let mut missing = vec![];
    for ext in ["json", "svg"] {
        let p = prefix.with_extension(ext);
        if p.exists() {
            println!("{}", p.display());
        } else {
            missing.push(p.display().to_string());
        }
    }
    if missing.is_empty() {
        println!("open the .json in https://ui.perfetto.dev (or chrome://tracing), the .svg in a browser");
        Ok(())
    } else {
        Err(format!(
            "example {name} wrote no trace ({}): it dispatches nothing through a prepared worker",
            missing.join(", ")
        ))
    }
}

/// `cargo xtask soak`: the soak binary at full scale (its own defaults are the scaled-down
/// test's), every other argument passed through.
fn soak(args: &[String]) -> Result<(), String> {
    let mut pass: Vec<String> = args.to_vec();
    for (flag, default) in [("--tasks", "1000000"), ("--runs", "10000")] {
        if !pass.iter().any(|a| a == flag) {
            pass.extend([flag.to_owned(), default.to_owned()]);
        }
    }
    run_step(
        "soak (release)",
        cargo()
            .args([
                "test",
                "--release",
                "-q",
                "-p",
                "strata-dist",
                "--test",
                "soak",
                "--",
            ])
            .args(&pass),
    )
}

fn usage() -> String {
    format!(
        "usage: cargo xtask <sim | ci | ci-mpi | soak [--tasks N] [--runs M] | trace <example> | bench <name>|list | bench-compare <rev> <bench> [--rounds N] | fuzz ...>
{}
  {}",
        compare::usage(),
        fuzz::usage()
    )
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("sim") => sim(),
        Some("ci") => ci(),
        Some("ci-mpi") => ensure_test_tools().and_then(|()| mpi_steps()),
        Some("soak") => soak(&args[1..]),
        Some("trace") => trace(&args[1..]),
        Some("bench") => match args.get(1) {
            Some(n) => bench(n),
            None => Err(usage()),
        },
        Some("bench-compare") => compare::bench_compare(&args[1..]),
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        Some("help" | "--help" | "-h") => {
            println!("{}", usage());
            println!("benches (cargo xtask bench list):");
            for b in BENCHES {
                println!("  {:<10} {}", b.name, b.what);
            }
            Ok(())
        }
        _ => Err(usage()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod loom_discovery_tests {
    #[test]
    fn crates_with_loom_models_are_found_and_others_are_not() {
        let found = super::loom_crates().unwrap();
        for krate in [
            "strata-sync",
            "strata-mailbox",
            "strata-graph",
            "strata-comm",
        ] {
            assert!(
                found.iter().any(|c| c == krate),
                "{krate} missing from {found:?}"
            );
        }
        assert!(!found.iter().any(|c| c == "strata-types"), "{found:?}");
    }
}
