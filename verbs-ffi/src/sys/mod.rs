//! Raw libibverbs ABI: `repr(C)` structs with checked layouts, and the C enum values.
//!
//! Names follow the C headers so that the reference and `verbs.h` can be read side by side.

mod consts;
mod types;

pub use consts::*;
pub(crate) use types::checked_layout;
pub use types::*;
