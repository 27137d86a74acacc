//! strata-mailbox
