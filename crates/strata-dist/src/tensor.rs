//! The tensor handles an orchestration holds besides shared tensors and window tensors: a
//! tensor in one chip's device memory, and a runtime-owned intermediate in a heap ring.
//! They are plain values (a buffer and a view), so the device-memory control paths and the
//! orchestration facade both name them without naming each other.

use crate::error::DistError;
use strata_graph::RunId;
use strata_types::{
    ArgTag, BufferDesc, BufferView, IntoTensorArg, TensorArg, TensorView, TypesError,
};

/// A tensor in the device memory of one chip child, allocated with
/// [`Orch::alloc_child_tensor`](crate::Orch::alloc_child_tensor) or
/// [`DistWorker::alloc_child_tensor`](crate::DistWorker::alloc_child_tensor). It stays
/// resident across runs until freed; pass it to tasks of *that* chip only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChildTensor {
    pub(crate) worker: usize,
    pub(crate) addr: u64,
    pub(crate) buffer: BufferDesc,
    pub(crate) view: TensorView,
}

impl ChildTensor {
    /// The chip (next-level worker id) whose memory holds it.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Its view.
    pub fn view(&self) -> TensorView {
        self.view
    }

    /// The whole tensor as a task argument.
    pub fn arg(&self, tag: ArgTag) -> TensorArg {
        TensorArg {
            buffer: self.buffer,
            view: self.view,
            tag,
        }
    }

    /// A sub-view of the tensor as a task argument.
    ///
    /// # Errors
    /// If the view does not fit the tensor's buffer.
    pub fn arg_view(&self, view: TensorView, tag: ArgTag) -> Result<TensorArg, DistError> {
        Ok(TensorArg::new(self.buffer, view, tag)?)
    }

    /// Elements `start..end` of axis `axis`, to pass to a task with a tag (a
    /// [`strata_types::TaskArgs`] chaining method records its error).
    ///
    /// # Errors
    /// As [`TensorView::slice`].
    pub fn slice(&self, axis: usize, start: u64, end: u64) -> Result<BufferView, TypesError> {
        BufferView::new(self.buffer, self.view)?.slice(axis, start, end)
    }
}

/// The whole tensor, for [`strata_types::TaskArgs`]' chaining methods.
impl IntoTensorArg for &ChildTensor {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError> {
        Ok(self.arg(tag))
    }
}

/// The whole intermediate, for [`strata_types::TaskArgs`]' chaining methods.
impl IntoTensorArg for &RunTensor {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError> {
        Ok(self.arg(tag))
    }
}

/// A runtime-owned intermediate in shared memory, allocated with
/// [`Orch::alloc`](crate::Orch::alloc) from the current scope's heap ring. It lives until
/// its scope ends and every task that uses it finished; every child can see it.
///
/// It is tagged with its run: a task of another run (or one submitted after its scope
/// ended) that names it is refused with [`DistError::StaleTensor`], never run over bytes
/// the ring has handed to another intermediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunTensor {
    pub(crate) buffer: BufferDesc,
    pub(crate) view: TensorView,
    pub(crate) run: RunId,
}

impl RunTensor {
    /// The run that allocated it (the only run whose tasks may name it).
    pub fn run(&self) -> RunId {
        self.run
    }

    /// Its view.
    pub fn view(&self) -> TensorView {
        self.view
    }

    /// The whole tensor as a task argument.
    pub fn arg(&self, tag: ArgTag) -> TensorArg {
        TensorArg {
            buffer: self.buffer,
            view: self.view,
            tag,
        }
    }
}
