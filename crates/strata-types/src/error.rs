//! The error type of this crate.

use thiserror::Error;

/// Everything that can be wrong with a value built from this crate's types.
///
/// Every variant says what was wrong and, where there is one, how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TypesError {
    /// A data-type wire code that names no type.
    #[error("unknown data type code {code}: valid codes are 0..=11 (see DataType)")]
    UnknownDataType {
        /// The code that was read.
        code: u8,
    },
    /// An argument-tag wire code that names no tag.
    #[error("unknown argument tag code {code}: valid codes are 0..=4 (see ArgTag)")]
    UnknownArgTag {
        /// The code that was read.
        code: u8,
    },
    /// A tensor with no dimensions or more than [`crate::MAX_DIMS`].
    #[error(
        "a tensor view needs 1..={max} dimensions, got {got}; reshape it to at most {max} axes"
    )]
    BadRank {
        /// Number of dimensions requested.
        got: usize,
        /// The maximum supported.
        max: usize,
    },
    /// Shape and strides of different lengths.
    #[error("shape has {shape} axes but strides has {strides}; give one stride per axis")]
    StrideCountMismatch {
        /// Length of the shape.
        shape: usize,
        /// Length of the strides.
        strides: usize,
    },
    /// An axis of length zero.
    #[error("axis {axis} has length 0; tensors must have at least one element per axis")]
    EmptyAxis {
        /// The offending axis.
        axis: usize,
    },
    /// A zero stride (broadcasting is not supported).
    #[error("axis {axis} has stride 0; strides are in elements and must be >= 1 (broadcast views are not supported)")]
    ZeroStride {
        /// The offending axis.
        axis: usize,
    },
    /// A byte offset that is not a multiple of the element size.
    #[error(
        "byte offset {byte_offset} is not a multiple of the {dtype} element size ({elem} bytes)"
    )]
    MisalignedOffset {
        /// The offset.
        byte_offset: u64,
        /// Name of the element type.
        dtype: &'static str,
        /// Element size in bytes.
        elem: usize,
    },
    /// Shape/stride arithmetic that does not fit in 64 bits.
    #[error("tensor view geometry overflows 64-bit byte arithmetic (shape {shape:?}, strides {strides:?})")]
    GeometryOverflow {
        /// The shape.
        shape: Vec<u64>,
        /// The strides.
        strides: Vec<u64>,
    },
    /// A view whose bytes reach past the end of its buffer.
    #[error("view spans bytes [{start}, {end}) but its buffer holds only {buffer_bytes} bytes; shrink the view or allocate a larger buffer")]
    ViewOutOfBounds {
        /// First byte the view touches.
        start: u64,
        /// One past the last byte the view touches.
        end: u64,
        /// Size of the backing buffer.
        buffer_bytes: u64,
    },
    /// An axis index outside the view's rank.
    #[error("axis {axis} is out of range for a {ndims}-dimensional view")]
    AxisOutOfRange {
        /// The axis.
        axis: usize,
        /// The view's rank.
        ndims: usize,
    },
    /// A slice/window range that does not fit the axis.
    #[error("range {start}..{end} does not fit axis {axis} of length {len}")]
    RangeOutOfBounds {
        /// The axis.
        axis: usize,
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// Axis length.
        len: u64,
    },
    /// A permutation that is not a permutation of `0..ndims`.
    #[error("{order:?} is not a permutation of the {ndims} axes")]
    BadPermutation {
        /// The order given.
        order: Vec<usize>,
        /// The view's rank.
        ndims: usize,
    },
    /// A reshape of a non-contiguous view or to a different element count.
    #[error("cannot reshape: {reason}")]
    BadReshape {
        /// Why.
        reason: String,
    },
    /// An element index outside a tensor view (wrong coordinate count, or a coordinate
    /// past its axis).
    #[error("index {index:?} does not address an element of a tensor of shape {shape:?}")]
    IndexOutOfBounds {
        /// The index given.
        index: Vec<u64>,
        /// The view's shape.
        shape: Vec<u64>,
    },
    /// A row-major flat element index past the last element.
    #[error("flat index {index} is outside a tensor of {numel} elements")]
    FlatIndexOutOfBounds {
        /// The index given.
        index: u64,
        /// The view's element count.
        numel: u64,
    },
    /// A copy of a slice whose length is not the view's element count.
    #[error("cannot copy {got} elements into a tensor of shape {shape:?} ({numel} elements)")]
    LengthMismatch {
        /// Elements given.
        got: usize,
        /// The view's shape.
        shape: Vec<u64>,
        /// The view's element count.
        numel: u64,
    },
    /// A buffer generation of zero (generations start at 1).
    #[error("buffer generation must be >= 1 (0 is reserved for 'no buffer')")]
    ZeroGeneration,
    /// Too many tensor arguments for the task's limits.
    #[error("task has more than {max} tensor arguments; split it into several tasks")]
    TooManyTensors {
        /// The limit.
        max: usize,
    },
    /// Too many scalar arguments for the task's limits.
    #[error("task has more than {max} scalar arguments; pass the rest in a tensor")]
    TooManyScalars {
        /// The limit.
        max: usize,
    },
    /// A tensor added after a scalar.
    #[error("tensor arguments must all be added before the first scalar (tensor {index} came after a scalar)")]
    TensorAfterScalar {
        /// Index the tensor would have had.
        index: usize,
    },
    /// An argument added with one of [`crate::TaskArgs`]' chaining methods that could not
    /// be one: which argument, and what was wrong with it.
    #[error("{slot}: {reason}")]
    InvalidArgument {
        /// The argument (its index among the tensors or the scalars).
        slot: crate::ArgSlot,
        /// What was wrong.
        reason: Box<TypesError>,
    },
    /// A value a higher layer was asked to turn into a task argument but could not (a
    /// stacked tensor where one shard is needed, a parameter that does not exist, ...):
    /// that layer's message.
    #[error("{0}")]
    NotAnArgument(String),
    /// An invalid value in a [`crate::CallConfig`].
    #[error("invalid CallConfig: {0}")]
    InvalidConfig(String),
    /// A malformed wire encoding (a task frame written by something else).
    #[error("malformed wire data: {0}")]
    Malformed(String),
    /// A buffer too small for a wire encoding.
    #[error("wire buffer holds {capacity} bytes but {needed} are needed")]
    WireTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        capacity: usize,
    },
}
