//! The drivers of the plugin's single-queue-pair path, for simulated NICs: what
//! `plugin/src/comm/path.rs` does around [`SendConn::isend_one`] (the plugin reads the head
//! entry, the core decides, the plugin posts) and [`RecvConn::irecv_one`] (the core decides, the
//! plugin posts), written once for the core's tests, the fuzz targets and the benches.

use crate::data::codec::CTS_ENTRY_LEN;
use crate::data::{DataError, OneRecv, OneSend, RecvBuf, RecvConn, RequestId, SendBuf, SendConn};
use crate::nic::Nic;

/// Send `buf` tagged `tag` as the plugin does: when the one-buffer path may decide, read the head
/// entry's stamp and then the entry, let [`SendConn::isend_one`] decide and post what it returns;
/// otherwise (and when it leaves the send to it) the general [`SendConn::isend`].
pub fn isend_direct(
    send: &mut SendConn,
    nic: &mut impl Nic,
    buf: SendBuf,
    tag: u32,
) -> Result<Option<RequestId>, DataError> {
    isend_direct_host(send, nic, buf, None, tag)
}

/// [`isend_direct`] of a host-memory send whose bytes are `host` (up to the eager threshold, as
/// the plugin hands them over): the general path may send it eager.
pub fn isend_direct_host(
    send: &mut SendConn,
    nic: &mut impl Nic,
    buf: SendBuf,
    host: Option<&[u8]>,
    tag: u32,
) -> Result<Option<RequestId>, DataError> {
    if let Some((stamp, entry)) = read_head(send, nic) {
        match send.isend_one(stamp, &entry, buf, tag, host)? {
            OneSend::Post { req, wr } => {
                return match nic.post_send(&[wr]) {
                    Ok(()) => Ok(Some(req)),
                    Err(err) => Err(send.post_failed(req, err)),
                };
            }
            OneSend::NotYet => return Ok(None),
            OneSend::General => {}
        }
    }
    send.isend_host(nic, buf, host, tag)
}

/// The head entry's stamp and then the entry, read as the plugin reads them (the stamp first:
/// `read_inbound` orders the reads, so a fresh stamp is never paired with older fields); `None`
/// when [`SendConn::head_entry`] leaves the send to the general path.
pub fn read_head(send: &SendConn, nic: &impl Nic) -> Option<(u32, [u8; CTS_ENTRY_LEN])> {
    let offset = send.head_entry()?;
    let mut stamp = [0u8; 4];
    nic.read_inbound(offset + CTS_ENTRY_LEN - 4, &mut stamp);
    let mut entry = [0u8; CTS_ENTRY_LEN];
    nic.read_inbound(offset, &mut entry);
    Some((u32::from_le_bytes(stamp), entry))
}

/// Post a receive of `bufs` tagged `tags` as the plugin does: one buffer through
/// [`RecvConn::irecv_one`] (post the empty receive, then the clear-to-send write it returns),
/// anything it leaves to it and every group through the general [`RecvConn::irecv`].
pub fn irecv_direct(
    recv: &mut RecvConn,
    nic: &mut impl Nic,
    bufs: &[RecvBuf],
    tags: &[u32],
) -> Result<Option<RequestId>, DataError> {
    if let ([buf], [tag]) = (bufs, tags) {
        match recv.irecv_one(*buf, *tag, nic.max_inline())? {
            OneRecv::Post {
                req,
                recv: wr_id,
                cts,
            } => {
                if let Err(err) = nic.post_recv(wr_id) {
                    return Err(recv.post_failed(req, err));
                }
                let cts = recv.one_cts_write(cts);
                return match nic.post_send(&[cts]) {
                    Ok(()) => Ok(Some(req)),
                    Err(err) => Err(recv.post_failed(req, err)),
                };
            }
            OneRecv::General => {}
        }
    }
    recv.irecv(nic, bufs, tags)
}
