//! The tensor handle an orchestration holds besides shared tensors, device tensors and
//! window tensors: a runtime-owned intermediate in a heap ring, a plain value (a buffer
//! and a view) tagged with its run.

use strata_graph::RunId;
use strata_types::{ArgTag, BufferDesc, IntoTensorArg, TensorArg, TensorView, TypesError};

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
/// ended) that names it is refused with [`DistError::StaleTensor`](crate::DistError::StaleTensor), never run over bytes
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
