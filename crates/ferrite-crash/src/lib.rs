//! FerriteFS crash-consistency simulator.
//!
//! Runs named and random workloads on a simulated persistent-memory pool
//! ([`ferrite_core::SimMedium`]) that records every store, flush and fence; at every
//! fence point it builds crash images (what is certainly durable plus chosen subsets
//! of the words still in flight, at 8-byte granularity), recovers each one, runs fsck
//! and compares the visible tree with a reference model: it must equal the state
//! before or after the operation in flight, never anything in between. Crashes during
//! recovery are explored too, injected persistence faults must be detected, and real
//! child processes are SIGKILLed at random moments. See docs/CRASH-SIMULATOR.md.
//!
//! Modules: [`model`] (reference tree, operations), [`exec`] (operations on a live
//! pool, canonical tree), [`gen`] (model-based random workloads), [`workloads`]
//! (the named suite), [`drive`] (running a workload under a fence hook), [`subset`]
//! (in-flight subsets), [`sched`] (the step scheduler of concurrent
//! workloads), [`clients`] (daemon and direct-client workloads), [`check`] (the oracle), [`explore`] (budgets, parallel
//! checking, fault scans, replay), [`process`] (real process kills), [`cli`].
#![forbid(unsafe_code)]

pub mod check;
pub mod cli;
pub mod clients;
pub mod drive;
pub mod exec;
pub mod explore;
pub mod gen;
pub mod model;
pub mod process;
pub mod rng;
pub mod sched;
pub mod subset;
pub mod workloads;

pub use cli::{run, CrashArgs};
