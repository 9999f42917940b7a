//! Non-blocking TCP for the handshake: listen, connect without blocking, accept.
//!
//! Unsafe: `std` has no non-blocking `connect`, so the connect path creates the socket and starts
//! the connection with `libc` calls, then hands the descriptor to `std::net::TcpStream`.

#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};

/// Bind a non-blocking listener on `addr` (its port 0: the kernel picks one; an IPv6 scope id is
/// kept, so link-local addresses work).
pub(crate) fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Accept one pending connection, if any, as a non-blocking stream.
pub(crate) fn accept(listener: &TcpListener) -> io::Result<Option<TcpStream>> {
    match listener.accept() {
        Ok((stream, _)) => {
            stream.set_nonblocking(true)?;
            stream.set_nodelay(true)?;
            Ok(Some(stream))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Start connecting to `addr` without waiting; see [`connect_done`].
pub(crate) fn start_connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket creation; the descriptor is owned by the TcpStream below.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh, valid socket descriptor that nothing else owns.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let (storage, len) = sockaddr(addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes for this family.
    let rc = unsafe { libc::connect(fd, (&raw const storage).cast(), len) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(err);
        }
    }
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Whether a connect started by [`start_connect`] has completed; the error if it failed.
pub(crate) fn connect_done(stream: &TcpStream) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if rc == 0 {
        return Ok(false);
    }
    match stream.take_error()? {
        Some(err) => Err(err),
        None => Ok(true),
    }
}

/// What a non-blocking peek at an established connection's socket says about the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// Nothing to read, the connection is open.
    Alive,
    /// EOF or a socket error: the peer closed it, its process died, or keepalive gave up.
    Gone,
}

/// Peek at `stream` without consuming anything or blocking.
pub(crate) fn liveness(stream: &TcpStream) -> Liveness {
    let mut byte = 0u8;
    // SAFETY: one writable byte; MSG_PEEK leaves the data in place, MSG_DONTWAIT never blocks.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n > 0 {
        return Liveness::Alive;
    }
    if n == 0 {
        return Liveness::Gone;
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN | libc::EINTR) => Liveness::Alive,
        _ => Liveness::Gone,
    }
}

/// Turn on TCP keepalive (first probe after 10 s idle, then every 5 s, 3 probes), so the
/// connection of a peer whose host or link died reports an error within about 25 s even when no
/// RDMA work is outstanding.
pub(crate) fn keepalive(stream: &TcpStream) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| -> io::Result<()> {
        // SAFETY: a valid socket and a pointer to an int option value of the stated size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&raw const value).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3)
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid `sockaddr_storage`.
    let mut storage: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sockaddr_storage` is large and aligned enough for any sockaddr.
            unsafe { (&raw mut storage).cast::<libc::sockaddr_in>().write(sin) };
            (storage, size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { (&raw mut storage).cast::<libc::sockaddr_in6>().write(sin6) };
            (storage, size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn connect_accept_loopback_from_one_thread() {
        let listener = listen("127.0.0.1:0".parse().expect("address")).expect("listen");
        let addr = listener.local_addr().expect("addr");
        let mut client = start_connect(addr).expect("connect");
        let mut server = None;
        for _ in 0..1000 {
            if server.is_none() {
                server = accept(&listener).expect("accept");
            }
            if server.is_some() && connect_done(&client).expect("connect state") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut server = server.expect("accepted within a second");
        client.write_all(b"ping").expect("write");
        let mut buf = [0u8; 4];
        for _ in 0..1000 {
            match server.read(&mut buf) {
                Ok(4) => break,
                Ok(n) => panic!("short read {n}"),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        assert_eq!(&buf, b"ping");
    }

    #[test]
    fn connect_to_closed_port_fails() {
        let listener = listen("127.0.0.1:0".parse().expect("address")).expect("listen");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let client = start_connect(addr);
        let failed = match client {
            Err(_) => true,
            Ok(stream) => (0..1000).any(|_| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                connect_done(&stream).is_err()
            }),
        };
        assert!(failed, "connecting to a closed port must fail");
    }

    #[test]
    fn liveness_sees_the_peer_close() {
        let listener = listen("127.0.0.1:0".parse().expect("address")).expect("listen");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let mut server = None;
        for _ in 0..1000 {
            server = accept(&listener).expect("accept");
            if server.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let server = server.expect("accepted");
        keepalive(&server).expect("keepalive");
        assert_eq!(liveness(&server), Liveness::Alive);
        drop(client);
        let gone = (0..1000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            liveness(&server) == Liveness::Gone
        });
        assert!(gone, "EOF from a closed peer must be seen");
    }
}
