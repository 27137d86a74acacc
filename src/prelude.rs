//! What a program's code uses, in one import: `use strata::prelude::*;`.

pub use crate::program::{Dim, Direction, ScalarValue};
pub use crate::{
    Arg, Compiled, CopyRange, DeviceTensor, DispatchHandle, Error, Prepare, PreparedWorker,
    Program, ProgramArgs, ProgramTensor, Signature, StackedDeviceTensor, Target,
};
pub use strata_chip::{ChipArgs, ChipConfig, ChipOrch, CoreArgs, KernelCtx, KernelError};
pub use strata_dist::{Orch, ReduceOp};
pub use strata_host::{SharedTensor, SubCall};
pub use strata_types::{ArgTag, CallConfig, CallbackResult, DataType, TaskArgs};
