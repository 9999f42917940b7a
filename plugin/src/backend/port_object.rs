//! The verbs objects of an opened port (context, protection domain) as its users hold them: the
//! object itself, or, for the unit tests' simulated port (`backend::sim`), a placeholder.

use std::sync::Arc;

/// A verbs object of an opened port. It dereferences to the object; the only other kind is the
/// test-only simulated port's placeholder, which nothing dereferences (the simulated backend
/// takes over every call that would), so reaching one is a bug in a test and panics.
#[derive(Debug)]
pub(crate) enum PortObject<T> {
    /// The object of a verbs device.
    Verbs(Arc<T>),
    /// A port of the simulated fabric (`backend::sim`) has none.
    #[cfg(test)]
    Simulated,
}

impl<T> core::ops::Deref for PortObject<T> {
    type Target = Arc<T>;

    #[inline]
    fn deref(&self) -> &Arc<T> {
        match self {
            Self::Verbs(object) => object,
            #[cfg(test)]
            Self::Simulated => panic!("a simulated port has no verbs objects"),
        }
    }
}

impl<T> Clone for PortObject<T> {
    fn clone(&self) -> Self {
        match self {
            Self::Verbs(object) => Self::Verbs(Arc::clone(object)),
            #[cfg(test)]
            Self::Simulated => Self::Simulated,
        }
    }
}
