//! `src/LIFE_OF_A_TASK.md` names a file and a function for every step of a dispatch; this
//! test keeps it true: every file it names exists, and defines the function it names (for
//! `Type::method`, a `fn method` in that file).

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("strata-dist lives two levels below the workspace root")
        .to_path_buf()
}

/// The backticked spans of one table row, in order.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// Whether `source` defines a function named `name` (any visibility, generic or not).
fn defines_fn(source: &str, name: &str) -> bool {
    source.match_indices("fn ").any(|(i, _)| {
        let rest = &source[i + 3..];
        rest.starts_with(name)
            && rest[name.len()..]
                .chars()
                .next()
                .is_some_and(|c| c == '(' || c == '<')
    })
}

#[test]
fn every_step_names_a_file_and_a_function_that_exist() {
    let root = workspace_root();
    let page = root.join("crates/strata-dist/src/LIFE_OF_A_TASK.md");
    let text = std::fs::read_to_string(&page).expect("the page exists");
    let mut steps = 0;
    let mut stale = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | step | where | what | `file` | `function` |
        if cells.len() != 7 || cells[1].parse::<u32>().is_err() {
            continue;
        }
        steps += 1;
        let (file, function) = match (code_spans(cells[4]).first(), code_spans(cells[5]).first()) {
            (Some(f), Some(g)) => (*f, *g),
            _ => {
                stale.push(format!("step {}: no `file` / `function` cell", cells[1]));
                continue;
            }
        };
        let Ok(source) = std::fs::read_to_string(root.join(file)) else {
            stale.push(format!("step {}: {file} does not exist", cells[1]));
            continue;
        };
        let name = function.rsplit("::").next().unwrap_or(function);
        if !defines_fn(&source, name) {
            stale.push(format!("step {}: {file} defines no fn {name}", cells[1]));
        }
    }
    assert!(
        steps >= 40,
        "the page lost its step tables ({steps} steps found)"
    );
    assert!(
        stale.is_empty(),
        "LIFE_OF_A_TASK.md is out of date:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_checker_sees_a_missing_function() {
    assert!(defines_fn(
        "pub(crate) fn poll_lanes(&mut self)",
        "poll_lanes"
    ));
    assert!(defines_fn("fn drive<R>(&self)", "drive"));
    assert!(!defines_fn("fn poll_lanes_all(&mut self)", "poll_lanes"));
    assert!(!defines_fn("// poll_lanes", "poll_lanes"));
}
