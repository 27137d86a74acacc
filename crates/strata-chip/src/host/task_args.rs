//! The one conversion of a level-independent argument list (`strata_types::TaskArgs`,
//! what a host orchestration submits and a mailbox frame carries) into the arguments of a
//! chip run ([`RunArgs`]). Used by the level-2 facade and by the engine's chip child.

use crate::error::ChipError;
use crate::host::args::RunArgs;
use crate::host::worker::ChipWorker;
use strata_types::{BufferLocation, TaskArgs};

/// Why a `TaskArgs` tensor cannot be an argument of a run on this chip.
#[derive(Debug, thiserror::Error)]
pub enum TaskArgsError {
    /// An argument its builder recorded as invalid ([`TaskArgs::check`]), naming it.
    #[error("invalid run arguments: {0}")]
    Invalid(strata_types::TypesError),
    /// A shared-memory tensor whose bytes are not mapped here (the resolver's message).
    #[error("tensor {index}: {message}")]
    Shared {
        /// The tensor's position.
        index: usize,
        /// Why the resolver refused it.
        message: String,
    },
    /// A tensor in the device memory of another chip.
    #[error("tensor {index} is in the device memory of worker {owner}, not this chip ({chip})")]
    OtherChip {
        /// The tensor's position.
        index: usize,
        /// The worker whose memory holds it.
        owner: u32,
        /// This chip's worker id.
        chip: u32,
    },
    /// A device tensor that is not a live allocation of this chip, or does not fit it.
    #[error("tensor {index}: {source}")]
    Device {
        /// The tensor's position.
        index: usize,
        /// The chip's error.
        #[source]
        source: ChipError,
    },
    /// A tensor in some process's private memory, which this chip cannot reach.
    #[error("tensor {index} is in the parent's private memory, which this process cannot see")]
    HostLocal {
        /// The tensor's position.
        index: usize,
    },
}

impl RunArgs<'static> {
    /// The run arguments for `args` on `chip`: shared-memory tensors are passed by the
    /// address `map_shared(region, offset, len)` returns for their bytes (gathered into
    /// device memory before the run, scattered back after it as their tags say) — except
    /// those in the region of the chip's external memory
    /// ([`ChipWorker::external_region`]), which are passed in place
    /// ([`RunArgs::external`]: distributed windows); device tensors in place (checked
    /// against `chip`'s live allocations; with `worker = Some(id)` a tensor naming another
    /// worker's memory is refused), then the scalars. Tensor `i` of `args` is tensor `i`
    /// of the run.
    ///
    /// # Safety
    /// Every pointer `map_shared` returns must be valid for reads and writes of `len`
    /// bytes for as long as the returned `RunArgs` is used, and nothing else may access
    /// those bytes while a run uses them.
    ///
    /// # Errors
    /// [`TaskArgsError`], naming the tensor ([`TaskArgsError::Invalid`] for an argument its
    /// builder recorded as invalid, before anything is mapped).
    pub unsafe fn from_task_args(
        args: &TaskArgs,
        chip: &ChipWorker,
        worker: Option<u32>,
        mut map_shared: impl FnMut(u64, u64, u64) -> Result<*mut u8, String>,
    ) -> Result<RunArgs<'static>, TaskArgsError> {
        args.check().map_err(TaskArgsError::Invalid)?;
        let mut run = RunArgs::new();
        for (index, t) in args.tensors().iter().enumerate() {
            match t.buffer.location() {
                BufferLocation::HostShared { region, offset }
                    if chip.external_region().is_some_and(|(r, _)| r == region) =>
                {
                    // The chip's external memory (distributed windows): in place.
                    run.external(offset, t.buffer.nbytes(), t.view, t.tag);
                }
                BufferLocation::HostShared { region, offset } => {
                    let base = map_shared(region, offset, t.view.byte_span().1)
                        .map_err(|message| TaskArgsError::Shared { index, message })?;
                    // SAFETY: the caller guarantees `base` is valid for the view's whole
                    // span and not accessed by anything else while the run uses it.
                    unsafe { run.host_raw(base, t.view, t.tag) };
                }
                BufferLocation::Device {
                    worker: owner,
                    addr,
                } => {
                    if let Some(chip_id) = worker.filter(|&id| id != owner) {
                        return Err(TaskArgsError::OtherChip {
                            index,
                            owner,
                            chip: chip_id,
                        });
                    }
                    let dt = chip
                        .device_tensor_at(addr, t.view)
                        .map_err(|source| TaskArgsError::Device { index, source })?;
                    run.device(&dt, t.tag);
                }
                BufferLocation::HostLocal { .. } => {
                    return Err(TaskArgsError::HostLocal { index });
                }
            }
        }
        for &s in args.scalars() {
            run.scalar(s);
        }
        Ok(run)
    }
}
