//! The one error convention of every user callback: kernels, chip orchestrations, host
//! orchestrations and host sub-worker closures all return a [`CallbackResult`].
//!
//! The error is a [`BoxError`], so `?` works on any error type (a runtime error, an I/O
//! error, the caller's own) and `Err("message".into())` works for a plain message. Where
//! the runtime needs structure from a callback's error (a chip error with a fatal code),
//! it downcasts the box (`err.downcast_ref::<ChipError>()`); where the error leaves the
//! process it travels as its message, [`error_chain`].
//!
//! ```
//! use strata_types::{error_chain, CallbackResult};
//!
//! fn parse(s: &str) -> CallbackResult<u32> {
//!     let n: u32 = s.parse()?; // any error converts
//!     if n == 0 {
//!         return Err("zero is not a valid block count".into()); // a plain message
//!     }
//!     Ok(n)
//! }
//! assert_eq!(parse("4").unwrap(), 4);
//! assert_eq!(error_chain(&*parse("0").unwrap_err()), "zero is not a valid block count");
//! assert!(error_chain(&*parse("x").unwrap_err()).contains("invalid digit"));
//! ```

use std::error::Error;

/// A boxed error: what every user callback returns on failure.
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// What every user callback returns: `Ok(value)` (usually `()`) or any error, boxed.
pub type CallbackResult<T = ()> = Result<T, BoxError>;

/// The message of an error and of its [`Error::source`] chain, joined with `": "`.
///
/// A source whose message the text so far already contains (an error type whose own
/// message embeds its cause) is not repeated.
///
/// ```
/// use strata_types::error_chain;
/// #[derive(Debug)]
/// struct Outer(std::io::Error);
/// impl std::fmt::Display for Outer {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("loading the weights")
///     }
/// }
/// impl std::error::Error for Outer {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
/// let e = Outer(std::io::Error::new(std::io::ErrorKind::NotFound, "w.bin is missing"));
/// assert_eq!(error_chain(&e), "loading the weights: w.bin is missing");
/// ```
pub fn error_chain(err: &(dyn Error + 'static)) -> String {
    let mut message = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        let part = e.to_string();
        if !part.is_empty() && !message.contains(&part) {
            message.push_str(": ");
            message.push_str(&part);
        }
        next = e.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Embeds(#[source] std::io::Error);

    #[test]
    fn chains_are_joined_without_repeating_embedded_causes() {
        let io = || std::io::Error::other("disk on fire");
        assert_eq!(error_chain(&Embeds(io())), "outer: disk on fire");
        let boxed: BoxError = "plain".into();
        assert_eq!(error_chain(&*boxed), "plain");
        let boxed: BoxError = Box::new(Embeds(io()));
        assert!(boxed.downcast_ref::<Embeds>().is_some());
    }
}
