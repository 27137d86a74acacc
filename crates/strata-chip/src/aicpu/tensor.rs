//! Orchestration-side tensors and task arguments: [`ChipTensor`], [`TensorCreateInfo`],
//! [`CoreArgs`], [`MixedKernels`], [`TaskOutputs`], [`ChipTaskId`].

use crate::aicore::kernels::KernelRef;
use crate::error::ChipError;
use strata_graph::{BufferKey, TaskRef};
use strata_types::{ArgLimits, ArgTag, DataType, Element, Scalar, TensorView, MAX_DIMS};

/// A tensor as a chip orchestration sees it: a device buffer (its dependency key, device
/// address and size) and a view of it. Cheap to copy; view operations return new tensors
/// over the same buffer.
///
/// A handle is valid only on the chip and in the run that produced it (it carries the
/// chip's nonce and the run's epoch): device addresses are reused by the next run's
/// rings and staging, and mean nothing on another chip. Using a handle kept from an
/// earlier run fails with [`ChipError::StaleTensor`], one from another chip with
/// [`ChipError::ForeignTensor`]; to use a resident tensor again, pass its
/// [`crate::DeviceTensor`] in the next run's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChipTensor {
    pub(crate) key: BufferKey,
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) view: TensorView,
    pub(crate) manual_dep: bool,
    /// The nonce of the chip whose run produced the handle.
    pub(crate) chip: u64,
    /// The epoch (sequence number) of that run on its chip.
    pub(crate) run: u64,
}

impl ChipTensor {
    /// The view.
    pub fn view(&self) -> &TensorView {
        &self.view
    }

    /// The data type.
    pub fn dtype(&self) -> DataType {
        self.view.dtype()
    }

    /// The shape.
    pub fn shape(&self) -> &[u64] {
        self.view.shape()
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.view.numel()
    }

    /// Device address of the buffer (not of the view's first element).
    pub fn buffer_addr(&self) -> u64 {
        self.addr
    }

    /// Size of the buffer in bytes.
    pub fn buffer_bytes(&self) -> u64 {
        self.size
    }

    /// The run epoch the handle belongs to (the chip's run sequence number).
    pub fn run_epoch(&self) -> u64 {
        self.run
    }

    /// The nonce of the chip the handle belongs to ([`crate::ChipWorker::nonce`]).
    pub fn chip_nonce(&self) -> u64 {
        self.chip
    }

    /// Whether dependency tracking is skipped for this view (`manual_dep`).
    pub fn is_manual_dep(&self) -> bool {
        self.manual_dep
    }

    /// The same view with dependency tracking skipped (`true`) or restored. A task passed
    /// a manual-dep view takes no TensorMap edge for it (only the creator edge of a
    /// runtime-created buffer): order it with explicit dependencies.
    pub fn with_manual_dep(mut self, manual: bool) -> Self {
        self.manual_dep = manual;
        self
    }

    /// The same buffer through another view (checked to fit).
    ///
    /// # Errors
    /// [`ChipError::Types`] if it does not fit the buffer.
    pub fn with_view(mut self, view: TensorView) -> Result<Self, ChipError> {
        view.check_fits(self.size)?;
        self.view = view;
        Ok(self)
    }

    /// `start..end` along `axis` (see [`TensorView::slice`]).
    ///
    /// # Errors
    /// [`ChipError::Types`] for an invalid range.
    pub fn slice(self, axis: usize, start: u64, end: u64) -> Result<Self, ChipError> {
        let v = self.view.slice(axis, start, end)?;
        self.with_view(v)
    }

    /// A window `origin .. origin + shape` (see [`TensorView::window`]).
    ///
    /// # Errors
    /// [`ChipError::Types`] for an invalid window.
    pub fn window(self, origin: &[u64], shape: &[u64]) -> Result<Self, ChipError> {
        let v = self.view.window(origin, shape)?;
        self.with_view(v)
    }

    /// Axes `a` and `b` swapped.
    ///
    /// # Errors
    /// [`ChipError::Types`] for an invalid axis.
    pub fn transpose(self, a: usize, b: usize) -> Result<Self, ChipError> {
        let v = self.view.transpose(a, b)?;
        self.with_view(v)
    }

    /// Axes permuted.
    ///
    /// # Errors
    /// [`ChipError::Types`] for an invalid permutation.
    pub fn permute(self, order: &[usize]) -> Result<Self, ChipError> {
        let v = self.view.permute(order)?;
        self.with_view(v)
    }

    /// A contiguous view reshaped.
    ///
    /// # Errors
    /// [`ChipError::Types`] if the view is not contiguous or the element count differs.
    pub fn reshape(self, shape: &[u64]) -> Result<Self, ChipError> {
        let v = self.view.reshape(shape)?;
        self.with_view(v)
    }
}

/// A tensor the runtime allocates for a task (an `OUTPUT` argument): shape, data type,
/// optional initial value. It is contiguous, lives in the heap ring of the scope the task
/// is submitted in, and is reclaimed when that scope has ended and every task that uses
/// it finished. Without an initial value its contents are undefined.
///
/// ```
/// use strata_chip::TensorCreateInfo;
/// use strata_types::DataType;
/// let ci = TensorCreateInfo::new(DataType::F32, &[16, 16]).with_initial_value(77.0f32);
/// assert_eq!(ci.nbytes(), 1024);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorCreateInfo {
    pub(crate) dtype: DataType,
    pub(crate) ndims: usize,
    pub(crate) shape: [u64; MAX_DIMS],
    pub(crate) init: Option<(DataType, [u8; 8])>,
    pub(crate) manual_dep: bool,
}

impl TensorCreateInfo {
    /// A tensor of `shape` (1..=5 axes) elements of `dtype`. An invalid shape is reported
    /// when the task is submitted (INVALID_ARGS).
    pub fn new(dtype: DataType, shape: &[u64]) -> Self {
        let mut s = [0u64; MAX_DIMS];
        let n = shape.len().min(MAX_DIMS);
        s[..n].copy_from_slice(&shape[..n]);
        TensorCreateInfo {
            dtype,
            ndims: if shape.len() > MAX_DIMS {
                MAX_DIMS + 1
            } else {
                n
            },
            shape: s,
            init: None,
            manual_dep: false,
        }
    }

    /// Fills the buffer with `v` when it is allocated (its type must be the tensor's).
    pub fn with_initial_value<T: Element>(mut self, v: T) -> Self {
        let mut bytes = [0u8; 8];
        bytes[..std::mem::size_of::<T>()]
            .copy_from_slice(crate::device::arena::as_bytes(std::slice::from_ref(&v)));
        self.init = Some((T::DTYPE, bytes));
        self
    }

    /// Skips dependency tracking for the created tensor's later uses.
    pub fn with_manual_dep(mut self, manual: bool) -> Self {
        self.manual_dep = manual;
        self
    }

    /// The contiguous view the tensor will have.
    ///
    /// # Errors
    /// [`ChipError::Types`] for a bad shape; [`ChipError::DtypeMismatch`] if the initial
    /// value has another type.
    pub fn view(&self) -> Result<TensorView, ChipError> {
        if let Some((d, _)) = self.init {
            if d != self.dtype {
                return Err(ChipError::DtypeMismatch {
                    have: self.dtype,
                    want: d,
                });
            }
        }
        let shape = if self.ndims > MAX_DIMS {
            &[][..]
        } else {
            &self.shape[..self.ndims]
        };
        Ok(TensorView::contiguous(self.dtype, shape)?)
    }

    /// Bytes of data (before 1024-byte alignment); `u64::MAX` when the shape's product
    /// overflows a u64 (such a tensor is refused by [`TensorCreateInfo::view`], and
    /// [`TensorCreateInfo::checked_nbytes`] says so).
    pub fn nbytes(&self) -> u64 {
        self.checked_nbytes().unwrap_or(u64::MAX)
    }

    /// Bytes of data, checked.
    ///
    /// # Errors
    /// [`ChipError::Types`] (geometry overflow) when the elements' bytes do not fit a u64.
    pub fn checked_nbytes(&self) -> Result<u64, ChipError> {
        let shape = &self.shape[..self.ndims.min(MAX_DIMS)];
        shape
            .iter()
            .try_fold(self.dtype.size_bytes() as u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| {
                ChipError::Types(strata_types::TypesError::GeometryOverflow {
                    shape: shape.to_vec(),
                    strides: Vec::new(),
                })
            })
    }
}

/// The id of a submitted task, usable as an explicit dependency of later tasks of the same
/// run. [`ChipTaskId::INVALID`] names no task (the reference's null id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChipTaskId(pub(crate) Option<TaskRef>);

impl ChipTaskId {
    /// No task: using it as a dependency is an INVALID_ARGS fatal.
    pub const INVALID: ChipTaskId = ChipTaskId(None);

    /// The graph task id (unique per chip), if valid.
    pub fn id(&self) -> Option<u64> {
        self.0.map(|t| t.id().0)
    }
}

impl std::fmt::Display for ChipTaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(t) => write!(f, "{t}"),
            None => f.write_str("task#invalid"),
        }
    }
}

/// What a submit returns: the task's id and the tensors the runtime created for its
/// `OUTPUT` arguments, in the order they were added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskOutputs {
    pub(crate) task: Option<TaskRef>,
    pub(crate) outputs: Vec<ChipTensor>,
}

impl TaskOutputs {
    /// The task id (for explicit dependencies).
    pub fn task_id(&self) -> ChipTaskId {
        ChipTaskId(self.task)
    }

    /// The `i`-th runtime-created output tensor.
    ///
    /// # Errors
    /// [`ChipError::InvalidRunArgs`] if there is no such output.
    pub fn get(&self, i: usize) -> Result<ChipTensor, ChipError> {
        self.outputs.get(i).copied().ok_or_else(|| {
            ChipError::InvalidRunArgs(format!(
                "the task created {} output tensors; there is no output {i}",
                self.outputs.len()
            ))
        })
    }

    /// Number of created outputs.
    pub fn len(&self) -> usize {
        self.outputs.len()
    }

    /// Whether the task created no tensor.
    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ArgTensor {
    Existing(ChipTensor, ArgTag),
    Create(TensorCreateInfo),
}

/// The arguments of one kernel task (the reference's `Arg<32, 16>`): tensors with their
/// tags, then scalars (raw 64-bit patterns), explicit dependencies, and the SPMD launch
/// spec. Builder calls chain; a misuse (tensor after scalar, over capacity) is recorded
/// and reported by the submit as INVALID_ARGS (code 5), as in the reference.
///
/// ```
/// use strata_chip::{CoreArgs, TensorCreateInfo};
/// use strata_types::DataType;
/// let mut args = CoreArgs::new();
/// args.output_new(TensorCreateInfo::new(DataType::F32, &[1024])).scalar(2.0f32).block_num(4);
/// assert_eq!((args.tensor_count(), args.scalar_count()), (1, 1));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CoreArgs {
    pub(crate) tensors: Vec<ArgTensor>,
    pub(crate) scalars: Vec<u64>,
    pub(crate) deps: Vec<ChipTaskId>,
    pub(crate) block_num: u32,
    pub(crate) sync_start: bool,
    pub(crate) error: Option<String>,
}

impl Default for CoreArgs {
    fn default() -> Self {
        CoreArgs {
            tensors: Vec::new(),
            scalars: Vec::new(),
            deps: Vec::new(),
            block_num: 1,
            sync_start: false,
            error: None,
        }
    }
}

impl CoreArgs {
    /// Empty arguments (one block).
    pub fn new() -> Self {
        CoreArgs::default()
    }

    fn fail(&mut self, msg: String) {
        if self.error.is_none() {
            self.error = Some(msg);
        }
    }

    fn push_tensor(&mut self, t: ArgTensor) -> &mut Self {
        let max = ArgLimits::CHIP_TASK.max_tensors;
        if !self.scalars.is_empty() {
            self.fail(format!(
                "tensor argument {} added after a scalar: add every tensor before the first scalar",
                self.tensors.len()
            ));
        } else if self.tensors.len() >= max {
            self.fail(format!("more than {max} tensor arguments: split the task"));
        } else {
            self.tensors.push(t);
        }
        self
    }

    /// Adds a tensor the task reads (INPUT).
    pub fn input(&mut self, t: &ChipTensor) -> &mut Self {
        self.push_tensor(ArgTensor::Existing(*t, ArgTag::Input))
    }

    /// Adds an existing tensor the task writes without reading (OUTPUT_EXISTING).
    pub fn output(&mut self, t: &ChipTensor) -> &mut Self {
        self.push_tensor(ArgTensor::Existing(*t, ArgTag::OutputExisting))
    }

    /// Asks the runtime to allocate an output tensor for the task (OUTPUT); it is returned
    /// in [`TaskOutputs`].
    pub fn output_new(&mut self, ci: TensorCreateInfo) -> &mut Self {
        self.push_tensor(ArgTensor::Create(ci))
    }

    /// Adds a tensor the task reads and writes (INOUT).
    pub fn inout(&mut self, t: &ChipTensor) -> &mut Self {
        self.push_tensor(ArgTensor::Existing(*t, ArgTag::InOut))
    }

    /// Adds a tensor passed to the kernel without dependency tracking (NO_DEP): ordering
    /// against it is the orchestration's job (explicit dependencies), and kernels reach it
    /// only through the `unsafe` `KernelCtx::untracked` accessor.
    pub fn no_dep(&mut self, t: &ChipTensor) -> &mut Self {
        self.push_tensor(ArgTensor::Existing(*t, ArgTag::NoDep))
    }

    /// Adds a tensor with an explicit tag (`OUTPUT` is not allowed here: use
    /// [`CoreArgs::output_new`] or [`CoreArgs::output`]).
    pub fn tensor(&mut self, t: &ChipTensor, tag: ArgTag) -> &mut Self {
        if tag == ArgTag::Output {
            self.fail("an existing tensor cannot be tagged OUTPUT: use output() (OUTPUT_EXISTING) or output_new(TensorCreateInfo)".into());
            return self;
        }
        self.push_tensor(ArgTensor::Existing(*t, tag))
    }

    /// Adds a scalar (stored as its raw bits, zero-extended).
    pub fn scalar<S: Scalar>(&mut self, v: S) -> &mut Self {
        self.scalar_bits(v.to_bits())
    }

    /// Adds a raw 64-bit scalar.
    pub fn scalar_bits(&mut self, bits: u64) -> &mut Self {
        let max = ArgLimits::CHIP_TASK.max_scalars;
        if self.scalars.len() >= max {
            self.fail(format!(
                "more than {max} scalar arguments: pass the rest in a tensor"
            ));
        } else {
            self.scalars.push(bits);
        }
        self
    }

    /// Adds several raw scalars.
    pub fn scalars(&mut self, bits: &[u64]) -> &mut Self {
        for &b in bits {
            self.scalar_bits(b);
        }
        self
    }

    /// Adds an explicit dependency on an earlier task of the run.
    pub fn dep(&mut self, t: ChipTaskId) -> &mut Self {
        self.deps.push(t);
        self
    }

    /// Sets the explicit dependencies (replacing earlier ones; an empty list clears them).
    pub fn set_dependencies(&mut self, deps: &[ChipTaskId]) -> &mut Self {
        self.deps.clear();
        self.deps.extend_from_slice(deps);
        self
    }

    /// Runs the task as `n` SPMD blocks (1..=32767; default 1). Every block runs every
    /// kernel of the task with its own `block_idx`.
    pub fn block_num(&mut self, n: u32) -> &mut Self {
        if n == 0 || n > i16::MAX as u32 {
            self.fail(format!("block_num = {n} (must be in 1..=32767)"));
        } else {
            self.block_num = n;
        }
        self
    }

    /// Requires every block to start at once (each on its own core), or the submit fails
    /// with REQUIRE_SYNC_START_INVALID (7) if the chip has too few cores.
    pub fn require_sync_start(&mut self, on: bool) -> &mut Self {
        self.sync_start = on;
        self
    }

    /// Number of tensor arguments.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Number of scalar arguments.
    pub fn scalar_count(&self) -> usize {
        self.scalars.len()
    }

    /// Clears everything (to reuse the builder).
    pub fn clear(&mut self) -> &mut Self {
        *self = CoreArgs::default();
        self
    }
}

/// The kernels of one task: any non-empty combination of an AIC kernel and the two AIV
/// lanes of a cluster. One kernel is an AIC or AIV task; two or three make a MIX task,
/// placed on one cluster, every kernel getting the same arguments.
///
/// ```
/// use strata_chip::MixedKernels;
/// let mix = MixedKernels::none().with_aic(0u32).with_aiv0(1u32).with_aiv1(2u32);
/// assert_eq!(mix.mask(), 0b111);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MixedKernels {
    /// The cube kernel.
    pub aic: Option<KernelRef>,
    /// The vector kernel of lane 0.
    pub aiv0: Option<KernelRef>,
    /// The vector kernel of lane 1.
    pub aiv1: Option<KernelRef>,
}

impl MixedKernels {
    /// No kernel (a dependency-only task).
    pub fn none() -> Self {
        MixedKernels::default()
    }

    /// Sets the AIC kernel.
    pub fn with_aic(mut self, k: impl Into<KernelRef>) -> Self {
        self.aic = Some(k.into());
        self
    }

    /// Sets the AIV lane-0 kernel.
    pub fn with_aiv0(mut self, k: impl Into<KernelRef>) -> Self {
        self.aiv0 = Some(k.into());
        self
    }

    /// Sets the AIV lane-1 kernel.
    pub fn with_aiv1(mut self, k: impl Into<KernelRef>) -> Self {
        self.aiv1 = Some(k.into());
        self
    }

    /// The reference's active mask: AIC = 1, AIV0 = 2, AIV1 = 4.
    pub fn mask(&self) -> u8 {
        (self.aic.is_some() as u8)
            | ((self.aiv0.is_some() as u8) << 1)
            | ((self.aiv1.is_some() as u8) << 2)
    }
}

#[cfg(test)]
mod tests {
    use super::TensorCreateInfo;
    use strata_types::DataType;

    #[test]
    fn nbytes_of_a_shape_whose_product_overflows_saturates_and_is_an_error_when_checked() {
        let ci = TensorCreateInfo::new(DataType::F32, &[u64::MAX / 2, 3]);
        assert_eq!(ci.nbytes(), u64::MAX);
        let err = ci.checked_nbytes().unwrap_err().to_string();
        assert!(err.contains("overflow"), "{err}");
        assert!(ci.view().is_err());
        let ok = TensorCreateInfo::new(DataType::F32, &[1 << 20, 4]);
        assert_eq!(ok.checked_nbytes().unwrap(), 16 << 20);
    }
}
