#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| timeshard_fuzz::store_wal_record(data));
