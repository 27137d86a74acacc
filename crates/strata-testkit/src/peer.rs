//! What the benches' peers share: installing a Debian package, building a peer program
//! from a source file in the repository, a Python virtual environment under `target/`,
//! and running a peer once and reading its figures.
//!
//! A peer that cannot be had is not an error of the bench: every function here returns
//! `Err(reason)`, the bench prints the reason and writes `null` for the peer's figures.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Whether this process runs as root (then `apt-get` runs directly, else through `sudo -n`).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `cmd arg` starts and exits 0 (its output discarded).
pub fn runs_ok(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn apt(args: &[&str]) -> Result<(), String> {
    let mut c = if is_root() {
        Command::new("apt-get")
    } else {
        let mut c = Command::new("sudo");
        c.args(["-n", "apt-get"]);
        c
    };
    let out = c
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run apt-get: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "apt-get {} failed: {}",
            args.join(" "),
            err.lines().last().unwrap_or("").trim()
        ))
    }
}

/// Makes sure a peer's Debian packages are installed: nothing happens when `present()`
/// already holds; otherwise `apt-get install -y --no-install-recommends <packages>`
/// (after `apt-get update` if the first attempt fails), non-interactively, saying so on
/// stdout. `Err` says why the peer is missing.
pub fn ensure_apt(what: &str, packages: &[&str], present: impl Fn() -> bool) -> Result<(), String> {
    if present() {
        return Ok(());
    }
    if !runs_ok("apt-get", &["--version"]) {
        return Err(format!(
            "{what}: not installed and no apt-get here (install {} by hand)",
            packages.join(" ")
        ));
    }
    println!(
        "{what}: not found; installing {} with apt-get (non-interactive) ...",
        packages.join(" ")
    );
    let mut install = vec!["install", "-y", "-q", "--no-install-recommends"];
    install.extend_from_slice(packages);
    if apt(&install).is_err() {
        apt(&["update", "-q"])?;
        apt(&install)?;
    }
    if present() {
        println!("{what}: installed");
        Ok(())
    } else {
        Err(format!(
            "{what}: installed {}, but it is still not usable",
            packages.join(" ")
        ))
    }
}

/// Whether `pkg-config` knows `module`.
pub fn pkg_config_has(module: &str) -> bool {
    runs_ok("pkg-config", &["--exists", module])
}

/// `pkg-config --cflags --libs <module>`, split into arguments.
pub fn pkg_config_flags(module: &str) -> Result<Vec<String>, String> {
    let out = Command::new("pkg-config")
        .args(["--cflags", "--libs", module])
        .output()
        .map_err(|e| format!("could not run pkg-config: {e}"))?;
    if !out.status.success() {
        return Err(format!("pkg-config does not know {module}"));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect())
}

/// The directory the running bench's peers are built in: `<target>/<profile>/peers/<name>`
/// (the bench binary lives in `<target>/<profile>/deps/`), created if needed.
pub fn peer_dir(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    let dir = profile.join("peers").join(name);
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// The target directory (`<target>`, the parent of the profile directory).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir)
}

/// Compiles one C or C++ source file into `<peer_dir(name)>/<name>`:
/// `<compiler> -O2 <flags before> -o <exe> <src> <flags after>`. Rebuilt every time (a
/// second or two), so an edited source is never stale.
pub fn build_program(
    name: &str,
    compiler: &str,
    before: &[&str],
    src: &Path,
    after: &[String],
) -> Result<PathBuf, String> {
    let exe = peer_dir(name).join(name);
    let out = Command::new(compiler)
        .arg("-O2")
        .args(before)
        .arg("-o")
        .arg(&exe)
        .arg(src)
        .args(after)
        .output()
        .map_err(|e| format!("{name}: could not run {compiler}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{name}: `{compiler} {}` failed: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .take(5)
                .collect::<Vec<_>>()
                .join(" / ")
        ));
    }
    Ok(exe)
}

/// Runs a peer once and returns its standard output, or why it failed (its exit status
/// and the last line of its standard error).
pub fn run_peer(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not start {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{:?} exited with {}: {}",
            cmd.get_program(),
            out.status,
            err.lines().last().unwrap_or("").trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The whitespace-separated numbers on the last non-empty line of `out`.
pub fn last_line_numbers(out: &str) -> Vec<f64> {
    out.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse::<f64>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `key value` lines of `out` whose value is a number, in order (later keys win).
///
/// ```
/// let kv = strata_testkit::peer::key_values("rtt_us 12.5\nnoise\nchain_us 3\n");
/// assert_eq!(kv.get("rtt_us"), Some(&12.5));
/// assert_eq!(kv.get("chain_us"), Some(&3.0));
/// ```
pub fn key_values(out: &str) -> std::collections::BTreeMap<String, f64> {
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (k, v) = (w.next()?, w.next()?.parse::<f64>().ok()?);
            w.next().is_none().then(|| (k.to_owned(), v))
        })
        .collect()
}

/// A Python virtual environment under `<target>/peers/venv-<name>` with `packages`
/// installed by pip (from PyPI), created on first use; `check` is a Python statement that
/// succeeds once the packages are usable (e.g. `import ray`). Returns the venv's
/// `python`. The base interpreter is `$STRATA_PYTHON`, else `python3`.
pub fn python_venv(name: &str, packages: &[&str], check: &str) -> Result<PathBuf, String> {
    let dir = target_dir().join("peers").join(format!("venv-{name}"));
    let py = dir.join("bin/python");
    let usable = |py: &Path| {
        Command::new(py)
            .args(["-c", check])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if usable(&py) {
        return Ok(py);
    }
    let base = std::env::var("STRATA_PYTHON").unwrap_or_else(|_| "python3".into());
    if !py.exists() {
        println!("{name}: creating a Python venv in {} ...", dir.display());
        let _ = std::fs::create_dir_all(dir.parent().expect("parent"));
        run_peer(Command::new(&base).args(["-m", "venv"]).arg(&dir))
            .map_err(|e| format!("{name}: `{base} -m venv` failed ({e}); Debian: python3-venv"))?;
    }
    println!(
        "{name}: pip install {} into {} (once; may take minutes) ...",
        packages.join(" "),
        dir.display()
    );
    run_peer(
        Command::new(&py)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(packages),
    )
    .map_err(|e| format!("{name}: pip install {} failed: {e}", packages.join(" ")))?;
    if usable(&py) {
        Ok(py)
    } else {
        Err(format!(
            "{name}: installed {} but `{check}` still fails",
            packages.join(" ")
        ))
    }
}
