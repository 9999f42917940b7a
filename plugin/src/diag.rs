//! What the `rivet doctor` command asks of the plugin's own choices, so it reports what the
//! plugin would really do rather than a re-implementation of it.

use crate::oob::iface;

/// The interface and address the handshake sockets would listen on (`NCCL_SOCKET_IFNAME`
/// honoured), or `None` when no interface that is up has a matching address.
pub fn socket_address() -> std::io::Result<Option<(String, std::net::IpAddr)>> {
    let filter = crate::config::Config::from_env().socket_ifname;
    let candidates = iface::local_addresses()?;
    Ok(iface::choose(&candidates, filter.as_ref()).map(|a| (a.name, a.addr)))
}
