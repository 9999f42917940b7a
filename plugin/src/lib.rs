//! The Rivet NCCL net plugin: the C tables `ncclNetPlugin_v6` … `ncclNetPlugin_v12` (and the
//! CollNet and RMA tables beside them) over one implementation that drives `rivet-core` with the
//! libibverbs backend.
//!
//! ## Layers
//!
//! The modules form layers, bottom first. A module imports only from its own layer or a lower
//! one, and no modules import each other, directly or round a circle; the crate root only
//! declares modules and re-exports. `plugin/tests/module_graph.rs` reads this table and every
//! source file and fails on an upward import or a cycle. A row names a module with everything
//! under it; inside one (e.g. `comm`: `mr` → `data` → `listen`, `connect`) the same two rules
//! hold module by module, a file's inline modules counted as modules of their own.
//!
//! `#![deny(unsafe_code)]` holds for the crate; the modules that need `unsafe` opt in with
//! `#![allow(unsafe_code)]` and say why at the top (`plugin/tests/unsafe_docs.rs` checks that,
//! and that every `unsafe fn` has a `# Safety` section).
//!
//! Public for the `rivet` command: [`devices`], [`diag`], [`stats`] and [`version`] (a safe Rust API), [`sys`] and
//! [`abi`] (the C view, for what must go through the exported tables).
//!
//! | layer | modules | what |
//! |---|---|---|
//! | 0 | `sys` | C mirrors of NCCL's ABI: result codes, property structs, callbacks, function-table layouts |
//! | 1 | `error`, `clock`, `random`, `log`, `version`, `profiler`, `stats` | typed errors with their `ncclResult_t`, time, randomness, NCCL's logger, what this build is, NCCL profiler events (kept with their comm), process-wide counters published for `rivet info --stats` |
//! | 2 | `handle` | the one typed handle layer: every object NCCL holds as `void*` is looked up here |
//! | 3 | `oob` | the out-of-band TCP socket of the handshake |
//! | 4 | `config`, `diag` | settings from the environment; the CLI's view of them |
//! | 5 | `backend` | devices, queue pairs and the `Nic` the core drives (verbs and mlx5 paths) |
//! | 6 | `devices`, `mesh` | discovery: the ports NCCL sees and their properties; the mesh device over them (`RIVET_MESH=1`) |
//! | 7 | `net` | lifecycle (`init`, contexts, `finalize`), opened ports |
//! | 8 | `comm` | listen/connect/accept, registrations and the data path |
//! | 9 | `collnet` | CollNet groups over the p2p comms |
//! | 10 | `rma` | one-sided RMA: groups formed as CollNet's, their control exchange, windows, contexts of RC lanes |
//! | 11 | `abi` | the exported tables, per-version shims, the panic guard, per-version properties |

#![deny(unsafe_code)]

pub mod abi;
mod backend;
mod clock;
#[cfg(feature = "collnet")]
mod collnet;
mod comm;
mod config;
pub mod devices;
pub mod diag;
mod error;
mod handle;
mod log;
mod mesh;
mod net;
mod oob;
mod profiler;
mod random;
#[cfg(feature = "rma")]
mod rma;
pub mod stats;
pub mod sys;
pub mod version;

pub use error::{ErrorClass, NetError};
