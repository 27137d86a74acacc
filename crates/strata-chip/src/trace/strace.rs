//! `[STRACE]` timing spans in the reference runtime's grammar, and a parser for them.
//!
//! One line per span: `[STRACE] v=1 pid=<pid> tid=<tid> inv=<n> hid=<hex> depth=<d>
//! name=<name> ts=<ns> dur=<ns> [k=v ...]`. Host spans (`chip.run`, `chip.run.bind`, ...)
//! are stamped on a process-wide monotonic clock; device spans carry `clk=dev` and their
//! `ts` is an offset from the run's device-clock origin (the earliest device phase start).
//! Spans are listed children first, as the reference emits them on scope exit.

use std::sync::atomic::{AtomicU64, Ordering};

pub use strata_types::trace::Span;

/// Parses every `[STRACE]` line in `text` (other lines, and malformed spans, are skipped).
///
/// ```
/// let spans = strata_chip::parse_strace(
///     "noise\n[STRACE] v=1 pid=7 tid=1 inv=3 hid=ab depth=0 name=chip.run ts=10 dur=99\n",
/// );
/// assert_eq!(spans.len(), 1);
/// assert_eq!((spans[0].name.as_str(), spans[0].dur), ("chip.run", 99));
/// ```
pub fn parse_strace(text: &str) -> Vec<Span> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Span> {
    let rest = &line[line.find("[STRACE]")? + "[STRACE]".len()..];
    let mut s = Span {
        v: 0,
        pid: 0,
        tid: 0,
        inv: 0,
        hid: String::new(),
        depth: 0,
        name: String::new(),
        ts: 0,
        dur: 0,
        attrs: Vec::new(),
    };
    let mut seen = 0u32;
    for field in rest.split_whitespace() {
        let (k, v) = field.split_once('=')?;
        match k {
            "v" => s.v = v.parse().ok()?,
            "pid" => s.pid = v.parse().ok()?,
            "tid" => s.tid = v.parse().ok()?,
            "inv" => s.inv = v.parse().ok()?,
            "hid" => s.hid = v.to_owned(),
            "depth" => s.depth = v.parse().ok()?,
            "name" => s.name = v.to_owned(),
            "ts" => s.ts = v.parse().ok()?,
            "dur" => s.dur = v.parse().ok()?,
            _ => {
                s.attrs.push((k.to_owned(), v.to_owned()));
                continue;
            }
        }
        seen += 1;
    }
    (seen == 9).then_some(s)
}

/// A span with its children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanTree {
    /// The span.
    pub span: Span,
    /// Spans nested directly inside it.
    pub children: Vec<SpanTree>,
}

impl SpanTree {
    /// Finds a descendant (or self) by full name.
    pub fn find(&self, name: &str) -> Option<&SpanTree> {
        if self.span.name == name {
            return Some(self);
        }
        self.children.iter().find_map(|c| c.find(name))
    }

    /// Renders the tree, one span per line with its duration in µs.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_into(&mut out, 0);
        out
    }

    fn render_into(&self, out: &mut String, indent: usize) {
        out.push_str(&format!(
            "{:indent$}{} {:.1} us\n",
            "",
            self.span.name,
            self.span.dur as f64 / 1e3,
            indent = indent * 2
        ));
        for c in &self.children {
            c.render_into(out, indent + 1);
        }
    }
}

/// Builds the span trees: spans are grouped by `(pid, inv)`, and a span's parent is the
/// span of the same group at `depth − 1` whose name is the longest proper prefix of its
/// own. Returns the roots (normally one `chip.run` per run), children in start order.
pub fn span_tree(spans: &[Span]) -> Vec<SpanTree> {
    let mut sorted: Vec<&Span> = spans.iter().collect();
    sorted.sort_by_key(|s| (s.pid, s.inv, s.depth, s.ts));
    let mut roots: Vec<SpanTree> = Vec::new();
    for s in sorted {
        let node = SpanTree {
            span: s.clone(),
            children: Vec::new(),
        };
        match find_parent(&mut roots, s) {
            Some(p) => {
                p.children.push(node);
                p.children.sort_by_key(|c| c.span.ts);
            }
            None => roots.push(node),
        }
    }
    roots
}

fn find_parent<'a>(nodes: &'a mut [SpanTree], s: &Span) -> Option<&'a mut SpanTree> {
    for n in nodes.iter_mut() {
        let is_prefix = s.name.len() > n.span.name.len()
            && s.name.starts_with(&n.span.name)
            && s.name.as_bytes()[n.span.name.len()] == b'.';
        if n.span.pid != s.pid || n.span.inv != s.inv || !is_prefix {
            continue;
        }
        if n.span.depth + 1 == s.depth {
            return Some(n);
        }
        return find_parent(&mut n.children, s);
    }
    None
}

/// The monotonic clock of host spans (`CLOCK_MONOTONIC`, the same in every process).
pub(crate) use strata_sync::mono_ns;

/// The next run invocation id of this process.
pub(crate) fn next_invocation() -> u64 {
    static INV: AtomicU64 = AtomicU64::new(1);
    INV.fetch_add(1, Ordering::Relaxed)
}

/// A small process-local id for the calling thread.
pub(crate) fn thread_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    ID.with(|i| *i)
}

/// Collects the spans of one run.
#[derive(Debug)]
pub(crate) struct Tracer {
    pub(crate) pid: u32,
    pub(crate) tid: u64,
    pub(crate) inv: u64,
    pub(crate) hid: String,
    pub(crate) spans: Vec<Span>,
}

impl Tracer {
    pub(crate) fn new(pid: u32, tid: u64, inv: u64, hid: String) -> Self {
        Tracer {
            pid,
            tid,
            inv,
            hid,
            spans: Vec::new(),
        }
    }

    /// Records a host span `[start, end)` (ns on [`mono_ns`]'s clock).
    pub(crate) fn host(&mut self, name: &str, start: u64, end: u64) {
        self.push(name, start, end.saturating_sub(start), false);
    }

    /// Records a device span (ts relative to the device origin); skipped if empty.
    pub(crate) fn device(&mut self, name: &str, ts: u64, dur: u64) {
        if dur > 0 {
            self.push(name, ts, dur, true);
        }
    }

    fn push(&mut self, name: &str, ts: u64, dur: u64, dev: bool) {
        self.spans.push(Span {
            v: 1,
            pid: self.pid,
            tid: self.tid,
            inv: self.inv,
            hid: self.hid.clone(),
            depth: name.matches('.').count().saturating_sub(1) as u32,
            name: name.to_owned(),
            ts,
            dur,
            attrs: if dev {
                vec![("clk".into(), "dev".into())]
            } else {
                Vec::new()
            },
        });
    }
}

/// The `[STRACE]` lines of `spans`.
pub(crate) fn strace_text(spans: &[Span]) -> String {
    let mut s = String::new();
    for sp in spans {
        s.push_str(&sp.to_line());
        s.push('\n');
    }
    s
}

/// The raw timestamps of one run (a few words, recorded on every run); its spans and
/// `[STRACE]` text are built from them only when asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunTiming {
    pub(crate) pid: u32,
    pub(crate) tid: u64,
    pub(crate) inv: u64,
    /// First 8 bytes of the orchestration's digest.
    pub(crate) hid: [u8; 8],
    // Host clock (mono_ns).
    pub(crate) t0: u64,
    pub(crate) bind: u64,
    pub(crate) prebuilt: u64,
    pub(crate) bind_end: u64,
    pub(crate) runner_end: u64,
    pub(crate) end: u64,
    pub(crate) done: u64,
    // Device phases (mono_ns, made relative to `origin` when rendered).
    pub(crate) origin: u64,
    pub(crate) orch_start: u64,
    pub(crate) orch_end: u64,
    pub(crate) dev_end: u64,
    /// First dispatch and last completion, if the run dispatched anything.
    pub(crate) sched: Option<(u64, u64)>,
    /// Device-domain spans are recorded (`STRATA_DEVICE_STRACE` is not `0`).
    pub(crate) device: bool,
}

impl RunTiming {
    /// The run's spans, children first (as the reference emits them on scope exit);
    /// device spans relative to the run's device origin, as `[STRACE]` has them.
    pub(crate) fn spans(&self) -> Vec<Span> {
        self.spans_from(self.origin)
    }

    /// The same spans with the device spans on the host's clock too (`CLOCK_MONOTONIC`:
    /// the emulated device clock is the host's), as a [`strata_types::trace::Trace`]
    /// holds them.
    pub(crate) fn spans_on_host_clock(&self) -> Vec<Span> {
        self.spans_from(0)
    }

    /// The spans, device timestamps taken relative to `base` (the device origin, or 0).
    fn spans_from(&self, base: u64) -> Vec<Span> {
        let hid: String = self.hid.iter().map(|b| format!("{b:02x}")).collect();
        let mut t = Tracer::new(self.pid, self.tid, self.inv, hid);
        t.host("chip.run.bind.prebuilt", self.bind, self.prebuilt);
        t.host("chip.run.bind.args", self.prebuilt, self.bind_end);
        t.host("chip.run.bind", self.bind, self.bind_end);
        if !self.device {
            t.host("chip.run.runner_run", self.bind_end, self.runner_end);
            t.host("chip.run.validate", self.runner_end, self.end);
            t.host("chip.run", self.t0, self.done);
            return t.spans;
        }
        let origin = self.origin;
        let rel = |x: u64| x.saturating_sub(origin) + (origin - base);
        t.device(
            "chip.run.runner_run.device_wall.preamble",
            rel(origin),
            self.orch_start.saturating_sub(origin),
        );
        t.device(
            "chip.run.runner_run.device_wall.orch",
            rel(self.orch_start),
            self.orch_end.saturating_sub(self.orch_start),
        );
        if let Some((first, last)) = self.sched {
            t.device(
                "chip.run.runner_run.device_wall.sched",
                rel(first),
                last.saturating_sub(first),
            );
        }
        t.device(
            "chip.run.runner_run.device_wall.post_orch",
            rel(self.orch_end),
            self.dev_end.saturating_sub(self.orch_end),
        );
        t.device(
            "chip.run.runner_run.device_wall",
            rel(origin),
            self.dev_end.saturating_sub(origin).max(1),
        );
        t.host("chip.run.runner_run", self.bind_end, self.runner_end);
        t.host("chip.run.validate", self.runner_end, self.end);
        t.host("chip.run", self.t0, self.done);
        t.spans
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_tree_nests_by_name() {
        let mut t = Tracer::new(
            std::process::id(),
            thread_id(),
            next_invocation(),
            "abcd".into(),
        );
        t.host("chip.run.bind.args", 12, 15);
        t.host("chip.run.bind", 11, 20);
        t.device("chip.run.runner_run.device_wall.orch", 0, 5);
        t.device("chip.run.runner_run.device_wall", 0, 9);
        t.device("chip.run.runner_run.device_wall.sched", 0, 0); // skipped: empty
        t.host("chip.run.runner_run", 21, 40);
        t.host("chip.run", 10, 50);
        let spans = parse_strace(&strace_text(&t.spans));
        assert_eq!(spans, t.spans);
        assert_eq!(spans.len(), 6);
        let roots = span_tree(&spans);
        assert_eq!(roots.len(), 1);
        let run = &roots[0];
        assert_eq!(run.span.name, "chip.run");
        assert_eq!(run.children.len(), 2);
        let wall = run.find("chip.run.runner_run.device_wall").unwrap();
        assert!(wall.span.is_device());
        assert_eq!(
            wall.children[0].span.name,
            "chip.run.runner_run.device_wall.orch"
        );
        assert_eq!(wall.span.depth, 2);
        assert!(run.render().contains("  chip.run.bind"));
    }
}
