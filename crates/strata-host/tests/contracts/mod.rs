//! The contracts of strata-host's children, written once over the execution mode and run
//! by both `processes.rs` (`ExecMode::Process`) and `threads_mode.rs`
//! (`ExecMode::Threads`): what a lane, a sub-worker, a startup failure, a death or a
//! shutdown look like does not depend on whether the child is a process or a thread.
//! Where the mode shows (a pid or none, an exit status or a thread's return code, whether
//! a closure's state is the parent's), the contract states both expectations side by
//! side.

use crate::common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_host::*;
use strata_mailbox::{ChildExit, ControlRequest, MailboxState, TaskSlot};
use strata_types::{
    ArgTag, BufferDesc, BufferLocation, DataType, IdentityMinter, TaskArgs, TensorArg, TensorView,
};

/// Every contract, instantiated for the mode `M`.
pub fn suite<M: Mode>() -> Vec<Scenario> {
    contracts![M;
        shared_memory_is_shared_both_ways_and_zero_copy,
        closures_keep_their_state_and_failures_are_task_failures,
        tensor_views_borrow_check_and_strided_access_work,
        ten_thousand_round_trips_through_a_sub_child_on_both_frames,
        three_sub_workers_run_concurrently,
        startup_failures_name_the_child_and_leave_nothing_running,
        a_child_that_breaks_the_protocol_is_reported_dead,
        shutdown_ends_a_child_stuck_in_a_task_after_the_grace_period,
        a_nested_worker_tree_starts_serves_and_shuts_down,
        the_doorbell_rings_after_every_completion,
        lanes_report_labels_pids_and_wait_options,
    ]
}

// -------------------------------------------------------------------------------------
// Shared memory, closures, views
// -------------------------------------------------------------------------------------

pub fn shared_memory_is_shared_both_ways_and_zero_copy<M: Mode>() -> Outcome {
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
            return Err(format!("child saw {seen:?}, expected {want:?}").into());
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
            strata_sync::sync::spin_hint();
        }
        Ok(())
    });
    let mut children = Children::spawn(&mem, subs(&reg, 1), opts(M::VALUE)).ctx("spawn")?;
    let mut tasks = Tasks::new();
    let lane = children.lane(0);
    // Written before the spawn → seen by the child; the child's writes → seen here.
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
    // Written by the parent after the spawn → seen by the child.
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

/// A closure's captured state lives where its child lives: each forked child keeps its
/// own copy (the parent's never changes), threads share the parent's. Either way the state
/// persists across calls, and every way a call can fail is a task failure that leaves the
/// child serving.
pub fn closures_keep_their_state_and_failures_are_task_failures<M: Mode>() -> Outcome {
    let mode = M::VALUE;
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
    let fails = reg.register_fn("fails", |_| Err("deliberately failing".into()));
    let panics = reg.register_fn("panics", |_| panic!("deliberate closure panic"));
    let writes_input = reg.register_fn("writes_input", |call| {
        call.tensor_mut::<f32>(0)?;
        Ok(())
    });
    let wrong_type = reg.register_fn("wrong_type", |call| {
        call.tensor::<i32>(0)?;
        Ok(())
    });
    let mut children = Children::spawn(&mem, subs(&reg, 2), opts(mode)).ctx("spawn")?;
    let mut tasks = Tasks::new();
    // The count a call sees: per child (processes) or shared by both (threads).
    let count_seen = |call: u64, calls_on_child_0: u64| match mode {
        ExecMode::Process => calls_on_child_0,
        ExecMode::Threads => call + 1,
    };
    for i in 0..5u64 {
        let lane = children.lane(i as usize % 2);
        ok(tasks.run(
            lane,
            TaskSlot::Slot0,
            lookup,
            &args_of(&[out.arg(ArgTag::Output)], &[i]),
        ))?;
        let v = out.to_vec::<u64>().ctx("read")?;
        let want = vec![i * i + OFFSET, count_seen(i, i / 2 + 1)];
        check!(
            v == want,
            "call {i}: got {v:?}, want {want:?} (the count persists across calls)"
        );
    }
    let here = counter.load(Ordering::SeqCst);
    match mode {
        ExecMode::Process => check!(
            here == 0,
            "the parent's counter changed ({here}): the closure ran here, not in the child"
        ),
        ExecMode::Threads => check!(here == 5, "threads share the parent's counter: {here}"),
    }
    let lane = children.lane(0);
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
    // SAFETY: the test checks that a sub-worker refuses host-local memory; the child
    // never dereferences this descriptor.
    let local_buf = unsafe {
        BufferDesc::from_parts(minter.mint(), 8, BufferLocation::HostLocal { addr: 0x1000 })
    };
    let local = TensorArg::new(
        local_buf,
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
    // The child survived all of it. The host-local call was refused before the closure
    // ran, so this is child 0's 4th counted call (processes), the 6th of both (threads).
    ok(tasks.run(
        lane,
        TaskSlot::Slot0,
        lookup,
        &args_of(&[out.arg(ArgTag::Output)], &[3]),
    ))?;
    let v = out.to_vec::<u64>().ctx("read")?;
    let want = vec![9 + OFFSET, count_seen(5, 4)];
    check!(v == want, "after failures: {v:?}, want {want:?}");
    lane.check_alive().ctx("alive")?;
    check!(!lane.is_dead(), "is_dead");
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(report.is_clean(), "unclean shutdown: {report}");
    Ok(())
}

pub fn tensor_views_borrow_check_and_strided_access_work<M: Mode>() -> Outcome {
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
            return Err(format!("strided read gave {vals:?}").into());
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
    let mut children = Children::spawn(&mem, subs(&reg, 1), opts(M::VALUE)).ctx("spawn")?;
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

pub fn ten_thousand_round_trips_through_a_sub_child_on_both_frames<M: Mode>() -> Outcome {
    const N: u64 = 10_000;
    let mode = M::VALUE;
    let mem = SharedMemory::new();
    let minter = IdentityMinter::new();
    let count = SharedTensor::zeros::<u64>(&mem, &minter, &[1]).ctx("count")?;
    let mut reg = SubRegistry::new();
    let inc = reg.register_fn("inc", |call| {
        call.tensor_mut::<u64>(0)?.update(|x| x + 1);
        Ok(())
    });
    let noop = reg.register_fn("noop", |_| Ok(()));
    let mut children = Children::spawn(&mem, subs(&reg, 1), opts(mode)).ctx("spawn")?;
    let pids = children.pids();
    let lane = children.lane(0);
    match mode {
        ExecMode::Process => check!(
            pids.len() == 1 && lane.pid() == Some(pids[0]),
            "a process child has a pid: {pids:?} {:?}",
            lane.pid()
        ),
        ExecMode::Threads => check!(
            pids.is_empty() && lane.pid().is_none(),
            "threads have no pids: {pids:?} {:?}",
            lane.pid()
        ),
    }
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
        "    sub round trip ({}): {:.2} µs/task one in flight, {:.2} µs/task two frames in flight ({N} tasks each)",
        M::NAME,
        serial.as_secs_f64() * 1e6 / N as f64,
        pipelined.as_secs_f64() * 1e6 / N as f64
    );
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(report.is_clean(), "{report}");
    check!(report.children[0].end == Some(clean_end(mode)), "{report}");
    Ok(())
}

pub fn three_sub_workers_run_concurrently<M: Mode>() -> Outcome {
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
    let mut children = Children::spawn(&mem, subs(&reg, 3), opts(M::VALUE)).ctx("spawn")?;
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
// Startup failures, deaths, shutdown
// -------------------------------------------------------------------------------------

/// A child whose start fails is named with how it failed, and the spawn leaves nothing
/// running: no process (each failed pid is gone) or no thread (each was joined).
pub fn startup_failures_name_the_child_and_leave_nothing_running<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let reg = SubRegistry::new();
    let timeout = Duration::from_millis(300);
    let kinds: &[Bad] = match mode {
        // A hung process is killed at the deadline; only a process can exit by itself.
        ExecMode::Process => &[
            Bad::Err,
            Bad::Panic,
            Bad::Exit,
            Bad::Hang(Duration::from_secs(120)),
        ],
        // A thread cannot be killed: it must give up by itself to be joined.
        ExecMode::Threads => &[Bad::Err, Bad::Panic, Bad::Hang(2 * timeout)],
    };
    for &bad in kinds {
        let mem = SharedMemory::new();
        let programs: Vec<Box<dyn ChildProgram>> = vec![
            Box::new(SubProgram::new(reg.clone()).with_index(0)),
            Box::new(BadProgram(bad)),
            Box::new(SubProgram::new(reg.clone()).with_index(1)),
        ];
        let before = descendants();
        let r = Children::spawn(
            &mem,
            programs,
            SpawnOptions::new(mode).with_startup_timeout(timeout),
        );
        let after = descendants();
        check!(
            before == after,
            "{bad:?}: processes left: {before:?} -> {after:?}"
        );
        check!(
            strata_host::other_threads().ctx("threads")? == 0,
            "{bad:?}: threads left running"
        );
        let e = match r {
            Err(e) => e,
            Ok(_) => return Err(format!("{bad:?}: spawn succeeded")),
        };
        let msg = e.to_string();
        let HostError::StartupFailed { label, pid, reason } = &e else {
            return Err(format!("{bad:?}: expected StartupFailed, got {e:?}"));
        };
        let want_label = BadProgram::label_of(bad);
        check!(label == &want_label, "{bad:?}: label {label}");
        let who = match (mode, pid) {
            (ExecMode::Process, Some(pid)) => {
                // SAFETY: probing a pid with signal 0 has no effect.
                let gone = unsafe { libc::kill(*pid, 0) } == -1;
                check!(gone, "{bad:?}: pid {pid} still exists");
                format!("pid {pid}")
            }
            (ExecMode::Threads, None) => "thread".to_string(),
            (_, pid) => return Err(format!("{bad:?}: pid {pid:?} in {mode:?} mode")),
        };
        check!(
            msg.starts_with(&format!("{want_label} ({who}) failed during init: ")),
            "{bad:?}: {msg}"
        );
        let want = match bad {
            Bad::Err => "no device 7 (deliberate)".to_string(),
            Bad::Panic => "panicked: deliberate start panic".to_string(),
            Bad::Exit => {
                "exited during init before signalling ready: exited with status 7".to_string()
            }
            Bad::Hang(_) => {
                format!("did not become ready within {timeout:?} (startup deadline exceeded)")
            }
        };
        check!(reason == &want, "{bad:?}: reason {reason:?}, want {want:?}");
    }
    Ok(())
}

/// A child that meets garbage in its mailbox stops serving with the protocol-error code;
/// the parent notices at its next liveness check and the death is in the report.
pub fn a_child_that_breaks_the_protocol_is_reported_dead<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mem = SharedMemory::new();
    let reg = SubRegistry::new();
    let mut children = Children::spawn(&mem, subs(&reg, 1), opts(mode)).ctx("spawn")?;
    let lane = children.lane(0);
    let pid = lane.pid();
    // Break the protocol under the child: garbage in task frame 1's state word. Its
    // serve loop fails (at its next park-slice wake-up) and the child ends.
    let p = lane.parent().mailbox().region().as_ptr();
    // SAFETY: the mailbox region is 3 × 64 KiB; byte 65 536 is task frame 1's (aligned)
    // state word, which is an atomic in the layout.
    unsafe {
        (*p.add(65_536).cast::<std::sync::atomic::AtomicU32>()).store(77, Ordering::Release);
    }
    let end = Instant::now() + BOUND;
    let err = loop {
        match lane.check_alive() {
            Ok(()) if Instant::now() < end => std::thread::sleep(Duration::from_millis(1)),
            Ok(()) => return Err("the child's end was never noticed".into()),
            Err(e) => break e,
        }
    };
    let (want_end, who) = match mode {
        ExecMode::Process => (
            ChildEnd::Process(ChildExit::Exited(exit_codes::PROTOCOL_ERROR)),
            format!("pid {}", pid.ok_or("no pid")?),
        ),
        ExecMode::Threads => (
            ChildEnd::ThreadReturned(exit_codes::PROTOCOL_ERROR),
            "thread".to_string(),
        ),
    };
    match &err {
        HostError::ChildDied {
            label,
            pid: died,
            exit,
        } if label == "sub_worker 0" && *died == pid && *exit == want_end => {}
        other => return Err(format!("unexpected: {other:?}")),
    }
    check!(
        err.to_string()
            .starts_with(&format!("sub_worker 0 ({who}) died: ")),
        "{err}"
    );
    check!(lane.is_dead(), "is_dead");
    let report = children.shutdown(BOUND).ctx("shutdown")?;
    check!(
        report.children[0].died_before_shutdown && !report.is_clean(),
        "{report}"
    );
    Ok(())
}

/// Shutdown gives a child stuck in a task a grace period, then ends it the only way the
/// mode allows: a process is killed, a thread is detached (and leaves once its task
/// returns; the runner waits for it). The other child ends cleanly, and a `Children`
/// dropped without a shutdown also ends every child.
pub fn shutdown_ends_a_child_stuck_in_a_task_after_the_grace_period<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let stuck_for = match mode {
        ExecMode::Process => Duration::from_secs(120),
        ExecMode::Threads => Duration::from_millis(800),
    };
    let mem = SharedMemory::new();
    let mut reg = SubRegistry::new();
    let stuck = reg.register_fn("stuck", move |_| {
        std::thread::sleep(stuck_for);
        Ok(())
    });
    let mut children = Children::spawn(&mem, subs(&reg, 2), opts(mode)).ctx("spawn")?;
    Tasks::new().publish(children.lane(1), TaskSlot::Slot0, stuck, &TaskArgs::new())?;
    std::thread::sleep(Duration::from_millis(20));
    let t0 = Instant::now();
    let report = children
        .shutdown(Duration::from_millis(200))
        .ctx("shutdown")?;
    println!("    shutdown with a stuck child took {:.2?}", t0.elapsed());
    check!(
        report.children[0].end == Some(clean_end(mode)) && !report.children[0].killed,
        "{report}"
    );
    check!(report.children[1].is_abnormal(), "{report}");
    match mode {
        ExecMode::Process => check!(
            report.children[1].killed
                && report.children[1].end.as_ref().and_then(ChildEnd::signal)
                    == Some(libc::SIGKILL),
            "{report}"
        ),
        ExecMode::Threads => check!(
            report.children[1].end.is_none() && report.to_string().contains("thread detached"),
            "{report}"
        ),
    }
    // Dropping a `Children` that was never shut down also ends them (checked by the
    // runner's leak check).
    let children = Children::spawn(&mem, subs(&reg, 2), opts(mode)).ctx("spawn")?;
    drop(children);
    Ok(())
}

pub fn a_nested_worker_tree_starts_serves_and_shuts_down<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mem = SharedMemory::new();
    let minter = IdentityMinter::new();
    let data = SharedTensor::from_slice(&mem, &minter, &[3], &[1i64, 2, 3]).ctx("data")?;
    let mut reg = SubRegistry::new();
    let neg = reg.register_fn("negate", |call| {
        call.tensor_mut::<i64>(0)?.update(|x| -x);
        Ok(())
    });
    let fail = reg.register_fn("fail", |call| {
        Err(format!("worker {} refuses", call.worker_index()).into())
    });
    let programs: Vec<Box<dyn ChildProgram>> = vec![Box::new(NestedProgram {
        registry: reg.clone(),
        mode,
    })];
    let mut children = Children::spawn(&mem, programs, opts(mode)).ctx("spawn")?;
    let lane = children.lane(0);
    check!(lane.ready_info() == 2, "ready info {}", lane.ready_info());
    let (inner, grandchildren) = inner_pids(lane)?;
    check!(inner == 2, "inner children: {inner}");
    match mode {
        ExecMode::Process => {
            let all = descendants();
            check!(
                grandchildren.len() == 2 && grandchildren.iter().all(|p| all.contains(p)),
                "grandchildren {grandchildren:?} not among descendants {all:?}"
            );
        }
        ExecMode::Threads => check!(
            grandchildren.is_empty(),
            "thread grandchildren have pids: {grandchildren:?}"
        ),
    }
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

// -------------------------------------------------------------------------------------
// Doorbell, lanes
// -------------------------------------------------------------------------------------

pub fn the_doorbell_rings_after_every_completion<M: Mode>() -> Outcome {
    let mem = SharedMemory::new();
    let mut reg = SubRegistry::new();
    let noop = reg.register_fn("noop", |_| Ok(()));
    let bell = Doorbell::new().ctx("doorbell")?;
    let mut children = Children::spawn(
        &mem,
        subs(&reg, 2),
        opts(M::VALUE).with_doorbell(bell.clone()),
    )
    .ctx("spawn")?;
    let mut tasks = Tasks::new();
    let none = TaskArgs::new();
    // Let both children park, so the completions below must wake us through the bell.
    std::thread::sleep(Duration::from_millis(50));
    for round in 0..100 {
        let i = round % 2;
        // Alternate the frames too, so both frames' completions ring.
        let slot = TaskSlot::ALL[round / 2 % 2];
        let mut seen = bell.seq();
        tasks.publish(children.lane(i), slot, noop, &none)?;
        // Poll, then park on the bell (no spin) until the lane's completion shows.
        let t_end = Instant::now() + BOUND;
        loop {
            let poll = children.lane(i).parent().poll(slot).ctx("poll")?;
            if poll.completion.is_some() {
                break;
            }
            check!(Instant::now() < t_end, "round {round}: no completion");
            seen = bell.wait(seen, Duration::ZERO, Duration::from_secs(5));
        }
        children.lane(i).parent().reset(slot).ctx("reset")?;
    }
    check!(bell.waiters() == 0, "waiters left registered");
    children.shutdown(BOUND).ctx("shutdown")?;
    Ok(())
}

pub fn lanes_report_labels_pids_and_wait_options<M: Mode>() -> Outcome {
    let mode = M::VALUE;
    let mem = SharedMemory::new();
    let reg = SubRegistry::new();
    let wait = strata_mailbox::WaitOptions::new().with_spin(Duration::from_micros(5));
    let mut children =
        Children::spawn(&mem, subs(&reg, 2), opts(mode).with_wait(wait)).ctx("spawn")?;
    check!(children.mode() == mode && children.len() == 2, "len");
    let pids = children.pids();
    check!(
        pids.len() == if mode == ExecMode::Process { 2 } else { 0 },
        "pids {pids:?}"
    );
    for (i, lane) in children.lanes_mut().iter_mut().enumerate() {
        check!(
            lane.index() == i && lane.label() == format!("sub_worker {i}"),
            "label"
        );
        check!(lane.pid() == pids.get(i).copied() && !lane.is_dead(), "pid");
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
