use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use super::*;

/// A file in tmpfs when the machine has one (the case the mapping is for),
/// else in the temporary directory.
fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("bw-file-map")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

/// A file of `data` in `dir` and its mapping; the file's path comes back
/// for writers and truncation through other descriptors.
fn mapped(dir: &tempfile::TempDir, data: &[u8]) -> (std::path::PathBuf, File, FileMap) {
    let path = dir.path().join("lun.img");
    std::fs::write(&path, data).unwrap();
    let file = File::open(&path).unwrap();
    let map = FileMap::new(&file).unwrap().expect("a non-empty file maps");
    (path, file, map)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

/// Sends `head` and the mapped range through a socket pair, resuming after
/// partial sends as the writer does; returns what the peer received.
fn send_all(map: &FileMap, head: &[u8], offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let (a, mut b) = UnixStream::pair()?;
    let total = head.len() + len;
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; total];
        b.read_exact(&mut got).map(|_| got)
    });
    let mut done = 0;
    while done < total {
        // A blocking socket: each call waits for room, and partial sends
        // come whenever the reader drains less than the rest.
        done += map.send(a.as_raw_fd(), head, offset, len, done)?;
    }
    reader.join().unwrap()
}

#[test]
fn sends_the_header_then_the_files_bytes_across_partial_sends() {
    let dir = scratch_dir();
    let data = pattern(3 << 20);
    let (_path, _file, map) = mapped(&dir, &data);
    assert_eq!(map.len(), data.len());
    let head = b"forty-eight bytes of a Basic Header Segment....".to_vec();
    // 2 MiB through a socket pair's small buffer: many partial sends.
    let (offset, len) = (4096 + 17, 2 << 20);
    let got = send_all(&map, &head, offset as u64, len).unwrap();
    assert_eq!(&got[..head.len()], &head[..]);
    assert!(
        got[head.len()..] == data[offset..offset + len],
        "payload differs from the file"
    );
}

#[test]
fn sends_what_the_file_holds_at_send_time() {
    let dir = scratch_dir();
    let (path, _file, map) = mapped(&dir, &pattern(1 << 20));
    // A WRITE through another descriptor after the mapping was made.
    let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    w.write_all(&[0xA5; 8192]).unwrap();
    let got = send_all(&map, &[], 0, 8192).unwrap();
    assert_eq!(got, vec![0xA5; 8192]);
}

#[test]
fn ranges_over_holes_or_past_the_mapping_are_not_offered() {
    let dir = scratch_dir();
    let path = dir.path().join("sparse.img");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(8 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&pattern(1 << 20), 1 << 20).unwrap();
    let map = FileMap::new(&file).unwrap().unwrap();
    assert!(map.allocated(1 << 20, 1 << 20), "the written MiB");
    assert!(!map.allocated(0, 1 << 20), "the hole before it");
    assert!(
        !map.allocated((1 << 20) + 4096, 1 << 20),
        "runs into the hole after it"
    );
    assert!(!map.allocated(8 << 20, 4096), "past the end of the mapping");
    assert!(!map.allocated(u64::MAX - 10, 4096), "offset overflow");
}

#[test]
fn a_file_truncated_under_the_mapping_fails_the_send_without_a_signal() {
    let dir = scratch_dir();
    let (path, _file, map) = mapped(&dir, &pattern(1 << 20));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    // The kernel's copy from beyond the end faults inside sendmsg: EFAULT,
    // and this process is still here to see it (no SIGBUS).
    let e = send_all(&map, &[], 512 << 10, 64 << 10).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
}

#[test]
fn an_empty_file_has_no_mapping() {
    let dir = scratch_dir();
    let path = dir.path().join("empty.img");
    std::fs::write(&path, b"").unwrap();
    assert!(FileMap::new(&File::open(&path).unwrap()).unwrap().is_none());
}

#[test]
fn sends_several_pdus_in_order_across_partial_sends() {
    let dir = scratch_dir();
    let data = pattern(4 << 20);
    let (_path, _file, map) = mapped(&dir, &data);
    // Four PDUs of a READ, out of file order on purpose, one with no
    // header, through a socket pair's small buffer: partial sends stop
    // inside heads and inside payloads alike.
    let heads: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i + 1; 48]).collect();
    let ranges = [
        (1 << 20, 256 << 10),
        (0, 300_000),
        (3 << 20, 4),
        (4096, 512 << 10),
    ];
    let parts: Vec<MappedPart<'_>> = ranges
        .iter()
        .zip(&heads)
        .enumerate()
        .map(|(i, (&(offset, len), head))| MappedPart {
            head: if i == 2 { &[] } else { head },
            offset,
            len,
        })
        .collect();
    let mut want = Vec::new();
    for p in &parts {
        want.extend_from_slice(p.head);
        want.extend_from_slice(&data[p.offset as usize..p.offset as usize + p.len]);
    }
    let (a, mut b) = UnixStream::pair().unwrap();
    let total = want.len();
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; total];
        b.read_exact(&mut got).map(|_| got)
    });
    // Non-blocking, as the target's sockets are: a call sends what fits.
    a.set_nonblocking(true).unwrap();
    let (mut done, mut calls) = (0, 0);
    while done < total {
        match map.send_parts(a.as_raw_fd(), &parts, done) {
            Ok(n) => {
                done += n;
                calls += 1;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(e) => panic!("send_parts: {e}"),
        }
    }
    assert_eq!(done, total, "no byte sent twice");
    assert!(
        calls > 1,
        "the socket pair's buffer should have split the send"
    );
    let got = reader.join().unwrap().unwrap();
    assert!(
        got == want,
        "bytes differ from the heads and ranges in order"
    );
}

#[test]
#[should_panic(expected = "payload outside the mapping")]
fn a_part_past_the_mapping_is_refused() {
    let dir = scratch_dir();
    let (_path, _file, map) = mapped(&dir, &pattern(8192));
    let part = MappedPart {
        head: &[],
        offset: 4096,
        len: 8192,
    };
    let (a, _b) = UnixStream::pair().unwrap();
    let _ = map.send_parts(a.as_raw_fd(), &[part], 0);
}
