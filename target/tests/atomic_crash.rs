//! Crash consistency of WRITE ATOMIC on a file LUN: the target killed at
//! any byte of an atomic write's three steps (journal record, in-place
//! write, done mark) or with its journal cut short at any byte, then the
//! store opened again: the written range is wholly old or wholly new, the
//! rest of the file untouched.
//!
//! The crash states are built from the bytes the journal's own encoders
//! produce, and the test first checks that those are exactly what a real
//! atomic write leaves in the two files, so the model is the writer.

use std::path::Path;

use blockwire_pdu::digest::crc32c_digest;
use blockwire_target::backstore::journal::{encode_record, parse_file_header, RecordHeader};
use blockwire_target::backstore::{Backstore, FileBackstore};

const SIZE: u64 = 64 << 10;
/// The atomic write under test: 16 KiB at 24 KiB.
const OFF: u64 = 24 << 10;
const LEN: usize = 16 << 10;

fn tmp() -> tempfile::TempDir {
    // tmpfs when there is one: fdatasync is free there, and the test
    // opens the store some 33 000 times.
    tempfile::Builder::new()
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn open(backing: &Path, journal: &Path) -> std::io::Result<(FileBackstore, usize)> {
    FileBackstore::open(backing, Some(SIZE), false)?.with_atomic_journal(journal)
}

fn splice(buf: &mut Vec<u8>, at: u64, bytes: &[u8]) {
    let at = at as usize;
    if buf.len() < at + bytes.len() {
        buf.resize(at + bytes.len(), 0);
    }
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

#[derive(Debug, PartialEq)]
enum Found {
    Old,
    New,
}

struct Case {
    dir: tempfile::TempDir,
    backing_before: Vec<u8>,
    journal_before: Vec<u8>,
    old: Vec<u8>,
    new: Vec<u8>,
}

impl Case {
    fn backing(&self) -> std::path::PathBuf {
        self.dir.path().join("lun.img")
    }

    fn journal(&self) -> std::path::PathBuf {
        self.dir.path().join("lun.img.atomic-journal")
    }

    /// Writes the two files, opens the store (replaying), and says what
    /// the range holds; panics on a torn range or a change elsewhere.
    fn recover(&self, backing: &[u8], journal: &[u8], what: &str) -> std::io::Result<Found> {
        std::fs::write(self.backing(), backing).unwrap();
        std::fs::write(self.journal(), journal).unwrap();
        let (store, _) = open(&self.backing(), &self.journal())?;
        let mut got = vec![0u8; SIZE as usize];
        store.read_at(0, &mut got).unwrap();
        let range = &got[OFF as usize..OFF as usize + LEN];
        let found = if range == &self.old[..] {
            Found::Old
        } else if range == &self.new[..] {
            Found::New
        } else {
            let first_new = range.iter().zip(&self.new).position(|(a, b)| a == b);
            panic!("{what}: torn range (first byte equal to new at {first_new:?})");
        };
        let mut outside = got.clone();
        outside[OFF as usize..OFF as usize + LEN]
            .copy_from_slice(&self.backing_before[OFF as usize..OFF as usize + LEN]);
        assert!(
            outside == self.backing_before,
            "{what}: bytes outside the range changed"
        );
        // Whatever it found, the store now writes atomically again.
        store.write_atomic(0, &[0xee; 512], false).unwrap();
        Ok(found)
    }
}

fn setup() -> Case {
    let dir = tmp();
    let backing = dir.path().join("lun.img");
    let journal = dir.path().join("lun.img.atomic-journal");
    let base: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&backing, &base).unwrap();
    // An earlier atomic write elsewhere: its done record sits in the slot
    // the write under test reuses.
    let (store, replayed) = open(&backing, &journal).unwrap();
    assert_eq!(replayed, 0);
    store.write_atomic(4096, &[0xa0; 8192], false).unwrap();
    drop(store);
    let backing_before = std::fs::read(&backing).unwrap();
    let journal_before = std::fs::read(&journal).unwrap();
    let old = backing_before[OFF as usize..OFF as usize + LEN].to_vec();
    let new: Vec<u8> = (0..LEN).map(|i| (i / 512) as u8 ^ 0x3c).collect();
    Case {
        dir,
        backing_before,
        journal_before,
        old,
        new,
    }
}

#[test]
fn killed_at_any_byte_of_an_atomic_write() {
    let case = setup();
    let g = parse_file_header(&case.journal_before).unwrap();
    let slot = g.slot_offset(0);
    // The first write had sequence 1; this one is 2.
    let record = encode_record(2, OFF, &case.new);
    let done = RecordHeader {
        seq: 2,
        offset: OFF,
        len: LEN as u32,
        data_crc: crc32c_digest(&case.new),
        done: true,
    }
    .encode();

    // The model is the writer: a real atomic write leaves exactly this.
    {
        let (store, _) = open(&case.backing(), &case.journal()).unwrap();
        store.write_atomic(OFF, &case.new, false).unwrap();
    }
    let mut journal_after = case.journal_before.clone();
    splice(&mut journal_after, slot, &record);
    splice(&mut journal_after, slot, &done);
    let mut backing_after = case.backing_before.clone();
    splice(&mut backing_after, OFF, &case.new);
    assert!(std::fs::read(case.journal()).unwrap() == journal_after);
    assert!(std::fs::read(case.backing()).unwrap() == backing_after);

    // Step 1 cut at every byte: old until the record is whole.
    let mut counts = [0usize; 2];
    for k in 0..=record.len() {
        let mut j = case.journal_before.clone();
        splice(&mut j, slot, &record[..k]);
        let found = case
            .recover(&case.backing_before, &j, &format!("record cut at {k}"))
            .unwrap();
        let want = if k == record.len() {
            Found::New
        } else {
            Found::Old
        };
        assert_eq!(found, want, "record cut at {k}");
        counts[usize::from(found == Found::New)] += 1;
    }
    // Step 2 cut anywhere (every 61st byte and both ends: the replay
    // rewrites the whole range whatever the cut).
    let mut j1 = case.journal_before.clone();
    splice(&mut j1, slot, &record);
    for k in (0..=LEN).filter(|k| k % 61 == 0 || *k == LEN) {
        let mut b = case.backing_before.clone();
        splice(&mut b, OFF, &case.new[..k]);
        let found = case
            .recover(&b, &j1, &format!("in-place write cut at {k}"))
            .unwrap();
        assert_eq!(found, Found::New, "in-place write cut at {k}");
        counts[1] += 1;
    }
    // Step 3 cut at every byte: new (replayed or not).
    for k in 0..=done.len() {
        let mut j = j1.clone();
        splice(&mut j, slot, &done[..k]);
        let found = case
            .recover(&backing_after, &j, &format!("done mark cut at {k}"))
            .unwrap();
        assert_eq!(found, Found::New, "done mark cut at {k}");
        counts[1] += 1;
    }
    println!(
        "crash states: {} wholly old, {} wholly new, none torn",
        counts[0], counts[1]
    );
}

#[test]
fn journal_cut_short_at_any_byte() {
    let case = setup();
    let g = parse_file_header(&case.journal_before).unwrap();
    let slot = g.slot_offset(0);
    let record = encode_record(2, OFF, &case.new);
    // The record is durable, the in-place write not begun, and then the
    // journal file loses its tail (a truncation, or blocks never written).
    let mut j1 = case.journal_before.clone();
    splice(&mut j1, slot, &record);
    let whole = slot as usize + record.len();
    let (mut old, mut new, mut refused) = (0, 0, 0);
    for cut in 0..=j1.len() {
        // Past the record, every cut gives the same answer: step through
        // the slots' tails in big strides.
        if cut > whole + 64 && cut % 4096 != 0 && cut != j1.len() {
            continue;
        }
        match case.recover(
            &case.backing_before,
            &j1[..cut],
            &format!("journal cut at {cut}"),
        ) {
            Ok(Found::Old) => {
                assert!(
                    cut < whole,
                    "journal cut at {cut}: a whole record was dropped"
                );
                old += 1;
            }
            Ok(Found::New) => {
                assert!(cut >= whole, "journal cut at {cut}");
                new += 1;
            }
            // A journal whose header (its first 20 bytes) is cut is
            // refused, never taken as empty: it could hold unfinished
            // writes.
            Err(e) => {
                assert!(cut > 0 && cut < 20, "journal cut at {cut}: {e}");
                assert!(e.to_string().contains("atomic-write journal"), "{e}");
                refused += 1;
            }
        }
    }
    println!("journal cuts: {old} wholly old, {new} wholly new, {refused} refused (header cut)");
    assert!(old > 0 && new > 0 && refused > 0);
}
