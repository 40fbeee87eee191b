//! The `timeshard` binary; everything lives in the library.

fn main() -> std::process::ExitCode {
    timeshard_cli::main()
}
