//! Element data types and the [`Element`] trait that ties them to Rust types.

use crate::error::TypesError;
use half::{bf16, f16};
use std::fmt;

/// The element type of a tensor.
///
/// The discriminants are the stable wire codes used in task frames; never renumber them.
///
/// ```
/// use strata_types::DataType;
/// assert_eq!(DataType::F32.size_bytes(), 4);
/// assert_eq!(DataType::from_code(DataType::BF16.code()).unwrap(), DataType::BF16);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DataType {
    /// One byte, 0 or 1.
    Bool = 0,
    /// Unsigned 8-bit integer.
    U8 = 1,
    /// Signed 8-bit integer.
    I8 = 2,
    /// Signed 16-bit integer.
    I16 = 3,
    /// Signed 32-bit integer.
    I32 = 4,
    /// Signed 64-bit integer.
    I64 = 5,
    /// Unsigned 32-bit integer.
    U32 = 6,
    /// Unsigned 64-bit integer.
    U64 = 7,
    /// IEEE 754 half precision.
    F16 = 8,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16 = 9,
    /// IEEE 754 single precision.
    F32 = 10,
    /// IEEE 754 double precision.
    F64 = 11,
}

impl DataType {
    /// Every data type, in wire-code order.
    pub const ALL: [DataType; 12] = [
        DataType::Bool,
        DataType::U8,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::U32,
        DataType::U64,
        DataType::F16,
        DataType::BF16,
        DataType::F32,
        DataType::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DataType::Bool | DataType::U8 | DataType::I8 => 1,
            DataType::I16 | DataType::F16 | DataType::BF16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// The stable wire code of this type.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Decodes a wire code.
    ///
    /// # Errors
    /// [`TypesError::UnknownDataType`] if `code` names no type.
    pub fn from_code(code: u8) -> Result<Self, TypesError> {
        Self::ALL
            .get(code as usize)
            .copied()
            .ok_or(TypesError::UnknownDataType { code })
    }

    /// Lower-case name, as used in messages and trace files (`"f32"`, `"bf16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Bool => "bool",
            DataType::U8 => "u8",
            DataType::I8 => "i8",
            DataType::I16 => "i16",
            DataType::I32 => "i32",
            DataType::I64 => "i64",
            DataType::U32 => "u32",
            DataType::U64 => "u64",
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::BF16 | DataType::F32 | DataType::F64
        )
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be viewed as the elements of a tensor.
///
/// # Safety
/// Implementors must be plain old data: every bit pattern of `size_of::<Self>()` bytes is a
/// valid value, there is no padding, and `size_of::<Self>() == Self::DTYPE.size_bytes()`.
/// Typed views over shared or device memory rely on this to reinterpret raw bytes.
pub unsafe trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The data type this Rust type represents.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(
            // SAFETY: primitive numeric types (and half's repr(transparent) u16 wrappers) are
            // plain old data whose size matches the data type's element size.
            unsafe impl Element for $t {
                const DTYPE: DataType = DataType::$d;
            }
        )*
    };
}

element!(
    u8 => U8,
    i8 => I8,
    i16 => I16,
    i32 => I32,
    i64 => I64,
    u32 => U32,
    u64 => U64,
    f16 => F16,
    bf16 => BF16,
    f32 => F32,
    f64 => F64,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_sizes_match_rust_types() {
        for d in DataType::ALL {
            assert_eq!(DataType::from_code(d.code()).unwrap(), d);
        }
        assert!(DataType::from_code(12).is_err());
        assert_eq!(std::mem::size_of::<f16>(), DataType::F16.size_bytes());
        assert_eq!(std::mem::size_of::<bf16>(), DataType::BF16.size_bytes());
        assert_eq!(std::mem::size_of::<f64>(), DataType::F64.size_bytes());
        assert_eq!(<bf16 as Element>::DTYPE, DataType::BF16);
    }
}
