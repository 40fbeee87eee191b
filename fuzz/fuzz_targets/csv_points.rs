#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| timeshard_fuzz::csv_points(data));
