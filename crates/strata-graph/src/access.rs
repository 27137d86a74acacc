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

/// The address domain a buffer's bytes live in: addresses are comparable only within one
/// domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressDomain {
    /// One host shared-memory region (offsets inside it).
    HostShared {
        /// The region id.
        region: u64,
    },
    /// The device memory of one chip (device addresses).
    Device {
        /// The chip's next-level worker id.
        worker: u32,
    },
    /// The submitting process's private memory (its virtual addresses).
    HostLocal,
}

/// Where a buffer's bytes start: its address domain and base address there. Two
/// accesses placed in one domain are compared by the bytes they touch, whatever their
/// keys — a stale or forged key over live bytes is still the same memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Placement {
    /// The address domain.
    pub domain: AddressDomain,
    /// The buffer's base address (or offset) in it.
    pub base: u64,
}

impl Placement {
    /// Where a tensor argument's buffer is.
    pub fn of_arg(arg: &TensorArg) -> Self {
        let (domain, base) = match arg.buffer.location {
            BufferLocation::HostShared { region, offset } => {
                (AddressDomain::HostShared { region }, offset)
            }
            BufferLocation::Device { worker, addr } => (AddressDomain::Device { worker }, addr),
            BufferLocation::HostLocal { addr } => (AddressDomain::HostLocal, addr),
        };
        Placement { domain, base }
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
    /// Where the buffer's bytes are, if known: then the within-task aliasing check also
    /// compares this access with accesses of other keys by address.
    pub placement: Option<Placement>,
}

impl Access {
    /// An access.
    pub fn new(key: BufferKey, footprint: Footprint, tag: ArgTag) -> Self {
        Access {
            key,
            footprint,
            tag,
            placement: None,
        }
    }

    /// The same access with the buffer's placement known.
    pub fn placed(mut self, placement: Placement) -> Self {
        self.placement = Some(placement);
        self
    }

    /// The absolute byte range `[start, end)` the access may touch in its domain, if
    /// placed and its footprint is a view (not the whole buffer of unknown size).
    pub(crate) fn absolute_span(&self) -> Option<(AddressDomain, u64, u64)> {
        let p = self.placement?;
        if self.footprint == Footprint::WHOLE {
            return None;
        }
        let (s, e) = self.footprint.span();
        Some((p.domain, p.base.saturating_add(s), p.base.saturating_add(e)))
    }

    /// The access a tensor argument makes (placed where its buffer is).
    pub fn of_arg(arg: &TensorArg) -> Self {
        Access::new(
            BufferKey::of_arg(arg),
            Footprint::of_view(&arg.view),
            arg.tag,
        )
        .placed(Placement::of_arg(arg))
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

/// A [`BufferKey`] hashed for locality: each aligned block of [`LOCAL_RUN`] buffers
/// minted one after another by one owner lands in neighbouring buckets of a [`KeyMap`],
/// so a run that walks many buffers in minting order (tiles of a wavefront,
/// intermediates) misses the cache once per block instead of on every lookup. The blocks
/// themselves are scattered (a mix of the block number and the other fields), so the
/// keys of many owners, generations or key spaces do not pile up into long runs of
/// occupied buckets; the top 7 bits (the tag hashbrown compares sixteen buckets at a time
/// with) mix the whole key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalKey(pub(crate) BufferKey);

const BUCKET_BITS: u64 = (1 << 57) - 1;
/// Consecutive buffer ids that share a block of consecutive buckets.
pub(crate) const LOCAL_RUN: u64 = 8;

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
        let b = id.buffer_id();
        let block = mix(base ^ (b / LOCAL_RUN)).wrapping_mul(LOCAL_RUN);
        let bucket = (block | (b % LOCAL_RUN)) & BUCKET_BITS;
        state.write_u64(bucket | (mix(base ^ b) & !BUCKET_BITS));
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
    fn consecutive_buffers_of_one_owner_share_blocks_of_consecutive_buckets() {
        for start in [96u64, 800] {
            let h: Vec<u64> = (start..start + LOCAL_RUN)
                .map(|id| hash(key(7, id, 1, KeySpace::Host)) & BUCKET_BITS)
                .collect();
            for w in h.windows(2) {
                assert_eq!(w[1], w[0] + 1, "{h:?}");
            }
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
        // The same id in other spaces does not share its tag.
        let same_id: std::collections::HashSet<u64> = (0..9)
            .map(|s| {
                let space = if s == 0 {
                    KeySpace::Host
                } else {
                    KeySpace::Device(s - 1)
                };
                hash(key(7, 100, 1, space)) >> 57
            })
            .collect();
        assert!(
            same_id.len() >= 6,
            "tags of one id in 9 spaces: {}",
            same_id.len()
        );
    }

    /// Many key spaces with the same ids (the host and 8 chips, ids from 0), at the highest
    /// load a table reaches (7/8): a lookup compares about one key. Runs of consecutive
    /// buckets per space would overlap and merge into long clusters, whose probe sequences
    /// meet many false tag matches (each one a key comparison); same-id keys sharing a tag
    /// would add more.
    #[test]
    fn many_key_spaces_keep_lookups_short() {
        use std::cell::Cell;
        use std::hash::Hash;
        thread_local!(static EQS: Cell<u64> = const { Cell::new(0) });
        #[derive(Clone, Copy)]
        struct Counted(LocalKey);
        impl PartialEq for Counted {
            fn eq(&self, o: &Self) -> bool {
                EQS.with(|c| c.set(c.get() + 1));
                self.0 == o.0
            }
        }
        impl Eq for Counted {}
        impl Hash for Counted {
            fn hash<H: Hasher>(&self, h: &mut H) {
                self.0.hash(h)
            }
        }
        // 14 328 keys: just under 7/8 of 16 384 buckets.
        let keys: Vec<Counted> = (0..9u32)
            .flat_map(|s| {
                let space = if s == 0 {
                    KeySpace::Host
                } else {
                    KeySpace::Device(s - 1)
                };
                (0..1592u64).map(move |id| Counted(LocalKey(key(7, id, 1, space))))
            })
            .collect();
        let mut m: std::collections::HashMap<Counted, (), BuildHasherDefault<PreHashed>> =
            std::collections::HashMap::with_capacity_and_hasher(keys.len(), Default::default());
        for k in &keys {
            m.insert(*k, ());
        }
        EQS.with(|c| c.set(0));
        for k in &keys {
            assert!(m.contains_key(k));
        }
        let per_lookup = EQS.with(Cell::get) as f64 / keys.len() as f64;
        assert!(
            per_lookup < 1.3,
            "{per_lookup:.2} key comparisons per lookup (1 is ideal)"
        );
    }
}
