//! Stable-toolchain smoke test of the fuzz target's body: a few thousand seeded
//! inputs of both modes (not run in CI; the fuzz crate is outside the workspace).
//! Run with `cargo test --manifest-path fuzz/Cargo.toml --release`.

fn rng(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn seeded_inputs_do_not_panic() {
    ferrite_fuzz::run(&[]);
    ferrite_fuzz::run(&[0]);
    ferrite_fuzz::run(&[1]);
    let n: u64 = std::env::var("SMOKE_INPUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let mut s = 1u64;
    for i in 0..n {
        let len = (rng(&mut s) % 3000) as usize;
        let mut input: Vec<u8> = (0..len).map(|_| rng(&mut s) as u8).collect();
        if input.is_empty() {
            continue;
        }
        // Mostly recipes with a little damage; some raw images.
        input[0] = if i % 8 == 0 { 0 } else { 1 };
        if input.len() > 2 {
            input[1] = input[1].max(40);
            let damage_at = 2 + 4 * input[1] as usize + 1;
            if i % 3 == 0 && input.len() > damage_at {
                input.truncate(damage_at + 5 * (i as usize % 4));
            }
        }
        ferrite_fuzz::run(&input);
    }
}
