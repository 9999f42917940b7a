//! Moving bytes between a non-blocking socket and a handshake machine.

use rivet_core::handshake::Handshake;
use rivet_core::time::Instant;
use std::io::{self, Read, Write};
use std::net::TcpStream;

/// Largest read the pump does at once; handshake frames are far smaller.
const CHUNK: usize = 512;

/// What went wrong on the socket itself (the machine's own errors are read from it).
#[derive(Debug)]
pub(crate) struct SocketError(pub(crate) io::Error);

/// Drive `machine` as far as the socket allows without blocking: write what it has to send, read
/// no more than it asks for, report EOF, and check its deadline against `now`.
pub(crate) fn pump<H: Handshake>(
    socket: &mut TcpStream,
    machine: &mut H,
    now: Instant,
) -> Result<(), SocketError> {
    loop {
        if machine.error().is_some() {
            // Flush a final Reject frame if the machine queued one; ignore failures, the
            // connection is over anyway.
            let out = machine.poll_transmit();
            if !out.is_empty()
                && let Ok(n) = socket.write(out)
            {
                machine.handle_transmitted(n);
            }
            return Ok(());
        }
        let out = machine.poll_transmit();
        if !out.is_empty() {
            match socket.write(out) {
                Ok(n) => {
                    machine.handle_transmitted(n);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(SocketError(e)),
            }
        }
        let want = machine.input_wanted().min(CHUNK);
        if want == 0 {
            break;
        }
        let mut buf = [0u8; CHUNK];
        match socket.read(&mut buf[..want]) {
            Ok(0) => {
                // The machine records the failure itself; the caller reads it with `error()`.
                let _ = machine.handle_peer_closed();
            }
            Ok(n) => {
                let _ = machine.handle_input(&buf[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SocketError(e)),
        }
    }
    if machine
        .poll_timeout()
        .is_some_and(|deadline| now >= deadline)
    {
        machine.handle_timeout(now);
    }
    Ok(())
}
