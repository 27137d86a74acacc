//! The child side of the protocol: a serve loop driven by a [`Handler`].

use crate::error::MailboxError;
use crate::layout::{
    Frame, ARGS_CAPACITY, CONTROL_PAYLOAD_CAPACITY, PROTOCOL_VERSION, WAIT_FOR_OFFSET,
};
use crate::liveness::ParentWatch;
use crate::mailbox::{Mailbox, Snapshot};
use crate::outcome::{codes, panic_message, FailureReport};
use crate::parent::{ControlReply, ControlRequest};
use crate::state::{FrameId, FrameIdentity, MailboxState, PrepareDisposition, TaskSlot};
use crate::wait::{wait_until, WaitOptions};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use strata_types::wire::{decode_args, decode_config};
use strata_types::WAIT_FOR_MAX_BYTES;
use strata_types::{ArgLimits, CallConfig, CallableId, TaskArgs};

/// Why a task handler is being called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskPhase {
    /// The frame was published `TASK_READY`: run it; the result becomes `TASK_DONE`
    /// (error code 0 on success, the failure's code otherwise).
    Run,
    /// The frame was published `PREPARE_READY`: [`Handler::prepare`] stages it.
    Prepare,
    /// The parent activated a staged frame: run it; the result becomes `TASK_DONE` on
    /// success or `TASK_FAILED`.
    Activated,
}

/// A task as the child's handler sees it: decoded and validated.
#[derive(Debug, Clone, Copy)]
pub struct TaskRequest<'a> {
    /// The task frame.
    pub slot: TaskSlot,
    /// Why the handler is called.
    pub phase: TaskPhase,
    /// The identity the parent stamped on the frame.
    pub identity: FrameIdentity,
    /// The callable to run (never [`CallableId::NONE`]).
    pub callable: CallableId,
    /// The call configuration (decoded once per change).
    pub config: &'a CallConfig,
    /// The decoded arguments.
    pub args: &'a TaskArgs,
    /// The raw argument blob (a private copy).
    pub args_blob: &'a [u8],
}

/// What a child does with the requests its parent sends. Used by [`Child::serve`].
///
/// Returning `Err(FailureReport)` reports a failure with its code and message to the parent; a
/// panic is caught and reported as [`codes::HANDLER_PANICKED`] (the child keeps serving).
///
/// ```
/// use strata_mailbox::*;
/// struct Sum(u64);
/// impl Handler for Sum {
///     fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
///         self.0 += req.args.scalars().iter().sum::<u64>();
///         Ok(())
///     }
///     fn control(&mut self, req: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
///         match req.command {
///             1 => Ok(ControlReply::new(self.0)),
///             c => Err(FailureReport::new(codes::UNSUPPORTED, format!("no command {c}"))),
///         }
///     }
/// }
/// ```
pub trait Handler {
    /// Runs one task ([`TaskPhase::Run`] or [`TaskPhase::Activated`]).
    ///
    /// # Errors
    /// The failure to report to the parent.
    fn task(&mut self, request: &TaskRequest<'_>) -> Result<(), FailureReport>;

    /// Stages a `PREPARE_READY` frame; the default only validates (the frame was decoded
    /// already). [`PrepareDisposition::None`] is reported as `ValidatedOnly`.
    ///
    /// # Errors
    /// The failure to report (the frame becomes `TASK_FAILED`).
    fn prepare(&mut self, request: &TaskRequest<'_>) -> Result<PrepareDisposition, FailureReport> {
        let _ = request;
        Ok(PrepareDisposition::ValidatedOnly)
    }

    /// Handles one control command; the default refuses every command with
    /// [`codes::UNSUPPORTED`].
    ///
    /// # Errors
    /// The failure to report to the parent.
    fn control(&mut self, request: &ControlRequest<'_>) -> Result<ControlReply, FailureReport> {
        Err(FailureReport::new(
            codes::UNSUPPORTED,
            format!(
                "control command {} is not supported by this child",
                request.command
            ),
        ))
    }
}

/// A callback the child runs right **after** it publishes a state its parent acts on:
/// `TASK_DONE`, `TASK_FAILED`, `FRAME_STAGED`, `CONTROL_DONE`, `INIT_READY` and
/// `INIT_FAILED` (see [`ServeOptions::on_publish`]).
///
/// The mailbox does not say what the callback does. A parent that watches many mailboxes
/// from one thread uses it to ring a shared "doorbell" word it parks on, instead of
/// parking on every mailbox: the callback runs after the releasing state store, so a
/// parent that sees the doorbell change and then polls the mailboxes finds the new state.
///
/// Two hooks compare equal when they share the same callback (`Arc::ptr_eq`).
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use strata_mailbox::PublishHook;
/// let rung = Arc::new(AtomicU32::new(0));
/// let r = rung.clone();
/// let hook = PublishHook::new(move || { r.fetch_add(1, Ordering::Release); });
/// hook.call();
/// assert_eq!(rung.load(Ordering::Acquire), 1);
/// assert_eq!(hook.clone(), hook);
/// ```
#[derive(Clone)]
pub struct PublishHook(Arc<dyn Fn() + Send + Sync>);

impl PublishHook {
    /// Wraps a callback. It must be cheap and must not block: it runs on the child's
    /// hot path, once per publication.
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> PublishHook {
        PublishHook(Arc::new(f))
    }

    /// Wraps a shared callback.
    pub fn from_arc(f: Arc<dyn Fn() + Send + Sync>) -> PublishHook {
        PublishHook(f)
    }

    /// Runs the callback.
    #[inline]
    pub fn call(&self) {
        (self.0)()
    }
}

impl std::fmt::Debug for PublishHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PublishHook({:p})", Arc::as_ptr(&self.0).cast::<()>())
    }
}

impl PartialEq for PublishHook {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for PublishHook {}

/// How [`Child::serve`] waits and validates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    /// Spin budget and park slice while idle (the deadline is ignored).
    pub wait: WaitOptions,
    /// How often to compare `getppid()` with the parent's pid while spinning idle; it
    /// is also compared after every park.
    pub orphan_check: Duration,
    /// Limits the argument blob is decoded against.
    pub arg_limits: ArgLimits,
    /// Run after every publication the parent acts on — `TASK_DONE`, `TASK_FAILED`
    /// (including the ones written on shutdown), `FRAME_STAGED` and `CONTROL_DONE` in
    /// [`Child::serve`], and `INIT_READY`/`INIT_FAILED` in [`Child::init_ready`] /
    /// [`Child::init_failed`] — always after the releasing state store. `None` (the
    /// default) runs nothing.
    pub on_publish: Option<PublishHook>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            wait: WaitOptions::new(),
            orphan_check: Duration::from_micros(100),
            arg_limits: ArgLimits::HOST,
            on_publish: None,
        }
    }
}

/// Why [`Child::serve`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServeExit {
    /// The parent requested shutdown (sticky word or `SHUTDOWN` state). Task frames the
    /// child still owned were completed `TASK_FAILED` with [`codes::SHUT_DOWN`].
    Shutdown,
    /// The parent died (`getppid()` changed). The child should exit.
    ParentDied,
}

/// The child's end of a mailbox.
///
/// Typical life: [`Child::init_ready`] (or [`Child::init_failed`]), then
/// [`Child::serve`] until it returns, then `_exit` (a forked child must never unwind
/// into the parent's copied stack frames).
#[derive(Debug)]
pub struct Child {
    mailbox: Mailbox,
    watch: ParentWatch,
    options: ServeOptions,
    blob: Vec<u8>,
    payload: Vec<u8>,
    configs: [Option<(u32, CallConfig)>; 2],
    /// Per task frame: the last argument blob and its decoding. A blob byte-identical to
    /// the previous one on the frame (repeated dispatches of the same call) is not
    /// decoded again.
    decoded: [Option<(Vec<u8>, TaskArgs)>; 2],
}

fn guarded<T>(f: impl FnOnce() -> Result<T, FailureReport>) -> Result<T, FailureReport> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(FailureReport::new(
            codes::HANDLER_PANICKED,
            format!("handler panicked: {}", panic_message(&*payload)),
        )),
    }
}

fn bad_request(message: String) -> FailureReport {
    FailureReport::new(codes::BAD_REQUEST, message)
}

/// Writes a completion: message and code (on failure) and then the releasing state.
fn complete(f: &Frame, outcome: Result<(), FailureReport>, ok: MailboxState, failed: MailboxState) {
    match outcome {
        Ok(()) => {
            f.error_code.store(codes::OK, Ordering::Relaxed);
            f.word().publish(ok.as_raw());
        }
        Err(fail) => {
            f.write_message(&fail.message);
            // Only where the blob does not reach (a blob the child caches stays intact).
            let args_len = f.args_len.load(Ordering::Relaxed) as usize;
            let wait_for = fail
                .wait_for
                .as_ref()
                .map(|w| w.encode())
                .filter(|b| args_len <= WAIT_FOR_OFFSET && b.len() <= WAIT_FOR_MAX_BYTES);
            let len = wait_for.as_ref().map_or(0, |b| {
                f.write_wait_for(b);
                b.len()
            });
            f.wait_for_len.store(len as u32, Ordering::Relaxed);
            f.error_code
                .store(FailureReport::new(fail.code, "").code, Ordering::Relaxed);
            f.word().publish(failed.as_raw());
        }
    }
}

/// States of a task frame the child owns (the parent is waiting for it).
fn child_owned(s: MailboxState) -> bool {
    matches!(
        s,
        MailboxState::TaskReady
            | MailboxState::PrepareReady
            | MailboxState::FrameStaged
            | MailboxState::Activate
            | MailboxState::TaskLaunched
    )
}

impl Child {
    /// The child end of `mailbox`, watching the current parent (`getppid()`).
    ///
    /// Prefer [`Child::with_parent`] with the pid the parent recorded before forking: a
    /// parent that dies between `fork` and this call would go unnoticed.
    pub fn new(mailbox: Mailbox) -> Child {
        Self::with_watch(mailbox, ParentWatch::current())
    }

    /// The child end of `mailbox`, whose parent has pid `parent_pid`.
    pub fn with_parent(mailbox: Mailbox, parent_pid: u32) -> Child {
        Self::with_watch(mailbox, ParentWatch::with_parent(parent_pid))
    }

    fn with_watch(mailbox: Mailbox, watch: ParentWatch) -> Child {
        Child {
            mailbox,
            watch,
            options: ServeOptions::default(),
            blob: Vec::with_capacity(256),
            payload: Vec::new(),
            configs: [None, None],
            decoded: [None, None],
        }
    }

    /// Replaces the serve options.
    pub fn with_options(mut self, options: ServeOptions) -> Child {
        self.options = options;
        self
    }

    /// The serve options.
    pub fn options(&self) -> &ServeOptions {
        &self.options
    }

    /// The mailbox.
    pub fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }

    /// Gives the mailbox back.
    pub fn into_mailbox(self) -> Mailbox {
        self.mailbox
    }

    /// Whether the parent is still alive.
    pub fn parent_alive(&self) -> bool {
        self.watch.is_alive()
    }

    /// Whether the sticky shutdown word is set.
    pub fn shutdown_requested(&self) -> bool {
        self.mailbox.shutdown_requested()
    }

    /// Reports a successful startup: writes `info` (e.g. a pipeline depth) to the result
    /// word and moves the control frame IDLE → `INIT_READY` (compare-exchange, so a
    /// shutdown the parent requested meanwhile is not erased).
    ///
    /// # Errors
    /// [`MailboxError::ShutdownRequested`] if the parent already asked for shutdown;
    /// [`MailboxError::FrameBusy`] if the control frame is not IDLE.
    pub fn init_ready(&mut self, info: u64) -> Result<(), MailboxError> {
        let ctrl = self.mailbox.control();
        ctrl.result.store(info, Ordering::Relaxed);
        ctrl.error_code.store(codes::OK, Ordering::Relaxed);
        self.publish_init(MailboxState::InitReady)
    }

    /// Reports a failed startup: writes code and message (truncated to 255 bytes) and
    /// moves the control frame IDLE → `INIT_FAILED`.
    ///
    /// # Errors
    /// As [`Child::init_ready`].
    pub fn init_failed(&mut self, failure: &FailureReport) -> Result<(), MailboxError> {
        let ctrl = self.mailbox.control();
        ctrl.write_message(&failure.message);
        ctrl.error_code
            .store(FailureReport::new(failure.code, "").code, Ordering::Relaxed);
        self.publish_init(MailboxState::InitFailed)
    }

    fn publish_init(&mut self, to: MailboxState) -> Result<(), MailboxError> {
        let ctrl = self.mailbox.control();
        match ctrl
            .word()
            .compare_publish(MailboxState::Idle.as_raw(), to.as_raw())
        {
            Ok(_) => {
                self.notify();
                Ok(())
            }
            Err(raw) => match MailboxState::decode(raw, FrameId::Control)? {
                MailboxState::Shutdown => Err(MailboxError::ShutdownRequested),
                state => Err(MailboxError::FrameBusy {
                    frame: FrameId::Control,
                    state,
                }),
            },
        }
    }

    /// Serves requests until the parent asks for shutdown or dies.
    ///
    /// Each round: if the sticky shutdown word or the `SHUTDOWN` state is set, complete
    /// every task frame the child still owns with `TASK_FAILED` ([`codes::SHUT_DOWN`])
    /// and return [`ServeExit::Shutdown`]; run `TASK_READY` and `ACTIVATE` frames and
    /// stage `PREPARE_READY` frames through `handler`; answer a `CONTROL_REQUEST`.
    /// While idle, spin for [`ServeOptions::wait`]`.spin`, then park on the three state
    /// words in slices of at most 10 ms; every [`ServeOptions::orphan_check`] of spinning
    /// and after every park, compare `getppid()` with the parent's pid and return
    /// [`ServeExit::ParentDied`] if it changed.
    ///
    /// Requests that fail validation (protocol version, identity, digest, lengths, config
    /// or argument encoding) are answered with [`codes::BAD_REQUEST`] without calling
    /// the handler.
    ///
    /// After each `TASK_DONE`, `TASK_FAILED`, `FRAME_STAGED` or `CONTROL_DONE` it
    /// publishes, it runs [`ServeOptions::on_publish`] (if set).
    ///
    /// # Errors
    /// Only for a broken protocol: a state word holding garbage or a state that is not
    /// valid in its frame. The child should then exit; the parent notices.
    pub fn serve<H: Handler + ?Sized>(
        &mut self,
        handler: &mut H,
    ) -> Result<ServeExit, MailboxError> {
        if !self.watch.is_alive() {
            return Ok(ServeExit::ParentDied);
        }
        loop {
            let Some(mut snap) = self.wait_for_work()? else {
                return Ok(ServeExit::ParentDied);
            };
            if snap.control == MailboxState::Shutdown || self.mailbox.shutdown_requested() {
                self.fail_outstanding()?;
                return Ok(ServeExit::Shutdown);
            }
            for slot in self.publication_order(&mut snap) {
                match snap.task(slot) {
                    MailboxState::TaskReady => self.run(slot, TaskPhase::Run, handler),
                    MailboxState::Activate => self.run(slot, TaskPhase::Activated, handler),
                    MailboxState::PrepareReady => self.prepare(slot, handler),
                    _ => {}
                }
            }
            if snap.control == MailboxState::ControlRequest && self.serve_control(handler)? {
                self.fail_outstanding()?;
                return Ok(ServeExit::Shutdown);
            }
        }
    }

    /// The task frames in the order the parent published them (by dispatch id), so that
    /// the parent's per-worker submit order holds: a frame published while the other one
    /// ran may be the older of two actionable frames. The snapshot read the frames one
    /// after the other, so a frame published just before the one it saw actionable may
    /// have been read too early: it is read again (after the acquiring read of the newer
    /// one, the older publication is visible) and `snap` updated.
    fn publication_order(&self, snap: &mut Snapshot) -> [TaskSlot; 2] {
        let actionable = |s: MailboxState| {
            matches!(
                s,
                MailboxState::TaskReady | MailboxState::Activate | MailboxState::PrepareReady
            )
        };
        let [a, b] = TaskSlot::ALL;
        for (seen, other) in [(a, b), (b, a)] {
            if actionable(snap.task(seen)) && !actionable(snap.task(other)) {
                let raw = self.mailbox.task(other).state.load(Ordering::Acquire);
                // A garbage word is reported by the next snapshot.
                if let Ok(live) = MailboxState::decode(raw, FrameId::Task(other)) {
                    if actionable(live) {
                        snap.tasks[other.index()] = live;
                    }
                }
            }
        }
        if actionable(snap.task(a)) && actionable(snap.task(b)) {
            // The identity was written before the state word just acquired.
            let id = |s: TaskSlot| self.mailbox.task(s).dispatch_id.load(Ordering::Relaxed);
            if id(b) < id(a) {
                return [b, a];
            }
        }
        [a, b]
    }

    /// Waits until something is actionable; `None` if the parent died meanwhile.
    fn wait_for_work(&self) -> Result<Option<Snapshot>, MailboxError> {
        let mb = &self.mailbox;
        let (ctrl, t0, t1) = (
            mb.control(),
            mb.task(TaskSlot::Slot0),
            mb.task(TaskSlot::Slot1),
        );
        let watch = self.watch;
        let mut orphaned = false;
        let opts = WaitOptions {
            deadline: None,
            ..self.options.wait
        };
        let r = wait_until(
            [ctrl.word(), t0.word(), t1.word()],
            &opts,
            self.options.orphan_check,
            |s| {
                // Touch the second cache line of each task frame (argument length,
                // digest, start of the blob) while polling, so that when a task arrives
                // its miss overlaps the state line's instead of following it.
                std::hint::black_box(t0.args_len.load(Ordering::Relaxed));
                std::hint::black_box(t1.args_len.load(Ordering::Relaxed));
                let snap = Snapshot::decode(s)?;
                if !snap.control.valid_in_control_frame() {
                    return Err(MailboxError::UnexpectedState {
                        frame: FrameId::Control,
                        state: snap.control,
                    });
                }
                for slot in TaskSlot::ALL {
                    if !snap.task(slot).valid_in_task_frame() {
                        return Err(MailboxError::UnexpectedState {
                            frame: FrameId::Task(slot),
                            state: snap.task(slot),
                        });
                    }
                }
                let actionable = matches!(
                    snap.control,
                    MailboxState::Shutdown | MailboxState::ControlRequest
                ) || snap.tasks.iter().any(|s| {
                    matches!(
                        s,
                        MailboxState::TaskReady
                            | MailboxState::Activate
                            | MailboxState::PrepareReady
                    )
                }) || ctrl.shutdown.load(Ordering::Acquire) != 0;
                Ok(actionable.then_some(snap))
            },
            || {
                if watch.is_alive() {
                    Ok(())
                } else {
                    orphaned = true;
                    Err(MailboxError::PeerGone("the parent process died".into()))
                }
            },
            String::new,
        );
        match r {
            Ok(snap) => Ok(Some(snap)),
            Err(_) if orphaned => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads and validates a task frame into the reusable buffers, the config cache and
    /// the decoded-arguments cache.
    fn load_request(
        &mut self,
        slot: TaskSlot,
    ) -> Result<(FrameIdentity, CallableId), FailureReport> {
        let f = self.mailbox.task(slot);
        let i = slot.index();
        let (protocol, identity) = f.read_identity();
        if protocol != PROTOCOL_VERSION {
            return Err(bad_request(format!(
                "task frame {i} carries protocol version {protocol}; this child speaks {PROTOCOL_VERSION}"
            )));
        }
        identity
            .validate()
            .map_err(|e| bad_request(e.to_string()))?;
        let callable = CallableId(f.read_digest());
        if callable == CallableId::NONE {
            return Err(bad_request(format!(
                "task frame {i} names no callable (all-zero digest)"
            )));
        }
        let len = f.args_len.load(Ordering::Relaxed) as usize;
        if len > ARGS_CAPACITY {
            return Err(bad_request(format!(
                "task frame {i} announces a {len}-byte argument blob; the capacity is {ARGS_CAPACITY}"
            )));
        }
        f.read_args(len, &mut self.blob);
        let epoch = f.config_epoch.load(Ordering::Relaxed);
        if epoch == 0 {
            return Err(bad_request(format!(
                "task frame {i} carries no call configuration"
            )));
        }
        if self.configs[i].as_ref().map(|c| c.0) != Some(epoch) {
            self.configs[i] = None;
            let bytes = f.read_config();
            let config = decode_config(&bytes)
                .map_err(|e| bad_request(format!("task frame {i} call configuration: {e}")))?;
            self.configs[i] = Some((epoch, config));
        }
        let fresh = match &self.decoded[i] {
            Some((blob, _)) => *blob != self.blob,
            None => true,
        };
        if fresh {
            self.decoded[i] = None;
            let args = decode_args(&self.blob, self.options.arg_limits)
                .map_err(|e| bad_request(format!("task frame {i} argument blob: {e}")))?;
            self.decoded[i] = Some((std::mem::take(&mut self.blob), args));
        }
        Ok((identity, callable))
    }

    fn run<H: Handler + ?Sized>(&mut self, slot: TaskSlot, phase: TaskPhase, handler: &mut H) {
        let loaded = self.load_request(slot);
        let f = self.mailbox.task(slot);
        let (ok, failed) = match phase {
            TaskPhase::Activated => (MailboxState::TaskDone, MailboxState::TaskFailed),
            _ => (MailboxState::TaskDone, MailboxState::TaskDone),
        };
        let i = slot.index();
        let outcome = match (&loaded, &self.configs[i], &self.decoded[i]) {
            (Ok((identity, callable)), Some((_, config)), Some((blob, args))) => {
                let req = TaskRequest {
                    slot,
                    phase,
                    identity: *identity,
                    callable: *callable,
                    config,
                    args,
                    args_blob: blob,
                };
                if phase == TaskPhase::Activated {
                    f.accepted.store(1, Ordering::Release);
                    f.word().publish(MailboxState::TaskLaunched.as_raw());
                }
                let r = guarded(|| handler.task(&req));
                // For a TASK_READY frame the launch and the completion coincide: set the
                // accepted word together with the terminal state (same cache line, one
                // hand-off) rather than before the handler.
                f.accepted.store(1, Ordering::Relaxed);
                r
            }
            (Err(fail), _, _) => Err(fail.clone()),
            (Ok(_), _, _) => Err(bad_request("decoded request missing".into())),
        };
        complete(f, outcome, ok, failed);
        self.notify();
    }

    fn prepare<H: Handler + ?Sized>(&mut self, slot: TaskSlot, handler: &mut H) {
        let loaded = self.load_request(slot);
        let f = self.mailbox.task(slot);
        let i = slot.index();
        let outcome = match (&loaded, &self.configs[i], &self.decoded[i]) {
            (Ok((identity, callable)), Some((_, config)), Some((blob, args))) => {
                let req = TaskRequest {
                    slot,
                    phase: TaskPhase::Prepare,
                    identity: *identity,
                    callable: *callable,
                    config,
                    args,
                    args_blob: blob,
                };
                guarded(|| handler.prepare(&req))
            }
            (Err(fail), _, _) => Err(fail.clone()),
            (Ok(_), _, _) => Err(bad_request("decoded request missing".into())),
        };
        match outcome {
            Ok(d) => {
                let d = match d {
                    PrepareDisposition::None => PrepareDisposition::ValidatedOnly,
                    d => d,
                };
                f.disposition.store(d.as_raw(), Ordering::Relaxed);
                f.word().publish(MailboxState::FrameStaged.as_raw());
            }
            Err(fail) => complete(
                f,
                Err(fail),
                MailboxState::TaskDone,
                MailboxState::TaskFailed,
            ),
        }
        self.notify();
    }

    /// Runs the [`ServeOptions::on_publish`] hook, if any (after a publication).
    #[inline]
    fn notify(&self) {
        if let Some(hook) = &self.options.on_publish {
            hook.call();
        }
    }

    /// Answers the pending control request. Returns `true` if the parent requested
    /// shutdown meanwhile (the state moved to `SHUTDOWN`).
    fn serve_control<H: Handler + ?Sized>(
        &mut self,
        handler: &mut H,
    ) -> Result<bool, MailboxError> {
        let ctrl = self.mailbox.control();
        let len = ctrl.args_len.load(Ordering::Relaxed) as usize;
        let outcome = if len > CONTROL_PAYLOAD_CAPACITY {
            Err(bad_request(format!(
                "control payload of {len} bytes exceeds the {CONTROL_PAYLOAD_CAPACITY}-byte area"
            )))
        } else {
            ctrl.read_args(len, &mut self.payload);
            let req = ControlRequest {
                command: ctrl.command.load(Ordering::Relaxed),
                arg0: ctrl.arg0.load(Ordering::Relaxed),
                payload: &self.payload,
            };
            guarded(|| handler.control(&req))
        };
        let outcome = match outcome {
            Ok(reply) if reply.payload.len() > CONTROL_PAYLOAD_CAPACITY => Err(FailureReport::new(
                codes::REPLY_TOO_LARGE,
                format!(
                    "control reply of {} bytes exceeds the {CONTROL_PAYLOAD_CAPACITY}-byte area",
                    reply.payload.len()
                ),
            )),
            other => other,
        };
        match outcome {
            Ok(ControlReply { result, payload }) => {
                ctrl.write_args(&payload);
                ctrl.reply_len
                    .store(payload.len() as u32, Ordering::Relaxed);
                ctrl.result.store(result, Ordering::Relaxed);
                ctrl.error_code.store(codes::OK, Ordering::Relaxed);
            }
            Err(fail) => {
                ctrl.write_message(&fail.message);
                ctrl.reply_len.store(0, Ordering::Relaxed);
                ctrl.error_code.store(fail.code, Ordering::Relaxed);
            }
        }
        match ctrl.word().compare_publish(
            MailboxState::ControlRequest.as_raw(),
            MailboxState::ControlDone.as_raw(),
        ) {
            Ok(_) => {
                self.notify();
                Ok(false)
            }
            Err(raw) => match MailboxState::decode(raw, FrameId::Control)? {
                MailboxState::Shutdown => Ok(true),
                state => Err(MailboxError::UnexpectedState {
                    frame: FrameId::Control,
                    state,
                }),
            },
        }
    }

    /// On shutdown: completes every frame the child still owns with `TASK_FAILED`.
    fn fail_outstanding(&mut self) -> Result<(), MailboxError> {
        let mut published = false;
        for slot in TaskSlot::ALL {
            let f = self.mailbox.task(slot);
            loop {
                let raw = f.word().load();
                let state = MailboxState::decode(raw, FrameId::Task(slot))?;
                if !child_owned(state) {
                    break;
                }
                f.write_message("the child shut down before the task ran");
                f.error_code.store(codes::SHUT_DOWN, Ordering::Relaxed);
                // A CAS: the parent may be activating a staged frame at this moment.
                if f.word()
                    .compare_publish(raw, MailboxState::TaskFailed.as_raw())
                    .is_ok()
                {
                    published = true;
                    break;
                }
            }
        }
        if published {
            self.notify();
        }
        Ok(())
    }
}
