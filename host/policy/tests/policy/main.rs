//! The WebAssembly host's integration tests, one binary (wasmtime is linked once): the example
//! guests, hand-written hostile components, limits and the sandbox, signed identities,
//! installing, memory footprint, and `guest/build.sh` itself. Needs the guest components
//! (`guest/build.sh`).

mod common;
mod crafted;
mod examples;
mod footprint;
mod guest_build;
mod hostile;
mod identity;
mod install;
mod sandbox;
