//! Buffer keys and tensor accesses: what dependency inference looks at.

use crate::footprint::Footprint;
use std::hash::{BuildHasherDefault, Hasher};
use strata_types::{ArgTag, BufferIdentity, BufferLocation, TensorArg};

/// The address space a buffer key lives in: host memory is one space; each chip's device
/// memory is its own space (a device address means nothing on another chip).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeySpace {
    /// Host memory (shared or private).
    Host,
    /// Device memory of the chip with this next-level worker id.
    Device(u32),
}

/// The dependency key of a buffer: its identity within an address space.
///
/// ```
/// use strata_graph::{BufferKey, KeySpace};
/// use strata_types::IdentityMinter;
/// let id = IdentityMinter::new().mint();
/// assert_ne!(BufferKey::new(id, KeySpace::Device(0)), BufferKey::new(id, KeySpace::Device(1)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferKey {
    /// The buffer's identity.
    pub identity: BufferIdentity,
    /// Its address space.
    pub space: KeySpace,
}

impl BufferKey {
    /// A key.
    pub fn new(identity: BufferIdentity, space: KeySpace) -> Self {
        BufferKey { identity, space }
    }

    /// The key of a tensor argument's buffer (device buffers are keyed per owning chip).
    pub fn of_arg(arg: &TensorArg) -> Self {
        let space = match arg.buffer.location {
            BufferLocation::Device { worker, .. } => KeySpace::Device(worker),
            _ => KeySpace::Host,
        };
        BufferKey::new(arg.buffer.identity, space)
    }
}

/// One tensor access of a task: which buffer, which bytes, and how.
///
/// ```
/// use strata_graph::{Access, BufferKey, Footprint, KeySpace};
/// use strata_types::{ArgTag, IdentityMinter};
/// let key = BufferKey::new(IdentityMinter::new().mint(), KeySpace::Host);
/// let a = Access::new(key, Footprint::bytes(0, 64).unwrap(), ArgTag::InOut);
/// assert!(a.tag.writes());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// The buffer.
    pub key: BufferKey,
    /// The bytes touched.
    pub footprint: Footprint,
    /// How they are touched.
    pub tag: ArgTag,
}

impl Access {
    /// An access.
    pub fn new(key: BufferKey, footprint: Footprint, tag: ArgTag) -> Self {
        Access {
            key,
            footprint,
            tag,
        }
    }

    /// The access a tensor argument makes.
    pub fn of_arg(arg: &TensorArg) -> Self {
        Access::new(
            BufferKey::of_arg(arg),
            Footprint::of_view(&arg.view),
            arg.tag,
        )
    }
}

/// A small, fast, non-cryptographic hasher (the FxHash mixing step) for the graph's
/// internal maps, whose keys are already well-distributed identities. Dependency
/// inference hashes on every submit, and SipHash would dominate its cost.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64)
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64)
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(FX_SEED);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64)
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;
pub(crate) type FxHashMap<K, V> = std::collections::HashMap<K, V, FxBuild>;
