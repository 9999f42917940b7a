//! The driver's clock: `std::time::Instant` turned into the core's `Instant` (nanoseconds since
//! the first call in this process).

use rivet_core::time::Instant;
use std::sync::OnceLock;

static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();

/// Now, on the core's clock.
pub(crate) fn now() -> Instant {
    let origin = ORIGIN.get_or_init(std::time::Instant::now);
    Instant::from_nanos(u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
}
