//! `cargo xtask bench-compare <rev> <bench>`: the named bench of an older revision and of
//! this working tree, run interleaved on the same machine, figure by figure.
//!
//! Each bench prints one flat JSON object as its last line. Both binaries are built first
//! (`<rev>` in a git worktree under `target/bench-compare/<short-rev>`, with its own
//! target directory, reused by later comparisons), then run alternately — base, head,
//! base, head … — so a drift of the machine (vCPU placement, other tenants) hits both
//! sides alike; each figure's verdict is taken from the per-round ratios head / base.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::{cargo, workspace_root, Bench, BENCHES};

/// Rounds when `--rounds` is not given.
pub const DEFAULT_ROUNDS: usize = 3;

/// A figure is within noise when the per-round ratios head / base straddle 1 or their
/// median is within this fraction of 1.
pub const NOISE: f64 = 0.10;

/// The rule, as printed beside the verdicts.
pub fn noise_rule() -> String {
    format!(
        "within noise = the per-round ratios head/base span 1.0 (min <= 1 <= max) or their median is within {:.0}% of 1; otherwise slower / faster (rates — gbps, per_s — and copy_…_ratio figures are higher-is-better, all others lower-is-better)",
        NOISE * 100.0
    )
}

// ----- a flat JSON object ---------------------------------------------------------------

/// A value of a bench's JSON line; only numbers are compared.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number (also `NaN` / `Infinity`, which older benches print).
    Num(f64),
    /// `null`, a string, a boolean, an array or an object.
    Other,
}

/// The top-level fields of one JSON object, in order; `None` if `line` is not one.
pub fn parse_object(line: &str) -> Option<Vec<(String, Value)>> {
    let mut p = Parser {
        s: line.trim().as_bytes(),
        i: 0,
    };
    let fields = p.object()?;
    p.ws();
    (p.i == p.s.len()).then_some(fields)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.s.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    fn object(&mut self) -> Option<Vec<(String, Value)>> {
        self.eat(b'{')?;
        let mut out = Vec::new();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Some(out);
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            out.push((key, self.value()?));
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(out);
                }
                _ => return None,
            }
        }
    }

    fn string(&mut self) -> Option<String> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        loop {
            let c = *self.s.get(self.i)?;
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let e = *self.s.get(self.i)?;
                    self.i += 1;
                    match e {
                        b'u' => {
                            let hex = std::str::from_utf8(self.s.get(self.i..self.i + 4)?).ok()?;
                            self.i += 4;
                            let ch =
                                char::from_u32(u32::from_str_radix(hex, 16).ok()?).unwrap_or('?');
                            out.extend_from_slice(ch.to_string().as_bytes());
                        }
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'b' | b'f' => {}
                        other => out.push(other),
                    }
                }
                c => out.push(c),
            }
        }
    }

    fn value(&mut self) -> Option<Value> {
        match self.peek()? {
            b'"' => self.string().map(|_| Value::Other),
            b'{' => self.object().map(|_| Value::Other),
            b'[' => {
                self.i += 1;
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Some(Value::Other);
                }
                loop {
                    self.value()?;
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Some(Value::Other);
                        }
                        _ => return None,
                    }
                }
            }
            _ => {
                let start = self.i;
                while self
                    .s
                    .get(self.i)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || b"+-.".contains(c))
                {
                    self.i += 1;
                }
                let word = std::str::from_utf8(&self.s[start..self.i]).ok()?;
                match word {
                    "null" | "true" | "false" => Some(Value::Other),
                    "NaN" => Some(Value::Num(f64::NAN)),
                    "Infinity" => Some(Value::Num(f64::INFINITY)),
                    "-Infinity" => Some(Value::Num(f64::NEG_INFINITY)),
                    w => w.parse::<f64>().ok().map(Value::Num),
                }
            }
        }
    }
}

// ----- statistics and verdicts -----------------------------------------------------------

/// The median of the finite values (NaN if there are none).
pub fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Whether a larger value of the figure is better: rates (bandwidths, `gbps`; tasks per
/// second, `per_s`) and a copy's throughput against its floor (`copy_…_ratio`).
pub fn higher_is_better(key: &str) -> bool {
    key.contains("gbps")
        || key.contains("per_s")
        || (key.starts_with("copy_") && key.ends_with("_ratio"))
}

/// The comparison of one figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The JSON key.
    pub key: String,
    /// Per-round values of the base and the head build.
    pub base: Vec<f64>,
    /// See `base`.
    pub head: Vec<f64>,
}

impl Figure {
    /// Ratios head / base of the rounds where both are finite and base is not zero.
    pub fn ratios(&self) -> Vec<f64> {
        self.base
            .iter()
            .zip(&self.head)
            .filter(|(b, h)| b.is_finite() && h.is_finite() && **b != 0.0)
            .map(|(b, h)| h / b)
            .collect()
    }

    /// `within noise`, `slower`, `faster`, or `no data`, by [`noise_rule`].
    pub fn verdict(&self) -> &'static str {
        let r = self.ratios();
        if r.is_empty() {
            return "no data";
        }
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let m = median(&r);
        if (lo <= 1.0 && 1.0 <= hi) || (m - 1.0).abs() < NOISE {
            "within noise"
        } else if (m > 1.0) == higher_is_better(&self.key) {
            "faster"
        } else {
            "slower"
        }
    }
}

/// The figures to compare: numeric keys present in every run of both sides, in the head's
/// order, without the machine description (`machine_*`) and round counts (`rounds`,
/// `rounds_*`). Also the keys only one side
/// has.
pub fn figures(
    base: &[Vec<(String, Value)>],
    head: &[Vec<(String, Value)>],
) -> (Vec<Figure>, Vec<String>, Vec<String>) {
    let skip = |k: &str| k.starts_with("machine_") || k == "rounds" || k.starts_with("rounds_");
    let numeric = |run: &[(String, Value)], k: &str| -> Option<f64> {
        run.iter().find(|(key, _)| key == k).map(|(_, v)| match v {
            Value::Num(x) => *x,
            Value::Other => f64::NAN,
        })
    };
    let keys_of = |runs: &[Vec<(String, Value)>]| -> Vec<String> {
        runs.first()
            .map(|r| {
                r.iter()
                    .map(|(k, _)| k.clone())
                    .filter(|k| !skip(k))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (bk, hk) = (keys_of(base), keys_of(head));
    let mut out = Vec::new();
    for k in hk.iter().filter(|k| bk.contains(k)) {
        let col = |runs: &[Vec<(String, Value)>]| -> Option<Vec<f64>> {
            runs.iter().map(|r| numeric(r, k)).collect()
        };
        if let (Some(b), Some(h)) = (col(base), col(head)) {
            out.push(Figure {
                key: k.clone(),
                base: b,
                head: h,
            });
        }
    }
    let only_base = bk.iter().filter(|k| !hk.contains(k)).cloned().collect();
    let only_head = hk.iter().filter(|k| !bk.contains(k)).cloned().collect();
    (out, only_base, only_head)
}

// ----- building and running ----------------------------------------------------------------

fn git(args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// `target/bench-compare/<short>`: a detached git worktree of `rev`, created if absent.
fn base_tree(rev: &str) -> Result<(String, PathBuf), String> {
    let sha = git(&[
        "rev-parse",
        "--verify",
        "--quiet",
        &format!("{rev}^{{commit}}"),
    ])
    .map_err(|_| format!("revision {rev:?} not found in this repository"))?;
    let short = git(&["rev-parse", "--short=9", &sha])?;
    let dir = workspace_root().join("target/bench-compare").join(&short);
    let present = dir.join("Cargo.toml").exists()
        && Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&dir)
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == sha);
    if present {
        eprintln!("base {short}: reusing the worktree {}", dir.display());
    } else {
        if dir.exists() {
            return Err(format!(
                "{} exists but is not a worktree of {short}; remove it (and run `git worktree prune`)",
                dir.display()
            ));
        }
        // A worktree whose directory was deleted by hand is still registered; forget it.
        let _ = git(&["worktree", "prune"]);
        let d = dir.to_string_lossy().into_owned();
        git(&["worktree", "add", "--detach", &d, &sha])
            .map_err(|e| format!("git worktree add {d} {short} failed: {e}"))?;
    }
    Ok((short, dir))
}

/// Builds the bench target in the workspace at `root` (with `own_target`, in its own
/// `target/` whatever `CARGO_TARGET_DIR` says), returning the bench executable.
fn build(side: &str, root: &Path, own_target: bool, b: &Bench) -> Result<PathBuf, String> {
    let mut cmd = cargo();
    if own_target {
        cmd.env_remove("CARGO_TARGET_DIR");
    }
    cmd.current_dir(root)
        .args([
            "bench",
            "--no-run",
            "-q",
            "-p",
            b.package,
            "--bench",
            b.target,
            "--message-format=json",
        ])
        .stderr(Stdio::inherit());
    eprintln!(
        "\n==> build {side}: cargo bench --no-run -p {} --bench {} (in {})",
        b.package,
        b.target,
        root.display()
    );
    let t = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| format!("build {side}: could not run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "build {side} failed ({}): see the compiler output above",
            out.status
        ));
    }
    let exe = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.contains("\"reason\":\"compiler-artifact\"")
                && l.contains("\"kind\":[\"bench\"]")
                && l.contains(&format!("\"name\":\"{}\"", b.target))
        })
        .find_map(|l| {
            let rest = &l[l.find("\"executable\":\"")? + 14..];
            Some(PathBuf::from(&rest[..rest.find('"')?]))
        })
        .ok_or_else(|| {
            format!(
                "build {side}: cargo built no bench target {:?} in package {} (does this revision have it?)",
                b.target, b.package
            )
        })?;
    eprintln!(
        "<== build {side}: {} in {:.1}s",
        exe.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(exe)
}

/// The package directory of `b` in the workspace at `root` (benches run there, as under
/// `cargo bench`).
fn package_dir(root: &Path, b: &Bench) -> PathBuf {
    let d = root.join("crates").join(b.package);
    if d.is_dir() {
        d
    } else {
        root.to_path_buf()
    }
}

/// Runs one bench binary; its JSON last line, and the log kept under `logs`.
fn run_once(
    side: &str,
    round: usize,
    exe: &Path,
    cwd: &Path,
    logs: &Path,
    bench: &str,
) -> Result<Vec<(String, Value)>, String> {
    let t = Instant::now();
    let out = Command::new(exe)
        .arg("--bench")
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{side}: could not run {}: {e}", exe.display()))?;
    let log = logs.join(format!("{bench}-{side}-{round}.txt"));
    let mut text = out.stdout.clone();
    text.extend_from_slice(b"\n--- stderr ---\n");
    text.extend_from_slice(&out.stderr);
    let _ = std::fs::write(&log, &text);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "    round {round} {side:<4}: {} in {:.1}s (log {})",
        out.status,
        t.elapsed().as_secs_f64(),
        log.display()
    );
    if !out.status.success() {
        return Err(format!(
            "{side} bench failed in round {round} ({}); its output is in {}",
            out.status,
            log.display()
        ));
    }
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    parse_object(last).ok_or_else(|| {
        format!(
            "{side} bench (round {round}): its last line is not a JSON object: {last:?} (log {})",
            log.display()
        )
    })
}

fn machine_line() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!("{model}; load average {}", load.join(" "))
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        "null".into()
    }
}

fn json_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `cargo xtask bench-compare <rev> <bench> [--rounds N]`.
pub fn bench_compare(args: &[String]) -> Result<(), String> {
    let mut rounds = DEFAULT_ROUNDS;
    let mut pos = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rounds" | "-n" => {
                let v = it.next().ok_or("--rounds needs a number")?;
                rounds = v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| format!("--rounds {v:?}: not a positive number"))?;
            }
            s if s.starts_with("--rounds=") => {
                let v = &s["--rounds=".len()..];
                rounds = v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| format!("--rounds {v:?}: not a positive number"))?;
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s:?}\n{}", usage())),
            s => pos.push(s.to_owned()),
        }
    }
    let [rev, name] = &pos[..] else {
        return Err(usage());
    };
    let b = BENCHES.iter().find(|b| b.name == name).ok_or_else(|| {
        let names: Vec<_> = BENCHES.iter().map(|b| b.name).collect();
        format!("unknown bench {name:?}; known: {}", names.join(", "))
    })?;
    let (short, base_dir) = base_tree(rev)?;
    let head_label = {
        let sha = git(&["rev-parse", "--short=9", "HEAD"])?;
        let dirty = !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
        if dirty {
            format!("{sha}+changes")
        } else {
            sha
        }
    };
    let base_exe = build(&format!("base {short}"), &base_dir, true, b)?;
    let head_exe = build(&format!("head {head_label}"), &workspace_root(), false, b)?;
    let logs = workspace_root().join("target/bench-compare/logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;

    let machine_start = machine_line();
    eprintln!(
        "\n==> bench-compare {name}: base {short} vs head {head_label}, {rounds} rounds (base, head, base, head, ...)"
    );
    eprintln!("    machine: {machine_start}");
    let started = Instant::now();
    let (mut base_runs, mut head_runs) = (Vec::new(), Vec::new());
    for r in 1..=rounds {
        base_runs.push(run_once(
            "base",
            r,
            &base_exe,
            &package_dir(&base_dir, b),
            &logs,
            name,
        )?);
        head_runs.push(run_once(
            "head",
            r,
            &head_exe,
            &package_dir(&workspace_root(), b),
            &logs,
            name,
        )?);
    }
    let machine_end = machine_line();
    let (figs, only_base, only_head) = figures(&base_runs, &head_runs);
    if figs.is_empty() {
        return Err(format!(
            "base and head share no numeric figure (base keys only: {only_base:?}; head keys only: {only_head:?})"
        ));
    }

    println!();
    println!("bench-compare {name}: base {short} vs head {head_label}; {rounds} rounds, base and head alternating; {:.0} s", started.elapsed().as_secs_f64());
    println!("machine at start: {machine_start}");
    println!("machine at end:   {machine_end}");
    println!("{}", noise_rule());
    let w = figs.iter().map(|f| f.key.len()).max().unwrap_or(6).max(6);
    println!(
        "{:<w$} {:>12} {:>12} {:>10} {:>17}  verdict",
        "figure", "base median", "head median", "head/base", "ratio min-max"
    );
    let mut json = Vec::new();
    for f in &figs {
        let r = f.ratios();
        let (lo, hi) = (
            r.iter().copied().fold(f64::INFINITY, f64::min),
            r.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        );
        let (bm, hm, rm) = (median(&f.base), median(&f.head), median(&r));
        println!(
            "{:<w$} {bm:>12.4} {hm:>12.4} {rm:>10.3} {:>17}  {}",
            f.key,
            if r.is_empty() {
                "-".to_owned()
            } else {
                format!("{lo:.3}-{hi:.3}")
            },
            f.verdict()
        );
        json.push(format!(
            "{}: {{\"base\": {}, \"head\": {}, \"ratio\": {}, \"ratio_min\": {}, \"ratio_max\": {}, \"verdict\": {}}}",
            json_str(&f.key),
            json_num(bm),
            json_num(hm),
            json_num(rm),
            json_num(if r.is_empty() { f64::NAN } else { lo }),
            json_num(if r.is_empty() { f64::NAN } else { hi }),
            json_str(f.verdict())
        ));
    }
    if !only_base.is_empty() {
        println!("only in base (not compared): {}", only_base.join(", "));
    }
    if !only_head.is_empty() {
        println!("only in head (not compared): {}", only_head.join(", "));
    }
    let count = |v: &str| figs.iter().filter(|f| f.verdict() == v).count();
    println!(
        "{} figures: {} within noise, {} slower, {} faster",
        figs.len(),
        count("within noise"),
        count("slower"),
        count("faster")
    );
    let list = |v: &[String]| v.iter().map(|k| json_str(k)).collect::<Vec<_>>().join(", ");
    println!(
        "{{\"bench\": {}, \"base\": {}, \"head\": {}, \"rounds\": {rounds}, \"noise_rule\": {}, \"machine_start\": {}, \"machine_end\": {}, \"figures\": {{{}}}, \"only_base\": [{}], \"only_head\": [{}]}}",
        json_str(name),
        json_str(&short),
        json_str(&head_label),
        json_str(&noise_rule()),
        json_str(&machine_start),
        json_str(&machine_end),
        json.join(", "),
        list(&only_base),
        list(&only_head)
    );
    Ok(())
}

/// The command line of `bench-compare`.
pub fn usage() -> String {
    format!(
        "usage: cargo xtask bench-compare <rev> <bench> [--rounds N]   (N default {DEFAULT_ROUNDS}; `cargo xtask bench list` names the benches)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &str) -> Vec<(String, Value)> {
        parse_object(line).expect("a JSON object")
    }

    #[test]
    fn parses_flat_and_nested_objects_and_old_nan() {
        let f =
            run(r#"{"a": 1.5, "b": NaN, "c": null, "s": "x\"y", "o": {"k": [1, 2]}, "e": -2e3}"#);
        let keys: Vec<&str> = f.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c", "s", "o", "e"]);
        assert_eq!(f[0].1, Value::Num(1.5));
        assert!(matches!(f[1].1, Value::Num(x) if x.is_nan()));
        assert_eq!(f[2].1, Value::Other);
        assert_eq!(f[5].1, Value::Num(-2000.0));
        assert!(parse_object("total bench time 3.1 s").is_none());
        assert!(parse_object(r#"{"a": 1} trailing"#).is_none());
        assert_eq!(parse_object("{}"), Some(vec![]));
    }

    #[test]
    fn compares_the_keys_both_sides_have_skipping_the_machine() {
        let base = vec![
            run(r#"{"x_us": 2.0, "old": 1}"#),
            run(r#"{"x_us": 4.0, "old": 1}"#),
        ];
        let head = vec![
            run(r#"{"x_us": 2.2, "new": 1, "rounds": 5, "machine_load_1m": 0.5}"#),
            run(r#"{"x_us": 4.4, "new": 1, "rounds": 5, "machine_load_1m": 0.7}"#),
        ];
        let (figs, only_base, only_head) = figures(&base, &head);
        assert_eq!(figs.len(), 1);
        assert_eq!(figs[0].key, "x_us");
        assert_eq!(figs[0].base, vec![2.0, 4.0]);
        assert_eq!(only_base, vec!["old".to_owned()]);
        assert_eq!(only_head, vec!["new".to_owned()]);
    }

    #[test]
    fn verdicts_follow_the_noise_rule_and_the_figure_direction() {
        let fig = |key: &str, base: &[f64], head: &[f64]| Figure {
            key: key.into(),
            base: base.to_vec(),
            head: head.to_vec(),
        };
        // 20 % more time in every round: slower.
        assert_eq!(
            fig("t_us", &[1.0, 2.0, 1.0], &[1.2, 2.4, 1.2]).verdict(),
            "slower"
        );
        // 20 % more bandwidth: faster.
        assert_eq!(
            fig("bw_gbps", &[1.0, 2.0, 1.0], &[1.2, 2.4, 1.2]).verdict(),
            "faster"
        );
        // More tasks per second, and a copy nearer its floor: faster, too.
        assert_eq!(
            fig("tasks_per_s_1", &[1.0; 3], &[1.3; 3]).verdict(),
            "faster"
        );
        assert_eq!(
            fig("copy_to_ratio", &[0.8; 3], &[0.9; 3]).verdict(),
            "faster"
        );
        assert_eq!(fig("rtt_ratio", &[2.0; 3], &[2.5; 3]).verdict(), "slower");
        // 5 % more time: within the 10 % band.
        assert_eq!(fig("t_us", &[1.0; 3], &[1.05; 3]).verdict(), "within noise");
        // Ratios 0.7 and 1.4 straddle 1: within noise although the median is 1.4.
        assert_eq!(
            fig("t_us", &[1.0; 3], &[0.7, 1.4, 1.4]).verdict(),
            "within noise"
        );
        // Only missing values: no data.
        assert_eq!(fig("t_us", &[f64::NAN], &[1.0]).verdict(), "no data");
    }
}
