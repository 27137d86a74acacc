//! [`DistributedTensor`]: what a kernel names — the same plain value on every rank.

use crate::error::CommError;
use strata_types::DataType;

/// Most dims a distributed tensor may have.
pub const MAX_DIMS: usize = 5;

/// Tag in the top 12 bits of scalar 0, so a wrong scalar is refused rather than misread.
const TAG: u64 = 0xD57;

/// Bits per dim in the packed 128-bit shape, by rank (1..=5 dims).
const DIM_BITS: [u32; MAX_DIMS] = [64, 64, 42, 32, 25];

/// A typed, row-major, contiguous view of one window buffer: the same value on every rank
/// of the buffer's domain. It names the buffer's domain-table slot and generation (so a
/// view of a freed buffer is refused), a byte offset within each rank's window, a dtype
/// and a shape.
///
/// Made by [`crate::CommAllocator::window`]; opened on a rank by [`crate::Comm::window`]
/// (host threads playing ranks). Kernels do not handle it: they receive windows as tensor
/// arguments and open them with [`crate::KernelWindows::window`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DistributedTensor {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
    pub(crate) offset: u64,
    pub(crate) dtype: DataType,
    pub(crate) ndim: u8,
    pub(crate) dims: [u64; MAX_DIMS],
}

impl DistributedTensor {
    /// How many u64 words a tensor encodes to (its descriptor in collective hashes).
    pub(crate) const SCALARS: usize = 4;

    /// Validates and builds a view (the allocator checks it against its buffer).
    pub(crate) fn new(
        slot: u32,
        generation: u32,
        offset: u64,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<Self, CommError> {
        let bad = |reason: String| Err(CommError::BadTensor { reason });
        if shape.is_empty() || shape.len() > MAX_DIMS {
            return bad(format!(
                "a distributed tensor has 1..={MAX_DIMS} dims, not {} (use shape [1] for a single element)",
                shape.len()
            ));
        }
        let bits = DIM_BITS[shape.len() - 1];
        if bits < 64 {
            if let Some(d) = shape.iter().find(|&&d| d >> bits != 0) {
                return bad(format!(
                    "dim {d} of shape {shape:?} does not fit the {bits} bits a {}-dim tensor encodes per dim; merge dims (fewer dims allow larger ones)",
                    shape.len()
                ));
            }
        }
        let numel = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size_bytes() as u64));
        if numel.is_none() {
            return bad(format!("shape {shape:?} of {dtype} overflows u64 bytes"));
        }
        if offset % dtype.size_bytes() as u64 != 0 {
            return bad(format!(
                "byte offset {offset} is not a multiple of the {dtype} element size {}",
                dtype.size_bytes()
            ));
        }
        let mut dims = [0u64; MAX_DIMS];
        dims[..shape.len()].copy_from_slice(shape);
        Ok(DistributedTensor {
            slot,
            generation,
            offset,
            dtype,
            ndim: shape.len() as u8,
            dims,
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The shape (row-major).
    pub fn shape(&self) -> &[u64] {
        &self.dims[..self.ndim as usize]
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape().iter().product()
    }

    /// Bytes of the view (`numel * element size`).
    pub fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.size_bytes() as u64
    }

    /// Byte offset of the view within each rank's window of its buffer.
    pub fn byte_offset(&self) -> u64 {
        self.offset
    }

    /// The buffer's domain-table slot.
    pub fn table_slot(&self) -> u32 {
        self.slot
    }

    /// The buffer's generation (refused once the buffer is freed).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The same buffer and offset seen with another shape and dtype (same or fewer bytes
    /// are not checked here; [`crate::Comm::window`] checks the view against the buffer).
    ///
    /// # Errors
    /// [`CommError::BadTensor`] for an invalid shape or misaligned offset.
    pub fn with_shape(&self, shape: &[u64], dtype: DataType) -> Result<Self, CommError> {
        Self::new(self.slot, self.generation, self.offset, shape, dtype)
    }

    /// The encoding (a tensor's identity in a collective's descriptor hash):
    /// `[tag:12 | ndim:4 | dtype:8 | slot:8 | generation:32, byte offset, shape lo, shape hi]`,
    /// the shape packed at 64, 64, 42, 32 or 25 bits per dim for 1..=5 dims.
    pub(crate) fn encode(&self) -> [u64; Self::SCALARS] {
        let s0 = (TAG << 52)
            | (u64::from(self.ndim) << 48)
            | (u64::from(self.dtype.code()) << 40)
            | (u64::from(self.slot) << 32)
            | u64::from(self.generation);
        let bits = DIM_BITS[self.ndim as usize - 1];
        let mut packed: u128 = 0;
        for (i, &d) in self.shape().iter().enumerate() {
            packed |= u128::from(d) << (i as u32 * bits);
        }
        [s0, self.offset, packed as u64, (packed >> 64) as u64]
    }

    /// Decodes [`DistributedTensor::encode`] (the tests' round trip).
    #[cfg(test)]
    fn decode(s: &[u64]) -> Result<Self, CommError> {
        let bad = |reason: String| CommError::BadTensor { reason };
        if s.len() < Self::SCALARS {
            return Err(bad(format!("{} words given", s.len())));
        }
        let s0 = s[0];
        if s0 >> 52 != TAG {
            return Err(bad(format!("{s0:#018x} is not an encoded tensor")));
        }
        let ndim = ((s0 >> 48) & 0xF) as usize;
        if ndim == 0 || ndim > MAX_DIMS {
            return Err(bad(format!("encoded tensor has {ndim} dims")));
        }
        let dtype = DataType::from_code(((s0 >> 40) & 0xFF) as u8)
            .map_err(|e| bad(format!("encoded tensor: {e}")))?;
        let packed = u128::from(s[2]) | (u128::from(s[3]) << 64);
        let bits = DIM_BITS[ndim - 1];
        let mask: u128 = if bits == 64 {
            u64::MAX as u128
        } else {
            (1u128 << bits) - 1
        };
        let shape: Vec<u64> = (0..ndim)
            .map(|i| ((packed >> (i as u32 * bits)) & mask) as u64)
            .collect();
        Self::new(((s0 >> 32) & 0xFF) as u32, s0 as u32, s[1], &shape, dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoding_round_trips_for_every_rank() {
        for shape in [
            vec![1u64 << 40],
            vec![3, u64::MAX / 8],
            vec![(1 << 42) - 1, 1, 7],
            vec![u32::MAX as u64, 2, 3, 4],
            vec![(1 << 25) - 1, 5, 1, 2, 3],
        ] {
            let t = DistributedTensor::new(255, 0xDEAD_BEEF, 4096, &shape, DataType::I8).unwrap();
            let s = t.encode();
            assert_eq!(DistributedTensor::decode(&s).unwrap(), t);
        }
        assert!(DistributedTensor::new(0, 1, 0, &[1 << 25, 1, 1, 1, 1], DataType::F32).is_err());
        assert!(DistributedTensor::new(0, 1, 2, &[4], DataType::F32).is_err());
        assert!(DistributedTensor::new(0, 1, 0, &[], DataType::F32).is_err());
        assert!(DistributedTensor::decode(&[1, 2, 3, 4]).is_err());
        assert!(DistributedTensor::decode(&[1, 2]).is_err());
    }
}
