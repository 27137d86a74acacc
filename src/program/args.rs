//! Dispatch arguments: what a caller passes to a program (positional, one per parameter),
//! how they travel to the host orchestration, and what the orchestration sees of them.

use super::signature::{BoundParam, BoundSignature, Direction, ScalarValue};
use crate::error::Error;
use crate::tensors::StackedDeviceTensor;
use strata_chip::DeviceTensor;
use strata_host::SharedTensor;
use strata_types::{ArgTag, BufferLocation, Element, Scalar, TaskArgs, TensorArg, TensorView};

/// One dispatch argument.
///
/// Built with `From`: a `&SharedTensor` (host memory every child sees), a `&DeviceTensor`
/// (resident on one chip), a `&StackedDeviceTensor` (one shard per chip), or a scalar
/// value. A slice or `Vec` converts too, only to be refused with an error that says how to
/// allocate it shared: a child process cannot see private memory.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// A host tensor in shared memory.
    Host(&'a SharedTensor),
    /// A tensor resident in one chip's device memory.
    Device(&'a DeviceTensor),
    /// A tensor sharded over chips.
    Stacked(&'a StackedDeviceTensor),
    /// A scalar.
    Scalar(ScalarValue),
    /// Private host memory (refused at dispatch).
    Private {
        /// Its element type's name.
        what: &'static str,
        /// Its length in elements.
        len: usize,
    },
}

impl<'a> From<&'a SharedTensor> for Arg<'a> {
    fn from(t: &'a SharedTensor) -> Self {
        Arg::Host(t)
    }
}

impl<'a> From<&'a DeviceTensor> for Arg<'a> {
    fn from(t: &'a DeviceTensor) -> Self {
        Arg::Device(t)
    }
}

impl<'a> From<&'a StackedDeviceTensor> for Arg<'a> {
    fn from(t: &'a StackedDeviceTensor) -> Self {
        Arg::Stacked(t)
    }
}

impl<'a, T: Element> From<&'a [T]> for Arg<'a> {
    fn from(s: &'a [T]) -> Self {
        Arg::Private {
            what: std::any::type_name::<T>(),
            len: s.len(),
        }
    }
}

impl<'a, T: Element> From<&'a Vec<T>> for Arg<'a> {
    fn from(s: &'a Vec<T>) -> Self {
        Arg::from(s.as_slice())
    }
}

macro_rules! arg_from_scalar {
    ($($t:ty),*) => {$(
        impl From<$t> for Arg<'_> {
            fn from(v: $t) -> Self {
                Arg::Scalar(ScalarValue::from(v))
            }
        }
    )*};
}
arg_from_scalar!(
    bool,
    u8,
    i8,
    i16,
    i32,
    i64,
    u32,
    u64,
    f32,
    f64,
    strata_types::f16,
    strata_types::bf16
);

impl From<ScalarValue> for Arg<'_> {
    fn from(v: ScalarValue) -> Self {
        Arg::Scalar(v)
    }
}

/// Something that is a dispatch's argument list: a tuple of things that convert into
/// [`Arg`] (`(&x, &y, 2.0f32)`), `()`, or a `Vec`/slice of [`Arg`]s.
pub trait IntoArgs<'a> {
    /// The arguments, in order.
    fn into_args(self) -> Vec<Arg<'a>>;
}

impl<'a> IntoArgs<'a> for Vec<Arg<'a>> {
    fn into_args(self) -> Vec<Arg<'a>> {
        self
    }
}

impl<'a> IntoArgs<'a> for &[Arg<'a>] {
    fn into_args(self) -> Vec<Arg<'a>> {
        self.to_vec()
    }
}

impl<'a> IntoArgs<'a> for () {
    fn into_args(self) -> Vec<Arg<'a>> {
        Vec::new()
    }
}

macro_rules! into_args_tuple {
    ($($name:ident),+) => {
        impl<'a, $($name: Into<Arg<'a>>),+> IntoArgs<'a> for ($($name,)+) {
            #[allow(non_snake_case)]
            fn into_args(self) -> Vec<Arg<'a>> {
                let ($($name,)+) = self;
                vec![$($name.into()),+]
            }
        }
    };
}
into_args_tuple!(A);
into_args_tuple!(A, B);
into_args_tuple!(A, B, C);
into_args_tuple!(A, B, C, D);
into_args_tuple!(A, B, C, D, E);
into_args_tuple!(A, B, C, D, E, F);
into_args_tuple!(A, B, C, D, E, F, G);
into_args_tuple!(A, B, C, D, E, F, G, H);
into_args_tuple!(A, B, C, D, E, F, G, H, I);
into_args_tuple!(A, B, C, D, E, F, G, H, I, J);
into_args_tuple!(A, B, C, D, E, F, G, H, I, J, K);
into_args_tuple!(A, B, C, D, E, F, G, H, I, J, K, L);

/// A dispatch argument held for as long as its dispatch runs (a handle keeps its
/// arguments alive).
#[derive(Debug, Clone)]
pub(crate) enum HeldArg {
    Host(SharedTensor),
    Device(DeviceTensor),
    Stacked(StackedDeviceTensor),
    Scalar(ScalarValue),
}

/// The top bit of a tensor parameter's layout word: the parameter is stacked (its shards
/// follow as consecutive tensor arguments; the low bits count them).
const STACKED: u64 = 1 << 63;

/// Encodes checked dispatch arguments for the host orchestration: the tensors in
/// parameter order (a stacked tensor's shards one after another), then as scalars one
/// layout word per tensor parameter (how many tensor arguments it took, [`STACKED`] if
/// stacked), then the scalar parameters' values (fixed ones included) in order.
pub(crate) fn encode(sig: &BoundSignature, args: &[HeldArg]) -> Result<TaskArgs, Error> {
    let mut t = TaskArgs::new();
    let mut layout = Vec::new();
    let mut scalars = Vec::new();
    let mut given = args.iter();
    for p in &sig.params {
        match p {
            BoundParam::Tensor { direction, .. } => {
                let tag = direction.tag();
                match given.next() {
                    Some(HeldArg::Host(h)) => {
                        t.push_tensor(h.arg(tag))?;
                        layout.push(1);
                    }
                    Some(HeldArg::Device(d)) => {
                        t.push_tensor(d.arg(tag))?;
                        layout.push(1);
                    }
                    Some(HeldArg::Stacked(s)) => {
                        for shard in s.shards() {
                            t.push_tensor(shard.arg(tag))?;
                        }
                        layout.push(STACKED | s.shards().len() as u64);
                    }
                    _ => return Err(Error::Internal("argument kinds were checked".into())),
                }
            }
            BoundParam::Scalar { fixed: Some(v), .. } => scalars.push(v.bits()),
            BoundParam::Scalar { .. } => match given.next() {
                Some(HeldArg::Scalar(v)) => scalars.push(v.bits()),
                _ => return Err(Error::Internal("argument kinds were checked".into())),
            },
        }
    }
    for w in layout.into_iter().chain(scalars) {
        t.push_scalar_bits(w)?;
    }
    Ok(t)
}

/// A tensor argument as a host orchestration sees it: its parameter's name and direction,
/// and the tensor — host memory, a resident device tensor, or a stacked tensor's shards.
#[derive(Debug, Clone)]
pub struct ProgramTensor {
    name: String,
    direction: Direction,
    kind: TensorKind,
}

#[derive(Debug, Clone)]
enum TensorKind {
    Whole(TensorArg),
    Stacked(Vec<TensorArg>),
}

impl ProgramTensor {
    /// The parameter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parameter's direction.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// Whether it is a stacked tensor (use [`ProgramTensor::shard`]).
    pub fn is_stacked(&self) -> bool {
        matches!(self.kind, TensorKind::Stacked(_))
    }

    /// The chip whose memory holds it, if it is a resident device tensor (on a level-4
    /// worker: the level-3 child whose chip holds it, where its task goes; that child's
    /// orchestration finds the chip with `TensorArg::device_worker`).
    pub fn worker(&self) -> Option<usize> {
        match &self.kind {
            TensorKind::Whole(a) => match a.buffer.location() {
                BufferLocation::Device { worker, .. } => Some(worker as usize),
                _ => None,
            },
            TensorKind::Stacked(_) => None,
        }
    }

    fn whole(&self) -> Result<&TensorArg, Error> {
        match &self.kind {
            TensorKind::Whole(a) => Ok(a),
            TensorKind::Stacked(s) => Err(Error::InvalidArgument(format!(
                "{} is a stacked tensor of {} shards: pass shard(r) to rank r's task",
                self.name,
                s.len()
            ))),
        }
    }

    /// Its view (a stacked tensor: refused, see [`ProgramTensor::shard`]).
    ///
    /// # Errors
    /// A stacked tensor.
    pub fn view(&self) -> Result<TensorView, Error> {
        Ok(self.whole()?.view)
    }

    /// The whole tensor as a task argument tagged by its parameter's direction (`In` →
    /// input, `Out` → output into existing memory, `InOut` → read-write).
    ///
    /// # Errors
    /// A stacked tensor (take a shard).
    pub fn arg(&self) -> Result<TensorArg, Error> {
        Ok(*self.whole()?)
    }

    /// The whole tensor as a task argument with an explicit tag.
    ///
    /// # Errors
    /// A stacked tensor.
    pub fn arg_as(&self, tag: ArgTag) -> Result<TensorArg, Error> {
        Ok(self.whole()?.with_tag(tag))
    }

    /// Elements `start..end` of axis `axis` as a task argument tagged by its direction.
    ///
    /// # Errors
    /// A stacked tensor, or a slice outside the tensor.
    pub fn slice(&self, axis: usize, start: u64, end: u64) -> Result<TensorArg, Error> {
        let a = self.whole()?;
        let view = a.view.slice(axis, start, end)?;
        Ok(TensorArg::new(a.buffer, view, a.tag)?)
    }

    /// Row `r` (index `r` of axis 0, kept as an axis of length 1) as a task argument
    /// tagged by its direction: rank `r`'s part of a tensor whose dimension 0 is the world.
    ///
    /// # Errors
    /// A stacked tensor, or a row past the end.
    pub fn row(&self, r: usize) -> Result<TensorArg, Error> {
        self.slice(0, r as u64, r as u64 + 1)
    }

    /// How many shards a stacked tensor has (1 otherwise).
    pub fn shards(&self) -> usize {
        match &self.kind {
            TensorKind::Whole(_) => 1,
            TensorKind::Stacked(s) => s.len(),
        }
    }

    /// The chip shard `i` of a stacked tensor is resident on (where its task must run;
    /// on a level-4 worker, the level-3 child whose chip holds it).
    ///
    /// # Errors
    /// Not a stacked tensor; `i` out of range.
    pub fn shard_worker(&self, i: usize) -> Result<usize, Error> {
        match self.shard(i)?.buffer.location() {
            BufferLocation::Device { worker, .. } => Ok(worker as usize),
            _ => Err(Error::Internal("shards are device tensors".into())),
        }
    }

    /// Shard `i` of a stacked tensor — resident on the chip it was placed on — as a task
    /// argument tagged by its direction.
    ///
    /// # Errors
    /// Not a stacked tensor; `i` out of range.
    pub fn shard(&self, i: usize) -> Result<TensorArg, Error> {
        match &self.kind {
            TensorKind::Stacked(s) => s.get(i).copied().ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{} has {} shards; shard {i} does not exist",
                    self.name,
                    s.len()
                ))
            }),
            TensorKind::Whole(_) => Err(Error::InvalidArgument(format!(
                "{} is not a stacked tensor; use arg() or row(r)",
                self.name
            ))),
        }
    }
}

/// The whole tensor, for `TaskArgs`' chaining methods (a stacked tensor records an error:
/// take a shard).
impl strata_types::IntoTensorArg for &ProgramTensor {
    fn into_tensor_arg(self, tag: ArgTag) -> Result<TensorArg, strata_types::TypesError> {
        Ok(self.arg_as(tag)?)
    }
}

/// The arguments of a dispatch as its host orchestration sees them: by parameter name.
#[derive(Debug, Clone)]
pub struct ProgramArgs {
    program: String,
    tensors: Vec<ProgramTensor>,
    scalars: Vec<(String, ScalarValue)>,
}

impl ProgramArgs {
    /// Decodes what [`encode`] produced (the engine hands the orchestration these task
    /// arguments unchanged).
    pub(crate) fn decode(sig: &BoundSignature, a: &TaskArgs) -> Result<ProgramArgs, Error> {
        let bad = || {
            Error::Internal(format!(
                "program {}: malformed dispatch arguments",
                sig.program
            ))
        };
        let n_tensor_params = sig
            .params
            .iter()
            .filter(|p| matches!(p, BoundParam::Tensor { .. }))
            .count();
        let words = a.scalars();
        if words.len() < n_tensor_params {
            return Err(bad());
        }
        let (layout, mut values) = words.split_at(n_tensor_params);
        let mut layout = layout.iter();
        let mut tensors_in = a.tensors().iter();
        let mut tensors = Vec::new();
        let mut scalars = Vec::new();
        for p in &sig.params {
            match p {
                BoundParam::Tensor {
                    name, direction, ..
                } => {
                    let w = *layout.next().ok_or_else(bad)?;
                    let n = (w & !STACKED) as usize;
                    let mut take = || tensors_in.next().copied().ok_or_else(bad);
                    let kind = if w & STACKED != 0 {
                        TensorKind::Stacked((0..n).map(|_| take()).collect::<Result<_, _>>()?)
                    } else {
                        TensorKind::Whole(take()?)
                    };
                    tensors.push(ProgramTensor {
                        name: name.to_string(),
                        direction: *direction,
                        kind,
                    });
                }
                BoundParam::Scalar { name, dtype, .. } => {
                    let (&bits, rest) = values.split_first().ok_or_else(bad)?;
                    values = rest;
                    scalars.push((name.to_string(), ScalarValue::from_bits(*dtype, bits)));
                }
            }
        }
        Ok(ProgramArgs {
            program: sig.program.clone(),
            tensors,
            scalars,
        })
    }

    /// The tensor parameter `name`.
    ///
    /// # Errors
    /// No tensor parameter of that name.
    pub fn tensor(&self, name: &str) -> Result<&ProgramTensor, Error> {
        self.tensors.iter().find(|t| t.name == name).ok_or_else(|| {
            Error::Program(format!(
                "program {} has no tensor parameter {name:?} (it has: {})",
                self.program,
                self.tensors
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    /// The value of scalar parameter `name` as `T`.
    ///
    /// # Errors
    /// No scalar parameter of that name, or it is not a `T`.
    pub fn scalar<T: Element + Scalar>(&self, name: &str) -> Result<T, Error> {
        let (_, v) = self
            .scalars
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| {
                Error::Program(format!(
                    "program {} has no scalar parameter {name:?}",
                    self.program
                ))
            })?;
        v.get::<T>().ok_or_else(|| {
            Error::Program(format!(
                "scalar parameter {name:?} is {:?}, not {:?}",
                v.dtype(),
                T::DTYPE
            ))
        })
    }

    /// The tensor parameters in order.
    pub fn tensors(&self) -> &[ProgramTensor] {
        &self.tensors
    }
}
