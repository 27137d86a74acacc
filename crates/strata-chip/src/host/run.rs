//! One run of a chip orchestration, as a pipeline of named stages on the host thread:
//! validate → stage in → dispatch (and wait for the reply) → verdict → copy back →
//! report. The stages report their boundaries to a [`RunTimer`]; none of them reads the
//! clock itself.

use super::args::{RunArg, RunArgs};
use super::timer::{Mark, RunTimer};
use super::worker::ChipWorker;
use crate::aicore::kernels::{KernelTable, RunEnv};
use crate::aicpu::orch::{wait_reply, ChipArgs, OrchCallable, OrchMsg, OrchReply, OrchRequest};
use crate::aicpu::registry::OrchHandle;
use crate::aicpu::sched::{RunCtl, SchedReport};
use crate::aicpu::tensor::ChipTensor;
use crate::config::RingSizing;
use crate::device::arena::{external_identity, EXTERNAL_BASE};
use crate::error::{codes, ChipError};
use crate::trace::strace::{strace_text, RunTiming, Span};
use crate::trace::swimlane::Swimlane;
use std::sync::Arc;
use std::time::Duration;
use strata_graph::{BufferKey, KeySpace};
use strata_types::trace::{CoreRecord, ProcessTrace};
use strata_types::{
    ArgTag, CallConfig, CallableDescriptor, ParamDirection, TensorView, RING_COUNT,
};

/// What a successful run reports.
///
/// The run's `[STRACE]` timing is recorded as a few raw timestamps; [`RunReport::spans`]
/// and [`RunReport::strace`] build the spans and their text only when asked for, so a run
/// whose trace nobody reads does not pay for formatting it.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    timing: Option<RunTiming>,
    /// The swimlane, when [`CallConfig::swimlane`] was 1.
    pub swimlane: Option<Swimlane>,
    /// Tasks the orchestration submitted (including dependency-only and allocation tasks).
    pub tasks: u64,
    /// Kernel invocations dispatched to cores.
    pub dispatches: u64,
    /// Notes about cores taken out of or returned to service.
    pub notes: Vec<String>,
}

impl RunReport {
    /// The run's `[STRACE]` spans, children first (empty for a default report).
    pub fn spans(&self) -> Vec<Span> {
        self.timing
            .as_ref()
            .map(RunTiming::spans)
            .unwrap_or_default()
    }

    /// The same spans as `[STRACE]` lines (what [`crate::parse_strace`] reads back).
    pub fn strace(&self) -> String {
        strace_text(&self.spans())
    }

    /// The run as one process of a [`Trace`](strata_types::trace::Trace), named `name`:
    /// its spans with every timestamp on the host's `CLOCK_MONOTONIC` (device spans too:
    /// the emulated device clock is the host's; [`RunReport::spans`] has them relative to
    /// the device origin, as `[STRACE]` does), and its swimlane's core records and core
    /// names when it has one.
    pub fn process_trace(&self, name: &str) -> ProcessTrace {
        let mut p = ProcessTrace::new(name, self.timing.as_ref().map_or(0, |t| t.pid), "");
        self.add_to(&mut p);
        p
    }

    /// Appends the run's spans and core records to `p` (see [`RunReport::process_trace`]).
    pub fn add_to(&self, p: &mut ProcessTrace) {
        if let Some(t) = &self.timing {
            p.spans.extend(t.spans_on_host_clock());
        }
        if let Some(s) = &self.swimlane {
            if p.cores.len() < s.core_types.len() {
                p.cores = s
                    .core_types
                    .iter()
                    .enumerate()
                    .map(|(i, ty)| format!("core {i} ({})", ty.name()))
                    .collect();
            }
            p.records.extend(s.records.iter().map(|r| CoreRecord {
                core: r.core,
                task: r.task,
                block: r.block,
                lane: r.lane,
                kernel: r.kernel.clone(),
                start_ns: r.start_ns,
                end_ns: r.end_ns,
            }));
        }
    }
}

impl ChipWorker {
    /// The run's arguments against the orchestration's signature, if it declares one.
    fn check_signature(desc: &CallableDescriptor, args: &RunArgs<'_>) -> Result<(), ChipError> {
        let sig = desc.signature();
        if sig.is_empty() {
            return Ok(());
        }
        if sig.len() != args.len() {
            return Err(ChipError::InvalidRunArgs(format!(
                "orchestration {:?} takes {} arguments, the run passes {} ({} tensors, {} scalars)",
                desc.name(),
                sig.len(),
                args.len(),
                args.tensors.len(),
                args.scalars.len()
            )));
        }
        for (i, d) in sig.iter().enumerate() {
            let got = match args.tensors.get(i) {
                None => ParamDirection::Scalar,
                Some(RunArg::HostIn { .. }) => ParamDirection::In,
                Some(RunArg::HostOut { inout: false, .. }) => ParamDirection::Out,
                Some(RunArg::HostOut { inout: true, .. }) => ParamDirection::InOut,
                Some(
                    RunArg::Device { tag, .. }
                    | RunArg::HostRaw { tag, .. }
                    | RunArg::External { tag, .. },
                ) => match tag {
                    ArgTag::Input | ArgTag::NoDep => ParamDirection::In,
                    ArgTag::Output | ArgTag::OutputExisting => ParamDirection::Out,
                    ArgTag::InOut => ParamDirection::InOut,
                },
            };
            if got != *d {
                return Err(ChipError::InvalidRunArgs(format!(
                    "argument {i} of orchestration {:?} must be {d:?} but the run passes {got:?}",
                    desc.name()
                )));
            }
        }
        Ok(())
    }

    /// The ring heap regions for `rings`' sizing (reused while the sizing stays).
    fn ensure_rings(
        &mut self,
        rings: &[RingSizing; RING_COUNT],
    ) -> Result<[u64; RING_COUNT], ChipError> {
        let live = self.live.as_mut().expect("checked by caller");
        let mut bases = [0u64; RING_COUNT];
        for r in 0..RING_COUNT {
            let need = rings[r].heap_bytes_aligned();
            match live.ring_regions[r] {
                Some((p, size)) if size == need => bases[r] = p.addr,
                old => {
                    if let Some((p, _)) = old {
                        live.mem.free(&p)?;
                        live.ring_regions[r] = None;
                    }
                    let (p, _) = live.mem.malloc(need).map_err(|e| match e {
                        ChipError::OutOfDeviceMemory { .. } => ChipError::InvalidConfig(format!(
                            "no device memory for ring {r}'s {need}-byte heap ({e}); lower the ring heaps or raise ChipConfig::device_memory_bytes"
                        )),
                        e => e,
                    })?;
                    live.ring_regions[r] = Some((p, need));
                    bases[r] = p.addr;
                }
            }
        }
        Ok(bases)
    }

    /// The host tensors in device memory (one retained staging buffer, `IN`/`INOUT`
    /// copied in) and the resident tensors checked, as the orchestration's arguments.
    fn stage(&mut self, args: &RunArgs<'_>, run: u64) -> Result<ChipArgs, ChipError> {
        let chip_id = self.config.chip_id;
        let nonce = self.nonce;
        let live = self.live.as_mut().expect("checked by caller");
        // Checked: every later offset into the staging buffer is below this total, so once
        // it fits no other sum can overflow.
        let total = args
            .tensors
            .iter()
            .try_fold(0u64, |sum, a| match a {
                RunArg::HostIn { view, .. }
                | RunArg::HostOut { view, .. }
                | RunArg::HostRaw { view, .. } => view
                    .nbytes()
                    .checked_next_multiple_of(1024)
                    .and_then(|b| sum.checked_add(b)),
                RunArg::Device { .. } | RunArg::External { .. } => Some(sum),
            })
            .ok_or_else(|| {
                ChipError::InvalidRunArgs(format!(
                    "the host tensors of the run need more than {} staging bytes (the sum of their sizes, each rounded up to 1024, must fit a u64)",
                    u64::MAX
                ))
            })?;
        if total > 0 && live.staging.is_none_or(|(_, s)| s < total) {
            if let Some((p, _)) = live.staging.take() {
                live.mem.free(&p)?;
            }
            let (p, s) = live.mem.malloc(total)?;
            live.staging = Some((p, s));
        }
        let mut out = ChipArgs::default();
        let mut off = 0u64;
        for a in &args.tensors {
            let view = match a {
                RunArg::HostIn { view, .. }
                | RunArg::HostOut { view, .. }
                | RunArg::HostRaw { view, .. } => Some(view),
                RunArg::Device { .. } | RunArg::External { .. } => None,
            };
            if let Some(view) = view.filter(|v| v.is_empty()) {
                // A zero-size host tensor: address 0 (as in the reference), no staging,
                // nothing copied in or back.
                out.tensors.push(ChipTensor {
                    key: BufferKey::new(live.staged_ids.mint(), KeySpace::Device(chip_id)),
                    addr: 0,
                    size: 0,
                    view: TensorView::contiguous_or_empty(view.dtype(), view.shape())?,
                    manual_dep: false,
                    chip: nonce,
                    run,
                });
                continue;
            }
            match a {
                RunArg::HostIn { view, .. } | RunArg::HostOut { view, .. } => {
                    let (base, _) = live.staging.expect("allocated above");
                    let addr = base.addr + off;
                    let size = view.nbytes().div_ceil(1024) * 1024;
                    off += size;
                    match a {
                        RunArg::HostIn { bytes, .. } => live.mem.arena.write(addr, bytes)?,
                        RunArg::HostOut {
                            bytes, inout: true, ..
                        } => live.mem.arena.write(addr, bytes)?,
                        _ => {}
                    }
                    out.tensors.push(ChipTensor {
                        key: BufferKey::new(live.staged_ids.mint(), KeySpace::Device(chip_id)),
                        addr,
                        size,
                        view: *view,
                        manual_dep: false,
                        chip: nonce,
                        run,
                    });
                }
                RunArg::HostRaw { base, view, tag } => {
                    let (staging, _) = live.staging.expect("allocated above");
                    let addr = staging.addr + off;
                    let size = view.nbytes().div_ceil(1024) * 1024;
                    off += size;
                    if tag.reads() || *tag == ArgTag::NoDep {
                        let mut dst = addr;
                        for (o, len) in view.contiguous_runs() {
                            // SAFETY: the caller of `host_raw` guarantees the view's bytes
                            // are readable for the duration of the run.
                            unsafe { live.mem.arena.write_raw(dst, base.add(o as usize), len)? };
                            dst += len;
                        }
                    }
                    let dense = TensorView::contiguous(view.dtype(), view.shape())?;
                    out.tensors.push(ChipTensor {
                        key: BufferKey::new(live.staged_ids.mint(), KeySpace::Device(chip_id)),
                        addr,
                        size,
                        view: dense,
                        manual_dep: false,
                        chip: nonce,
                        run,
                    });
                }
                RunArg::External {
                    offset, size, view, ..
                } => {
                    let len = live.mem.arena.external().map(|e| e.len()).ok_or_else(|| {
                        ChipError::InvalidRunArgs(
                            "an external-memory argument, but this chip has no external memory (ChipWorker::attach_external_memory)".into(),
                        )
                    })?;
                    if offset.checked_add(*size).is_none_or(|end| end > len) || *size == 0 {
                        return Err(ChipError::InvalidRunArgs(format!(
                            "external buffer of {size} bytes at offset {offset} does not lie in the chip's {len}-byte external memory"
                        )));
                    }
                    view.check_fits(*size)?;
                    out.tensors.push(ChipTensor {
                        key: BufferKey::new(external_identity(*offset), KeySpace::Device(chip_id)),
                        addr: EXTERNAL_BASE + offset,
                        size: *size,
                        view: *view,
                        manual_dep: false,
                        chip: nonce,
                        run,
                    });
                }
                RunArg::Device { t, .. } => {
                    live.mem.check_range(&t.ptr, t.size, "device tensor")?;
                    t.view.check_fits(t.size)?;
                    out.tensors.push(ChipTensor {
                        key: BufferKey::new(t.identity(), KeySpace::Device(chip_id)),
                        addr: t.ptr.addr,
                        size: t.size,
                        view: t.view,
                        manual_dep: false,
                        chip: nonce,
                        run,
                    });
                }
            }
        }
        out.scalars = args.scalars.clone();
        Ok(out)
    }

    /// Runs a registered chip orchestration on `args` and waits for it.
    ///
    /// Host tensors are staged into device memory (`IN`/`INOUT` copied in; `OUT`/`INOUT`
    /// copied back only if the run succeeded); device tensors are passed in place. The
    /// orchestration runs on the orchestrator thread (or, with
    /// [`OrchestratorPlacement::Caller`](crate::OrchestratorPlacement::Caller), on the
    /// calling thread); its tasks run on the cores.
    ///
    /// # Errors
    /// - [`ChipError::InvalidConfig`] for a bad `config` (with [`CallConfig::validate`]'s
    ///   message), [`ChipError::InvalidRunArgs`], [`ChipError::UnknownCallable`];
    /// - a latched [`ChipError::Fatal`] (codes 1–5, 7, 8, 9) naming what to fix;
    /// - [`ChipError::KernelFailed`] (the first failed kernel: name and message),
    ///   [`ChipError::KernelTimeout`] (SCHEDULER_TIMEOUT), [`ChipError::OrchestrationFailed`];
    /// - [`ChipError::Unusable`] if the orchestration itself stopped making progress (the
    ///   chip cannot run again).
    pub fn run(
        &mut self,
        orch: &OrchHandle,
        args: &mut RunArgs<'_>,
        config: &CallConfig,
    ) -> Result<RunReport, ChipError> {
        let mut timer = RunTimer::start();
        // `tracing` spans with the [STRACE] names: a disabled callsite costs one load.
        let run_span =
            tracing::info_span!(target: "strata", "chip.run", chip = self.config.chip_id);
        let _run = run_span.enter();
        let plan = self.validate(orch, args, config)?;
        let live = self.live.as_ref().expect("validated");
        timer.identify(live.pid, &orch.id(), live.device_strace);
        timer.mark(Mark::StageIn);
        let staged = {
            let _bind = tracing::info_span!(target: "strata", "chip.run.bind").entered();
            self.stage_in(&plan, args, &mut timer)?
        };
        timer.mark(Mark::Staged);
        let dispatched = {
            let _runner = tracing::info_span!(target: "strata", "chip.run.runner_run").entered();
            self.dispatch(plan, staged)
        };
        self.quarantine_abandoned();
        let (reply, sched) = dispatched?;
        timer.mark(Mark::Replied);
        let verdict = Self::verdict(&reply, &sched);
        let copied_back = match &verdict {
            Ok(()) => {
                let _validate =
                    tracing::info_span!(target: "strata", "chip.run.validate").entered();
                self.copy_back(args)
            }
            Err(_) => Ok(()),
        };
        timer.mark(Mark::CopiedBack);
        timer.device(&reply, &sched);
        if tracing::enabled!(target: "strata", tracing::Level::DEBUG) {
            // The device phases ran on other threads: they go out as events with their
            // timestamps (ns on CLOCK_MONOTONIC) once the run is over.
            for s in timer
                .timing()
                .spans_on_host_clock()
                .iter()
                .filter(|s| s.is_device())
            {
                tracing::debug!(target: "strata", name = %s.name, ts_ns = s.ts, dur_ns = s.dur, clk = "dev", "device span");
            }
        }
        self.report(timer, verdict.and(copied_back), reply, sched, config)
    }

    /// Builds the run arenas for `config`'s ring sizing now — the ring heaps in device
    /// memory and the orchestrator's task windows and dependency pools — through a run of
    /// an empty orchestration, so the next run with the same sizing starts on them. A
    /// later run with another sizing rebuilds them (one sizing is kept at a time).
    ///
    /// ```
    /// use strata_chip::{ChipConfig, ChipWorker};
    /// use strata_types::CallConfig;
    /// let mut chip = ChipWorker::new(ChipConfig::default())?;
    /// chip.init()?;
    /// let before = chip.committed_device_memory()?;
    /// chip.prewarm(&CallConfig::default())?;
    /// assert!(chip.committed_device_memory()? > before); // the ring heaps are allocated
    /// # Ok::<(), strata_chip::ChipError>(())
    /// ```
    ///
    /// # Errors
    /// An invalid `config`; no device memory for the heaps; a chip that is not
    /// initialised or unusable.
    pub fn prewarm(&mut self, config: &CallConfig) -> Result<(), ChipError> {
        self.live("prewarm")?;
        if let Some(u) = &self.unusable {
            return Err(ChipError::Unusable(u.clone()));
        }
        let rings = self.config.effective_rings(config)?;
        let kernels = self
            .kernels_snapshot
            .get_or_insert_with(|| Arc::new(self.registry.kernels().clone()))
            .clone();
        let plan = RunPlan {
            rings,
            callable: Arc::new(OrchCallable {
                name: "prewarm".into(),
                f: Arc::new(|_, _| Ok(())),
            }),
            kernels,
            timeout: self.config.kernel_timeout,
            swimlane: false,
        };
        let mut timer = RunTimer::start();
        let staged = self.stage_in(&plan, &RunArgs::new(), &mut timer)?;
        let (reply, sched) = self.dispatch(plan, staged)?;
        Self::verdict(&reply, &sched)
    }

    /// Stage 1: everything that can refuse the run before it touches the chip — the
    /// chip's state, the call configuration, the arguments against the orchestration's
    /// signature — and what the later stages need.
    fn validate(
        &mut self,
        orch: &OrchHandle,
        args: &RunArgs<'_>,
        config: &CallConfig,
    ) -> Result<RunPlan, ChipError> {
        self.live("run")?;
        if let Some(u) = &self.unusable {
            return Err(ChipError::Unusable(u.clone()));
        }
        let rings = self.config.effective_rings(config)?;
        if let Some(e) = &args.error {
            return Err(ChipError::InvalidRunArgs(e.clone()));
        }
        let limits = strata_types::ArgLimits::HOST;
        if args.tensors.len() > limits.max_tensors || args.scalars.len() > limits.max_scalars {
            return Err(ChipError::InvalidRunArgs(format!(
                "a run takes at most {} tensors and {} scalars (the reference's entry-argument limits); got {} and {}",
                limits.max_tensors,
                limits.max_scalars,
                args.tensors.len(),
                args.scalars.len()
            )));
        }
        let entry = self.registry.orch_entry(&orch.id())?;
        Self::check_signature(&entry.desc, args)?;
        let callable = entry.callable.clone();
        let kernels = self
            .kernels_snapshot
            .get_or_insert_with(|| Arc::new(self.registry.kernels().clone()))
            .clone();
        let timeout = config.timeout.unwrap_or(self.config.kernel_timeout);
        Ok(RunPlan {
            rings,
            callable,
            kernels,
            timeout,
            swimlane: config.swimlane,
        })
    }

    /// Stage 2: bind the run to device memory — the ring heap regions its sizing needs,
    /// then the host tensors staged in.
    fn stage_in(
        &mut self,
        plan: &RunPlan,
        args: &RunArgs<'_>,
        timer: &mut RunTimer,
    ) -> Result<Staged, ChipError> {
        let reconfigure = self.live.as_ref().expect("validated").rings_current != plan.rings;
        let ring_bases = self.ensure_rings(&plan.rings)?;
        timer.mark(Mark::RingsReady);
        // The run's epoch: every handle it hands the orchestration carries it.
        self.runs += 1;
        let args = self.stage(args, self.runs)?;
        Ok(Staged {
            reconfigure,
            ring_bases,
            args,
            run: self.runs,
        })
    }

    /// Stage 3: hand the run to the orchestrator (its thread, or this one under
    /// [`OrchestratorPlacement::Caller`](crate::OrchestratorPlacement::Caller)) and wait
    /// for its reply and, if the scheduler took part, the scheduler's report. An
    /// orchestration that stops making progress makes the chip unusable.
    fn dispatch(
        &mut self,
        plan: RunPlan,
        staged: Staged,
    ) -> Result<(OrchReply, SchedReport), ChipError> {
        let live = self.live.as_mut().expect("validated");
        live.rings_current = plan.rings;
        let comm_changed = match (&live.env.comm, &self.comm) {
            (None, None) => false,
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
            _ => true,
        };
        if comm_changed || !Arc::ptr_eq(&live.env.kernels, &plan.kernels) {
            // A new environment for the cores (they re-read it when a dispatch carries
            // a new epoch).
            self.epoch += 1;
            live.env = Arc::new(RunEnv::new(
                self.epoch,
                plan.kernels.clone(),
                self.comm.clone(),
            ));
            for l in &live.links {
                *l.env.lock().unwrap_or_else(|e| e.into_inner()) = live.env.clone();
            }
        }
        let run_seq = staged.run;
        let timeout = plan.timeout;
        let req = OrchRequest {
            callable: plan.callable,
            args: staged.args,
            kernels: plan.kernels,
            rings: plan.rings,
            reconfigure: staged.reconfigure,
            ring_bases: staged.ring_bases,
            run: run_seq,
            ctl: RunCtl {
                timing: plan.swimlane,
                timeout,
                env: live.env.clone(),
            },
        };
        let budget = 2 * timeout
            .max(self.config.tensor_wait_timeout)
            .max(self.config.ring_wait_timeout)
            + Duration::from_secs(1);
        let reply = if let Some((orch, dog)) = live.inline.as_mut() {
            // The scheduler wakes whoever orchestrates (ring and tensor waits park).
            live.shared.orch_bell.register_current();
            let _watched = dog.watch.begin(run_seq, budget);
            Some(orch.run_request(&req))
        } else {
            let orch_thread = live.orch_thread.as_ref();
            let orch_alive = || orch_thread.is_some_and(|h| !h.is_finished());
            if !orch_alive() {
                self.unusable = Some("the orchestrator thread is gone".into());
                return Err(ChipError::Unusable(
                    "the orchestrator thread is gone".into(),
                ));
            }
            live.orch_link.request.post(OrchMsg::Run(req));
            wait_reply(
                &live.orch_link,
                &live.heartbeat,
                &live.shared,
                self.config.idle_spin,
                budget,
                orch_alive,
            )
        };
        let Some(reply) = reply else {
            if live.inline.is_none() && live.orch_thread.as_ref().is_none_or(|h| h.is_finished()) {
                let msg = "the orchestrator thread is gone".to_owned();
                self.unusable = Some(msg.clone());
                return Err(ChipError::Unusable(msg));
            }
            let msg = format!(
                "the orchestration made no progress for {} ms (SCHEDULER_TIMEOUT, orchestrator-starvation): its thread is stuck and the chip cannot run again; close it",
                budget.as_millis()
            );
            self.unusable = Some(msg.clone());
            // What the tasks it had submitted were doing when it was given up on.
            let wait_for = live
                .sched
                .wait_for(format!(
                    "the orchestration made no progress for {} ms",
                    budget.as_millis()
                ))
                .map(Box::new);
            return Err(ChipError::Fatal {
                code: codes::SCHEDULER_TIMEOUT,
                message: msg,
                wait_for,
            });
        };
        let sched = if reply.sched_used {
            // The scheduler ran tasks of this run, which is over: take its part of the
            // report (under the scheduler's lock, so after its last pass).
            live.sched.take_report(run_seq)
        } else {
            SchedReport::default()
        };
        Ok((reply, sched))
    }

    /// Stage 6: the report of a run whose verdict and copy-back gave `outcome` — the
    /// `[STRACE]` lines if they are printed (whatever the outcome), the swimlane (and its
    /// file under `output_prefix`).
    fn report(
        &mut self,
        mut timer: RunTimer,
        outcome: Result<(), ChipError>,
        reply: OrchReply,
        sched: SchedReport,
        config: &CallConfig,
    ) -> Result<RunReport, ChipError> {
        let print_strace = self.live.as_ref().expect("validated").print_strace;
        if print_strace {
            timer.mark(Mark::Done);
            eprint!("{}", strace_text(&timer.timing().spans()));
        }
        outcome?;
        let swimlane = config.swimlane.then(|| Swimlane {
            chip: self.config.chip_id,
            core_types: self.core_types(),
            records: sched.swimlane,
        });
        if let (Some(s), Some(prefix)) = (&swimlane, &config.output_prefix) {
            write_swimlane(s, prefix)?;
        }
        if !print_strace {
            timer.mark(Mark::Done);
        }
        Ok(RunReport {
            timing: Some(timer.finish()),
            swimlane,
            tasks: reply.tasks,
            dispatches: sched.dispatches,
            notes: sched.notes,
        })
    }

    /// Stage 4: the run's verdict — the first error among the orchestrator's setup, a
    /// latched fatal error, the failed task the graph reports (as the scheduler typed it)
    /// and the orchestration's own error.
    fn verdict(reply: &OrchReply, sched: &SchedReport) -> Result<(), ChipError> {
        if let Some(e) = &reply.setup_error {
            return Err(e.clone());
        }
        if let Some(e) = &reply.fatal {
            return Err(e.clone());
        }
        match &reply.graph {
            Ok(()) => match &reply.orch_error {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            },
            Err(f) => {
                if let Some((_, e)) = sched.errors.iter().find(|(g, _)| g == f) {
                    return Err(e.clone());
                }
                if let Some(e) = &reply.orch_error {
                    return Err(e.clone());
                }
                Err(ChipError::RunFailed {
                    code: f.code(),
                    message: f.message().to_owned(),
                })
            }
        }
    }

    /// Stage 5 (after a successful verdict only): `OUT`/`INOUT` host tensors copied back
    /// from their staging.
    fn copy_back(&mut self, args: &mut RunArgs<'_>) -> Result<(), ChipError> {
        let live = self.live.as_ref().expect("checked");
        let Some((base, _)) = live.staging else {
            return Ok(());
        };
        let mut off = 0u64;
        for a in args.tensors.iter_mut() {
            match a {
                RunArg::HostIn { view, .. } => off += view.nbytes().div_ceil(1024) * 1024,
                RunArg::HostOut { view, .. } if view.is_empty() => {}
                RunArg::HostOut { bytes, view, .. } => {
                    live.mem.arena.read(base.addr + off, bytes)?;
                    off += view.nbytes().div_ceil(1024) * 1024;
                }
                RunArg::HostRaw {
                    base: host,
                    view,
                    tag,
                } => {
                    if tag.writes() {
                        let mut src = base.addr + off;
                        for (o, len) in view.contiguous_runs() {
                            // SAFETY: the caller of `host_raw` guarantees the view's bytes
                            // are writable until `run` returns.
                            unsafe { live.mem.arena.read_raw(src, host.add(o as usize), len)? };
                            src += len;
                        }
                    }
                    off += view.nbytes().div_ceil(1024) * 1024;
                }
                RunArg::Device { .. } | RunArg::External { .. } => {}
            }
        }
        Ok(())
    }
}

/// What validation found a run needs.
struct RunPlan {
    rings: [RingSizing; RING_COUNT],
    callable: Arc<OrchCallable>,
    kernels: Arc<KernelTable>,
    timeout: Duration,
    /// Record a swimlane ([`CallConfig::swimlane`] is 1).
    swimlane: bool,
}

/// A run bound to device memory.
struct Staged {
    /// The ring sizing changed since the previous run.
    reconfigure: bool,
    ring_bases: [u64; RING_COUNT],
    args: ChipArgs,
    /// The run's epoch (its sequence number on this chip).
    run: u64,
}

/// Writes `<prefix>/chip_swimlane.json`: the directory is created 0700 if missing, and
/// the file is written without following a symlink planted under its name.
fn write_swimlane(s: &Swimlane, prefix: &str) -> Result<(), ChipError> {
    let dir = std::path::Path::new(prefix);
    crate::trace::file::create_trace_dir(dir)
        .and_then(|_| s.write_chrome_json(&dir.join("chip_swimlane.json")))
        .map_err(|e| {
            ChipError::InvalidConfig(format!(
                "writing the swimlane under output_prefix {prefix:?}: {e}"
            ))
        })
}
