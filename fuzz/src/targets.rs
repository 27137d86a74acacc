//! The fuzz targets: each takes arbitrary bytes, hands them to the decoder exactly as the
//! runtime would hand it bytes another process wrote, and checks what must hold for any
//! input (no panic; whatever decodes re-encodes to the same value).

use crate::alloc_guard::armed;
use crate::fixture::{
    frame_ptr, with_chip, with_mailbox, with_sub, PARENT_IDENTITY, SUB_CALLABLE_NAME,
};
use crate::image;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use strata_chip::RunArgs;
use strata_dist::{ControlCommand, COPY_PAYLOAD_BYTES};
use strata_host::SubRegistry;
use strata_mailbox::layout::CONTROL_PAYLOAD_CAPACITY;
use strata_mailbox::{
    encode_args_blob, AssumeAlive, Child, ControlReply, ControlRequest, EncodedConfig,
    FailureReport, FrameId, FrameIdentity, Handler, MailboxError, MailboxState, Parent,
    PublishHook, PublishKind, ServeOptions, TaskPhase, TaskPublication, TaskRequest, TaskSlot,
    WaitOptions,
};
use strata_types::wire::{decode_args, decode_config, encode_config, CALL_CONFIG_WIRE_BYTES};
use strata_types::{ArgLimits, CallConfig, CallableId, TaskArgs};

/// The callable every `mailbox_parent` publication names (and its seeds carry back).
pub const PARENT_CALLABLE: CallableId = CallableId([0x5a; 32]);

/// An argument blob as a task frame carries it: decoded against the host limits (what
/// [`Child::serve`] uses) and the chip-task limits; whatever decodes must survive
/// encode → decode unchanged.
pub fn args_blob(data: &[u8]) {
    let _guard = armed();
    for limits in [ArgLimits::HOST, ArgLimits::CHIP_TASK] {
        if let Ok(args) = decode_args(data, limits) {
            for t in args.tensors() {
                let _ = t.view.byte_span();
            }
            let again = decode_args(
                &encode_args_blob(&args).expect("decoded arguments re-encode"),
                limits,
            )
            .expect("a decoded argument list re-encodes to a valid blob");
            assert_eq!(again, args, "argument blob does not round-trip");
        }
    }
}

/// The 1152 config bytes of a task frame (shorter inputs are zero-padded), decoded as
/// the child does; a decoded config re-encodes to itself.
pub fn call_config(data: &[u8]) {
    let _guard = armed();
    let mut bytes = [0u8; CALL_CONFIG_WIRE_BYTES];
    let n = data.len().min(CALL_CONFIG_WIRE_BYTES);
    bytes[..n].copy_from_slice(&data[..n]);
    if let Ok(config) = decode_config(&bytes) {
        let mut again = [0u8; CALL_CONFIG_WIRE_BYTES];
        encode_config(&config, &mut again).expect("a decoded config re-encodes");
        assert_eq!(
            decode_config(&again).expect("a decoded config re-encodes to a valid one"),
            config,
            "call config does not round-trip"
        );
    }
}

/// An argument blob a chip child receives: decoded (host limits, as the serve loop
/// does), then turned into the arguments of a chip run exactly as the chip child does
/// (`RunArgs::from_task_args` against the live chip, worker 0, and the shared-memory
/// table's bounds-checked `ptr`), then run (an orchestration that submits nothing, so
/// the run stages the arguments in and out). A failed run rebuilds the chip.
pub fn task_args(data: &[u8]) {
    with_chip(|fx| {
        let _guard = armed();
        if let Ok(args) = decode_args(data, ArgLimits::HOST) {
            let shared = fx.shared.clone();
            // SAFETY: `ptr` checks each view's span against its region, the regions
            // live as long as the fixture, and only this thread touches them.
            let run = unsafe {
                RunArgs::from_task_args(&args, &fx.chip, Some(0), |region, offset, len| {
                    shared.ptr(region, offset, len).map_err(|e| e.to_string())
                })
            };
            if let Ok(mut run) = run {
                // What the chip child does next: a run, which gathers every shared
                // tensor's view into device memory and scatters the written ones back.
                let config = CallConfig::default();
                let ran = fx.chip.run(&fx.noop, &mut run, &config);
                return ((), ran.is_ok());
            }
        }
        ((), true)
    })
}

/// An argument blob a sub-worker child receives for its closure: decoded (host limits),
/// then served by the real [`strata_host::SubHandler`] — which maps every tensor through
/// the shared-memory table and builds the typed views — running a closure that reads
/// every element of every view and writes every writable one.
pub fn sub_task(data: &[u8]) {
    with_sub(|handler| {
        let _guard = armed();
        if let Ok(args) = decode_args(data, ArgLimits::HOST) {
            let config = CallConfig::default();
            let req = TaskRequest {
                slot: TaskSlot::Slot0,
                phase: TaskPhase::Run,
                identity: PARENT_IDENTITY,
                callable: SubRegistry::id_of(SUB_CALLABLE_NAME),
                config: &config,
                args: &args,
                args_blob: data,
            };
            let _ = handler.task(&req);
        }
    })
}

/// A control frame's `command`, `arg0` (8 bytes LE each) and payload (the rest): decoded
/// with [`ControlCommand::from_request`] (a decoded command re-encodes to itself) and
/// carried out by the chip child's own handler (`serve_chip_control`) on the fuzz chip.
pub fn control_request(data: &[u8]) {
    let word = |i: usize| {
        let mut b = [0u8; 8];
        if let Some(src) = data.get(i..) {
            let have = src.len().min(8);
            b[..have].copy_from_slice(&src[..have]);
        }
        u64::from_le_bytes(b)
    };
    let payload = &data[data.len().min(16)..];
    let payload = &payload[..payload.len().min(CONTROL_PAYLOAD_CAPACITY)];
    let req = ControlRequest {
        command: word(0),
        arg0: word(8),
        payload,
    };
    with_chip(|fx| {
        let _guard = armed();
        let decoded = ControlCommand::from_request(&req);
        if let Ok(command) = decoded {
            let mut buf = [0u8; COPY_PAYLOAD_BYTES];
            let again = command.to_request(&mut buf);
            assert_eq!(
                ControlCommand::from_request(&again),
                Ok(command),
                "control command does not round-trip"
            );
        }
        let reply = strata_dist::fuzzing::serve_chip_control(&fx.chip, &fx.shared, &req);
        let intact = match (decoded, reply) {
            // Give a fresh allocation back the way the runtime does, so the next input
            // sees the fixture as built.
            (Ok(ControlCommand::Allocate { .. }), Ok(r)) => {
                let mut buf = [0u8; COPY_PAYLOAD_BYTES];
                let free = ControlCommand::Free { addr: r.result }.to_request(&mut buf);
                strata_dist::fuzzing::serve_chip_control(&fx.chip, &fx.shared, &free).is_ok()
            }
            // A fixture allocation was freed: rebuild before the next input.
            (Ok(ControlCommand::Free { .. }), Ok(_)) => false,
            _ => true,
        };
        ((), intact)
    })
}

fn slot_of(sel: u8) -> TaskSlot {
    if sel & 0x10 == 0 {
        TaskSlot::Slot0
    } else {
        TaskSlot::Slot1
    }
}

/// The identity the `mailbox_parent` target publishes into `slot`.
pub fn parent_identity(slot: TaskSlot) -> FrameIdentity {
    FrameIdentity {
        lease_slot: slot.index() as u32,
        ..PARENT_IDENTITY
    }
}

/// A frame written by a hostile child, read by the real [`Parent`]. The first byte
/// selects the scenario (low nibble `% 3`) and its flags (high nibble), the rest is the
/// frame [`image`]:
///
/// * 0 — a task frame: the parent publishes a task into slot `sel & 0x10` (a
///   `PREPARE_READY` one if `sel & 0x20`), the child overwrites the frame, then the
///   parent polls, snapshots, activates (if `sel & 0x40`), waits (deadline now), resets
///   and publishes again, as the engine's endpoint does;
/// * 1 — the startup report: the child writes the control frame, the parent waits for
///   `INIT_READY` / `INIT_FAILED` (deadline now);
/// * 2 — a control reply: the parent sends a control request, the child overwrites the
///   control frame while the parent waits (1 ms deadline), the parent reads the reply.
pub fn mailbox_parent(data: &[u8]) {
    let Some((&sel, img)) = data.split_first() else {
        return;
    };
    let config = EncodedConfig::default();
    let blob = encode_args_blob(&TaskArgs::new().scalar(3u64)).expect("one scalar encodes");
    with_mailbox(|mb| {
        let _guard = armed();
        let now = WaitOptions::new()
            .with_spin(Duration::ZERO)
            .with_deadline(Instant::now());
        let mut parent = Parent::new(mb);
        match (sel & 0x0f) % 3 {
            0 => {
                let slot = slot_of(sel);
                let mut task =
                    TaskPublication::run(PARENT_CALLABLE, parent_identity(slot), &config, &blob);
                if sel & 0x20 != 0 {
                    task.kind = PublishKind::Prepare;
                }
                parent
                    .publish(slot, &task)
                    .expect("publishing into a cleared frame");
                // SAFETY: the frame is mapped and only this thread touches it.
                unsafe { image::apply(frame_ptr(parent.mailbox(), 1 + slot.index()), img) };
                let _ = parent.poll(slot);
                let _ = parent.snapshot();
                if sel & 0x40 != 0 {
                    let _ = parent.activate(slot);
                }
                let _ = parent.wait_task(slot, &now, &mut AssumeAlive);
                let _ = parent.reset(slot);
                let _ = parent.publish(slot, &task);
            }
            1 => {
                // SAFETY: as above.
                unsafe { image::apply(frame_ptr(parent.mailbox(), 0), img) };
                let _ = parent.wait_init(&now, &mut AssumeAlive);
                let _ = parent.snapshot();
            }
            _ => {
                let frame = frame_ptr(parent.mailbox(), 0) as usize;
                let mut written = false;
                let mut hostile_child = || -> Result<(), MailboxError> {
                    if !written {
                        written = true;
                        // SAFETY: as above; the parent thread is inside its wait loop,
                        // between two reads of the frame.
                        unsafe { image::apply(frame as *mut u8, img) };
                    }
                    Ok(())
                };
                let opts = WaitOptions::new()
                    .with_spin(Duration::ZERO)
                    .with_park_slice(WaitOptions::MIN_PARK_SLICE)
                    .with_deadline(Instant::now() + Duration::from_millis(1));
                let req = ControlRequest {
                    command: 5,
                    arg0: 0,
                    payload: &[],
                };
                let _ = parent.control(&req, &opts, &mut hostile_child);
            }
        }
        ((), parent.into_mailbox())
    })
}

/// The fuzz child's handler: accepts every task, echoes every control request.
struct EchoHandler;

impl Handler for EchoHandler {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        let _ = (req.args.tensors().len(), req.config.timeout);
        Ok(())
    }

    fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
        Ok(ControlReply {
            result: req.arg0,
            payload: req.payload.to_vec(),
        })
    }
}

/// Whether [`Child::serve`] acts on the mailbox at once rather than waiting (a child of
/// an idle parent waits forever, correctly; that is not a decoder's business).
fn child_acts_at_once(states: [u32; 3], shutdown: u32) -> bool {
    let frames = [
        FrameId::Control,
        FrameId::Task(TaskSlot::Slot0),
        FrameId::Task(TaskSlot::Slot1),
    ];
    let mut acts = shutdown != 0;
    for (raw, frame) in states.into_iter().zip(frames) {
        let Ok(s) = MailboxState::decode(raw, frame) else {
            return true; // a garbage state word is a protocol error at once
        };
        let valid = match frame {
            FrameId::Control => s.valid_in_control_frame(),
            FrameId::Task(_) => s.valid_in_task_frame(),
        };
        if !valid {
            return true;
        }
        acts |= match frame {
            FrameId::Control => {
                matches!(s, MailboxState::Shutdown | MailboxState::ControlRequest)
            }
            FrameId::Task(_) => matches!(
                s,
                MailboxState::TaskReady | MailboxState::Activate | MailboxState::PrepareReady
            ),
        };
    }
    acts
}

/// A frame written by a hostile parent, served by the real [`Child`]: the first byte
/// selects the frame (`% 3`: control, task slot 0, task slot 1), the rest is its
/// [`image`]; the other frames are IDLE. The child serves one round (its publish hook
/// then sets the sticky shutdown word, so the next round ends the serve loop).
pub fn mailbox_child(data: &[u8]) {
    let Some((&sel, img)) = data.split_first() else {
        return;
    };
    with_mailbox(|mb| {
        let frame = sel as usize % 3;
        // SAFETY: the frame is mapped and only this thread touches it.
        unsafe { image::apply(frame_ptr(&mb, frame), img) };
        let word = |f: usize, off: usize| {
            // SAFETY: an aligned u32 inside a mapped frame; read as an atomic, as the
            // child does.
            unsafe { (*frame_ptr(&mb, f).add(off).cast::<AtomicU32>()).load(Ordering::Acquire) }
        };
        let states = [word(0, 0), word(1, 0), word(2, 0)];
        if !child_acts_at_once(states, word(0, 32)) {
            return ((), mb);
        }
        let shutdown_word = frame_ptr(&mb, 0) as usize + 32;
        let hook = PublishHook::new(move || {
            // SAFETY: the sticky shutdown word of the fuzz mailbox, which stays mapped
            // for the life of the process (a thread-local kept until exit).
            unsafe { (*(shutdown_word as *const AtomicU32)).store(1, Ordering::Release) }
        });
        let options = ServeOptions {
            wait: WaitOptions::new().with_spin(Duration::ZERO),
            on_publish: Some(hook),
            ..ServeOptions::default()
        };
        let mut child = Child::with_parent(mb, std::process::id()).with_options(options);
        {
            let _guard = armed();
            let _ = child.serve(&mut EchoHandler);
        }
        ((), child.into_mailbox())
    })
}

/// Bytes a network peer sent, decoded as a strata-net reader does: header (magic,
/// version, type, flags, length bound), checksum, then the type's body. Whatever decodes
/// must re-encode to exactly the input bytes (header and postcard body are canonical).
pub fn net_frame(data: &[u8]) {
    use strata_net::wire::{decode_frame, encode, Body, FrameType};
    let _guard = armed();
    let Ok((h, body)) = decode_frame(data) else {
        return;
    };
    let again = match &body {
        Body::Hello(b) => encode(FrameType::Hello, h.session, h.sequence, b),
        Body::Challenge(b) => encode(FrameType::Challenge, h.session, h.sequence, b),
        Body::Auth(b) => encode(FrameType::Auth, h.session, h.sequence, b),
        Body::Error(b) => encode(FrameType::Error, h.session, h.sequence, b),
        Body::NodeHello(b) => encode(FrameType::NodeHello, h.session, h.sequence, b),
        Body::Ready(b) => encode(FrameType::Ready, h.session, h.sequence, b),
        Body::Task(b) => encode(FrameType::Task, h.session, h.sequence, b),
        Body::Data(b) => encode(FrameType::Data, h.session, h.sequence, b),
        Body::Done(b) => encode(FrameType::Done, h.session, h.sequence, b),
        Body::Control(b) => encode(FrameType::Control, h.session, h.sequence, b),
        Body::ControlReply(b) => encode(FrameType::ControlReply, h.session, h.sequence, b),
        Body::Heartbeat => encode(FrameType::Heartbeat, h.session, h.sequence, &()),
        Body::Cancel(b) => encode(FrameType::Cancel, h.session, h.sequence, b),
        Body::Shutdown => encode(FrameType::Shutdown, h.session, h.sequence, &()),
        Body::ShutdownAck(b) => encode(FrameType::ShutdownAck, h.session, h.sequence, b),
    }
    .expect("a decoded frame re-encodes");
    assert_eq!(again, data, "network frame does not round-trip");
    // The node's wait-for bytes are foreign: the root decodes them without panicking.
    if let Body::Done(d) = &body {
        let _ = strata_types::WaitFor::decode(&d.wait_for);
    }
}
