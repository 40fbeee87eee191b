#!/usr/bin/env bash
# Builds every guest component (examples and hostile fixtures) for wasm32-wasip2 into
# guest/target/wasm32-wasip2/release/*.wasm, where the host tests and the policy benchmark
# look for them. Run it before `cargo test -p timeshard-policy`; from any directory.
set -euo pipefail
cd "$(dirname "$0")"

# The guests need the standard library of wasm32-wasip2 (core and alloc). Look in the sysroot
# of the toolchain cargo uses here, which also works without rustup.
if [ ! -d "$(rustc --print sysroot)/lib/rustlib/wasm32-wasip2" ]; then
    if ! command -v rustup >/dev/null || ! rustup target add wasm32-wasip2; then
        echo "error: the wasm32-wasip2 target of $(rustc --version) is not installed and could not be" \
            "added: run 'rustup target add wasm32-wasip2' where the Rust distribution server is reachable" >&2
        exit 1
    fi
fi

# Into guest/target whatever CARGO_TARGET_DIR says: that is where the components are read.
cargo build --release --target wasm32-wasip2 --target-dir target --workspace "$@"

out=target/wasm32-wasip2/release
for wasm in "$out"/*.wasm; do
    printf '%8d  %s\n' "$(wc -c < "$wasm")" "$wasm"
done
