//! strata-graph
