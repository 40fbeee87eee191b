//! The `timeshard` command line, built inside the test package so tests can spawn it.

fn main() -> std::process::ExitCode {
    timeshard_cli::main()
}
