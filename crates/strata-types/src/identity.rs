//! Identities: of buffers (for dependency keys) and of callables (digests that cross
//! process boundaries instead of function pointers).

use crate::error::TypesError;
use sha2::{Digest, Sha256};
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

/// A random 64-bit value that names one owner of buffers (a worker, a process, a run).
///
/// Two owners minting buffer ids independently cannot collide because their nonces differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerNonce(pub u64);

impl OwnerNonce {
    /// A fresh nonce, distinct (with overwhelming probability) from every other nonce
    /// minted by any process on the machine.
    pub fn fresh() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(d.as_nanos());
        }
        let v = h.finish();
        OwnerNonce(if v == 0 { 1 } else { v })
    }
}

/// The identity of one buffer: who minted it, its id, and its generation.
///
/// Dependency keys are derived from this identity, never from addresses, so a buffer
/// freed and re-allocated at the same address is a different buffer (its generation or id
/// differs). Generations start at 1.
///
/// ```
/// use strata_types::{BufferIdentity, OwnerNonce};
/// let id = BufferIdentity::new(OwnerNonce(7), 42, 1).unwrap();
/// assert_eq!(id.next_generation().generation(), 2);
/// assert!(BufferIdentity::new(OwnerNonce(7), 42, 0).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferIdentity {
    owner: OwnerNonce,
    buffer_id: u64,
    generation: NonZeroU32,
}

impl BufferIdentity {
    /// Builds an identity.
    ///
    /// # Errors
    /// [`TypesError::ZeroGeneration`] if `generation == 0`.
    pub fn new(owner: OwnerNonce, buffer_id: u64, generation: u32) -> Result<Self, TypesError> {
        Ok(BufferIdentity {
            owner,
            buffer_id,
            generation: NonZeroU32::new(generation).ok_or(TypesError::ZeroGeneration)?,
        })
    }

    /// The minting owner.
    pub fn owner(&self) -> OwnerNonce {
        self.owner
    }

    /// The owner-local buffer id.
    pub fn buffer_id(&self) -> u64 {
        self.buffer_id
    }

    /// The generation (≥ 1).
    pub fn generation(&self) -> u32 {
        self.generation.get()
    }

    /// The same buffer id, one generation later (wraps from `u32::MAX` to 1).
    pub fn next_generation(&self) -> Self {
        let g = self.generation.get().checked_add(1).unwrap_or(1);
        BufferIdentity {
            generation: NonZeroU32::new(g).unwrap_or(NonZeroU32::MIN),
            ..*self
        }
    }
}

impl fmt::Display for BufferIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "buf:{:016x}/{}@{}",
            self.owner.0, self.buffer_id, self.generation
        )
    }
}

/// Mints fresh [`BufferIdentity`] values for one owner. Thread-safe.
///
/// ```
/// use strata_types::IdentityMinter;
/// let m = IdentityMinter::new();
/// let (a, b) = (m.mint(), m.mint());
/// assert_ne!(a, b);
/// assert_eq!(a.owner(), b.owner());
/// ```
#[derive(Debug)]
pub struct IdentityMinter {
    owner: OwnerNonce,
    next: AtomicU64,
}

impl IdentityMinter {
    /// A minter with a fresh owner nonce.
    pub fn new() -> Self {
        Self::with_owner(OwnerNonce::fresh())
    }

    /// A minter for a given owner.
    pub fn with_owner(owner: OwnerNonce) -> Self {
        IdentityMinter {
            owner,
            next: AtomicU64::new(1),
        }
    }

    /// The owner this minter mints for.
    pub fn owner(&self) -> OwnerNonce {
        self.owner
    }

    /// A new identity, generation 1.
    pub fn mint(&self) -> BufferIdentity {
        BufferIdentity {
            owner: self.owner,
            buffer_id: self.next.fetch_add(1, Ordering::Relaxed),
            generation: NonZeroU32::MIN,
        }
    }
}

impl Default for IdentityMinter {
    fn default() -> Self {
        Self::new()
    }
}

/// What kind of program a callable is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CallableKind {
    /// A kernel that runs on an emulated AICore.
    Kernel = 1,
    /// An orchestration that runs on a chip's emulated AICPU.
    ChipOrchestration = 2,
    /// An orchestration that runs on an L3/L4 host.
    HostOrchestration = 3,
    /// A host sub-worker callback.
    SubWorker = 4,
    /// A runtime-provided builtin (collectives and the like).
    Builtin = 5,
}

/// The direction of one parameter in a callable's signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ParamDirection {
    /// A scalar value.
    Scalar = 0,
    /// A tensor the callable reads.
    In = 1,
    /// A tensor the callable writes.
    Out = 2,
    /// A tensor the callable reads and writes.
    InOut = 3,
}

/// Version of the descriptor encoding hashed into a [`CallableId`]. Bump it (and never
/// reuse an old value) whenever the encoding changes.
pub const CALLABLE_DESCRIPTOR_SCHEMA: u32 = 1;

/// A stable description of a callable, from which its [`CallableId`] is computed.
///
/// Encoding (little-endian): `u32 schema (=1)`, `u32 kind`, `str name`, `u32 version`,
/// `u32 n` then `n` direction bytes; `str` = `u32 len` + UTF-8 bytes.
///
/// ```
/// use strata_types::{CallableDescriptor, CallableKind, ParamDirection};
/// let a = CallableDescriptor::new(CallableKind::Kernel, "vector_add")
///     .with_signature(&[ParamDirection::In, ParamDirection::In, ParamDirection::Out]);
/// let b = a.clone();
/// assert_eq!(a.digest(), b.digest());
/// assert_ne!(a.digest(), a.clone().with_version(2).digest());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallableDescriptor {
    kind: CallableKind,
    name: String,
    version: u32,
    signature: Vec<ParamDirection>,
}

impl CallableDescriptor {
    /// A descriptor with an empty signature and version 1.
    pub fn new(kind: CallableKind, name: impl Into<String>) -> Self {
        CallableDescriptor {
            kind,
            name: name.into(),
            version: 1,
            signature: Vec::new(),
        }
    }

    /// Sets the parameter directions.
    pub fn with_signature(mut self, signature: &[ParamDirection]) -> Self {
        self.signature = signature.to_vec();
        self
    }

    /// Sets the user-chosen version (change it when the callable's behaviour changes).
    pub fn with_version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// The kind.
    pub fn kind(&self) -> CallableKind {
        self.kind
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parameter directions.
    pub fn signature(&self) -> &[ParamDirection] {
        &self.signature
    }

    /// The canonical byte encoding that is hashed.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + self.name.len() + self.signature.len());
        out.extend_from_slice(&CALLABLE_DESCRIPTOR_SCHEMA.to_le_bytes());
        out.extend_from_slice(&(self.kind as u32).to_le_bytes());
        out.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.signature.len() as u32).to_le_bytes());
        out.extend(self.signature.iter().map(|d| *d as u8));
        out
    }

    /// The SHA-256 digest of [`CallableDescriptor::encode`].
    pub fn digest(&self) -> CallableId {
        CallableId(Sha256::digest(self.encode()).into())
    }
}

/// The 32-byte SHA-256 digest that identifies a callable across processes and hosts.
///
/// ```
/// use strata_types::CallableId;
/// let id = CallableId([0xab; 32]);
/// assert!(id.to_string().starts_with("sha256:abab"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallableId(pub [u8; 32]);

impl CallableId {
    /// The all-zero id, used on the wire for "no callable".
    pub const NONE: CallableId = CallableId([0; 32]);

    /// The digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for CallableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for CallableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallableId(")?;
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_sha256_of_the_documented_encoding() {
        let d = CallableDescriptor::new(CallableKind::SubWorker, "ab")
            .with_signature(&[ParamDirection::In, ParamDirection::Scalar]);
        let mut expected = vec![];
        expected.extend_from_slice(&1u32.to_le_bytes());
        expected.extend_from_slice(&4u32.to_le_bytes());
        expected.extend_from_slice(&2u32.to_le_bytes());
        expected.extend_from_slice(b"ab");
        expected.extend_from_slice(&1u32.to_le_bytes());
        expected.extend_from_slice(&2u32.to_le_bytes());
        expected.extend_from_slice(&[1, 0]);
        assert_eq!(d.encode(), expected);
        // Known-answer: sha256 of the empty string, to pin the hash function itself.
        let empty: [u8; 32] = Sha256::digest([]).into();
        assert_eq!(
            CallableId(empty).to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn distinct_descriptors_have_distinct_digests() {
        let base = CallableDescriptor::new(CallableKind::Kernel, "k");
        let others = [
            CallableDescriptor::new(CallableKind::ChipOrchestration, "k"),
            CallableDescriptor::new(CallableKind::Kernel, "k2"),
            base.clone().with_version(2),
            base.clone().with_signature(&[ParamDirection::In]),
        ];
        for o in &others {
            assert_ne!(base.digest(), o.digest());
        }
    }

    #[test]
    fn nonces_and_minted_ids_are_distinct() {
        let a = OwnerNonce::fresh();
        let b = OwnerNonce::fresh();
        assert_ne!(a, b);
        let m = IdentityMinter::with_owner(a);
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| m.mint()).collect();
        assert_eq!(ids.len(), 1000);
        let x = BufferIdentity::new(a, 1, u32::MAX).unwrap();
        assert_eq!(x.next_generation().generation(), 1);
    }
}
