//! The fuzz target's body (`fuzz/src/lib.rs`, target `mount_fsck`) on seeded
//! inputs, on the stable toolchain and in CI: scrub's checks, the raw replica
//! repair, mount, fsck, repair and reads of damaged and undamaged pools never
//! panic or hang, and a pool fsck calls clean stays clean through operations and
//! a remount. The fuzz crate itself (libFuzzer, nightly) is outside the workspace;
//! this runs its code without it. FERRITE_FUZZ_SMOKE sets the input count.

#[allow(dead_code)]
#[path = "../../../fuzz/src/lib.rs"]
mod fuzz_body;

fn rng(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn seeded_fuzz_inputs_neither_panic_nor_break_a_clean_pool() {
    fuzz_body::run(&[]);
    fuzz_body::run(&[0]);
    fuzz_body::run(&[1]);
    let n: u64 =
        std::env::var("FERRITE_FUZZ_SMOKE").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let mut s = 7u64;
    for i in 0..n {
        let len = (rng(&mut s) % 3000) as usize;
        let mut input: Vec<u8> = (0..len).map(|_| rng(&mut s) as u8).collect();
        if input.is_empty() {
            continue;
        }
        // Mostly recipes (deep valid pools) with a little damage; some raw images.
        input[0] = if i % 8 == 0 { 0 } else { 1 };
        if input.len() > 2 {
            input[1] = input[1].max(40);
            let damage_at = 2 + 4 * input[1] as usize + 1;
            if i % 3 == 0 && input.len() > damage_at {
                input.truncate(damage_at + 5 * (i as usize % 4));
            }
        }
        fuzz_body::run(&input);
    }
}
