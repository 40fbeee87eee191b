//! The `timeshard-control` command line, built inside this package so the end-to-end tests can
//! run control plane processes.

fn main() -> std::process::ExitCode {
    timeshard_control::main()
}
