//! Argument tags: how a task accesses a tensor, which is what dependencies are inferred from.

use crate::error::TypesError;
use std::fmt;

/// How a task accesses one of its tensor arguments.
///
/// strata guarantees the result of a sequential execution in submit order: a reader waits
/// for earlier overlapping writers (read-after-write), a writer waits for earlier
/// overlapping writers *and* readers (write-after-write, write-after-read). Only
/// [`ArgTag::NoDep`] opts out.
///
/// The discriminants are stable wire codes.
///
/// ```
/// use strata_types::ArgTag;
/// assert!(ArgTag::InOut.reads() && ArgTag::InOut.writes());
/// assert!(!ArgTag::NoDep.tracked());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ArgTag {
    /// Read only.
    Input = 0,
    /// Written in full or in part; the previous contents are not read.
    Output = 1,
    /// Read, then written.
    InOut = 2,
    /// Written into an existing buffer the caller owns (same dependency rules as `Output`).
    OutputExisting = 3,
    /// Passed to the task but not tracked: ordering against it is the caller's job.
    NoDep = 4,
}

impl ArgTag {
    /// Every tag, in wire-code order.
    pub const ALL: [ArgTag; 5] = [
        ArgTag::Input,
        ArgTag::Output,
        ArgTag::InOut,
        ArgTag::OutputExisting,
        ArgTag::NoDep,
    ];

    /// Whether the task reads the tensor (for dependency purposes).
    pub const fn reads(self) -> bool {
        matches!(self, ArgTag::Input | ArgTag::InOut)
    }

    /// Whether the task writes the tensor (for dependency purposes).
    pub const fn writes(self) -> bool {
        matches!(
            self,
            ArgTag::Output | ArgTag::InOut | ArgTag::OutputExisting
        )
    }

    /// Whether the tag takes part in dependency inference at all.
    pub const fn tracked(self) -> bool {
        !matches!(self, ArgTag::NoDep)
    }

    /// The stable wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Decodes a wire code.
    ///
    /// # Errors
    /// [`TypesError::UnknownArgTag`] if `code` names no tag.
    pub fn from_code(code: u8) -> Result<Self, TypesError> {
        Self::ALL
            .get(code as usize)
            .copied()
            .ok_or(TypesError::UnknownArgTag { code })
    }

    /// Upper-case name as in the reference runtime (`INPUT`, `OUTPUT_EXISTING`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ArgTag::Input => "INPUT",
            ArgTag::Output => "OUTPUT",
            ArgTag::InOut => "INOUT",
            ArgTag::OutputExisting => "OUTPUT_EXISTING",
            ArgTag::NoDep => "NO_DEP",
        }
    }
}

impl fmt::Display for ArgTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_reference_wire_abi() {
        assert_eq!(ArgTag::Input.code(), 0);
        assert_eq!(ArgTag::Output.code(), 1);
        assert_eq!(ArgTag::InOut.code(), 2);
        assert_eq!(ArgTag::OutputExisting.code(), 3);
        assert_eq!(ArgTag::NoDep.code(), 4);
        for t in ArgTag::ALL {
            assert_eq!(ArgTag::from_code(t.code()).unwrap(), t);
        }
        assert_eq!(
            ArgTag::from_code(5),
            Err(TypesError::UnknownArgTag { code: 5 })
        );
    }
}
