//! Port failover through a multi-lane connection ([`super::super::failover`]): the driver
//! (the plugin) blocks a failing lane, quiesces it behind its [`Guarded`] NIC, sends its
//! snapshot, replays the plan the machine made on the lane's new queue pair, and resumes it.
//! The other lanes carry on meanwhile; a message with a part on the blocked lane waits, and
//! one needing it is not started. Off the hot path: nothing here runs unless failover is on.

use super::{MultiRecv, MultiSend, QpMask};
use crate::data::DataError;
use crate::data::failover::{
    FailoverError, Guarded, KeyMap, Plan, RecvJournal, Rekey, Replayed, ReportBody, SendJournal,
};
use crate::nic::Nic;

/// `lane` as an index of a connection of `lanes` lanes.
fn lane_index(lane: u8, lanes: usize) -> Result<usize, FailoverError> {
    let index = usize::from(lane);
    if index < lanes {
        Ok(index)
    } else {
        Err(FailoverError::Lane(lane))
    }
}

/// The bit of `lane` (a lane outside the connection has none: nothing to block).
fn lane_bit(lane: u8, lanes: usize) -> QpMask {
    if usize::from(lane) < lanes {
        1 << lane
    } else {
        0
    }
}

impl MultiSend {
    /// Lanes (queue pairs) of the connection.
    pub fn lanes(&self) -> usize {
        self.conns.len()
    }

    /// Journal every part posted from now on, per lane, so a lane can be replayed after its
    /// port fails. Call it before the first send (a send posted before is not in the journal).
    pub fn enable_failover(&mut self) {
        if self.journals.is_none() {
            self.journals = Some((0..self.conns.len()).map(|_| SendJournal::new()).collect());
        }
    }

    /// Whether failover was enabled.
    pub fn failover_enabled(&self) -> bool {
        self.journals.is_some()
    }

    /// Stop posting on `lane` and polling its NIC (the driver is failing it over): a send that
    /// needs it returns `Ok(None)` without posting any of its parts, and requests with a part on
    /// it stay pending. A lane outside the connection is ignored.
    pub fn block_lane(&mut self, lane: u8) {
        self.blocked |= lane_bit(lane, self.conns.len());
    }

    /// Post on `lane` and poll it again (its replay is done).
    pub fn resume_lane(&mut self, lane: u8) {
        self.blocked &= !lane_bit(lane, self.conns.len());
    }

    /// Whether `lane` is blocked.
    pub fn lane_blocked(&self, lane: u8) -> bool {
        self.blocked & lane_bit(lane, self.conns.len()) != 0
    }

    /// Quiesce `lane` (blocked, its queue pair moved to the error state by the driver) behind
    /// its armed tripwire: [`SendConn::failover_quiesce`](crate::data::SendConn::failover_quiesce).
    /// `Ok(true)` once nothing of the old queue pair is left.
    pub fn failover_quiesce<N: Nic>(
        &mut self,
        lane: u8,
        nic: &mut Guarded<N>,
    ) -> Result<bool, FailoverError> {
        let index = lane_index(lane, self.conns.len())?;
        self.conns[index].failover_quiesce(nic)
    }

    /// The quiesced `lane`'s state, for its report.
    pub fn failover_snapshot(&self, lane: u8) -> Result<ReportBody, FailoverError> {
        let index = lane_index(lane, self.conns.len())?;
        self.conns[index]
            .failover_snapshot()
            .map(ReportBody::Sender)
            .map_err(FailoverError::Local)
    }

    /// Replay `plan` (a sender's) on `lane`'s new queue pair `nic`, its sends from the lane's
    /// journal, under `rekey`. The lane's requests then complete through [`test`](Self::test)
    /// as usual; its later sends read their buffers with the keys of fused member `member`
    /// (the port it moved to).
    pub fn failover_replay<N: Nic>(
        &mut self,
        lane: u8,
        nic: &mut N,
        plan: &Plan,
        rekey: &Rekey<'_>,
        member: u8,
    ) -> Result<Replayed, FailoverError> {
        let index = lane_index(lane, self.conns.len())?;
        let Some(journals) = &mut self.journals else {
            return Err(FailoverError::Disabled);
        };
        let Plan::Sender(plan) = plan else {
            return Err(FailoverError::Local(DataError::InvalidArgument(
                "a receiver's replay plan on the sending end",
            )));
        };
        let replayed = self.conns[index].failover_replay(nic, plan, &mut journals[index], rekey)?;
        // Only a replay that happened moves the lane (a refused one changes nothing).
        self.members[index] = member;
        Ok(replayed)
    }
}

impl MultiRecv {
    /// Lanes (queue pairs) of the connection.
    pub fn lanes(&self) -> usize {
        self.conns.len()
    }

    /// Journal every part posted from now on, per lane (see [`MultiSend::enable_failover`]).
    pub fn enable_failover(&mut self) {
        if self.journals.is_none() {
            self.journals = Some((0..self.conns.len()).map(|_| RecvJournal::new()).collect());
        }
    }

    /// Whether failover was enabled.
    pub fn failover_enabled(&self) -> bool {
        self.journals.is_some()
    }

    /// Stop posting on `lane` and polling its NIC (see [`MultiSend::block_lane`]).
    pub fn block_lane(&mut self, lane: u8) {
        self.blocked |= lane_bit(lane, self.conns.len());
    }

    /// Post on `lane` and poll it again.
    pub fn resume_lane(&mut self, lane: u8) {
        self.blocked &= !lane_bit(lane, self.conns.len());
    }

    /// Whether `lane` is blocked.
    pub fn lane_blocked(&self, lane: u8) -> bool {
        self.blocked & lane_bit(lane, self.conns.len()) != 0
    }

    /// Quiesce `lane`: [`RecvConn::failover_quiesce`](crate::data::RecvConn::failover_quiesce).
    pub fn failover_quiesce<N: Nic>(
        &mut self,
        lane: u8,
        nic: &mut Guarded<N>,
    ) -> Result<bool, FailoverError> {
        let index = lane_index(lane, self.conns.len())?;
        self.conns[index].failover_quiesce(nic)
    }

    /// The quiesced `lane`'s state, for its report.
    pub fn failover_snapshot(&self, lane: u8) -> Result<ReportBody, FailoverError> {
        let index = lane_index(lane, self.conns.len())?;
        Ok(ReportBody::Receiver(self.conns[index].failover_snapshot()))
    }

    /// Replay `plan` (a receiver's) on `lane`'s new queue pair `nic`, its receives from the
    /// lane's journal, under `rekey`; its later receives offer their buffers with the keys of
    /// fused member `member` (the port it moved to).
    pub fn failover_replay<N: Nic>(
        &mut self,
        lane: u8,
        nic: &mut N,
        plan: &Plan,
        rekey: &Rekey<'_>,
        member: u8,
    ) -> Result<Replayed, FailoverError> {
        let index = lane_index(lane, self.conns.len())?;
        let Some(journals) = &mut self.journals else {
            return Err(FailoverError::Disabled);
        };
        let Plan::Receiver(plan) = plan else {
            return Err(FailoverError::Local(DataError::InvalidArgument(
                "a sender's replay plan on the receiving end",
            )));
        };
        let replayed = self.conns[index].failover_replay(nic, plan, &mut journals[index], rekey)?;
        // Only a replay that happened moves the lane (a refused one changes nothing).
        self.members[index] = member;
        Ok(replayed)
    }

    /// The quiesced `lane` moves to another device: the keys of its receives the sender may
    /// have consumed entries of, old and new (`new_key`), for the sender
    /// ([`RecvConn::failover_peer_keys`](crate::data::RecvConn::failover_peer_keys)).
    pub fn failover_peer_keys(
        &self,
        lane: u8,
        new_key: &dyn Fn(u32) -> Option<u32>,
    ) -> Result<KeyMap, FailoverError> {
        let index = lane_index(lane, self.conns.len())?;
        let Some(journals) = &self.journals else {
            return Err(FailoverError::Disabled);
        };
        let mut keys = KeyMap::EMPTY;
        self.conns[index].failover_peer_keys(&journals[index], new_key, &mut keys)?;
        Ok(keys)
    }
}
