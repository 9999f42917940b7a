//! NCCL's net plugin ABI: C types, function tables and the per-version shims.

mod shims;
pub mod tables;
pub mod types;
#[cfg(test)]
mod vdevice_replay;
