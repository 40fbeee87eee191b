#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| timeshard_fuzz::gossip_entry(data));
