//! The loopback rate of a bare sender and receiver on one TCP connection over
//! 127.0.0.1, with no iSCSI at all: what bounds a READ of large blocks on this
//! machine before either end parses a header.
//!
//! ```text
//! loopback_pair [--file FILE [--mapped [--pdus N [--pdu-sends]] | --splice] | --hot]
//!               [--buffers N] [--read-max BYTES] [--secs S]
//! ```
//!
//! The sender (a thread) either `sendfile(2)`s FILE, 1 MiB per call, passes
//! repeated, as a target sending from the page cache does (with `--mapped`:
//! copying sends from FILE's mapping, as blockwire sends large payloads of
//! an in-memory file to an initiator on this host; with `--splice`:
//! `splice(2)` from FILE into a pipe of 1 MiB and from the pipe to the
//! socket, which passes the page cache's pages as `sendfile` does but 1 MiB
//! per call where `sendfile`'s own pipe holds 16 pages), or with `--hot`
//! writes one 1 MiB buffer again and again, as iperf3 does. The receiver
//! (the main thread) reads into N buffers of 1 MiB taken in turn, each filled
//! by `read` calls into what is left of it (at most `--read-max` bytes each,
//! default all of it) before the next: the way a client with N 1 MiB READs in
//! flight places their data. With `--pdus N` (and `--mapped`) each 1 MiB
//! leaves as N PDUs of 1/N MiB, each behind a 48-byte header, as Data-In
//! PDUs of one READ do: all N in one `sendmsg` (as blockwire sends the
//! Data-In PDUs of a READ queued together), or one `sendmsg` each with
//! `--pdu-sends`; the receiver then reads each header, then its payload into
//! the buffer, as an initiator does. `--buffers 1` is a
//! receiver that keeps one buffer in the CPU caches (iperf3's receiver
//! reads into one buffer of its length too).
//!
//! Prints `MB/s` of received bytes, one number.
//!
//! Run: `cargo run --release -p blockwire-target --example loopback_pair -- --hot --buffers 8`

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::pipe::{fcntl_setpipe_size, pipe, splice, SpliceFlags};

use blockwire_target::iscsi::file_map::{FileMap, MappedPart, MAX_PARTS};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// A run that could not measure: says why, exits 1.
fn fail(why: &str) -> ! {
    eprintln!("loopback_pair: {why}");
    std::process::exit(1)
}

const SYNOPSIS: &str = "loopback_pair [--file FILE [--mapped [--pdus N [--pdu-sends]] | --splice] \
     | --hot] [--buffers N] [--read-max BYTES] [--secs S]";

/// The length of a Basic Header Segment, which `--pdus` puts before each
/// PDU's payload.
const HEAD: usize = 48;

/// How `--pdus` splits each 1 MiB: PDUs per MiB, and whether each has a
/// send of its own.
#[derive(Clone, Copy)]
struct Pdus {
    per_mib: usize,
    separate: bool,
}

fn usage(why: &str) -> ! {
    eprintln!("loopback_pair: {why}");
    eprintln!("usage: {SYNOPSIS}");
    std::process::exit(2)
}

enum Source {
    File(std::fs::File, u64),
    Mapped(FileMap, u64),
    /// The file, its size and a pipe (read end, write end) of 1 MiB.
    Spliced(std::fs::File, u64, (OwnedFd, OwnedFd)),
    Hot,
}

fn send(
    mut sock: TcpStream,
    source: Source,
    pdus: Option<Pdus>,
    secs: f64,
) -> std::io::Result<u64> {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    let hot = vec![0x5au8; MIB];
    let mut off = 0u64;
    while Instant::now() < end {
        match &source {
            Source::File(file, size) => {
                let want = (MIB as u64).min(size - off) as usize;
                let mut at = off;
                let n = rustix::fs::sendfile(&sock, file, Some(&mut at), want)?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                off = (off + n as u64) % size;
                sent += n as u64;
            }
            Source::Mapped(map, size) if pdus.is_some() => {
                // size is a whole number of MiB, so each pass sends 1 MiB.
                let Pdus { per_mib, separate } = pdus.expect("matched");
                let piece = MIB / per_mib;
                let head = [0x48u8; HEAD];
                let parts: Vec<MappedPart<'_>> = (0..per_mib)
                    .map(|i| MappedPart {
                        head: &head,
                        offset: off + (i * piece) as u64,
                        len: piece,
                    })
                    .collect();
                let groups: Vec<&[MappedPart<'_>]> = if separate {
                    parts.chunks(1).collect()
                } else {
                    vec![&parts[..]]
                };
                for group in groups {
                    let total: usize = group.iter().map(|p| p.head.len() + p.len).sum();
                    let mut done = 0;
                    while done < total {
                        done += map.send_parts(sock.as_raw_fd(), group, done)?;
                    }
                }
                off = (off + MIB as u64) % size;
                sent += MIB as u64;
            }
            Source::Mapped(map, size) => {
                let want = (MIB as u64).min(size - off) as usize;
                let mut done = 0;
                while done < want {
                    done += map.send(sock.as_raw_fd(), &[], off, want, done)?;
                }
                off = (off + want as u64) % size;
                sent += want as u64;
            }
            Source::Spliced(file, size, (pipe_out, pipe_in)) => {
                // size is a whole number of MiB: 1 MiB into the pipe, then out.
                let mut at = off;
                let mut queued = 0;
                while queued < MIB {
                    let n = splice(
                        file,
                        Some(&mut at),
                        pipe_in,
                        None,
                        MIB - queued,
                        SpliceFlags::MOVE,
                    )?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    queued += n;
                }
                let mut out = 0;
                while out < MIB {
                    match splice(pipe_out, None, &sock, None, MIB - out, SpliceFlags::MOVE)? {
                        0 => return Err(std::io::ErrorKind::WriteZero.into()),
                        n => out += n,
                    }
                }
                off = (off + MIB as u64) % size;
                sent += MIB as u64;
            }
            Source::Hot => {
                sock.write_all(&hot)?;
                sent += MIB as u64;
            }
        }
    }
    Ok(sent)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut file, mut hot, mut buffers, mut secs) = (None, false, 8usize, 5.0f64);
    let (mut mapped, mut spliced) = (false, false);
    let mut read_max = MIB;
    let (mut per_mib, mut separate) = (0usize, false);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        match a.as_str() {
            "--file" => file = Some(value("--file")),
            "--hot" => hot = true,
            "--mapped" => mapped = true,
            "--splice" => spliced = true,
            "--pdus" => {
                per_mib = value("--pdus")
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_PARTS).contains(n) && MIB % n == 0)
                    .unwrap_or_else(|| {
                        usage(&format!("--pdus takes a power of two up to {MAX_PARTS}"))
                    })
            }
            "--pdu-sends" => separate = true,
            "--buffers" => {
                buffers = value("--buffers")
                    .parse()
                    .ok()
                    .filter(|n| (1..=1024).contains(n))
                    .unwrap_or_else(|| usage("--buffers takes 1 to 1024"))
            }
            "--read-max" => {
                read_max = value("--read-max")
                    .parse()
                    .ok()
                    .filter(|n| (1..=MIB).contains(n))
                    .unwrap_or_else(|| usage("--read-max takes 1 to 1048576 bytes"))
            }
            "--secs" => {
                secs = value("--secs")
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0 && *s <= 3600.0)
                    .unwrap_or_else(|| usage("--secs takes a number of seconds, at most 3600"))
            }
            "-h" | "--help" => {
                println!(
                    "{SYNOPSIS}\n\
                     The loopback rate (MB/s) of a bare sender (sendfile of FILE, copying sends\n\
                     from FILE's mapping with --mapped, splice through a 1 MiB pipe with --splice,\n\
                     or one hot 1 MiB buffer written again and again) and a receiver reading into\n\
                     N 1 MiB buffers in turn (default 8), for S seconds (default 5). --pdus N\n\
                     sends each 1 MiB as N PDUs behind 48-byte headers, in one sendmsg\n\
                     (--pdu-sends: one each)."
                );
                std::process::exit(0)
            }
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if (mapped || spliced) && file.is_none() {
        usage("--mapped and --splice go with --file FILE");
    }
    if mapped && spliced {
        usage("give one of --mapped and --splice");
    }
    if (per_mib > 0 || separate) && !mapped {
        usage("--pdus and --pdu-sends go with --mapped");
    }
    if separate && per_mib == 0 {
        usage("--pdu-sends goes with --pdus N");
    }
    let pdus = (per_mib > 0).then_some(Pdus { per_mib, separate });
    let source = match (file, hot) {
        (Some(_), true) | (None, false) => usage("give one of --file FILE and --hot"),
        (None, true) => Source::Hot,
        (Some(path), false) => {
            let f = std::fs::File::open(&path).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
            let size = f.metadata().map(|m| m.len()).unwrap_or(0);
            if size < MIB as u64 {
                fail(&format!("{path} is smaller than 1 MiB"));
            }
            let size = size - size % MIB as u64;
            if mapped {
                let map = FileMap::new(&f)
                    .unwrap_or_else(|e| fail(&format!("mapping {path}: {e}")))
                    .unwrap_or_else(|| fail(&format!("{path} is empty")));
                Source::Mapped(map, size)
            } else if spliced {
                let pipe = pipe().unwrap_or_else(|e| fail(&format!("pipe: {e}")));
                // 1 MiB fits the default /proc/sys/fs/pipe-max-size.
                fcntl_setpipe_size(&pipe.1, MIB)
                    .unwrap_or_else(|e| fail(&format!("a pipe of 1 MiB: {e}")));
                Source::Spliced(f, size, pipe)
            } else {
                Source::File(f, size)
            }
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("bound address");
    let sender = std::thread::spawn(move || {
        let sock = TcpStream::connect(addr)?;
        send(sock, source, pdus, secs)
    });
    let (mut conn, _) = listener.accept().expect("accept the sender");
    // Touched once, so no page is faulted in while timing.
    let mut bufs: Vec<Vec<u8>> = (0..buffers).map(|_| vec![1u8; MIB]).collect();
    let (mut which, mut at, mut total) = (0usize, 0usize, 0u64);
    let piece = pdus.map_or(MIB, |p| MIB / p.per_mib);
    let mut head = [0u8; HEAD];
    let start = Instant::now();
    loop {
        if pdus.is_some() && at % piece == 0 {
            // Each PDU's header before its payload, as an initiator reads.
            match conn.read_exact(&mut head) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => fail(&format!("receive failed: {e}")),
            }
        }
        let upto = (at - at % piece + piece).min(at + read_max);
        let n = match conn.read(&mut bufs[which][at..upto]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => fail(&format!("receive failed: {e}")),
        };
        total += n as u64;
        at += n;
        if at == MIB {
            (which, at) = ((which + 1) % buffers, 0);
        }
    }
    let took = start.elapsed().as_secs_f64();
    match sender.join() {
        Ok(Ok(sent)) if sent == total => {}
        Ok(Ok(sent)) => fail(&format!("sent {sent} bytes but received {total}")),
        Ok(Err(e)) => fail(&format!("sender failed: {e}")),
        Err(_) => fail("sender panicked"),
    }
    println!("{:.1}", total as f64 / took / 1e6);
}
