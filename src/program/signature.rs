//! A program's signature: its named parameters — tensors with a direction, a data type and
//! a shape whose dimensions are fixed or bound later, and scalars fixed at compile time or
//! given at dispatch — and the checks that bind it at compile time and match dispatch
//! arguments against it.

use crate::error::Error;
use std::borrow::Cow;
use std::collections::HashMap;
use strata_types::{DataType, Element, Scalar, MAX_DIMS};

/// Which way a tensor parameter's data flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Read by the program.
    In,
    /// Written by the program (its prior contents are not read).
    Out,
    /// Read and written.
    InOut,
}

impl Direction {
    /// The dependency tag a task argument taken whole from this parameter gets.
    pub fn tag(self) -> strata_types::ArgTag {
        match self {
            Direction::In => strata_types::ArgTag::Input,
            Direction::Out => strata_types::ArgTag::OutputExisting,
            Direction::InOut => strata_types::ArgTag::InOut,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
            Direction::InOut => "inout",
        }
    }
}

/// One dimension of a tensor parameter's shape.
///
/// ```
/// use strata::program::Dim;
/// let shape = [Dim::World, Dim::Fixed(1024)];
/// let named: [Dim; 2] = [Dim::named("tokens"), 64.into()];
/// # let _ = (shape, named);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A size fixed when the program is written.
    Fixed(u64),
    /// The number of chips of the worker the program is compiled for (its world size):
    /// bound at compile time.
    World,
    /// A size bound at dispatch from the argument's actual shape; every parameter that
    /// names the same dimension must agree on it.
    Named(Cow<'static, str>),
}

impl Dim {
    /// A dimension bound at dispatch, by name.
    pub fn named(name: impl Into<Cow<'static, str>>) -> Dim {
        Dim::Named(name.into())
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Dim {
        Dim::Fixed(n)
    }
}

impl From<&'static str> for Dim {
    /// `"world"` is [`Dim::World`]; any other name is [`Dim::Named`].
    fn from(name: &'static str) -> Dim {
        if name == "world" {
            Dim::World
        } else {
            Dim::Named(Cow::Borrowed(name))
        }
    }
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::World => f.write_str("world"),
            Dim::Named(n) => f.write_str(n),
        }
    }
}

/// A scalar value with its data type (a dispatch argument or a fixed parameter's value).
///
/// ```
/// use strata::program::ScalarValue;
/// use strata::types::DataType;
/// let v = ScalarValue::from(2.5f32);
/// assert_eq!(v.dtype(), DataType::F32);
/// assert_eq!(v.get::<f32>(), Some(2.5));
/// assert_eq!(v.get::<i32>(), None); // typed: no silent reinterpretation
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScalarValue {
    dtype: DataType,
    bits: u64,
}

impl ScalarValue {
    /// A value of type `T`.
    pub fn new<T: Element + Scalar>(v: T) -> ScalarValue {
        ScalarValue {
            dtype: T::DTYPE,
            bits: v.to_bits(),
        }
    }

    /// A value of `dtype` from its wire pattern.
    pub(crate) fn from_bits(dtype: DataType, bits: u64) -> ScalarValue {
        ScalarValue { dtype, bits }
    }

    /// Its data type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Its 64-bit wire pattern (as `TaskArgs` carries scalars).
    pub fn bits(&self) -> u64 {
        self.bits
    }

    /// The value as `T`, if that is its type.
    pub fn get<T: Element + Scalar>(&self) -> Option<T> {
        (T::DTYPE == self.dtype).then(|| T::from_bits(self.bits))
    }
}

macro_rules! scalar_value_from {
    ($($t:ty),*) => {$(
        impl From<$t> for ScalarValue {
            fn from(v: $t) -> ScalarValue {
                ScalarValue::new(v)
            }
        }
    )*};
}
impl From<bool> for ScalarValue {
    fn from(v: bool) -> ScalarValue {
        ScalarValue {
            dtype: DataType::Bool,
            bits: v as u64,
        }
    }
}

scalar_value_from!(
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

/// A tensor parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorParam {
    /// Its name.
    pub name: Cow<'static, str>,
    /// Which way its data flows.
    pub direction: Direction,
    /// Its element type.
    pub dtype: DataType,
    /// Its shape.
    pub shape: Vec<Dim>,
}

/// A scalar parameter: given at dispatch, or fixed at compile time (then it is not passed
/// at dispatch, and the orchestration reads the fixed value like any other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalarParam {
    /// Its name.
    pub name: Cow<'static, str>,
    /// Its type.
    pub dtype: DataType,
    /// The value fixed at compile time, if it is.
    pub fixed: Option<ScalarValue>,
}

/// One parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// A tensor.
    Tensor(TensorParam),
    /// A scalar.
    Scalar(ScalarParam),
}

impl Param {
    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            Param::Tensor(t) => &t.name,
            Param::Scalar(s) => &s.name,
        }
    }
}

/// A program's parameters, in dispatch order.
///
/// Built with chained calls; mistakes (a duplicate name, a bad rank) are reported by
/// [`Program::compile`](crate::program::Program::compile), naming the parameter.
///
/// ```
/// use strata::program::{Dim, Signature};
/// use strata::types::DataType;
/// let sig = Signature::new()
///     .input("x", DataType::F32, [Dim::World, Dim::Fixed(1024)])
///     .output("y", DataType::F32, [Dim::World, Dim::Fixed(1024)])
///     .scalar("alpha", DataType::F32)
///     .fixed_scalar("rounds", 3u32);
/// assert_eq!(sig.params().len(), 4);
/// assert_eq!(sig.dispatch_arity(), 3); // the fixed scalar is not passed at dispatch
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signature {
    params: Vec<Param>,
}

impl Signature {
    /// No parameters.
    pub fn new() -> Signature {
        Signature::default()
    }

    fn tensor(
        mut self,
        name: impl Into<Cow<'static, str>>,
        direction: Direction,
        dtype: DataType,
        shape: impl IntoIterator<Item = impl Into<Dim>>,
    ) -> Signature {
        self.params.push(Param::Tensor(TensorParam {
            name: name.into(),
            direction,
            dtype,
            shape: shape.into_iter().map(Into::into).collect(),
        }));
        self
    }

    /// Adds a tensor the program reads.
    pub fn input(
        self,
        name: impl Into<Cow<'static, str>>,
        dtype: DataType,
        shape: impl IntoIterator<Item = impl Into<Dim>>,
    ) -> Signature {
        self.tensor(name, Direction::In, dtype, shape)
    }

    /// Adds a tensor the program writes.
    pub fn output(
        self,
        name: impl Into<Cow<'static, str>>,
        dtype: DataType,
        shape: impl IntoIterator<Item = impl Into<Dim>>,
    ) -> Signature {
        self.tensor(name, Direction::Out, dtype, shape)
    }

    /// Adds a tensor the program reads and writes.
    pub fn inout(
        self,
        name: impl Into<Cow<'static, str>>,
        dtype: DataType,
        shape: impl IntoIterator<Item = impl Into<Dim>>,
    ) -> Signature {
        self.tensor(name, Direction::InOut, dtype, shape)
    }

    /// Adds a scalar given at dispatch.
    pub fn scalar(mut self, name: impl Into<Cow<'static, str>>, dtype: DataType) -> Signature {
        self.params.push(Param::Scalar(ScalarParam {
            name: name.into(),
            dtype,
            fixed: None,
        }));
        self
    }

    /// Adds a scalar fixed now (not passed at dispatch).
    pub fn fixed_scalar(
        mut self,
        name: impl Into<Cow<'static, str>>,
        value: impl Into<ScalarValue>,
    ) -> Signature {
        let value = value.into();
        self.params.push(Param::Scalar(ScalarParam {
            name: name.into(),
            dtype: value.dtype(),
            fixed: Some(value),
        }));
        self
    }

    /// A signature read off sample tensors: each sample's name, direction, data type and
    /// shape (all fixed dimensions). Only the samples' shapes and types are read, never
    /// their contents.
    ///
    /// ```
    /// use strata::program::{Direction, Signature};
    /// use strata::host::SharedTensor;
    /// use strata::types::DataType;
    /// let x = SharedTensor::zeroed(&[2, 8], DataType::F32)?;
    /// let sig = Signature::from_samples([("x", Direction::In, &x)]);
    /// assert_eq!(sig.params()[0].name(), "x");
    /// # Ok::<(), strata::Error>(())
    /// ```
    pub fn from_samples<'a, S: TensorSample + 'a>(
        samples: impl IntoIterator<Item = (&'static str, Direction, &'a S)>,
    ) -> Signature {
        samples
            .into_iter()
            .fold(Signature::new(), |sig, (name, direction, s)| {
                sig.tensor(
                    name,
                    direction,
                    s.sample_dtype(),
                    s.sample_shape().iter().copied(),
                )
            })
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// How many arguments a dispatch passes (every parameter but fixed scalars).
    pub fn dispatch_arity(&self) -> usize {
        self.params
            .iter()
            .filter(|p| !matches!(p, Param::Scalar(ScalarParam { fixed: Some(_), .. })))
            .count()
    }

    /// Checks the signature and binds [`Dim::World`] to `world` (the number of chips).
    pub(crate) fn bind(&self, program: &str, world: usize) -> Result<BoundSignature, Error> {
        let bad = |param: &str, what: String| Error::Signature {
            program: program.to_owned(),
            param: param.to_owned(),
            message: what,
        };
        let mut seen = HashMap::new();
        let mut params = Vec::with_capacity(self.params.len());
        for (i, p) in self.params.iter().enumerate() {
            let name = p.name();
            if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(bad(
                    name,
                    format!("parameter {i} needs a non-empty name without spaces"),
                ));
            }
            if let Some(j) = seen.insert(name.to_owned(), i) {
                return Err(bad(
                    name,
                    format!("is declared twice (parameters {j} and {i})"),
                ));
            }
            match p {
                Param::Tensor(t) => {
                    if t.shape.is_empty() || t.shape.len() > MAX_DIMS {
                        return Err(bad(
                            name,
                            format!(
                                "has {} dimensions; a tensor has 1 to {MAX_DIMS}",
                                t.shape.len()
                            ),
                        ));
                    }
                    let mut dims = Vec::with_capacity(t.shape.len());
                    for d in &t.shape {
                        dims.push(match d {
                            Dim::Fixed(n) => BoundDim::Fixed(*n),
                            Dim::World if world == 0 => {
                                return Err(bad(
                                    name,
                                    "uses the world dimension, but the target has no chips".into(),
                                ))
                            }
                            Dim::World => BoundDim::Fixed(world as u64),
                            Dim::Named(n) if n.is_empty() || n == "world" => {
                                return Err(bad(
                                    name,
                                    format!("names a dimension {n:?}; use Dim::World for the world size and a non-empty name otherwise"),
                                ))
                            }
                            Dim::Named(n) => BoundDim::Named(n.clone()),
                        });
                    }
                    let fixed: Option<u64> = dims.iter().try_fold(1u64, |acc, d| match d {
                        BoundDim::Fixed(n) => acc.checked_mul(*n),
                        BoundDim::Named(_) => Some(acc),
                    });
                    if fixed
                        .and_then(|n| n.checked_mul(t.dtype.size_bytes() as u64))
                        .is_none()
                    {
                        return Err(bad(
                            name,
                            "has more bytes than a 64-bit size can hold".to_string(),
                        ));
                    }
                    params.push(BoundParam::Tensor {
                        name: t.name.clone(),
                        direction: t.direction,
                        dtype: t.dtype,
                        dims,
                    });
                }
                Param::Scalar(s) => {
                    if let Some(v) = s.fixed {
                        if v.dtype() != s.dtype {
                            return Err(bad(
                                name,
                                format!(
                                    "is declared {:?} but fixed to a {:?} value",
                                    s.dtype,
                                    v.dtype()
                                ),
                            ));
                        }
                    }
                    params.push(BoundParam::Scalar {
                        name: s.name.clone(),
                        dtype: s.dtype,
                        fixed: s.fixed,
                    });
                }
            }
        }
        Ok(BoundSignature {
            program: program.to_owned(),
            params,
        })
    }
}

/// Something a signature can be read off ([`Signature::from_samples`]).
pub trait TensorSample {
    /// Its element type.
    fn sample_dtype(&self) -> DataType;
    /// Its shape.
    fn sample_shape(&self) -> Vec<u64>;
}

impl TensorSample for strata_host::SharedTensor {
    fn sample_dtype(&self) -> DataType {
        self.view().dtype()
    }
    fn sample_shape(&self) -> Vec<u64> {
        self.view().shape().to_vec()
    }
}

/// A dimension after compile: a size, or a name bound at dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BoundDim {
    Fixed(u64),
    Named(Cow<'static, str>),
}

/// A parameter after compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BoundParam {
    Tensor {
        name: Cow<'static, str>,
        direction: Direction,
        dtype: DataType,
        dims: Vec<BoundDim>,
    },
    Scalar {
        name: Cow<'static, str>,
        dtype: DataType,
        fixed: Option<ScalarValue>,
    },
}

impl BoundParam {
    pub(crate) fn name(&self) -> &str {
        match self {
            BoundParam::Tensor { name, .. } | BoundParam::Scalar { name, .. } => name,
        }
    }
}

/// A checked signature with the world size bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BoundSignature {
    pub(crate) program: String,
    pub(crate) params: Vec<BoundParam>,
}

impl BoundSignature {
    pub(crate) fn dispatch_arity(&self) -> usize {
        self.params
            .iter()
            .filter(|p| !matches!(p, BoundParam::Scalar { fixed: Some(_), .. }))
            .count()
    }

    /// The parameters a dispatch passes (all but fixed scalars), in order.
    pub(crate) fn dispatch_params(&self) -> impl Iterator<Item = &BoundParam> {
        self.params
            .iter()
            .filter(|p| !matches!(p, BoundParam::Scalar { fixed: Some(_), .. }))
    }

    /// The parameter names, for messages.
    pub(crate) fn describe(&self) -> String {
        self.params
            .iter()
            .map(|p| match p {
                BoundParam::Tensor {
                    name,
                    direction,
                    dtype,
                    dims,
                } => {
                    let dims: Vec<String> = dims
                        .iter()
                        .map(|d| match d {
                            BoundDim::Fixed(n) => n.to_string(),
                            BoundDim::Named(n) => n.to_string(),
                        })
                        .collect();
                    format!(
                        "{name}: {} {dtype:?}[{}]",
                        direction.name(),
                        dims.join(", ")
                    )
                }
                BoundParam::Scalar { name, dtype, fixed } => match fixed {
                    Some(_) => format!("{name}: {dtype:?} (fixed)"),
                    None => format!("{name}: {dtype:?}"),
                },
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Checks a tensor argument's type and shape against parameter `param`, binding its
    /// named dimensions (which must agree with earlier bindings).
    pub(crate) fn check_tensor(
        &self,
        param: &BoundParam,
        dtype: DataType,
        shape: &[u64],
        named: &mut HashMap<String, (u64, String)>,
    ) -> Result<(), Error> {
        let BoundParam::Tensor {
            name,
            dtype: want,
            dims,
            ..
        } = param
        else {
            return Err(self.arg_error(
                param.name(),
                "is a scalar parameter, but a tensor was given".into(),
            ));
        };
        if dtype != *want {
            return Err(self.arg_error(name, format!("expects dtype {want:?}, got {dtype:?}")));
        }
        if shape.len() != dims.len() {
            return Err(self.arg_error(
                name,
                format!(
                    "expects rank {} (shape [{}]), got rank {} (shape {shape:?})",
                    dims.len(),
                    dims.iter()
                        .map(|d| match d {
                            BoundDim::Fixed(n) => n.to_string(),
                            BoundDim::Named(n) => n.to_string(),
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                    shape.len()
                ),
            ));
        }
        for (axis, (d, &got)) in dims.iter().zip(shape).enumerate() {
            match d {
                BoundDim::Fixed(n) if *n != got => {
                    return Err(self.arg_error(
                        name,
                        format!(
                            "expects shape dimension {axis} = {n}, got {got} (shape {shape:?})"
                        ),
                    ))
                }
                BoundDim::Fixed(_) => {}
                BoundDim::Named(dim) => match named.get(dim.as_ref()) {
                    Some((bound, by)) if *bound != got => {
                        return Err(self.arg_error(
                            name,
                            format!(
                                "dimension {axis} ({dim}) is {got}, but {by} bound {dim} = {bound}"
                            ),
                        ))
                    }
                    Some(_) => {}
                    None => {
                        named.insert(dim.to_string(), (got, name.to_string()));
                    }
                },
            }
        }
        Ok(())
    }

    pub(crate) fn arg_error(&self, param: &str, message: String) -> Error {
        Error::Argument {
            program: self.program.clone(),
            param: param.to_owned(),
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig() -> Signature {
        Signature::new()
            .input("x", DataType::F32, [Dim::World, Dim::named("n")])
            .inout("kv", DataType::F32, [Dim::Fixed(4), Dim::named("n")])
            .scalar("alpha", DataType::F32)
            .fixed_scalar("steps", 3u32)
    }

    #[test]
    fn binding_fixes_the_world_and_keeps_named_dimensions() {
        let b = sig().bind("p", 2).unwrap();
        assert_eq!(b.dispatch_arity(), 3);
        let BoundParam::Tensor { dims, .. } = &b.params[0] else {
            panic!()
        };
        assert_eq!(dims, &[BoundDim::Fixed(2), BoundDim::Named("n".into())]);
        assert_eq!(
            b.describe(),
            "x: in F32[2, n], kv: inout F32[4, n], alpha: F32, steps: U32 (fixed)"
        );
    }

    #[test]
    fn bad_signatures_name_the_parameter() {
        let cases: Vec<(Signature, usize, &str, &str)> = vec![
            (
                Signature::new()
                    .scalar("a", DataType::F32)
                    .scalar("a", DataType::I32),
                1,
                "a",
                "declared twice",
            ),
            (
                Signature::new().input("x", DataType::F32, Vec::<Dim>::new()),
                1,
                "x",
                "0 dimensions",
            ),
            (
                Signature::new().input("x", DataType::F32, [1u64; 6]),
                1,
                "x",
                "6 dimensions",
            ),
            (
                Signature::new().input("x", DataType::F32, [Dim::World]),
                0,
                "x",
                "no chips",
            ),
            (
                Signature::new().input("x", DataType::F32, [Dim::named("")]),
                1,
                "x",
                "non-empty name",
            ),
            (
                Signature::new().input("", DataType::F32, [1u64]),
                1,
                "",
                "non-empty name",
            ),
            (
                Signature::new().input("x", DataType::F64, [u64::MAX, 2]),
                1,
                "x",
                "64-bit size",
            ),
        ];
        for (sig, world, param, msg) in cases {
            match sig.bind("prog", world) {
                Err(Error::Signature {
                    program,
                    param: p,
                    message,
                }) => {
                    assert_eq!((program.as_str(), p.as_str()), ("prog", param));
                    assert!(message.contains(msg), "{message:?} should say {msg:?}");
                }
                other => panic!("{sig:?}: expected a signature error, got {other:?}"),
            }
        }
    }

    #[test]
    fn arguments_bind_named_dimensions_consistently() {
        let b = sig().bind("p", 2).unwrap();
        let mut named = HashMap::new();
        b.check_tensor(&b.params[0], DataType::F32, &[2, 16], &mut named)
            .unwrap();
        assert_eq!(named["n"].0, 16);
        b.check_tensor(&b.params[1], DataType::F32, &[4, 16], &mut named)
            .unwrap();
        let e = b
            .check_tensor(&b.params[1], DataType::F32, &[4, 8], &mut named)
            .unwrap_err();
        assert!(e.to_string().contains("x bound n = 16"), "{e}");
        let e = b
            .check_tensor(&b.params[0], DataType::F32, &[3, 16], &mut HashMap::new())
            .unwrap_err();
        assert!(e.to_string().contains("dimension 0 = 2, got 3"), "{e}");
        let e = b
            .check_tensor(&b.params[0], DataType::I32, &[2, 16], &mut HashMap::new())
            .unwrap_err();
        assert!(e.to_string().contains("expects dtype F32, got I32"), "{e}");
        let e = b
            .check_tensor(&b.params[0], DataType::F32, &[2], &mut HashMap::new())
            .unwrap_err();
        assert!(e.to_string().contains("expects rank 2"), "{e}");
        let e = b
            .check_tensor(&b.params[2], DataType::F32, &[2], &mut HashMap::new())
            .unwrap_err();
        assert!(e.to_string().contains("scalar parameter"), "{e}");
    }

    #[test]
    fn a_fixed_scalar_of_the_wrong_type_is_refused() {
        let mut s = Signature::new().fixed_scalar("k", 1u32);
        if let Param::Scalar(p) = &mut s.params[0] {
            p.dtype = DataType::F32;
        }
        assert!(s
            .bind("p", 1)
            .unwrap_err()
            .to_string()
            .contains("fixed to a U32"));
    }
}
