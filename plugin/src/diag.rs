//! What the `rivet doctor` command asks of the plugin's own choices, so it reports what the
//! plugin would really do rather than a re-implementation of it.

use crate::oob::iface;

/// The interface and address the handshake sockets would listen on (`NCCL_SOCKET_IFNAME`,
/// `NCCL_SOCKET_FAMILY` and `NCCL_COMM_ID` honoured), or `None` when no interface qualifies.
pub fn socket_address() -> std::io::Result<Option<(String, std::net::IpAddr)>> {
    let rules = crate::config::Config::from_env().interface;
    let candidates = iface::local_addresses()?;
    Ok(iface::choose(&candidates, &rules).map(|a| (a.name, a.addr.ip())))
}
