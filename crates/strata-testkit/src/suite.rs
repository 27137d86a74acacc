//! Contract suites: a scenario written once over a parameter known at compile time (the
//! execution mode of a worker's children, an implementation of a seam) and run once per
//! value of it, in the manner of iceoryx2's conformance tests.
//!
//! A contract is a generic function `fn name<V: Variant>() -> Outcome`; each binary of a
//! suite picks its variant and instantiates the whole list with [`contracts!`](crate::contracts), so every
//! instance is a plain [`Scenario`](crate::Scenario) that [`run`](crate::run) executes in
//! order, with its leak check, like any other. Scenarios that only make sense for one
//! variant are listed beside the instances in that variant's binary.
//!
//! The parameter is a type rather than a value so that an instance is a `fn()` pointer
//! (a closure over the value could not be one) and a contract cannot be forgotten by one
//! binary: the list is written once, next to the contracts.
//!
//! ```
//! use strata_testkit::suite::Variant;
//! use strata_testkit::{check, contracts, Outcome, Scenario};
//!
//! struct Doubled;
//! impl Variant for Doubled {
//!     type Value = u32;
//!     const VALUE: u32 = 2;
//!     const NAME: &'static str = "doubled";
//! }
//!
//! fn scales_by_the_variant<V: Variant<Value = u32>>() -> Outcome {
//!     check!(3 * V::VALUE == 6, "{} scales by {}", V::NAME, V::VALUE);
//!     Ok(())
//! }
//!
//! fn suite<V: Variant<Value = u32>>() -> Vec<Scenario> {
//!     contracts![V; scales_by_the_variant]
//! }
//!
//! let instances = suite::<Doubled>();
//! assert_eq!(instances[0].0, "scales_by_the_variant");
//! assert!((instances[0].1)().is_ok());
//! ```

use strata_types::{TaskArgs, TensorArg};

/// One value of a suite's parameter, as a type: a contract generic over `V: Variant`
/// reads the value as `V::VALUE`.
pub trait Variant: 'static {
    /// The parameter's type (e.g. an execution mode).
    type Value: Copy + std::fmt::Debug;
    /// The value this variant stands for.
    const VALUE: Self::Value;
    /// How the variant is named in messages.
    const NAME: &'static str;
}

/// The instances of the listed contracts for one variant, as named scenarios: each name
/// is the contract's function name, so a contract keeps its name in every binary and the
/// runner's name filter selects it in each.
///
/// `contracts![V; first, second]` expands to
/// `vec![("first", first::<V> as fn() -> Outcome), ("second", …)]`.
#[macro_export]
macro_rules! contracts {
    ($variant:ty; $($contract:ident),+ $(,)?) => {
        vec![$(
            (
                stringify!($contract),
                $contract::<$variant> as fn() -> $crate::Outcome,
            )
        ),+]
    };
}

/// Task arguments from tensors then scalars (raw 64-bit words), the shape every suite's
/// callables take; panics only if the lists exceed [`TaskArgs`]' limits, which a scenario
/// chooses.
pub fn task_args(tensors: &[TensorArg], scalars: &[u64]) -> TaskArgs {
    let mut args = TaskArgs::new();
    for t in tensors {
        args.push_tensor(*t)
            .expect("a scenario's tensor list fits TaskArgs");
    }
    for s in scalars {
        args.push_scalar_bits(*s)
            .expect("a scenario's scalar list fits TaskArgs");
    }
    args
}
