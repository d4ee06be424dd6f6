//! `ferrite-bench`: the benchmark suite as its own binary (the same as `ferrite bench`).
#![forbid(unsafe_code)]

use clap::Parser;

#[derive(Parser)]
#[command(name = "ferrite-bench", version, about = "FerriteFS benchmarks against its peers")]
struct Cli {
    #[command(flatten)]
    args: ferrite_bench::BenchArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    std::process::ExitCode::from(ferrite_bench::run(&cli.args) as u8)
}
