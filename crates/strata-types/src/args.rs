//! Task arguments: tagged tensors, then scalars.

use crate::error::TypesError;
use crate::identity::BufferIdentity;
use crate::tag::ArgTag;
use crate::view::TensorView;
use half::{bf16, f16};

/// Where a buffer's bytes live, as far as the receiver of a task needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferLocation {
    /// Host shared memory every process of the worker tree can map: a region id (assigned
    /// by the layer that created the region) and a byte offset inside it.
    HostShared {
        /// The region.
        region: u64,
        /// Offset of the buffer inside the region.
        offset: u64,
    },
    /// Memory of one chip: the next-level worker id that owns it and the device address.
    Device {
        /// Worker id of the chip that owns the memory.
        worker: u32,
        /// Device address.
        addr: u64,
    },
    /// Private memory of the submitting process. Valid only in that process; a child
    /// process can not see it.
    HostLocal {
        /// Address in the submitting process.
        addr: u64,
    },
}

impl BufferLocation {
    /// Short name for messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            BufferLocation::HostShared { .. } => "host-shared",
            BufferLocation::Device { .. } => "device",
            BufferLocation::HostLocal { .. } => "host-local",
        }
    }
}

/// A buffer: its identity, size and location.
///
/// Descriptors are built by the runtime only (a `SharedTensor`, a run's intermediate, a
/// chip tensor, a window): the fields are private and the one constructor,
/// [`BufferDesc::from_parts`], is `unsafe`. Dependencies are keyed by the identity, so a
/// descriptor that named live bytes under another identity would let two tasks touch them
/// with no edge between them. A descriptor decoded from bytes ([`crate::wire`]) is only a
/// claim: the runtime checks every descriptor a task names against the buffers it owns
/// before the task is admitted, and refuses one that is stale or forged.
///
/// Safe code cannot write one down:
///
/// ```compile_fail
/// use strata_types::*;
/// let forged = BufferDesc {
///     identity: IdentityMinter::new().mint(),
///     nbytes: 64,
///     location: BufferLocation::HostShared { region: 1, offset: 0 },
/// };
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferDesc {
    identity: BufferIdentity,
    nbytes: u64,
    location: BufferLocation,
}

impl BufferDesc {
    /// A descriptor from its parts.
    ///
    /// # Safety
    /// Only a runtime layer that owns the bytes may build one: the caller guarantees that
    /// `nbytes` bytes at `location` are a buffer it allocated, that every other descriptor
    /// covering any of these bytes carries the same `identity` (so the engine orders every
    /// task touching them), and that the bytes stay allocated while a task may use the
    /// descriptor. Breaking this lets safe task code hold overlapping `&mut`/`&` slices.
    ///
    /// ```
    /// use strata_types::*;
    /// // SAFETY: a doc example: the descriptor is never given to a task.
    /// let d = unsafe {
    ///     BufferDesc::from_parts(IdentityMinter::new().mint(), 64, BufferLocation::HostLocal { addr: 0x1000 })
    /// };
    /// assert_eq!(d.nbytes(), 64);
    /// ```
    pub const unsafe fn from_parts(
        identity: BufferIdentity,
        nbytes: u64,
        location: BufferLocation,
    ) -> Self {
        BufferDesc {
            identity,
            nbytes,
            location,
        }
    }

    /// The identity dependency keys are derived from.
    pub fn identity(&self) -> BufferIdentity {
        self.identity
    }

    /// Size of the whole buffer in bytes.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Where the bytes are.
    pub fn location(&self) -> BufferLocation {
        self.location
    }
}

/// One tensor argument: a view into a buffer and how the task accesses it.
///
/// ```
/// use strata_types::*;
/// let id = IdentityMinter::new().mint();
/// // SAFETY: a doc example: the descriptor is never given to a task.
/// let buf = unsafe { BufferDesc::from_parts(id, 64, BufferLocation::HostLocal { addr: 0x1000 }) };
/// let view = TensorView::contiguous(DataType::F32, &[16]).unwrap();
/// let arg = TensorArg::new(buf, view, ArgTag::Input).unwrap();
/// assert_eq!(arg.tag, ArgTag::Input);
/// let too_big = TensorView::contiguous(DataType::F32, &[17]).unwrap();
/// assert!(TensorArg::new(buf, too_big, ArgTag::Input).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorArg {
    /// The buffer.
    pub buffer: BufferDesc,
    /// The part of the buffer the task sees.
    pub view: TensorView,
    /// How the task accesses it.
    pub tag: ArgTag,
}

impl TensorArg {
    /// A tensor argument, checked to lie inside its buffer.
    ///
    /// # Errors
    /// [`TypesError::ViewOutOfBounds`] if the view reaches past the buffer.
    pub fn new(buffer: BufferDesc, view: TensorView, tag: ArgTag) -> Result<Self, TypesError> {
        view.check_fits(buffer.nbytes())?;
        Ok(TensorArg { buffer, view, tag })
    }

    /// Elements `start..end` of axis `axis` of this argument's view, same buffer and tag.
    ///
    /// # Errors
    /// As [`TensorView::slice`].
    pub fn slice(&self, axis: usize, start: u64, end: u64) -> Result<Self, TypesError> {
        TensorArg::new(self.buffer, self.view.slice(axis, start, end)?, self.tag)
    }

    /// Row `r` (index `r` of axis 0, kept as an axis of length 1): rank `r`'s part of a
    /// tensor whose dimension 0 is the world.
    ///
    /// # Errors
    /// A row past the end, or a view without axes.
    pub fn row(&self, r: usize) -> Result<Self, TypesError> {
        self.slice(0, r as u64, r as u64 + 1)
    }

    /// The same tensor with another tag (e.g. an orchestration forwarding its input to a
    /// task that reads it).
    ///
    /// ```
    /// # use strata_types::*;
    /// # let id = IdentityMinter::new().mint();
    /// # // SAFETY: a doc example: the descriptor is never given to a task.
    /// # let buf = unsafe { BufferDesc::from_parts(id, 64, BufferLocation::HostLocal { addr: 0x1000 }) };
    /// # let view = TensorView::contiguous(DataType::F32, &[16]).unwrap();
    /// let a = TensorArg::new(buf, view, ArgTag::InOut).unwrap();
    /// assert_eq!(a.with_tag(ArgTag::Input).tag, ArgTag::Input);
    /// ```
    #[must_use]
    pub fn with_tag(self, tag: ArgTag) -> Self {
        TensorArg { tag, ..self }
    }

    /// The next-level worker whose device memory holds it, if it is a device tensor: a
    /// level-3 orchestration submits its task to that chip. (A level-4 orchestration sees
    /// the level-3 worker holding it; that worker's orchestration then sees its chip.)
    ///
    /// ```
    /// # use strata_types::*;
    /// # let id = IdentityMinter::new().mint();
    /// # // SAFETY: a doc example: the descriptor is never given to a task.
    /// let dev = unsafe { BufferDesc::from_parts(id, 64, BufferLocation::Device { worker: 3, addr: 0x4000 }) };
    /// let view = TensorView::contiguous(DataType::F32, &[16]).unwrap();
    /// assert_eq!(TensorArg::new(dev, view, ArgTag::Input).unwrap().device_worker(), Some(3));
    /// ```
    pub fn device_worker(&self) -> Option<usize> {
        match self.buffer.location() {
            BufferLocation::Device { worker, .. } => Some(worker as usize),
            _ => None,
        }
    }
}

/// A view into a buffer, not yet tagged: what a tensor handle's `slice` / `window` gives,
/// to be passed to a task with a tag ([`TaskArgs::input`], ...).
///
/// ```
/// use strata_types::*;
/// // SAFETY: a doc example: the descriptor is never given to a task.
/// let buf = unsafe { BufferDesc::from_parts(IdentityMinter::new().mint(), 64, BufferLocation::HostLocal { addr: 0x1000 }) };
/// let whole = BufferView::new(buf, TensorView::contiguous(DataType::F32, &[4, 4])?)?;
/// let rows = whole.slice(0, 1, 3)?;
/// assert_eq!(rows.view().byte_offset(), 16);
/// assert!(whole.window(&[2, 2], &[3, 3]).is_err()); // leaves the tensor
/// # Ok::<(), TypesError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferView {
    buffer: BufferDesc,
    view: TensorView,
}

impl BufferView {
    /// A view into `buffer`, checked to lie inside it.
    ///
    /// # Errors
    /// [`TypesError::ViewOutOfBounds`] if the view reaches past the buffer.
    pub fn new(buffer: BufferDesc, view: TensorView) -> Result<Self, TypesError> {
        view.check_fits(buffer.nbytes())?;
        Ok(BufferView { buffer, view })
    }

    /// The buffer.
    pub fn buffer(&self) -> BufferDesc {
        self.buffer
    }

    /// The view.
    pub fn view(&self) -> TensorView {
        self.view
    }

    /// The same buffer under another view (built from [`BufferView::view`] with
    /// `transpose`, `reshape`, ...).
    ///
    /// # Errors
    /// [`TypesError::ViewOutOfBounds`] if it reaches past the buffer.
    pub fn with_view(&self, view: TensorView) -> Result<Self, TypesError> {
        BufferView::new(self.buffer, view)
    }

    /// Elements `start..end` of axis `axis` ([`TensorView::slice`]).
    ///
    /// # Errors
    /// As [`TensorView::slice`].
    pub fn slice(&self, axis: usize, start: u64, end: u64) -> Result<Self, TypesError> {
        self.with_view(self.view.slice(axis, start, end)?)
    }

    /// The box of `shape` at `origin` ([`TensorView::window`]).
    ///
    /// # Errors
    /// As [`TensorView::window`].
    pub fn window(&self, origin: &[u64], shape: &[u64]) -> Result<Self, TypesError> {
        self.with_view(self.view.window(origin, shape)?)
    }
}

/// Something that becomes a tensor argument once given a tag: a [`TensorArg`] (re-tagged),
/// a [`BufferView`], and each runtime crate's tensor handles by reference (a shared host
/// tensor, a chip tensor, a run's intermediate, a window). A `Result` of one is one too:
/// its error is recorded by [`TaskArgs`]' chaining methods and reported when the
/// arguments are used, so a fallible view can be passed without a `?`.
pub trait IntoTensorArg {
    /// The tensor argument with `tag`.
    ///
    /// # Errors
    /// Why it cannot be one (a view outside its buffer, ...).
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError>;
}

impl IntoTensorArg for TensorArg {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError> {
        Ok(self.with_tag(tag))
    }
}

impl IntoTensorArg for &TensorArg {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError> {
        Ok(self.with_tag(tag))
    }
}

impl IntoTensorArg for BufferView {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError> {
        TensorArg::new(self.buffer, self.view, tag)
    }
}

impl IntoTensorArg for &BufferView {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError> {
        (*self).into_tensor_arg(tag)
    }
}

impl<T: IntoTensorArg, E: Into<TypesError>> IntoTensorArg for Result<T, E> {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, TypesError> {
        self.map_err(Into::into)?.into_tensor_arg(tag)
    }
}

/// Which argument of a task: the `i`-th tensor or the `i`-th scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArgSlot {
    /// Tensor argument `i`.
    Tensor(usize),
    /// Scalar argument `i`.
    Scalar(usize),
}

impl std::fmt::Display for ArgSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgSlot::Tensor(i) => write!(f, "tensor argument {i}"),
            ArgSlot::Scalar(i) => write!(f, "scalar argument {i}"),
        }
    }
}

/// Limits on the number of arguments of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgLimits {
    /// Maximum tensor arguments.
    pub max_tensors: usize,
    /// Maximum scalar arguments.
    pub max_scalars: usize,
}

impl ArgLimits {
    /// Limits of a host-level (L3/L4) task: 256 tensors, 128 scalars.
    pub const HOST: ArgLimits = ArgLimits {
        max_tensors: 256,
        max_scalars: 128,
    };
    /// Limits of a kernel task submitted by a chip orchestration: 32 tensors, 16 scalars.
    pub const CHIP_TASK: ArgLimits = ArgLimits {
        max_tensors: 32,
        max_scalars: 16,
    };
}

impl Default for ArgLimits {
    fn default() -> Self {
        ArgLimits::HOST
    }
}

/// The arguments of one task: tensors first, then scalars (raw 64-bit patterns).
///
/// Build them with the chaining methods — [`TaskArgs::input`], [`TaskArgs::output`],
/// [`TaskArgs::output_existing`], [`TaskArgs::inout`], [`TaskArgs::no_dep`],
/// [`TaskArgs::scalar`] — which take anything that becomes a tensor argument
/// ([`IntoTensorArg`], fallible views included) and record the first invalid argument
/// instead of returning it: whatever uses the arguments (a submit, the wire encoding, a
/// chip run) reports it as [`TypesError::InvalidArgument`] naming the argument, before
/// anything is published. `push_tensor` / `push_scalar` report errors at once instead.
///
/// ```
/// use strata_types::*;
/// // SAFETY: a doc example: the descriptor is never given to a task.
/// let buf = unsafe { BufferDesc::from_parts(IdentityMinter::new().mint(), 64, BufferLocation::HostLocal { addr: 0x1000 }) };
/// let x = BufferView::new(buf, TensorView::contiguous(DataType::F32, &[4, 4])?)?;
/// let args = TaskArgs::new().input(x.slice(0, 0, 2)).output(x.slice(0, 2, 4)).scalar(0.5f32);
/// assert_eq!((args.tensors().len(), args.scalars().len()), (2, 1));
/// args.check()?;
///
/// let bad = TaskArgs::new().input(&x).inout(x.slice(0, 3, 5)); // rows 3..5 of 4
/// let e = bad.check().unwrap_err();
/// assert!(e.to_string().starts_with("tensor argument 1:"), "{e}");
///
/// let mut args = TaskArgs::with_limits(ArgLimits { max_tensors: 1, max_scalars: 2 });
/// args.push_scalar(1.5f32)?;
/// args.push_scalar(-3i32)?;
/// assert_eq!(args.scalar_at::<f32>(0), Some(1.5));
/// assert_eq!(args.scalar_at::<i32>(1), Some(-3));
/// assert!(args.push_scalar(0u64).is_err()); // over the limit
/// # Ok::<(), TypesError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskArgs {
    limits: ArgLimits,
    tensors: Vec<TensorArg>,
    scalars: Vec<u64>,
    /// The first error of a chaining method, reported by [`TaskArgs::check`].
    error: Option<TypesError>,
}

impl TaskArgs {
    /// Empty arguments with host-level limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empty arguments with the given limits.
    pub fn with_limits(limits: ArgLimits) -> Self {
        TaskArgs {
            limits,
            tensors: Vec::new(),
            scalars: Vec::new(),
            error: None,
        }
    }

    /// The limits these arguments are checked against.
    pub fn limits(&self) -> ArgLimits {
        self.limits
    }

    /// Appends a tensor argument, reporting an error at once (see [`TaskArgs::input`] and
    /// its siblings for the chaining form).
    ///
    /// # Errors
    /// [`TypesError::TensorAfterScalar`] once a scalar was pushed;
    /// [`TypesError::TooManyTensors`] past the limit.
    pub fn push_tensor(&mut self, arg: TensorArg) -> Result<&mut Self, TypesError> {
        if !self.scalars.is_empty() {
            return Err(TypesError::TensorAfterScalar {
                index: self.tensors.len(),
            });
        }
        if self.tensors.len() >= self.limits.max_tensors {
            return Err(TypesError::TooManyTensors {
                max: self.limits.max_tensors,
            });
        }
        self.tensors.push(arg);
        Ok(self)
    }

    /// Appends a scalar argument (stored as its raw bits, zero-extended).
    ///
    /// # Errors
    /// [`TypesError::TooManyScalars`] past the limit.
    pub fn push_scalar<S: Scalar>(&mut self, value: S) -> Result<&mut Self, TypesError> {
        self.push_scalar_bits(value.to_bits())
    }

    /// Appends a raw 64-bit scalar.
    ///
    /// # Errors
    /// [`TypesError::TooManyScalars`] past the limit.
    pub fn push_scalar_bits(&mut self, bits: u64) -> Result<&mut Self, TypesError> {
        if self.scalars.len() >= self.limits.max_scalars {
            return Err(TypesError::TooManyScalars {
                max: self.limits.max_scalars,
            });
        }
        self.scalars.push(bits);
        Ok(self)
    }

    fn record(&mut self, slot: ArgSlot, reason: TypesError) {
        if self.error.is_none() {
            self.error = Some(TypesError::InvalidArgument {
                slot,
                reason: Box::new(reason),
            });
        }
    }

    /// Appends `t` as a tensor argument tagged `tag`, or records why it cannot be one.
    /// The chaining form of [`TaskArgs::push_tensor`].
    #[must_use]
    pub fn tensor(mut self, t: impl IntoTensorArg, tag: ArgTag) -> Self {
        let slot = ArgSlot::Tensor(self.tensors.len());
        if let Err(e) = t
            .into_tensor_arg(tag)
            .and_then(|arg| self.push_tensor(arg).map(|_| ()))
        {
            self.record(slot, e);
        }
        self
    }

    /// Appends a tensor the task reads (`INPUT`).
    #[must_use]
    pub fn input(self, t: impl IntoTensorArg) -> Self {
        self.tensor(t, ArgTag::Input)
    }

    /// Appends a tensor the task writes whole without reading (`OUTPUT`).
    #[must_use]
    pub fn output(self, t: impl IntoTensorArg) -> Self {
        self.tensor(t, ArgTag::Output)
    }

    /// Appends an existing tensor the task writes without reading (`OUTPUT_EXISTING`).
    #[must_use]
    pub fn output_existing(self, t: impl IntoTensorArg) -> Self {
        self.tensor(t, ArgTag::OutputExisting)
    }

    /// Appends a tensor the task reads and writes (`INOUT`).
    #[must_use]
    pub fn inout(self, t: impl IntoTensorArg) -> Self {
        self.tensor(t, ArgTag::InOut)
    }

    /// Appends a tensor the engine does not track (`NO_DEP`): ordering it is the caller's
    /// job.
    #[must_use]
    pub fn no_dep(self, t: impl IntoTensorArg) -> Self {
        self.tensor(t, ArgTag::NoDep)
    }

    /// Appends a scalar (its raw bits, zero-extended), or records that there are too many.
    /// The chaining form of [`TaskArgs::push_scalar`].
    #[must_use]
    pub fn scalar<S: Scalar>(self, value: S) -> Self {
        self.scalar_bits(value.to_bits())
    }

    /// Appends a raw 64-bit scalar, or records that there are too many.
    #[must_use]
    pub fn scalar_bits(mut self, bits: u64) -> Self {
        let slot = ArgSlot::Scalar(self.scalars.len());
        if let Err(e) = self.push_scalar_bits(bits) {
            self.record(slot, e);
        }
        self
    }

    /// The first error a chaining method recorded, if any.
    pub fn error(&self) -> Option<&TypesError> {
        self.error.as_ref()
    }

    /// Whether the arguments can be used: the error a chaining method recorded, if any.
    ///
    /// # Errors
    /// [`TypesError::InvalidArgument`], naming the first invalid argument and what was
    /// wrong with it.
    pub fn check(&self) -> Result<(), TypesError> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The tensor arguments, in order.
    pub fn tensors(&self) -> &[TensorArg] {
        &self.tensors
    }

    /// Mutable access to the tensor arguments (to rewrite locations when staging).
    pub fn tensors_mut(&mut self) -> &mut [TensorArg] {
        &mut self.tensors
    }

    /// The raw scalar arguments, in order.
    pub fn scalars(&self) -> &[u64] {
        &self.scalars
    }

    /// Scalar `i` reinterpreted as `S`, if present.
    pub fn scalar_at<S: Scalar>(&self, i: usize) -> Option<S> {
        self.scalars.get(i).map(|&b| S::from_bits(b))
    }

    /// Total number of arguments.
    pub fn len(&self) -> usize {
        self.tensors.len() + self.scalars.len()
    }

    /// Whether there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A value that travels as a 64-bit scalar argument.
///
/// Floats travel as their IEEE bit pattern in the low bits (an `f32` occupies the low 32
/// bits), integers zero-extended from their unsigned bit pattern, as in the reference ABI.
pub trait Scalar: Copy {
    /// The 64-bit pattern.
    fn to_bits(self) -> u64;
    /// Recovers the value from its 64-bit pattern (high bits beyond the type are ignored).
    fn from_bits(bits: u64) -> Self;
}

macro_rules! scalar_int {
    ($($t:ty => $u:ty),*) => {
        $(
            impl Scalar for $t {
                fn to_bits(self) -> u64 { self as $u as u64 }
                fn from_bits(bits: u64) -> Self { bits as $u as $t }
            }
        )*
    };
}
scalar_int!(u8 => u8, i8 => u8, u16 => u16, i16 => u16, u32 => u32, i32 => u32, u64 => u64, i64 => u64, usize => u64);

impl Scalar for bool {
    fn to_bits(self) -> u64 {
        self as u64
    }
    fn from_bits(bits: u64) -> Self {
        bits & 1 == 1
    }
}
impl Scalar for f32 {
    fn to_bits(self) -> u64 {
        f32::to_bits(self) as u64
    }
    fn from_bits(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
}
impl Scalar for f64 {
    fn to_bits(self) -> u64 {
        f64::to_bits(self)
    }
    fn from_bits(bits: u64) -> Self {
        f64::from_bits(bits)
    }
}
impl Scalar for f16 {
    fn to_bits(self) -> u64 {
        f16::to_bits(self) as u64
    }
    fn from_bits(bits: u64) -> Self {
        f16::from_bits(bits as u16)
    }
}
impl Scalar for bf16 {
    fn to_bits(self) -> u64 {
        bf16::to_bits(self) as u64
    }
    fn from_bits(bits: u64) -> Self {
        bf16::from_bits(bits as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DataType, IdentityMinter};

    fn arg(tag: ArgTag) -> TensorArg {
        // SAFETY: a unit test's descriptor, never given to a task.
        let buf = unsafe {
            BufferDesc::from_parts(
                IdentityMinter::new().mint(),
                16,
                BufferLocation::HostLocal { addr: 0 },
            )
        };
        TensorArg::new(
            buf,
            TensorView::contiguous(DataType::U8, &[16]).unwrap(),
            tag,
        )
        .unwrap()
    }

    #[test]
    fn tensors_must_precede_scalars_and_limits_are_enforced() {
        let mut a = TaskArgs::with_limits(ArgLimits {
            max_tensors: 2,
            max_scalars: 1,
        });
        a.push_tensor(arg(ArgTag::Input)).unwrap();
        a.push_tensor(arg(ArgTag::Output)).unwrap();
        assert_eq!(
            a.push_tensor(arg(ArgTag::Input)).unwrap_err(),
            TypesError::TooManyTensors { max: 2 }
        );
        a.push_scalar(7u32).unwrap();
        assert_eq!(
            a.push_tensor(arg(ArgTag::Input)).unwrap_err(),
            TypesError::TensorAfterScalar { index: 2 }
        );
        assert_eq!(
            a.push_scalar(8u32).unwrap_err(),
            TypesError::TooManyScalars { max: 1 }
        );
        assert_eq!(a.len(), 3);
    }

    #[test]
    // `&ok` exercises the by-reference impl.
    #[allow(clippy::needless_borrows_for_generic_args)]
    fn chaining_records_the_first_invalid_argument_and_keeps_going() {
        let ok = arg(ArgTag::Input);
        let outside = BufferView::new(ok.buffer, ok.view)
            .unwrap()
            .slice(0, 8, 24)
            .map(|v| v.into_tensor_arg(ArgTag::Input));
        assert!(outside.is_err());
        let small = TaskArgs::with_limits(ArgLimits {
            max_tensors: 2,
            max_scalars: 1,
        });
        let a = small
            .clone()
            .input(ok)
            .inout(BufferView::new(ok.buffer, ok.view).unwrap().slice(0, 8, 24))
            .output(&ok)
            .scalar(1u8)
            .scalar(2u8);
        assert_eq!(a.tensors().len(), 2);
        assert_eq!(a.tensors()[1].tag, ArgTag::Output);
        let e = a.check().unwrap_err();
        match &e {
            TypesError::InvalidArgument { slot, reason } => {
                assert_eq!(*slot, ArgSlot::Tensor(1));
                assert!(matches!(**reason, TypesError::RangeOutOfBounds { .. }));
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        assert!(
            e.to_string().starts_with("tensor argument 1: range 8..24"),
            "{e}"
        );
        let b = small.scalar(1u8).scalar(2u8).no_dep(ok);
        assert_eq!(
            b.check().unwrap_err().to_string(),
            "scalar argument 1: task has more than 1 scalar arguments; pass the rest in a tensor"
        );
        assert_eq!(b.error(), b.check().err().as_ref());
        let c = TaskArgs::new()
            .output_existing(ok)
            .no_dep(&ok)
            .scalar_bits(7);
        c.check().unwrap();
        assert_eq!(c.tensors()[0].tag, ArgTag::OutputExisting);
        assert_eq!(c.tensors()[1].tag, ArgTag::NoDep);
        assert_eq!(c.scalar_at::<u64>(0), Some(7));
    }

    #[test]
    fn scalar_bit_patterns_match_the_reference_abi() {
        assert_eq!(Scalar::to_bits(1.0f32), 0x3f80_0000);
        assert_eq!(Scalar::to_bits(-1i32), 0xffff_ffff);
        assert_eq!(<i32 as Scalar>::from_bits(0xffff_ffff), -1);
        assert_eq!(Scalar::to_bits(-1i64), u64::MAX);
        assert_eq!(
            <f16 as Scalar>::from_bits(Scalar::to_bits(f16::from_f32(2.5))).to_f32(),
            2.5
        );
        assert!(<bool as Scalar>::from_bits(true.to_bits()));
    }
}
