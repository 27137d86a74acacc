//! Every example of `examples/` runs to completion and reports `ok:` — the same check as
//! `cargo xtask sim`, here on the debug build `cargo test` makes of them, so the examples
//! the README points at are part of the test suite.
//!
//! `harness = false`: one process, the examples one after another (several of them fork
//! trees of their own), each bounded by a deadline after which it is killed.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(300);

fn main() -> ExitCode {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    // `cargo test` builds the examples next to this test's directory: target/<profile>/examples.
    let bins = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("examples")))
        .expect("the test binary lives in target/<profile>/deps");
    let mut names: Vec<String> = std::fs::read_dir(&src)
        .expect("examples/ exists")
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "rs").then(|| p.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect();
    names.sort();
    let mut failed = Vec::new();
    for name in &names {
        let start = Instant::now();
        let outcome = fresh(&src.join(format!("{name}.rs")), &bins.join(name))
            .and_then(|()| run(&bins.join(name)));
        match &outcome {
            Ok(line) => println!("example {name} ... ok ({:.2?}): {line}", start.elapsed()),
            Err(e) => println!(
                "example {name} ... FAILED ({:.2?})\n    {e}",
                start.elapsed()
            ),
        }
        if outcome.is_err() {
            failed.push(name.clone());
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed: {failed:?}",
        if failed.is_empty() { "ok" } else { "FAILED" },
        names.len() - failed.len(),
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `cargo test` (all targets) builds the examples before this test runs; `cargo test
/// --test examples` alone does not, so a missing or older binary is reported as such
/// rather than run.
fn fresh(src: &std::path::Path, bin: &std::path::Path) -> Result<(), String> {
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified());
    let hint = "run `cargo test` for every target, or `cargo build --examples` first";
    match (modified(src), modified(bin)) {
        (_, Err(_)) => Err(format!("{} is not built: {hint}", bin.display())),
        (Ok(s), Ok(b)) if s > b => Err(format!(
            "{} is older than its source: {hint}",
            bin.display()
        )),
        _ => Ok(()),
    }
}

/// Runs one example binary; its last stdout line must start with `ok:`.
fn run(bin: &std::path::Path) -> Result<String, String> {
    let mut child = Command::new(bin)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break st;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("no exit within {DEADLINE:?}; killed"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    let last = out.lines().last().unwrap_or("").to_owned();
    if status.success() && last.starts_with("ok:") {
        Ok(last)
    } else {
        Err(format!(
            "exit {status}, last line {last:?}, stderr: {}",
            err.trim()
        ))
    }
}
