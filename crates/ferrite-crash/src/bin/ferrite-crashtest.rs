//! `ferrite-crashtest`: the crash simulator as a standalone program (the same
//! arguments as `ferrite crashtest`); also the child process of real-crash tests.
#![forbid(unsafe_code)]

use clap::Parser;

#[derive(Parser)]
#[command(name = "ferrite-crashtest", about = "FerriteFS crash-consistency simulator")]
struct Cli {
    #[command(flatten)]
    args: ferrite_crash::CrashArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    std::process::ExitCode::from(ferrite_crash::run(&cli.args) as u8)
}
