//! `rivet bench`: bandwidth (window of 8, 4 KiB … 64 MiB) and 8-byte ping-pong latency between two
//! processes, through the plugin's `ncclNetPlugin_v12` table exactly as NCCL would call it.
//!
//! - `rivet bench`: loopback on this host (spawns `rivet bench --server --once` as a child).
//! - `rivet bench --server [--port P]` on one host, `rivet bench --client HOST[:P]` on the other.
//!
//! Module map: [`plugin`] (dlopen and the C table; all of the binary's unsafe FFI into the plugin), [`control`]
//! (the TCP control connection), [`measure`] (the loops), [`report`] (table and JSON).

mod control;
pub(crate) mod measure;
pub(crate) mod plugin;
pub(crate) mod report;

use control::{Control, GREETING, decode_handle, encode_handle};
use plugin::Plugin;
use report::{Bandwidth, Latency, Report};
use std::fmt;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Default TCP port of the control connection.
pub(crate) const DEFAULT_PORT: u16 = 18620;
const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// Bytes moved per bandwidth size (before the iteration cap), so that every size takes a
/// similar time.
const BYTES_PER_SIZE: usize = 128 * MIB;
const MIN_ITERS: usize = 8;

pub(crate) const USAGE: &str = "usage: rivet bench [options]                 loopback: server child + client on this host
       rivet bench --server [--port P] [options]
       rivet bench --client HOST[:P] [options]

options:
  --plugin PATH     plugin library (default: RIVET_PLUGIN_LIB, else libnccl_net_rivet.so next to rivet,
                    else ../lib/ or ../lib/<arch>-linux-gnu/libnccl-net-rivet.so from it)
  --dev D           plugin device index (default 0)
  --fuse LIST       fuse the listed devices (comma list) with makeVDevice, as NCCL 2.24+ does, and use
                    the device it returns instead of --dev
  --sizes LIST      bandwidth sizes: comma list of sizes or ranges A-B (powers of two), K/M/G suffixes
                    (default 4K-64M; none: latency only)
  --iters N         most timed messages per size (default 1000; fewer for large sizes: 128 MiB per size,
                    at least 8)
  --lat-iters N     timed 8-byte round trips (default 2000; 0 skips latency)
  --window W        outstanding messages (default 8, as NCCL keeps)
  --poll MODE       after a test that finds nothing done: yield (default: sched_yield, as NCCL's
                    proxy thread does after a pass that progressed nothing), spin (test again at
                    once) or sleep (~20 us; a diagnostic that leaves CPU time to a software device
                    such as Soft-RoCE)
  --json            machine-readable output on stdout
  --once            server: serve one client, then exit
  --bind ADDR       server: control address to listen on (default 0.0.0.0; 127.0.0.1 with --once)
  --quiet           no progress line on stderr
";

/// What went wrong in a bench run.
#[derive(Debug)]
pub(crate) enum Error {
    /// Bad command line.
    Usage(String),
    /// The library could not be loaded or is not a v12 plugin.
    Load(String),
    /// The plugin has no usable device.
    NoDevice(String),
    /// A plugin call returned an error code.
    Plugin {
        /// The call.
        call: &'static str,
        /// Its `ncclResult_t`.
        code: i32,
    },
    /// A wait ran out of time.
    Stalled(String),
    /// The control connection failed.
    Control(String),
    /// The other process reported an error.
    Remote(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(s) => write!(f, "{s}"),
            Self::Load(s) => write!(f, "loading the plugin: {s}"),
            Self::NoDevice(s) => write!(f, "no device: {s}"),
            Self::Plugin { call, code } => write!(
                f,
                "the plugin's {call} returned {code} ({})",
                plugin::result_name(*code)
            ),
            Self::Stalled(s) => write!(f, "stalled: {s}"),
            Self::Control(s) => write!(f, "control connection: {s}"),
            Self::Remote(s) => write!(f, "the other side failed: {s}"),
        }
    }
}

/// Parsed command line.
#[derive(Debug, Clone)]
struct Options {
    role: Role,
    port: u16,
    plugin: Option<PathBuf>,
    dev: i32,
    /// `--fuse`: devices to fuse with `makeVDevice`; the fused device replaces `dev`.
    fuse: Option<Vec<i32>>,
    sizes: Vec<usize>,
    iters: usize,
    lat_iters: usize,
    window: usize,
    json: bool,
    quiet: bool,
    once: bool,
    /// Server: the control listener's address (`--bind`); default 0.0.0.0, 127.0.0.1 with `--once`.
    bind: Option<String>,
    poll: measure::Poll,
}

#[derive(Debug, Clone)]
enum Role {
    Loopback,
    Server,
    Client(String),
}

fn parse_size(s: &str) -> Result<usize, Error> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], KIB),
        Some((i, 'M' | 'm')) => (&s[..i], MIB),
        Some((i, 'G' | 'g')) => (&s[..i], 1024 * MIB),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n > 0 && *n <= 1024 * MIB)
        .ok_or_else(|| Error::Usage(format!("--sizes: {s:?} is not a size from 1 B to 1 GiB")))
}

fn parse_sizes(list: &str) -> Result<Vec<usize>, Error> {
    let mut sizes = Vec::new();
    if list == "none" {
        return Ok(sizes);
    }
    for item in list.split(',').filter(|s| !s.trim().is_empty()) {
        if let Some((a, b)) = item.split_once('-') {
            let (mut s, end) = (parse_size(a)?, parse_size(b)?);
            if s > end {
                return Err(Error::Usage(format!("--sizes: empty range {item:?}")));
            }
            while s <= end {
                sizes.push(s);
                s *= 2;
            }
        } else {
            sizes.push(parse_size(item)?);
        }
    }
    if sizes.is_empty() {
        return Err(Error::Usage("--sizes: no size given".into()));
    }
    Ok(sizes)
}

fn parse(args: &[String]) -> Result<Options, Error> {
    let mut o = Options {
        role: Role::Loopback,
        port: DEFAULT_PORT,
        plugin: std::env::var_os("RIVET_PLUGIN_LIB")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
        dev: 0,
        fuse: None,
        sizes: parse_sizes("4K-64M")?,
        iters: 1000,
        lat_iters: 2000,
        window: 8,
        json: false,
        quiet: false,
        once: false,
        bind: None,
        poll: measure::Poll::Yield,
    };
    let mut it = args.iter();
    let num = |flag: &str, v: Option<&String>| -> Result<usize, Error> {
        v.and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::Usage(format!("{flag} needs a number")))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--server" => o.role = Role::Server,
            "--client" => {
                let host = it
                    .next()
                    .ok_or_else(|| Error::Usage("--client needs HOST[:PORT]".into()))?;
                o.role = Role::Client(host.clone());
            }
            "--port" => {
                o.port = u16::try_from(num("--port", it.next())?)
                    .map_err(|_| Error::Usage("--port: 0..65535".into()))?;
            }
            "--plugin" => {
                o.plugin =
                    Some(PathBuf::from(it.next().ok_or_else(|| {
                        Error::Usage("--plugin needs a path".into())
                    })?));
            }
            "--dev" => {
                o.dev = i32::try_from(num("--dev", it.next())?)
                    .map_err(|_| Error::Usage("--dev: too large".into()))?;
            }
            "--fuse" => {
                let list = it
                    .next()
                    .ok_or_else(|| Error::Usage("--fuse needs a device list".into()))?;
                let devs = list
                    .split(',')
                    .map(|d| d.trim().parse::<i32>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| Error::Usage(format!("--fuse {list}: not a list of devices")))?;
                if !(1..=8).contains(&devs.len()) {
                    return Err(Error::Usage("--fuse takes 1 to 8 devices".into()));
                }
                o.fuse = Some(devs);
            }
            "--sizes" => {
                o.sizes = parse_sizes(
                    it.next()
                        .ok_or_else(|| Error::Usage("--sizes needs a list".into()))?,
                )?;
            }
            "--iters" => o.iters = num("--iters", it.next())?.max(1),
            "--lat-iters" => o.lat_iters = num("--lat-iters", it.next())?,
            "--window" => o.window = num("--window", it.next())?.clamp(1, 32),
            "--poll" => {
                o.poll = match it.next().map(String::as_str) {
                    Some("spin") => measure::Poll::Spin,
                    Some("yield") => measure::Poll::Yield,
                    Some("sleep") => measure::Poll::Sleep,
                    _ => return Err(Error::Usage("--poll: spin, yield or sleep".into())),
                };
            }
            "--json" => o.json = true,
            "--quiet" => o.quiet = true,
            "--once" => o.once = true,
            "--bind" => {
                o.bind = Some(
                    it.next()
                        .ok_or_else(|| Error::Usage("--bind needs an address".into()))?
                        .clone(),
                );
            }
            "-h" | "--help" => return Err(Error::Usage(String::new())),
            other => return Err(Error::Usage(format!("unknown option {other:?}"))),
        }
    }
    Ok(o)
}

/// The plugin library to load: `--plugin`, `RIVET_PLUGIN_LIB`, or next to this executable.
fn plugin_path(o: &Options) -> Result<PathBuf, Error> {
    find_plugin(o.plugin.as_ref())
}

/// The plugin library: `explicit` if given, else next to this executable (cargo build or install).
pub(crate) fn find_plugin(explicit: Option<&PathBuf>) -> Result<PathBuf, Error> {
    if let Some(p) = explicit {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::Load(format!("locating the rivet executable: {e}")))?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    // A cargo build puts the cdylib beside the binary; an install puts it in ../lib, the Debian
    // package in the multiarch directory ../lib/<arch>-linux-gnu (scripts/package.sh).
    for candidate in [
        dir.join("libnccl_net_rivet.so"),
        dir.join("../lib/libnccl-net-rivet.so"),
        dir.join(format!(
            "../lib/{}-linux-gnu/libnccl-net-rivet.so",
            std::env::consts::ARCH
        )),
    ] {
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    Err(Error::Load(format!(
        "no libnccl_net_rivet.so next to {} (build the workspace, or give --plugin PATH / RIVET_PLUGIN_LIB)",
        exe.display()
    )))
}

/// Timed messages for one size: `--iters`, fewer for large sizes (about 128 MiB per size).
fn iterations(size: usize, max: usize) -> usize {
    (BYTES_PER_SIZE / size).clamp(MIN_ITERS.min(max), max)
}

/// `rivet bench …`: run and report; the exit code says whether it worked.
pub(crate) fn main(args: &[String]) -> ExitCode {
    let o = match parse(args) {
        Ok(o) => o,
        Err(Error::Usage(msg)) if msg.is_empty() => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("rivet bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    measure::set_poll(o.poll);
    let result = match &o.role {
        Role::Server => server(&o),
        Role::Client(host) => client(&o, host, "client"),
        Role::Loopback => loopback(&o),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rivet bench: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---- server ----

fn server(o: &Options) -> Result<(), Error> {
    let path = plugin_path(o)?;
    let plugin = Plugin::load(&path, o.dev, o.fuse.as_deref())?;
    let bind = o
        .bind
        .as_deref()
        .unwrap_or(if o.once { "127.0.0.1" } else { "0.0.0.0" });
    let listener = TcpListener::bind((bind, o.port))
        .map_err(|e| Error::Control(format!("binding {bind}:{}: {e}", o.port)))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::Control(format!("local address: {e}")))?
        .port();
    // The loopback parent reads this line to learn the port.
    println!(
        "rivet bench server: {} via {}, control port {port}",
        plugin.device_name,
        path.display()
    );
    let _ = std::io::stdout().flush();
    loop {
        let (stream, peer) = listener
            .accept()
            .map_err(|e| Error::Control(format!("accepting a client: {e}")))?;
        let result = serve(&plugin, stream, o);
        match &result {
            Ok(()) => eprintln!("rivet bench server: {peer} done"),
            Err(e) => eprintln!("rivet bench server: {peer}: {e}"),
        }
        if o.once {
            return result;
        }
    }
}

fn serve(plugin: &Plugin, stream: TcpStream, o: &Options) -> Result<(), Error> {
    let mut ctl = Control::new(stream, Duration::from_secs(600))?;
    let hello = ctl.recv()?;
    if hello != GREETING {
        let _ = ctl.send(&format!("ERR expected {GREETING:?}, got {hello:?}"));
        return Err(Error::Control(format!("client greeted with {hello:?}")));
    }
    ctl.send(&format!("OK {}", plugin.device_name))?;
    let result = serve_session(plugin, &mut ctl, o);
    if let Err(e) = &result {
        let _ = ctl.send(&format!("ERR server: {e}"));
    }
    result
}

fn serve_session(plugin: &Plugin, ctl: &mut Control, _o: &Options) -> Result<(), Error> {
    let (listener, handle) = plugin.listen()?;
    ctl.send(&format!("HANDLE {}", encode_handle(&handle)))?;
    let mut peer = decode_handle(&ctl.expect("HANDLE")?)?;
    let (send, recv) = measure::establish(plugin, &listener, &mut peer)?;
    drop(listener); // closeListen right after accept, as NCCL does
    let mut inbox: Option<(usize, plugin::Region<'_, '_>)> = None;
    loop {
        let line = ctl.recv()?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let arg = |i: usize| -> Result<usize, Error> {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| Error::Control(format!("malformed command {line:?}")))
        };
        match words.first().copied() {
            Some("BW") => {
                let (size, count, window) = (arg(1)?, arg(2)?, arg(3)?);
                let cap = size.saturating_mul(window).clamp(size, size.max(64 * MIB));
                if inbox.as_ref().is_none_or(|(c, _)| *c < cap) {
                    // Deregister the smaller buffer before registering the larger one.
                    drop(inbox.take());
                    inbox = Some((cap, recv.register(cap)?));
                }
                let Some((_, region)) = &inbox else {
                    unreachable!("registered above")
                };
                measure::bandwidth_recv(&recv, region, size, count, window)?;
                ctl.send("DONE")?;
            }
            Some("LAT") => {
                let (size, count) = (arg(1)?, arg(2)?);
                let rin = recv.register(size.saturating_mul(measure::LAT_RECVS_AHEAD))?;
                let rout = send.register(size)?;
                measure::latency_server(&send, &recv, &rin, &rout, size, count)?;
                ctl.send("DONE")?;
            }
            Some("STOP") => {
                ctl.send("BYE")?;
                return Ok(());
            }
            _ => return Err(Error::Control(format!("unknown command {line:?}"))),
        }
    }
}

// ---- client ----

fn connect_control(host: &str, default_port: u16) -> Result<TcpStream, Error> {
    let has_port = host
        .rsplit_once(':')
        .is_some_and(|(h, p)| p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']')));
    let target = if has_port {
        host.to_owned()
    } else if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{default_port}") // a bare IPv6 address
    } else {
        format!("{host}:{default_port}")
    };
    let addrs: Vec<_> = target
        .to_socket_addrs()
        .map_err(|e| Error::Control(format!("resolving {target}: {e}")))?
        .collect();
    let mut last = None;
    // The server may still be starting (loopback child, or a just-launched server): retry briefly.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(Error::Control(format!(
        "connecting to {target}: {}",
        last.map_or_else(|| "no address".to_owned(), |e| e.to_string())
    )))
}

struct Progress {
    enabled: bool,
    tty: bool,
}

impl Progress {
    fn line(&self, msg: &str) {
        if !self.enabled {
            return;
        }
        let mut err = std::io::stderr();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{msg}");
        } else {
            let _ = writeln!(err, "{msg}");
        }
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.enabled && self.tty {
            let _ = writeln!(std::io::stderr());
        }
    }
}

fn client(o: &Options, host: &str, mode: &str) -> Result<(), Error> {
    let path = plugin_path(o)?;
    let plugin = Plugin::load(&path, o.dev, o.fuse.as_deref())?;
    let mut ctl = Control::new(connect_control(host, o.port)?, Duration::from_secs(600))?;
    ctl.send(GREETING)?;
    let server_device = ctl.expect("OK")?;
    let mut peer = decode_handle(&ctl.expect("HANDLE")?)?;
    let (listener, handle) = plugin.listen()?;
    ctl.send(&format!("HANDLE {}", encode_handle(&handle)))?;
    let (send, recv) = measure::establish(&plugin, &listener, &mut peer)?;
    drop(listener);

    let progress = Progress {
        enabled: !o.quiet,
        tty: std::io::stderr().is_terminal(),
    };
    let largest = o.sizes.iter().copied().max().unwrap_or(MIB);
    let cap = largest
        .saturating_mul(o.window)
        .clamp(largest, largest.max(64 * MIB));
    let region = send.register(cap)?;
    let mut bandwidth = Vec::with_capacity(o.sizes.len());
    let started = Instant::now();
    for (k, &size) in o.sizes.iter().enumerate() {
        let iters = iterations(size, o.iters);
        let warmup = o.window;
        progress.line(&format!(
            "rivet bench: bandwidth {} ({}/{}), {iters} messages, {:.0} s so far",
            report::human_size(size),
            k + 1,
            o.sizes.len(),
            started.elapsed().as_secs_f64()
        ));
        ctl.send(&format!("BW {size} {} {}", warmup + iters, o.window))?;
        let elapsed = measure::bandwidth_send(&send, &region, size, warmup, iters, o.window)?;
        ctl.expect("DONE")?;
        bandwidth.push(Bandwidth {
            size,
            iters,
            seconds: elapsed.as_secs_f64(),
        });
    }
    drop(region);
    let latency = if o.lat_iters > 0 {
        const LAT_SIZE: usize = 8;
        let warmup = (o.lat_iters / 10).clamp(1, 100);
        progress.line(&format!(
            "rivet bench: latency, {} round trips of {LAT_SIZE} B, {:.0} s so far",
            o.lat_iters,
            started.elapsed().as_secs_f64()
        ));
        ctl.send(&format!("LAT {LAT_SIZE} {}", warmup + o.lat_iters))?;
        let out = send.register(LAT_SIZE)?;
        let back = recv.register(LAT_SIZE * measure::LAT_RECVS_AHEAD)?;
        let samples =
            measure::latency_client(&send, &recv, &out, &back, LAT_SIZE, warmup, o.lat_iters)?;
        ctl.expect("DONE")?;
        Some(Latency::from_samples(LAT_SIZE, samples))
    } else {
        None
    };
    progress.finish();
    ctl.send("STOP")?;
    ctl.expect("BYE")?;
    let report = Report {
        mode: mode.to_owned(),
        plugin: path.display().to_string(),
        device: plugin.device_name.clone(),
        server_device,
        speed_mbps: plugin.speed_mbps,
        window: o.window,
        poll: o.poll.name(),
        bandwidth,
        latency,
    };
    if o.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

// ---- loopback ----

fn loopback(o: &Options) -> Result<(), Error> {
    let path = plugin_path(o)?;
    // Fail here, once and clearly, when there is no device, rather than through the child.
    drop(Plugin::load(&path, o.dev, o.fuse.as_deref())?);
    let exe = std::env::current_exe()
        .map_err(|e| Error::Load(format!("locating the rivet executable: {e}")))?;
    let mut command = Command::new(exe);
    command
        .args(["bench", "--server", "--once", "--port", "0", "--dev"])
        .arg(o.dev.to_string());
    if let Some(fuse) = &o.fuse {
        let list: Vec<String> = fuse.iter().map(i32::to_string).collect();
        command.arg("--fuse").arg(list.join(","));
    }
    let mut child = command
        .arg("--plugin")
        .arg(&path)
        .args(["--poll", o.poll.name()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Control(format!("starting the server process: {e}")))?;
    let port = child.stdout.take().and_then(|out| {
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).ok()?;
        line.rsplit(' ').next()?.trim().parse::<u16>().ok()
    });
    let result = match port {
        Some(port) => client(o, &format!("127.0.0.1:{port}"), "loopback"),
        None => Err(Error::Control(
            "the server process did not start (see its message above)".into(),
        )),
    };
    if result.is_err() {
        let _ = child.kill();
    }
    let status = child
        .wait()
        .map_err(|e| Error::Control(format!("waiting for the server process: {e}")))?;
    match result {
        Ok(()) if !status.success() => Err(Error::Remote(format!(
            "the server process exited with {status}"
        ))),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_lists_ranges_and_suffixes() {
        assert_eq!(
            parse_sizes("4K-64K").unwrap(),
            vec![4096, 8192, 16384, 32768, 65536]
        );
        assert_eq!(parse_sizes("8,1M,2m").unwrap(), vec![8, MIB, 2 * MIB]);
        assert_eq!(parse_sizes("4K-64M").unwrap().len(), 15);
        assert!(parse_sizes("0").is_err());
        assert!(parse_sizes("2G").is_err());
        assert!(parse_sizes("64K-4K").is_err());
        assert!(parse_sizes("x").is_err());
        assert!(parse_sizes("").is_err());
        assert_eq!(parse_sizes("none").unwrap(), Vec::<usize>::new());
    }

    #[test]
    fn iterations_shrink_for_large_sizes() {
        assert_eq!(iterations(4096, 1000), 1000);
        assert_eq!(iterations(MIB, 1000), 128);
        assert_eq!(iterations(64 * MIB, 1000), 8);
        assert_eq!(iterations(64 * MIB, 3), 3);
    }

    #[test]
    fn options_parse_roles() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert!(matches!(
            parse(&args("--server --port 9")).unwrap().role,
            Role::Server
        ));
        let o = parse(&args("--client h:5 --iters 3 --json")).unwrap();
        assert!(matches!(o.role, Role::Client(ref h) if h == "h:5"));
        assert_eq!((o.iters, o.json), (3, true));
        assert!(parse(&args("--bogus")).is_err());
        assert!(parse(&args("--port 70000")).is_err());
    }

    #[test]
    fn server_binds_where_told() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        let o = parse(&args("--server --once --bind 192.168.101.2")).unwrap();
        assert_eq!(o.bind.as_deref(), Some("192.168.101.2"));
        assert!(parse(&args("--server --bind")).is_err());
        assert_eq!(parse(&args("--server")).unwrap().bind, None);
    }
}
