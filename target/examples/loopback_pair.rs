//! The loopback rate of a bare sender and receiver on one TCP connection over
//! 127.0.0.1, with no iSCSI at all: what bounds a READ of large blocks on this
//! machine before either end parses a header.
//!
//! ```text
//! loopback_pair [--file FILE [--mapped] | --hot] [--buffers N] [--read-max BYTES] [--secs S]
//! ```
//!
//! The sender (a thread) either `sendfile(2)`s FILE, 1 MiB per call, passes
//! repeated, as a target sending from the page cache does (with `--mapped`:
//! copying sends from FILE's mapping, as blockwire sends large payloads of
//! an in-memory file to an initiator on this host), or with `--hot`
//! writes one 1 MiB buffer again and again, as iperf3 does. The receiver
//! (the main thread) reads into N buffers of 1 MiB taken in turn, each filled
//! by `read` calls into what is left of it (at most `--read-max` bytes each,
//! default all of it) before the next: the way a client with N 1 MiB READs in
//! flight places their data. `--buffers 1` is a
//! receiver that keeps one buffer in the CPU caches (iperf3's receiver
//! reads into one buffer of its length too).
//!
//! Prints `MB/s` of received bytes, one number.
//!
//! Run: `cargo run --release -p blockwire-target --example loopback_pair -- --hot --buffers 8`

use std::io::{Read, Write};
use std::os::fd::AsRawFd;

use blockwire_target::iscsi::file_map::FileMap;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// A run that could not measure: says why, exits 1.
fn fail(why: &str) -> ! {
    eprintln!("loopback_pair: {why}");
    std::process::exit(1)
}

const SYNOPSIS: &str =
    "loopback_pair [--file FILE [--mapped] | --hot] [--buffers N] [--read-max BYTES] [--secs S]";

fn usage(why: &str) -> ! {
    eprintln!("loopback_pair: {why}");
    eprintln!("usage: {SYNOPSIS}");
    std::process::exit(2)
}

enum Source {
    File(std::fs::File, u64),
    Mapped(FileMap, u64),
    Hot,
}

fn send(mut sock: TcpStream, source: Source, secs: f64) -> std::io::Result<u64> {
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
            Source::Mapped(map, size) => {
                let want = (MIB as u64).min(size - off) as usize;
                let mut done = 0;
                while done < want {
                    done += map.send(sock.as_raw_fd(), &[], off, want, done)?;
                }
                off = (off + want as u64) % size;
                sent += want as u64;
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
    let mut mapped = false;
    let mut read_max = MIB;
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        match a.as_str() {
            "--file" => file = Some(value("--file")),
            "--hot" => hot = true,
            "--mapped" => mapped = true,
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
                     from FILE's mapping with --mapped, or one hot 1 MiB buffer written again and\n\
                     again) and a receiver reading into N 1 MiB buffers\n\
                     in turn (default 8), for S seconds (default 5)."
                );
                std::process::exit(0)
            }
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if mapped && file.is_none() {
        usage("--mapped goes with --file FILE");
    }
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
            } else {
                Source::File(f, size)
            }
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("bound address");
    let sender = std::thread::spawn(move || {
        let sock = TcpStream::connect(addr)?;
        send(sock, source, secs)
    });
    let (mut conn, _) = listener.accept().expect("accept the sender");
    // Touched once, so no page is faulted in while timing.
    let mut bufs: Vec<Vec<u8>> = (0..buffers).map(|_| vec![1u8; MIB]).collect();
    let (mut which, mut at, mut total) = (0usize, 0usize, 0u64);
    let start = Instant::now();
    loop {
        let upto = MIB.min(at + read_max);
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
