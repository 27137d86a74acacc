//! Real child processes: spawning, shared memory, sub-workers, liveness, shutdown,
//! reaping and orphans.
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

use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use strata_host::*;
use strata_mailbox::{
    codes, ChildExit, ControlReply, ControlRequest, Failure, Handler, MailboxState,
    TaskPublication, TaskRequest, TaskSlot, WaitOptions,
};
use strata_types::{
    ArgTag, BufferDesc, BufferLocation, DataType, IdentityMinter, TaskArgs, TensorArg, TensorView,
};

fn process_opts() -> SpawnOptions {
    SpawnOptions::new(ExecMode::Process).with_startup_timeout(BOUND)
}

/// `n` atomics at the start of region `region` (which must hold `8 n` bytes).
fn atomics(mem: &SharedMemory, region: u64, n: usize) -> Result<&[AtomicU64], String> {
    let p = mem.ptr(region, 0, 8 * n as u64).ctx("region")?;
    // SAFETY: the region holds 8n bytes from a page-aligned start; AtomicU64 is valid for
    // any bit pattern and is meant to be shared; the region lives as long as `mem`.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<AtomicU64>(), n) })
}

fn args_of(tensors: &[TensorArg], scalars: &[u64]) -> TaskArgs {
    let mut a = TaskArgs::new();
    for t in tensors {
        a.push_tensor(*t).unwrap();
    }
    for s in scalars {
        a.push_scalar(*s).unwrap();
    }
    a
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
// Shared memory
// -------------------------------------------------------------------------------------

fn shared_memory_is_shared_both_ways_and_zero_copy() -> Outcome {
    let mem = SharedMemory::new();
    let minter = IdentityMinter::new();
    let data = SharedTensor::from_slice(&mem, &minter, &[8], &[1u32, 2, 3, 4, 5, 6, 7, 8])
        .ctx("tensor")?;
    let flags = mem.create_region(16, "flags").ctx("flags")?;
    let mut reg = SubRegistry::new();
    // Checks that the tensor holds `expected + i`, then writes `100 * expected + i`.
    let check_and_write = reg.register_fn("check_and_write", |call| {
        let expected: u32 = call.scalar(0).ok_or("missing scalar")?;
        let mut t = call.tensor_mut::<u32>(0)?;
        let seen = t.to_vec();
        let want: Vec<u32> = (0..8).map(|i| expected + i).collect();
        if seen != want {
            return Err(format!("child saw {seen:?}, expected {want:?}"));
        }
        t.copy_from_slice(&(0..8).map(|i| 100 * expected + i).collect::<Vec<_>>())?;
        Ok(())
    });
    // Writes the tensor, raises flag 0, then holds the task open until the parent
    // raises flag 1: the parent must see the write while the task still runs.
    let m2 = mem.clone();
    let hold = reg.register_fn("write_and_hold", move |call| {
        let mut t = call.tensor_mut::<u32>(0)?;
        t.fill(42);
        drop(t);
        let f = atomics(&m2, flags, 2)?;
        f[0].store(1, Ordering::Release);
        let end = Instant::now() + BOUND;
        while f[1].load(Ordering::Acquire) == 0 {
            if Instant::now() > end {
                return Err("the parent never released the task".into());
            }
            std::hint::spin_loop();
        }
        Ok(())
    });
    let mut children = Children::spawn(&mem, subs(&reg, 1), process_opts()).ctx("spawn")?;
    let mut tasks = Tasks::new();
    let lane = children.lane(0);
    // Written before the fork → seen by the child; the child's writes → seen here.
    ok(tasks.run(
        lane,
        TaskSlot::Slot0,
        check_and_write,
        &args_of(&[data.arg(ArgTag::InOut)], &[1]),
    ))?;
    check!(
        data.to_vec::<u32>().ctx("read")? == (0..8).map(|i| 100 + i).collect::<Vec<_>>(),
        "parent did not see the child's write"
    );
    // Written by the parent after the fork → seen by the child.
    data.write(&(0..8).map(|i| 7 + i).collect::<Vec<u32>>())
        .ctx("write")?;
    ok(tasks.run(
        lane,
        TaskSlot::Slot1,
        check_and_write,
        &args_of(&[data.arg(ArgTag::InOut)], &[7]),
    ))?;
    check!(
        data.to_vec::<u32>().ctx("read")?[7] == 707,
        "second write not seen"
    );
    // Zero-copy: the write is visible before the task completes.
    tasks.publish(
        lane,
        TaskSlot::Slot0,
        hold,
        &args_of(&[data.arg(ArgTag::Output)], &[]),
    )?;
    let f = atomics(&mem, flags, 2)?;
    wait_for("the child's flag", || f[0].load(Ordering::Acquire) == 1)?;
    check!(
        data.to_vec::<u32>().ctx("read")? == vec![42; 8],
        "the write is not visible while the task runs"
    );
    let state = lane.parent().poll(TaskSlot::Slot0).ctx("poll")?.state;
    check!(
        state == MailboxState::TaskReady,
        "the task already completed ({state:?}): cannot tell zero-copy from copy-back"
    );
    f[1].store(1, Ordering::Release);
    ok(lane.wait_task(TaskSlot::Slot0, Some(BOUND)))?;
    lane.parent().reset(TaskSlot::Slot0).ctx("reset")?;
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(report.is_clean(), "unclean shutdown: {report}");
    Ok(())
}

// -------------------------------------------------------------------------------------
// Closures
// -------------------------------------------------------------------------------------

fn closures_capture_state_without_serialization_and_failures_are_clean() -> Outcome {
    let mem = SharedMemory::new();
    let minter = IdentityMinter::new();
    let out = SharedTensor::zeros::<u64>(&mem, &minter, &[2]).ctx("out")?;
    let input = SharedTensor::from_slice(&mem, &minter, &[2], &[1.5f32, 2.5]).ctx("in")?;
    let table: Vec<u64> = (0..16).map(|i| i * i).collect();
    let counter = Arc::new(AtomicU64::new(0));
    const OFFSET: u64 = 1000;
    let mut reg = SubRegistry::new();
    let c2 = counter.clone();
    let lookup = reg.register_fn("lookup", move |call| {
        let i: u64 = call.scalar(0).ok_or("missing scalar")?;
        let n = c2.fetch_add(1, Ordering::SeqCst) + 1;
        let mut o = call.tensor_mut::<u64>(0)?;
        let v = *table.get(i as usize).ok_or("index past the table")?;
        o.set(&[0], v + OFFSET)?;
        o.set(&[1], n)?;
        Ok(())
    });
    let fails = reg.register_fn("fails", |_| Err("deliberately failing".to_string()));
    let panics = reg.register_fn("panics", |_| panic!("deliberate closure panic"));
    let writes_input = reg.register_fn("writes_input", |call| {
        call.tensor_mut::<f32>(0)?;
        Ok(())
    });
    let wrong_type = reg.register_fn("wrong_type", |call| {
        call.tensor::<i32>(0)?;
        Ok(())
    });
    let mut children = Children::spawn(&mem, subs(&reg, 1), process_opts()).ctx("spawn")?;
    let mut tasks = Tasks::new();
    let lane = children.lane(0);
    for i in 0..5u64 {
        ok(tasks.run(
            lane,
            TaskSlot::Slot0,
            lookup,
            &args_of(&[out.arg(ArgTag::Output)], &[i]),
        ))?;
        let v = out.to_vec::<u64>().ctx("read")?;
        check!(
            v == vec![i * i + OFFSET, i + 1],
            "call {i}: got {v:?} (the count must persist across calls inside the child)"
        );
    }
    check!(
        counter.load(Ordering::SeqCst) == 0,
        "the parent's counter changed: the closure ran here, not in the child"
    );
    let slot = TaskSlot::Slot1;
    let no_args = TaskArgs::new();
    let (code, msg) = failed(tasks.run(lane, slot, fails, &no_args))?;
    check!(
        code == sub_codes::FAILED && msg == "sub_worker 0: fails: deliberately failing",
        "Err: {code} {msg}"
    );
    let (code, msg) = failed(tasks.run(lane, slot, panics, &no_args))?;
    check!(
        code == sub_codes::PANICKED
            && msg == "sub_worker 0: panics: panicked: deliberate closure panic",
        "panic: {code} {msg}"
    );
    let unknown = SubRegistry::id_of("never registered");
    let (code, msg) = failed(tasks.run(lane, slot, unknown, &no_args))?;
    check!(
        code == sub_codes::NOT_REGISTERED
            && msg == format!("sub_worker 0: callable {unknown} not registered"),
        "unknown digest: {code} {msg}"
    );
    let local = TensorArg::new(
        BufferDesc {
            identity: minter.mint(),
            nbytes: 8,
            location: BufferLocation::HostLocal { addr: 0x1000 },
        },
        TensorView::contiguous(DataType::U64, &[1]).ctx("view")?,
        ArgTag::Input,
    )
    .ctx("arg")?;
    let (code, msg) = failed(tasks.run(lane, slot, lookup, &args_of(&[local], &[0])))?;
    check!(
        code == sub_codes::BAD_ARGUMENT
            && msg.contains("host-local")
            && msg.contains("SharedTensor"),
        "host-local: {code} {msg}"
    );
    let (_, msg) = failed(tasks.run(
        lane,
        slot,
        writes_input,
        &args_of(&[input.arg(ArgTag::Input)], &[]),
    ))?;
    check!(msg.contains("tagged INPUT"), "tensor_mut on INPUT: {msg}");
    let (_, msg) = failed(tasks.run(
        lane,
        slot,
        wrong_type,
        &args_of(&[input.arg(ArgTag::Input)], &[]),
    ))?;
    check!(msg.contains("f32 elements, not i32"), "dtype: {msg}");
    // The child survived all of it.
    ok(tasks.run(
        lane,
        TaskSlot::Slot0,
        lookup,
        &args_of(&[out.arg(ArgTag::Output)], &[3]),
    ))?;
    check!(
        out.to_vec::<u64>().ctx("read")? == vec![1009, 6],
        "after failures"
    );
    lane.check_alive().ctx("alive")?;
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(report.is_clean(), "unclean shutdown: {report}");
    Ok(())
}

fn tensor_views_borrow_check_and_strided_access_work() -> Outcome {
    let mem = SharedMemory::new();
    let minter = IdentityMinter::new();
    let m = SharedTensor::from_slice(&mem, &minter, &[3, 4], &(0..12).collect::<Vec<i32>>())
        .ctx("m")?;
    let mut reg = SubRegistry::new();
    // arg 0: column 1 of m (INPUT, strided); arg 1: column 3 (OUTPUT, strided, disjoint
    // elements but an overlapping byte span); arg 2: all of m (INPUT).
    let f = reg.register_fn("columns", |call| {
        let col1 = call.tensor::<i32>(0)?;
        if call.tensor_mut::<i32>(1).is_ok() {
            return Err("a mutable view overlapping a borrowed one was allowed".into());
        }
        let vals: Vec<i32> = col1.iter().collect();
        if col1.as_slice().is_some() || vals != vec![1, 5, 9] {
            return Err(format!("strided read gave {vals:?}"));
        }
        drop(col1);
        let mut col3 = call.tensor_mut::<i32>(1)?;
        if call.tensor::<i32>(2).is_ok() {
            return Err("a shared view overlapping a mutable one was allowed".into());
        }
        for r in 0..3 {
            col3.set(&[r, 0], -(r as i32))?;
        }
        if col3.set(&[3, 0], 0).is_ok() {
            return Err("an out-of-range set was allowed".into());
        }
        drop(col3);
        let all = call.tensor::<i32>(2)?;
        let again = call.tensor::<i32>(2)?; // two shared views are fine
        if all.as_slice().map(<[i32]>::len) != Some(12) || again.get(&[2, 3])? != -2 {
            return Err("contiguous view".into());
        }
        Ok(())
    });
    let view = m.view();
    let a = m
        .arg_view(view.slice(1, 1, 2).ctx("s")?, ArgTag::Input)
        .ctx("a")?;
    let b = m
        .arg_view(view.slice(1, 3, 4).ctx("s")?, ArgTag::Output)
        .ctx("b")?;
    let mut children = Children::spawn(&mem, subs(&reg, 1), process_opts()).ctx("spawn")?;
    ok(Tasks::new().run(
        children.lane(0),
        TaskSlot::Slot0,
        f,
        &args_of(&[a, b, m.arg(ArgTag::Input)], &[]),
    ))?;
    let v = m.to_vec::<i32>().ctx("read")?;
    check!(
        v == vec![0, 1, 2, 0, 4, 5, 6, -1, 8, 9, 10, -2],
        "after the strided write: {v:?}"
    );
    children.shutdown(BOUND).ctx("shutdown")?;
    Ok(())
}

// -------------------------------------------------------------------------------------
// Round trips and parallelism
// -------------------------------------------------------------------------------------

fn ten_thousand_round_trips_through_a_sub_child_on_both_frames() -> Outcome {
    const N: u64 = 10_000;
    let mem = SharedMemory::new();
    let minter = IdentityMinter::new();
    let count = SharedTensor::zeros::<u64>(&mem, &minter, &[1]).ctx("count")?;
    let mut reg = SubRegistry::new();
    let inc = reg.register_fn("inc", |call| {
        call.tensor_mut::<u64>(0)?.update(|x| x + 1);
        Ok(())
    });
    let noop = reg.register_fn("noop", |_| Ok(()));
    let mut children = Children::spawn(&mem, subs(&reg, 1), process_opts()).ctx("spawn")?;
    let lane = children.lane(0);
    let mut tasks = Tasks::new();
    let args = args_of(&[count.arg(ArgTag::InOut)], &[]);
    // Alternate the frames: IDLE → TASK_READY → TASK_DONE → IDLE on each.
    for i in 0..N {
        let slot = TaskSlot::ALL[(i % 2) as usize];
        ok(tasks.run(lane, slot, inc, &args))?;
    }
    check!(
        count.to_vec::<u64>().ctx("read")? == vec![N],
        "the child ran {:?} increments, expected {N}",
        count.to_vec::<u64>()
    );
    // Measure (reported, not asserted): one task in flight, alternating frames…
    let none = TaskArgs::new();
    let t0 = Instant::now();
    for i in 0..N {
        ok(tasks.run(lane, TaskSlot::ALL[(i % 2) as usize], noop, &none))?;
    }
    let serial = t0.elapsed();
    // … and both frames in flight.
    let t0 = Instant::now();
    for _ in 0..N / 2 {
        for slot in TaskSlot::ALL {
            tasks.publish(lane, slot, noop, &none)?;
        }
        for slot in TaskSlot::ALL {
            ok(lane.wait_task(slot, Some(BOUND)))?;
            lane.parent().reset(slot).ctx("reset")?;
        }
    }
    let pipelined = t0.elapsed();
    println!(
        "    sub round trip (process): {:.2} µs/task one in flight, {:.2} µs/task two frames in flight ({N} tasks each)",
        serial.as_secs_f64() * 1e6 / N as f64,
        pipelined.as_secs_f64() * 1e6 / N as f64
    );
    children.shutdown(BOUND).ctx("shutdown")?;
    Ok(())
}

fn three_sub_workers_run_concurrently() -> Outcome {
    let mem = SharedMemory::new();
    let minter = IdentityMinter::new();
    // Row i: [start_ns, end_ns] of the call.
    let times = SharedTensor::zeros::<u64>(&mem, &minter, &[3, 2]).ctx("times")?;
    let mut reg = SubRegistry::new();
    let nap = reg.register_fn("nap", |call| {
        let ms: u64 = call.scalar(0).ok_or("missing scalar")?;
        let mut row = call.tensor_mut::<u64>(0)?;
        row.set(&[0, 0], mono_ns())?;
        std::thread::sleep(Duration::from_millis(ms));
        row.set(&[0, 1], mono_ns())?;
        Ok(())
    });
    let mut children = Children::spawn(&mem, subs(&reg, 3), process_opts()).ctx("spawn")?;
    let mut tasks = Tasks::new();
    let row = |i: u64| -> Result<TensorArg, String> {
        times
            .arg_view(
                times.view().slice(0, i, i + 1).ctx("slice")?,
                ArgTag::Output,
            )
            .ctx("row")
    };
    // Serial reference: three naps one after another on one worker.
    let t0 = Instant::now();
    for i in 0..3 {
        ok(tasks.run(
            children.lane(0),
            TaskSlot::Slot0,
            nap,
            &args_of(&[row(i)?], &[50]),
        ))?;
    }
    let serial = t0.elapsed();
    // Dispatched together, one per worker.
    let t0 = Instant::now();
    for i in 0..3 {
        tasks.publish(
            children.lane(i),
            TaskSlot::Slot0,
            nap,
            &args_of(&[row(i as u64)?], &[50]),
        )?;
    }
    for i in 0..3 {
        let lane = children.lane(i);
        ok(lane.wait_task(TaskSlot::Slot0, Some(BOUND)))?;
        lane.parent().reset(TaskSlot::Slot0).ctx("reset")?;
    }
    let parallel = t0.elapsed();
    let t = times.to_vec::<u64>().ctx("read")?;
    let latest_start = t[0].max(t[2]).max(t[4]);
    let earliest_end = t[1].min(t[3]).min(t[5]);
    println!(
        "    3 × 50 ms naps: serial {serial:.1?}, parallel {parallel:.1?}, ratio {:.2}",
        parallel.as_secs_f64() / serial.as_secs_f64()
    );
    check!(
        latest_start < earliest_end,
        "the three calls did not overlap: intervals {t:?}"
    );
    children.shutdown(BOUND).ctx("shutdown")?;
    Ok(())
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
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), Failure> {
        let v: u64 = req.args.scalar(0).unwrap_or(0);
        let (rtx, rrx) = mpsc::channel();
        let tx = self.tx.as_ref().ok_or(Failure::new(1, "no helper"))?;
        tx.send((v, rtx))
            .map_err(|e| Failure::new(1, e.to_string()))?;
        let got = rrx.recv().map_err(|e| Failure::new(1, e.to_string()))?;
        if got == 2 * v {
            Ok(())
        } else {
            Err(Failure::new(2, format!("helper answered {got} for {v}")))
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
// Startup failures
// -------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Bad {
    Err,
    Panic,
    Exit,
    Hang,
}

struct BadProgram(Bad);

impl ChildProgram for BadProgram {
    fn label(&self) -> String {
        format!("bad_child {:?}", self.0)
    }

    fn start(self: Box<Self>, _env: &ChildEnv) -> Result<Box<dyn Handler + Send>, String> {
        match self.0 {
            Bad::Err => Err("no device 7 (deliberate)".into()),
            Bad::Panic => panic!("deliberate start panic"),
            Bad::Exit => std::process::exit(7),
            Bad::Hang => {
                std::thread::sleep(Duration::from_secs(120));
                Err("woke up".into())
            }
        }
    }
}

fn startup_failures_name_the_child_and_leave_no_process() -> Outcome {
    let reg = SubRegistry::new();
    for bad in [Bad::Err, Bad::Panic, Bad::Exit, Bad::Hang] {
        let mem = SharedMemory::new();
        let programs: Vec<Box<dyn ChildProgram>> = vec![
            Box::new(SubProgram::new(reg.clone()).with_index(0)),
            Box::new(BadProgram(bad)),
            Box::new(SubProgram::new(reg.clone()).with_index(1)),
        ];
        let timeout = Duration::from_millis(300);
        let before = descendants();
        let r = Children::spawn(
            &mem,
            programs,
            SpawnOptions::new(ExecMode::Process).with_startup_timeout(timeout),
        );
        let after = descendants();
        check!(
            before == after,
            "{bad:?}: processes left: {before:?} -> {after:?}"
        );
        let e = match r {
            Err(e) => e,
            Ok(_) => return Err(format!("{bad:?}: spawn succeeded")),
        };
        let msg = e.to_string();
        let HostError::StartupFailed { label, pid, reason } = &e else {
            return Err(format!("{bad:?}: expected StartupFailed, got {e:?}"));
        };
        check!(
            label == &format!("bad_child {bad:?}"),
            "{bad:?}: label {label}"
        );
        let pid = pid.ok_or("no pid")?;
        check!(
            msg.starts_with(&format!(
                "bad_child {bad:?} (pid {pid}) failed during init: "
            )),
            "{bad:?}: {msg}"
        );
        // SAFETY: probing a pid with signal 0 has no effect.
        let gone = unsafe { libc::kill(pid, 0) } == -1;
        check!(gone, "{bad:?}: pid {pid} still exists");
        let want = match bad {
            Bad::Err => "no device 7 (deliberate)".to_string(),
            Bad::Panic => "panicked: deliberate start panic".to_string(),
            Bad::Exit => {
                "exited during init before signalling ready: exited with status 7".to_string()
            }
            Bad::Hang => {
                format!("did not become ready within {timeout:?} (startup deadline exceeded)")
            }
        };
        check!(reason == &want, "{bad:?}: reason {reason:?}, want {want:?}");
    }
    Ok(())
}

// -------------------------------------------------------------------------------------
// Death, shutdown, orphans
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

fn shutdown_kills_a_child_stuck_in_a_task_after_the_grace_period() -> Outcome {
    let mem = SharedMemory::new();
    let mut reg = SubRegistry::new();
    let stuck = reg.register_fn("stuck", |_| {
        std::thread::sleep(Duration::from_secs(120));
        Ok(())
    });
    let mut children = Children::spawn(&mem, subs(&reg, 2), process_opts()).ctx("spawn")?;
    Tasks::new().publish(children.lane(1), TaskSlot::Slot0, stuck, &TaskArgs::new())?;
    std::thread::sleep(Duration::from_millis(20));
    let t0 = Instant::now();
    let report = children
        .shutdown(Duration::from_millis(200))
        .ctx("shutdown")?;
    println!("    shutdown with a stuck child took {:.2?}", t0.elapsed());
    check!(
        report.children[0].end == Some(ChildEnd::Process(ChildExit::Exited(0)))
            && !report.children[0].killed,
        "{report}"
    );
    check!(
        report.children[1].killed
            && report.children[1].end.as_ref().and_then(ChildEnd::signal) == Some(libc::SIGKILL),
        "{report}"
    );
    // Dropping a `Children` that was never shut down also reaps (checked by the runner).
    let children = Children::spawn(&mem, subs(&reg, 2), process_opts()).ctx("spawn")?;
    drop(children);
    Ok(())
}

/// A nested worker: its `start` spawns its own sub-worker children (so INIT_READY means
/// the whole subtree is ready) and its handler forwards each task to one of them.
struct NestedProgram {
    registry: SubRegistry,
}

struct NestedHandler {
    inner: Children,
    tasks: Tasks,
    next: usize,
}

const CTRL_INNER_PIDS: u64 = 1;

impl ChildProgram for NestedProgram {
    fn label(&self) -> String {
        "child_worker level=3 id=0".into()
    }

    fn start(self: Box<Self>, env: &ChildEnv) -> Result<Box<dyn Handler + Send>, String> {
        let inner = Children::spawn(&env.shared, subs(&self.registry, 2), process_opts())
            .map_err(|e| e.to_string())?;
        env.set_ready_info(inner.len() as u64);
        Ok(Box::new(NestedHandler {
            inner,
            tasks: Tasks::new(),
            next: 0,
        }))
    }
}

impl Handler for NestedHandler {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), Failure> {
        let i = self.next % self.inner.len();
        self.next += 1;
        let id = self.tasks.identity(TaskSlot::Slot0);
        let task = TaskPublication::run(req.callable, id, &self.tasks.config, req.args_blob);
        match self.inner.lane(i).run_task(TaskSlot::Slot0, &task, None) {
            Ok(c) => c
                .outcome
                .map_err(|f| Failure::new(f.code, format!("inner: {}", f.message))),
            Err(e) => Err(Failure::new(50, e.to_string())),
        }
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, Failure> {
        match req.command {
            CTRL_INNER_PIDS => Ok(ControlReply {
                result: self.inner.len() as u64,
                payload: self
                    .inner
                    .pids()
                    .iter()
                    .flat_map(|p| p.to_le_bytes())
                    .collect(),
            }),
            c => Err(Failure::new(codes::UNSUPPORTED, format!("no command {c}"))),
        }
    }
}

fn pids_of(payload: &[u8]) -> Vec<i32> {
    payload
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn a_nested_worker_tree_starts_serves_and_shuts_down() -> Outcome {
    let mem = SharedMemory::new();
    let minter = IdentityMinter::new();
    let data = SharedTensor::from_slice(&mem, &minter, &[3], &[1i64, 2, 3]).ctx("data")?;
    let mut reg = SubRegistry::new();
    let neg = reg.register_fn("negate", |call| {
        call.tensor_mut::<i64>(0)?.update(|x| -x);
        Ok(())
    });
    let fail = reg.register_fn("fail", |call| {
        Err(format!("worker {} refuses", call.worker_index()))
    });
    let programs: Vec<Box<dyn ChildProgram>> = vec![Box::new(NestedProgram {
        registry: reg.clone(),
    })];
    let mut children = Children::spawn(&mem, programs, process_opts()).ctx("spawn")?;
    let lane = children.lane(0);
    check!(lane.ready_info() == 2, "ready info {}", lane.ready_info());
    let reply = lane
        .control(
            &ControlRequest {
                command: CTRL_INNER_PIDS,
                arg0: 0,
                payload: &[],
            },
            Some(BOUND),
        )
        .ctx("control")?;
    let grandchildren = pids_of(&reply.payload);
    let all = descendants();
    check!(
        grandchildren.len() == 2 && grandchildren.iter().all(|p| all.contains(p)),
        "grandchildren {grandchildren:?} not among descendants {all:?}"
    );
    let mut tasks = Tasks::new();
    for _ in 0..3 {
        ok(tasks.run(
            lane,
            TaskSlot::Slot0,
            neg,
            &args_of(&[data.arg(ArgTag::InOut)], &[]),
        ))?;
    }
    check!(
        data.to_vec::<i64>().ctx("read")? == vec![-1, -2, -3],
        "two levels down, still zero-copy"
    );
    let (_, msg) = failed(tasks.run(lane, TaskSlot::Slot1, fail, &TaskArgs::new()))?;
    check!(
        msg == "inner: sub_worker 0: fail: worker 0 refuses"
            || msg == "inner: sub_worker 1: fail: worker 1 refuses",
        "{msg}"
    );
    let e = lane
        .control(
            &ControlRequest {
                command: 99,
                arg0: 0,
                payload: &[],
            },
            Some(BOUND),
        )
        .err()
        .ok_or("control 99 succeeded")?;
    check!(
        matches!(e, HostError::Control { command: 99, .. })
            && e.to_string().contains("no command 99"),
        "{e}"
    );
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(report.is_clean(), "{report}");
    Ok(())
}

fn orphans_exit_by_themselves_when_their_parent_is_killed() -> Outcome {
    // The pids the middle process reports: [ready flag, n, pid…].
    let board = SharedMemory::new();
    let region = board.create_region(8 * 16, "board").ctx("board")?;
    let b2 = board.clone();
    let mut reg = SubRegistry::new();
    reg.register_fn("noop", |_| Ok(()));
    let middle = Forked::fork(move || {
        let slots = match atomics(&b2, region, 16) {
            Ok(s) => s,
            Err(_) => return 2,
        };
        let mem = SharedMemory::new();
        let mut programs = subs(&reg, 2);
        programs.push(Box::new(NestedProgram { registry: reg }));
        let mut children = match Children::spawn(&mem, programs, process_opts()) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("middle: {e}");
                slots[0].store(2, Ordering::Release);
                return 1;
            }
        };
        let mut pids = children.pids();
        let lane = children.lane(2);
        match lane.control(
            &ControlRequest {
                command: CTRL_INNER_PIDS,
                arg0: 0,
                payload: &[],
            },
            Some(BOUND),
        ) {
            Ok(r) => pids.extend(pids_of(&r.payload)),
            Err(_) => {
                slots[0].store(2, Ordering::Release);
                return 1;
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
    let slots = atomics(&board, region, 16)?;
    wait_for("the middle process", || {
        slots[0].load(Ordering::Acquire) != 0
    })?;
    check!(
        slots[0].load(Ordering::Acquire) == 1,
        "the middle process failed to start its children"
    );
    let n = slots[1].load(Ordering::Relaxed) as usize;
    let pids: Vec<i32> = (0..n)
        .map(|i| slots[2 + i].load(Ordering::Relaxed) as i32)
        .collect();
    check!(
        n == 5,
        "expected 3 children + 2 grandchildren, got {pids:?}"
    );
    let direct = &pids[..3];
    // SAFETY: SIGKILL our own child; then reap it.
    unsafe { libc::kill(middle.0, libc::SIGKILL) };
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(middle.0, &mut status, 0) };
    std::mem::forget(middle);
    let t0 = Instant::now();
    // As subreaper we inherit the orphans: reap each as it exits and record how.
    let mut exits: Vec<Option<i32>> = vec![None; direct.len()];
    let end = Instant::now() + BOUND;
    while exits.iter().any(Option::is_none) {
        if Instant::now() > end {
            // Clean up before failing.
            for (i, p) in direct.iter().enumerate() {
                if exits[i].is_none() {
                    // SAFETY: our (inherited) child.
                    unsafe {
                        libc::kill(*p, libc::SIGKILL);
                        libc::waitpid(*p, std::ptr::null_mut(), 0);
                    }
                }
            }
            return Err(format!("orphans still alive after {BOUND:?}: {pids:?}"));
        }
        for (i, p) in direct.iter().enumerate() {
            if exits[i].is_none() {
                let mut st = 0;
                // SAFETY: waitpid on an inherited child, non-blocking.
                let r = unsafe { libc::waitpid(*p, &mut st, libc::WNOHANG) };
                if r == *p {
                    exits[i] = Some(st);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // The grandchildren were shut down and reaped by the nested worker on its way out.
    wait_for("the grandchildren to be gone", || {
        // SAFETY: signal 0 only probes.
        pids[3..].iter().all(|p| unsafe { libc::kill(*p, 0) } == -1)
    })?;
    println!(
        "    {} orphans and their 2 children gone {:.2?} after the parent was killed",
        direct.len(),
        t0.elapsed()
    );
    for (p, st) in direct.iter().zip(&exits) {
        let st = st.unwrap_or(-1);
        check!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "orphan {p} did not exit by itself (status {st:#x})"
        );
    }
    Ok(())
}

// -------------------------------------------------------------------------------------
// Doorbell and idle cost
// -------------------------------------------------------------------------------------

fn the_doorbell_rings_after_every_completion() -> Outcome {
    let mem = SharedMemory::new();
    let mut reg = SubRegistry::new();
    let noop = reg.register_fn("noop", |_| Ok(()));
    let bell = Doorbell::new().ctx("doorbell")?;
    let mut children = Children::spawn(
        &mem,
        subs(&reg, 2),
        process_opts().with_doorbell(bell.clone()),
    )
    .ctx("spawn")?;
    let mut tasks = Tasks::new();
    let none = TaskArgs::new();
    // Let both children park, so the completions below must wake us through the bell.
    std::thread::sleep(Duration::from_millis(50));
    for round in 0..50 {
        let seen = bell.seq();
        let i = round % 2;
        tasks.publish(children.lane(i), TaskSlot::Slot0, noop, &none)?;
        // Poll, then park on the bell (no spin) until the lane's completion shows.
        let t_end = Instant::now() + BOUND;
        let mut seen = seen;
        loop {
            let poll = children
                .lane(i)
                .parent()
                .poll(TaskSlot::Slot0)
                .ctx("poll")?;
            if poll.completion.is_some() {
                break;
            }
            check!(Instant::now() < t_end, "round {round}: no completion");
            seen = bell.wait(seen, Duration::ZERO, Duration::from_secs(5));
        }
        children
            .lane(i)
            .parent()
            .reset(TaskSlot::Slot0)
            .ctx("reset")?;
    }
    check!(bell.waiters() == 0, "waiters left registered");
    children.shutdown(BOUND).ctx("shutdown")?;
    Ok(())
}

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

fn lanes_report_labels_pids_and_wait_options() -> Outcome {
    let mem = SharedMemory::new();
    let reg = SubRegistry::new();
    let wait = WaitOptions::new().with_spin(Duration::from_micros(5));
    let mut children =
        Children::spawn(&mem, subs(&reg, 2), process_opts().with_wait(wait)).ctx("spawn")?;
    check!(
        children.mode() == ExecMode::Process && children.len() == 2,
        "len"
    );
    let pids = children.pids();
    for (i, lane) in children.lanes_mut().iter_mut().enumerate() {
        check!(
            lane.index() == i && lane.label() == format!("sub_worker {i}"),
            "label"
        );
        check!(lane.pid() == Some(pids[i]) && !lane.is_dead(), "pid");
        check!(lane.wait_options().spin == wait.spin, "wait options");
        lane.check_alive().ctx("alive")?;
        lane.check_alive().ctx("alive (rate-limited)")?;
        let _ = lane.liveness().check();
    }
    check!(children.get(2).is_none(), "get out of range");
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(report.is_clean() && report.children.len() == 2, "{report}");
    Ok(())
}

fn main() {
    become_subreaper();
    common::run(&[
        (
            "shared_memory_is_shared_both_ways_and_zero_copy",
            shared_memory_is_shared_both_ways_and_zero_copy,
        ),
        (
            "closures_capture_state_without_serialization_and_failures_are_clean",
            closures_capture_state_without_serialization_and_failures_are_clean,
        ),
        (
            "tensor_views_borrow_check_and_strided_access_work",
            tensor_views_borrow_check_and_strided_access_work,
        ),
        (
            "ten_thousand_round_trips_through_a_sub_child_on_both_frames",
            ten_thousand_round_trips_through_a_sub_child_on_both_frames,
        ),
        (
            "three_sub_workers_run_concurrently",
            three_sub_workers_run_concurrently,
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
            "startup_failures_name_the_child_and_leave_no_process",
            startup_failures_name_the_child_and_leave_no_process,
        ),
        (
            "a_child_killed_mid_task_is_reported_and_everything_is_reaped",
            a_child_killed_mid_task_is_reported_and_everything_is_reaped,
        ),
        (
            "shutdown_kills_a_child_stuck_in_a_task_after_the_grace_period",
            shutdown_kills_a_child_stuck_in_a_task_after_the_grace_period,
        ),
        (
            "a_nested_worker_tree_starts_serves_and_shuts_down",
            a_nested_worker_tree_starts_serves_and_shuts_down,
        ),
        (
            "orphans_exit_by_themselves_when_their_parent_is_killed",
            orphans_exit_by_themselves_when_their_parent_is_killed,
        ),
        (
            "the_doorbell_rings_after_every_completion",
            the_doorbell_rings_after_every_completion,
        ),
        (
            "idle_children_use_almost_no_cpu",
            idle_children_use_almost_no_cpu,
        ),
        (
            "lanes_report_labels_pids_and_wait_options",
            lanes_report_labels_pids_and_wait_options,
        ),
    ]);
}
