//! NCCL's net plugin ABI: C types, function tables and the per-version shims.

mod guard;
pub mod props;
mod shims;
pub mod tables;
#[cfg(test)]
mod vdevice_replay;
