//! The parent side of the protocol.

use crate::error::MailboxError;
use crate::layout::{
    Frame, ARGS_CAPACITY, CONFIG_BYTES, CONTROL_PAYLOAD_CAPACITY, PROTOCOL_VERSION,
};
use crate::liveness::Liveness;
use crate::mailbox::{Mailbox, Snapshot};
use crate::outcome::{codes, FailureReport};
use crate::state::{FrameId, FrameIdentity, MailboxState, PrepareDisposition, TaskSlot};
use crate::wait::{wait_until, WaitOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_types::wire::{args_wire_len, encode_args};
use strata_types::wire::{decode_config, encode_config};
use strata_types::{CallConfig, CallableId, TaskArgs, TypesError, WaitFor, WAIT_FOR_MAX_BYTES};

static CONFIG_IDS: AtomicU64 = AtomicU64::new(1);

/// A [`CallConfig`] encoded once for the wire (1152 bytes), cheap to clone.
///
/// A [`Parent`] remembers which encoded config each task frame holds and skips
/// rewriting the 1152 bytes when the same `EncodedConfig` (or a clone) is published
/// again; the child likewise decodes a frame's config only when it changed.
///
/// ```
/// use strata_mailbox::EncodedConfig;
/// use strata_types::CallConfig;
/// let c = CallConfig::default().with_block_dim(4);
/// let e = EncodedConfig::new(&c)?;
/// assert_eq!(e.decode()?, c);
/// assert!(EncodedConfig::new(&CallConfig::default().with_aicpu_threads(9)).is_err());
/// # Ok::<(), strata_mailbox::MailboxError>(())
/// ```
#[derive(Debug, Clone)]
pub struct EncodedConfig {
    id: u64,
    bytes: Arc<[u8; CONFIG_BYTES]>,
}

impl EncodedConfig {
    /// Validates and encodes `config`.
    ///
    /// # Errors
    /// [`MailboxError::InvalidConfig`] if `config.validate()` fails.
    pub fn new(config: &CallConfig) -> Result<EncodedConfig, MailboxError> {
        let mut bytes = [0u8; CONFIG_BYTES];
        encode_config(config, &mut bytes).map_err(MailboxError::InvalidConfig)?;
        Ok(EncodedConfig {
            id: CONFIG_IDS.fetch_add(1, Ordering::Relaxed),
            bytes: Arc::new(bytes),
        })
    }

    /// The wire bytes.
    pub fn as_bytes(&self) -> &[u8; CONFIG_BYTES] {
        &self.bytes
    }

    /// Decodes the bytes back.
    ///
    /// # Errors
    /// [`MailboxError::InvalidConfig`] (cannot happen for a value built by `new`).
    pub fn decode(&self) -> Result<CallConfig, MailboxError> {
        decode_config(&self.bytes).map_err(MailboxError::InvalidConfig)
    }
}

impl Default for EncodedConfig {
    fn default() -> Self {
        // The default configuration encodes to all zeros.
        let bytes = [0u8; CONFIG_BYTES];
        EncodedConfig {
            id: CONFIG_IDS.fetch_add(1, Ordering::Relaxed),
            bytes: Arc::new(bytes),
        }
    }
}

/// Encodes `args` into a fresh argument blob (`strata_types::wire::encode_args`).
///
/// ```
/// use strata_mailbox::encode_args_blob;
/// use strata_types::TaskArgs;
/// let a = TaskArgs::new().scalar(3u64);
/// assert_eq!(encode_args_blob(&a)?.len(), 16);
/// # Ok::<(), strata_types::TypesError>(())
/// ```
///
/// # Errors
/// The invalid argument a chaining method recorded ([`TaskArgs::check`]).
pub fn encode_args_blob(args: &TaskArgs) -> Result<Vec<u8>, TypesError> {
    let mut blob = vec![0u8; args_wire_len(args)];
    let n = encode_args(args, &mut blob)?;
    blob.truncate(n);
    Ok(blob)
}

/// Which state a publication stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PublishKind {
    /// `TASK_READY`: run the task now.
    Run,
    /// `PREPARE_READY`: validate and stage it; run it after [`Parent::activate`].
    Prepare,
}

/// A task to publish into a task frame.
#[derive(Debug, Clone, Copy)]
pub struct TaskPublication<'a> {
    /// Run now or prepare.
    pub kind: PublishKind,
    /// The callable to run (not [`CallableId::NONE`]).
    pub callable: CallableId,
    /// The identity stamped on the frame.
    pub identity: FrameIdentity,
    /// The call configuration.
    pub config: &'a EncodedConfig,
    /// The argument blob, as written by `strata_types::wire::encode_args` (the child
    /// validates it; at most [`ARGS_CAPACITY`] bytes).
    pub args: &'a [u8],
}

impl<'a> TaskPublication<'a> {
    /// A [`PublishKind::Run`] publication.
    pub fn run(
        callable: CallableId,
        identity: FrameIdentity,
        config: &'a EncodedConfig,
        args: &'a [u8],
    ) -> Self {
        TaskPublication {
            kind: PublishKind::Run,
            callable,
            identity,
            config,
            args,
        }
    }

    /// A [`PublishKind::Prepare`] publication.
    pub fn prepare(
        callable: CallableId,
        identity: FrameIdentity,
        config: &'a EncodedConfig,
        args: &'a [u8],
    ) -> Self {
        TaskPublication {
            kind: PublishKind::Prepare,
            ..Self::run(callable, identity, config, args)
        }
    }
}

/// A finished task, read from a frame in `TASK_DONE` or `TASK_FAILED`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCompletion {
    /// The frame.
    pub slot: TaskSlot,
    /// `TASK_DONE` or `TASK_FAILED`.
    pub state: MailboxState,
    /// The identity it was published with (checked against the frame).
    pub identity: FrameIdentity,
    /// Whether the child crossed the launch point (sticky launch-accepted word).
    pub accepted: bool,
    /// `Ok` on success; the child's code and message otherwise.
    pub outcome: Result<(), FailureReport>,
}

/// What [`Parent::poll`] observed in a task frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPoll {
    /// The frame's state.
    pub state: MailboxState,
    /// The sticky launch-accepted word.
    pub accepted: bool,
    /// The preparation disposition (meaningful from `FRAME_STAGED` on).
    pub disposition: PrepareDisposition,
    /// The completion, when the state is `TASK_DONE` or `TASK_FAILED`.
    pub completion: Option<TaskCompletion>,
}

/// A control command: a sub-command, an argument and a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlRequest<'a> {
    /// The sub-command (meaning defined by the layers above).
    pub command: u64,
    /// Its argument.
    pub arg0: u64,
    /// Its payload (at most [`CONTROL_PAYLOAD_CAPACITY`] bytes).
    pub payload: &'a [u8],
}

/// The answer to a successful control command.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ControlReply {
    /// The result word.
    pub result: u64,
    /// Reply bytes (at most [`CONTROL_PAYLOAD_CAPACITY`]).
    pub payload: Vec<u8>,
}

impl ControlReply {
    /// A reply with a result word and no payload.
    pub fn new(result: u64) -> ControlReply {
        ControlReply {
            result,
            payload: Vec::new(),
        }
    }
}

/// The parent's end of a mailbox.
///
/// It publishes tasks into the two task frames, polls or waits for their completion,
/// runs control commands, and requests shutdown. It keeps, per task frame, the identity
/// it published (to detect stale frames) and which [`EncodedConfig`] the frame holds.
///
/// Waiting is spin-then-park ([`WaitOptions`]) with a caller-supplied [`Liveness`] check
/// (typically [`crate::ChildProcess`]) run at least every park slice (≤ 10 ms), so a dead
/// child ends a wait with a typed error instead of a hang.
///
/// ```
/// use strata_mailbox::*;
/// use strata_types::{CallableId, TaskArgs, wire};
///
/// struct Echo;
/// impl Handler for Echo {
///     fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
///         match req.args.scalar_at::<u32>(0) {
///             Some(0) => Err(FailureReport::new(7, "zero is not allowed")),
///             _ => Ok(()),
///         }
///     }
/// }
///
/// let mb = Mailbox::create()?;
/// // A thread stands in for the forked child here; it maps the same memory again.
/// let child_mb = mb.try_clone()?;
/// let child = std::thread::spawn(move || {
///     Child::with_parent(child_mb, std::process::id()).serve(&mut Echo)
/// });
///
/// let mut parent = Parent::new(mb);
/// let config = EncodedConfig::default();
/// let blob = encode_args_blob(&TaskArgs::new().scalar(0u32)).expect("one scalar encodes");
/// let id = FrameIdentity { run_id: 1, lease_slot: 0, lease_generation: 1, dispatch_id: 1 };
/// let publication = TaskPublication::run(CallableId([1; 32]), id, &config, &blob);
/// let done = parent.run_task(TaskSlot::Slot0, &publication, &WaitOptions::default(), &mut AssumeAlive)?;
/// assert_eq!(done.outcome, Err(FailureReport::new(7, "zero is not allowed")));
/// parent.request_shutdown();
/// assert_eq!(child.join().unwrap()?, ServeExit::Shutdown);
/// # Ok::<(), MailboxError>(())
/// ```
#[derive(Debug)]
pub struct Parent {
    mailbox: Mailbox,
    published: [Option<FrameIdentity>; 2],
    configs: [Option<u64>; 2],
    poisoned: Option<String>,
    shutdown: bool,
}

fn task_state(frame: &Frame, slot: TaskSlot) -> Result<MailboxState, MailboxError> {
    let id = FrameId::Task(slot);
    let s = MailboxState::decode(frame.word().load(), id)?;
    if s.valid_in_task_frame() {
        Ok(s)
    } else {
        Err(MailboxError::UnexpectedState {
            frame: id,
            state: s,
        })
    }
}

impl Parent {
    /// The parent end of `mailbox`.
    pub fn new(mailbox: Mailbox) -> Parent {
        Parent {
            mailbox,
            published: [None; 2],
            configs: [None; 2],
            poisoned: None,
            shutdown: false,
        }
    }

    /// The mailbox.
    pub fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }

    /// Gives the mailbox back.
    pub fn into_mailbox(self) -> Mailbox {
        self.mailbox
    }

    /// The identity this parent published into `slot`, while the task is outstanding.
    pub fn published(&self, slot: TaskSlot) -> Option<FrameIdentity> {
        self.published[slot.index()]
    }

    /// Waits for the child's startup report: `INIT_READY` (returns its info word and
    /// resets the control frame to IDLE) or `INIT_FAILED`.
    ///
    /// # Errors
    /// [`MailboxError::InitFailed`] with the child's code and message; the liveness
    /// error, [`MailboxError::Timeout`], or a protocol error.
    pub fn wait_init(
        &mut self,
        opts: &WaitOptions,
        liveness: &mut dyn Liveness,
    ) -> Result<u64, MailboxError> {
        let ctrl = self.mailbox.control();
        let state = wait_until(
            [ctrl.word()],
            opts,
            opts.slice(),
            |s| match MailboxState::decode(s[0], FrameId::Control)? {
                MailboxState::Idle => Ok(None),
                st @ (MailboxState::InitReady | MailboxState::InitFailed) => Ok(Some(st)),
                MailboxState::Shutdown => Err(MailboxError::ShutdownRequested),
                state => Err(MailboxError::UnexpectedState {
                    frame: FrameId::Control,
                    state,
                }),
            },
            || liveness.check(),
            || "the child's INIT_READY or INIT_FAILED on the control frame".into(),
        )?;
        if state == MailboxState::InitFailed {
            return Err(MailboxError::InitFailed {
                code: ctrl.error_code.load(Ordering::Relaxed),
                message: ctrl.read_message(),
            });
        }
        let info = ctrl.result.load(Ordering::Relaxed);
        ctrl.word().store_silent(MailboxState::Idle.as_raw());
        Ok(info)
    }

    /// Publishes a task into `slot`: zeroes the error fields, clears the accepted word
    /// and the disposition, writes identity, digest, argument blob and (if the frame does
    /// not hold it already) the config, then release-stores `TASK_READY` or
    /// `PREPARE_READY` and wakes the child if it is parked.
    ///
    /// # Errors
    /// [`MailboxError::FrameBusy`] if the frame is not IDLE (nothing is written);
    /// [`MailboxError::InvalidIdentity`], [`MailboxError::MissingCallable`],
    /// [`MailboxError::ArgsTooLarge`], [`MailboxError::ShutdownRequested`], or a
    /// decoding error for a garbage state word.
    pub fn publish(
        &mut self,
        slot: TaskSlot,
        task: &TaskPublication<'_>,
    ) -> Result<(), MailboxError> {
        if self.shutdown {
            return Err(MailboxError::ShutdownRequested);
        }
        task.identity.validate()?;
        if task.callable == CallableId::NONE {
            return Err(MailboxError::MissingCallable);
        }
        if task.args.len() > ARGS_CAPACITY {
            return Err(MailboxError::ArgsTooLarge {
                len: task.args.len(),
                capacity: ARGS_CAPACITY,
            });
        }
        let f = self.mailbox.task(slot);
        let state = task_state(f, slot)?;
        if state != MailboxState::Idle {
            return Err(MailboxError::FrameBusy {
                frame: FrameId::Task(slot),
                state,
            });
        }
        let i = slot.index();
        f.error_code.store(0, Ordering::Relaxed);
        f.accepted.store(0, Ordering::Relaxed);
        f.disposition
            .store(PrepareDisposition::None.as_raw(), Ordering::Relaxed);
        f.clear_message();
        f.write_identity(&task.identity);
        f.write_digest(task.callable.as_bytes());
        f.args_len.store(task.args.len() as u32, Ordering::Relaxed);
        f.write_args(task.args);
        if self.configs[i] != Some(task.config.id) {
            f.write_config(task.config.as_bytes());
            let epoch = f
                .config_epoch
                .load(Ordering::Relaxed)
                .wrapping_add(1)
                .max(1);
            f.config_epoch.store(epoch, Ordering::Relaxed);
            self.configs[i] = Some(task.config.id);
        }
        self.published[i] = Some(task.identity);
        let next = match task.kind {
            PublishKind::Run => MailboxState::TaskReady,
            PublishKind::Prepare => MailboxState::PrepareReady,
        };
        f.word().publish(next.as_raw());
        Ok(())
    }

    /// Observes a task frame without blocking: its state, the accepted word, the
    /// disposition and, for `TASK_DONE`/`TASK_FAILED`, the completion (error code and
    /// message). Every non-IDLE observation checks the frame's identity against the one
    /// published.
    ///
    /// # Errors
    /// [`MailboxError::StaleFrameIdentity`] on an identity mismatch;
    /// [`MailboxError::NoTaskPublished`] for a busy frame this parent never published
    /// into; [`MailboxError::UnknownState`], [`MailboxError::UnexpectedState`] or
    /// [`MailboxError::CorruptField`] for garbage.
    pub fn poll(&self, slot: TaskSlot) -> Result<TaskPoll, MailboxError> {
        let frame = FrameId::Task(slot);
        let f = self.mailbox.task(slot);
        let state = task_state(f, slot)?;
        let accepted = f.accepted.load(Ordering::Acquire) != 0;
        if state == MailboxState::Idle {
            return Ok(TaskPoll {
                state,
                accepted,
                disposition: PrepareDisposition::None,
                completion: None,
            });
        }
        let expected =
            self.published[slot.index()].ok_or(MailboxError::NoTaskPublished { frame, state })?;
        let (protocol, found) = f.read_identity();
        if protocol != PROTOCOL_VERSION || found != expected {
            return Err(MailboxError::StaleFrameIdentity {
                frame,
                expected,
                found,
                found_protocol: protocol,
            });
        }
        let raw = f.disposition.load(Ordering::Relaxed);
        let disposition = PrepareDisposition::from_raw(raw).ok_or(MailboxError::CorruptField {
            frame,
            field: "disposition",
            value: raw.into(),
            limit: PrepareDisposition::NativePrepared.as_raw().into(),
        })?;
        let completion = if state.is_task_terminal() {
            let code = f.error_code.load(Ordering::Relaxed);
            let outcome = if code == codes::OK && state == MailboxState::TaskDone {
                Ok(())
            } else {
                let len = f.wait_for_len.load(Ordering::Relaxed) as usize;
                if len > WAIT_FOR_MAX_BYTES {
                    return Err(MailboxError::CorruptField {
                        frame,
                        field: "wait_for_len",
                        value: len as u64,
                        limit: WAIT_FOR_MAX_BYTES as u64,
                    });
                }
                // A state that does not decode is dropped: the failure itself still counts.
                let wait_for = (len != 0)
                    .then(|| WaitFor::decode(&f.read_wait_for(len)).ok())
                    .flatten();
                Err(FailureReport::new(code, f.read_message()).with_wait_for(wait_for))
            };
            Some(TaskCompletion {
                slot,
                state,
                identity: expected,
                accepted,
                outcome,
            })
        } else {
            None
        };
        Ok(TaskPoll {
            state,
            accepted,
            disposition,
            completion,
        })
    }

    /// Waits (spin-then-park) until `slot` reaches `TASK_DONE` or `TASK_FAILED` and
    /// returns the completion. The frame stays terminal; [`Parent::reset`] frees it.
    ///
    /// A [`PublishKind::Prepare`] publication stops at `FRAME_STAGED` until
    /// [`Parent::activate`]: wait for the staging with [`Parent::wait_change`] (or poll),
    /// activate, then wait here.
    ///
    /// # Errors
    /// [`MailboxError::NoTaskPublished`] if nothing is outstanding in `slot`; the
    /// liveness error; [`MailboxError::Timeout`]; the errors of [`Parent::poll`].
    pub fn wait_task(
        &mut self,
        slot: TaskSlot,
        opts: &WaitOptions,
        liveness: &mut dyn Liveness,
    ) -> Result<TaskCompletion, MailboxError> {
        let f = self.mailbox.task(slot);
        if self.published[slot.index()].is_none() {
            return Err(MailboxError::NoTaskPublished {
                frame: FrameId::Task(slot),
                state: task_state(f, slot)?,
            });
        }
        wait_until(
            [f.word()],
            opts,
            opts.slice(),
            |s| {
                let st = MailboxState::decode(s[0], FrameId::Task(slot))?;
                if !st.valid_in_task_frame() {
                    return Err(MailboxError::UnexpectedState {
                        frame: FrameId::Task(slot),
                        state: st,
                    });
                }
                Ok(st.is_task_terminal().then_some(()))
            },
            || liveness.check(),
            || format!("TASK_DONE or TASK_FAILED on task frame {}", slot.index()),
        )?;
        match self.poll(slot)?.completion {
            Some(c) => Ok(c),
            // The state only leaves a terminal value through this parent's reset.
            None => Err(MailboxError::UnexpectedState {
                frame: FrameId::Task(slot),
                state: task_state(f, slot)?,
            }),
        }
    }

    /// Resets a finished frame to IDLE so it can be published into again. A frame that
    /// is IDLE already is left alone.
    ///
    /// The store is a plain release store with no wake: nobody waits for IDLE.
    ///
    /// # Errors
    /// [`MailboxError::NotTerminal`] if the task has not finished.
    pub fn reset(&mut self, slot: TaskSlot) -> Result<(), MailboxError> {
        let f = self.mailbox.task(slot);
        let state = task_state(f, slot)?;
        if state != MailboxState::Idle && !state.is_task_terminal() {
            return Err(MailboxError::NotTerminal {
                frame: FrameId::Task(slot),
                state,
            });
        }
        f.word().store_silent(MailboxState::Idle.as_raw());
        self.published[slot.index()] = None;
        Ok(())
    }

    /// Publishes, waits for the completion and resets the frame: one full round trip.
    ///
    /// # Errors
    /// Those of [`Parent::publish`] and [`Parent::wait_task`].
    pub fn run_task(
        &mut self,
        slot: TaskSlot,
        task: &TaskPublication<'_>,
        opts: &WaitOptions,
        liveness: &mut dyn Liveness,
    ) -> Result<TaskCompletion, MailboxError> {
        self.publish(slot, task)?;
        let c = self.wait_task(slot, opts, liveness)?;
        self.reset(slot)?;
        Ok(c)
    }

    /// Asks the child to launch a staged frame: `compare_exchange(FRAME_STAGED →
    /// ACTIVATE)`, so a stale observation can never overwrite a state the child moved on
    /// to (e.g. `TASK_FAILED`). Returns whether the exchange happened; when it did not,
    /// [`Parent::poll`] tells what the frame holds.
    ///
    /// # Errors
    /// [`MailboxError::NoTaskPublished`] if nothing is outstanding in `slot`; a decoding
    /// error for a garbage state word.
    pub fn activate(&mut self, slot: TaskSlot) -> Result<bool, MailboxError> {
        let f = self.mailbox.task(slot);
        if self.published[slot.index()].is_none() {
            return Err(MailboxError::NoTaskPublished {
                frame: FrameId::Task(slot),
                state: task_state(f, slot)?,
            });
        }
        match f.word().compare_publish(
            MailboxState::FrameStaged.as_raw(),
            MailboxState::Activate.as_raw(),
        ) {
            Ok(_) => Ok(true),
            Err(raw) => MailboxState::decode(raw, FrameId::Task(slot)).map(|_| false),
        }
    }

    /// Runs a control command: writes sub-command, argument and payload, release-stores
    /// `CONTROL_REQUEST`, waits (spin-then-park, liveness-checked, optional deadline) for
    /// `CONTROL_DONE`, reads the outcome and resets the control frame to IDLE.
    ///
    /// If the wait fails (child gone, deadline, protocol error) the control channel is
    /// poisoned: the child may still be working on the command, so every later command is
    /// refused.
    ///
    /// # Errors
    /// [`MailboxError::ControlFailed`] with the child's code and message;
    /// [`MailboxError::ControlPoisoned`]; [`MailboxError::PayloadTooLarge`];
    /// [`MailboxError::FrameBusy`] if the control frame is not IDLE (e.g. before
    /// [`Parent::wait_init`]); the liveness error; [`MailboxError::Timeout`].
    pub fn control(
        &mut self,
        request: &ControlRequest<'_>,
        opts: &WaitOptions,
        liveness: &mut dyn Liveness,
    ) -> Result<ControlReply, MailboxError> {
        if let Some(reason) = &self.poisoned {
            return Err(MailboxError::ControlPoisoned {
                reason: reason.clone(),
            });
        }
        if self.shutdown {
            return Err(MailboxError::ShutdownRequested);
        }
        if request.payload.len() > CONTROL_PAYLOAD_CAPACITY {
            return Err(MailboxError::PayloadTooLarge {
                len: request.payload.len(),
                capacity: CONTROL_PAYLOAD_CAPACITY,
            });
        }
        let ctrl = self.mailbox.control();
        let state = MailboxState::decode(ctrl.word().load(), FrameId::Control)?;
        if state != MailboxState::Idle {
            return Err(MailboxError::FrameBusy {
                frame: FrameId::Control,
                state,
            });
        }
        ctrl.error_code.store(0, Ordering::Relaxed);
        ctrl.clear_message();
        ctrl.command.store(request.command, Ordering::Relaxed);
        ctrl.arg0.store(request.arg0, Ordering::Relaxed);
        ctrl.result.store(0, Ordering::Relaxed);
        ctrl.reply_len.store(0, Ordering::Relaxed);
        ctrl.args_len
            .store(request.payload.len() as u32, Ordering::Relaxed);
        ctrl.write_args(request.payload);
        ctrl.word().publish(MailboxState::ControlRequest.as_raw());

        let waited = wait_until(
            [ctrl.word()],
            opts,
            opts.slice(),
            |s| match MailboxState::decode(s[0], FrameId::Control)? {
                MailboxState::ControlRequest => Ok(None),
                MailboxState::ControlDone => Ok(Some(())),
                state => Err(MailboxError::UnexpectedState {
                    frame: FrameId::Control,
                    state,
                }),
            },
            || liveness.check(),
            || format!("CONTROL_DONE for control command {}", request.command),
        );
        if let Err(e) = waited {
            self.poisoned = Some(format!(
                "control command {} did not complete: {e}",
                request.command
            ));
            return Err(e);
        }
        let code = ctrl.error_code.load(Ordering::Relaxed);
        if code != codes::OK {
            let message = ctrl.read_message();
            ctrl.word().store_silent(MailboxState::Idle.as_raw());
            return Err(MailboxError::ControlFailed {
                command: request.command,
                code,
                message,
            });
        }
        let result = ctrl.result.load(Ordering::Relaxed);
        let len = ctrl.reply_len.load(Ordering::Relaxed) as usize;
        if len > CONTROL_PAYLOAD_CAPACITY {
            ctrl.word().store_silent(MailboxState::Idle.as_raw());
            return Err(MailboxError::CorruptField {
                frame: FrameId::Control,
                field: "reply_len",
                value: len as u64,
                limit: CONTROL_PAYLOAD_CAPACITY as u64,
            });
        }
        let mut payload = Vec::new();
        ctrl.read_args(len, &mut payload);
        ctrl.word().store_silent(MailboxState::Idle.as_raw());
        Ok(ControlReply { result, payload })
    }

    /// Requests shutdown: release-stores the sticky shutdown word (never cleared), then
    /// publishes `SHUTDOWN` on the control frame (waking a parked child). Idempotent;
    /// afterwards publications and control commands are refused.
    pub fn request_shutdown(&mut self) {
        let ctrl = self.mailbox.control();
        ctrl.shutdown.store(1, Ordering::Release);
        ctrl.word().swap_publish(MailboxState::Shutdown.as_raw());
        self.shutdown = true;
    }

    /// The decoded states of all three frames.
    ///
    /// # Errors
    /// [`MailboxError::UnknownState`] for a garbage state word.
    pub fn snapshot(&self) -> Result<Snapshot, MailboxError> {
        let mb = &self.mailbox;
        Snapshot::decode(&[
            mb.control().word().load(),
            mb.task(TaskSlot::Slot0).word().load(),
            mb.task(TaskSlot::Slot1).word().load(),
        ])
    }

    /// Waits (spin-then-park over all three state words) until any frame's state differs
    /// from `since`, and returns the new snapshot.
    ///
    /// # Errors
    /// The liveness error; [`MailboxError::Timeout`]; [`MailboxError::UnknownState`].
    pub fn wait_change(
        &self,
        since: &Snapshot,
        opts: &WaitOptions,
        liveness: &mut dyn Liveness,
    ) -> Result<Snapshot, MailboxError> {
        let mb = &self.mailbox;
        wait_until(
            [
                mb.control().word(),
                mb.task(TaskSlot::Slot0).word(),
                mb.task(TaskSlot::Slot1).word(),
            ],
            opts,
            opts.slice(),
            |s| {
                let now = Snapshot::decode(s)?;
                Ok((now != *since).then_some(now))
            },
            || liveness.check(),
            || format!("a state change in the mailbox (since {since:?})"),
        )
    }
}
