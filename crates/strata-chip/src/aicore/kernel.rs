//! What a kernel sees: [`KernelCtx`] (typed views of its tensors, scalars, SPMD
//! coordinates, cancellation, comm hook), and the type of a kernel ([`KernelFn`]). A kernel
//! returns a [`CallbackResult`] (any error, boxed); [`KernelError`], the error of the
//! context's accessors and a convenient one for kernels' own messages, lives with the
//! crate's other errors.

use crate::aicore::signal::{SignalNote, SignalSlot};
use crate::config::CoreType;
use crate::device::arena::{
    buffer_base, is_external, Arena, AtomicView, ClaimError, Claims, EXTERNAL_BASE,
};
use crate::error::KernelError;
use crate::task::{KTensor, TaskDesc};
use std::any::Any;
use std::sync::Arc;
use strata_sync::sync::{AtomicU64, Ordering};
use strata_types::{
    ArgTag, CallbackResult, Element, Scalar, TensorMut, TensorRef, TensorView, ViewLoan,
};

/// A kernel: runs on an emulated AICore. Its error (any error, boxed) fails the task with
/// the error's message ([`strata_types::error_chain`]).
pub type KernelFn = Arc<dyn Fn(&mut KernelCtx<'_>) -> CallbackResult + Send + Sync>;

/// The context of one kernel invocation: one SPMD block of one subtask (AIC, AIV0 or
/// AIV1) of one task, on one core.
///
/// Tensor access follows the task's argument tags, so it is sound by construction:
/// - [`KernelCtx::input`]: `&[T]`-style read access to an `INPUT` argument;
/// - [`KernelCtx::output`]: exclusive read-write access to a written argument (`OUTPUT`,
///   `OUTPUT_EXISTING`, `INOUT`) — one block/subtask of the task may hold it;
/// - [`KernelCtx::shared`]: element-wise atomic access to any tracked argument, for blocks
///   or subtasks that write disjoint parts of one tensor concurrently;
/// - [`KernelCtx::untracked`] (`unsafe`): slices of a `NO_DEP`/manual-dep argument, whose
///   ordering the orchestration guarantees.
///
/// An argument in the chip's external memory (a window of distributed memory,
/// [`crate::ExternalMemory`]) may be written by peers while the kernel runs: `input` and
/// `output` refuse it; reach it through [`KernelCtx::shared`] or, with strata-comm, as a
/// window (`ctx.window(i)`, built on [`KernelCtx::external_arg`]).
pub struct KernelCtx<'a> {
    pub(crate) desc: &'a TaskDesc,
    pub(crate) arena: &'a Arena,
    pub(crate) block_idx: u32,
    pub(crate) sub_block_id: u32,
    pub(crate) lane: u8,
    pub(crate) core_id: u32,
    pub(crate) core_type: CoreType,
    pub(crate) cancel: &'a AtomicU64,
    /// The core's signal-wait slot.
    pub(crate) signal: &'a SignalSlot,
    pub(crate) seq: u64,
    pub(crate) task_id: u64,
    /// The registered name of the kernel (for its messages).
    pub(crate) kernel_name: &'a str,
    /// The chip's communication context, if it was given one.
    pub(crate) comm: Option<&'a (dyn Any + Send + Sync)>,
}

impl std::fmt::Debug for KernelCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCtx")
            .field("task", &self.task_id)
            .field("block_idx", &self.block_idx)
            .field("block_num", &self.desc.block_num)
            .field("sub_block_id", &self.sub_block_id)
            .field("core", &self.core_id)
            .finish()
    }
}

impl<'a> KernelCtx<'a> {
    /// This block's index, `0..block_num`.
    pub fn block_idx(&self) -> u32 {
        self.block_idx
    }

    /// The task's SPMD block count.
    pub fn block_num(&self) -> u32 {
        self.desc.block_num
    }

    /// The AIV lane (0 or 1) of the core this runs on; 0 on an AIC core.
    pub fn sub_block_id(&self) -> u32 {
        self.sub_block_id
    }

    /// The physical core index (AIC cores first, then AIV cores).
    pub fn core_id(&self) -> u32 {
        self.core_id
    }

    /// The kind of core this runs on.
    pub fn core_type(&self) -> CoreType {
        self.core_type
    }

    /// The task id (unique per chip).
    pub fn task_id(&self) -> u64 {
        self.task_id
    }

    /// The registered name of the running kernel.
    pub fn kernel_name(&self) -> &str {
        self.kernel_name
    }

    /// Number of tensor arguments.
    pub fn tensor_count(&self) -> usize {
        self.desc.tensors.len()
    }

    /// Number of scalar arguments.
    pub fn scalar_count(&self) -> usize {
        self.desc.scalars.len()
    }

    /// The raw scalar arguments.
    pub fn scalars(&self) -> &[u64] {
        &self.desc.scalars
    }

    /// Scalar `i` reinterpreted as `S` (an `f32` from its low 32 bits, ...).
    ///
    /// # Errors
    /// If there is no scalar `i`.
    pub fn scalar<S: Scalar>(&self, i: usize) -> Result<S, KernelError> {
        self.desc
            .scalars
            .get(i)
            .map(|&b| S::from_bits(b))
            .ok_or_else(|| {
                KernelError(format!(
                    "the task has {} scalars; there is no scalar {i}",
                    self.desc.scalars.len()
                ))
            })
    }

    /// The tag of tensor argument `i`.
    ///
    /// # Errors
    /// If there is no tensor argument `i`.
    pub fn tag(&self, i: usize) -> Result<ArgTag, KernelError> {
        Ok(self.arg(i)?.tag)
    }

    /// The view of tensor argument `i`.
    ///
    /// # Errors
    /// If there is no tensor argument `i`.
    pub fn view(&self, i: usize) -> Result<&TensorView, KernelError> {
        Ok(&self.arg(i)?.view)
    }

    /// Whether the scheduler asked this kernel to stop (it exceeded the run's timeout).
    /// Long-running kernels should poll it and return.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) == self.seq
    }

    /// Where a signal wait of this kernel says what it waits on (so a stalled run's error
    /// shows the cell and its value); strata-comm's waits use it.
    pub fn signal_note(&self) -> SignalNote<'a> {
        SignalNote::new(self.signal, self.seq)
    }

    /// The communication context the chip was given for distributed kernels
    /// ([`crate::ChipWorker::set_comm_context`]), if it has type `C`.
    pub fn comm<C: Any>(&self) -> Option<&'a C> {
        self.comm.and_then(|c| c.downcast_ref::<C>())
    }

    fn arg(&self, i: usize) -> Result<&'a KTensor, KernelError> {
        let desc: &'a TaskDesc = self.desc;
        desc.tensors.get(i).ok_or_else(|| {
            KernelError(format!(
                "kernel {:?}: the task has {} tensor arguments; there is no argument {i}",
                self.kernel_name(),
                desc.tensors.len()
            ))
        })
    }

    /// Where tensor argument `i` lies in the chip's external memory ([`ExternalArg`]), for
    /// layers that address external memory themselves (strata-comm's windows).
    ///
    /// # Errors
    /// If there is no argument `i`, or it is not in external memory.
    pub fn external_arg(&self, i: usize) -> Result<ExternalArg, KernelError> {
        let a = self.arg(i)?;
        let addr = self.desc.addr_of(a);
        if !is_external(addr) {
            return Err(KernelError(format!(
                "kernel {:?}: argument {i} is in device memory, not a window (external memory); pass the window itself as the task's argument",
                self.kernel_name()
            )));
        }
        Ok(ExternalArg {
            offset: addr - EXTERNAL_BASE,
            size: a.size,
            view: a.view,
            tag: a.tag,
        })
    }

    /// The error of `input` / `output` on an argument in external memory.
    fn refuse_external(&self, i: usize, a: &KTensor, what: &str) -> Result<(), KernelError> {
        if is_external(self.desc.addr_of(a)) {
            // (Short: the failure of the task names the kernel, and a child's message
            // crosses the mailbox in 255 bytes.)
            return Err(KernelError(format!(
                "argument {i} is a window (peers may write it while the kernel runs): ctx.{what}({i}) cannot lend it as a slice; use ctx.window({i}) (strata_comm::KernelWindows) or ctx.shared({i})"
            )));
        }
        Ok(())
    }

    fn typed<T: Element>(&self, i: usize) -> Result<&'a KTensor, KernelError> {
        let a = self.arg(i)?;
        if a.view.dtype() != T::DTYPE {
            return Err(KernelError(format!(
                "kernel {:?}: argument {i} holds {} elements, not {}",
                self.kernel_name(),
                a.view.dtype(),
                T::DTYPE
            )));
        }
        Ok(a)
    }

    fn owner(&self) -> u32 {
        self.block_idx * 3 + self.lane as u32
    }

    fn claim_error(&self, i: usize, e: ClaimError) -> KernelError {
        let who = |o: u32| {
            format!(
                "block {} {}",
                o / 3,
                ["AIC", "AIV0", "AIV1"][(o % 3) as usize]
            )
        };
        KernelError(match e {
            ClaimError::AlreadyBorrowed => format!(
                "kernel {:?}: argument {i} is already borrowed by a live view in this kernel; drop it first",
                self.kernel_name()
            ),
            ClaimError::OtherOwner(o) => format!(
                "kernel {:?}: argument {i} is held exclusively by {} of this task; blocks and subtasks that share a written tensor must use ctx.shared({i})",
                self.kernel_name(),
                who(o)
            ),
            ClaimError::Shared => format!(
                "kernel {:?}: argument {i} is being accessed element-wise (ctx.shared) by another block or subtask of this task; use ctx.shared({i}) here too",
                self.kernel_name()
            ),
        })
    }

    /// Read access to `INPUT` argument `i` as elements of `T`.
    ///
    /// # Errors
    /// If the argument does not exist, has another type, is written by the task (use
    /// [`KernelCtx::output`]), is untracked (use the `unsafe` [`KernelCtx::untracked`]),
    /// or is a window (use `ctx.window(i)` or [`KernelCtx::shared`]).
    pub fn input<T: Element>(&self, i: usize) -> Result<TensorRef<'a, T>, KernelError> {
        let a = self.typed::<T>(i)?;
        self.refuse_external(i, a, "input")?;
        if !a.tracked {
            return Err(KernelError(format!(
                "kernel {:?}: argument {i} is untracked (NO_DEP or manual_dep): only the unsafe ctx.untracked({i}) reaches it",
                self.kernel_name()
            )));
        }
        if a.tag != ArgTag::Input {
            return Err(KernelError(format!(
                "kernel {:?}: argument {i} is {}: use ctx.output({i}) for read-write access",
                self.kernel_name(),
                a.tag
            )));
        }
        let base = buffer_base(self.arena, self.desc.addr_of(a), a.size, &a.view)
            .map_err(|e| KernelError(e.to_string()))?;
        // SAFETY: `base` is the argument's buffer, checked to lie in the arena (mapped for
        // as long as any core can reach it) with the view inside it; device buffers are
        // 1024-aligned and views element-aligned, and `T` is the view's element type
        // (checked by `typed`). The argument is a tracked INPUT: the graph keeps every
        // writer of these bytes from running while this task runs (module docs of
        // `device::arena`).
        Ok(unsafe { TensorRef::new(base, a.view, None) })
    }

    /// Exclusive read-write access to written argument `i` (`OUTPUT`, `OUTPUT_EXISTING`,
    /// `INOUT`). The first block/subtask of the task to take it keeps it; another one
    /// gets an error (use [`KernelCtx::shared`] for tensors written by several blocks).
    ///
    /// # Errors
    /// If the argument does not exist, has another type, is read-only, untracked, a window
    /// (use `ctx.window(i)` or [`KernelCtx::shared`]), or held by another block/subtask.
    pub fn output<T: Element>(&self, i: usize) -> Result<TensorMut<'a, T>, KernelError> {
        let a = self.typed::<T>(i)?;
        self.refuse_external(i, a, "output")?;
        if !a.tracked {
            return Err(KernelError(format!(
                "kernel {:?}: argument {i} is untracked (NO_DEP or manual_dep): only the unsafe ctx.untracked({i}) reaches it",
                self.kernel_name()
            )));
        }
        if !a.tag.writes() {
            return Err(KernelError(format!(
                "kernel {:?}: argument {i} is {} (read-only): use ctx.input({i})",
                self.kernel_name(),
                a.tag
            )));
        }
        let desc: &'a TaskDesc = self.desc;
        let base = buffer_base(self.arena, desc.addr_of(a), a.size, &a.view)
            .map_err(|e| KernelError(e.to_string()))?;
        let owner = self.owner();
        desc.claims
            .exclusive(i, owner)
            .map_err(|e| self.claim_error(i, e))?;
        let loan = ViewLoan::new(&desc.claims, Claims::token(i, owner));
        // SAFETY: as in `input` for the memory; this (block, subtask) now holds the
        // argument's exclusive claim, released by the loan when the view drops, so no other
        // block or subtask of the task reaches these bytes meanwhile, and the graph keeps
        // every other task that reads or writes them from running.
        Ok(unsafe { TensorMut::new(base, a.view, Some(loan)) })
    }

    /// Element-wise atomic access to tracked argument `i`, usable by every block and
    /// subtask at once. Stores are allowed if the task writes the argument.
    ///
    /// # Errors
    /// If the argument does not exist, has another type, is untracked (use the `unsafe`
    /// [`KernelCtx::untracked`]), or is held exclusively by a block/subtask through
    /// [`KernelCtx::output`].
    pub fn shared<T: Element>(&self, i: usize) -> Result<AtomicView<'a, T>, KernelError> {
        let a = self.typed::<T>(i)?;
        if !a.tracked {
            return Err(KernelError(format!(
                "kernel {:?}: argument {i} is untracked (NO_DEP or manual_dep): only the unsafe ctx.untracked({i}) reaches it",
                self.kernel_name()
            )));
        }
        let desc: &'a TaskDesc = self.desc;
        let writable = a.tag.writes();
        let claim = writable.then_some((&desc.claims, i));
        match AtomicView::new(self.arena, desc.addr_of(a), a.size, a.view, claim, writable) {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(self.claim_error(i, e)),
            Err(e) => Err(KernelError(e.to_string())),
        }
    }

    /// Slice access to an untracked argument (`NO_DEP`, or a manual-dep view).
    ///
    /// # Safety
    /// The graph does not order other tasks against this argument. The caller must
    /// guarantee (through explicit dependencies) that no other task, block or subtask
    /// accesses these elements while the returned view lives, except reads when this
    /// kernel only reads. For a window (external memory) that includes every peer's
    /// kernel: order them with signals first.
    ///
    /// # Errors
    /// If the argument does not exist, has another type, or is tracked (use the safe
    /// accessors).
    pub unsafe fn untracked<T: Element>(&self, i: usize) -> Result<TensorMut<'a, T>, KernelError> {
        let a = self.typed::<T>(i)?;
        if a.tracked {
            return Err(KernelError(format!(
                "kernel {:?}: argument {i} is tracked: use ctx.input/output/shared({i})",
                self.kernel_name()
            )));
        }
        let base = buffer_base(self.arena, self.desc.addr_of(a), a.size, &a.view)
            .map_err(|e| KernelError(e.to_string()))?;
        // SAFETY: as in `input` for the memory; exclusion of other accesses to an untracked
        // argument is this function's caller's obligation.
        Ok(unsafe { TensorMut::new(base, a.view, None) })
    }
}

/// Where a kernel's tensor argument lies in the chip's external memory
/// ([`KernelCtx::external_arg`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExternalArg {
    /// Byte offset of the argument's buffer in the external memory.
    pub offset: u64,
    /// Bytes of the buffer.
    pub size: u64,
    /// The argument's view of its buffer.
    pub view: TensorView,
    /// The argument's tag.
    pub tag: ArgTag,
}
