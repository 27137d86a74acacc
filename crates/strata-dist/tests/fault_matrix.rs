//! The fault matrix: every kind of child a worker has (a chip, a sub-worker, a nested
//! level-3 worker under a level-4 one) × every way a child fails (SIGKILL mid-task,
//! SIGSTOP, a panic, an infinite loop, `exit(0)` mid-task, a corrupted mailbox frame).
//! Each cell checks that the run fails with a typed error naming the child within a bound,
//! that the task depending on the faulty one is poisoned (never runs), that independent
//! work in flight on another child finishes, that the worker closes, and that no process,
//! thread, descriptor (memfd or other) or `/dev/shm` entry is left behind. It prints the
//! time from the fault to the error (and the close) per cell as a markdown table, the
//! source of the table in `docs/reliability.md`.
//!
//! `harness = false`: the cells fork (a libtest harness would run them on threads). The
//! process is a child subreaper, so orphans are counted by the leak check; every cell runs
//! under `alarm(2)` so that a hang ends the binary instead of the CI job, and a failing
//! cell SIGKILLs what it started before its worker closes.
//!
//! Arguments: name filters (`chip`, `sub/loop`, …); `FAULT_MATRIX_ROUNDS=n` repeats the
//! matrix (the table shows the worst round); `FAULT_MATRIX_PENDING=1` runs the [`PENDING`]
//! cells too.

mod common;

use common::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, CoreArgs, OrchHandle};
use strata_dist::*;
use strata_host::ExecMode;
use strata_types::{ArgTag, CallConfig, DataType, TaskArgs};

/// The kind of child the fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A chip child of a level-3 worker (the fault is in its kernel).
    Chip,
    /// A sub-worker child of a level-3 worker (the fault is in its closure).
    Sub,
    /// A level-3 worker child of a level-4 worker (the fault is in its host
    /// orchestration, run by the level-3 process itself).
    Nested,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Chip, Kind::Sub, Kind::Nested];

    fn name(self) -> &'static str {
        match self {
            Kind::Chip => "chip",
            Kind::Sub => "sub",
            Kind::Nested => "nested-l3",
        }
    }

    /// How the engine names the faulty child in its errors.
    fn label(self) -> &'static str {
        match self {
            Kind::Chip => "chip_process dev=0",
            Kind::Sub => "sub_worker 0",
            Kind::Nested => "child_worker level=3 id=0",
        }
    }
}

/// What goes wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The child is SIGKILLed while its task runs.
    Kill,
    /// The child is SIGSTOPped while its task runs (it never answers again).
    Stop,
    /// The task panics.
    Panic,
    /// The task spins forever (bounded at 120 s so a broken run cannot outlive CI).
    Loop,
    /// The child calls `_exit(0)` in the middle of its task.
    Exit0,
    /// The identity in the child's task frames is overwritten while the task runs.
    Corrupt,
}

impl Fault {
    const ALL: [Fault; 6] = [
        Fault::Kill,
        Fault::Stop,
        Fault::Panic,
        Fault::Loop,
        Fault::Exit0,
        Fault::Corrupt,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILL mid-task",
            Fault::Stop => "SIGSTOP",
            Fault::Panic => "panic",
            Fault::Loop => "infinite loop",
            Fault::Exit0 => "exit(0) mid-task",
            Fault::Corrupt => "corrupted frame",
        }
    }

    fn code(self) -> u64 {
        self as u64
    }

    fn from_code(c: u64) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.code() == c)
    }

    /// Faults only a deadline can end: the run is given one (nested: the backstop).
    fn needs_deadline(self) -> bool {
        matches!(self, Fault::Stop | Fault::Loop)
    }
}

/// Cells that today's code cannot pass because the behaviour they check is another
/// item of the issue; skipped with the reason printed (`FAULT_MATRIX_PENDING=1` runs
/// them anyway).
const PENDING: &[(Kind, Fault, &str)] = &[];

/// The per-task deadline of the runs whose fault only a deadline ends.
const TASK_DEADLINE: Duration = Duration::from_millis(1000);
/// Every worker's backstop deadline for a whole task ([`DistConfig::task_timeout`]):
/// it ends a chip task whose process was stopped (the chip's own kernel deadline cannot
/// run then), and a level-3 child's task (stopped, or waiting on its own stuck child).
const TASK_BACKSTOP: Duration = Duration::from_secs(3);
/// The level-3 children's own task deadline, longer than the level-4 worker's, so it is
/// the level-4 worker that ends a stuck level-3 child (which must take its busy child
/// with it).
const NESTED_TASK_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a cell waits for the run's error before it fails (a generous bound on
/// behaviour, not a performance figure).
const ERROR_BOUND: Duration = Duration::from_secs(20);
/// The close grace of every worker of the matrix.
const CLOSE_GRACE: Duration = Duration::from_millis(500);
/// The whole cell, or the binary dies of SIGALRM.
const CELL_ALARM_SECS: u32 = 120;

// Words of the cell's shared page (see `SharedWords`).
/// `mono_ns` when the faulty task started (and, for a fault it does itself, faulted).
const STARTED: usize = 0;
/// The test lets the faulty task of `Corrupt` return.
const GO: usize = 1;
/// The downstream task ran (it must not).
const DOWNSTREAM: usize = 2;
/// The independent task started.
const INDEP_STARTED: usize = 3;
/// The independent task finished.
const INDEP_DONE: usize = 4;
/// The fault happened (the independent task waits for it, so it is in flight then).
const FAULTED: usize = 5;
const WORDS: usize = 6;

/// Waits (sleeping, bounded) until `word` is non-zero.
fn wait_word(w: &SharedWords, word: usize, within: Duration) -> bool {
    let end = Instant::now() + within;
    while w.get(word) == 0 {
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}

/// The faulty task's body, in whichever child runs it.
fn faulty_body(w: &SharedWords, fault: u64) -> Result<(), String> {
    let fault = Fault::from_code(fault).ok_or("unknown fault code")?;
    w.at(STARTED).store(mono_ns().max(1), Ordering::SeqCst);
    match fault {
        Fault::Kill | Fault::Stop => {
            std::thread::sleep(Duration::from_secs(120));
            Ok(())
        }
        Fault::Panic => {
            w.at(FAULTED).store(1, Ordering::SeqCst);
            panic!("deliberate fault-matrix panic");
        }
        Fault::Loop => {
            w.at(FAULTED).store(1, Ordering::SeqCst);
            let end = Instant::now() + Duration::from_secs(120);
            let mut spins = 0u64;
            while spins % 1024 != 0 || Instant::now() < end {
                spins = spins.wrapping_add(1);
                std::hint::spin_loop();
            }
            Ok(())
        }
        Fault::Exit0 => {
            w.at(FAULTED).store(1, Ordering::SeqCst);
            // SAFETY: ends this (child) process at once, as a buggy callable would.
            unsafe { libc::_exit(0) }
        }
        Fault::Corrupt => {
            if wait_word(w, GO, Duration::from_secs(30)) {
                Ok(())
            } else {
                Err("never released".into())
            }
        }
    }
}

/// The independent task's body: it is in flight when the fault happens and finishes.
fn independent_body(w: &SharedWords) -> Result<(), String> {
    w.at(INDEP_STARTED).store(1, Ordering::SeqCst);
    if !wait_word(w, FAULTED, Duration::from_secs(30)) {
        return Err("the fault never happened".into());
    }
    w.at(INDEP_DONE).store(1, Ordering::SeqCst);
    Ok(())
}

/// One cell's worker, its orchestration and the pid of the child the fault hits.
struct Rig {
    worker: DistWorker,
    orch: HostOrchHandle,
    words: SharedWords,
    /// The faulty child's lane (for the frame corruption).
    lane: usize,
    victim: i32,
}

fn matrix_l3(chips: usize, subs: usize, task_timeout: Duration) -> DistConfig {
    let mut cfg =
        DistConfig::l3(vec![ChipConfig::default(); chips], subs).with_exec_mode(ExecMode::Process);
    cfg.close_grace = CLOSE_GRACE;
    cfg.task_timeout = task_timeout;
    cfg
}

/// A chip orchestration running one AIV kernel with `body`, its tensors (InOut) and the
/// fault code (scalar 0) passed on.
fn chip_task(
    w: &mut DistWorker,
    name: &str,
    body: impl Fn(u64) -> Result<(), String> + Send + Sync + 'static,
) -> Result<OrchHandle, String> {
    let k = w
        .register_kernel(name, move |ctx| {
            let fault: u64 = ctx.scalar(0)?;
            Ok(body(fault)?)
        })
        .ctx("kernel")?;
    w.register_chip_orchestration(name, move |o, a| {
        let mut core = CoreArgs::new();
        if let Ok(t) = a.tensor(0) {
            core.inout(&t);
        }
        core.scalar(a.scalar::<u64>(0)?);
        o.submit_aiv(k, &core)?;
        Ok(())
    })
    .ctx("chip orchestration")
}

impl Rig {
    fn new(kind: Kind) -> Result<Rig, String> {
        let (mut w, lane) = match kind {
            Kind::Chip => (
                DistWorker::new(matrix_l3(2, 1, TASK_BACKSTOP)).ctx("new")?,
                0,
            ),
            Kind::Sub => (
                DistWorker::new(matrix_l3(1, 1, TASK_BACKSTOP)).ctx("new")?,
                1,
            ),
            Kind::Nested => {
                let mut cfg = DistConfig::l4(1).with_exec_mode(ExecMode::Process);
                cfg.close_grace = CLOSE_GRACE;
                cfg.task_timeout = TASK_BACKSTOP;
                let mut top = DistWorker::new(cfg).ctx("new l4")?;
                for i in 0..2 {
                    top.add_worker(
                        DistWorker::new(matrix_l3(0, 1, NESTED_TASK_TIMEOUT)).ctx("new l3")?,
                    )
                    .ctx(&format!("add level-3 child {i}"))?;
                }
                (top, 0)
            }
        };
        let words = SharedWords::new(&w, WORDS);
        let data = w.shared_tensor(&[1], DataType::U64).ctx("data")?;
        let wd = words.clone();
        let downstream = w.register_sub("downstream", move |_| {
            wd.at(DOWNSTREAM).store(1, Ordering::SeqCst);
            Ok(())
        });
        let da = data.clone();
        let orch = match kind {
            Kind::Chip => {
                let wf = words.clone();
                let faulty = chip_task(&mut w, "faulty", move |f| faulty_body(&wf, f))?;
                let wi = words.clone();
                let indep = chip_task(&mut w, "independent", move |_| independent_body(&wi))?;
                w.register_orchestration("matrix", move |o, a| {
                    o.submit_next_level(faulty, &args(&[da.arg(ArgTag::InOut)], a.scalars()), 0)?;
                    o.submit_sub(&downstream, &args(&[da.arg(ArgTag::Input)], &[]))?;
                    o.submit_next_level(indep, &args(&[], &[0]), 1)?;
                    Ok(())
                })
            }
            Kind::Sub => {
                let wf = words.clone();
                let faulty = w.register_sub("faulty", move |call| {
                    let fault = call.scalar::<u64>(0).ok_or("no fault code")?;
                    Ok(faulty_body(&wf, fault)?)
                });
                let wi = words.clone();
                let indep = chip_task(&mut w, "independent", move |_| independent_body(&wi))?;
                w.register_orchestration("matrix", move |o, a| {
                    o.submit_sub(
                        &faulty,
                        &args(&[da.arg(ArgTag::OutputExisting)], a.scalars()),
                    )?;
                    o.submit_sub(&downstream, &args(&[da.arg(ArgTag::Input)], &[]))?;
                    o.submit_next_level(indep, &args(&[], &[0]), 0)?;
                    Ok(())
                })
            }
            Kind::Nested => {
                let wg = words.clone();
                let grand = w.register_sub("grand", move |call| {
                    let fault = call.scalar::<u64>(0).ok_or("no fault code")?;
                    Ok(faulty_body(&wg, fault)?)
                });
                let wf = words.clone();
                // SIGKILL, SIGSTOP and the loop hit the level-3 process while its own
                // sub-worker is busy (sleeping or spinning in `grand`): that grandchild
                // must not outlive it. The other faults happen in the level-3 process's
                // orchestration itself.
                let faulty = w.register_orchestration("faulty", move |o, a| {
                    let fault = a.scalar_at::<u64>(0).ok_or("no fault code")?;
                    match Fault::from_code(fault) {
                        Some(Fault::Kill | Fault::Stop | Fault::Loop) => {
                            o.submit_sub(&grand, &args(&[], &[fault]))?;
                            Ok(())
                        }
                        _ => Ok(faulty_body(&wf, fault)?),
                    }
                });
                let wi = words.clone();
                let indep =
                    w.register_orchestration("independent", move |_, _| Ok(independent_body(&wi)?));
                w.register_orchestration("matrix", move |o, a| {
                    o.submit_next_level(
                        faulty,
                        &args(&[da.arg(ArgTag::OutputExisting)], a.scalars()),
                        0,
                    )?;
                    o.submit_sub(&downstream, &args(&[da.arg(ArgTag::Input)], &[]))?;
                    o.submit_next_level(indep, &TaskArgs::new(), 1)?;
                    Ok(())
                })
            }
        };
        w.init().ctx("init")?;
        let victim = *w.child_pids().get(lane).ok_or("no victim pid")?;
        Ok(Rig {
            worker: w,
            orch,
            words,
            lane,
            victim,
        })
    }
}

/// What one cell measured.
struct Measured {
    error: String,
    variant: String,
    to_error: Duration,
    close: Duration,
    close_result: String,
    usable_after: bool,
    /// From `close` returning until nothing of the cell was left (orphans reaped).
    settle: Duration,
}

fn signal(pid: i32, sig: i32) -> Outcome {
    // SAFETY: signalling a child process this cell started (alive: it is not reaped
    // before the worker closes).
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(format!(
            "kill({pid}, {sig}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn exercise(rig: &mut Rig, kind: Kind, fault: Fault) -> Result<Measured, String> {
    let w = &rig.words;
    // A level-3 child passes its run's configuration on to its own tasks, so the nested
    // runs keep the default and meet the level-4 worker's backstop instead.
    let config = if fault.needs_deadline() && kind != Kind::Nested {
        CallConfig::default().with_timeout(TASK_DEADLINE)
    } else {
        CallConfig::default()
    };
    let mut handle = rig
        .worker
        .submit_with(&rig.orch, &args(&[], &[fault.code()]), &config)
        .ctx("submit")?;
    if !wait_word(w, STARTED, BOUND) {
        let why = handle.wait(Some(Duration::from_millis(100)));
        return Err(format!("the faulty task never started (the run: {why:?})"));
    }
    check!(
        wait_word(w, INDEP_STARTED, BOUND),
        "the independent task never started"
    );
    let fault_ns = match fault {
        Fault::Kill | Fault::Stop | Fault::Corrupt => {
            let t = mono_ns();
            match fault {
                Fault::Kill => signal(rig.victim, libc::SIGKILL)?,
                Fault::Stop => signal(rig.victim, libc::SIGSTOP)?,
                _ => {
                    rig.worker
                        .inject_frame_corruption(rig.lane)
                        .ctx("corrupt")?;
                    w.at(GO).store(1, Ordering::SeqCst);
                }
            }
            w.at(FAULTED).store(1, Ordering::SeqCst);
            t
        }
        // The task faulted itself right after stamping STARTED.
        _ => w.get(STARTED),
    };
    let outcome = handle.wait(Some(ERROR_BOUND));
    let to_error = Duration::from_nanos(mono_ns().saturating_sub(fault_ns));
    let (variant, error) = match outcome {
        Ok(()) => return Err("the run succeeded although its child faulted".into()),
        Err(DistError::WaitTimeout { .. }) => {
            return Err(format!("no error within {ERROR_BOUND:?} of the fault"))
        }
        Err(DistError::TaskFailed(f)) => (
            format!("TaskFailed({:?})", f.kind()),
            DistError::TaskFailed(f).to_string(),
        ),
        Err(e) => return Err(format!("expected DistError::TaskFailed, got {e:?}")),
    };
    check!(
        error.contains(kind.label()),
        "the error names {}: {error}",
        kind.label()
    );
    check!(
        wait_word(w, INDEP_DONE, BOUND),
        "the independent task on another child never finished"
    );
    check!(
        w.get(DOWNSTREAM) == 0,
        "the task depending on the faulty one ran"
    );
    let usable_after = rig.worker.unusable_reason().is_none();
    let t0 = Instant::now();
    let closed = rig.worker.close();
    let close = t0.elapsed();
    let close_result = match closed {
        Ok(()) => "Ok".to_owned(),
        Err(DistError::Close(why)) => format!("Close({why})"),
        Err(e) => return Err(format!("close: {e:?}")),
    };
    Ok(Measured {
        error,
        variant,
        to_error,
        close,
        close_result,
        usable_after,
        settle: Duration::ZERO,
    })
}

/// Open descriptors of this process: how many, and how many are memfds.
fn descriptors() -> (usize, usize) {
    let mut all = 0usize;
    let mut memfds = 0;
    for e in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        all += 1;
        if std::fs::read_link(e.path())
            .map(|t| t.to_string_lossy().starts_with("/memfd:"))
            .unwrap_or(false)
        {
            memfds += 1;
        }
    }
    // The directory handle read_dir held is one of them.
    (all.saturating_sub(1), memfds)
}

/// Everything a cell could leave behind.
#[derive(Debug, PartialEq, Eq)]
struct Footprint {
    descendants: Vec<i32>,
    shm: Vec<String>,
    threads: usize,
    fds: (usize, usize),
}

fn footprint() -> Footprint {
    Footprint {
        descendants: descendants(),
        shm: shm_entries(),
        threads: other_threads().unwrap_or(usize::MAX),
        fds: descriptors(),
    }
}

/// SIGKILLs (after SIGCONT, for a stopped one) every descendant not in `keep` and reaps
/// them: a failing cell's worker can then close without waiting on a child that will
/// never answer.
fn kill_new_descendants(keep: &[i32]) {
    for p in descendants() {
        if !keep.contains(&p) {
            // SAFETY: signalling descendants of this process started by the cell.
            unsafe {
                libc::kill(p, libc::SIGCONT);
                libc::kill(p, libc::SIGKILL);
            }
        }
    }
}

fn reap_orphans(keep: &[i32]) {
    for p in descendants() {
        if !keep.contains(&p) {
            // SAFETY: reaping a process reparented to this subreaper (or ECHILD).
            unsafe { libc::waitpid(p, std::ptr::null_mut(), libc::WNOHANG) };
        }
    }
}

fn cell(kind: Kind, fault: Fault) -> Result<Measured, String> {
    let before = footprint();
    // SAFETY: alarm only arms this process's timer; SIGALRM's default action ends the
    // binary (and its children follow their parent), which is the point.
    unsafe { libc::alarm(CELL_ALARM_SECS) };
    let result = match Rig::new(kind) {
        Ok(mut rig) => {
            let r = exercise(&mut rig, kind, fault);
            if r.is_err() {
                kill_new_descendants(&before.descendants);
            }
            drop(rig);
            r
        }
        Err(e) => Err(e),
    };
    // Orphans (a nested child's children) are reparented here and exit by themselves;
    // give them, and detached threads, a bounded moment to be reaped.
    let settle_start = Instant::now();
    let end = settle_start + Duration::from_secs(10);
    let mut after = footprint();
    while after != before && Instant::now() < end {
        reap_orphans(&before.descendants);
        std::thread::sleep(Duration::from_millis(5));
        after = footprint();
    }
    let settle = settle_start.elapsed();
    // SAFETY: disarms the timer armed above.
    unsafe { libc::alarm(0) };
    let leak = (after != before).then(|| format!("leak: {before:?} -> {after:?}"));
    match (result, leak) {
        (Ok(mut m), None) => {
            m.settle = settle;
            Ok(m)
        }
        (Ok(_), Some(l)) => {
            kill_new_descendants(&before.descendants);
            Err(l)
        }
        (Err(e), None) => Err(e),
        (Err(e), Some(l)) => {
            kill_new_descendants(&before.descendants);
            Err(format!("{e}; {l}"))
        }
    }
}

/// The error's essential part for the table: what follows the child's label.
fn gist(error: &str, label: &str) -> String {
    let rest = error
        .find(label)
        .map(|i| &error[i + label.len()..])
        .unwrap_or(error);
    let rest = rest.trim_start_matches([':', ' ', ')']);
    let mut s: String = rest.chars().take(90).collect();
    if rest.chars().count() > 90 {
        s.push('…');
    }
    s.replace('|', "\\|")
}

fn main() {
    become_subreaper();
    quiet_deliberate_panics();
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let rounds: usize = std::env::var("FAULT_MATRIX_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let run_pending = std::env::var_os("FAULT_MATRIX_PENDING").is_some();
    let mut failed = Vec::new();
    let mut skipped = Vec::new();
    // Per cell: the first round's measurement, then the worst of each figure.
    let mut rows: Vec<(Kind, Fault, Measured)> = Vec::new();
    for kind in Kind::ALL {
        for fault in Fault::ALL {
            let name = format!("{}/{}", kind.name(), fault.name());
            if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
                continue;
            }
            if let Some((_, _, why)) = PENDING.iter().find(|(k, f, _)| *k == kind && *f == fault) {
                if !run_pending {
                    println!("test {name} ... PENDING ({why})");
                    skipped.push(name);
                    continue;
                }
            }
            let mut worst: Option<Measured> = None;
            for round in 0..rounds {
                let t0 = Instant::now();
                match cell(kind, fault) {
                    Ok(m) => {
                        println!(
                            "test {name} (round {}) ... ok ({:.2?}): {} after {:.1?}, close {:.1?} {}, clean {:.1?} later\n    {}",
                            round + 1,
                            t0.elapsed(),
                            m.variant,
                            m.to_error,
                            m.close,
                            m.close_result,
                            m.settle,
                            m.error
                        );
                        worst = Some(match worst {
                            None => m,
                            Some(w) => Measured {
                                to_error: w.to_error.max(m.to_error),
                                close: w.close.max(m.close),
                                settle: w.settle.max(m.settle),
                                ..w
                            },
                        });
                    }
                    Err(e) => {
                        println!("test {name} (round {}) ... FAILED\n    {e}", round + 1);
                        failed.push(name.clone());
                        worst = None;
                        break;
                    }
                }
            }
            if let Some(m) = worst {
                rows.push((kind, fault, m));
            }
        }
    }
    println!();
    println!("| child | fault | error (variant(kind): message after the child's name) | fault → error | close | close returns | tree clean after close | usable after |");
    println!("|---|---|---|---|---|---|---|---|");
    for (kind, fault, m) in &rows {
        let close_result = if m.close_result.starts_with("Close(") {
            "`Err(Close)`"
        } else {
            "`Ok`"
        };
        println!(
            "| {} | {} | `{}`: {} | {:.1?} | {:.1?} | {} | {:.1?} | {} |",
            kind.name(),
            fault.name(),
            m.variant,
            gist(&m.error, kind.label()),
            m.to_error,
            m.close,
            close_result,
            m.settle,
            if m.usable_after {
                "yes"
            } else {
                "no (`Unusable`)"
            }
        );
    }
    println!("(worst of {rounds} round(s) per cell)");
    println!();
    if failed.is_empty() {
        println!(
            "test result: ok. {} cells passed; 0 failed; {} pending",
            rows.len(),
            skipped.len()
        );
    } else {
        println!(
            "test result: FAILED. {} passed; {} failed: {failed:?}; {} pending",
            rows.len(),
            failed.len(),
            skipped.len()
        );
        std::process::exit(1);
    }
}
