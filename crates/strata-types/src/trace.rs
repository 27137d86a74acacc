//! The trace model every level shares, and its byte encoding.
//!
//! A [`Span`] is one timed section in the reference runtime's `[STRACE]` grammar
//! (`v=1 pid tid inv hid depth name ts dur [k=v ...]`); a [`CoreRecord`] is one kernel
//! invocation on one emulated core (a swimlane record). A [`ProcessTrace`] holds what one
//! worker recorded — a chip, a host engine, a sub-worker as its parent saw it, a remote
//! node — on that process's own clock, with the [`ClockSync`] that maps it onto the
//! trace's clock; a [`Trace`] is every process of a run (or of several runs).
//!
//! Children send their trace to their parent with a task's completion, as bytes
//! ([`Trace::encode_bounded`]): the encoding never exceeds the room it is given (what
//! does not fit is dropped and counted, and the counts travel with it), and
//! [`Trace::decode`] checks every length and count against the bytes it has, so bytes
//! another process wrote can at worst be refused — never a panic, never an allocation
//! larger than the input.
//!
//! Timestamps are nanoseconds on `CLOCK_MONOTONIC` of the process that recorded them
//! (shared by every process of one host). Device spans (`clk=dev`) in a `Trace` are on
//! that clock too — the emulated device clock *is* the host's monotonic clock; the
//! `[STRACE]` text of a chip run shows them relative to the run's device origin, as the
//! reference does.
//!
//! ```
//! use strata_types::trace::{ClockSync, ProcessTrace, Span, Trace};
//! let mut t = Trace::default();
//! let p = t.process_mut("chip_process dev=0", 42, "");
//! p.spans.push(Span::new(42, 1, 7, "ab", "chip.run", 1_000, 500));
//! let bytes = t.encode_bounded(4096);
//! let back = Trace::decode(&bytes)?;
//! assert_eq!(back, t);
//! // Too little room: the span is dropped and counted, the process header stays.
//! let small = Trace::decode(&t.encode_bounded(100))?;
//! assert_eq!((small.processes[0].spans.len(), small.processes[0].dropped_spans), (0, 1));
//! # let _ = ClockSync::SAME_HOST;
//! # Ok::<(), strata_types::TypesError>(())
//! ```

use crate::error::TypesError;

mod export;

/// One timed section (one `[STRACE]` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// Grammar version (1).
    pub v: u32,
    /// Process id of the process that recorded it (a thread that stands for a process
    /// uses its thread id).
    pub pid: u32,
    /// Thread id (process-local).
    pub tid: u64,
    /// Run invocation id (per process and kind of run).
    pub inv: u64,
    /// Callable hash (first 8 bytes of the callable's digest, hex).
    pub hid: String,
    /// Nesting depth (0 = the root, e.g. `chip.run`).
    pub depth: u32,
    /// Dotted name (`chip.run.runner_run.device_wall.orch`).
    pub name: String,
    /// Start, ns.
    pub ts: u64,
    /// Duration, ns.
    pub dur: u64,
    /// Extra `k=v` attributes (`clk=dev` on device spans).
    pub attrs: Vec<(String, String)>,
}

impl Span {
    /// A host span; its depth is the number of dots in `name` minus one (`chip.run` is 0).
    pub fn new(pid: u32, tid: u64, inv: u64, hid: &str, name: &str, ts: u64, dur: u64) -> Span {
        Span {
            v: 1,
            pid,
            tid,
            inv,
            hid: hid.to_owned(),
            depth: name.matches('.').count().saturating_sub(1) as u32,
            name: name.to_owned(),
            ts,
            dur,
            attrs: Vec::new(),
        }
    }

    /// The same span with attribute `k=v` added.
    #[must_use]
    pub fn with_attr(mut self, k: &str, v: impl ToString) -> Span {
        self.attrs.push((k.to_owned(), v.to_string()));
        self
    }

    /// Whether the span is on the device clock (`clk=dev`).
    pub fn is_device(&self) -> bool {
        self.attr("clk") == Some("dev")
    }

    /// The value of attribute `k`, if it has one.
    pub fn attr(&self, k: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }

    /// The end, ns (`ts + dur`, saturating).
    pub fn end(&self) -> u64 {
        self.ts.saturating_add(self.dur)
    }

    /// The `[STRACE]` line.
    pub fn to_line(&self) -> String {
        let mut s = format!(
            "[STRACE] v={} pid={} tid={} inv={} hid={} depth={} name={} ts={} dur={}",
            self.v,
            self.pid,
            self.tid,
            self.inv,
            self.hid,
            self.depth,
            self.name,
            self.ts,
            self.dur
        );
        for (k, v) in &self.attrs {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            s.push_str(v);
        }
        s
    }
}

/// One kernel invocation (task × block × lane) on one core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreRecord {
    /// The core (an index into [`ProcessTrace::cores`]).
    pub core: u32,
    /// The task id on its chip.
    pub task: u64,
    /// The SPMD block.
    pub block: u32,
    /// The subtask lane: 0 AIC, 1 AIV0, 2 AIV1.
    pub lane: u8,
    /// The kernel's registered name.
    pub kernel: String,
    /// Start, ns.
    pub start_ns: u64,
    /// End, ns.
    pub end_ns: u64,
}

/// How a process's clock maps onto the trace's: `t_trace = t_process + offset_ns`, and the
/// true offset lies within `±error_ns` of `offset_ns`.
///
/// Processes of one host share `CLOCK_MONOTONIC` ([`ClockSync::SAME_HOST`]: offset and
/// error 0). A remote node's offset is estimated from a task's round trip, as NTP does:
/// with `t0` the root sending the task, `t1` the node receiving it, `t2` the node sending
/// the answer and `t3` the root receiving it, `offset = ((t0 − t1) + (t3 − t2)) / 2` and
/// the error is at most `((t3 − t0) − (t2 − t1)) / 2`, half the round trip spent on the
/// network, whatever the asymmetry of the two directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct ClockSync {
    /// Added to the process's timestamps.
    pub offset_ns: i64,
    /// Bound on the error of `offset_ns`.
    pub error_ns: u64,
}

impl ClockSync {
    /// The same clock (processes of one host).
    pub const SAME_HOST: ClockSync = ClockSync {
        offset_ns: 0,
        error_ns: 0,
    };

    /// The estimate from one round trip (see the type's docs): `t0`, `t3` on the
    /// trace's clock, `t1`, `t2` on the process's. `None` if the stamps are inconsistent
    /// (the answer before the request, or the node's time longer than the round trip).
    pub fn from_round_trip(t0: u64, t1: u64, t2: u64, t3: u64) -> Option<ClockSync> {
        if t3 < t0 || t2 < t1 || t2 - t1 > t3 - t0 {
            return None;
        }
        let offset = ((t0 as i128 - t1 as i128) + (t3 as i128 - t2 as i128)) / 2;
        Some(ClockSync {
            offset_ns: i64::try_from(offset).ok()?,
            error_ns: ((t3 - t0) - (t2 - t1)).div_ceil(2),
        })
    }

    /// `inner` (a process's sync to an intermediate clock) followed by `self` (that
    /// clock's sync to the trace's): offsets add, errors add.
    pub fn then(self, inner: ClockSync) -> ClockSync {
        ClockSync {
            offset_ns: self.offset_ns.saturating_add(inner.offset_ns),
            error_ns: self.error_ns.saturating_add(inner.error_ns),
        }
    }

    /// `t` (on the process's clock) on the trace's clock.
    pub fn apply(self, t: u64) -> u64 {
        (t as i128 + self.offset_ns as i128).clamp(0, u64::MAX as i128) as u64
    }
}

/// What one worker (one process track) recorded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessTrace {
    /// The worker's name (`"host (level 3)"`, `"chip_process dev=0"`, `"sub_worker 1"`,
    /// `"remote node hostB"`).
    pub name: String,
    /// Its process id (0 when unknown).
    pub pid: u32,
    /// Its host (empty: the trace's own host).
    pub host: String,
    /// Its clock against the trace's.
    pub clock: ClockSync,
    /// Its spans, on its own clock.
    pub spans: Vec<Span>,
    /// Names of its threads (`(tid, "orchestrator")`), for the spans' `tid`s.
    pub threads: Vec<(u64, String)>,
    /// Names of its cores by core id (`"core 0 (AIC)"`), for the core records.
    pub cores: Vec<String>,
    /// Its core records, on its own clock.
    pub records: Vec<CoreRecord>,
    /// Spans that were recorded but dropped to keep the trace bounded.
    pub dropped_spans: u64,
    /// Core records dropped likewise.
    pub dropped_records: u64,
}

impl ProcessTrace {
    /// An empty trace of a worker.
    pub fn new(name: &str, pid: u32, host: &str) -> ProcessTrace {
        ProcessTrace {
            name: name.to_owned(),
            pid,
            host: host.to_owned(),
            ..ProcessTrace::default()
        }
    }

    /// Names thread `tid` (once; a later name for the same tid is ignored).
    pub fn name_thread(&mut self, tid: u64, name: &str) {
        if !self.threads.iter().any(|(t, _)| *t == tid) && self.threads.len() < MAX_THREADS {
            self.threads.push((tid, name.to_owned()));
        }
    }

    /// The name of thread `tid`, if it has one.
    pub fn thread_name(&self, tid: u64) -> Option<&str> {
        self.threads
            .iter()
            .find(|(t, _)| *t == tid)
            .map(|(_, n)| n.as_str())
    }
}

/// Every process of a run (or of several runs) on one clock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trace {
    /// The processes, in the order they first appeared.
    pub processes: Vec<ProcessTrace>,
    /// What was lost on the way (processes dropped, truncated children), for people.
    pub notes: Vec<String>,
}

/// Longest string the encoding carries (longer ones are cut on a character boundary and
/// end in `~`, as the reference's markers do).
pub const MAX_STRING: usize = 512;
/// Most attributes per span the encoding carries.
pub const MAX_ATTRS: usize = 16;
/// Most processes a trace carries.
pub const MAX_PROCESSES: usize = 4096;
/// Most notes a trace carries.
pub const MAX_NOTES: usize = 64;
/// Most core names per process.
pub const MAX_CORES: usize = 1024;
/// Most thread names per process.
pub const MAX_THREADS: usize = 1024;

const MAGIC: [u8; 4] = *b"STRT";
const VERSION: u16 = 1;
/// magic, version, flags (u16), processes dropped (u64), notes (u32), processes (u32).
const HEADER: usize = 4 + 2 + 2 + 8 + 4 + 4;

impl Trace {
    /// The process (worker) named `name` on `host`, appended if there is none yet, so the
    /// spans of many runs of one worker land on one track. Workers are told apart by name
    /// and host (a worker's name is unique in its tree: the parent names its children);
    /// `pid` fills in a pid still unknown (0).
    pub fn process_mut(&mut self, name: &str, pid: u32, host: &str) -> &mut ProcessTrace {
        let at = match self.position(name, host) {
            Some(i) => i,
            None => {
                self.processes.push(ProcessTrace::new(name, pid, host));
                self.processes.len() - 1
            }
        };
        let p = &mut self.processes[at];
        if p.pid == 0 {
            p.pid = pid;
        }
        p
    }

    fn position(&self, name: &str, host: &str) -> Option<usize> {
        self.processes
            .iter()
            .position(|p| p.name == name && p.host == host)
    }

    /// Adds `other`'s processes and notes, its clocks composed with `clock` (how
    /// `other`'s trace clock maps onto this one's). A process of the same name and host is
    /// merged into the existing one (whose clock stays: the records are moved onto it).
    /// `host`, when not empty, replaces the empty host of `other`'s processes (they ran on
    /// that host).
    pub fn absorb(&mut self, other: Trace, clock: ClockSync, host: &str) {
        for mut p in other.processes {
            if p.host.is_empty() {
                p.host = host.to_owned();
            }
            let clock = clock.then(p.clock);
            match self.position(&p.name, &p.host) {
                Some(i) => {
                    let q = &mut self.processes[i];
                    if q.pid == 0 {
                        q.pid = p.pid;
                    }
                    for (tid, name) in &p.threads {
                        q.name_thread(*tid, name);
                    }
                    // One track per process: the records of an earlier clock estimate are
                    // moved onto this one's clock (they differ by the two estimates' gap,
                    // well inside both errors).
                    let shift = clock.offset_ns.saturating_sub(q.clock.offset_ns);
                    let moved =
                        |t: u64| (t as i128 + shift as i128).clamp(0, u64::MAX as i128) as u64;
                    for mut s in p.spans {
                        s.ts = moved(s.ts);
                        q.spans.push(s);
                    }
                    if q.cores.len() < p.cores.len() {
                        q.cores = p.cores;
                    }
                    for mut r in p.records {
                        r.start_ns = moved(r.start_ns);
                        r.end_ns = moved(r.end_ns);
                        q.records.push(r);
                    }
                    q.dropped_spans = q.dropped_spans.saturating_add(p.dropped_spans);
                    q.dropped_records = q.dropped_records.saturating_add(p.dropped_records);
                }
                None if self.processes.len() < MAX_PROCESSES => {
                    p.clock = clock;
                    self.processes.push(p);
                }
                None => self.note(format!(
                    "process {} ({}) dropped: the trace holds {MAX_PROCESSES} processes",
                    p.name, p.pid
                )),
            }
        }
        for n in other.notes {
            self.note(n);
        }
    }

    /// Names the processes of a child's trace as its parent knows the child: the first
    /// process (the child itself) becomes `label`, every other one (the child's own
    /// children) `"{label} / {name}"`, so names stay unique in the parent's tree.
    pub fn nest_under(&mut self, label: &str) {
        for (i, p) in self.processes.iter_mut().enumerate() {
            p.name = if i == 0 {
                label.to_owned()
            } else {
                format!("{label} / {}", p.name)
            };
        }
    }

    /// Sets the clock of every process on `host` (a better estimate of a remote node's
    /// offset), moving nothing.
    pub fn set_clock(&mut self, host: &str, clock: ClockSync) {
        for p in self.processes.iter_mut().filter(|p| p.host == host) {
            p.clock = clock;
        }
    }

    /// Adds a note (at most [`MAX_NOTES`]; equal notes once).
    pub fn note(&mut self, note: String) {
        if self.notes.len() < MAX_NOTES && !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// Spans of every process.
    pub fn span_count(&self) -> usize {
        self.processes.iter().map(|p| p.spans.len()).sum()
    }

    /// Core records of every process.
    pub fn record_count(&self) -> usize {
        self.processes.iter().map(|p| p.records.len()).sum()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.notes.is_empty()
    }

    /// Drops spans and records past `max_events` in all (the latest ones, process by
    /// process from the last), counting them as dropped, so a trace that accumulates many
    /// runs stays bounded.
    pub fn truncate_events(&mut self, max_events: usize) {
        let mut total = self.span_count() + self.record_count();
        for p in self.processes.iter_mut().rev() {
            if total <= max_events {
                break;
            }
            let over = total - max_events;
            let r = over.min(p.records.len());
            p.records.truncate(p.records.len() - r);
            p.dropped_records = p.dropped_records.saturating_add(r as u64);
            let s = (over - r).min(p.spans.len());
            p.spans.truncate(p.spans.len() - s);
            p.dropped_spans = p.dropped_spans.saturating_add(s as u64);
            total -= r + s;
        }
    }

    /// The trace as at most `limit` bytes. What does not fit is left out and counted:
    /// spans and core records in their process's dropped counts, whole processes in the
    /// header (decoded as a note). Below the header's size (24 bytes) the result is empty.
    pub fn encode_bounded(&self, limit: usize) -> Vec<u8> {
        if limit < HEADER {
            return Vec::new();
        }
        let mut e = Enc {
            buf: Vec::with_capacity(limit.min(4096)),
            limit,
        };
        e.buf.extend_from_slice(&MAGIC);
        e.buf.extend_from_slice(&VERSION.to_le_bytes());
        e.buf.extend_from_slice(&0u16.to_le_bytes());
        let dropped_at = e.buf.len();
        e.buf.extend_from_slice(&0u64.to_le_bytes());
        let notes_at = e.buf.len();
        e.buf.extend_from_slice(&0u32.to_le_bytes());
        let procs_at = e.buf.len();
        e.buf.extend_from_slice(&0u32.to_le_bytes());
        let mut notes = 0u32;
        for n in self.notes.iter().take(MAX_NOTES) {
            let mut item = Vec::new();
            put_str(&mut item, n);
            if e.try_push(&item) {
                notes += 1;
            }
        }
        let mut procs = 0u32;
        let mut dropped_procs = 0u64;
        for p in &self.processes {
            if procs as usize >= MAX_PROCESSES || !e.process(p) {
                dropped_procs += 1;
            } else {
                procs += 1;
            }
        }
        e.buf[dropped_at..dropped_at + 8].copy_from_slice(&dropped_procs.to_le_bytes());
        e.buf[notes_at..notes_at + 4].copy_from_slice(&notes.to_le_bytes());
        e.buf[procs_at..procs_at + 4].copy_from_slice(&procs.to_le_bytes());
        e.buf
    }

    /// Decodes what [`Trace::encode_bounded`] wrote — bytes that may come from another
    /// process and are checked throughout. Empty input is an empty trace.
    ///
    /// # Errors
    /// [`TypesError::Malformed`] naming what is wrong (bad magic or version, a count or
    /// length past the bytes, a string that is not UTF-8, trailing bytes).
    pub fn decode(bytes: &[u8]) -> Result<Trace, TypesError> {
        if bytes.is_empty() {
            return Ok(Trace::default());
        }
        let mut d = Dec { b: bytes, at: 0 };
        if d.take(4)? != MAGIC {
            return Err(bad("trace: bad magic"));
        }
        let version = d.u16()?;
        if version != VERSION {
            return Err(bad(format!(
                "trace: version {version}, this build reads {VERSION}"
            )));
        }
        let flags = d.u16()?;
        if flags != 0 {
            return Err(bad(format!("trace: unknown flags {flags:#x}")));
        }
        let dropped_procs = d.u64()?;
        let n_notes = d.count(2, MAX_NOTES, "notes")?;
        let n_procs = d.count(PROCESS_MIN, MAX_PROCESSES, "processes")?;
        let mut t = Trace::default();
        for _ in 0..n_notes {
            t.notes.push(d.string()?);
        }
        for _ in 0..n_procs {
            t.processes.push(d.process()?);
        }
        if d.at != bytes.len() {
            return Err(bad(format!("trace: {} trailing bytes", bytes.len() - d.at)));
        }
        if dropped_procs > 0 {
            t.note(format!(
                "{dropped_procs} process(es) dropped: the trace did not fit its bounded room"
            ));
        }
        Ok(t)
    }
}

fn bad(m: impl Into<String>) -> TypesError {
    TypesError::Malformed(m.into())
}

/// `s` cut to [`MAX_STRING`] bytes on a character boundary, ending in `~` when cut.
fn capped(s: &str) -> std::borrow::Cow<'_, str> {
    if s.len() <= MAX_STRING {
        return s.into();
    }
    let mut end = MAX_STRING - 1;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}~", &s[..end]).into()
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    let s = capped(s);
    buf.extend_from_slice(&(s.len() as u16).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_span(buf: &mut Vec<u8>, s: &Span) {
    buf.extend_from_slice(&s.v.to_le_bytes());
    buf.extend_from_slice(&s.pid.to_le_bytes());
    buf.extend_from_slice(&s.tid.to_le_bytes());
    buf.extend_from_slice(&s.inv.to_le_bytes());
    put_str(buf, &s.hid);
    buf.extend_from_slice(&s.depth.to_le_bytes());
    put_str(buf, &s.name);
    buf.extend_from_slice(&s.ts.to_le_bytes());
    buf.extend_from_slice(&s.dur.to_le_bytes());
    let n = s.attrs.len().min(MAX_ATTRS);
    buf.push(n as u8);
    for (k, v) in &s.attrs[..n] {
        put_str(buf, k);
        put_str(buf, v);
    }
}

/// v, pid, tid, inv, hid len, depth, name len, ts, dur, attrs count.
const SPAN_MIN: usize = 4 + 4 + 8 + 8 + 2 + 4 + 2 + 8 + 8 + 1;
/// core, task, block, lane, kernel len, start, end.
const RECORD_MIN: usize = 4 + 8 + 4 + 1 + 2 + 8 + 8;
/// name, pid, host, offset, error, dropped ×2, threads, cores, spans, records.
const PROCESS_MIN: usize = 2 + 4 + 2 + 8 + 8 + 8 + 8 + 4 + 4 + 4 + 4;

fn put_record(buf: &mut Vec<u8>, r: &CoreRecord) {
    buf.extend_from_slice(&r.core.to_le_bytes());
    buf.extend_from_slice(&r.task.to_le_bytes());
    buf.extend_from_slice(&r.block.to_le_bytes());
    buf.push(r.lane);
    put_str(buf, &r.kernel);
    buf.extend_from_slice(&r.start_ns.to_le_bytes());
    buf.extend_from_slice(&r.end_ns.to_le_bytes());
}

struct Enc {
    buf: Vec<u8>,
    limit: usize,
}

impl Enc {
    fn room(&self) -> usize {
        self.limit.saturating_sub(self.buf.len())
    }

    fn try_push(&mut self, item: &[u8]) -> bool {
        if item.len() > self.room() {
            return false;
        }
        self.buf.extend_from_slice(item);
        true
    }

    /// Writes a process; `false` (nothing written) if not even its header fits.
    fn process(&mut self, p: &ProcessTrace) -> bool {
        let mut head = Vec::with_capacity(64);
        put_str(&mut head, &p.name);
        head.extend_from_slice(&p.pid.to_le_bytes());
        put_str(&mut head, &p.host);
        head.extend_from_slice(&p.clock.offset_ns.to_le_bytes());
        head.extend_from_slice(&p.clock.error_ns.to_le_bytes());
        let dropped_at = head.len();
        head.extend_from_slice(&0u64.to_le_bytes());
        head.extend_from_slice(&0u64.to_le_bytes());
        let threads = p.threads.len().min(MAX_THREADS);
        head.extend_from_slice(&(threads as u32).to_le_bytes());
        for (tid, name) in &p.threads[..threads] {
            head.extend_from_slice(&tid.to_le_bytes());
            put_str(&mut head, name);
        }
        let cores = p.cores.len().min(MAX_CORES);
        head.extend_from_slice(&(cores as u32).to_le_bytes());
        for c in &p.cores[..cores] {
            put_str(&mut head, c);
        }
        // The two counts follow the header; reserve them with it.
        if head.len() + 8 > self.room() {
            return false;
        }
        let start = self.buf.len();
        self.buf.extend_from_slice(&head);
        let spans_at = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_le_bytes());
        let mut item = Vec::with_capacity(128);
        let mut spans = 0u32;
        let mut dropped_spans = p.dropped_spans;
        // Reserve the record count while writing spans.
        self.limit -= 4;
        for s in &p.spans {
            item.clear();
            put_span(&mut item, s);
            if spans < u32::MAX && self.try_push(&item) {
                spans += 1;
            } else {
                dropped_spans += 1;
            }
        }
        self.limit += 4;
        let records_at = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_le_bytes());
        let mut records = 0u32;
        let mut dropped_records = p.dropped_records;
        for r in &p.records {
            item.clear();
            put_record(&mut item, r);
            if records < u32::MAX && self.try_push(&item) {
                records += 1;
            } else {
                dropped_records += 1;
            }
        }
        let d = start + dropped_at;
        self.buf[d..d + 8].copy_from_slice(&dropped_spans.to_le_bytes());
        self.buf[d + 8..d + 16].copy_from_slice(&dropped_records.to_le_bytes());
        self.buf[spans_at..spans_at + 4].copy_from_slice(&spans.to_le_bytes());
        self.buf[records_at..records_at + 4].copy_from_slice(&records.to_le_bytes());
        true
    }
}

struct Dec<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], TypesError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                bad(format!(
                    "trace: {n} bytes needed at byte {} of {}",
                    self.at,
                    self.b.len()
                ))
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], TypesError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, TypesError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, TypesError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, TypesError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, TypesError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64, TypesError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A `u32` count of items of at least `min` bytes each, at most `max`, that the
    /// remaining bytes can hold (so nothing is allocated past the input's size).
    fn count(&mut self, min: usize, max: usize, what: &str) -> Result<usize, TypesError> {
        let n = self.u32()? as usize;
        let left = self.b.len() - self.at;
        if n > max || n.saturating_mul(min) > left {
            return Err(bad(format!(
                "trace: {n} {what} announced; at most {max}, and {left} bytes left"
            )));
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, TypesError> {
        let n = self.u16()? as usize;
        if n > MAX_STRING {
            return Err(bad(format!(
                "trace: a {n}-byte string (at most {MAX_STRING})"
            )));
        }
        let s = self.take(n)?;
        std::str::from_utf8(s)
            .map(str::to_owned)
            .map_err(|e| bad(format!("trace: a string that is not UTF-8: {e}")))
    }

    fn span(&mut self) -> Result<Span, TypesError> {
        let v = self.u32()?;
        let pid = self.u32()?;
        let tid = self.u64()?;
        let inv = self.u64()?;
        let hid = self.string()?;
        let depth = self.u32()?;
        let name = self.string()?;
        let ts = self.u64()?;
        let dur = self.u64()?;
        let n = self.u8()? as usize;
        if n > MAX_ATTRS {
            return Err(bad(format!(
                "trace: a span with {n} attributes (at most {MAX_ATTRS})"
            )));
        }
        let mut attrs = Vec::with_capacity(n);
        for _ in 0..n {
            let k = self.string()?;
            let v = self.string()?;
            attrs.push((k, v));
        }
        Ok(Span {
            v,
            pid,
            tid,
            inv,
            hid,
            depth,
            name,
            ts,
            dur,
            attrs,
        })
    }

    fn record(&mut self) -> Result<CoreRecord, TypesError> {
        Ok(CoreRecord {
            core: self.u32()?,
            task: self.u64()?,
            block: self.u32()?,
            lane: self.u8()?,
            kernel: self.string()?,
            start_ns: self.u64()?,
            end_ns: self.u64()?,
        })
    }

    fn process(&mut self) -> Result<ProcessTrace, TypesError> {
        let name = self.string()?;
        let pid = self.u32()?;
        let host = self.string()?;
        let offset_ns = self.i64()?;
        let error_ns = self.u64()?;
        let dropped_spans = self.u64()?;
        let dropped_records = self.u64()?;
        let n_threads = self.count(10, MAX_THREADS, "thread names")?;
        let mut threads = Vec::with_capacity(n_threads);
        for _ in 0..n_threads {
            let tid = self.u64()?;
            threads.push((tid, self.string()?));
        }
        let n_cores = self.count(2, MAX_CORES, "core names")?;
        let mut cores = Vec::with_capacity(n_cores);
        for _ in 0..n_cores {
            cores.push(self.string()?);
        }
        let n_spans = self.count(SPAN_MIN, usize::MAX, "spans")?;
        let mut spans = Vec::with_capacity(n_spans);
        for _ in 0..n_spans {
            spans.push(self.span()?);
        }
        let n_records = self.count(RECORD_MIN, usize::MAX, "core records")?;
        let mut records = Vec::with_capacity(n_records);
        for _ in 0..n_records {
            records.push(self.record()?);
        }
        Ok(ProcessTrace {
            name,
            pid,
            host,
            clock: ClockSync {
                offset_ns,
                error_ns,
            },
            spans,
            threads,
            cores,
            records,
            dropped_spans,
            dropped_records,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Trace {
        let mut t = Trace::default();
        t.note("a note".into());
        let p = t.process_mut("host (level 3)", 10, "");
        p.spans
            .push(Span::new(10, 1, 1, "ab", "l3.run", 100, 50).with_attr("worker", 0));
        p.spans
            .push(Span::new(10, 1, 1, "ab", "l3.run.submit", 110, 5));
        let c = t.process_mut("chip_process dev=0", 11, "");
        c.name_thread(2, "host thread");
        c.cores = vec!["core 0 (AIC)".into(), "core 1 (AIV)".into()];
        c.spans.push(
            Span::new(11, 2, 3, "cd", "chip.run.runner_run.device_wall", 120, 9)
                .with_attr("clk", "dev"),
        );
        c.records.push(CoreRecord {
            core: 1,
            task: 4,
            block: 0,
            lane: 1,
            kernel: "add".into(),
            start_ns: 121,
            end_ns: 125,
        });
        t
    }

    #[test]
    fn a_trace_round_trips_and_every_prefix_of_its_bytes_is_refused() {
        let t = sample();
        let bytes = t.encode_bounded(1 << 16);
        assert_eq!(Trace::decode(&bytes).unwrap(), t);
        for n in 1..bytes.len() {
            assert!(Trace::decode(&bytes[..n]).is_err(), "prefix {n}");
        }
        assert!(Trace::decode(&[bytes.as_slice(), &[0]].concat()).is_err());
        assert!(t.processes[1].spans[0].is_device());
    }

    #[test]
    fn a_bounded_encoding_never_exceeds_its_room_and_counts_what_it_left_out() {
        let t = sample();
        let full = t.encode_bounded(1 << 16).len();
        for limit in 0..full + 8 {
            let bytes = t.encode_bounded(limit);
            assert!(bytes.len() <= limit, "limit {limit}: {} bytes", bytes.len());
            let back = Trace::decode(&bytes).unwrap();
            let kept: usize = back.span_count() + back.record_count();
            let dropped: u64 = back
                .processes
                .iter()
                .map(|p| p.dropped_spans + p.dropped_records)
                .sum();
            let procs = back.processes.len();
            // Every span and record of a process that made it is either kept or counted;
            // a process that did not make it is named in a note.
            let expected: usize = t.processes[..procs]
                .iter()
                .map(|p| p.spans.len() + p.records.len())
                .sum();
            if !bytes.is_empty() {
                assert_eq!(kept as u64 + dropped, expected as u64, "limit {limit}");
                if procs < t.processes.len() {
                    assert!(back.notes.iter().any(|n| n.contains("dropped")), "{back:?}");
                }
            }
        }
    }

    #[test]
    fn counts_past_the_input_are_refused_before_anything_is_allocated() {
        let mut bytes = Trace::default().encode_bounded(64);
        // Announce 4 billion processes.
        let n = bytes.len();
        bytes[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = Trace::decode(&bytes).unwrap_err().to_string();
        assert!(e.contains("processes announced"), "{e}");
    }

    #[test]
    fn long_strings_are_capped_with_a_tilde() {
        let mut t = Trace::default();
        t.process_mut(&"é".repeat(400), 1, "");
        let back = Trace::decode(&t.encode_bounded(4096)).unwrap();
        let name = &back.processes[0].name;
        assert!(name.len() <= MAX_STRING && name.ends_with('~'), "{name}");
    }

    #[test]
    fn clocks_from_a_round_trip_bound_their_error_by_half_the_network_time() {
        // The node's clock is 1000 ns ahead; 40 ns each way, 20 ns of work on the node.
        let (t0, t1, t2, t3) = (100, 100 + 40 + 1000, 100 + 40 + 20 + 1000, 100 + 100);
        let c = ClockSync::from_round_trip(t0, t1, t2, t3).unwrap();
        assert_eq!(
            c,
            ClockSync {
                offset_ns: -1000,
                error_ns: 40
            }
        );
        assert_eq!(c.apply(t1), 140);
        // Asymmetric: 10 ns out, 70 ns back: still within the error bound.
        let c = ClockSync::from_round_trip(100, 1110, 1130, 200).unwrap();
        assert!((c.offset_ns + 1000).unsigned_abs() <= c.error_ns, "{c:?}");
        assert_eq!(ClockSync::from_round_trip(100, 0, 500, 200), None);
        assert_eq!(
            ClockSync::SAME_HOST.then(c),
            c,
            "composition with the same clock changes nothing"
        );
    }

    #[test]
    fn absorbing_merges_tracks_and_bounds_events() {
        let mut t = sample();
        let mut other = sample();
        other.processes[1].clock = ClockSync {
            offset_ns: 5,
            error_ns: 1,
        };
        t.absorb(other, ClockSync::SAME_HOST, "");
        assert_eq!(t.processes.len(), 2);
        assert_eq!(t.processes[1].spans.len(), 2);
        assert_eq!(
            t.processes[1].spans[1].ts, 125,
            "moved onto the track's clock"
        );
        t.truncate_events(3);
        assert_eq!(t.span_count() + t.record_count(), 3);
        assert_eq!(
            t.processes
                .iter()
                .map(|p| p.dropped_spans + p.dropped_records)
                .sum::<u64>(),
            5,
            "4 host spans, 2 chip spans and 2 records, 3 kept"
        );
    }
}
