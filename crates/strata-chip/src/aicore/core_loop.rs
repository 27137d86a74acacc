//! One emulated AICore: a thread that pops dispatch descriptors from its ring, runs the
//! kernel (under `catch_unwind`), and pushes a completion.

use crate::aicore::kernel::KernelCtx;
use crate::aicore::kernels::RunEnv;
use crate::aicore::link::{Completion, CoreLink, CoreMsg, Dispatch};
use crate::config::CoreType;
use crate::device::arena::Arena;
use std::sync::Arc;
use std::time::Duration;
use strata_sync::sync::Ordering;
use strata_sync::{panic_message, Idle, ThreadBell};

/// What a core thread needs.
pub(crate) struct CoreEnv {
    pub(crate) id: u32,
    pub(crate) ty: CoreType,
    pub(crate) link: Arc<CoreLink>,
    pub(crate) sched_bell: Arc<ThreadBell>,
    pub(crate) arena: Arc<Arena>,
    pub(crate) idle_spin: Duration,
}

fn run_one(env: &CoreEnv, run: &RunEnv, d: Dispatch) -> Completion {
    let start_ns = if d.timing { strata_sync::mono_ns() } else { 0 };
    let failure = match run.kernels.kernel_by_func(d.func) {
        None => Some(format!("no kernel in lane {} of task {}", d.lane, d.task_id).into()),
        Some(k) => {
            let mut ctx = KernelCtx {
                desc: &d.desc,
                arena: &env.arena,
                block_idx: d.block,
                sub_block_id: d.sub_block_id,
                lane: d.lane,
                core_id: env.id,
                core_type: env.ty,
                cancel: &env.link.cancel,
                signal: &env.link.signal,
                seq: d.seq,
                task_id: d.task_id,
                kernel_name: &k.name,
                comm: run.comm.as_deref(),
            };
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (k.f)(&mut ctx))) {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(strata_types::error_chain(&*e).into()),
                Err(p) => Some(format!("kernel panicked: {}", panic_message(&*p)).into()),
            }
        }
    };
    let end_ns = if d.timing { strata_sync::mono_ns() } else { 0 };
    Completion {
        seq: d.seq,
        desc: d.desc,
        failure,
        start_ns,
        end_ns,
    }
}

/// The core loop: pop (ACK), run, push completion (FIN), ring the scheduler; idle cores
/// spin, then yield, then park.
pub(crate) fn core_main(env: CoreEnv) {
    env.link.bell.register_current();
    let mut idle = Idle::new(env.idle_spin);
    let mut run: Arc<RunEnv> = env
        .link
        .env
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    loop {
        match env.link.dispatch.pop() {
            Some(CoreMsg::Run(d)) => {
                idle.reset();
                if d.epoch != run.epoch {
                    run = env
                        .link
                        .env
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone();
                }
                let c = run_one(&env, &run, d);
                // The scheduler keeps at most two dispatches outstanding and the ring holds
                // four completions, so this never retries in practice.
                strata_sync::push_retry(c, |c| env.link.completions.push(c), || {});
                env.sched_bell.ring();
            }
            Some(CoreMsg::Exit) => break,
            None => {
                let link = &env.link;
                idle.step(&link.bell, None, || !link.dispatch.is_empty());
            }
        }
    }
    env.link.exited.store(true, Ordering::Release);
}
