//! `timeshard-control`: the control plane's service and command line (see the library's docs).

fn main() -> std::process::ExitCode {
    timeshard_control::main()
}
