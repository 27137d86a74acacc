//! Device memory: the arena (one anonymous mapping) with the typed views kernels get of
//! it ([`arena`]), and the allocator with its checked handles ([`memory`]).

pub(crate) mod arena;
pub(crate) mod memory;
