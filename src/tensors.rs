//! Tensors a prepared worker keeps in device memory across dispatches: stacked (sharded)
//! tensors, one shard per chip.

use strata_chip::DeviceTensor;
use strata_types::DataType;

/// A tensor sharded along dimension 0 over chips: shard `i` — the host tensor's
/// `[i, ...]` slice — is resident on chip `worker_ids()[i]`. A dispatch that passes it
/// gives each rank's task its own shard (`ProgramTensor::shard`). On a level-4 worker the
/// chips are those of its level-3 children, local or remote, numbered in child order
/// (child 0's chips first), and a shard's [`DeviceTensor::worker`] is the child that
/// holds it (where its task goes; that child's orchestration sees its own chip).
/// Made by
/// [`PreparedWorker::alloc_stacked_tensor`](crate::PreparedWorker::alloc_stacked_tensor);
/// freed with `free_stacked_tensor` or at `close`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackedDeviceTensor {
    pub(crate) shards: Vec<DeviceTensor>,
    pub(crate) full_shape: Vec<u64>,
    pub(crate) dtype: DataType,
    /// The chip of each shard (level 4: numbered across the children).
    pub(crate) placement: Vec<usize>,
}

impl StackedDeviceTensor {
    /// The shards, in order.
    pub fn shards(&self) -> &[DeviceTensor] {
        &self.shards
    }

    /// The chip of each shard, as `alloc_stacked_tensor` numbered them.
    pub fn worker_ids(&self) -> Vec<usize> {
        self.placement.clone()
    }

    /// The full shape `[shards, ...]`.
    pub fn shape(&self) -> &[u64] {
        &self.full_shape
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }
}
