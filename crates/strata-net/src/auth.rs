//! The shared secret and the challenge–response that proves both ends hold it.
//!
//! Each side sends a fresh 32-byte nonce; each proves the secret with
//! HMAC-SHA256(secret, role label ‖ session ‖ the other's nonce ‖ its own nonce). The
//! secret never crosses the wire, a recorded proof is useless in another session (fresh
//! nonces from both sides), and the role labels differ, so a proof cannot be reflected
//! back. Proofs are compared in constant time (`hmac`'s `verify_slice`).

use crate::error::NetError;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::Read;
use std::path::Path;

type HmacSha256 = Hmac<Sha256>;

/// The fewest bytes a secret may have.
pub const MIN_SECRET_BYTES: usize = 16;

/// A shared secret (its bytes are never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

impl Secret {
    /// A secret from its bytes.
    ///
    /// # Errors
    /// Fewer than [`MIN_SECRET_BYTES`] bytes.
    pub fn new(bytes: Vec<u8>) -> Result<Secret, NetError> {
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(NetError::Config(format!(
                "the secret has {} bytes; use at least {MIN_SECRET_BYTES} (e.g. `head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE`)",
                bytes.len()
            )));
        }
        Ok(Secret(bytes))
    }

    /// Reads a secret file: a regular file that neither its group nor others may read or
    /// write (mode `0600` or stricter), whose content (surrounding whitespace trimmed) is
    /// the secret.
    ///
    /// # Errors
    /// A file that cannot be read, that others may read ("chmod 600 PATH"), or that holds
    /// too short a secret.
    pub fn from_file(path: &Path) -> Result<Secret, NetError> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path)
            .map_err(|e| NetError::io(format!("secret file {}", path.display()), e))?;
        if !meta.is_file() {
            return Err(NetError::Config(format!(
                "secret file {} is not a regular file",
                path.display()
            )));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(NetError::Config(format!(
                "secret file {} has mode {mode:03o}: its group or others may read it; run `chmod 600 {}`",
                path.display(),
                path.display()
            )));
        }
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| NetError::io(format!("secret file {}", path.display()), e))?;
        let trimmed = bytes.trim_ascii().to_vec();
        Secret::new(trimmed)
            .map_err(|e| NetError::Config(format!("secret file {}: {e}", path.display())))
    }

    /// The secret as lowercase hex (for handing it to a launched process's environment).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// A secret from lowercase or uppercase hex.
    ///
    /// # Errors
    /// Not hex, or too short.
    pub fn from_hex(s: &str) -> Result<Secret, NetError> {
        let b = unhex(s).ok_or_else(|| NetError::Config("the secret is not hex".into()))?;
        Secret::new(b)
    }

    /// A secret derived from this one for one purpose (`label`), e.g. one job's session
    /// secret from a long-lived one.
    pub fn derive(&self, label: &[u8]) -> Secret {
        let mut m = HmacSha256::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        m.update(b"strata-net derive\0");
        m.update(label);
        Secret(m.finalize().into_bytes().to_vec())
    }
}

/// Which side of the handshake a proof is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that connected and sent HELLO.
    Initiator,
    /// The side that accepted and sent CHALLENGE.
    Responder,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Initiator => b"strata-net initiator\0",
            Role::Responder => b"strata-net responder\0",
        }
    }
}

fn mac(
    secret: &Secret,
    role: Role,
    session: u64,
    theirs: &[u8; 32],
    mine: &[u8; 32],
) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(&secret.0)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    m.update(role.label());
    m.update(&session.to_le_bytes());
    m.update(theirs);
    m.update(mine);
    m
}

/// The proof `role` sends: over the other side's nonce `theirs` and its own `mine`.
pub fn prove(
    secret: &Secret,
    role: Role,
    session: u64,
    theirs: &[u8; 32],
    mine: &[u8; 32],
) -> [u8; 32] {
    mac(secret, role, session, theirs, mine)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks, in constant time, a proof `role` sent (over our nonce `ours` and its own
/// `their_nonce`).
pub fn verify(
    secret: &Secret,
    role: Role,
    session: u64,
    ours: &[u8; 32],
    their_nonce: &[u8; 32],
    proof: &[u8; 32],
) -> bool {
    mac(secret, role, session, ours, their_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// `n` bytes from the kernel's random source.
///
/// # Errors
/// `/dev/urandom` cannot be read.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], NetError> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| NetError::io("reading /dev/urandom", e))?;
    Ok(b)
}

/// Lowercase hex of `b`.
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// The bytes of hex string `s`, if it is one.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    let s = s.trim();
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_secret_nonces_session_and_role() {
        let s = Secret::new(vec![7; 32]).unwrap();
        let other = Secret::new(vec![8; 32]).unwrap();
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let p = prove(&s, Role::Responder, 9, &a, &b);
        assert!(verify(&s, Role::Responder, 9, &a, &b, &p));
        assert!(!verify(&other, Role::Responder, 9, &a, &b, &p));
        assert!(!verify(&s, Role::Initiator, 9, &a, &b, &p), "reflected");
        assert!(
            !verify(&s, Role::Responder, 10, &a, &b, &p),
            "other session"
        );
        assert!(
            !verify(&s, Role::Responder, 9, &b, &a, &p),
            "nonces swapped"
        );
    }

    #[test]
    fn secret_files_readable_by_others_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("strata-net-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("secret");
        std::fs::write(&f, "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Secret::from_file(&f).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = Secret::from_file(&f).unwrap();
        assert_eq!(
            s,
            Secret::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap()
        );
        std::fs::write(&f, "short").unwrap();
        assert!(Secret::from_file(&f)
            .unwrap_err()
            .to_string()
            .contains("at least"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hex_round_trips() {
        let s = Secret::new((0..40u8).collect()).unwrap();
        assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
    }
}
