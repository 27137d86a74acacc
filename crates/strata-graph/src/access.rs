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

/// A [`BufferKey`] hashed for locality: buffers minted one after another by one owner
/// land in neighbouring buckets of a [`KeyMap`], so a run that walks many buffers in
/// minting order (tiles of a wavefront, intermediates) walks the table instead of
/// missing the cache on every lookup. The low 57 bits are the buffer id offset by a mix
/// of the other fields (the bucket), the top 7 bits a mix of the buffer id (the tag
/// hashbrown compares sixteen buckets at a time with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalKey(pub(crate) BufferKey);

const BUCKET_BITS: u64 = (1 << 57) - 1;

fn mix(v: u64) -> u64 {
    let mut x = v.wrapping_mul(FX_SEED);
    x ^= x >> 29;
    x.wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

impl std::hash::Hash for LocalKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let id = &self.0.identity;
        let space = match self.0.space {
            KeySpace::Host => 0,
            KeySpace::Device(w) => u64::from(w) + 1,
        };
        let base = mix(id.owner().0 ^ (u64::from(id.generation()) << 40) ^ (space << 20));
        let bucket = id.buffer_id().wrapping_add(base) & BUCKET_BITS;
        state.write_u64(bucket | (mix(id.buffer_id()) & !BUCKET_BITS));
    }
}

/// The hasher of [`KeyMap`]: [`LocalKey`] writes one finished hash.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PreHashed(u64);

impl Hasher for PreHashed {
    fn write(&mut self, bytes: &[u8]) {
        // Only `LocalKey` is hashed with this hasher, and it writes one u64; fold anything
        // else in the Fx way so the hasher stays correct if that ever changes.
        let mut fx = FxHasher(self.0);
        fx.write(bytes);
        self.0 = fx.0;
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map from buffer keys, laid out for locality (see [`LocalKey`]).
pub(crate) type KeyMap<V> = std::collections::HashMap<LocalKey, V, BuildHasherDefault<PreHashed>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;
    use strata_types::{BufferIdentity, OwnerNonce};

    fn hash(k: BufferKey) -> u64 {
        BuildHasherDefault::<PreHashed>::default().hash_one(LocalKey(k))
    }

    fn key(owner: u64, id: u64, gen: u32, space: KeySpace) -> BufferKey {
        BufferKey::new(
            BufferIdentity::new(OwnerNonce(owner), id, gen).unwrap(),
            space,
        )
    }

    #[test]
    fn consecutive_buffers_of_one_owner_take_consecutive_buckets() {
        let h: Vec<u64> = (100..110)
            .map(|id| hash(key(7, id, 1, KeySpace::Host)) & BUCKET_BITS)
            .collect();
        for w in h.windows(2) {
            assert_eq!(w[1], (w[0] + 1) & BUCKET_BITS);
        }
    }

    #[test]
    fn other_fields_move_the_bucket_and_tags_vary() {
        let base = hash(key(7, 100, 1, KeySpace::Host)) & BUCKET_BITS;
        for other in [
            key(8, 100, 1, KeySpace::Host),
            key(7, 100, 2, KeySpace::Host),
            key(7, 100, 1, KeySpace::Device(0)),
            key(7, 100, 1, KeySpace::Device(1)),
        ] {
            assert_ne!(hash(other) & BUCKET_BITS, base, "{other:?}");
        }
        let tags: std::collections::HashSet<u64> = (0..64)
            .map(|id| hash(key(7, id, 1, KeySpace::Host)) >> 57)
            .collect();
        assert!(tags.len() > 32, "tags of 64 neighbours: {}", tags.len());
    }
}
