//! One connection's queue pair on the simulated fabric, behind the same trait as the verbs and
//! mlx5 endpoints ([`ConnEndpoint`]).

use super::device::TestDevice;
use super::fabric::{ADVERTISED_ADDR, ADVERTISED_RKEY, World, world};
use crate::backend::conn_endpoint::ConnEndpoint;
use crate::backend::device::OpenPort;
use crate::backend::endpoint::Role;
use crate::backend::qp_params;
use crate::config::QpSettings;
use rivet_core::nic::{Completion, Nic, NicError, Payload, RemoteRegion, SendWr};
use rivet_core::sim::{QpConfig, SimNic};
use rivet_core::wire::EndpointInfo;
use rivet_verbs_ffi::VerbsError;
use std::sync::Arc;

/// Inline bytes of a simulated queue pair.
const MAX_INLINE: usize = 64;

/// One connection's queue pair on the simulated fabric.
#[derive(Debug)]
pub(crate) struct SimEndpoint {
    id: usize,
    port: Arc<OpenPort<TestDevice>>,
    psn: u32,
}

impl ConnEndpoint for SimEndpoint {
    type Device = TestDevice;

    /// An endpoint for `role` on the simulated port (connected to its peer by [`Self::connect`]).
    fn new(port: &Arc<OpenPort<TestDevice>>, role: Role) -> Result<Self, VerbsError> {
        use rivet_core::data::{CQ_DEPTH, SEND_QUEUE_DEPTH};
        let (inbound_len, staging_len, rq_depth) = role.regions();
        let mut guard = world();
        let w = guard.get_or_insert_with(World::new);
        let id = w.endpoints.len();
        let key = u32::try_from(id).map_err(|_| VerbsError::InvalidArgument {
            what: "too many simulated endpoints",
        })?;
        w.endpoints.push(super::fabric::Slot {
            config: QpConfig {
                max_inline: MAX_INLINE,
                sq_depth: SEND_QUEUE_DEPTH,
                rq_depth: rq_depth as usize,
                cq_depth: CQ_DEPTH,
                inbound_len,
                staging_len,
            },
            advertised: RemoteRegion {
                addr: ADVERTISED_ADDR + (u64::from(key) << 32),
                rkey: ADVERTISED_RKEY + key,
                len: inbound_len as u32,
            },
            nic: None,
            peer: None,
        });
        Ok(Self {
            id,
            port: Arc::clone(port),
            psn: qp_params::random_psn(),
        })
    }

    /// What the peer needs to reach this endpoint.
    fn local_info(&self, settings: &QpSettings) -> EndpointInfo {
        let advertised = world()
            .as_ref()
            .map(|w| w.endpoints[self.id].advertised)
            .unwrap_or_else(|| unreachable!("an endpoint exists only in a world"));
        qp_params::endpoint_info_at(
            &self.port.info,
            self.qp_num(),
            self.psn,
            advertised,
            settings,
        )
    }

    /// Pair this endpoint with the one `remote` describes (the first of the two to connect
    /// creates the fabric pair for both).
    fn connect(&self, remote: &EndpointInfo, _settings: &QpSettings) -> Result<(), VerbsError> {
        let unknown = || VerbsError::InvalidArgument {
            what: "the remote endpoint is not on the simulated fabric",
        };
        let mut guard = world();
        let w = guard.get_or_insert_with(World::new);
        let peer = (remote.qpn as usize)
            .checked_sub(1)
            .filter(|&p| p != self.id && p < w.endpoints.len())
            .ok_or_else(unknown)?;
        if w.endpoints[peer].advertised != remote.inbound {
            return Err(unknown());
        }
        match (w.endpoints[self.id].peer, w.endpoints[peer].peer) {
            (Some(p), _) if p == peer => return Ok(()),
            (None, None) => {}
            _ => {
                return Err(VerbsError::InvalidArgument {
                    what: "simulated endpoint already connected elsewhere",
                });
            }
        }
        let (mine, theirs) = w.fabric.connect(
            w.device,
            w.endpoints[self.id].config,
            w.device,
            w.endpoints[peer].config,
        );
        let me = &mut w.endpoints[self.id];
        me.nic = Some(mine);
        me.peer = Some(peer);
        let them = &mut w.endpoints[peer];
        them.nic = Some(theirs);
        them.peer = Some(self.id);
        Ok(())
    }

    /// The port this endpoint lives on.
    fn port(&self) -> &Arc<OpenPort<TestDevice>> {
        &self.port
    }

    /// The QP number the peer is told (never 0).
    fn qp_num(&self) -> u32 {
        self.id as u32 + 1
    }

    /// A completion-queue address for event bookkeeping (simulated ports have no events).
    fn cq_addr(&self) -> usize {
        0xc0de_0000 + self.id
    }

    /// The unit tests' simulated port has one port: nothing to fail over to (the core's
    /// simulator tests failover; the fabric lane tests the plugin's).
    fn fail_queue_pair(&self) -> Result<(), VerbsError> {
        Err(VerbsError::InvalidArgument {
            what: "port failover on the unit tests' simulated port",
        })
    }

    fn move_to(
        &mut self,
        _port: &Arc<OpenPort<TestDevice>>,
        _role: Role,
    ) -> Result<(), VerbsError> {
        self.fail_queue_pair()
    }
}

impl SimEndpoint {
    /// Run `f` on this endpoint's fabric end (an error before it is connected).
    fn with_nic<R>(
        &self,
        f: impl FnOnce(&mut World, &mut SimNic) -> Result<R, NicError>,
    ) -> Result<R, NicError> {
        let mut guard = world();
        let w = guard
            .as_mut()
            .unwrap_or_else(|| unreachable!("an endpoint exists only in a world"));
        let Some(mut nic) = w.endpoints[self.id].nic.take() else {
            return Err(NicError::Post {
                errno: libc::ENOTCONN,
            });
        };
        let out = f(w, &mut nic);
        w.endpoints[self.id].nic = Some(nic);
        out
    }
}

impl Drop for SimEndpoint {
    fn drop(&mut self) {
        // The fabric end is dropped under the lock (see `World`'s `Send`).
        if let Some(w) = world().as_mut() {
            drop(w.endpoints[self.id].nic.take());
        }
    }
}

impl Nic for SimEndpoint {
    fn max_inline(&self) -> usize {
        MAX_INLINE
    }

    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        self.with_nic(|w, nic| {
            let translated: Vec<SendWr<'_>> = chain
                .iter()
                .map(|wr| {
                    let payload = match wr.payload {
                        Payload::Local(sge) => Payload::Local(w.local(sge)),
                        other => other,
                    };
                    let (remote_addr, rkey) = w.remote(wr.remote_addr, wr.rkey, payload.len());
                    SendWr {
                        payload,
                        remote_addr,
                        rkey,
                        ..*wr
                    }
                })
                .collect();
            nic.post_send(&translated)?;
            w.run();
            Ok(())
        })
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        self.with_nic(|w, nic| {
            nic.post_recv(wr_id)?;
            w.run();
            Ok(())
        })
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        self.with_nic(|w, nic| {
            w.run();
            nic.poll(out)
        })
    }

    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        let read = self.with_nic(|w, nic| {
            w.run();
            nic.read_inbound(offset, out);
            Ok(())
        });
        if read.is_err() {
            // Before the pair exists nothing can have arrived: the region is still zero.
            out.fill(0);
        }
    }

    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        let _ = self.with_nic(|_, nic| {
            nic.write_staging(offset, bytes);
            Ok(())
        });
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) {
        let _ = self.with_nic(|_, nic| {
            nic.write_inbound(offset, bytes);
            Ok(())
        });
    }

    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        let _ = self.with_nic(|w, nic| {
            let mut bytes = vec![0u8; len];
            nic.read_inbound(offset, &mut bytes);
            w.deliver(&bytes, dst);
            Ok(())
        });
    }
}
