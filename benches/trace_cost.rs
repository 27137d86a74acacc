//! `cargo xtask bench trace`: what tracing costs a level-3 dispatch (`harness = false`).
//!
//! One small program (two `Process`-mode chips, one no-op chip task each) is dispatched
//! under four settings, each in a fresh process (a global `tracing` subscriber cannot be
//! taken back), alternated in rounds:
//!
//! - **no subscriber**: nothing listens, the dispatch is not traced (the default; baseline);
//! - **subscriber, strata off**: a subscriber is installed but does not listen to strata's
//!   targets (a user logging their own crate) — what `tracing`'s callsites cost;
//! - **traced**: `CallConfig::with_trace(true)`, no subscriber — every level records its
//!   spans and the chips send theirs back with the completion;
//! - **subscriber, strata on**: a subscriber listens to everything (no-op sink): runs are
//!   traced and every span is also emitted as a `tracing` event.
//!
//! A figure is the median per-dispatch time of one process's dispatches; a ratio is the
//! median over rounds of the per-round ratio to the baseline. Prints a table, then one
//! JSON line.

use std::process::Command;
use std::time::Instant;
use strata::prelude::*;
use strata_testkit::bench::{median, Json, Machine, Rounds};
use tracing::subscriber::Interest;
use tracing::{span, Event, Metadata, Subscriber};

const ROUNDS: usize = 21;
const WARMUP: usize = 30;
const DISPATCHES: usize = 1_000;
const MODE_ENV: &str = "STRATA_TRACE_COST_MODE";

const MODES: [(&str, &str); 4] = [
    ("none", "no subscriber"),
    ("off", "subscriber, strata off"),
    ("traced", "traced"),
    ("all", "subscriber, strata on"),
];

/// A subscriber that records nothing; `all`: it listens to every target, else to none of
/// strata's.
struct Sink {
    all: bool,
}

impl Subscriber for Sink {
    fn register_callsite(&self, m: &'static Metadata<'static>) -> Interest {
        if self.enabled(m) {
            Interest::always()
        } else {
            Interest::never()
        }
    }
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        self.all || !m.target().starts_with("strata")
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, e: &Event<'_>) {
        std::hint::black_box(e);
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

fn program() -> Program {
    let mut p = Program::new(
        "noop2",
        Signature::new().inout("t", DataType::U8, [Dim::World, Dim::Fixed(64)]),
    );
    let k = p.kernel("k", |_ctx| Ok(()));
    let c = p.chip_orchestration("c", move |o, a| {
        o.submit_aiv(k, CoreArgs::new().inout(&a.tensor(0)?))?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let t = args.tensor("t")?;
        for r in 0..o.world_size() {
            o.submit_next_level(c, &TaskArgs::new().inout(t.row(r)), r)?;
        }
        Ok(())
    });
    p
}

/// The child: dispatches under `mode`, prints the median µs per dispatch.
fn child(mode: &str) -> Result<(), Error> {
    match mode {
        "off" => tracing::subscriber::set_global_default(Sink { all: false }),
        "all" => tracing::subscriber::set_global_default(Sink { all: true }),
        _ => Ok(()),
    }
    .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let config = CallConfig::default().with_trace(mode == "traced");
    let compiled = program().compile(&Target::l3(2))?;
    let t = SharedTensor::zeroed(&[2, 64], DataType::U8)?;
    let rt = compiled.prepare(Prepare::new())?;
    let mut v = Vec::with_capacity(DISPATCHES);
    for i in 0..WARMUP + DISPATCHES {
        let s = Instant::now();
        rt.submit_with(&compiled, (&t,), &config)?.result(None)?;
        if i >= WARMUP {
            v.push(s.elapsed().as_secs_f64() * 1e6);
        }
    }
    rt.close()?;
    println!("{}", median(&v));
    Ok(())
}

fn measure(mode: &str) -> f64 {
    let exe = std::env::current_exe().expect("the bench's own path");
    let out = Command::new(exe)
        .env(MODE_ENV, mode)
        .output()
        .expect("start a measuring child");
    assert!(
        out.status.success(),
        "mode {mode}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the child prints its median")
}

fn main() -> Result<(), Error> {
    if let Ok(mode) = std::env::var(MODE_ENV) {
        return child(&mode);
    }
    let start = Machine::now();
    println!("{}", start.line());
    let mut rounds = Rounds::new(ROUNDS);
    for (mode, name) in MODES {
        rounds = rounds.variant(name, move || measure(mode));
    }
    let r = rounds.baseline("no subscriber").run();
    println!(
        "\none level-3 dispatch of two no-op chip tasks (µs, median of {DISPATCHES} per process and round)"
    );
    println!("{}", r.table("µs", 1));
    let mut json = Json::new();
    json.num("none_us", r.median("no subscriber"), 1);
    for (key, name) in [
        ("off_vs_none", "subscriber, strata off"),
        ("traced_vs_none", "traced"),
        ("subscriber_vs_none", "subscriber, strata on"),
    ] {
        json.num(key, r.ratio_median_vs(name, "no subscriber"), 3);
    }
    json.int("rounds", ROUNDS as u64).machine(&start);
    println!("{}", json.line());
    Ok(())
}
