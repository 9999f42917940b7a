//! An opened RDMA port: its verbs context and protection domain, shared by every comm on it.

use rivet_verbs_ffi::discover::PortInfo;
use rivet_verbs_ffi::{Context, DeviceList, ProtectionDomain, VerbsError};
use std::sync::Arc;

/// A port opened for use: created on the first comm that needs it, dropped with the last one.
#[derive(Debug)]
pub(crate) struct OpenPort {
    /// What discovery found (name, port number, GID choice, MTU, link layer, …).
    pub(crate) info: PortInfo,
    /// Protection domain all of this port's QPs and memory registrations share.
    pub(crate) pd: Arc<ProtectionDomain>,
    /// The device context.
    pub(crate) context: Arc<Context>,
}

impl OpenPort {
    /// Open the device named in `info` and allocate a protection domain on it.
    pub(crate) fn open(info: &PortInfo) -> Result<Arc<Self>, VerbsError> {
        let list = DeviceList::new()?;
        let device =
            list.iter()
                .find(|d| d.name() == info.name)
                .ok_or(VerbsError::InvalidArgument {
                    what: "the discovered RDMA device disappeared",
                })?;
        let context = device.open()?;
        let pd = ProtectionDomain::new(&context)?;
        Ok(Arc::new(Self {
            info: info.clone(),
            pd,
            context,
        }))
    }
}
