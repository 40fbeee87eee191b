#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| timeshard_fuzz::policy_floors(data));
