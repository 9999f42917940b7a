//! cargo-fuzz entry for [`rivet_fuzz::failover`]: the body and its model live in the library so
//! `cargo test` replays the committed seeds and findings through the same code.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rivet_fuzz::failover::check(data));
