//! Control requests a scheduler sends a child outside task dispatch (chip device memory),
//! typed, with the one encoding into a mailbox control frame that both ends use: the
//! engine encodes ([`ControlCommand::to_request`], in the local endpoint) and the chip
//! child decodes ([`ControlCommand::from_request`], in its handler).
//!
//! Wire form (`command`, `arg0`, payload):
//!
//! | request | command | arg0 | payload |
//! |---|---|---|---|
//! | [`ControlCommand::Allocate`] | 1 | bytes | empty |
//! | [`ControlCommand::Free`] | 2 | device address | empty |
//! | [`ControlCommand::Copy`] to the device | 3 | byte offset in the allocation | device address, region, offset, length (4 × `u64` LE) |
//! | [`ControlCommand::Copy`] from the device | 4 | as 3 | as 3 |
//! | [`ControlCommand::CommittedBytes`] | 5 | 0 | empty |
//! | [`ControlCommand::FreeBytes`] | 6 | 0 | empty |
//! | [`ControlCommand::AllocateOn`] | 7 | bytes | chip (`u64` LE) |
//! | [`ControlCommand::CommittedBytesOn`] | 8 | chip | empty |
//! | [`ControlCommand::FreeBytesOn`] | 9 | chip | empty |
//!
//! The reply is the result word: the device address for `Allocate`, the bytes the chip's
//! allocator holds for `CommittedBytes`, the bytes it could still hand out for
//! `FreeBytes`, 0 otherwise.
//!
//! Commands 1–6 go to a chip child. A level-3 worker child (of a level-4 worker) takes
//! 7–9, which name one of its chips, and `Free` / `Copy`, whose address is then the
//! handle its `AllocateOn` replied with (the worker child keeps the table from handles to
//! its chips' tensors).

use strata_mailbox::ControlRequest;

/// Which way a [`ControlCommand::Copy`] moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyDirection {
    /// Shared host memory → device memory.
    ToDevice,
    /// Device memory → shared host memory.
    FromDevice,
}

/// One control request for a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlCommand {
    /// Allocate `bytes` of device memory; the reply is the allocation's device address.
    Allocate {
        /// Bytes to allocate.
        bytes: u64,
    },
    /// Free the allocation that starts at device address `addr`.
    Free {
        /// The allocation's base address.
        addr: u64,
    },
    /// Copy `len` bytes between the allocation at device address `addr`, from its byte
    /// `dev_offset` on, and shared-memory region `region` at `offset` (both ranges are
    /// bounds-checked by the child, without overflow).
    Copy {
        /// Which way.
        direction: CopyDirection,
        /// The device allocation's base address.
        addr: u64,
        /// The byte offset in the allocation.
        dev_offset: u64,
        /// The shared-memory region id (`BufferLocation::HostShared::region`).
        region: u64,
        /// The byte offset in the region.
        offset: u64,
        /// Bytes to copy.
        len: u64,
    },
    /// How many bytes the chip's device allocator holds; the reply is that count.
    CommittedBytes,
    /// How many bytes the chip's emulated card could still hand out; the reply is that
    /// count (its capacity is the parent's `ChipConfig::device_memory_bytes`).
    FreeBytes,
    /// To a level-3 worker child: allocate `bytes` on its chip `chip`; the reply is the
    /// handle that later `Free` and `Copy` requests (and task arguments) name.
    AllocateOn {
        /// The worker child's chip (its next-level worker id there).
        chip: u32,
        /// Bytes to allocate.
        bytes: u64,
    },
    /// To a level-3 worker child: [`ControlCommand::CommittedBytes`] of its chip `chip`.
    CommittedBytesOn {
        /// The worker child's chip.
        chip: u32,
    },
    /// To a level-3 worker child: [`ControlCommand::FreeBytes`] of its chip `chip`.
    FreeBytesOn {
        /// The worker child's chip.
        chip: u32,
    },
}

/// Payload bytes of a [`ControlCommand::Copy`].
pub const COPY_PAYLOAD_BYTES: usize = 32;

/// Command words of the wire form.
mod word {
    pub(super) const ALLOCATE: u64 = 1;
    pub(super) const FREE: u64 = 2;
    pub(super) const COPY_TO_DEVICE: u64 = 3;
    pub(super) const COPY_FROM_DEVICE: u64 = 4;
    pub(super) const COMMITTED_BYTES: u64 = 5;
    pub(super) const FREE_BYTES: u64 = 6;
    pub(super) const ALLOCATE_ON: u64 = 7;
    pub(super) const COMMITTED_BYTES_ON: u64 = 8;
    pub(super) const FREE_BYTES_ON: u64 = 9;
}

/// Why a control frame does not decode to a [`ControlCommand`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlDecodeError {
    /// The command word names no request.
    #[error("control command {0} is not a request this engine sends")]
    UnknownCommand(u64),
    /// The payload has the wrong length for the command.
    #[error("control command {command}: payload is {len} bytes, expected {expected}")]
    PayloadLength {
        /// The command word.
        command: u64,
        /// The payload's length.
        len: usize,
        /// The length the command takes.
        expected: usize,
    },
    /// `arg0` is set for a command that takes none.
    #[error("control command {command}: arg0 is {arg0}, expected 0")]
    UnexpectedArgument {
        /// The command word.
        command: u64,
        /// The argument found.
        arg0: u64,
    },
    /// A chip number that does not fit 32 bits.
    #[error("control command {command}: chip {chip} does not fit 32 bits")]
    ChipOutOfRange {
        /// The command word.
        command: u64,
        /// The chip number found.
        chip: u64,
    },
}

impl ControlCommand {
    /// The request in a mailbox control frame; a copy's payload is written into `payload`
    /// (which the request borrows).
    pub fn to_request<'p>(&self, payload: &'p mut [u8; COPY_PAYLOAD_BYTES]) -> ControlRequest<'p> {
        let (command, arg0, words) = match *self {
            ControlCommand::Allocate { bytes } => (word::ALLOCATE, bytes, None),
            ControlCommand::Free { addr } => (word::FREE, addr, None),
            ControlCommand::Copy {
                direction,
                addr,
                dev_offset,
                region,
                offset,
                len,
            } => {
                let command = match direction {
                    CopyDirection::ToDevice => word::COPY_TO_DEVICE,
                    CopyDirection::FromDevice => word::COPY_FROM_DEVICE,
                };
                (command, dev_offset, Some([addr, region, offset, len]))
            }
            ControlCommand::CommittedBytes => (word::COMMITTED_BYTES, 0, None),
            ControlCommand::FreeBytes => (word::FREE_BYTES, 0, None),
            ControlCommand::AllocateOn { chip, bytes } => {
                payload[..8].copy_from_slice(&u64::from(chip).to_le_bytes());
                return ControlRequest {
                    command: word::ALLOCATE_ON,
                    arg0: bytes,
                    payload: &payload[..8],
                };
            }
            ControlCommand::CommittedBytesOn { chip } => {
                (word::COMMITTED_BYTES_ON, u64::from(chip), None)
            }
            ControlCommand::FreeBytesOn { chip } => (word::FREE_BYTES_ON, u64::from(chip), None),
        };
        let len = match words {
            Some(w) => {
                for (chunk, v) in payload.chunks_exact_mut(8).zip(w) {
                    chunk.copy_from_slice(&v.to_le_bytes());
                }
                COPY_PAYLOAD_BYTES
            }
            None => 0,
        };
        ControlRequest {
            command,
            arg0,
            payload: &payload[..len],
        }
    }

    /// Decodes a control frame written by [`ControlCommand::to_request`].
    ///
    /// # Errors
    /// An unknown command word, a payload of the wrong length, or an `arg0` for a command
    /// that takes none ([`ControlDecodeError`]); never a panic.
    pub fn from_request(req: &ControlRequest<'_>) -> Result<ControlCommand, ControlDecodeError> {
        let expect_len = |expected: usize| {
            if req.payload.len() == expected {
                Ok(())
            } else {
                Err(ControlDecodeError::PayloadLength {
                    command: req.command,
                    len: req.payload.len(),
                    expected,
                })
            }
        };
        let no_arg = || {
            if req.arg0 == 0 {
                Ok(())
            } else {
                Err(ControlDecodeError::UnexpectedArgument {
                    command: req.command,
                    arg0: req.arg0,
                })
            }
        };
        let chip = |v: u64| {
            u32::try_from(v).map_err(|_| ControlDecodeError::ChipOutOfRange {
                command: req.command,
                chip: v,
            })
        };
        match req.command {
            word::ALLOCATE => {
                expect_len(0)?;
                Ok(ControlCommand::Allocate { bytes: req.arg0 })
            }
            word::FREE => {
                expect_len(0)?;
                Ok(ControlCommand::Free { addr: req.arg0 })
            }
            word::COPY_TO_DEVICE | word::COPY_FROM_DEVICE => {
                expect_len(COPY_PAYLOAD_BYTES)?;
                let mut w = [0u64; 4];
                for (v, chunk) in w.iter_mut().zip(req.payload.chunks_exact(8)) {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(chunk);
                    *v = u64::from_le_bytes(b);
                }
                let [addr, region, offset, len] = w;
                let direction = if req.command == word::COPY_TO_DEVICE {
                    CopyDirection::ToDevice
                } else {
                    CopyDirection::FromDevice
                };
                Ok(ControlCommand::Copy {
                    direction,
                    addr,
                    dev_offset: req.arg0,
                    region,
                    offset,
                    len,
                })
            }
            word::COMMITTED_BYTES => {
                expect_len(0)?;
                no_arg()?;
                Ok(ControlCommand::CommittedBytes)
            }
            word::FREE_BYTES => {
                expect_len(0)?;
                no_arg()?;
                Ok(ControlCommand::FreeBytes)
            }
            word::ALLOCATE_ON => {
                expect_len(8)?;
                let mut b = [0u8; 8];
                b.copy_from_slice(req.payload);
                Ok(ControlCommand::AllocateOn {
                    chip: chip(u64::from_le_bytes(b))?,
                    bytes: req.arg0,
                })
            }
            word::COMMITTED_BYTES_ON => {
                expect_len(0)?;
                Ok(ControlCommand::CommittedBytesOn {
                    chip: chip(req.arg0)?,
                })
            }
            word::FREE_BYTES_ON => {
                expect_len(0)?;
                Ok(ControlCommand::FreeBytesOn {
                    chip: chip(req.arg0)?,
                })
            }
            other => Err(ControlDecodeError::UnknownCommand(other)),
        }
    }

    /// The request's name in messages.
    pub fn name(&self) -> &'static str {
        match self {
            ControlCommand::Allocate { .. } => "allocate",
            ControlCommand::Free { .. } => "free",
            ControlCommand::Copy {
                direction: CopyDirection::ToDevice,
                ..
            } => "copy to device",
            ControlCommand::Copy {
                direction: CopyDirection::FromDevice,
                ..
            } => "copy from device",
            ControlCommand::CommittedBytes => "committed bytes",
            ControlCommand::FreeBytes => "free bytes",
            ControlCommand::AllocateOn { .. } => "allocate on a chip",
            ControlCommand::CommittedBytesOn { .. } => "committed bytes of a chip",
            ControlCommand::FreeBytesOn { .. } => "free bytes of a chip",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_variant() -> Vec<ControlCommand> {
        let mut v = vec![
            ControlCommand::Allocate { bytes: 0 },
            ControlCommand::Allocate { bytes: u64::MAX },
            ControlCommand::Free { addr: 0x1000 },
            ControlCommand::CommittedBytes,
            ControlCommand::FreeBytes,
            ControlCommand::AllocateOn {
                chip: u32::MAX,
                bytes: 1 << 40,
            },
            ControlCommand::CommittedBytesOn { chip: 3 },
            ControlCommand::FreeBytesOn { chip: 0 },
        ];
        for direction in [CopyDirection::ToDevice, CopyDirection::FromDevice] {
            v.push(ControlCommand::Copy {
                direction,
                addr: 0xdead_beef_0000,
                dev_offset: u64::MAX,
                region: 7,
                offset: u64::MAX - 1,
                len: 4096,
            });
        }
        v
    }

    #[test]
    fn every_variant_round_trips() {
        for c in every_variant() {
            let mut buf = [0u8; COPY_PAYLOAD_BYTES];
            let req = c.to_request(&mut buf);
            assert_eq!(ControlCommand::from_request(&req), Ok(c), "{c:?}");
        }
    }

    #[test]
    fn wire_form_is_the_documented_one() {
        let mut buf = [0u8; COPY_PAYLOAD_BYTES];
        let req = ControlCommand::Copy {
            direction: CopyDirection::FromDevice,
            addr: 1,
            dev_offset: 5,
            region: 2,
            offset: 3,
            len: 4,
        }
        .to_request(&mut buf);
        assert_eq!((req.command, req.arg0), (4, 5));
        let mut expected = Vec::new();
        for v in [1u64, 2, 3, 4] {
            expected.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(req.payload, &expected[..]);
        let req = ControlCommand::Allocate { bytes: 64 }.to_request(&mut buf);
        assert_eq!((req.command, req.arg0, req.payload.len()), (1, 64, 0));
    }

    #[test]
    fn malformed_requests_are_typed_errors() {
        let req = |command, arg0, payload: &'static [u8]| ControlRequest {
            command,
            arg0,
            payload,
        };
        assert_eq!(
            ControlCommand::from_request(&req(0, 0, &[])),
            Err(ControlDecodeError::UnknownCommand(0))
        );
        assert_eq!(
            ControlCommand::from_request(&req(99, 1, &[1, 2])),
            Err(ControlDecodeError::UnknownCommand(99))
        );
        for command in [3, 4] {
            assert_eq!(
                ControlCommand::from_request(&req(command, 0, &[0; 31])),
                Err(ControlDecodeError::PayloadLength {
                    command,
                    len: 31,
                    expected: 32
                })
            );
        }
        for command in [1, 2, 5, 6] {
            assert_eq!(
                ControlCommand::from_request(&req(command, 0, &[0; 8])),
                Err(ControlDecodeError::PayloadLength {
                    command,
                    len: 8,
                    expected: 0
                })
            );
        }
        for command in [5, 6] {
            assert_eq!(
                ControlCommand::from_request(&req(command, 1, &[])),
                Err(ControlDecodeError::UnexpectedArgument { command, arg0: 1 })
            );
        }
        assert_eq!(
            ControlCommand::from_request(&req(7, 64, &[0; 4])),
            Err(ControlDecodeError::PayloadLength {
                command: 7,
                len: 4,
                expected: 8
            })
        );
        assert_eq!(
            ControlCommand::from_request(&req(7, 64, &[0, 0, 0, 0, 1, 0, 0, 0])),
            Err(ControlDecodeError::ChipOutOfRange {
                command: 7,
                chip: 1 << 32
            })
        );
        for command in [8, 9] {
            assert_eq!(
                ControlCommand::from_request(&req(command, u64::MAX, &[])),
                Err(ControlDecodeError::ChipOutOfRange {
                    command,
                    chip: u64::MAX
                })
            );
        }
    }
}
