//! Tests of the striped backstore: placement on the members, member sizing
//! and refusals, flush, UNMAP and the allocation map, errors, and a
//! model-based property test against a flat RAM image.

use super::*;
use crate::backstore::RamBackstore;
use proptest::prelude::*;
use std::os::unix::fs::FileExt;

fn paths(dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n).map(|i| dir.join(format!("m{i}.img"))).collect()
}

/// Device byte `d`'s test value (not the no-disk pattern, to keep them apart).
fn dev_byte(d: u64) -> u8 {
    (d % 251) as u8 ^ (d >> 12) as u8
}

fn dev_bytes(range: Range<u64>) -> Vec<u8> {
    range.map(dev_byte).collect()
}

/// Writes device bytes across every member (unaligned, crossing chunk
/// boundaries, large enough for the parallel path) and checks, by reading
/// the member files directly, that every byte sits where RAID0 puts it.
#[test]
fn bytes_land_on_the_right_member_at_the_right_offset() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path(), 3);
    let stripe = 4096u64;
    let size = 3 * 4096 * 40;
    let s = StripedBackstore::open(&p, stripe, Some(size), false, FileMode::Cached).unwrap();
    assert_eq!(s.size(), size);
    // Unaligned start inside member 0's first chunk, ends inside a later one.
    let range = 1000..1000 + 300 * 1024;
    s.write_at(range.start, &dev_bytes(range.clone())).unwrap();
    let files: Vec<File> = p.iter().map(|q| File::open(q).unwrap()).collect();
    for d in range.clone() {
        let k = d / stripe;
        let (m, mo) = ((k % 3) as usize, (k / 3) * stripe + d % stripe);
        let mut b = [0u8; 1];
        files[m].read_exact_at(&mut b, mo).unwrap();
        assert_eq!(b[0], dev_byte(d), "device byte {d} on member {m} at {mo}");
    }
    // Bytes outside the write stay zero, on every member.
    let mut head = vec![1u8; 1000];
    s.read_at(0, &mut head).unwrap();
    assert!(head.iter().all(|&b| b == 0));
    // Reads split the same way: small (serial) and large (parallel).
    for r in [range.start..range.start + 5000, range.clone(), 4095..4097] {
        let mut back = vec![0u8; (r.end - r.start) as usize];
        s.read_at(r.start, &mut back).unwrap();
        assert_eq!(back, dev_bytes(r.clone()), "read {r:?}");
    }
    // Exactly one chunk, on member 1 only.
    let mut one = vec![0u8; 4096];
    s.read_at(4096, &mut one).unwrap();
    assert_eq!(one, dev_bytes(4096..8192));
    assert!(s.read_at(size - 1, &mut [0u8; 2]).is_err());
    assert!(s.write_at(size, &[0u8]).is_err());
    assert!(
        s.describe().contains("striped 3 x 4 KiB"),
        "{}",
        s.describe()
    );
}

#[test]
fn member_span_is_the_union_of_the_mapped_pieces() {
    proptest!(|(members in 2u32..7, stripe_log in 0u32..6, start in 0u64..5000, len in 0u64..5000)| {
        let layout = StripeLayout::new(members, 64 << stripe_log);
        for m in 0..members {
            let pieces: Vec<Piece> = layout
                .map(start..start + len)
                .filter(|p| p.member == m)
                .collect();
            let want = match (pieces.first(), pieces.last()) {
                (Some(a), Some(b)) => Some(a.member_offset..b.member_offset + b.len),
                _ => None,
            };
            // Contiguity: the pieces tile the span without gaps.
            let covered: u64 = pieces.iter().map(|p| p.len).sum();
            if let Some(w) = &want {
                prop_assert_eq!(covered, w.end - w.start);
            }
            prop_assert_eq!(member_span(&layout, start..start + len, m), want);
        }
    });
}

#[test]
fn members_are_created_sized_and_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path(), 4);
    // 1 MiB + 64 KiB over 4 x 64 KiB: 17 chunks, so 5 per member.
    let size = (1 << 20) + (64 << 10);
    let s = StripedBackstore::open(&p, 64 << 10, Some(size), false, FileMode::Cached).unwrap();
    s.write_at(size - 10, b"last bytes").unwrap();
    s.flush().unwrap();
    drop(s);
    for q in &p {
        assert_eq!(
            std::fs::metadata(q).unwrap().len(),
            5 * (64 << 10),
            "{}",
            q.display()
        );
    }
    // Without a size: whole chunks on every member.
    let again = StripedBackstore::open(&p, 64 << 10, None, true, FileMode::Cached).unwrap();
    assert_eq!(again.size(), 4 * 5 * (64 << 10));
    let mut b = [0u8; 10];
    again.read_at(size - 10, &mut b).unwrap();
    assert_eq!(&b, b"last bytes");
    assert!(again.write_at(0, b"x").is_err(), "read-only members");
    // Growing the LUN grows every member and keeps the data in place.
    let grown =
        StripedBackstore::open(&p, 64 << 10, Some(2 << 20), false, FileMode::Cached).unwrap();
    grown.read_at(size - 10, &mut b).unwrap();
    assert_eq!(&b, b"last bytes");
    for q in &p {
        assert_eq!(std::fs::metadata(q).unwrap().len(), 512 << 10);
    }
}

#[test]
fn mismatched_members_and_bad_settings_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path(), 3);
    StripedBackstore::open(&p, 4096, Some(3 << 20), false, FileMode::Cached).unwrap();
    let err = |r: io::Result<StripedBackstore>| r.unwrap_err().to_string();

    // A member truncated to another length.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p[1])
        .unwrap()
        .set_len(4096)
        .unwrap();
    let e = err(StripedBackstore::open(
        &p,
        4096,
        Some(3 << 20),
        false,
        FileMode::Cached,
    ));
    assert!(
        e.contains("m1.img is 4096 bytes") && e.contains("m0.img"),
        "{e}"
    );
    assert!(e.contains("truncate -s"), "says the fix: {e}");
    // A member missing while the others hold data.
    std::fs::remove_file(&p[1]).unwrap();
    let e = err(StripedBackstore::open(
        &p,
        4096,
        Some(3 << 20),
        false,
        FileMode::Cached,
    ));
    assert!(e.contains("m1.img is missing or empty"), "{e}");
    assert!(!p[1].exists(), "a refused open creates nothing");
    // Adding a fourth (new) member to a set with data.
    let mut four = p.clone();
    std::fs::copy(&p[0], &p[1]).unwrap();
    four.push(dir.path().join("m3.img"));
    let e = err(StripedBackstore::open(
        &four,
        4096,
        Some(4 << 20),
        false,
        FileMode::Cached,
    ));
    assert!(e.contains("m3.img is missing or empty"), "{e}");
    // Read-only members too short for the size asked.
    let e = err(StripedBackstore::open(
        &p,
        4096,
        Some(6 << 20),
        true,
        FileMode::Cached,
    ));
    assert!(e.contains("read-only") && e.contains("m0.img"), "{e}");

    let e = err(StripedBackstore::open(
        &p[..1],
        4096,
        Some(1 << 20),
        false,
        FileMode::Cached,
    ));
    assert!(e.contains("at least 2"), "{e}");
    let twice = vec![p[0].clone(), p[0].clone()];
    let e = err(StripedBackstore::open(
        &twice,
        4096,
        Some(1 << 20),
        false,
        FileMode::Cached,
    ));
    assert!(e.contains("listed twice"), "{e}");
    for bad in [3000, 256, 32 << 20] {
        let e = err(StripedBackstore::open(
            &p,
            bad,
            Some(3 << 20),
            false,
            FileMode::Cached,
        ));
        assert!(e.contains("power of two"), "{bad}: {e}");
    }
    let e = err(StripedBackstore::open(
        &p,
        1024,
        Some(3 << 20),
        false,
        FileMode::Direct,
    ));
    assert!(e.contains("direct mode needs a stripe chunk"), "{e}");
    let fresh = paths(&dir.path().join("none"), 2);
    let e = err(StripedBackstore::open(
        &fresh,
        4096,
        None,
        false,
        FileMode::Cached,
    ));
    assert!(e.contains("give the LUN a size"), "{e}");
}

/// Durable writes and flush reach every member: what was written through
/// the store reads back through independent handles on each file.
#[test]
fn durable_writes_and_flush_reach_every_member() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path(), 2);
    let s = StripedBackstore::open(&p, 8192, Some(1 << 20), false, FileMode::Cached).unwrap();
    // A large durable write: one thread per member even in cached mode.
    let before = PARALLEL_RUNS.load(std::sync::atomic::Ordering::Relaxed);
    s.write_at_durable(0, &dev_bytes(0..600_000)).unwrap();
    assert!(PARALLEL_RUNS.load(std::sync::atomic::Ordering::Relaxed) > before);
    s.write_at_durable(4096, &dev_bytes(4096..4096 + 16384))
        .unwrap();
    s.write_at(65536, &dev_bytes(65536..65536 + 200_000))
        .unwrap();
    s.flush().unwrap();
    let reopened = StripedBackstore::open(&p, 8192, None, true, FileMode::Cached).unwrap();
    let mut b = vec![0u8; 16384];
    reopened.read_at(4096, &mut b).unwrap();
    assert_eq!(b, dev_bytes(4096..4096 + 16384));
    let mut b = vec![0u8; 200_000];
    reopened.read_at(65536, &mut b).unwrap();
    assert_eq!(b, dev_bytes(65536..65536 + 200_000));
    for q in &p {
        let f = File::open(q).unwrap();
        let mut any = vec![0u8; 8192];
        f.read_exact_at(&mut any, 0).unwrap();
        assert!(any.iter().any(|&x| x != 0), "{} got its share", q.display());
    }
}

/// UNMAP punches holes in every member's share; the range reads zeros,
/// the data around it survives, and the allocation map shows the hole in
/// device coordinates.
#[test]
fn unmap_punches_every_member_and_the_map_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path(), 3);
    let stripe = 64 << 10;
    let size = 3 * stripe * 8; // 1.5 MiB
    let s = StripedBackstore::open(&p, stripe, Some(size), false, FileMode::Cached).unwrap();
    s.write_at(0, &dev_bytes(0..size)).unwrap();
    s.flush().unwrap();
    // From mid chunk 1 to mid chunk 10: partial chunks on two members.
    let hole = stripe + 4096..10 * stripe + 8192;
    s.discard(hole.start, hole.end - hole.start).unwrap();
    let mut all = vec![0u8; size as usize];
    s.read_at(0, &mut all).unwrap();
    for (d, &b) in all.iter().enumerate() {
        let d = d as u64;
        let want = if hole.contains(&d) { 0 } else { dev_byte(d) };
        assert_eq!(b, want, "device byte {d}");
    }
    let map = s.allocation(0, size).unwrap().expect("files keep a map");
    let covered: u64 = map.iter().map(|e| e.len).sum();
    assert_eq!(covered, size);
    for w in map.windows(2) {
        assert_eq!(w[0].offset + w[0].len, w[1].offset, "in order, no gaps");
        assert_ne!(w[0].mapped, w[1].mapped, "runs are merged");
    }
    // Whole chunks 2..=9 are inside the hole on every member.
    let unmapped: Vec<Range<u64>> = map
        .iter()
        .filter(|e| !e.mapped)
        .map(|e| e.offset..e.offset + e.len)
        .collect();
    assert!(
        unmapped
            .iter()
            .any(|r| r.start <= 2 * stripe && r.end >= 10 * stripe),
        "{map:?}"
    );
    for r in &unmapped {
        assert!(
            r.start >= hole.start && r.end <= hole.end,
            "{r:?} outside {hole:?}"
        );
    }
    // WRITE SAME zeros without unmap: zeros, still allocated.
    s.write_zeroes(0, 3 * stripe).unwrap();
    let mut z = vec![1u8; 3 * stripe as usize];
    s.read_at(0, &mut z).unwrap();
    assert!(z.iter().all(|&b| b == 0));
    // A partial map from an offset.
    let part = s.allocation(stripe, 2 * stripe).unwrap().unwrap();
    assert_eq!(part.first().unwrap().offset, stripe);
    assert_eq!(part.iter().map(|e| e.len).sum::<u64>(), 2 * stripe);
}

/// A member that fails (here: truncated under the store, so reads hit end
/// of file) fails the commands touching it with its error unchanged, and
/// the SCSI core turns that into MEDIUM ERROR naming the command's LBA;
/// commands on the other members still work.
#[test]
fn a_failing_member_is_a_medium_error_at_the_lba() {
    use crate::scsi::{ItNexus, LogicalUnit, LuConfig, LunTable, ScsiRequest};
    use blockwire_pdu::pdu::codes::TaskAttr;
    use blockwire_pdu::scsi::{Asc, Cdb, CdbSize, Rw, Sense, SenseKey};

    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path(), 2);
    let s =
        Arc::new(StripedBackstore::open(&p, 4096, Some(1 << 20), false, FileMode::Cached).unwrap());
    s.write_at(0, &dev_bytes(0..1 << 20)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p[1])
        .unwrap()
        .set_len(0)
        .unwrap();
    let e = s.read_at(4096, &mut [0u8; 4096]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    // Member 0 is fine.
    let mut ok = vec![0u8; 4096];
    s.read_at(8192, &mut ok).unwrap();
    assert_eq!(ok, dev_bytes(8192..12288));

    let t = LunTable::new(vec![(
        0,
        Arc::new(LogicalUnit::new(LuConfig::new(s.clone()))),
    )]);
    let nexus = ItNexus::iscsi("iqn.a", [0x40, 0, 0, 0, 0, 1], "iqn.t", 1);
    let read = |lba: u64, blocks: u32| {
        let cdb = Cdb::Read {
            rw: Rw {
                size: CdbSize::Ten,
                lba,
                length: blocks,
                protect: 0,
                dpo: false,
                fua: false,
                group: 0,
            },
            rarc: false,
        }
        .encode();
        t.execute(&ScsiRequest {
            lun: 0,
            cdb: &cdb,
            nexus: &nexus,
            task_tag: 1,
            attr: TaskAttr::Simple,
            data_out: &[],
            data_in_capacity: blocks * 512,
            initiator_stats: None,
        })
    };
    // Clear the power-on unit attention.
    let mut r = read(16, 8);
    for _ in 0..4 {
        if r.status == 0 {
            break;
        }
        r = read(16, 8);
    }
    assert_eq!(r.status, 0, "member 0's chunk 1 reads fine");
    // LBA 6..=13 crosses into chunk 1 (member 1).
    let r = read(6, 8);
    assert_eq!(r.status, 2, "{r:?}");
    let sense = Sense::decode(r.sense.as_deref().unwrap()).unwrap();
    assert_eq!(
        (sense.key, sense.code(), sense.information),
        (SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR, Some(6))
    );
}

/// Direct mode (or its announced fallback) across members, unaligned.
#[test]
fn direct_mode_round_trips_across_members() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path(), 2);
    let s = StripedBackstore::open(&p, 16384, Some(2 << 20), false, FileMode::Direct).unwrap();
    eprintln!("{}", s.describe());
    let before = PARALLEL_RUNS.load(std::sync::atomic::Ordering::Relaxed);
    // Large enough for one thread per member (when O_DIRECT really runs).
    let r = 777..777 + 700_000;
    s.write_at(r.start, &dev_bytes(r.clone())).unwrap();
    s.write_at_durable(600_000, &dev_bytes(600_000..600_000 + 40_000))
        .unwrap();
    let mut b = vec![0u8; (r.end - r.start) as usize];
    s.read_at(r.start, &mut b).unwrap();
    assert_eq!(b, dev_bytes(r));
    let mut b = vec![0u8; 40_000];
    s.read_at(600_000, &mut b).unwrap();
    assert_eq!(b, dev_bytes(600_000..640_000));
    if s.direct() {
        let runs = PARALLEL_RUNS.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert!(runs >= 2, "the large write and read ran per member: {runs}");
    }
    let (src, direct) = s
        .engine_source()
        .unwrap()
        .expect("the engine reads a striped store");
    assert_eq!(direct, s.direct());
    assert_eq!(src.streams(), 2);
}

#[derive(Debug, Clone)]
enum Op {
    Write(u64, Vec<u8>, bool),
    Read(u64, usize),
    Discard(u64, u64),
    Zero(u64, u64),
    Flush,
}

fn op(size: u64) -> impl Strategy<Value = Op> {
    let at = 0..size;
    prop_oneof![
        4 => (at.clone(), 1usize..800_000, any::<u8>(), any::<bool>()).prop_map(move |(o, n, seed, durable)| {
            let n = n.min((size - o) as usize).max(1);
            let o = o.min(size - n as u64);
            Op::Write(o, (0..n).map(|i| seed.wrapping_add((i % 253) as u8)).collect(), durable)
        }),
        4 => (at.clone(), 1usize..800_000).prop_map(move |(o, n)| {
            let n = n.min((size - o) as usize).max(1);
            Op::Read(o.min(size - n as u64), n)
        }),
        1 => (at.clone(), 1u64..200_000).prop_map(move |(o, n)| Op::Discard(o, n.min(size - o))),
        1 => (at, 1u64..200_000).prop_map(move |(o, n)| Op::Zero(o, n.min(size - o))),
        1 => Just(Op::Flush),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A striped LUN behaves like one flat byte array (the RAM backstore)
    /// for any mix of reads, writes, UNMAP, WRITE SAME zeros and flushes,
    /// in cached and direct mode; reopening it gives the same bytes.
    #[test]
    fn behaves_like_a_flat_image(
        members in 2usize..5,
        stripe_log in 0u32..6,
        direct in any::<bool>(),
        ops in proptest::collection::vec(op(1 << 20), 1..25),
    ) {
        let stripe = 4096u64 << stripe_log;
        let size = 1u64 << 20;
        let mode = if direct { FileMode::Direct } else { FileMode::Cached };
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path(), members);
        let s = StripedBackstore::open(&p, stripe, Some(size), false, mode).unwrap();
        let model = RamBackstore::new(size);
        for o in &ops {
            match o {
                Op::Write(at, d, durable) => {
                    if *durable { s.write_at_durable(*at, d).unwrap() } else { s.write_at(*at, d).unwrap() }
                    model.write_at(*at, d).unwrap();
                }
                Op::Read(at, n) => {
                    let (mut a, mut b) = (vec![0u8; *n], vec![0u8; *n]);
                    s.read_at(*at, &mut a).unwrap();
                    model.read_at(*at, &mut b).unwrap();
                    prop_assert!(a == b, "read {}+{} differs", at, n);
                }
                Op::Discard(at, n) => {
                    s.discard(*at, *n).unwrap();
                    model.discard(*at, *n).unwrap();
                }
                Op::Zero(at, n) => {
                    s.write_zeroes(*at, *n).unwrap();
                    model.write_zeroes(*at, *n).unwrap();
                }
                Op::Flush => s.flush().unwrap(),
            }
        }
        s.flush().unwrap();
        drop(s);
        let again = StripedBackstore::open(&p, stripe, None, true, mode).unwrap();
        // Without a size, whole chunks on every member: at least the size.
        prop_assert_eq!(again.size(), StripeLayout::new(members as u32, stripe).member_size(size) * members as u64);
        let (mut a, mut b) = (vec![0u8; size as usize], vec![0u8; size as usize]);
        again.read_at(0, &mut a).unwrap();
        model.read_at(0, &mut b).unwrap();
        prop_assert!(a == b, "image differs after reopen");
        // The allocation map covers the device in order.
        let map = again.allocation(0, size).unwrap().unwrap();
        prop_assert_eq!(map.iter().map(|e| e.len).sum::<u64>(), size);
        for x in map.iter().filter(|x| !x.mapped) {
            let mut z = vec![1u8; x.len as usize];
            again.read_at(x.offset, &mut z).unwrap();
            prop_assert!(z.iter().all(|&v| v == 0), "a hole reads zeros");
        }
    }
}
