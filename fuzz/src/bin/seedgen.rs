//! Writes the seed corpus `fuzz/corpus/<target>/` from the real encoders: argument blobs
//! (`encode_args`), call configs (`encode_config`), control requests
//! (`ControlCommand::to_request`) and mailbox frames captured from a real parent and a
//! real child exchanging tasks, startup reports and control commands.
//!
//! `cargo xtask fuzz --seeds` runs it; its output is committed. Seeds are named by
//! content, so re-running it only adds files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use strata_dist::{ControlCommand, CopyDirection, COPY_PAYLOAD_BYTES};
use strata_fuzz::fixture::{frame_ptr, ChipFixture};
use strata_fuzz::image;
use strata_fuzz::targets::{parent_identity, PARENT_CALLABLE};
use strata_mailbox::{
    encode_args_blob, AssumeAlive, Child, ControlReply, ControlRequest, EncodedConfig,
    FailureReport, Handler, Mailbox, MailboxState, Parent, PrepareDisposition, ServeExit,
    TaskPublication, TaskRequest, TaskSlot, WaitOptions,
};
use strata_types::wire::{encode_config, CALL_CONFIG_WIRE_BYTES};
use strata_types::{
    ArgTag, BufferDesc, BufferIdentity, BufferLocation, CallConfig, DataType, IdentityMinter,
    OwnerNonce, RingOverride, TaskArgs, TensorArg, TensorView,
};

/// The one place seeds build a buffer descriptor (the runtime's own constructor may
/// change; only this function follows it).
fn desc(identity: BufferIdentity, nbytes: u64, location: BufferLocation) -> BufferDesc {
    // SAFETY: seeds are bytes written to the corpus; no task ever runs on these
    // descriptors in this process.
    unsafe { BufferDesc::from_parts(identity, nbytes, location) }
}

fn tensor(
    minter: &IdentityMinter,
    location: BufferLocation,
    nbytes: u64,
    view: TensorView,
    tag: ArgTag,
) -> TensorArg {
    TensorArg::new(desc(minter.mint(), nbytes, location), view, tag).expect("seed tensor")
}

fn arg_lists(fx: &ChipFixture) -> Vec<(&'static str, TaskArgs)> {
    // A fixed owner: seeds are the same on every run.
    let m = IdentityMinter::with_owner(OwnerNonce(0x5eed_5eed));
    let mut out = Vec::new();
    out.push(("empty", TaskArgs::new()));
    let mut scalars = TaskArgs::new();
    scalars
        .push_scalar(1u64)
        .and_then(|a| a.push_scalar(2.5f32))
        .and_then(|a| a.push_scalar(-7i32))
        .expect("scalars");
    out.push(("scalars", scalars));

    let shared = |region, offset| BufferLocation::HostShared { region, offset };
    let device = |addr| BufferLocation::Device { worker: 0, addr };
    let f32x = |n| TensorView::contiguous(DataType::F32, &[n]).expect("view");

    let mut host = TaskArgs::new();
    host.push_tensor(tensor(&m, shared(1, 0), 4096, f32x(1024), ArgTag::Input))
        .and_then(|a| a.push_tensor(tensor(&m, shared(2, 256), 4096, f32x(64), ArgTag::InOut)))
        .and_then(|a| a.push_scalar(4u64))
        .expect("host args");
    out.push(("shared", host));

    let mut dev = TaskArgs::new();
    let grid = TensorView::contiguous(DataType::BF16, &[8, 16, 4]).expect("view");
    let window = grid.window(&[1, 2, 0], &[3, 4, 4]).expect("window");
    dev.push_tensor(tensor(
        &m,
        device(fx.addrs[2]),
        1 << 16,
        window,
        ArgTag::OutputExisting,
    ))
    .and_then(|a| {
        a.push_tensor(tensor(
            &m,
            device(fx.addrs[1]),
            64,
            TensorView::contiguous(DataType::U8, &[64]).expect("view"),
            ArgTag::Output,
        ))
    })
    .and_then(|a| {
        a.push_tensor(tensor(
            &m,
            device(fx.addrs[0]),
            4096,
            TensorView::contiguous(DataType::I64, &[4, 8, 2, 2, 2]).expect("view"),
            ArgTag::NoDep,
        ))
    })
    .expect("device args");
    out.push(("device", dev));

    let mut mixed = TaskArgs::new();
    mixed
        .push_tensor(tensor(
            &m,
            BufferLocation::HostLocal { addr: 0x7000_0000 },
            64,
            TensorView::contiguous(DataType::F16, &[32]).expect("view"),
            ArgTag::Input,
        ))
        .and_then(|a| {
            a.push_tensor(tensor(
                &m,
                BufferLocation::Device {
                    worker: 3,
                    addr: fx.addrs[0],
                },
                4096,
                f32x(16),
                ArgTag::Input,
            ))
        })
        .and_then(|a| {
            a.push_tensor(tensor(
                &m,
                shared(3, 0),
                1,
                TensorView::contiguous(DataType::Bool, &[1]).expect("view"),
                ArgTag::Input,
            ))
        })
        .expect("mixed args");
    out.push(("mixed", mixed));

    let mut many = TaskArgs::new();
    for i in 0..32u64 {
        many.push_tensor(tensor(
            &m,
            shared(2, 128 * i),
            4096,
            f32x(32),
            ArgTag::Input,
        ))
        .expect("many");
    }
    for i in 0..16u64 {
        many.push_scalar(i).expect("many scalars");
    }
    out.push(("chip-limits", many));
    out
}

fn configs() -> Vec<(&'static str, CallConfig)> {
    let rings = CallConfig::default().with_ring(
        1,
        RingOverride::default()
            .with_task_window(64)
            .with_heap_bytes(1 << 20)
            .with_dep_pool(256),
    );
    vec![
        ("default", CallConfig::default()),
        (
            "prefix",
            CallConfig::default()
                .with_output_prefix("/tmp/strata-out/run")
                .with_swimlane(true)
                .with_timeout(Duration::from_millis(5000)),
        ),
        ("threads", rings.with_aicpu_threads(4).with_block_dim(2)),
    ]
}

fn commands(fx: &ChipFixture) -> Vec<ControlCommand> {
    let mut v = vec![
        ControlCommand::Allocate { bytes: 4096 },
        ControlCommand::Allocate { bytes: u64::MAX },
        ControlCommand::Free { addr: fx.addrs[1] },
        ControlCommand::CommittedBytes,
        ControlCommand::FreeBytes,
    ];
    for direction in [CopyDirection::ToDevice, CopyDirection::FromDevice] {
        v.push(ControlCommand::Copy {
            direction,
            addr: fx.addrs[0],
            dev_offset: 0,
            region: 1,
            offset: 0,
            len: 4096,
        });
        v.push(ControlCommand::Copy {
            direction,
            addr: fx.addrs[2],
            dev_offset: 512,
            region: 2,
            offset: 1024,
            len: 512,
        });
    }
    v
}

/// Named frame images recorded by the child's handler.
type Recorded = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A child handler that answers as the seeds need and records what it saw.
struct Recorder {
    frames: Recorded,
    control_frame: usize,
}

impl Handler for Recorder {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        match req.args.scalars().first() {
            Some(&13) => Err(FailureReport::new(
                42,
                "the task failed on purpose: ünïcode ✓",
            )),
            _ => Ok(()),
        }
    }

    fn prepare(&mut self, _req: &TaskRequest<'_>) -> Result<PrepareDisposition, FailureReport> {
        Ok(PrepareDisposition::NativePrepared)
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
        // The request as the parent wrote it: a `mailbox_child` seed.
        // SAFETY: the control frame is mapped; the parent does not write it while the
        // request is outstanding.
        let mut img = unsafe { image::capture(self.control_frame as *const u8, req.payload.len()) };
        img[4..8].fill(0); // the waiter count: timing, not content
        self.frames
            .lock()
            .expect("recorder")
            .push((format!("control-request-{}", req.command), img));
        match req.command {
            9 => Err(FailureReport::new(7, "no such command")),
            _ => Ok(ControlReply {
                result: req.arg0 ^ 0xfeed,
                payload: req.payload.iter().rev().copied().collect(),
            }),
        }
    }
}

struct Seeds {
    root: PathBuf,
    written: AtomicUsize,
}

impl Seeds {
    fn put(&self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.root.join(target);
        std::fs::create_dir_all(&dir).expect("corpus dir");
        std::fs::write(dir.join(name), bytes).expect("seed");
        self.written.fetch_add(1, Ordering::Relaxed);
    }
}

fn with_selector(sel: u8, img: &[u8]) -> Vec<u8> {
    let mut v = vec![sel];
    v.extend_from_slice(img);
    v
}

fn set_state(img: &mut [u8], state: MailboxState) {
    img[image::STATE..image::STATE + 4].copy_from_slice(&state.as_raw().to_le_bytes());
}

fn mailbox_seeds(seeds: &Seeds, blobs: &[(&'static str, Vec<u8>)]) {
    let wait = WaitOptions::default().with_timeout(std::time::Duration::from_secs(10));
    let mb = Mailbox::create().expect("mailbox");
    let frames = Arc::new(Mutex::new(Vec::new()));
    let child_side = mb.try_clone().expect("mailbox clone");
    let control_frame = frame_ptr(&child_side, 0) as usize;
    let recorder = Recorder {
        frames: frames.clone(),
        control_frame,
    };
    let child = std::thread::spawn(move || {
        let mut child = Child::with_parent(child_side, std::process::id());
        child.init_ready(2).expect("init_ready");
        let mut recorder = recorder;
        let exit = child.serve(&mut recorder);
        (exit, child.into_mailbox())
    });
    let mut parent = Parent::new(mb);
    parent.wait_init(&wait, &mut AssumeAlive).expect("init");
    let mut init = unsafe_capture(&parent, 0, 0);
    set_state(&mut init, MailboxState::InitReady);
    seeds.put("mailbox_parent", "init-ready", &with_selector(1, &init));

    for (ci, (cname, config)) in configs().into_iter().enumerate() {
        let config = EncodedConfig::new(&config).expect("config");
        for (name, blob) in blobs {
            for slot in TaskSlot::ALL {
                let sel = if slot == TaskSlot::Slot0 { 0 } else { 0x10 };
                let identity = parent_identity(slot);
                let task = TaskPublication::run(PARENT_CALLABLE, identity, &config, blob);
                // What the child reads: a `mailbox_child` seed (selector = frame index).
                let published = quiet_publication(slot, &task);
                parent.publish(slot, &task).expect("publish");
                let done = parent
                    .wait_task(slot, &wait, &mut AssumeAlive)
                    .expect("done");
                // What the parent reads back: a `mailbox_parent` seed.
                let reply = unsafe_capture(&parent, 1 + slot.index(), 0);
                parent.reset(slot).expect("reset");
                if ci == 0 || slot == TaskSlot::Slot0 {
                    let tag = format!("{cname}-{name}-slot{}", slot.index());
                    seeds.put(
                        "mailbox_child",
                        &format!("task-{tag}"),
                        &with_selector(1 + slot.index() as u8, &published),
                    );
                    let kind = if done.outcome.is_ok() {
                        "done"
                    } else {
                        "failed"
                    };
                    seeds.put(
                        "mailbox_parent",
                        &format!("task-{kind}-{tag}"),
                        &with_selector(sel, &reply),
                    );
                }
            }
        }
    }
    // A failing task (the recorder fails scalar 13) and a prepared one.
    let config = EncodedConfig::default();
    let mut thirteen = TaskArgs::new();
    thirteen.push_scalar(13u64).expect("scalar");
    let blob = encode_args_blob(&thirteen).expect("thirteen encodes");
    let identity = parent_identity(TaskSlot::Slot0);
    let task = TaskPublication::run(PARENT_CALLABLE, identity, &config, &blob);
    parent.publish(TaskSlot::Slot0, &task).expect("publish");
    parent
        .wait_task(TaskSlot::Slot0, &wait, &mut AssumeAlive)
        .expect("failed task");
    let failed = unsafe_capture(&parent, 1, 0);
    seeds.put(
        "mailbox_parent",
        "task-failed-message",
        &with_selector(0, &failed),
    );
    parent.reset(TaskSlot::Slot0).expect("reset");

    let prep = TaskPublication::prepare(PARENT_CALLABLE, identity, &config, &blob);
    let prepared = quiet_publication(TaskSlot::Slot0, &prep);
    parent
        .publish(TaskSlot::Slot0, &prep)
        .expect("publish prepare");
    seeds.put(
        "mailbox_child",
        "prepare-ready",
        &with_selector(1, &prepared),
    );
    let t0 = std::time::Instant::now();
    while parent.poll(TaskSlot::Slot0).expect("poll").state != MailboxState::FrameStaged {
        assert!(
            t0.elapsed().as_secs() < 10,
            "the child never staged the frame"
        );
        std::thread::yield_now();
    }
    let staged = unsafe_capture(&parent, 1, 0);
    seeds.put(
        "mailbox_parent",
        "frame-staged",
        &with_selector(0x20 | 0x40, &staged),
    );
    parent.activate(TaskSlot::Slot0).expect("activate");
    let mut activated = staged.clone();
    set_state(&mut activated, MailboxState::Activate);
    seeds.put("mailbox_child", "activate", &with_selector(1, &activated));
    parent
        .wait_task(TaskSlot::Slot0, &wait, &mut AssumeAlive)
        .expect("activated task");
    parent.reset(TaskSlot::Slot0).expect("reset");

    // Control commands: the reply the parent reads (`mailbox_parent`, selector 2) and,
    // recorded by the child's handler, the request the child reads (`mailbox_child`).
    let fx_payload: Vec<u8> = (0u8..48).collect();
    for (command, arg0, payload) in [
        (5u64, 0u64, &[][..]),
        (1, 4096, &fx_payload[..]),
        (9, 1, &[][..]),
    ] {
        let req = ControlRequest {
            command,
            arg0,
            payload,
        };
        let outcome = parent.control(&req, &wait, &mut AssumeAlive);
        let len = outcome.as_ref().map_or(0, |r| r.payload.len());
        let mut reply = unsafe_capture(&parent, 0, len);
        set_state(&mut reply, MailboxState::ControlDone);
        seeds.put(
            "mailbox_parent",
            &format!("control-reply-{command}"),
            &with_selector(2, &reply),
        );
    }
    for (name, img) in frames.lock().expect("recorder").iter() {
        seeds.put("mailbox_child", name, &with_selector(0, img));
    }
    parent.request_shutdown();
    let shutdown = unsafe_capture(&parent, 0, 0);
    let (exit, _) = child.join().expect("child thread");
    assert_eq!(exit.expect("serve"), ServeExit::Shutdown);
    seeds.put("mailbox_child", "shutdown", &with_selector(0, &shutdown));

    // A startup failure, from a second child.
    let mb = Mailbox::create().expect("mailbox");
    let mut child = Child::with_parent(mb.try_clone().expect("clone"), std::process::id());
    child
        .init_failed(&FailureReport::new(
            3,
            "the chip could not start: no device memory",
        ))
        .expect("init_failed");
    let parent = Parent::new(mb);
    let failed = unsafe_capture(&parent, 0, 0);
    seeds.put("mailbox_parent", "init-failed", &with_selector(1, &failed));
}

/// The frame a parent publishes `task` into, captured from a mailbox no child serves
/// (so no child can have moved on already).
fn quiet_publication(slot: TaskSlot, task: &TaskPublication<'_>) -> Vec<u8> {
    let mut quiet = Parent::new(Mailbox::create().expect("mailbox"));
    quiet.publish(slot, task).expect("quiet publish");
    unsafe_capture(&quiet, 1 + slot.index(), task.args.len())
}

fn unsafe_capture(parent: &Parent, frame: usize, payload: usize) -> Vec<u8> {
    // SAFETY: the frame is mapped; the child does not write it while the parent owns it
    // (callers capture only between hand-offs).
    let mut img = unsafe { image::capture(frame_ptr(parent.mailbox(), frame), payload) };
    // The waiter count depends on whether the peer happened to park: zero it, so seeds
    // are the same on every run.
    img[4..8].fill(0);
    img
}

fn main() {
    let root = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"));
    let seeds = Seeds {
        root,
        written: AtomicUsize::new(0),
    };
    let fx = ChipFixture::new();

    let lists = arg_lists(&fx);
    let blobs: Vec<(&'static str, Vec<u8>)> = lists
        .iter()
        .map(|(n, a)| (*n, encode_args_blob(a).expect("a seed encodes")))
        .collect();
    for (name, blob) in &blobs {
        seeds.put("args_blob", name, blob);
        seeds.put("task_args", name, blob);
        seeds.put("sub_task", name, blob);
    }
    for (name, config) in configs() {
        let mut bytes = [0u8; CALL_CONFIG_WIRE_BYTES];
        encode_config(&config, &mut bytes).expect("a seed config is valid");
        seeds.put("call_config", name, &bytes);
    }
    for (i, command) in commands(&fx).into_iter().enumerate() {
        let mut buf = [0u8; COPY_PAYLOAD_BYTES];
        let req = command.to_request(&mut buf);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&req.command.to_le_bytes());
        bytes.extend_from_slice(&req.arg0.to_le_bytes());
        bytes.extend_from_slice(req.payload);
        let name = command.name().replace(' ', "-");
        seeds.put("control_request", &format!("{i}-{name}"), &bytes);
    }
    mailbox_seeds(&seeds, &blobs);
    net_seeds(&seeds, &blobs);
    println!(
        "seedgen: wrote {} seeds under {}",
        seeds.written.load(Ordering::Relaxed),
        seeds.root.display()
    );
}

/// Network frames from strata-net's real encoder: every frame type, a TASK carrying each
/// argument blob, DATA chunks.
fn net_seeds(seeds: &Seeds, blobs: &[(&'static str, Vec<u8>)]) {
    use strata_net::wire::*;
    let put = |name: &str, f: Vec<u8>| seeds.put("net_frame", name, &f);
    put(
        "hello",
        encode(FrameType::Hello, 9, 1, &Hello { nonce: [1; 32] }).unwrap(),
    );
    put(
        "challenge",
        encode(
            FrameType::Challenge,
            9,
            1,
            &Challenge {
                nonce: [2; 32],
                proof: [3; 32],
            },
        )
        .unwrap(),
    );
    put(
        "auth-open",
        encode(
            FrameType::Auth,
            9,
            2,
            &Auth {
                proof: [4; 32],
                intro: Intro::Open {
                    worker_id: 1,
                    build_id: vec![5; 20],
                    args: vec!["--case".into(), "x".into()],
                },
            },
        )
        .unwrap(),
    );
    put(
        "auth-join",
        encode(
            FrameType::Auth,
            9,
            2,
            &Auth {
                proof: [4; 32],
                intro: Intro::Join { worker_id: 2 },
            },
        )
        .unwrap(),
    );
    put(
        "error",
        encode(
            FrameType::Error,
            9,
            3,
            &ErrorBody {
                code: ErrorCode::Program,
                message: "no program with build-id".into(),
            },
        )
        .unwrap(),
    );
    put(
        "node-hello",
        encode(
            FrameType::NodeHello,
            9,
            3,
            &NodeHello {
                worker_id: 0,
                build_id: vec![6; 20],
                registry_digest: [7; 32],
                chips: 2,
                sub_workers: 1,
                pid: 42,
                host: "vm".into(),
            },
        )
        .unwrap(),
    );
    put(
        "ready",
        encode(
            FrameType::Ready,
            9,
            4,
            &Ready {
                staging_bytes: 64 << 20,
            },
        )
        .unwrap(),
    );
    for (name, blob) in blobs {
        let t = Task {
            callable: [8; 32],
            config: vec![1, 0, 0, 7],
            args: blob.clone(),
            segments: vec![Segment {
                region: 3,
                start: 0,
                len: 4096,
                send: true,
                recv: true,
            }],
        };
        put(
            &format!("task-{name}"),
            encode(FrameType::Task, 9, 5, &t).unwrap(),
        );
    }
    let mut data = Vec::new();
    encode_data(
        &mut data,
        9,
        5,
        DataHead {
            owner: 5,
            segment: 0,
            offset: 4096,
        },
        300,
        |d| d.fill(0x5a),
    );
    put("data", data);
    put(
        "done-ok",
        encode(FrameType::Done, 9, 5, &Done::new(None)).unwrap(),
    );
    put(
        "done-failed",
        encode(
            FrameType::Done,
            9,
            5,
            &Done::new(Some((-1, "orchestration failed".into()))),
        )
        .unwrap(),
    );
    let mut stalled = Done::new(Some((-1, "kernel timeout".into())));
    stalled.wait_for = strata_types::WaitFor {
        place: "chip".into(),
        stalled: "kernel past its timeout".into(),
        running: vec![strata_types::RunningTask {
            task: 1,
            name: "stuck".into(),
            on: strata_types::Executor::Core(0),
            for_ms: Some(300),
        }],
        ..strata_types::WaitFor::default()
    }
    .encode();
    put(
        "done-stalled",
        encode(FrameType::Done, 9, 5, &stalled).unwrap(),
    );
    put(
        "control",
        encode(
            FrameType::Control,
            9,
            6,
            &Control::CopyTo {
                id: 1,
                offset: 0,
                len: 4096,
            },
        )
        .unwrap(),
    );
    put(
        "control-reply",
        encode(
            FrameType::ControlReply,
            9,
            6,
            &ControlAnswer { result: Ok(7) },
        )
        .unwrap(),
    );
    put(
        "heartbeat",
        encode(FrameType::Heartbeat, 9, 0, &()).unwrap(),
    );
    put(
        "cancel",
        encode(FrameType::Cancel, 9, 7, &Cancel { task: 5 }).unwrap(),
    );
    put("shutdown", encode(FrameType::Shutdown, 9, 8, &()).unwrap());
    put(
        "shutdown-ack",
        encode(
            FrameType::ShutdownAck,
            9,
            0,
            &ShutdownAck {
                reaped: true,
                report: String::new(),
            },
        )
        .unwrap(),
    );
}
