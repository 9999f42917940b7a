//! cargo-fuzz entry for [`rivet_fuzz::rma_ops`]: the body and its model live in the library so
//! `cargo test` replays the committed seeds and findings through the same code.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: rivet_fuzz::rma_ops::Input| rivet_fuzz::rma_ops::check(input));
