#![no_main]
//! libFuzzer entry point of `strata_fuzz::targets::net_frame` (see that function).
libfuzzer_sys::fuzz_target!(|data: &[u8]| strata_fuzz::targets::net_frame(data));
