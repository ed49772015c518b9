//! Copy-path harness (the data paths of the GMBlock paper): send a file's data to a TCP
//! socket on loopback three ways and count the bytes copied.
//!
//! - `cached`: read() from the page cache into a user buffer, write() to the
//!   socket: the kernel copies every byte twice (page cache -> user,
//!   user -> socket buffer).
//! - `sendfile`: sendfile() from the page cache: no copy on the sending
//!   side (the socket references the page-cache pages).
//! - `direct`: O_DIRECT read into a registered, aligned pool buffer by the
//!   datapath engine (io_uring READ_FIXED: device DMA, no CPU copy), then
//!   send(): one kernel copy (user buffer -> socket buffer).
//! - `none`: set-up only (the baseline `bench/copy-paths.sh` subtracts from
//!   callgrind's instruction counts).
//!
//! Usage: copy_paths [--bench] [PATH|all] [MiB]. Prints, per path, copies
//! per byte (user space / kernel) from our counters, throughput and CPU
//! time (user + system of this process: the sender and its I/O workers;
//! the receiver runs in a child process) per byte.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use blockwire_target::datapath::sink::StreamSink;
use blockwire_target::datapath::*;

const MIB: usize = 1 << 20;

/// A loopback connection to a receiver in a child process (this binary
/// with `--recv`), so the receiver's copies and CPU time are not ours.
fn connect() -> (TcpStream, std::process::Child) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--recv")
        .arg(addr.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (s, _) = l.accept().unwrap();
    (s, child)
}

/// The child: drains one connection, prints the byte count.
fn receive(addr: &str) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut buf = vec![0u8; MIB];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n as u64,
        }
    }
    println!("{total}");
}

fn cpu_time() -> f64 {
    // SAFETY: rusage is a plain C struct of integers and timevals, for
    // which all-zero bytes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, exclusively borrowed rusage for getrusage to
    // fill; RUSAGE_SELF needs nothing else.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Sends `size` bytes of `path` by `how`; returns the copies made.
fn run(how: &str, path: &std::path::Path, size: usize) -> CopyCost {
    let (mut sock, rx) = connect();
    let mut cost = CopyCost::default();
    match how {
        "none" => {}
        "cached" => {
            let mut f = File::open(path).unwrap();
            let mut buf = vec![0u8; 256 << 10];
            let mut left = size;
            while left > 0 {
                let n = f.read(&mut buf[..left.min(256 << 10)]).unwrap();
                assert!(n > 0);
                cost.kernel += n; // page cache -> user
                sock.write_all(&buf[..n]).unwrap();
                cost.kernel += n; // user -> socket buffer
                left -= n;
            }
        }
        "sendfile" => {
            let f = File::open(path).unwrap();
            let mut off: libc::off_t = 0;
            while (off as usize) < size {
                // SAFETY: both fds are open for the call (the socket and
                // file outlive it) and `off` is a valid, exclusive off_t.
                let n = unsafe {
                    libc::sendfile(
                        sock.as_raw_fd(),
                        f.as_raw_fd(),
                        &mut off,
                        size - off as usize,
                    )
                };
                assert!(n > 0, "sendfile: {}", std::io::Error::last_os_error());
            }
        }
        "direct" => {
            let pool = BufferPool::new(&[(MIB, 4)]);
            let (engine, desc) = open_engine(pool, EnginePref::Auto).unwrap();
            eprintln!("direct path engine: {desc}");
            let file = open_direct(path, false).expect("O_DIRECT open");
            let src = Source::File(Arc::new(file));
            let p = Pipeline::new(engine);
            let mut sink = StreamSink(&mut sock);
            let mut off = 0;
            while off < size {
                let len = MIB.min(size - off);
                let r = p
                    .read(
                        &src,
                        off as u64,
                        len,
                        &ReadConfig::synchronized(256 << 10),
                        &mut sink,
                    )
                    .unwrap();
                cost += r.copies;
                off += len;
            }
        }
        other => panic!("unknown path {other}: cached, sendfile, direct or none"),
    }
    drop(sock);
    let out = rx.wait_with_output().unwrap();
    let got: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(got as usize, if how == "none" { 0 } else { size });
    cost
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if let Some(i) = argv.iter().position(|a| a == "--recv") {
        return receive(&argv[i + 1]);
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let full = std::env::args().any(|a| a == "--bench");
    let which = args.first().cloned().unwrap_or_else(|| "all".into());
    let mib: usize = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(if full { 256 } else { 8 });
    let size = mib * MIB;
    let dir = std::env::var("BW_COPY_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let path = dir.join(format!("bw-copy-paths-{mib}M.dat"));
    if std::fs::metadata(&path).map(|m| m.len() as usize).ok() != Some(size) {
        let mut f = File::create(&path).unwrap();
        let block: Vec<u8> = (0..MIB).map(|i| (i * 7) as u8).collect();
        for _ in 0..mib {
            f.write_all(&block).unwrap();
        }
        f.sync_all().unwrap();
    }
    // Warm the page cache for the cached paths.
    let mut sink = vec![0u8; MIB];
    let mut f = File::open(&path).unwrap();
    while f.read(&mut sink).unwrap() > 0 {}

    let paths: Vec<&str> = if which == "all" {
        vec!["cached", "sendfile", "direct"]
    } else {
        vec![which.as_str()]
    };
    println!(
        "{:<9} {:>9} {:>12} {:>14} {:>10} {:>12}",
        "path", "MiB", "user cp/B", "kernel cp/B", "MB/s", "CPU ns/B"
    );
    for how in paths {
        let c0 = cpu_time();
        let t0 = Instant::now();
        let cost = run(how, &path, size);
        let secs = t0.elapsed().as_secs_f64();
        let cpu = cpu_time() - c0;
        let b = size.max(1) as f64;
        println!(
            "{:<9} {:>9} {:>12.2} {:>14.2} {:>10.0} {:>12.3}",
            how,
            mib,
            cost.user as f64 / b,
            cost.kernel as f64 / b,
            size as f64 / secs / 1e6,
            cpu * 1e9 / b
        );
    }
}
