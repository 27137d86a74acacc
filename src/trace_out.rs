//! `STRATA_TRACE_OUT=<path prefix>`: every dispatch of this process is traced (spans at
//! every level and the chips' core records) and the traces of all of them are written, on
//! one clock, as `<prefix>.json` (Chrome / Perfetto trace events) and `<prefix>.svg` (a
//! swimlane picture) each time a prepared worker closes. `cargo xtask trace <example>`
//! runs an example this way; a user can do the same with any program.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use strata_types::trace::Trace;
use strata_types::CallConfig;

/// The environment variable naming the output's path prefix.
pub const TRACE_OUT_ENV: &str = "STRATA_TRACE_OUT";

/// Most spans and core records kept over all dispatches (later ones are counted as
/// dropped), so a long loop under `STRATA_TRACE_OUT` stays bounded in memory and its
/// files stay loadable.
const MAX_EVENTS: usize = 500_000;

fn prefix() -> Option<&'static PathBuf> {
    static P: OnceLock<Option<PathBuf>> = OnceLock::new();
    P.get_or_init(|| {
        std::env::var_os(TRACE_OUT_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .as_ref()
}

fn collected() -> &'static Mutex<Trace> {
    static T: OnceLock<Mutex<Trace>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(Trace::default()))
}

/// `config` as a dispatch runs it: traced, with core records, under `STRATA_TRACE_OUT`.
pub(crate) fn config(config: &CallConfig) -> CallConfig {
    if prefix().is_some() {
        config.clone().with_trace(true).with_swimlane(true)
    } else {
        config.clone()
    }
}

/// Whether dispatches are collected.
pub(crate) fn enabled() -> bool {
    prefix().is_some()
}

/// Adds a finished dispatch's trace to the collection.
pub(crate) fn record(t: Trace) {
    if prefix().is_none() {
        return;
    }
    let mut all = collected().lock().unwrap_or_else(|e| e.into_inner());
    all.absorb(t, strata_types::trace::ClockSync::SAME_HOST, "");
    if all.span_count() + all.record_count() > MAX_EVENTS {
        all.truncate_events(MAX_EVENTS);
        all.note(format!(
            "{TRACE_OUT_ENV}: more than {MAX_EVENTS} spans and records; later ones were dropped"
        ));
    }
}

/// Writes the collection so far (a worker closed). A failure to write is reported on
/// stderr, never as the program's error: the trace is a by-product of the run.
pub(crate) fn flush() {
    let Some(prefix) = prefix() else {
        return;
    };
    let (json, svg) = {
        let all = collected().lock().unwrap_or_else(|e| e.into_inner());
        if all.is_empty() {
            return;
        }
        (all.to_chrome_json(), all.to_swimlane_svg())
    };
    for (ext, text) in [("json", json), ("svg", svg)] {
        let mut path = prefix.clone().into_os_string();
        path.push(".");
        path.push(ext);
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!(
                "strata: {TRACE_OUT_ENV}: cannot write {}: {e}",
                PathBuf::from(path).display()
            );
        }
    }
}
