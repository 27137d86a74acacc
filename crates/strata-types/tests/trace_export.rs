//! The Chrome / Perfetto export against the trace-event format: known phases with their
//! required fields, begin/end pairs that match as a stack per track, timestamps that never
//! go back on a track, every span and core record exactly once, a name for every track,
//! and dependency arrows from producer to consumer.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use strata_types::trace::{ClockSync, CoreRecord, Span, Trace};

/// A run as a level-3 worker records it: its own spans, two tasks dispatched to a chip
/// (the second depends on the first) and one to a remote node on another clock, the
/// chip's host and device spans and its core records (two of which overlap without
/// nesting), a name with characters JSON must escape.
fn sample() -> Trace {
    let mut t = Trace::default();
    let host = t.process_mut("host (level 3)", 100, "");
    host.name_thread(1, "caller");
    host.spans
        .push(Span::new(100, 1, 1, "aa", "l3.run", 1_000, 9_000));
    host.spans
        .push(Span::new(100, 1, 1, "aa", "l3.run.submit", 1_100, 500));
    host.spans
        .push(Span::new(100, 1, 1, "aa", "l3.run.wait", 1_700, 8_300));
    let chip = t.process_mut("chip_process dev=0", 200, "");
    chip.name_thread(7, "frame 0 \"quoted\"\n");
    for (task, start, deps) in [(0u64, 2_000u64, None), (1, 4_000, Some("0"))] {
        chip.spans.push(
            Span::new(100, 7, 1, "bb", "l3.run.schedule", start - 100, 100).with_attr("task", task),
        );
        let mut d = Span::new(100, 7, 1, "bb", "l3.run.dispatch", start, 1_500)
            .with_attr("task", task)
            .with_attr("callable", "prog/k");
        if let Some(deps) = deps {
            d = d.with_attr("deps", deps);
        }
        chip.spans.push(d);
        chip.spans.push(Span::new(
            200,
            3,
            task,
            "cc",
            "chip.run",
            start + 100,
            1_200,
        ));
        chip.spans.push(
            Span::new(
                200,
                3,
                task,
                "cc",
                "chip.run.runner_run.device_wall",
                start + 200,
                900,
            )
            .with_attr("clk", "dev"),
        );
    }
    // A span that overlaps the first chip.run without nesting in it.
    chip.spans
        .push(Span::new(200, 3, 9, "cc", "chip.run", 2_500, 2_000));
    chip.cores = vec!["core 0 (AIV)".into(), "core 1 (AIV)".into()];
    for (core, a, b) in [(0, 2_300, 2_800), (0, 2_700, 3_000), (1, 4_300, 4_900)] {
        chip.records.push(CoreRecord {
            core,
            task: 1,
            block: 0,
            lane: 1,
            kernel: "add<f32>".into(),
            start_ns: a,
            end_ns: b,
        });
    }
    // A remote node whose clock runs 1 ms ahead of this one's.
    let mut remote = Trace::default();
    let node = remote.process_mut("node", 300, "");
    node.spans
        .push(Span::new(300, 1, 1, "dd", "node.task", 1_005_000, 500));
    t.absorb(
        remote,
        ClockSync {
            offset_ns: -1_000_000,
            error_ns: 40_000,
        },
        "hostB",
    );
    t.note("one note".into());
    t
}

fn num(v: &Value, k: &str) -> Result<f64, String> {
    v.get(k)
        .and_then(Value::as_f64)
        .ok_or(format!("{k} missing or not a number in {v}"))
}

#[test]
fn the_chrome_export_is_well_formed_trace_event_json() -> Result<(), String> {
    let t = sample();
    let json = t.to_chrome_json();
    let doc: Value = serde_json::from_str(&json).map_err(|e| format!("{e}:\n{json}"))?;
    let events = doc["traceEvents"].as_array().ok_or("traceEvents")?;
    let mut open: HashMap<(u64, u64), Vec<String>> = HashMap::new();
    let mut last_ts: HashMap<(u64, u64), f64> = HashMap::new();
    let mut thread_names: HashMap<(u64, u64), String> = HashMap::new();
    let mut process_names: HashMap<u64, String> = HashMap::new();
    let mut begins: BTreeMap<String, usize> = BTreeMap::new();
    let mut flows: HashMap<u64, Vec<&Value>> = HashMap::new();
    for e in events {
        let ph = e["ph"].as_str().ok_or(format!("no phase: {e}"))?;
        let pid = e["pid"].as_u64().ok_or(format!("no pid: {e}"))?;
        let tid = e["tid"].as_u64().ok_or(format!("no tid: {e}"))?;
        match ph {
            "M" => {
                let name = e["args"]["name"].as_str();
                match e["name"].as_str() {
                    Some("process_name") => {
                        process_names.insert(pid, name.ok_or("process name")?.into());
                    }
                    Some("thread_name") => {
                        thread_names.insert((pid, tid), name.ok_or("thread name")?.into());
                    }
                    Some("process_sort_index" | "thread_sort_index" | "process_labels") => {}
                    other => return Err(format!("unknown metadata {other:?}")),
                }
            }
            "B" | "E" => {
                let ts = num(e, "ts")?;
                let name = e["name"].as_str().ok_or("name")?.to_owned();
                let last = last_ts.entry((pid, tid)).or_insert(f64::MIN);
                if ts < *last {
                    return Err(format!("track ({pid}, {tid}) goes back in time at {e}"));
                }
                *last = ts;
                let stack = open.entry((pid, tid)).or_default();
                if ph == "B" {
                    *begins.entry(name.clone()).or_default() += 1;
                    stack.push(name);
                } else if stack.pop().as_deref() != Some(name.as_str()) {
                    return Err(format!("an end without its begin: {e}"));
                }
            }
            "s" | "f" => {
                num(e, "ts")?;
                flows
                    .entry(e["id"].as_u64().ok_or("flow id")?)
                    .or_default()
                    .push(e);
            }
            other => return Err(format!("unexpected phase {other}: {e}")),
        }
    }
    if let Some((k, v)) = open.iter().find(|(_, v)| !v.is_empty()) {
        return Err(format!("track {k:?} leaves {v:?} open"));
    }
    for k in last_ts.keys() {
        if !thread_names.contains_key(k) || !process_names.contains_key(&k.0) {
            return Err(format!("track {k:?} has no name"));
        }
    }
    // Every span and core record once, each process a track of its own.
    let mut want: BTreeMap<String, usize> = BTreeMap::new();
    for p in &t.processes {
        for s in &p.spans {
            *want.entry(s.name.clone()).or_default() += 1;
        }
        for r in &p.records {
            *want.entry(r.kernel.clone()).or_default() += 1;
        }
    }
    assert_eq!(begins, want);
    assert_eq!(process_names.len(), t.processes.len());
    assert!(
        process_names
            .values()
            .any(|n| n == "node (pid 300) on hostB"),
        "{process_names:?}"
    );
    assert!(
        thread_names.values().any(|n| n == "frame 0 \"quoted\"\n"),
        "escaped names round-trip: {thread_names:?}"
    );
    // The two overlapping chip.run spans and core records are on tracks of their own.
    assert!(
        thread_names.values().any(|n| n == "core 0 (AIV) #2"),
        "{thread_names:?}"
    );
    // One arrow: task 0's dispatch → task 1's, its ends on the dispatch tracks, start
    // inside the producer and end inside the consumer.
    assert_eq!(flows.len(), 1, "{flows:?}");
    let f = flows.values().next().ok_or("flow")?;
    let (s, e) = match (f[0]["ph"].as_str(), f[1]["ph"].as_str()) {
        (Some("s"), Some("f")) => (f[0], f[1]),
        _ => return Err(format!("a flow is one s and one f: {f:?}")),
    };
    let origin = t.origin_ns() as f64 / 1000.0;
    let (a, b) = (num(s, "ts")? + origin, num(e, "ts")? + origin);
    assert!(
        (2.0..3.5).contains(&a) && (4.0..5.5).contains(&b),
        "{s} {e}"
    );
    assert_eq!(e["bp"], "e");
    assert_eq!(doc["otherData"]["notes"], "one note");
    // The node's span on this clock: its offset applied (it starts at 5 µs).
    let node = events
        .iter()
        .find(|e| e["name"] == "node.task" && e["ph"] == "B")
        .ok_or("node.task")?;
    assert_eq!(num(node, "ts")? + origin, 5.0);
    Ok(())
}

#[test]
fn the_swimlane_picture_has_a_lane_per_core_and_frame_and_a_box_per_record() {
    let t = sample();
    let svg = t.to_swimlane_svg();
    assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
    // Two cores and one engine frame; three kernel boxes and two task boxes, each with a
    // tooltip; names escaped.
    assert_eq!(svg.matches("<title>").count(), 5);
    assert!(svg.contains("add&lt;f32&gt;"));
    assert!(svg.contains("core 0 (AIV)") && svg.contains("core 1 (AIV)"));
    assert!(!svg.contains("add<f32>"));
    // An empty trace is an empty picture, not a panic.
    assert!(Trace::default().to_swimlane_svg().starts_with("<svg "));
    assert!(Trace::default()
        .to_chrome_json()
        .starts_with("{\"traceEvents\":["));
}

proptest::proptest! {
    /// Any trace — extreme timestamps, overlapping spans, clocks that clamp — exports to
    /// JSON that parses with balanced tracks, and to a picture, without a panic.
    #[test]
    fn any_trace_exports_without_a_panic(
        spans in proptest::collection::vec((0u64..4, proptest::num::u64::ANY, proptest::num::u64::ANY, 0u8..3), 0..40),
        offset in proptest::num::i64::ANY,
    ) {
        let mut t = Trace::default();
        let p = t.process_mut("p", 1, "");
        p.clock = ClockSync { offset_ns: offset, error_ns: 1 };
        for (tid, ts, dur, kind) in spans {
            match kind {
                0 => p.spans.push(Span::new(1, tid, 0, "aa", "x.run.dispatch", ts, dur).with_attr("task", tid).with_attr("deps", "0,1,+3")),
                1 => p.spans.push(Span::new(1, tid, 0, "aa", "x.y", ts, dur).with_attr("clk", "dev")),
                _ => p.records.push(CoreRecord { core: tid as u32, task: 0, block: 0, lane: 0, kernel: "k".into(), start_ns: ts, end_ns: dur }),
            }
        }
        let doc: Value = serde_json::from_str(&t.to_chrome_json()).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
        let events = doc["traceEvents"].as_array().cloned().unwrap_or_default();
        let b = events.iter().filter(|e| e["ph"] == "B").count();
        let e = events.iter().filter(|e| e["ph"] == "E").count();
        proptest::prop_assert_eq!(b, e);
        proptest::prop_assert_eq!(b, t.span_count() + t.record_count());
        proptest::prop_assert!(t.to_swimlane_svg().ends_with("</svg>\n"));
    }
}
