//! Cross-process scenarios: a parent and `fork`ed children talking through a mailbox.
//!
//! `harness = false`: the libtest harness runs tests on threads, and `fork` in a
//! multi-threaded process can deadlock the child. This binary stays single-threaded and
//! runs each scenario sequentially from `main`, printing `test <name> ... ok`, and exits
//! non-zero if any scenario fails. Arguments that do not start with `-` filter scenarios
//! by substring, like libtest.
//!
//! Tests assert behaviour, never timings: every bound below is a generous safety net
//! against hanging (30 s), not a performance expectation.

// The mailbox API is compiled out under `--cfg loom` (only the protocol core is
// model-checked there), so this binary is empty in that configuration.
#[cfg(not(loom))]
mod scenarios {

    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    use strata_mailbox::*;
    use strata_types::{
        ArgTag, BufferDesc, BufferLocation, CallableId, DataType, IdentityMinter, TaskArgs,
        TensorArg, TensorView,
    };

    /// The safety net for every wait in this file.
    const BOUND: Duration = Duration::from_secs(30);

    const SUM: CallableId = CallableId([1; 32]);
    const FAIL: CallableId = CallableId([2; 32]);
    const ABORT: CallableId = CallableId([3; 32]);
    const SIGKILL_SELF: CallableId = CallableId([4; 32]);
    const SLOW: CallableId = CallableId([5; 32]);

    /// Region id (in `BufferLocation::HostShared`) of the results region.
    const RESULTS_REGION: u64 = 1;
    const RESULTS_BYTES: usize = 4096;

    type Outcome = Result<(), String>;

    /// A named scenario.
    type Scenario = (&'static str, fn() -> Outcome);

    macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

    fn opts() -> WaitOptions {
        WaitOptions::new().with_timeout(BOUND)
    }

    // ---------------------------------------------------------------------------------------
    // Processes
    // ---------------------------------------------------------------------------------------

    /// A forked child that is killed and reaped if the scenario bails out early. Its
    /// `watch` is both the liveness check for the parent's waits and the reaper, so an exit
    /// the liveness check already reaped is still known.
    struct Forked {
        pid: i32,
        watch: ChildProcess,
    }

    impl Forked {
        fn new(pid: i32) -> Forked {
            Forked {
                pid,
                watch: ChildProcess::new(pid),
            }
        }

        /// Waits (polling `waitpid(WNOHANG)`) until the child exits, at most `BOUND`.
        fn wait_exit(&mut self) -> Result<ChildExit, String> {
            let end = Instant::now() + BOUND;
            loop {
                match self.watch.try_wait().map_err(|e| e.to_string())? {
                    Some(exit) => return Ok(exit),
                    None if Instant::now() > end => {
                        return Err(format!("child {} did not exit within {BOUND:?}", self.pid))
                    }
                    None => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        }
    }

    impl Drop for Forked {
        fn drop(&mut self) {
            if self.watch.exit().is_none() {
                // SAFETY: kill and waitpid on a pid this process forked and has not reaped.
                unsafe {
                    libc::kill(self.pid, libc::SIGKILL);
                    libc::waitpid(self.pid, std::ptr::null_mut(), 0);
                }
            }
        }
    }

    /// Forks; the child runs `body` and `_exit`s with its result (101 if it panicked). The
    /// child never returns into the caller's frames.
    fn fork(body: impl FnOnce() -> i32) -> Result<Forked, String> {
        // SAFETY: this process is single-threaded (no harness, no threads spawned), so the
        // child may run arbitrary code after fork.
        let pid = unsafe { libc::fork() };
        match pid {
            -1 => Err(format!("fork failed: {}", std::io::Error::last_os_error())),
            0 => {
                let code = catch_unwind(AssertUnwindSafe(body)).unwrap_or(101);
                // SAFETY: leave the child without running the parent's destructors or atexit
                // handlers.
                unsafe { libc::_exit(code) }
            }
            pid => Ok(Forked::new(pid)),
        }
    }

    // ---------------------------------------------------------------------------------------
    // The child's handler
    // ---------------------------------------------------------------------------------------

    /// Sums the scalars of a task and stores the sum (u64) where its first tensor argument
    /// points in the results region; other callables fail, abort, kill themselves or sleep.
    struct TestChild<'a> {
        results: &'a SharedRegion,
    }

    impl Handler for TestChild<'_> {
        fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
            match req.callable {
                SUM => {
                    let sum = req
                        .args
                        .scalars()
                        .iter()
                        .fold(0u64, |a, &b| a.wrapping_add(b));
                    let t = req
                        .args
                        .tensors()
                        .first()
                        .ok_or_else(|| FailureReport::new(10, "SUM needs an output tensor"))?;
                    let offset = match t.buffer.location() {
                        BufferLocation::HostShared {
                            region: RESULTS_REGION,
                            offset,
                        } => offset + t.view.byte_offset(),
                        other => {
                            return Err(FailureReport::new(
                                10,
                                format!("unexpected location {other:?}"),
                            ))
                        }
                    };
                    if offset % 8 != 0 || offset as usize + 8 > self.results.len() {
                        return Err(FailureReport::new(
                            10,
                            format!("offset {offset} outside the results"),
                        ));
                    }
                    // SAFETY: in bounds and 8-aligned (checked above) inside a live mapping;
                    // the word is only accessed atomically.
                    let cell = unsafe {
                        &*self
                            .results
                            .as_ptr()
                            .add(offset as usize)
                            .cast::<AtomicU64>()
                    };
                    cell.store(sum, Ordering::Relaxed);
                    Ok(())
                }
                FAIL => Err(FailureReport::new(
                    11,
                    format!("refusing dispatch {}", req.identity.dispatch_id),
                )),
                ABORT => std::process::abort(),
                SIGKILL_SELF => {
                    // SAFETY: sends SIGKILL to this very process.
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                    Ok(())
                }
                SLOW => {
                    std::thread::sleep(Duration::from_millis(50));
                    Ok(())
                }
                other => Err(FailureReport::new(12, format!("unknown callable {other}"))),
            }
        }

        fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
            match req.command {
                1 => Ok(ControlReply {
                    result: req.arg0 * 2,
                    payload: req.payload.iter().rev().copied().collect(),
                }),
                2 => Err(FailureReport::new(17, "no buffer 99 on this child")),
                3 => std::process::abort(),
                c => Err(FailureReport::new(
                    codes::UNSUPPORTED,
                    format!("unknown control command {c}"),
                )),
            }
        }
    }

    /// Forks a child that reports `INIT_READY(info)` and serves `mailbox` until shutdown
    /// (exit 0) or parent death (exit 7).
    fn spawn_server(
        mailbox: &Mailbox,
        results: &SharedRegion,
        info: u64,
    ) -> Result<(Forked, Parent), String> {
        let me = std::process::id();
        let child_mb = mailbox.try_clone().map_err(|e| e.to_string())?;
        let forked = fork(move || {
            let mut child = Child::with_parent(child_mb, me);
            if child.init_ready(info).is_err() {
                return 3;
            }
            match child.serve(&mut TestChild { results }) {
                Ok(ServeExit::Shutdown) => 0,
                Ok(ServeExit::ParentDied) => 7,
                Err(_) => 4,
            }
        })?;
        let mut parent = Parent::new(mailbox.try_clone().map_err(|e| e.to_string())?);
        let mut forked = forked;
        let got = parent
            .wait_init(&opts(), &mut forked.watch)
            .map_err(|e| format!("wait_init: {e}"))?;
        check!(got == info, "INIT_READY info {got}, expected {info}");
        Ok((forked, parent))
    }

    fn shutdown_and_reap(parent: &mut Parent, child: &mut Forked) -> Outcome {
        parent.request_shutdown();
        let exit = child.wait_exit()?;
        check!(
            exit == ChildExit::Exited(0),
            "child ended with {exit} instead of exit 0"
        );
        Ok(())
    }

    /// A SUM task: one output tensor at `slot_index * 8` of the results region, then scalars.
    fn sum_args(minter: &IdentityMinter, slot_index: u64, scalars: &[u64]) -> Vec<u8> {
        // SAFETY: each task names its own 8-byte slot of the results region, which this
        // test allocated; no two descriptors cover the same bytes.
        let buffer = unsafe {
            BufferDesc::from_parts(
                minter.mint(),
                8,
                BufferLocation::HostShared {
                    region: RESULTS_REGION,
                    offset: slot_index * 8,
                },
            )
        };
        let view = TensorView::contiguous(DataType::U64, &[1]).expect("a 1-element view");
        let mut args = TaskArgs::new();
        args.push_tensor(TensorArg::new(buffer, view, ArgTag::Output).expect("fits"))
            .expect("one tensor");
        for &s in scalars {
            args.push_scalar(s).expect("few scalars");
        }
        encode_args_blob(&args).expect("few scalars")
    }

    fn result_at(results: &SharedRegion, slot_index: u64) -> u64 {
        // SAFETY: slot_index * 8 + 8 <= RESULTS_BYTES for every index used below; aligned.
        let cell = unsafe {
            &*results
                .as_ptr()
                .add(slot_index as usize * 8)
                .cast::<AtomicU64>()
        };
        cell.load(Ordering::Relaxed)
    }

    fn identity(dispatch: u64, slot: TaskSlot) -> FrameIdentity {
        FrameIdentity {
            run_id: 1,
            lease_slot: slot.index() as u32,
            lease_generation: 1,
            dispatch_id: dispatch,
        }
    }

    // ---------------------------------------------------------------------------------------
    // Scenarios
    // ---------------------------------------------------------------------------------------

    fn ten_thousand_round_trips_sum_scalars() -> Outcome {
        let mb = Mailbox::create().map_err(|e| e.to_string())?;
        let results = SharedRegion::anonymous(RESULTS_BYTES).map_err(|e| e.to_string())?;
        let (mut child, mut parent) = spawn_server(&mb, &results, 0x5157)?;
        let minter = IdentityMinter::new();
        let config = EncodedConfig::default();
        for i in 0..10_000u64 {
            let k = i % 512;
            let blob = sum_args(&minter, k, &[i, 2 * i, 3 * i]);
            let task = TaskPublication::run(SUM, identity(i + 1, TaskSlot::Slot0), &config, &blob);
            let done = parent
                .run_task(TaskSlot::Slot0, &task, &opts(), &mut child.watch)
                .map_err(|e| format!("round {i}: {e}"))?;
            check!(done.outcome == Ok(()), "round {i}: {:?}", done.outcome);
            check!(
                done.state == MailboxState::TaskDone && done.accepted,
                "round {i}: {done:?}"
            );
            check!(
                done.identity.dispatch_id == i + 1,
                "round {i}: identity {}",
                done.identity
            );
            let got = result_at(&results, k);
            check!(
                got == 6 * i,
                "round {i}: the child computed {got}, expected {}",
                6 * i
            );
        }
        // A failing task in the same session: the parent gets the child's code and message.
        let blob = sum_args(&minter, 0, &[]);
        let task = TaskPublication::run(FAIL, identity(10_001, TaskSlot::Slot0), &config, &blob);
        let done = parent
            .run_task(TaskSlot::Slot0, &task, &opts(), &mut child.watch)
            .map_err(|e| e.to_string())?;
        check!(
            done.outcome == Err(FailureReport::new(11, "refusing dispatch 10001")),
            "failure outcome {:?}",
            done.outcome
        );
        shutdown_and_reap(&mut parent, &mut child)
    }

    fn both_task_frames_in_flight() -> Outcome {
        let mb = Mailbox::create().map_err(|e| e.to_string())?;
        let results = SharedRegion::anonymous(RESULTS_BYTES).map_err(|e| e.to_string())?;
        let (mut child, mut parent) = spawn_server(&mb, &results, 2)?;
        let minter = IdentityMinter::new();
        let config = EncodedConfig::default();
        for i in 0..1_000u64 {
            // Odd rounds stage frame 1 as a successor and activate it once staged.
            let prepare = i % 2 == 1;
            let a = sum_args(&minter, 0, &[i, 1]);
            let b = sum_args(&minter, 1, &[i, 2]);
            let ta = TaskPublication::run(SUM, identity(2 * i + 1, TaskSlot::Slot0), &config, &a);
            let mut tb =
                TaskPublication::run(SUM, identity(2 * i + 2, TaskSlot::Slot1), &config, &b);
            if prepare {
                tb.kind = PublishKind::Prepare;
            }
            parent
                .publish(TaskSlot::Slot0, &ta)
                .map_err(|e| e.to_string())?;
            parent
                .publish(TaskSlot::Slot1, &tb)
                .map_err(|e| e.to_string())?;
            if prepare {
                let mut snap = parent.snapshot().map_err(|e| e.to_string())?;
                while snap.task(TaskSlot::Slot1) == MailboxState::PrepareReady {
                    snap = parent
                        .wait_change(&snap, &opts(), &mut child.watch)
                        .map_err(|e| e.to_string())?;
                }
                check!(
                    snap.task(TaskSlot::Slot1) == MailboxState::FrameStaged,
                    "round {i}: frame 1 is {}, expected FRAME_STAGED",
                    snap.task(TaskSlot::Slot1)
                );
                let poll = parent.poll(TaskSlot::Slot1).map_err(|e| e.to_string())?;
                check!(
                    poll.disposition == PrepareDisposition::ValidatedOnly,
                    "round {i}: disposition {:?}",
                    poll.disposition
                );
                check!(
                    parent
                        .activate(TaskSlot::Slot1)
                        .map_err(|e| e.to_string())?,
                    "round {i}: activation refused"
                );
            }
            // Collect in the opposite order of publication.
            for slot in [TaskSlot::Slot1, TaskSlot::Slot0] {
                let done = parent
                    .wait_task(slot, &opts(), &mut child.watch)
                    .map_err(|e| format!("round {i} {slot:?}: {e}"))?;
                check!(
                    done.outcome == Ok(()),
                    "round {i} {slot:?}: {:?}",
                    done.outcome
                );
                parent.reset(slot).map_err(|e| e.to_string())?;
            }
            check!(
                result_at(&results, 0) == i + 1,
                "round {i}: slot 0 result {}",
                result_at(&results, 0)
            );
            check!(
                result_at(&results, 1) == i + 2,
                "round {i}: slot 1 result {}",
                result_at(&results, 1)
            );
        }
        shutdown_and_reap(&mut parent, &mut child)
    }

    fn control_commands_succeed_and_report_child_errors() -> Outcome {
        let mb = Mailbox::create().map_err(|e| e.to_string())?;
        let results = SharedRegion::anonymous(RESULTS_BYTES).map_err(|e| e.to_string())?;
        let (mut child, mut parent) = spawn_server(&mb, &results, 3)?;
        let reply = parent
            .control(
                &ControlRequest {
                    command: 1,
                    arg0: 21,
                    payload: b"strata",
                },
                &opts(),
                &mut child.watch,
            )
            .map_err(|e| e.to_string())?;
        check!(
            reply
                == ControlReply {
                    result: 42,
                    payload: b"atarts".to_vec()
                },
            "reply {reply:?}"
        );
        match parent.control(
            &ControlRequest {
                command: 2,
                arg0: 0,
                payload: &[],
            },
            &opts(),
            &mut child.watch,
        ) {
            Err(MailboxError::ControlFailed {
                command: 2,
                code: 17,
                message,
            }) => {
                check!(
                    message == "no buffer 99 on this child",
                    "message {message:?}"
                )
            }
            other => return Err(format!("expected ControlFailed, got {other:?}")),
        }
        match parent.control(
            &ControlRequest {
                command: 9,
                arg0: 0,
                payload: &[],
            },
            &opts(),
            &mut child.watch,
        ) {
            Err(MailboxError::ControlFailed { code, message, .. }) => {
                check!(code == codes::UNSUPPORTED, "code {code}");
                check!(
                    message == "unknown control command 9",
                    "message {message:?}"
                );
            }
            other => return Err(format!("expected ControlFailed, got {other:?}")),
        }
        // The channel still works after errors.
        let reply = parent
            .control(
                &ControlRequest {
                    command: 1,
                    arg0: 5,
                    payload: &[],
                },
                &opts(),
                &mut child.watch,
            )
            .map_err(|e| e.to_string())?;
        check!(reply.result == 10, "result {}", reply.result);
        shutdown_and_reap(&mut parent, &mut child)
    }

    fn init_failure_is_reported_with_its_message() -> Outcome {
        let mb = Mailbox::create().map_err(|e| e.to_string())?;
        let child_mb = mb.try_clone().map_err(|e| e.to_string())?;
        let me = std::process::id();
        let mut child = fork(move || {
            let mut c = Child::with_parent(child_mb, me);
            match c.init_failed(&FailureReport::new(3, "device 7 not found")) {
                Ok(()) => 2,
                Err(_) => 5,
            }
        })?;
        let mut parent = Parent::new(mb);
        match parent.wait_init(&opts(), &mut child.watch) {
            Err(MailboxError::InitFailed { code: 3, message }) => {
                check!(message == "device 7 not found", "message {message:?}")
            }
            other => return Err(format!("expected InitFailed, got {other:?}")),
        }
        let exit = child.wait_exit()?;
        check!(exit == ChildExit::Exited(2), "child ended with {exit}");
        Ok(())
    }

    fn orderly_shutdown_exits_zero_and_is_reaped() -> Outcome {
        let mb = Mailbox::create().map_err(|e| e.to_string())?;
        let results = SharedRegion::anonymous(RESULTS_BYTES).map_err(|e| e.to_string())?;
        let (mut child, mut parent) = spawn_server(&mb, &results, 5)?;
        // Let the child go idle and park first, so the shutdown has to wake it.
        std::thread::sleep(Duration::from_millis(20));
        shutdown_and_reap(&mut parent, &mut child)?;
        check!(
            parent.mailbox().shutdown_requested(),
            "sticky shutdown word not set"
        );
        check!(
            matches!(
                parent.control(
                    &ControlRequest {
                        command: 1,
                        arg0: 0,
                        payload: &[]
                    },
                    &opts(),
                    &mut AssumeAlive
                ),
                Err(MailboxError::ShutdownRequested)
            ),
            "control after shutdown must be refused"
        );
        Ok(())
    }

    fn a_child_dying_mid_task_ends_the_wait_with_child_exited() -> Outcome {
        let minter = IdentityMinter::new();
        let config = EncodedConfig::default();
        for (callable, signal) in [(ABORT, libc::SIGABRT), (SIGKILL_SELF, libc::SIGKILL)] {
            let mb = Mailbox::create().map_err(|e| e.to_string())?;
            let results = SharedRegion::anonymous(RESULTS_BYTES).map_err(|e| e.to_string())?;
            let (mut child, mut parent) = spawn_server(&mb, &results, 6)?;
            let blob = sum_args(&minter, 0, &[]);
            let task = TaskPublication::run(callable, identity(1, TaskSlot::Slot0), &config, &blob);
            parent
                .publish(TaskSlot::Slot0, &task)
                .map_err(|e| e.to_string())?;
            match parent.wait_task(TaskSlot::Slot0, &opts(), &mut child.watch) {
                Err(MailboxError::ChildExited { pid, exit }) => {
                    check!(pid == child.pid, "pid {pid}");
                    check!(
                        matches!(exit, ChildExit::Signaled { signal: s, .. } if s == signal),
                        "exit {exit}, expected signal {signal}"
                    );
                    check!(
                        child.watch.exit() == Some(exit),
                        "the liveness check reaped the child"
                    );
                }
                other => return Err(format!("expected ChildExited, got {other:?}")),
            }
        }
        // A child dying inside a control command: the command fails, the channel is poisoned.
        let mb = Mailbox::create().map_err(|e| e.to_string())?;
        let results = SharedRegion::anonymous(RESULTS_BYTES).map_err(|e| e.to_string())?;
        let (mut child, mut parent) = spawn_server(&mb, &results, 6)?;
        match parent.control(
            &ControlRequest {
                command: 3,
                arg0: 0,
                payload: &[],
            },
            &opts(),
            &mut child.watch,
        ) {
            Err(MailboxError::ChildExited {
                exit: ChildExit::Signaled { signal, .. },
                ..
            }) => {
                check!(signal == libc::SIGABRT, "signal {signal}");
            }
            other => return Err(format!("expected ChildExited, got {other:?}")),
        }
        check!(
            matches!(
                parent.control(
                    &ControlRequest {
                        command: 1,
                        arg0: 0,
                        payload: &[]
                    },
                    &opts(),
                    &mut child.watch
                ),
                Err(MailboxError::ControlPoisoned { .. })
            ),
            "the control channel must be poisoned"
        );
        Ok(())
    }

    fn an_orphaned_child_exits_by_itself() -> Outcome {
        let mb = Mailbox::create().map_err(|e| e.to_string())?;
        let results = SharedRegion::anonymous(RESULTS_BYTES).map_err(|e| e.to_string())?;
        let shared = SharedRegion::anonymous(64).map_err(|e| e.to_string())?;
        // SAFETY: a 4-byte aligned word at the start of a 64-byte mapping, used atomically.
        let grandchild_pid = unsafe { &*shared.as_ptr().cast::<AtomicU32>() };
        let mut middle = fork(|| {
            // The middle process: fork the serving grandchild, wait until it serves and has
            // gone idle (parked), then die without shutting it down.
            let (grandchild, _parent) = match spawn_server(&mb, &results, 8) {
                Ok(x) => x,
                Err(_) => return 3,
            };
            grandchild_pid.store(grandchild.pid as u32, Ordering::SeqCst);
            std::mem::forget(grandchild); // do not kill it on the way out
            std::thread::sleep(Duration::from_millis(30));
            0
        })?;
        let exit = middle.wait_exit()?;
        check!(
            exit == ChildExit::Exited(0),
            "middle process ended with {exit}"
        );
        let pid = grandchild_pid.load(Ordering::SeqCst) as i32;
        check!(pid > 0, "the middle process did not report its child");
        // We are a child subreaper (see main), so the orphan is re-parented to us and we can
        // reap it: it must exit by itself with the "parent died" status.
        let mut orphan = Forked::new(pid);
        let exit = orphan.wait_exit()?;
        check!(
            exit == ChildExit::Exited(7),
            "orphan ended with {exit}, expected exit 7 (ParentDied)"
        );
        // SAFETY: kill(pid, 0) only checks for existence; the pid was reaped above.
        let gone = unsafe { libc::kill(pid, 0) } == -1;
        check!(gone, "process {pid} still exists");
        Ok(())
    }

    fn a_parked_child_is_woken_by_a_later_publication() -> Outcome {
        let mb = Mailbox::create().map_err(|e| e.to_string())?;
        let results = SharedRegion::anonymous(RESULTS_BYTES).map_err(|e| e.to_string())?;
        let (mut child, mut parent) = spawn_server(&mb, &results, 9)?;
        let minter = IdentityMinter::new();
        let config = EncodedConfig::default();
        for round in 0..3u64 {
            // Idle for far longer than the 50 µs spin budget: the child parks (sleeping 'S'
            // in /proc, not spinning 'R').
            let mut parked = false;
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(2));
                if strata_testkit::proc_state(child.pid) == Some('S') {
                    parked = true;
                    break;
                }
            }
            check!(
                parked,
                "round {round}: the idle child never showed up as sleeping"
            );
            let blob = sum_args(&minter, 3, &[round, 40]);
            let task =
                TaskPublication::run(SUM, identity(round + 1, TaskSlot::Slot0), &config, &blob);
            let done = parent
                .run_task(TaskSlot::Slot0, &task, &opts(), &mut child.watch)
                .map_err(|e| e.to_string())?;
            check!(done.outcome == Ok(()), "round {round}: {:?}", done.outcome);
            check!(
                result_at(&results, 3) == round + 40,
                "round {round}: result {}",
                result_at(&results, 3)
            );
        }
        // And the other direction: a slow task makes the parent park until TASK_DONE wakes it.
        let blob = sum_args(&minter, 0, &[]);
        let task = TaskPublication::run(SLOW, identity(9, TaskSlot::Slot1), &config, &blob);
        let done = parent
            .run_task(TaskSlot::Slot1, &task, &opts(), &mut child.watch)
            .map_err(|e| e.to_string())?;
        check!(done.outcome == Ok(()), "slow task: {:?}", done.outcome);
        shutdown_and_reap(&mut parent, &mut child)
    }

    fn a_named_mailbox_is_shared_by_name_and_unlinked_by_its_creator() -> Outcome {
        let mb = Mailbox::create_named().map_err(|e| e.to_string())?;
        let name = mb.name().ok_or("a named mailbox has a name")?.to_owned();
        let path = std::path::Path::new("/dev/shm").join(&name[1..]);
        check!(path.exists(), "{} missing", path.display());
        let results = SharedRegion::create_named(RESULTS_BYTES).map_err(|e| e.to_string())?;
        let results_name = results.name().ok_or("named")?.to_owned();
        let me = std::process::id();
        let child_name = name.clone();
        let mut child = fork(move || {
            // Attach by name, as an unrelated process would (the inherited copies are not
            // owners, so dropping them must not unlink anything).
            let Ok(attached) = Mailbox::open_named(&child_name) else {
                return 3;
            };
            let Ok(res) = SharedRegion::open_named(&results_name) else {
                return 3;
            };
            let mut c = Child::with_parent(attached, me);
            if c.init_ready(1).is_err() {
                return 3;
            }
            match c.serve(&mut TestChild { results: &res }) {
                Ok(ServeExit::Shutdown) => 0,
                _ => 4,
            }
        })?;
        let mut parent = Parent::new(mb);
        parent
            .wait_init(&opts(), &mut child.watch)
            .map_err(|e| e.to_string())?;
        let minter = IdentityMinter::new();
        let config = EncodedConfig::default();
        for i in 0..100u64 {
            let blob = sum_args(&minter, 2, &[i, i]);
            let task = TaskPublication::run(SUM, identity(i + 1, TaskSlot::Slot0), &config, &blob);
            let done = parent
                .run_task(TaskSlot::Slot0, &task, &opts(), &mut child.watch)
                .map_err(|e| e.to_string())?;
            check!(done.outcome == Ok(()), "round {i}: {:?}", done.outcome);
            check!(
                result_at(&results, 2) == 2 * i,
                "round {i}: result {}",
                result_at(&results, 2)
            );
        }
        shutdown_and_reap(&mut parent, &mut child)?;
        check!(
            path.exists(),
            "the child's exit must not unlink the parent's mailbox"
        );
        drop(parent);
        check!(
            !path.exists(),
            "the creator's drop must unlink {}",
            path.display()
        );
        drop(results);
        Ok(())
    }

    // ---------------------------------------------------------------------------------------

    /// Names in /dev/shm that this process created (`strata-<pid>-*`).
    fn leaked_regions() -> Vec<String> {
        let prefix = format!("{NAMED_REGION_PREFIX}{}-", std::process::id());
        std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&prefix))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn main() {
        let filters: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        // Orphans of our children are re-parented to us (not to init), so the orphan scenario
        // can reap its grandchild and tell "exited" from "still running".
        // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag; no memory is passed.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };

        let scenarios: &[Scenario] = &[
            (
                "ten_thousand_round_trips_sum_scalars",
                ten_thousand_round_trips_sum_scalars,
            ),
            ("both_task_frames_in_flight", both_task_frames_in_flight),
            (
                "control_commands_succeed_and_report_child_errors",
                control_commands_succeed_and_report_child_errors,
            ),
            (
                "init_failure_is_reported_with_its_message",
                init_failure_is_reported_with_its_message,
            ),
            (
                "orderly_shutdown_exits_zero_and_is_reaped",
                orderly_shutdown_exits_zero_and_is_reaped,
            ),
            (
                "a_child_dying_mid_task_ends_the_wait_with_child_exited",
                a_child_dying_mid_task_ends_the_wait_with_child_exited,
            ),
            (
                "an_orphaned_child_exits_by_itself",
                an_orphaned_child_exits_by_itself,
            ),
            (
                "a_parked_child_is_woken_by_a_later_publication",
                a_parked_child_is_woken_by_a_later_publication,
            ),
            (
                "a_named_mailbox_is_shared_by_name_and_unlinked_by_its_creator",
                a_named_mailbox_is_shared_by_name_and_unlinked_by_its_creator,
            ),
        ];
        let selected: Vec<_> = scenarios
            .iter()
            .filter(|(name, _)| {
                filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
            })
            .collect();
        println!("\nrunning {} tests", selected.len());
        let (mut passed, mut failed) = (0usize, 0usize);
        for (name, scenario) in &selected {
            let r = catch_unwind(scenario).unwrap_or_else(|p| Err(strata_sync::panic_message(&*p)));
            match r {
                Ok(()) => {
                    println!("test {name} ... ok");
                    passed += 1;
                }
                Err(e) => {
                    println!("test {name} ... FAILED: {e}");
                    failed += 1;
                }
            }
        }
        if !selected.is_empty() {
            let leaked = leaked_regions();
            if leaked.is_empty() {
                println!("test no_named_region_left_in_dev_shm ... ok");
                passed += 1;
            } else {
                println!("test no_named_region_left_in_dev_shm ... FAILED: {leaked:?}");
                failed += 1;
            }
        }
        let verdict = if failed == 0 { "ok" } else { "FAILED" };
        println!("\ntest result: {verdict}. {passed} passed; {failed} failed; 0 ignored; 0 measured; {} filtered out\n", scenarios.len() - selected.len());
        std::process::exit(if failed == 0 { 0 } else { 1 });
    }
}

fn main() {
    #[cfg(not(loom))]
    scenarios::main();
}
