#!/usr/bin/env bash
# Builds every guest component (examples and hostile fixtures) for wasm32-wasip2 into
# guest/target/wasm32-wasip2/release/*.wasm, where the host tests and the policy benchmark
# look for them. Run it before `cargo test -p timeshard-policy`.
set -euo pipefail
cd "$(dirname "$0")"

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    rustup target add wasm32-wasip2
fi

cargo build --release --target wasm32-wasip2 --workspace "$@"

out=target/wasm32-wasip2/release
for wasm in "$out"/*.wasm; do
    printf '%8d  %s\n' "$(wc -c < "$wasm")" "$wasm"
done
