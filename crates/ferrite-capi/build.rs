//! Generates include/ferrite.h from the exported functions and types (cbindgen).
//! The header is written only when its content changes, so the crate does not
//! rebuild itself in a loop.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let cfg = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let out = std::path::Path::new(&dir).join("include/ferrite.h");
    match cbindgen::Builder::new().with_crate(&dir).with_config(cfg).generate() {
        Ok(b) => {
            let mut v = Vec::new();
            b.write(&mut v);
            if std::fs::read(&out).ok().as_deref() != Some(&v[..]) {
                std::fs::write(&out, v).expect("write include/ferrite.h");
            }
        }
        Err(e) => panic!("cbindgen: {e}"),
    }
}
