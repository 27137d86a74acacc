//! The wait-for state of a stalled run ([`WaitFor`]): what the level that gave up was
//! waiting for — tasks pending on producers, tasks running on a worker, signal cells a
//! kernel waits on, a heap ring that cannot make room — as data and as a short text, with
//! a bounded byte encoding so it can travel from a chip's process to its parent.

use crate::TypesError;
use std::fmt;

/// Most bytes [`WaitFor::encode`] writes: what a failed task's completion may carry across
/// a mailbox (the snapshot is cut down to fit, [`WaitFor::omitted`] counting what was
/// left out).
pub const WAIT_FOR_MAX_BYTES: usize = 4096;

/// Most entries kept per list (the oldest tasks first: where a missing producer sits).
pub const WAIT_FOR_MAX_ENTRIES: usize = 8;

/// Most task ids or worker ids kept per entry.
pub const WAIT_FOR_MAX_IDS: usize = 8;

/// Longest text kept per name (and per comparison), in bytes.
pub const WAIT_FOR_MAX_TEXT: usize = 64;

/// Longest text kept for [`WaitFor::place`] and [`WaitFor::stalled`], in bytes.
pub const WAIT_FOR_MAX_HEADING: usize = 160;

const ENCODING_VERSION: u8 = 1;

/// Longest comparison kept (the symbols are one or two bytes).
const MAX_CMP: usize = 4;

/// Where a task is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Executor {
    /// An emulated AICore of a chip (its physical index).
    Core(u32),
    /// A next-level worker (a chip or a level-3 worker) by its worker id.
    Worker(u32),
    /// A host sub-worker by its index.
    SubWorker(u32),
}

impl fmt::Display for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Executor::Core(c) => write!(f, "core {c}"),
            Executor::Worker(w) => write!(f, "worker {w}"),
            Executor::SubWorker(s) => write!(f, "sub-worker {s}"),
        }
    }
}

/// A task that has not started: waiting for producers (`producers` non-empty) or, ready,
/// for a worker (`workers`: those it needs that are busy).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PendingTask {
    /// The task id (as the level that reports it numbers its tasks).
    pub task: u64,
    /// What the task runs (kernel, callable), empty if unknown.
    pub name: String,
    /// Whether every producer finished (it waits only for a worker).
    pub ready: bool,
    /// The producers it still waits for (task ids, oldest first).
    pub producers: Vec<u64>,
    /// The workers it needs that are not free (a group needs all of its workers idle).
    pub workers: Vec<u32>,
}

/// A task that is running (and, in a stall, not finishing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningTask {
    /// The task id.
    pub task: u64,
    /// What it runs, empty if unknown.
    pub name: String,
    /// Where it runs.
    pub on: Executor,
    /// How long it has been running when the snapshot was taken, in milliseconds (`None`
    /// if not known).
    pub for_ms: Option<u64>,
}

/// A kernel blocked in a signal wait: which cell, the condition, and the cell's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalWait {
    /// The waiting kernel's task.
    pub task: u64,
    /// The core it runs on.
    pub core: u32,
    /// The world rank whose cell it waits on (its own).
    pub rank: u32,
    /// The cell: its flat element index in the signal tensor.
    pub cell: u64,
    /// The comparison (`"=="`, `">="`, ...): the wait ends when `value <cmp> expected`.
    pub cmp: String,
    /// The value it waits for.
    pub expected: i32,
    /// The cell's value when last read.
    pub value: i32,
    /// Whether the wait gave up (its own deadline passed) rather than still waiting.
    pub gave_up: bool,
}

/// A heap ring that cannot make room for an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingWait {
    /// The ring (0..4, by scope depth).
    pub ring: u32,
    /// Its heap size in bytes.
    pub heap_bytes: u64,
    /// The (aligned) request that does not fit.
    pub requested: u64,
    /// The largest contiguous free run.
    pub free: u64,
    /// The tasks whose allocations still hold the ring's bytes, oldest first: the ring
    /// reclaims in FIFO order, so the first one is what the allocation waits for.
    pub held_by: Vec<u64>,
}

/// The wait-for state of a run that made no progress for its budget: carried by the error
/// that ends the wait, so the cycle or the missing producer shows instead of a bare
/// timeout. Lists are bounded ([`WAIT_FOR_MAX_ENTRIES`], oldest tasks first); `omitted`
/// counts what was left out.
///
/// ```
/// use strata_types::{Executor, PendingTask, RunningTask, WaitFor};
/// let w = WaitFor {
///     place: "level-3 worker".into(),
///     stalled: "run 1 did not finish within 200ms".into(),
///     pending: vec![PendingTask { task: 2, name: "allreduce".into(), ready: true, producers: vec![], workers: vec![1] }],
///     running: vec![RunningTask { task: 1, name: "spin".into(), on: Executor::Worker(1), for_ms: Some(200) }],
///     ..WaitFor::default()
/// };
/// let text = w.to_string();
/// assert!(text.contains("task 1 \"spin\" running on worker 1 for 200 ms"), "{text}");
/// assert!(text.contains("task 2 \"allreduce\" ready, waits for workers [1]"), "{text}");
/// assert_eq!(WaitFor::decode(&w.encode())?, w);
/// # Ok::<(), strata_types::TypesError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WaitFor {
    /// Where the stall was observed (`"chip"`, `"level-3 worker"`, ...).
    pub place: String,
    /// What gave up, in one line.
    pub stalled: String,
    /// Tasks not started, with what each waits for.
    pub pending: Vec<PendingTask>,
    /// Tasks running, where and for how long.
    pub running: Vec<RunningTask>,
    /// Kernels blocked in signal waits.
    pub signals: Vec<SignalWait>,
    /// Heap rings that cannot make room.
    pub rings: Vec<RingWait>,
    /// Entries left out to keep the snapshot bounded.
    pub omitted: u32,
}

impl WaitFor {
    /// Whether it names nothing to wait for (no task, signal or ring).
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
            && self.running.is_empty()
            && self.signals.is_empty()
            && self.rings.is_empty()
    }

    /// Cuts every list and text to the bounds (counting dropped entries in `omitted`).
    pub fn bound(&mut self) {
        fn cut<T>(v: &mut Vec<T>, omitted: &mut u32) {
            if v.len() > WAIT_FOR_MAX_ENTRIES {
                *omitted = omitted.saturating_add((v.len() - WAIT_FOR_MAX_ENTRIES) as u32);
                v.truncate(WAIT_FOR_MAX_ENTRIES);
            }
        }
        let mut omitted = self.omitted;
        cut(&mut self.pending, &mut omitted);
        cut(&mut self.running, &mut omitted);
        cut(&mut self.signals, &mut omitted);
        cut(&mut self.rings, &mut omitted);
        self.omitted = omitted;
        truncate(&mut self.place, WAIT_FOR_MAX_HEADING);
        truncate(&mut self.stalled, WAIT_FOR_MAX_HEADING);
        for p in &mut self.pending {
            truncate(&mut p.name, WAIT_FOR_MAX_TEXT);
            p.producers.truncate(WAIT_FOR_MAX_IDS);
            p.workers.truncate(WAIT_FOR_MAX_IDS);
        }
        for r in &mut self.running {
            truncate(&mut r.name, WAIT_FOR_MAX_TEXT);
        }
        for s in &mut self.signals {
            truncate(&mut s.cmp, MAX_CMP);
        }
        for r in &mut self.rings {
            r.held_by.truncate(WAIT_FOR_MAX_IDS);
        }
    }

    /// The bounded byte encoding (at most [`WAIT_FOR_MAX_BYTES`]): [`WaitFor::bound`] is
    /// applied to a copy first.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = self.clone();
        w.bound();
        let out = w.encode_bounded();
        if out.len() <= WAIT_FOR_MAX_BYTES {
            return out;
        }
        // Unreachable with the bounds above (the tests check the largest case); should a
        // bound change, the headings and the count still travel.
        let dropped = w.pending.len() + w.running.len() + w.signals.len() + w.rings.len();
        w.omitted = w.omitted.saturating_add(dropped as u32);
        w.pending.clear();
        w.running.clear();
        w.signals.clear();
        w.rings.clear();
        w.encode_bounded()
    }

    fn encode_bounded(&self) -> Vec<u8> {
        let w = self;
        let mut out = Vec::with_capacity(512);
        out.push(ENCODING_VERSION);
        put_str(&mut out, &w.place);
        put_str(&mut out, &w.stalled);
        out.extend_from_slice(&w.omitted.to_le_bytes());
        out.push(w.pending.len() as u8);
        for p in &w.pending {
            out.extend_from_slice(&p.task.to_le_bytes());
            put_str(&mut out, &p.name);
            out.push(u8::from(p.ready));
            out.push(p.producers.len() as u8);
            for t in &p.producers {
                out.extend_from_slice(&t.to_le_bytes());
            }
            out.push(p.workers.len() as u8);
            for t in &p.workers {
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
        out.push(w.running.len() as u8);
        for r in &w.running {
            out.extend_from_slice(&r.task.to_le_bytes());
            put_str(&mut out, &r.name);
            let (kind, id) = match r.on {
                Executor::Core(c) => (0u8, c),
                Executor::Worker(c) => (1, c),
                Executor::SubWorker(c) => (2, c),
            };
            out.push(kind);
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&r.for_ms.unwrap_or(u64::MAX).to_le_bytes());
        }
        out.push(w.signals.len() as u8);
        for s in &w.signals {
            out.extend_from_slice(&s.task.to_le_bytes());
            out.extend_from_slice(&s.core.to_le_bytes());
            out.extend_from_slice(&s.rank.to_le_bytes());
            out.extend_from_slice(&s.cell.to_le_bytes());
            put_str(&mut out, &s.cmp);
            out.extend_from_slice(&s.expected.to_le_bytes());
            out.extend_from_slice(&s.value.to_le_bytes());
            out.push(u8::from(s.gave_up));
        }
        out.push(w.rings.len() as u8);
        for r in &w.rings {
            out.extend_from_slice(&r.ring.to_le_bytes());
            out.extend_from_slice(&r.heap_bytes.to_le_bytes());
            out.extend_from_slice(&r.requested.to_le_bytes());
            out.extend_from_slice(&r.free.to_le_bytes());
            out.push(r.held_by.len() as u8);
            for t in &r.held_by {
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
        out
    }

    /// Decodes [`WaitFor::encode`]'s bytes, checking every length against the bounds.
    ///
    /// # Errors
    /// [`TypesError::Malformed`] for bytes that are not such an encoding.
    pub fn decode(bytes: &[u8]) -> Result<WaitFor, TypesError> {
        if bytes.len() > WAIT_FOR_MAX_BYTES {
            return Err(malformed(format!(
                "{} bytes (at most {WAIT_FOR_MAX_BYTES})",
                bytes.len()
            )));
        }
        let mut r = Reader { b: bytes };
        let v = r.u8()?;
        if v != ENCODING_VERSION {
            return Err(malformed(format!("encoding version {v}")));
        }
        let mut w = WaitFor {
            place: r.str()?,
            stalled: r.str()?,
            omitted: r.u32()?,
            ..WaitFor::default()
        };
        for _ in 0..r.count(WAIT_FOR_MAX_ENTRIES)? {
            let task = r.u64()?;
            let name = r.str()?;
            let ready = r.flag()?;
            let producers = (0..r.count(WAIT_FOR_MAX_IDS)?)
                .map(|_| r.u64())
                .collect::<Result<_, _>>()?;
            let workers = (0..r.count(WAIT_FOR_MAX_IDS)?)
                .map(|_| r.u32())
                .collect::<Result<_, _>>()?;
            w.pending.push(PendingTask {
                task,
                name,
                ready,
                producers,
                workers,
            });
        }
        for _ in 0..r.count(WAIT_FOR_MAX_ENTRIES)? {
            let task = r.u64()?;
            let name = r.str()?;
            let kind = r.u8()?;
            let id = r.u32()?;
            let on = match kind {
                0 => Executor::Core(id),
                1 => Executor::Worker(id),
                2 => Executor::SubWorker(id),
                k => return Err(malformed(format!("executor kind {k}"))),
            };
            let ms = r.u64()?;
            w.running.push(RunningTask {
                task,
                name,
                on,
                for_ms: (ms != u64::MAX).then_some(ms),
            });
        }
        for _ in 0..r.count(WAIT_FOR_MAX_ENTRIES)? {
            w.signals.push(SignalWait {
                task: r.u64()?,
                core: r.u32()?,
                rank: r.u32()?,
                cell: r.u64()?,
                cmp: r.str()?,
                expected: r.u32()? as i32,
                value: r.u32()? as i32,
                gave_up: r.flag()?,
            });
        }
        for _ in 0..r.count(WAIT_FOR_MAX_ENTRIES)? {
            let ring = r.u32()?;
            let heap_bytes = r.u64()?;
            let requested = r.u64()?;
            let free = r.u64()?;
            let held_by = (0..r.count(WAIT_FOR_MAX_IDS)?)
                .map(|_| r.u64())
                .collect::<Result<_, _>>()?;
            w.rings.push(RingWait {
                ring,
                heap_bytes,
                requested,
                free,
                held_by,
            });
        }
        if !r.b.is_empty() {
            return Err(malformed(format!("{} trailing bytes", r.b.len())));
        }
        Ok(w)
    }
}

fn malformed(what: String) -> TypesError {
    TypesError::Malformed(format!("wait-for snapshot: {what}"))
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Bounded by `truncate` (to at most WAIT_FOR_MAX_HEADING < 256 bytes).
    let b = &s.as_bytes()[..s.len().min(WAIT_FOR_MAX_HEADING)];
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], TypesError> {
        if self.b.len() < n {
            return Err(malformed("truncated".into()));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, TypesError> {
        Ok(self.take(1)?[0])
    }
    fn flag(&mut self) -> Result<bool, TypesError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(malformed(format!("flag {v}"))),
        }
    }
    fn u32(&mut self) -> Result<u32, TypesError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, TypesError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn count(&mut self, max: usize) -> Result<usize, TypesError> {
        let n = self.u8()? as usize;
        if n > max {
            return Err(malformed(format!("{n} entries (at most {max})")));
        }
        Ok(n)
    }
    fn str(&mut self) -> Result<String, TypesError> {
        let n = self.u8()? as usize;
        if n > WAIT_FOR_MAX_HEADING {
            return Err(malformed(format!("{n}-byte text")));
        }
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| malformed("text not UTF-8".into()))
    }
}

fn ids<T: fmt::Display>(v: &[T]) -> String {
    let mut s = String::from("[");
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&x.to_string());
    }
    s.push(']');
    s
}

fn named(f: &mut fmt::Formatter<'_>, task: u64, name: &str) -> fmt::Result {
    write!(f, "task {task}")?;
    if !name.is_empty() {
        write!(f, " {name:?}")?;
    }
    Ok(())
}

/// One line per entry under a heading, e.g.
///
/// ```text
/// wait-for state at chip: kernel "wait_flag" (task 1) made no progress on core 0 for 300 ms
///   task 1 "wait_flag" running on core 0 for 300 ms
///   task 1 on core 0 (rank 0) waits for signal cell 3 >= 1, value 0
///   task 2 "consumer" pending, waits for producers [1]
/// ```
impl fmt::Display for WaitFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "wait-for state at {}: {}", self.place, self.stalled)?;
        for r in &self.running {
            f.write_str("\n  ")?;
            named(f, r.task, &r.name)?;
            write!(f, " running on {}", r.on)?;
            if let Some(ms) = r.for_ms {
                write!(f, " for {ms} ms")?;
            }
        }
        for s in &self.signals {
            write!(
                f,
                "\n  task {} on core {} (rank {}) {} signal cell {} {} {}, value {}",
                s.task,
                s.core,
                s.rank,
                if s.gave_up {
                    "gave up waiting for"
                } else {
                    "waits for"
                },
                s.cell,
                s.cmp,
                s.expected,
                s.value
            )?;
        }
        for r in &self.rings {
            write!(
                f,
                "\n  heap ring {} ({} bytes): {} bytes requested, {} free, held by tasks {}",
                r.ring,
                r.heap_bytes,
                r.requested,
                r.free,
                ids(&r.held_by)
            )?;
        }
        for p in &self.pending {
            f.write_str("\n  ")?;
            named(f, p.task, &p.name)?;
            f.write_str(if p.ready { " ready" } else { " pending" })?;
            if !p.producers.is_empty() {
                write!(f, ", waits for producers {}", ids(&p.producers))?;
            }
            if !p.workers.is_empty() {
                write!(f, ", waits for workers {}", ids(&p.workers))?;
            }
        }
        if self.omitted > 0 {
            write!(f, "\n  ({} more entries left out)", self.omitted)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> WaitFor {
        let name = "é".repeat(200);
        WaitFor {
            place: name.clone(),
            stalled: name.clone(),
            pending: (0..40)
                .map(|i| PendingTask {
                    task: i,
                    name: name.clone(),
                    ready: i % 2 == 0,
                    producers: (0..30).collect(),
                    workers: (0..30).collect(),
                })
                .collect(),
            running: (0..40)
                .map(|i| RunningTask {
                    task: i,
                    name: name.clone(),
                    on: Executor::SubWorker(i as u32),
                    for_ms: None,
                })
                .collect(),
            signals: (0..40)
                .map(|i| SignalWait {
                    task: i,
                    core: 1,
                    rank: 2,
                    cell: 3,
                    cmp: name.clone(),
                    expected: -1,
                    value: i32::MIN,
                    gave_up: true,
                })
                .collect(),
            rings: (0..40)
                .map(|i| RingWait {
                    ring: i,
                    heap_bytes: 1,
                    requested: 2,
                    free: 3,
                    held_by: (0..30).collect(),
                })
                .collect(),
            omitted: 1,
        }
    }

    #[test]
    fn the_largest_snapshot_fits_its_bound_and_round_trips_cut_down() {
        let w = full();
        let bytes = w.encode();
        assert!(bytes.len() <= WAIT_FOR_MAX_BYTES, "{}", bytes.len());
        let back = WaitFor::decode(&bytes).unwrap();
        assert!(
            !back.signals.is_empty(),
            "it fits without dropping the lists"
        );
        let mut bounded = w.clone();
        bounded.bound();
        assert_eq!(back, bounded);
        assert_eq!(back.omitted, 1 + 4 * 32);
        assert_eq!(back.pending[0].producers.len(), WAIT_FOR_MAX_IDS);
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let bytes = full().encode();
        for n in 0..bytes.len() {
            assert!(WaitFor::decode(&bytes[..n]).is_err(), "prefix {n}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(WaitFor::decode(&extra).is_err());
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            let _ = WaitFor::decode(&b);
        }
        assert!(WaitFor::decode(&vec![1; WAIT_FOR_MAX_BYTES + 1]).is_err());
    }

    #[test]
    fn the_text_names_every_entry() {
        let w = WaitFor {
            place: "chip".into(),
            stalled: "kernel timeout".into(),
            pending: vec![PendingTask {
                task: 2,
                name: "consumer".into(),
                ready: false,
                producers: vec![1],
                workers: vec![],
            }],
            running: vec![RunningTask {
                task: 1,
                name: "wait_flag".into(),
                on: Executor::Core(0),
                for_ms: Some(300),
            }],
            signals: vec![SignalWait {
                task: 1,
                core: 0,
                rank: 0,
                cell: 3,
                cmp: ">=".into(),
                expected: 1,
                value: 0,
                gave_up: false,
            }],
            rings: vec![RingWait {
                ring: 1,
                heap_bytes: 4096,
                requested: 8192,
                free: 2048,
                held_by: vec![1, 2],
            }],
            omitted: 0,
        };
        assert_eq!(
            w.to_string(),
            "wait-for state at chip: kernel timeout\n  \
             task 1 \"wait_flag\" running on core 0 for 300 ms\n  \
             task 1 on core 0 (rank 0) waits for signal cell 3 >= 1, value 0\n  \
             heap ring 1 (4096 bytes): 8192 bytes requested, 2048 free, held by tasks [1, 2]\n  \
             task 2 \"consumer\" pending, waits for producers [1]"
        );
    }
}
