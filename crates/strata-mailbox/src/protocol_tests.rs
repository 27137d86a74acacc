//! In-process tests of the parent/child protocol (threads over two mappings of one
//! mailbox). The cross-process scenarios live in `tests/fork_roundtrip.rs`.

use crate::layout::{ARGS_CAPACITY, MESSAGE_MAX_LEN};
use crate::*;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use strata_types::{CallConfig, CallableId, TaskArgs};

const OK: CallableId = CallableId([1; 32]);
const FAIL: CallableId = CallableId([2; 32]);
const PANIC: CallableId = CallableId([3; 32]);
const STALL: CallableId = CallableId([4; 32]);

/// The wait-for state the STALL callable fails with.
fn stall_state() -> strata_types::WaitFor {
    strata_types::WaitFor {
        place: "chip".into(),
        stalled: "kernel \"k\" made no progress".into(),
        running: vec![strata_types::RunningTask {
            task: 3,
            name: "k".into(),
            on: strata_types::Executor::Core(1),
            for_ms: Some(5),
        }],
        ..Default::default()
    }
}

#[derive(Default)]
struct Seen {
    block_dims: Vec<Option<u32>>,
    sums: Vec<u64>,
    phases: Vec<TaskPhase>,
    identities: Vec<FrameIdentity>,
}

struct TestHandler(Arc<Mutex<Seen>>);

impl Handler for TestHandler {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        {
            let mut s = self.0.lock().unwrap();
            s.block_dims.push(req.config.block_dim);
            s.sums.push(req.args.scalars().iter().sum());
            assert_eq!(
                req.args_blob,
                encode_args_blob(req.args).unwrap().as_slice()
            );
            s.phases.push(req.phase);
            s.identities.push(req.identity);
        }
        match req.callable {
            OK => Ok(()),
            FAIL => Err(FailureReport::new(
                5,
                format!("failed with {} scalars", req.args.scalars().len()),
            )),
            PANIC => panic!("deliberate test panic"),
            STALL => Err(FailureReport::new(6, "stalled").with_wait_for(Some(stall_state()))),
            other => Err(FailureReport::new(9, format!("unknown callable {other}"))),
        }
    }

    fn prepare(&mut self, req: &TaskRequest<'_>) -> Result<PrepareDisposition, FailureReport> {
        self.0.lock().unwrap().phases.push(req.phase);
        Ok(PrepareDisposition::NativePrepared)
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
        match req.command {
            1 => Ok(ControlReply {
                result: req.arg0 + 1,
                payload: req.payload.iter().rev().copied().collect(),
            }),
            2 => Err(FailureReport::new(42, "é".repeat(300))),
            3 => panic!("control panic"),
            4 => Ok(ControlReply {
                result: 0,
                payload: vec![0; ARGS_CAPACITY + 1],
            }),
            c => Err(FailureReport::new(
                codes::UNSUPPORTED,
                format!("no command {c}"),
            )),
        }
    }
}

fn quiet_panics() {
    // Keep deliberate handler panics from cluttering the test output.
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info.to_string();
            if !msg.contains("deliberate test panic") && !msg.contains("control panic") {
                prev(info);
            }
        }));
    });
}

struct Rig {
    parent: Parent,
    seen: Arc<Mutex<Seen>>,
    child: Option<JoinHandle<Result<ServeExit, MailboxError>>>,
}

impl Rig {
    fn new() -> Rig {
        quiet_panics();
        let mb = Mailbox::create().unwrap();
        let child_mb = mb.try_clone().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s2 = seen.clone();
        let child = std::thread::spawn(move || {
            let mut c =
                Child::with_parent(child_mb, std::process::id()).with_options(ServeOptions {
                    wait: WaitOptions::new().with_spin(Duration::from_micros(5)),
                    ..ServeOptions::default()
                });
            c.init_ready(17)?;
            c.serve(&mut TestHandler(s2))
        });
        let mut parent = Parent::new(mb);
        assert_eq!(parent.wait_init(&opts(), &mut AssumeAlive).unwrap(), 17);
        Rig {
            parent,
            seen,
            child: Some(child),
        }
    }

    fn finish(mut self) -> Result<ServeExit, MailboxError> {
        self.parent.request_shutdown();
        self.child.take().unwrap().join().unwrap()
    }
}

fn opts() -> WaitOptions {
    WaitOptions::new()
        .with_spin(Duration::from_micros(5))
        .with_timeout(Duration::from_secs(30))
}

fn ident(dispatch: u64) -> FrameIdentity {
    FrameIdentity {
        run_id: 3,
        lease_slot: 0,
        lease_generation: 2,
        dispatch_id: dispatch,
    }
}

fn scalars(vals: &[u64]) -> Vec<u8> {
    let mut a = TaskArgs::new();
    for &v in vals {
        a.push_scalar(v).unwrap();
    }
    encode_args_blob(&a).unwrap()
}

#[test]
fn tasks_succeed_fail_and_panic_with_exact_outcomes() {
    let mut rig = Rig::new();
    let cfg = EncodedConfig::default();
    let blob = scalars(&[1, 2, 3]);
    for (slot, callable, expect) in [
        (TaskSlot::Slot0, OK, Ok(())),
        (
            TaskSlot::Slot1,
            FAIL,
            Err(FailureReport::new(5, "failed with 3 scalars")),
        ),
        (
            TaskSlot::Slot0,
            PANIC,
            Err(FailureReport::new(
                codes::HANDLER_PANICKED,
                "handler panicked: deliberate test panic",
            )),
        ),
        (TaskSlot::Slot1, OK, Ok(())),
    ] {
        let t = TaskPublication::run(callable, ident(7), &cfg, &blob);
        let done = rig
            .parent
            .run_task(slot, &t, &opts(), &mut AssumeAlive)
            .unwrap();
        assert_eq!(done.outcome, expect);
        assert_eq!(done.state, MailboxState::TaskDone);
        assert_eq!(done.slot, slot);
        assert!(done.accepted, "the handler ran, so the launch was accepted");
        assert_eq!(done.identity, ident(7));
        assert_eq!(rig.parent.poll(slot).unwrap().state, MailboxState::Idle);
    }
    assert_eq!(rig.seen.lock().unwrap().identities, vec![ident(7); 4]);
    assert_eq!(rig.finish().unwrap(), ServeExit::Shutdown);
}

#[test]
fn a_failure_carries_its_wait_for_state_and_only_that_failure_does() {
    let mut rig = Rig::new();
    let cfg = EncodedConfig::default();
    let blob = scalars(&[1]);
    for (callable, expect) in [
        (
            STALL,
            FailureReport::new(6, "stalled").with_wait_for(Some(stall_state())),
        ),
        (FAIL, FailureReport::new(5, "failed with 1 scalars")),
    ] {
        let t = TaskPublication::run(callable, ident(3), &cfg, &blob);
        let done = rig
            .parent
            .run_task(TaskSlot::Slot0, &t, &opts(), &mut AssumeAlive)
            .unwrap();
        assert_eq!(done.outcome, Err(expect));
    }
    assert_eq!(rig.finish().unwrap(), ServeExit::Shutdown);
}

#[test]
fn malformed_frames_are_answered_with_bad_request() {
    let mut rig = Rig::new();
    let cfg = EncodedConfig::default();
    // An argument blob whose header announces more than it holds.
    let mut blob = scalars(&[1]);
    blob[4] = 9;
    let t = TaskPublication::run(OK, ident(1), &cfg, &blob);
    let done = rig
        .parent
        .run_task(TaskSlot::Slot0, &t, &opts(), &mut AssumeAlive)
        .unwrap();
    let f = done.outcome.unwrap_err();
    assert_eq!(f.code, codes::BAD_REQUEST);
    assert!(
        f.message
            .starts_with("task frame 0 argument blob: malformed wire data"),
        "{}",
        f.message
    );
    assert!(!done.accepted, "the handler never ran");
    // A frame written by a peer that speaks another protocol version, by hand.
    let f = rig.parent.mailbox().task(TaskSlot::Slot1);
    f.write_identity(&ident(2));
    f.protocol.store(99, Ordering::Relaxed);
    f.write_digest(&[1; 32]);
    let empty = scalars(&[]);
    f.args_len.store(empty.len() as u32, Ordering::Relaxed);
    f.write_args(&empty);
    f.word().publish(MailboxState::TaskReady.as_raw());
    while rig
        .parent
        .mailbox()
        .state(FrameId::Task(TaskSlot::Slot1))
        .unwrap()
        != MailboxState::TaskDone
    {
        std::thread::yield_now();
    }
    assert_eq!(f.error_code.load(Ordering::Relaxed), codes::BAD_REQUEST);
    assert_eq!(
        f.read_message(),
        "task frame 1 carries protocol version 99; this child speaks 1"
    );
    f.word().store_silent(MailboxState::Idle.as_raw());
    assert!(
        rig.seen.lock().unwrap().block_dims.is_empty(),
        "the handler never ran"
    );
    assert_eq!(rig.finish().unwrap(), ServeExit::Shutdown);
}

#[test]
fn publication_is_validated_and_refused_on_busy_frames() {
    let mut rig = Rig::new();
    let cfg = EncodedConfig::default();
    let blob = scalars(&[]);
    let mut t = TaskPublication::run(OK, ident(0), &cfg, &blob);
    assert!(matches!(
        rig.parent.publish(TaskSlot::Slot0, &t),
        Err(MailboxError::InvalidIdentity { .. })
    ));
    t.identity = ident(1);
    t.callable = CallableId::NONE;
    assert!(matches!(
        rig.parent.publish(TaskSlot::Slot0, &t),
        Err(MailboxError::MissingCallable)
    ));
    t.callable = OK;
    let big = vec![0u8; ARGS_CAPACITY + 1];
    let t_big = TaskPublication { args: &big, ..t };
    assert!(matches!(
        rig.parent.publish(TaskSlot::Slot0, &t_big),
        Err(MailboxError::ArgsTooLarge { len, capacity: ARGS_CAPACITY }) if len == ARGS_CAPACITY + 1
    ));
    assert!(matches!(
        rig.parent
            .wait_task(TaskSlot::Slot0, &opts(), &mut AssumeAlive),
        Err(MailboxError::NoTaskPublished {
            state: MailboxState::Idle,
            ..
        })
    ));
    rig.parent.publish(TaskSlot::Slot0, &t).unwrap();
    rig.parent
        .wait_task(TaskSlot::Slot0, &opts(), &mut AssumeAlive)
        .unwrap();
    // Terminal but not reset: a second publication is refused and writes nothing.
    assert!(matches!(
        rig.parent.publish(TaskSlot::Slot0, &t),
        Err(MailboxError::FrameBusy {
            state: MailboxState::TaskDone,
            ..
        })
    ));
    rig.parent.reset(TaskSlot::Slot0).unwrap();
    rig.parent.reset(TaskSlot::Slot0).unwrap(); // idempotent on IDLE
    assert_eq!(rig.finish().unwrap(), ServeExit::Shutdown);
}

#[test]
fn stale_identities_and_garbage_states_are_typed_errors() {
    let mut rig = Rig::new();
    let cfg = EncodedConfig::default();
    let blob = scalars(&[]);
    let t = TaskPublication::run(OK, ident(5), &cfg, &blob);
    rig.parent.publish(TaskSlot::Slot0, &t).unwrap();
    rig.parent
        .wait_task(TaskSlot::Slot0, &opts(), &mut AssumeAlive)
        .unwrap();
    let f = rig.parent.mailbox().task(TaskSlot::Slot0);
    f.dispatch_id.store(6, Ordering::Relaxed);
    match rig.parent.poll(TaskSlot::Slot0) {
        Err(MailboxError::StaleFrameIdentity {
            expected,
            found,
            found_protocol,
            ..
        }) => {
            assert_eq!(expected, ident(5));
            assert_eq!(found, ident(6));
            assert_eq!(found_protocol, crate::layout::PROTOCOL_VERSION);
        }
        other => panic!("expected StaleFrameIdentity, got {other:?}"),
    }
    f.dispatch_id.store(5, Ordering::Relaxed);
    f.disposition.store(9, Ordering::Relaxed);
    assert!(matches!(
        rig.parent.poll(TaskSlot::Slot0),
        Err(MailboxError::CorruptField {
            field: "disposition",
            value: 9,
            ..
        })
    ));
    f.disposition.store(0, Ordering::Relaxed);
    rig.parent.reset(TaskSlot::Slot0).unwrap();
    // A state word that is valid elsewhere but not in a task frame, then garbage.
    let f1 = rig.parent.mailbox().task(TaskSlot::Slot1);
    f1.state
        .store(MailboxState::ControlDone.as_raw(), Ordering::Release);
    assert!(matches!(
        rig.parent.poll(TaskSlot::Slot1),
        Err(MailboxError::UnexpectedState {
            state: MailboxState::ControlDone,
            ..
        })
    ));
    f1.state.store(1234, Ordering::Release);
    assert!(matches!(
        rig.parent.poll(TaskSlot::Slot1),
        Err(MailboxError::UnknownState { value: 1234, .. })
    ));
    // The child notices the garbage too (whichever value it saw) and stops serving with a
    // typed error, unless it saw the shutdown first.
    rig.parent.request_shutdown();
    match rig.child.take().unwrap().join().unwrap() {
        Ok(ServeExit::Shutdown)
        | Err(MailboxError::UnknownState { value: 1234, .. })
        | Err(MailboxError::UnexpectedState {
            state: MailboxState::ControlDone,
            ..
        }) => {}
        other => panic!("unexpected child result {other:?}"),
    }
}

#[test]
fn control_commands_reply_fail_and_survive_panics() {
    let mut rig = Rig::new();
    let o = opts();
    let r = rig
        .parent
        .control(
            &ControlRequest {
                command: 1,
                arg0: 41,
                payload: b"abc",
            },
            &o,
            &mut AssumeAlive,
        )
        .unwrap();
    assert_eq!(
        r,
        ControlReply {
            result: 42,
            payload: b"cba".to_vec()
        }
    );
    match rig.parent.control(
        &ControlRequest {
            command: 2,
            arg0: 0,
            payload: &[],
        },
        &o,
        &mut AssumeAlive,
    ) {
        Err(MailboxError::ControlFailed {
            command: 2,
            code: 42,
            message,
        }) => {
            assert_eq!(
                message,
                "é".repeat(127),
                "truncated to 254 bytes on a char boundary"
            );
            assert!(message.len() <= MESSAGE_MAX_LEN);
        }
        other => panic!("expected ControlFailed, got {other:?}"),
    }
    match rig.parent.control(
        &ControlRequest {
            command: 3,
            arg0: 0,
            payload: &[],
        },
        &o,
        &mut AssumeAlive,
    ) {
        Err(MailboxError::ControlFailed { code, message, .. }) => {
            assert_eq!(code, codes::HANDLER_PANICKED);
            assert_eq!(message, "handler panicked: control panic");
        }
        other => panic!("expected ControlFailed, got {other:?}"),
    }
    match rig.parent.control(
        &ControlRequest {
            command: 4,
            arg0: 0,
            payload: &[],
        },
        &o,
        &mut AssumeAlive,
    ) {
        Err(MailboxError::ControlFailed { code, .. }) => assert_eq!(code, codes::REPLY_TOO_LARGE),
        other => panic!("expected ControlFailed, got {other:?}"),
    }
    let big = vec![1u8; ARGS_CAPACITY + 1];
    assert!(matches!(
        rig.parent.control(
            &ControlRequest {
                command: 1,
                arg0: 0,
                payload: &big
            },
            &o,
            &mut AssumeAlive
        ),
        Err(MailboxError::PayloadTooLarge { .. })
    ));
    // Still usable after all that.
    let r = rig
        .parent
        .control(
            &ControlRequest {
                command: 1,
                arg0: 1,
                payload: &[],
            },
            &o,
            &mut AssumeAlive,
        )
        .unwrap();
    assert_eq!(r.result, 2);
    assert_eq!(rig.finish().unwrap(), ServeExit::Shutdown);
}

#[test]
fn a_failed_control_wait_poisons_the_channel() {
    // No child at all: the liveness check reports the peer gone.
    let mut parent = Parent::new(Mailbox::create().unwrap());
    let mut calls = 0;
    let mut gone = || {
        calls += 1;
        Err(MailboxError::PeerGone("test peer".into()))
    };
    let req = ControlRequest {
        command: 7,
        arg0: 0,
        payload: &[],
    };
    let o = WaitOptions::new()
        .with_spin(Duration::ZERO)
        .with_park_slice(Duration::from_millis(1));
    assert!(matches!(
        parent.control(&req, &o, &mut gone),
        Err(MailboxError::PeerGone(_))
    ));
    assert!(matches!(
        parent.control(&req, &o, &mut AssumeAlive),
        Err(MailboxError::ControlPoisoned { .. })
    ));
    let o = o.with_timeout(Duration::from_millis(2));
    let mut p2 = Parent::new(Mailbox::create().unwrap());
    match p2.control(&req, &o, &mut AssumeAlive) {
        Err(MailboxError::Timeout { what, .. }) => {
            assert_eq!(what, "CONTROL_DONE for control command 7")
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn prepare_then_activate_runs_the_staged_frame() {
    let mut rig = Rig::new();
    let cfg = EncodedConfig::default();
    let blob = scalars(&[4]);
    let t = TaskPublication::prepare(OK, ident(11), &cfg, &blob);
    rig.parent.publish(TaskSlot::Slot1, &t).unwrap();
    // Not staged yet or staged: activation only succeeds from FRAME_STAGED.
    let mut snap = rig.parent.snapshot().unwrap();
    while snap.task(TaskSlot::Slot1) != MailboxState::FrameStaged {
        snap = rig
            .parent
            .wait_change(&snap, &opts(), &mut AssumeAlive)
            .unwrap();
    }
    let p = rig.parent.poll(TaskSlot::Slot1).unwrap();
    assert_eq!(p.disposition, PrepareDisposition::NativePrepared);
    assert!(!p.accepted && p.completion.is_none());
    assert!(rig.parent.activate(TaskSlot::Slot1).unwrap());
    let done = rig
        .parent
        .wait_task(TaskSlot::Slot1, &opts(), &mut AssumeAlive)
        .unwrap();
    assert_eq!(done.outcome, Ok(()));
    assert!(done.accepted);
    assert!(
        !rig.parent.activate(TaskSlot::Slot1).unwrap(),
        "terminal: the CAS must fail"
    );
    assert_eq!(
        rig.parent.poll(TaskSlot::Slot1).unwrap().state,
        MailboxState::TaskDone
    );
    rig.parent.reset(TaskSlot::Slot1).unwrap();
    assert_eq!(
        rig.seen.lock().unwrap().phases,
        vec![TaskPhase::Prepare, TaskPhase::Activated]
    );
    // A failing activated task ends TASK_FAILED.
    let t = TaskPublication::prepare(FAIL, ident(12), &cfg, &blob);
    rig.parent.publish(TaskSlot::Slot0, &t).unwrap();
    while rig.parent.poll(TaskSlot::Slot0).unwrap().state != MailboxState::FrameStaged {
        std::thread::yield_now();
    }
    assert!(rig.parent.activate(TaskSlot::Slot0).unwrap());
    let done = rig
        .parent
        .wait_task(TaskSlot::Slot0, &opts(), &mut AssumeAlive)
        .unwrap();
    assert_eq!(done.state, MailboxState::TaskFailed);
    assert_eq!(
        done.outcome,
        Err(FailureReport::new(5, "failed with 1 scalars"))
    );
    rig.parent.reset(TaskSlot::Slot0).unwrap();
    assert_eq!(rig.finish().unwrap(), ServeExit::Shutdown);
}

#[test]
fn shutdown_fails_frames_the_child_still_owns() {
    let mut rig = Rig::new();
    let cfg = EncodedConfig::default();
    let blob = scalars(&[]);
    let t = TaskPublication::prepare(OK, ident(1), &cfg, &blob);
    rig.parent.publish(TaskSlot::Slot0, &t).unwrap();
    while rig.parent.poll(TaskSlot::Slot0).unwrap().state != MailboxState::FrameStaged {
        std::thread::yield_now();
    }
    rig.parent.request_shutdown();
    assert_eq!(
        rig.child.take().unwrap().join().unwrap().unwrap(),
        ServeExit::Shutdown
    );
    let c = rig
        .parent
        .poll(TaskSlot::Slot0)
        .unwrap()
        .completion
        .unwrap();
    assert_eq!(c.state, MailboxState::TaskFailed);
    assert_eq!(
        c.outcome,
        Err(FailureReport::new(
            codes::SHUT_DOWN,
            "the child shut down before the task ran"
        ))
    );
    assert!(matches!(
        rig.parent.publish(TaskSlot::Slot1, &t),
        Err(MailboxError::ShutdownRequested)
    ));
    assert!(rig.parent.mailbox().shutdown_requested());
}

#[test]
fn configs_are_written_and_decoded_only_when_they_change() {
    let mut rig = Rig::new();
    let a = EncodedConfig::new(&CallConfig::default().with_block_dim(3)).unwrap();
    let b = EncodedConfig::new(&CallConfig::default().with_block_dim(8)).unwrap();
    let blob = scalars(&[]);
    let epoch = |p: &Parent| {
        p.mailbox()
            .task(TaskSlot::Slot0)
            .config_epoch
            .load(Ordering::Relaxed)
    };
    let mut epochs = vec![];
    for cfg in [&a, &a, &a.clone(), &b, &a] {
        let t = TaskPublication::run(OK, ident(1), cfg, &blob);
        rig.parent
            .run_task(TaskSlot::Slot0, &t, &opts(), &mut AssumeAlive)
            .unwrap();
        epochs.push(epoch(&rig.parent));
    }
    assert_eq!(epochs, vec![1, 1, 1, 2, 3]);
    assert_eq!(
        rig.seen.lock().unwrap().block_dims,
        [3, 3, 3, 8, 3].map(Some)
    );
    assert_eq!(rig.finish().unwrap(), ServeExit::Shutdown);
}

#[test]
fn repeated_and_changed_argument_blobs_decode_correctly() {
    let mut rig = Rig::new();
    let cfg = EncodedConfig::default();
    let blobs = [
        scalars(&[1]),
        scalars(&[1]),
        scalars(&[2, 3]),
        scalars(&[]),
        scalars(&[1]),
    ];
    for (n, blob) in blobs.iter().enumerate() {
        for slot in TaskSlot::ALL {
            let t = TaskPublication::run(OK, ident(n as u64 + 1), &cfg, blob);
            rig.parent
                .run_task(slot, &t, &opts(), &mut AssumeAlive)
                .unwrap();
        }
    }
    assert_eq!(
        rig.seen.lock().unwrap().sums,
        vec![1, 1, 1, 1, 5, 5, 0, 0, 1, 1]
    );
    assert_eq!(rig.finish().unwrap(), ServeExit::Shutdown);
}

#[test]
fn init_failures_and_late_inits_are_reported() {
    let mb = Mailbox::create().unwrap();
    let mut child = Child::with_parent(mb.try_clone().unwrap(), std::process::id());
    let mut parent = Parent::new(mb);
    child
        .init_failed(&FailureReport::new(3, "no device 7"))
        .unwrap();
    match parent.wait_init(&opts(), &mut AssumeAlive) {
        Err(MailboxError::InitFailed { code: 3, message }) => assert_eq!(message, "no device 7"),
        other => panic!("expected InitFailed, got {other:?}"),
    }
    let mb = Mailbox::create().unwrap();
    let mut child = Child::with_parent(mb.try_clone().unwrap(), std::process::id());
    let mut parent = Parent::new(mb);
    parent.request_shutdown();
    assert!(matches!(
        child.init_ready(1),
        Err(MailboxError::ShutdownRequested)
    ));
    assert!(child.shutdown_requested());
    assert_eq!(
        child.serve(&mut TestHandler(Default::default())).unwrap(),
        ServeExit::Shutdown
    );
}

#[test]
fn a_child_whose_parent_pid_is_wrong_reports_parent_died() {
    let mb = Mailbox::create().unwrap();
    // pid 1 is never this process's parent in a test run (the test binary is spawned by
    // cargo), so the watch sees a different parent at once.
    let mut child = Child::with_parent(mb, u32::MAX);
    assert!(!child.parent_alive());
    assert_eq!(
        child.serve(&mut TestHandler(Default::default())).unwrap(),
        ServeExit::ParentDied
    );
}

#[test]
fn the_publish_hook_runs_after_every_publication_the_parent_acts_on() {
    use std::sync::atomic::AtomicU32;
    let rung = Arc::new(AtomicU32::new(0));
    let r = rung.clone();
    let hook = PublishHook::new(move || {
        r.fetch_add(1, Ordering::Release);
    });
    let mb = Mailbox::create().unwrap();
    let child_mb = mb.try_clone().unwrap();
    let child = std::thread::spawn(move || {
        let mut c = Child::with_parent(child_mb, std::process::id()).with_options(ServeOptions {
            wait: WaitOptions::new().with_spin(Duration::from_micros(5)),
            on_publish: Some(hook),
            ..ServeOptions::default()
        });
        c.init_ready(0)?;
        c.serve(&mut TestHandler(Default::default()))
    });
    // Waits until the hook has run `n` times in total; the state it announced must be
    // visible by then (the hook runs after the releasing store).
    let wait_rung = |n: u32| {
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while rung.load(Ordering::Acquire) < n {
            assert!(std::time::Instant::now() < end, "hook never ran {n} times");
            std::thread::yield_now();
        }
    };
    let mut parent = Parent::new(mb);
    wait_rung(1); // INIT_READY
    assert_eq!(parent.snapshot().unwrap().control, MailboxState::InitReady);
    parent.wait_init(&opts(), &mut AssumeAlive).unwrap();
    let config = EncodedConfig::default();
    let blob = scalars(&[1]);
    let mut expected = 1;
    for (i, callable) in [OK, FAIL].into_iter().enumerate() {
        let task = TaskPublication::run(callable, ident(i as u64 + 1), &config, &blob);
        parent.publish(TaskSlot::Slot1, &task).unwrap();
        expected += 1;
        wait_rung(expected);
        let poll = parent.poll(TaskSlot::Slot1).unwrap();
        assert_eq!(poll.state, MailboxState::TaskDone);
        assert_eq!(poll.completion.unwrap().outcome.is_ok(), callable == OK);
        parent.reset(TaskSlot::Slot1).unwrap();
    }
    // PREPARE_READY → FRAME_STAGED rings; ACTIVATE → TASK_LAUNCHED does not, the
    // completion does.
    let task = TaskPublication::prepare(OK, ident(9), &config, &blob);
    parent.publish(TaskSlot::Slot0, &task).unwrap();
    expected += 1;
    wait_rung(expected);
    assert_eq!(
        parent.poll(TaskSlot::Slot0).unwrap().state,
        MailboxState::FrameStaged
    );
    assert!(parent.activate(TaskSlot::Slot0).unwrap());
    expected += 1;
    wait_rung(expected);
    assert_eq!(
        parent.poll(TaskSlot::Slot0).unwrap().state,
        MailboxState::TaskDone
    );
    parent.reset(TaskSlot::Slot0).unwrap();
    // A control command rings once, after CONTROL_DONE.
    let reply = parent
        .control(
            &ControlRequest {
                command: 1,
                arg0: 4,
                payload: &[],
            },
            &opts(),
            &mut AssumeAlive,
        )
        .unwrap();
    assert_eq!(reply.result, 5);
    expected += 1;
    wait_rung(expected);
    // Shutdown with a task the child still owns (a staged frame): TASK_FAILED rings.
    let task = TaskPublication::prepare(OK, ident(10), &config, &blob);
    parent.publish(TaskSlot::Slot1, &task).unwrap();
    expected += 1;
    wait_rung(expected);
    parent.request_shutdown();
    assert_eq!(child.join().unwrap().unwrap(), ServeExit::Shutdown);
    assert_eq!(rung.load(Ordering::Acquire), expected + 1);
    assert_eq!(
        parent.poll(TaskSlot::Slot1).unwrap().state,
        MailboxState::TaskFailed
    );
}

/// Two ready frames run in the order the parent published them, whatever their slots: the
/// parent publishes dispatch 2 into slot 1 and then dispatch 3 into slot 0 while the child
/// is held (in its publication hook, right after completing dispatch 1), so its next
/// snapshot finds both ready. Before, the child ran slot 0 first (dispatch 3 overtook 2).
#[test]
fn two_ready_frames_run_in_publication_order_whatever_their_slots() {
    use std::sync::atomic::AtomicBool;
    quiet_panics();
    let mb = Mailbox::create().unwrap();
    let child_mb = mb.try_clone().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s2 = seen.clone();
    let hold = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(AtomicBool::new(false));
    let (h, g) = (hold.clone(), gate.clone());
    let hook = PublishHook::new(move || {
        if h.swap(false, Ordering::SeqCst) {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !g.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
        }
    });
    let child = std::thread::spawn(move || {
        let mut c = Child::with_parent(child_mb, std::process::id()).with_options(ServeOptions {
            wait: WaitOptions::new().with_spin(Duration::from_micros(5)),
            on_publish: Some(hook),
            ..ServeOptions::default()
        });
        c.init_ready(0)?;
        c.serve(&mut TestHandler(s2))
    });
    let mut parent = Parent::new(mb);
    parent.wait_init(&opts(), &mut AssumeAlive).unwrap();
    let cfg = EncodedConfig::default();
    let (b1, b2, b3) = (scalars(&[1]), scalars(&[2]), scalars(&[3]));
    hold.store(true, Ordering::SeqCst);
    let t1 = TaskPublication::run(OK, ident(1), &cfg, &b1);
    parent
        .run_task(TaskSlot::Slot0, &t1, &opts(), &mut AssumeAlive)
        .unwrap();
    // The child is held right after completing dispatch 1.
    let t2 = TaskPublication::run(OK, ident(2), &cfg, &b2);
    parent.publish(TaskSlot::Slot1, &t2).unwrap();
    let t3 = TaskPublication::run(OK, ident(3), &cfg, &b3);
    parent.publish(TaskSlot::Slot0, &t3).unwrap();
    gate.store(true, Ordering::SeqCst);
    for slot in [TaskSlot::Slot1, TaskSlot::Slot0] {
        parent.wait_task(slot, &opts(), &mut AssumeAlive).unwrap();
        parent.reset(slot).unwrap();
    }
    assert_eq!(
        seen.lock().unwrap().sums,
        vec![1, 2, 3],
        "dispatches started out of publication order"
    );
    parent.request_shutdown();
    assert_eq!(child.join().unwrap().unwrap(), ServeExit::Shutdown);
}
