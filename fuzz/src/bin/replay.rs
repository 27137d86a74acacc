//! Runs inputs through the fuzz targets without libFuzzer: `replay <target> <path>...`
//! (files, or directories of files). A crash aborts the process as it would under the
//! fuzzer; otherwise it prints how many inputs ran. Used to check a regression seed and
//! to replay the corpus where the instrumented build is not wanted.

use std::path::Path;

fn inputs(path: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            inputs(&e, out)?;
        }
    } else if path.is_file() {
        out.push(path.to_path_buf());
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((target, paths)) = args.split_first() else {
        eprintln!(
            "usage: replay <target> <path>...; targets: {}",
            strata_fuzz::TARGETS.join(", ")
        );
        return std::process::ExitCode::FAILURE;
    };
    let mut files = Vec::new();
    for p in paths {
        if let Err(e) = inputs(Path::new(p), &mut files) {
            eprintln!("replay: {p}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    for f in &files {
        let data = match std::fs::read(f) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("replay: {}: {e}", f.display());
                return std::process::ExitCode::FAILURE;
            }
        };
        if !strata_fuzz::run_target(target, &data) {
            eprintln!("replay: unknown target {target:?}");
            return std::process::ExitCode::FAILURE;
        }
    }
    println!("replay {target}: {} inputs, no crash", files.len());
    std::process::ExitCode::SUCCESS
}
