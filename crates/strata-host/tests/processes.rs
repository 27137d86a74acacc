//! `ExecMode::Process`: strata-host's contracts (`contracts/`, shared with
//! `threads_mode.rs`) with real child processes, then what only processes have: threads
//! in a forked child, the fork-with-threads guard, `SIGKILL`, orphans (idle or busy)
//! when their parent is killed, what a child can see of and do to the mailboxes, a
//! seccomp filter that refuses `futex_waitv`, and the CPU an idle process uses.
//!
//! `harness = false`: a process that forks must be single-threaded at the fork, and the
//! libtest harness runs tests on threads. `main` runs each scenario sequentially and
//! prints `test <name> ... ok`; every scenario is wrapped in a leak check (descendant
//! processes, `/dev/shm/strata-*` entries, threads of this process). This process is a
//! child subreaper, so orphaned grandchildren are reparented to it (and counted).
//!
//! Timing figures are *printed*, never asserted (except the idle-CPU bound, which is
//! 20× the target so it cannot flake).

mod common;
mod contracts;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use strata_host::*;
use strata_mailbox::{ChildExit, FailureReport, Handler, TaskRequest, TaskSlot};
use strata_types::TaskArgs;

fn process_opts() -> SpawnOptions {
    opts(ExecMode::Process)
}

/// A forked helper process that is killed and reaped if the scenario bails out.
struct Forked(i32);

impl Forked {
    fn fork(body: impl FnOnce() -> i32) -> Result<Forked, String> {
        // SAFETY: the scenario runner keeps this process single-threaded at this point;
        // the child runs `body` and leaves through `_exit`.
        let pid = unsafe { libc::fork() };
        match pid {
            -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
            0 => {
                let code =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101);
                // SAFETY: leave without running the inherited destructors.
                unsafe { libc::_exit(code) }
            }
            pid => Ok(Forked(pid)),
        }
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        // SAFETY: kill and reap our own child (a no-op if it is reaped already: ECHILD).
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

// -------------------------------------------------------------------------------------
// Threads and fork
// -------------------------------------------------------------------------------------

/// A child program that starts threads in `start`: a helper that answers requests over
/// a channel, and one that churns the allocator.
struct ThreadedProgram;

struct ThreadedHandler {
    tx: Option<mpsc::Sender<(u64, mpsc::Sender<u64>)>>,
    helper: Option<std::thread::JoinHandle<()>>,
    churn: Option<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl ChildProgram for ThreadedProgram {
    fn label(&self) -> String {
        "threaded_child".into()
    }

    fn start(self: Box<Self>, _env: &ChildEnv) -> Result<Box<dyn Handler + Send>, String> {
        let (tx, rx) = mpsc::channel::<(u64, mpsc::Sender<u64>)>();
        let helper = std::thread::spawn(move || {
            for (v, reply) in rx {
                let words: Vec<String> = (0..50).map(|i| format!("w{i}")).collect();
                let _ = reply.send(2 * v + words.len() as u64 - 50);
            }
        });
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let churn = std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                let v: Vec<u8> = vec![1; 4096];
                std::hint::black_box(format!("{}", v.len()));
            }
        });
        Ok(Box::new(ThreadedHandler {
            tx: Some(tx),
            helper: Some(helper),
            churn: Some(churn),
            stop,
        }))
    }
}

impl Handler for ThreadedHandler {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        let v: u64 = req.args.scalar_at(0).unwrap_or(0);
        let (rtx, rrx) = mpsc::channel();
        let tx = self.tx.as_ref().ok_or(FailureReport::new(1, "no helper"))?;
        tx.send((v, rtx))
            .map_err(|e| FailureReport::new(1, e.to_string()))?;
        let got = rrx
            .recv()
            .map_err(|e| FailureReport::new(1, e.to_string()))?;
        if got == 2 * v {
            Ok(())
        } else {
            Err(FailureReport::new(
                2,
                format!("helper answered {got} for {v}"),
            ))
        }
    }
}

impl Drop for ThreadedHandler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.tx.take());
        for h in [self.helper.take(), self.churn.take()]
            .into_iter()
            .flatten()
        {
            let _ = h.join();
        }
    }
}

fn threads_started_after_the_fork_do_not_deadlock() -> Outcome {
    let mem = SharedMemory::new();
    let programs: Vec<Box<dyn ChildProgram>> =
        vec![Box::new(ThreadedProgram), Box::new(ThreadedProgram)];
    let mut children = Children::spawn(&mem, programs, process_opts()).ctx("spawn")?;
    // Now this process starts threads that churn the allocator and stdio locks.
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let s = stop.clone();
            std::thread::spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    let v: Vec<String> = (0..64).map(|i| i.to_string()).collect();
                    std::hint::black_box(v);
                }
            })
        })
        .collect();
    let mut tasks = Tasks::new();
    let callable = SubRegistry::id_of("any");
    let result = (|| -> Outcome {
        for i in 0..300u64 {
            let lane = children.lane((i % 2) as usize);
            ok(tasks.run(
                lane,
                TaskSlot::ALL[(i / 2 % 2) as usize],
                callable,
                &args_of(&[], &[i]),
            ))?;
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join()
            .map_err(|_| "a parent thread panicked".to_string())?;
    }
    result?;
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(
        report.is_clean(),
        "children with threads did not shut down cleanly: {report}"
    );
    Ok(())
}

fn spawn_refuses_to_fork_while_threads_run_unless_opted_in() -> Outcome {
    let mem = SharedMemory::new();
    let reg = SubRegistry::new();
    let (tx, rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let _ = rx.recv();
    });
    let refused = Children::spawn(&mem, subs(&reg, 1), process_opts());
    let result = (|| -> Outcome {
        match refused {
            Err(e @ HostError::ThreadsRunning { count: 1 }) => {
                let m = e.to_string();
                check!(
                    m.contains("allow_fork_with_threads") && m.contains("1 other thread"),
                    "message: {m}"
                );
            }
            other => return Err(format!("expected ThreadsRunning, got {other:?}")),
        }
        let mut children = Children::spawn(
            &mem,
            subs(&reg, 1),
            process_opts().with_fork_with_threads(true),
        )
        .ctx("spawn with the opt-in")?;
        let (_, msg) = failed(Tasks::new().run(
            children.lane(0),
            TaskSlot::Slot0,
            SubRegistry::id_of("x"),
            &TaskArgs::new(),
        ))?;
        check!(msg.contains("not registered"), "{msg}");
        children.shutdown(BOUND).ctx("shutdown")?;
        Ok(())
    })();
    drop(tx);
    t.join().map_err(|_| "thread panicked")?;
    result?;
    check!(
        strata_host::other_threads().ctx("threads")? == 0,
        "thread count"
    );
    // Threads mode never forks, so it does not refuse.
    let mut children = Children::spawn(&mem, subs(&reg, 1), SpawnOptions::new(ExecMode::Threads))
        .ctx("threads mode")?;
    children.shutdown(BOUND).ctx("shutdown")?;
    Ok(())
}

// -------------------------------------------------------------------------------------
// Death by signal, orphans
// -------------------------------------------------------------------------------------

fn a_child_killed_mid_task_is_reported_and_everything_is_reaped() -> Outcome {
    let mem = SharedMemory::new();
    let started = mem.create_region(8, "started").ctx("region")?;
    let mut reg = SubRegistry::new();
    let m2 = mem.clone();
    let long = reg.register_fn("long", move |_| {
        atomics(&m2, started, 1)?[0].store(1, Ordering::Release);
        std::thread::sleep(Duration::from_secs(120));
        Ok(())
    });
    let suicide = reg.register_fn("suicide", |_| {
        // SAFETY: kills this (child) process, which is what the scenario wants.
        unsafe { libc::raise(libc::SIGKILL) };
        Ok(())
    });
    let noop = reg.register_fn("noop", |_| Ok(()));
    let mut children = Children::spawn(&mem, subs(&reg, 3), process_opts()).ctx("spawn")?;
    let mut tasks = Tasks::new();
    let none = TaskArgs::new();
    // Lane 1: killed from outside while it runs a task; noticed by check_alive.
    tasks.publish(children.lane(1), TaskSlot::Slot0, long, &none)?;
    let flag = atomics(&mem, started, 1)?;
    wait_for("the long task to start", || {
        flag[0].load(Ordering::Acquire) == 1
    })?;
    let pid1 = children.lane(1).pid().ok_or("no pid")?;
    // SAFETY: pid1 is our unreaped child.
    unsafe { libc::kill(pid1, libc::SIGKILL) };
    let t0 = Instant::now();
    let err = loop {
        match children.lane(1).check_alive() {
            Ok(()) if t0.elapsed() < BOUND => std::thread::sleep(Duration::from_micros(100)),
            Ok(()) => return Err("check_alive never noticed the death".into()),
            Err(e) => break e,
        }
    };
    println!(
        "    SIGKILL noticed by check_alive after {:.2?}",
        t0.elapsed()
    );
    match &err {
        HostError::ChildDied { label, pid, exit } => {
            check!(label == "sub_worker 1" && *pid == Some(pid1), "{err}");
            check!(exit.signal() == Some(libc::SIGKILL), "{err}");
        }
        other => return Err(format!("expected ChildDied, got {other:?}")),
    }
    let msg = err.to_string();
    check!(
        msg.contains(&format!(
            "sub_worker 1 (pid {pid1}) died: killed by signal 9 (SIGKILL)"
        )),
        "{msg}"
    );
    check!(children.lane(1).is_dead(), "is_dead");
    check!(
        matches!(
            children.lane(1).check_alive(),
            Err(HostError::ChildDied { .. })
        ),
        "the death must be sticky"
    );
    // Lane 2: dies while the parent is blocked in a wait.
    let r = tasks.run(children.lane(2), TaskSlot::Slot1, suicide, &none);
    match r {
        Err(HostError::ChildDied {
            ref label,
            exit: ref e,
            ..
        }) if label == "sub_worker 2" && e.signal() == Some(libc::SIGKILL) => {}
        other => return Err(format!("blocked wait on a dying child: {other:?}")),
    }
    // Lane 0 is unaffected.
    children.lane(0).check_alive().ctx("lane 0")?;
    ok(tasks.run(children.lane(0), TaskSlot::Slot0, noop, &none))?;
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(!report.is_clean(), "the report must show the deaths");
    let ab = report.abnormal();
    check!(
        ab.len() == 2 && ab.iter().all(|c| c.died_before_shutdown && !c.killed),
        "abnormal: {report}"
    );
    check!(
        report.children[0].end == Some(ChildEnd::Process(ChildExit::Exited(0))),
        "{report}"
    );
    check!(
        matches!(
            report.clone().into_result(),
            Err(HostError::AbnormalExit { .. })
        ),
        "into_result"
    );
    check!(
        children.is_empty() && children.pids().is_empty(),
        "lanes dropped"
    );
    let again = children.shutdown(BOUND).ctx("second shutdown")?;
    check!(again == report, "shutdown is idempotent");
    Ok(())
}

/// Reaps (as subreaper) every pid of `pids` as it ends, until all ended or `within`
/// passed; then SIGKILLs and reaps the survivors (cleanup) and returns them. The wait
/// statuses of the ended ones are returned in `pids` order (`None` for survivors).
fn reap_all(pids: &[i32], within: Duration) -> (Vec<i32>, Vec<Option<i32>>) {
    let mut exits: Vec<Option<i32>> = vec![None; pids.len()];
    let end = Instant::now() + within;
    while exits.iter().any(Option::is_none) && Instant::now() < end {
        for (i, p) in pids.iter().enumerate() {
            if exits[i].is_none() {
                let mut st = 0;
                // SAFETY: waitpid on an inherited child, non-blocking.
                let r = unsafe { libc::waitpid(*p, &mut st, libc::WNOHANG) };
                if r == *p {
                    exits[i] = Some(st);
                } else if r == -1 {
                    // Not (or no longer) our child: reaped by its own parent.
                    // SAFETY: signal 0 only probes.
                    if unsafe { libc::kill(*p, 0) } == -1 {
                        exits[i] = Some(0);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut survivors = Vec::new();
    for (i, p) in pids.iter().enumerate() {
        if exits[i].is_none() {
            survivors.push(*p);
            // SAFETY: our (inherited) unreaped child: kill and reap it.
            unsafe {
                libc::kill(*p, libc::SIGKILL);
                libc::waitpid(*p, std::ptr::null_mut(), 0);
            }
        }
    }
    (survivors, exits)
}

/// Forks a middle process that spawns two sub-workers and a nested worker (with two
/// sub-workers of its own), publishes `task` on lanes 0 and 2 (the nested worker
/// forwards it to its first child) unless `task` is `None`, waits until `started`
/// counted both, reports the pids of its 5 descendants on the board and waits to be
/// killed. Returns the middle process and the pids (direct children first).
fn middle_with_a_tree(
    reg: &SubRegistry,
    task: Option<strata_types::CallableId>,
    board: &Arc<SharedMemory>,
    region: u64,
) -> Result<(Forked, Vec<i32>), String> {
    let b2 = board.clone();
    let reg = reg.clone();
    let middle = Forked::fork(move || {
        let slots = match atomics(&b2, region, 16) {
            Ok(s) => s,
            Err(_) => return 2,
        };
        let mem = SharedMemory::new();
        let mut programs = subs(&reg, 2);
        programs.push(Box::new(NestedProgram {
            registry: reg,
            mode: ExecMode::Process,
        }));
        let fail = |why: String| {
            eprintln!("middle: {why}");
            slots[0].store(2, Ordering::Release);
            1
        };
        let mut children = match Children::spawn(&mem, programs, process_opts()) {
            Ok(c) => c,
            Err(e) => return fail(e.to_string()),
        };
        let mut pids = children.pids();
        match inner_pids(children.lane(2)) {
            Ok((_, inner)) => pids.extend(inner),
            Err(e) => return fail(e),
        }
        if let Some(task) = task {
            let mut tasks = Tasks::new();
            for lane in [0, 2] {
                if let Err(e) =
                    tasks.publish(children.lane(lane), TaskSlot::Slot0, task, &TaskArgs::new())
                {
                    return fail(e);
                }
            }
            let end = Instant::now() + BOUND;
            while slots[15].load(Ordering::Acquire) < 2 {
                if Instant::now() > end {
                    return fail("the busy tasks did not start".into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        slots[1].store(pids.len() as u64, Ordering::Relaxed);
        for (i, p) in pids.iter().enumerate() {
            slots[2 + i].store(*p as u64, Ordering::Relaxed);
        }
        slots[0].store(1, Ordering::Release);
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    })?;
    let slots = atomics(board, region, 16)?;
    wait_for("the middle process", || {
        slots[0].load(Ordering::Acquire) != 0
    })?;
    check!(
        slots[0].load(Ordering::Acquire) == 1,
        "the middle process failed to start its children"
    );
    let n = slots[1].load(Ordering::Relaxed) as usize;
    let pids: Vec<i32> = (0..n.min(13))
        .map(|i| slots[2 + i].load(Ordering::Relaxed) as i32)
        .collect();
    check!(
        n == 5,
        "expected 3 children + 2 grandchildren, got {pids:?}"
    );
    Ok((middle, pids))
}

/// SIGKILLs and reaps the middle process.
fn kill_middle(middle: Forked) {
    // SAFETY: SIGKILL our own child; then reap it.
    unsafe {
        libc::kill(middle.0, libc::SIGKILL);
        libc::waitpid(middle.0, std::ptr::null_mut(), 0);
    }
    std::mem::forget(middle);
}

fn idle_orphans_die_with_their_parent() -> Outcome {
    let board = SharedMemory::new();
    let region = board.create_region(8 * 16, "board").ctx("board")?;
    let mut reg = SubRegistry::new();
    reg.register_fn("noop", |_| Ok(()));
    let (middle, pids) = middle_with_a_tree(&reg, None, &board, region)?;
    kill_middle(middle);
    let t0 = Instant::now();
    // As subreaper we inherit the orphans: reap each as it ends and record how.
    let (survivors, exits) = reap_all(&pids, BOUND);
    check!(
        survivors.is_empty(),
        "orphans still alive after {BOUND:?}: {survivors:?} of {pids:?}"
    );
    println!(
        "    3 orphans and their 2 children gone {:.2?} after the parent was killed",
        t0.elapsed()
    );
    for (p, st) in pids[..3].iter().zip(&exits) {
        let st = st.unwrap_or(-1);
        // The parent-death signal (SIGKILL) or, if the orphan noticed first, exit 0.
        check!(
            (libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGKILL)
                || (libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0),
            "orphan {p} ended with status {st:#x}"
        );
    }
    Ok(())
}

fn busy_orphans_die_within_a_second_of_their_parent() -> Outcome {
    let board = SharedMemory::new();
    let region = board.create_region(8 * 16, "board").ctx("board")?;
    let mut reg = SubRegistry::new();
    let b2 = board.clone();
    // Spins forever at 100 % CPU, never looking at its mailbox or its parent.
    let spin = reg.register_fn("spin", move |_| {
        atomics(&b2, region, 16)?[15].fetch_add(1, Ordering::AcqRel);
        loop {
            std::hint::spin_loop();
        }
    });
    reg.register_fn("noop", |_| Ok(()));
    let (middle, pids) = middle_with_a_tree(&reg, Some(spin), &board, region)?;
    // Busy: sub_worker 0 and the nested worker's first child spin; the nested worker is
    // blocked waiting for that child; the others are idle.
    kill_middle(middle);
    let t0 = Instant::now();
    let (survivors, _) = reap_all(&pids, Duration::from_secs(1));
    check!(
        survivors.is_empty(),
        "busy orphans still alive 1 s after their parent was killed: {survivors:?} of {pids:?}"
    );
    println!(
        "    5 descendants (2 spinning, 1 blocked on a spinning child) gone {:.2?} after the parent was killed",
        t0.elapsed()
    );
    Ok(())
}

/// The descriptors of `/proc/self/fd` that are mailbox memfds, and the number of
/// `/proc/self/maps` lines that map one.
fn own_mailbox_view() -> (Vec<i32>, usize) {
    let is_mailbox = |p: &str| p.starts_with("/memfd:strata-mailbox");
    let mut fds = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        let link = std::fs::read_link(e.path()).unwrap_or_default();
        if link.to_str().is_some_and(is_mailbox) {
            if let Some(fd) = e.file_name().to_str().and_then(|s| s.parse().ok()) {
                fds.push(fd);
            }
        }
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mapped = maps
        .lines()
        .filter(|l| l.split_whitespace().nth(5).is_some_and(is_mailbox))
        .count();
    (fds, mapped)
}

fn a_child_sees_only_its_own_mailbox() -> Outcome {
    let mem = SharedMemory::new();
    let mut reg = SubRegistry::new();
    let inspect = reg.register_fn("inspect", |_| {
        let (fds, mapped) = own_mailbox_view();
        if fds.len() == 1 && mapped == 1 {
            Ok(())
        } else {
            Err(format!(
                "pid {} holds mailbox fds {fds:?} and {mapped} mailbox mappings",
                std::process::id()
            )
            .into())
        }
    });
    let mut programs = subs(&reg, 3);
    programs.push(Box::new(NestedProgram {
        registry: reg,
        mode: ExecMode::Process,
    }));
    let mut children = Children::spawn(&mem, programs, process_opts()).ctx("spawn")?;
    let mut tasks = Tasks::new();
    // Lanes 0..3 are siblings (forked first, in the middle, last); lane 3 forwards to its
    // own first child, which also inherited the nested worker's own mailbox.
    for lane in 0..4 {
        ok(tasks.run(
            children.lane(lane),
            TaskSlot::Slot0,
            inspect,
            &TaskArgs::new(),
        ))
        .map_err(|e| format!("lane {lane}: {e}"))?;
    }
    let (fds, mapped) = own_mailbox_view();
    check!(
        fds.len() == 4 && mapped == 4,
        "the parent keeps all 4 mailboxes: fds {fds:?}, {mapped} mappings"
    );
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(report.is_clean(), "{report}");
    Ok(())
}

fn a_child_cannot_resize_its_mailbox_under_its_parent() -> Outcome {
    let mut reg = SubRegistry::new();
    // Grows, then shrinks to nothing, every mailbox memfd it holds: unsealed, the shrink
    // makes every later access of the mapping a SIGBUS, in the child and in the parent.
    let resize = reg.register_fn("resize", |_| {
        let (fds, _) = own_mailbox_view();
        let mut answers = Vec::new();
        for fd in &fds {
            for len in [1 << 20, 0] {
                // SAFETY: ftruncate on a descriptor this process holds.
                let r = unsafe { libc::ftruncate(*fd, len) };
                answers.push(if r == 0 {
                    format!("fd {fd} to {len}: done")
                } else {
                    format!("fd {fd} to {len}: {}", std::io::Error::last_os_error())
                });
            }
        }
        Err(format!("{} fds: {}", fds.len(), answers.join("; ")).into())
    });
    let noop = reg.register_fn("noop", |_| Ok(()));
    // The parent runs in a forked process, so that a SIGBUS kills it and not the runner.
    let middle = Forked::fork(move || {
        let mem = SharedMemory::new();
        let mut children = match Children::spawn(&mem, subs(&reg, 2), process_opts()) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("middle: {e}");
                return 10;
            }
        };
        let mut tasks = Tasks::new();
        match failed(tasks.run(children.lane(0), TaskSlot::Slot0, resize, &TaskArgs::new())) {
            Ok((_, msg)) if msg.contains(": 1 fds: ") && !msg.contains("done") => {}
            Ok((_, msg)) => {
                eprintln!("middle: the resize answered {msg:?}");
                return 11;
            }
            Err(e) => {
                eprintln!("middle: {e}");
                return 12;
            }
        }
        // The parent reads and writes both mailboxes again.
        for lane in 0..2 {
            for slot in TaskSlot::ALL {
                if let Err(e) = ok(tasks.run(children.lane(lane), slot, noop, &TaskArgs::new())) {
                    eprintln!("middle: lane {lane}: {e}");
                    return 13;
                }
            }
        }
        match children.shutdown(BOUND) {
            Ok(r) if r.is_clean() => 0,
            other => {
                eprintln!("middle: shutdown {other:?}");
                14
            }
        }
    })?;
    let mut st = 0;
    let end = Instant::now() + BOUND;
    loop {
        // SAFETY: non-blocking reap of our own child.
        let r = unsafe { libc::waitpid(middle.0, &mut st, libc::WNOHANG) };
        if r == middle.0 {
            break;
        }
        check!(Instant::now() < end, "the middle process did not finish");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::mem::forget(middle);
    check!(
        !(libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGBUS),
        "the parent died of SIGBUS after its child truncated the mailbox"
    );
    check!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "the parent failed (status {st:#x}; its stderr says why)"
    );
    Ok(())
}

/// A sub-worker whose process refuses `futex_waitv` with `errno` (a seccomp filter set in
/// `start`, before it serves its mailbox), as a container's profile might.
struct SandboxedSub {
    registry: SubRegistry,
    errno: i32,
}

impl ChildProgram for SandboxedSub {
    fn label(&self) -> String {
        format!("sandboxed_sub errno={}", self.errno)
    }

    fn start(self: Box<Self>, env: &ChildEnv) -> Result<Box<dyn Handler + Send>, String> {
        strata_testkit::seccomp::refuse_syscall(libc::SYS_futex_waitv, self.errno)?;
        // The filter works: the call is refused with our errno.
        // SAFETY: futex_waitv with no records and null pointers only returns an error.
        let r = unsafe { libc::syscall(libc::SYS_futex_waitv, std::ptr::null::<u8>(), 0, 0, 0, 0) };
        let e = std::io::Error::last_os_error().raw_os_error();
        if r != -1 || e != Some(self.errno) {
            return Err(format!("the filter did not refuse futex_waitv: {r} {e:?}"));
        }
        Box::new(SubProgram::new(self.registry).with_index(env.index)).start(env)
    }
}

fn idle_children_keep_working_when_a_seccomp_filter_refuses_futex_waitv() -> Outcome {
    let mem = SharedMemory::new();
    let mut reg = SubRegistry::new();
    let noop = reg.register_fn("noop", |_| Ok(()));
    let programs: Vec<Box<dyn ChildProgram>> = [libc::EPERM, libc::EINVAL, libc::ENOSYS]
        .into_iter()
        .map(|errno| {
            Box::new(SandboxedSub {
                registry: reg.clone(),
                errno,
            }) as Box<dyn ChildProgram>
        })
        .collect();
    let mut children = Children::spawn(&mem, programs, process_opts()).ctx("spawn")?;
    let mut tasks = Tasks::new();
    for round in 0..3 {
        // Past the spin budget: every child parks on its three state words.
        std::thread::sleep(Duration::from_millis(60));
        for lane in 0..3 {
            ok(tasks.run(
                children.lane(lane),
                TaskSlot::ALL[round % 2],
                noop,
                &TaskArgs::new(),
            ))
            .map_err(|e| format!("round {round}, lane {lane}: {e}"))?;
        }
    }
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(
        report.is_clean(),
        "sandboxed children must exit normally (not with a protocol error): {report}"
    );
    Ok(())
}

// -------------------------------------------------------------------------------------
// Idle cost
// -------------------------------------------------------------------------------------

fn idle_children_use_almost_no_cpu() -> Outcome {
    let mem = SharedMemory::new();
    let mut reg = SubRegistry::new();
    let noop = reg.register_fn("noop", |_| Ok(()));
    let mut children = Children::spawn(&mem, subs(&reg, 4), process_opts()).ctx("spawn")?;
    let mut tasks = Tasks::new();
    for i in 0..4 {
        ok(tasks.run(children.lane(i), TaskSlot::Slot0, noop, &TaskArgs::new()))?;
    }
    std::thread::sleep(Duration::from_millis(100)); // past the spin budget: parked
    let pids = children.pids();
    let before: u64 = pids.iter().map(|p| cpu_ns(*p)).sum::<Result<u64, _>>()?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let after: u64 = pids.iter().map(|p| cpu_ns(*p)).sum::<Result<u64, _>>()?;
    let wall = t0.elapsed();
    let percent = (after - before) as f64 / wall.as_nanos() as f64 * 100.0;
    println!(
        "    4 parked children: {percent:.3} % of one core in total over {wall:.2?} ({} µs CPU)",
        (after - before) / 1000
    );
    check!(
        percent < 20.0,
        "idle children used {percent:.2} % of a core"
    );
    children.shutdown(BOUND).ctx("shutdown")?;
    Ok(())
}

// -------------------------------------------------------------------------------------
// Reaping: retried when it failed, never a reused pid
// -------------------------------------------------------------------------------------

/// Whether `pid` is still a child of this process that nobody reaped (running, or a
/// zombie): only then is its pid certainly not another process's.
fn still_our_child(pid: i32) -> bool {
    // SAFETY: an all-zero siginfo_t is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: WNOWAIT only peeks at the child's state (reaps nothing); `info` is
    // writable.
    unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        ) == 0
    }
}

/// Kills and reaps `pid` on drop if it is still our unreaped child (so never a pid that
/// was reaped and may belong to someone else now).
struct ReapIfOurs(i32);

impl Drop for ReapIfOurs {
    fn drop(&mut self) {
        if still_our_child(self.0) {
            // SAFETY: an unreaped child of ours: its pid cannot have been reused.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
                libc::waitpid(self.0, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// A shutdown whose reaps fail (injected: every wait for a process fails) kills the
/// children but cannot reap them and says so; the next shutdown — and the drop, for a
/// `Children` dropped after such a failure — retries and reaps them, updating the
/// report. Before, the first report was returned again and the zombies were forgotten.
fn a_reap_that_failed_is_retried_not_forgotten() -> Outcome {
    let reg = SubRegistry::new();
    for retry_by_drop in [false, true] {
        let mem = SharedMemory::new();
        let mut children = Children::spawn(&mem, subs(&reg, 2), process_opts()).ctx("spawn")?;
        let pids = children.pids();
        // Reap them ourselves if the scenario bails out.
        let _reap = pids.iter().map(|&p| ReapIfOurs(p)).collect::<Vec<_>>();
        children.inject_reap_failure();
        match children.shutdown(Duration::ZERO) {
            Err(HostError::Reap { what, .. }) => {
                check!(what.contains("sub_worker 0"), "{what}")
            }
            other => return Err(format!("expected a reap error, got {other:?}")),
        }
        check!(
            pids.iter().all(|&p| still_our_child(p)),
            "the failed shutdown reaped nothing"
        );
        if retry_by_drop {
            drop(children);
        } else {
            let report = children.shutdown(BOUND).ctx("the retried shutdown")?;
            for c in &report.children {
                // The first shutdown asked the children to stop and, its grace being zero,
                // killed them: whichever came first ended each one (a child that saw the
                // request in time exits 0 before the SIGKILL lands on its zombie).
                let ended = c
                    .end
                    .as_ref()
                    .is_some_and(|e| e.signal() == Some(libc::SIGKILL) || e.code() == Some(0));
                check!(
                    c.killed && ended,
                    "the retry reaps the child the failed shutdown ended and reports it: {c}"
                );
            }
        }
        for &p in &pids {
            check!(
                !still_our_child(p),
                "child {p} was left unreaped (retry by drop: {retry_by_drop})"
            );
        }
    }
    Ok(())
}

/// Someone else in the process reaps a child (a stray `waitpid`), and its pid goes to a
/// new process of ours; shutting the children down must neither reap nor kill that
/// process. Pid reuse is forced by writing `/proc/sys/kernel/ns_last_pid` (root only;
/// skipped, saying so, where it cannot be written or another process takes the pid).
fn shutdown_never_kills_or_reaps_a_process_that_reused_a_childs_pid() -> Outcome {
    let mem = SharedMemory::new();
    let mut children =
        Children::spawn(&mem, subs(&SubRegistry::new(), 1), process_opts()).ctx("spawn")?;
    let pid = children.pids()[0];
    // A stray reaper: kill and reap the child behind the watch's back.
    // SAFETY: `pid` is our unreaped child; reaping it is the fault under test.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    let mut decoy = None;
    for _ in 0..50 {
        if std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", pid - 1)).is_err() {
            break;
        }
        let d = Forked::fork(|| loop {
            std::thread::sleep(Duration::from_millis(10));
        })?;
        let d = ReapIfOurs(std::mem::ManuallyDrop::new(d).0);
        if d.0 == pid {
            decoy = Some(d);
            break;
        }
    }
    let Some(decoy) = decoy else {
        println!("    skipped: could not make a new process reuse pid {pid}");
        let _ = children.shutdown(BOUND);
        return Ok(());
    };
    let report = children.shutdown(Duration::ZERO).ctx("shutdown")?;
    check!(
        still_our_child(decoy.0),
        "the shutdown reaped the process that reused pid {pid}: {report}"
    );
    // SAFETY: signal 0 only checks that the decoy (our child) exists.
    let alive = unsafe { libc::kill(decoy.0, 0) } == 0;
    let zombie = std::fs::read_to_string(format!("/proc/{}/stat", decoy.0))
        .map(|s| s.contains(") Z "))
        .unwrap_or(true);
    check!(
        alive && !zombie,
        "the shutdown killed the process that reused pid {pid}: {report}"
    );
    check!(
        !report.children[0].killed,
        "a child reaped by someone else is not killed: {report}"
    );
    Ok(())
}

fn main() {
    become_subreaper();
    let process_only: &[Scenario] = &[
        (
            "a_reap_that_failed_is_retried_not_forgotten",
            a_reap_that_failed_is_retried_not_forgotten,
        ),
        (
            "shutdown_never_kills_or_reaps_a_process_that_reused_a_childs_pid",
            shutdown_never_kills_or_reaps_a_process_that_reused_a_childs_pid,
        ),
        (
            "threads_started_after_the_fork_do_not_deadlock",
            threads_started_after_the_fork_do_not_deadlock,
        ),
        (
            "spawn_refuses_to_fork_while_threads_run_unless_opted_in",
            spawn_refuses_to_fork_while_threads_run_unless_opted_in,
        ),
        (
            "a_child_killed_mid_task_is_reported_and_everything_is_reaped",
            a_child_killed_mid_task_is_reported_and_everything_is_reaped,
        ),
        (
            "idle_orphans_die_with_their_parent",
            idle_orphans_die_with_their_parent,
        ),
        (
            "busy_orphans_die_within_a_second_of_their_parent",
            busy_orphans_die_within_a_second_of_their_parent,
        ),
        (
            "a_child_sees_only_its_own_mailbox",
            a_child_sees_only_its_own_mailbox,
        ),
        (
            "a_child_cannot_resize_its_mailbox_under_its_parent",
            a_child_cannot_resize_its_mailbox_under_its_parent,
        ),
        (
            "idle_children_keep_working_when_a_seccomp_filter_refuses_futex_waitv",
            idle_children_keep_working_when_a_seccomp_filter_refuses_futex_waitv,
        ),
        (
            "idle_children_use_almost_no_cpu",
            idle_children_use_almost_no_cpu,
        ),
    ];
    common::run(&[contracts::suite::<Process>().as_slice(), process_only].concat());
}
