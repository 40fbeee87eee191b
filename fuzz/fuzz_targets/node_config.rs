#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| timeshard_fuzz::node_config(data));
