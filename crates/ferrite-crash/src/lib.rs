//! Crash-consistency simulator for FerriteFS (work in progress).
#![forbid(unsafe_code)]

pub mod exec;
pub mod gen;
pub mod model;
pub mod rng;
