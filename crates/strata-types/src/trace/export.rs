//! A [`Trace`] as pictures: Chrome / Perfetto trace-event JSON
//! ([`Trace::to_chrome_json`]) and an SVG swimlane ([`Trace::to_swimlane_svg`]).
//!
//! Both place every process's events on the trace's clock (its [`ClockSync`] applied)
//! and count time from the trace's earliest event, so tracks of different processes and
//! hosts line up. No dependency: the formats are small enough to write by hand, and the
//! strings that go into them are escaped here.
//!
//! [`ClockSync`]: super::ClockSync

use super::{ProcessTrace, Trace};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// One box on a track: a span or a core record, on the trace's clock.
struct Item<'a> {
    start: u64,
    end: u64,
    name: &'a str,
    cat: &'static str,
    args: Vec<(&'a str, String)>,
    /// A dispatch span: its `(engine pid, run, task)` and its dependencies.
    task: Option<(u32, u64, u64)>,
    deps: Option<&'a str>,
}

/// A dispatch by `(host, engine pid, run, task)`.
type TaskKey<'a> = (&'a str, u32, u64, u64);
/// Where a slice sits in the JSON: `(pid, tid, start, end)`.
type Slice = (usize, usize, u64, u64);

/// Where a track's items go: a thread (its spans, host and device apart) or a core.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TrackKey {
    Thread { tid: u64, device: bool },
    Core(u32),
}

fn escape(s: &str, out: &mut String) {
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

fn json_str(s: &str, out: &mut String) {
    out.push('"');
    escape(s, out);
    out.push('"');
}

/// `ns` (since the origin) as the format's microseconds, exactly (three decimals).
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// The tracks of one process: items per track, on the trace's clock.
fn tracks(p: &ProcessTrace) -> BTreeMap<TrackKey, Vec<Item<'_>>> {
    let mut t: BTreeMap<TrackKey, Vec<Item<'_>>> = BTreeMap::new();
    for s in &p.spans {
        let start = p.clock.apply(s.ts);
        let device = s.is_device();
        let task = if s.name.ends_with(".run.dispatch") {
            s.attr("task")
                .and_then(|v| v.parse().ok())
                .map(|k| (s.pid, s.inv, k))
        } else {
            None
        };
        let mut args = vec![("inv", s.inv.to_string()), ("hid", s.hid.clone())];
        args.extend(s.attrs.iter().map(|(k, v)| (k.as_str(), v.clone())));
        t.entry(TrackKey::Thread { tid: s.tid, device })
            .or_default()
            .push(Item {
                start,
                end: start.saturating_add(s.dur),
                name: &s.name,
                cat: if device { "device" } else { "host" },
                args,
                task,
                deps: s.attr("deps"),
            });
    }
    for r in &p.records {
        let start = p.clock.apply(r.start_ns);
        t.entry(TrackKey::Core(r.core)).or_default().push(Item {
            start,
            end: p.clock.apply(r.end_ns).max(start),
            name: &r.kernel,
            cat: "kernel",
            args: vec![
                ("task", r.task.to_string()),
                ("block", r.block.to_string()),
                ("lane", r.lane.to_string()),
            ],
            task: None,
            deps: None,
        });
    }
    t
}

/// Splits a track's items into lanes where they nest (an item either ends before the
/// next starts or encloses it), as the format's begin/end pairs need: spans that overlap
/// without nesting (two tasks of one frame seen from the parent, a record's rounding) go
/// to a further lane. Each lane lists its items in order of start, outer first.
fn nest(mut items: Vec<Item<'_>>) -> Vec<Vec<Item<'_>>> {
    items.sort_by_key(|i| (i.start, std::cmp::Reverse(i.end)));
    let mut open: Vec<Vec<u64>> = Vec::new();
    let mut lanes: Vec<Vec<Item<'_>>> = Vec::new();
    for it in items {
        let mut at = None;
        for (k, stack) in open.iter_mut().enumerate() {
            while stack.last().is_some_and(|&e| e <= it.start) {
                stack.pop();
            }
            if stack.last().is_none_or(|&e| e >= it.end) {
                at = Some(k);
                break;
            }
        }
        let k = at.unwrap_or_else(|| {
            open.push(Vec::new());
            lanes.push(Vec::new());
            open.len() - 1
        });
        open[k].push(it.end);
        lanes[k].push(it);
    }
    lanes
}

fn thread_label(p: &ProcessTrace, key: TrackKey, lane: usize) -> String {
    let mut s = match key {
        TrackKey::Thread { tid, device } => {
            let base = p
                .thread_name(tid)
                .map_or_else(|| format!("thread {tid}"), str::to_owned);
            if device {
                format!("{base} (device clock)")
            } else {
                base
            }
        }
        TrackKey::Core(c) => p
            .cores
            .get(c as usize)
            .cloned()
            .unwrap_or_else(|| format!("core {c}")),
    };
    if lane > 0 {
        let _ = write!(s, " #{}", lane + 1);
    }
    s
}

fn process_label(p: &ProcessTrace) -> String {
    let mut s = p.name.clone();
    if p.pid != 0 {
        let _ = write!(s, " (pid {})", p.pid);
    }
    if !p.host.is_empty() {
        let _ = write!(s, " on {}", p.host);
    }
    s
}

impl Trace {
    /// The earliest event on the trace's clock (0 for an empty trace).
    pub fn origin_ns(&self) -> u64 {
        self.processes
            .iter()
            .flat_map(|p| {
                let spans = p.spans.iter().map(|s| p.clock.apply(s.ts));
                let records = p.records.iter().map(|r| p.clock.apply(r.start_ns));
                spans.chain(records)
            })
            .min()
            .unwrap_or(0)
    }

    /// Chrome / Perfetto trace-event JSON (`{"traceEvents": [...]}`, open it in
    /// `ui.perfetto.dev` or `chrome://tracing`).
    ///
    /// - One process track per [`ProcessTrace`] (the host engine, each chip, each
    ///   sub-worker, each remote node and what runs under it), named by `process_name`
    ///   metadata (name, pid, host) with its clock's error bound as a label; track ids are
    ///   the processes' positions (1, 2, ...), since pids of different hosts may collide.
    /// - One thread track per recording thread (device-clock spans on a track of their
    ///   own) and one per core (the core records, named by kernel). Spans that overlap
    ///   without nesting on one thread go to a further track (`#2`, ...), so every track
    ///   is a well-formed sequence of begin (`B`) / end (`E`) pairs in time order.
    /// - Flow arrows (`s` → `f`, category `dep`) from each task's producer's dispatch span
    ///   to its consumer's, from the dispatch spans' `task=` and `deps=` attributes (same
    ///   engine, same run).
    /// - Timestamps in µs (to the ns) since [`Trace::origin_ns`]; the origin, the notes
    ///   and the dropped counts in `otherData`.
    pub fn to_chrome_json(&self) -> String {
        let origin = self.origin_ns();
        let mut out = String::with_capacity(256 + 160 * (self.span_count() + self.record_count()));
        out.push_str("{\"traceEvents\":[");
        let mut first = true;
        let mut event = |out: &mut String, body: &str| {
            if !first {
                out.push(',');
            }
            first = false;
            out.push('\n');
            out.push('{');
            out.push_str(body);
            out.push('}');
        };
        // Producer dispatches by (host, engine pid, run, task): where an arrow starts.
        let mut producers: HashMap<TaskKey<'_>, Slice> = HashMap::new();
        let mut consumers: Vec<(TaskKey<'_>, &str, Slice)> = Vec::new();
        let (mut dropped_spans, mut dropped_records) = (0u64, 0u64);
        for (i, p) in self.processes.iter().enumerate() {
            let pid = i + 1;
            dropped_spans = dropped_spans.saturating_add(p.dropped_spans);
            dropped_records = dropped_records.saturating_add(p.dropped_records);
            let mut b = String::new();
            b.push_str("\"ph\":\"M\",\"name\":\"process_name\",\"pid\":");
            let _ = write!(b, "{pid},\"tid\":0,\"args\":{{\"name\":");
            json_str(&process_label(p), &mut b);
            b.push('}');
            event(&mut out, &b);
            b.clear();
            let _ = write!(
                b,
                "\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{pid},\"tid\":0,\"args\":{{\"sort_index\":{i}}}"
            );
            event(&mut out, &b);
            b.clear();
            let _ = write!(
                b,
                "\"ph\":\"M\",\"name\":\"process_labels\",\"pid\":{pid},\"tid\":0,\"args\":{{\"labels\":\"clock offset {} ns ± {} ns\"}}",
                p.clock.offset_ns, p.clock.error_ns
            );
            event(&mut out, &b);
            let mut tid = 0usize;
            for (key, items) in tracks(p) {
                for (lane, items) in nest(items).into_iter().enumerate() {
                    tid += 1;
                    b.clear();
                    let _ = write!(
                        b,
                        "\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":"
                    );
                    json_str(&thread_label(p, key, lane), &mut b);
                    b.push('}');
                    event(&mut out, &b);
                    b.clear();
                    let _ = write!(
                        b,
                        "\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"sort_index\":{tid}}}"
                    );
                    event(&mut out, &b);
                    // Begin/end in time order: close what ended before the next begins.
                    let mut stack: Vec<(u64, &str)> = Vec::new();
                    let end_event = |out: &mut String,
                                     ev: &mut dyn FnMut(&mut String, &str),
                                     at: u64,
                                     name: &str| {
                        let mut b = String::new();
                        let _ = write!(
                            b,
                            "\"ph\":\"E\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"name\":",
                            us(at - origin)
                        );
                        json_str(name, &mut b);
                        ev(out, &b);
                    };
                    for it in &items {
                        while let Some(&(e, n)) = stack.last() {
                            if e > it.start {
                                break;
                            }
                            stack.pop();
                            end_event(&mut out, &mut event, e, n);
                        }
                        b.clear();
                        let _ = write!(
                            b,
                            "\"ph\":\"B\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"cat\":\"{}\",\"name\":",
                            us(it.start - origin),
                            it.cat
                        );
                        json_str(it.name, &mut b);
                        b.push_str(",\"args\":{");
                        for (k, (ak, av)) in it.args.iter().enumerate() {
                            if k > 0 {
                                b.push(',');
                            }
                            json_str(ak, &mut b);
                            b.push(':');
                            json_str(av, &mut b);
                        }
                        b.push('}');
                        event(&mut out, &b);
                        stack.push((it.end, it.name));
                        if let Some((epid, run, task)) = it.task {
                            producers.insert(
                                (p.host.as_str(), epid, run, task),
                                (pid, tid, it.start, it.end),
                            );
                            if let Some(d) = it.deps {
                                consumers.push((
                                    (p.host.as_str(), epid, run, task),
                                    d,
                                    (pid, tid, it.start, it.end),
                                ));
                            }
                        }
                    }
                    while let Some((e, n)) = stack.pop() {
                        end_event(&mut out, &mut event, e, n);
                    }
                }
            }
        }
        // Arrows: each bound to the middle of its slice (the format binds a flow event to
        // the slice that encloses it on its track).
        let mut id = 0u64;
        for ((host, epid, run, _), deps, (pid, tid, a, b)) in consumers {
            for d in deps.split(',').filter_map(|d| d.parse::<u64>().ok()) {
                let Some(&(ppid, ptid, pa, pb)) = producers.get(&(host, epid, run, d)) else {
                    continue;
                };
                id += 1;
                let mut s = String::new();
                let _ = write!(
                    s,
                    "\"ph\":\"s\",\"id\":{id},\"pid\":{ppid},\"tid\":{ptid},\"ts\":{},\"cat\":\"dep\",\"name\":\"dep\"",
                    us(pa + (pb - pa) / 2 - origin)
                );
                event(&mut out, &s);
                s.clear();
                let _ = write!(
                    s,
                    "\"ph\":\"f\",\"bp\":\"e\",\"id\":{id},\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"cat\":\"dep\",\"name\":\"dep\"",
                    us(a + (b - a) / 2 - origin)
                );
                event(&mut out, &s);
            }
        }
        let _ = write!(
            out,
            "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"origin_ns\":\"{origin}\",\"dropped_spans\":\"{dropped_spans}\",\"dropped_records\":\"{dropped_records}\",\"notes\":"
        );
        json_str(&self.notes.join("; "), &mut out);
        out.push_str("}}\n");
        out
    }

    /// An SVG swimlane picture: one lane per core that has records (boxes: kernels) and
    /// one per engine frame that has dispatch spans (boxes: the tasks a level-3/4 worker
    /// ran on that child), on the trace's clock, each box coloured by its kernel or
    /// callable (legend below) with a tooltip; empty stretches of a lane are idle time.
    /// A trace with neither shows each thread's outermost spans instead.
    pub fn to_swimlane_svg(&self) -> String {
        struct Lane<'a> {
            label: String,
            boxes: Vec<(u64, u64, &'a str, String)>,
        }
        let mut lanes: Vec<Lane<'_>> = Vec::new();
        // A host thread's lane, labelled by its process and thread.
        let thread_lane = |p: &ProcessTrace, tid: u64| Lane {
            label: format!(
                "{} {}",
                p.name,
                thread_label(p, TrackKey::Thread { tid, device: false }, 0)
            ),
            boxes: Vec::new(),
        };
        let tip = |name: &str, extra: String, a: u64, b: u64| {
            format!("{name} {extra} {:.3} µs", (b - a) as f64 / 1000.0)
        };
        for p in &self.processes {
            let mut cores: BTreeMap<u32, Lane<'_>> = BTreeMap::new();
            for r in &p.records {
                let (a, b) = (p.clock.apply(r.start_ns), p.clock.apply(r.end_ns));
                let b = b.max(a);
                cores
                    .entry(r.core)
                    .or_insert_with(|| Lane {
                        label: format!("{} {}", p.name, thread_label(p, TrackKey::Core(r.core), 0)),
                        boxes: Vec::new(),
                    })
                    .boxes
                    .push((
                        a,
                        b,
                        &r.kernel,
                        tip(
                            &r.kernel,
                            format!("task {} block {}", r.task, r.block),
                            a,
                            b,
                        ),
                    ));
            }
            lanes.extend(cores.into_values());
            let mut frames: BTreeMap<u64, Lane<'_>> = BTreeMap::new();
            for s in p.spans.iter().filter(|s| s.name.ends_with(".run.dispatch")) {
                let (a, b) = (p.clock.apply(s.ts), p.clock.apply(s.end()));
                let name = s.attr("callable").unwrap_or(&s.hid);
                frames
                    .entry(s.tid)
                    .or_insert_with(|| thread_lane(p, s.tid))
                    .boxes
                    .push((
                        a,
                        b,
                        name,
                        tip(
                            name,
                            format!("task {}", s.attr("task").unwrap_or("?")),
                            a,
                            b,
                        ),
                    ));
            }
            lanes.extend(frames.into_values());
        }
        if lanes.is_empty() {
            for p in &self.processes {
                let mut threads: BTreeMap<u64, Lane<'_>> = BTreeMap::new();
                for s in p.spans.iter().filter(|s| s.depth == 0 && !s.is_device()) {
                    let (a, b) = (p.clock.apply(s.ts), p.clock.apply(s.end()));
                    threads
                        .entry(s.tid)
                        .or_insert_with(|| thread_lane(p, s.tid))
                        .boxes
                        .push((a, b, &s.name, tip(&s.name, String::new(), a, b)));
                }
                lanes.extend(threads.into_values());
            }
        }
        svg(&lanes
            .iter()
            .map(|l| (l.label.as_str(), l.boxes.as_slice()))
            .collect::<Vec<_>>())
    }
}

/// A colour per name, stable across pictures (a hash of the name picks the hue).
fn colour(name: &str) -> String {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!("hsl({},65%,55%)", h % 360)
}

type SvgLane<'a, 'b> = (&'a str, &'b [(u64, u64, &'b str, String)]);

fn svg(lanes: &[SvgLane<'_, '_>]) -> String {
    const LABEL_W: f64 = 300.0;
    const PLOT_W: f64 = 1100.0;
    const LANE_H: f64 = 20.0;
    const TOP: f64 = 30.0;
    let t0 = lanes
        .iter()
        .flat_map(|l| l.1.iter().map(|b| b.0))
        .min()
        .unwrap_or(0);
    let t1 = lanes
        .iter()
        .flat_map(|l| l.1.iter().map(|b| b.1))
        .max()
        .unwrap_or(0)
        .max(t0.saturating_add(1));
    let span = (t1 - t0) as f64;
    let x = |t: u64| LABEL_W + (t - t0) as f64 / span * PLOT_W;
    let mut names: Vec<&str> = lanes.iter().flat_map(|l| l.1.iter().map(|b| b.2)).collect();
    names.sort_unstable();
    names.dedup();
    let legend_rows = names.len().div_ceil(4);
    let plot_h = TOP + lanes.len() as f64 * LANE_H;
    let height = plot_h + 30.0 + legend_rows as f64 * 18.0 + 10.0;
    let width = LABEL_W + PLOT_W + 20.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"monospace\" font-size=\"11\">"
    );
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    // Time axis: ten ticks, µs since the first box.
    for k in 0..=10u64 {
        let t = t0 + ((t1 - t0) as u128 * k as u128 / 10) as u64;
        let xt = x(t);
        let _ = writeln!(
            s,
            "<line x1=\"{xt:.1}\" y1=\"{}\" x2=\"{xt:.1}\" y2=\"{plot_h}\" stroke=\"#ddd\"/><text x=\"{xt:.1}\" y=\"{}\" text-anchor=\"middle\">{:.1} µs</text>",
            TOP - 8.0,
            TOP - 12.0,
            (t - t0) as f64 / 1000.0
        );
    }
    for (i, (label, boxes)) in lanes.iter().enumerate() {
        let y = TOP + i as f64 * LANE_H;
        if i % 2 == 0 {
            let _ = writeln!(
                s,
                "<rect x=\"{LABEL_W}\" y=\"{y}\" width=\"{PLOT_W}\" height=\"{LANE_H}\" fill=\"#f4f4f4\"/>"
            );
        }
        let mut l = String::new();
        escape_xml(label, &mut l);
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{l}</text>",
            LABEL_W - 6.0,
            y + LANE_H * 0.7
        );
        for (a, b, name, tip) in boxes.iter() {
            let (xa, xb) = (x(*a), x(*b));
            let mut t = String::new();
            escape_xml(tip, &mut t);
            let _ = writeln!(
                s,
                "<rect x=\"{xa:.2}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{:.1}\" fill=\"{}\" stroke=\"#333\" stroke-width=\"0.3\"><title>{t}</title></rect>",
                y + 2.0,
                (xb - xa).max(0.5),
                LANE_H - 4.0,
                colour(name)
            );
        }
    }
    for (k, name) in names.iter().enumerate() {
        let (col, row) = (k % 4, k / 4);
        let lx = LABEL_W + col as f64 * (PLOT_W / 4.0);
        let ly = plot_h + 20.0 + row as f64 * 18.0;
        let mut n = String::new();
        escape_xml(name, &mut n);
        let _ = writeln!(
            s,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{ly:.1}\">{n}</text>",
            ly - 10.0,
            colour(name),
            lx + 16.0
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape_xml(s: &str, out: &mut String) {
    for ch in s.chars() {
        match ch {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            c if (c as u32) < 0x20 => out.push(' '),
            c => out.push(c),
        }
    }
}
