//! Who a program is: the ELF build-id of the running executable (the linker's
//! `.note.gnu.build-id`, which changes whenever the code does), or, for an executable
//! linked without one, the SHA-256 of its file.

use crate::error::NetError;
use object::{Object, ObjectSection};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::OnceLock;

/// The build-id of the executable at `path`.
///
/// # Errors
/// The file cannot be read.
pub fn build_id_of(path: &Path) -> Result<Vec<u8>, NetError> {
    let bytes =
        std::fs::read(path).map_err(|e| NetError::io(format!("reading {}", path.display()), e))?;
    if let Ok(file) = object::File::parse(&*bytes) {
        if let Ok(Some(id)) = file.build_id() {
            if !id.is_empty() {
                return Ok(id.to_vec());
            }
        }
        // Some linkers keep the note only as a section.
        if let Some(sec) = file.section_by_name(".note.gnu.build-id") {
            if let Ok(data) = sec.data() {
                if data.len() > 16 {
                    return Ok(data[16..].to_vec());
                }
            }
        }
    }
    Ok(Sha256::digest(&bytes).to_vec())
}

/// The build-id of this process's executable (read once).
///
/// # Errors
/// `/proc/self/exe` cannot be read.
pub fn own_build_id() -> Result<Vec<u8>, NetError> {
    static ID: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();
    ID.get_or_init(|| build_id_of(Path::new("/proc/self/exe")).map_err(|e| e.to_string()))
        .clone()
        .map_err(NetError::Config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_test_binary_has_a_stable_build_id() {
        let a = own_build_id().unwrap();
        let b = build_id_of(&std::env::current_exe().unwrap()).unwrap();
        assert_eq!(a, b);
        assert!(a.len() >= 16, "{a:?}");
    }
}
