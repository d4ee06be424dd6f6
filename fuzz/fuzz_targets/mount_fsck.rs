//! Fuzz target: mount arbitrary bytes as a pool image, scrub and fsck it, repair it
//! when damaged, read everything, and (when fsck calls it clean) use it. See `ferrite_fuzz::run` for the input
//! format and fuzz/README.md for how to run it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferrite_fuzz::run(data);
});
