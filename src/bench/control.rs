//! The small TCP control connection between `rivet bench --client` and `--server`: one text line
//! per message. It carries the greeting, the two 128-byte listen handles (hex), the size schedule
//! one step at a time (`BW`, `LAT`) and the stop.
//!
//! ```text
//! client → server   RIVET-BENCH 1
//! server → client   OK <device>                 (or ERR <why>)
//! server → client   HANDLE <256 hex digits>      the server's listen handle: client → server data
//! client → server   HANDLE <256 hex digits>      the client's listen handle: server → client data
//! client → server   BW <size> <messages> <window>   server receives <messages> messages
//! server → client   DONE
//! client → server   LAT <size> <round trips>        server echoes each message back
//! server → client   DONE
//! client → server   STOP
//! server → client   BYE
//! ```

use super::Error;
use super::plugin::Handle;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Protocol greeting (bumped on incompatible changes).
pub(crate) const GREETING: &str = "RIVET-BENCH 1";

/// One end of the control connection.
#[derive(Debug)]
pub(crate) struct Control {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Control {
    /// Wrap a connected stream; every read gives up after `timeout`.
    pub(crate) fn new(stream: TcpStream, timeout: Duration) -> Result<Self, Error> {
        let io = |e: std::io::Error| Error::Control(format!("setting up the control socket: {e}"));
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let writer = stream.try_clone().map_err(io)?;
        Ok(Self {
            reader: BufReader::new(stream),
            writer,
        })
    }

    /// Send one line.
    pub(crate) fn send(&mut self, line: &str) -> Result<(), Error> {
        let mut buf = String::with_capacity(line.len() + 1);
        buf.push_str(line);
        buf.push('\n');
        self.writer
            .write_all(buf.as_bytes())
            .map_err(|e| Error::Control(format!("sending {:?}: {e}", first_word(line))))
    }

    /// Receive one line (without its newline).
    pub(crate) fn recv(&mut self) -> Result<String, Error> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(Error::Control(
                "the peer closed the control connection".into(),
            )),
            Ok(_) => Ok(line.trim_end().to_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(Error::Control(
                    "the peer sent nothing within the timeout".into(),
                ))
            }
            Err(e) => Err(Error::Control(format!(
                "reading the control connection: {e}"
            ))),
        }
    }

    /// Receive a line that must start with `word`; returns the rest. `ERR <why>` becomes an error.
    pub(crate) fn expect(&mut self, word: &str) -> Result<String, Error> {
        let line = self.recv()?;
        if let Some(why) = line.strip_prefix("ERR ") {
            return Err(Error::Remote(why.to_owned()));
        }
        match line.split_once(' ') {
            Some((w, rest)) if w == word => Ok(rest.to_owned()),
            None if line == word => Ok(String::new()),
            _ => Err(Error::Control(format!("expected {word}, got {line:?}"))),
        }
    }
}

fn first_word(line: &str) -> &str {
    line.split(' ').next().unwrap_or(line)
}

/// `HANDLE <hex>` payload for a listen handle.
pub(crate) fn encode_handle(handle: &Handle) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(handle.len() * 2);
    for b in handle {
        // Writing to a String cannot fail.
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Parse the hex payload of `HANDLE`.
pub(crate) fn decode_handle(hex: &str) -> Result<Handle, Error> {
    let mut handle: Handle = [0; 128];
    let bytes = hex.as_bytes();
    if bytes.len() != handle.len() * 2 {
        return Err(Error::Control(format!(
            "listen handle has {} hex digits, expected {}",
            bytes.len(),
            handle.len() * 2
        )));
    }
    for (i, out) in handle.iter_mut().enumerate() {
        let pair = std::str::from_utf8(&bytes[2 * i..2 * i + 2]).unwrap_or("");
        *out = u8::from_str_radix(pair, 16)
            .map_err(|_| Error::Control(format!("listen handle: {pair:?} is not a hex byte")))?;
    }
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_through_hex() {
        let mut h: Handle = [0; 128];
        for (i, b) in h.iter_mut().enumerate() {
            *b = (i * 37 % 256) as u8;
        }
        let hex = encode_handle(&h);
        assert_eq!(hex.len(), 256);
        assert_eq!(decode_handle(&hex).unwrap(), h);
        assert!(decode_handle(&hex[..254]).is_err());
        assert!(decode_handle(&"zz".repeat(128)).is_err());
    }
}
