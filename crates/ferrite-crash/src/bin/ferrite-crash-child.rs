//! Child process of the real-crash test (work in progress).
fn main() {}
