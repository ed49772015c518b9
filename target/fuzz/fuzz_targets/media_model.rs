//! Drives one logical unit with a sequence of media commands the fuzzer
//! picks, over each kind of backstore (RAM; a file through the page cache
//! or O_DIRECT, with or without the atomic-write journal; files striped
//! RAID0), and checks every answer against a model of the medium: one
//! `Vec<u8>` holding what each byte of the unit must read as.
//!
//! The commands are the ones that change or compare blocks (SBC-4): WRITE
//! in every CDB size, with FUA; WRITE SAME with and without UNMAP and
//! NDOB; UNMAP with several descriptors; COMPARE AND WRITE that matches or
//! not; ORWRITE; WRITE AND VERIFY; VERIFY with BYTCHK 0, 1 and 3; WRITE
//! ATOMIC; SYNCHRONIZE CACHE; GET LBA STATUS; EXTENDED COPY of block
//! segments within the unit; POPULATE TOKEN and WRITE USING TOKEN within
//! the unit, and the block device zero token; SANITIZE (OVERWRITE and BLOCK ERASE); FORMAT
//! UNIT (deallocating a thin unit, keeping a fully provisioned one's data); the
//! write cache turned on and off by MODE SELECT; and,
//! beside the commands, a resize of the unit and, for files, closing the
//! store and opening it again. Half the units are formatted with T10
//! protection information (Type 1, tuples in memory, kept across a
//! reopen as a tuples file would be). READs and WRITEs go through each road the
//! fabric takes: the core's own command path, the planned READ the fabric
//! reads itself (also through the I/O engine, chunk by chunk, as
//! synchronized sends do), the planned WRITE it writes itself, and the
//! in-memory answers of the connection task.
//!
//! Checked after every step:
//! - a READ, by any road, returns exactly the model's bytes;
//! - a command answers GOOD or CHECK CONDITION (never another status: one
//!   initiator, no reservations);
//! - a command whose range runs past the capacity is refused with ILLEGAL
//!   REQUEST (EXTENDED COPY: aborted with COPY ABORTED, the segments before
//!   that one done), and a READ, WRITE, ORWRITE, VERIFY or WRITE AND VERIFY
//!   within it is not refused;
//! - a miscompare (COMPARE AND WRITE, VERIFY) happens exactly when the
//!   model says the bytes differ, reports the offset of the first differing
//!   byte in INFORMATION, and writes nothing;
//! - GET LBA STATUS describes consecutive ranges from the LBA asked for,
//!   and every block it calls deallocated or anchored reads as zeros;
//! - the whole medium, read from the backstore directly, equals the model:
//!   a refused command changed nothing, a command changed no block outside
//!   its range, and (after a reopen) what a file holds is what was written;
//! - on a protected unit, every block's stored tuple is the one generated
//!   for the model's block at its LBA, or FFh throughout (unwritten,
//!   unmapped, sanitized): no command leaves a tuple that would fail a
//!   later READ, and none fails a READ (the READ checks above see GOOD).
//!
//! Run with the flags in `media_model.flags`: `-len_control=0` (whole
//! sequences from the first input) and `-detect_leaks=0`, because a
//! SANITIZE's worker thread may still be exiting when its command has
//! answered, and LeakSanitizer then reports the C library's per-thread
//! destructor list as leaked.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::Arc;

#[path = "../common/lun_files.rs"]
mod lun_files;

use blockwire_pdu::pdu::codes::TaskAttr;
use blockwire_pdu::scsi::{
    Asc, Cdb, CdbSize, ModePage, ModeParameters, PageControl, PiTuple, Rw, Sense, SenseKey,
    UnmapDescriptor,
    UnmapList, Vpd, VpdPage,
};
use blockwire_target::backstore::{Backstore, FileBackstore, RamBackstore, StripedBackstore};
use blockwire_target::datapath::{Engine, ReadCommand, ReadConfig, SendOrder};
use blockwire_target::scsi::read_plan::{PlannedRead, ReadPlan};
use blockwire_target::scsi::token_copy::{
    block_zero_token, encode_populate_token, encode_write_using_token, BlockRange,
    PopulateTokenParams, WriteUsingTokenParams, TOKEN_LEN,
};
use blockwire_target::scsi::write_plan::WritePlan;
use blockwire_target::scsi::{ItNexus, LogicalUnit, LuConfig, LunTable, ScsiRequest, ScsiResult};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

const GOOD: u8 = 0;
const CHECK_CONDITION: u8 = 2;
/// The largest transfer a step asks for, in blocks.
const MAX_STEP_BLOCKS: u64 = 64;
const SCRATCH_PREFIX: &str = "blockwire-fuzz-media-";

#[derive(Arbitrary, Debug)]
struct Input {
    store: StoreKind,
    four_k_blocks: bool,
    size: u8,
    thin: bool,
    protected: bool,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq)]
enum StoreKind {
    Ram,
    File {
        direct: bool,
        journal: bool,
    },
    Striped {
        direct: bool,
        members: u8,
        stripe: u8,
    },
}

/// Where a step works: an LBA and a length, usually within the capacity;
/// `past_end` pushes it over the end now and then.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Place {
    lba: u16,
    blocks: u8,
    past_end: u8,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum ReadRoad {
    Core,
    Planned,
    FromMemory,
    /// The planned READ read by the I/O engine in chunks of 4, 8 or 64 KiB
    /// (synchronized sends), or all first (serial).
    Engine {
        chunk: u8,
        serial: bool,
    },
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum WriteRoad {
    Core,
    Planned,
    WithoutWaiting,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Size {
    Six,
    Ten,
    Twelve,
    Sixteen,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Write {
        size: Size,
        at: Place,
        fua: bool,
        seed: u8,
        road: WriteRoad,
    },
    Read {
        size: Size,
        at: Place,
        road: ReadRoad,
    },
    WriteSame {
        sixteen: bool,
        at: Place,
        whole: bool,
        unmap: bool,
        ndob: bool,
        seed: u8,
    },
    Unmap {
        places: Vec<Place>,
    },
    CompareAndWrite {
        at: Place,
        differ_at: Option<u16>,
        seed: u8,
    },
    OrWrite {
        at: Place,
        seed: u8,
    },
    WriteAndVerify {
        at: Place,
        bytchk: bool,
        seed: u8,
    },
    Verify {
        at: Place,
        bytchk: u8,
        differ_at: Option<u16>,
    },
    WriteAtomic {
        at: Place,
        boundary: u8,
        seed: u8,
    },
    SynchronizeCache {
        at: Place,
    },
    GetLbaStatus {
        lba: u16,
    },
    /// EXTENDED COPY (LID1) of block-to-block segments within the unit.
    ExtendedCopy {
        segments: Vec<(Place, Place)>,
    },
    /// POPULATE TOKEN of `sources`, then WRITE USING TOKEN of it to
    /// `dests` from `offset` blocks in (the token is made and used on the
    /// unit itself); with `zero`, the block device zero token instead.
    TokenCopy {
        sources: Vec<Place>,
        offset: u8,
        dests: Vec<Place>,
        zero: bool,
        delete: bool,
    },
    Sanitize {
        erase: bool,
        invert: bool,
        count: u8,
        pattern: Vec<u8>,
    },
    /// FORMAT UNIT asking for the unit's own protection, or (`other`)
    /// for the one it has not.
    Format {
        other: bool,
    },
    WriteCache(bool),
    Resize {
        blocks: u16,
    },
    Reopen,
    /// READ(16) with RDPROTECT `protect` (1-7): on a protected unit each
    /// block comes followed by its tuple (6 and 7 are reserved); elsewhere
    /// it is refused.
    ReadWithTuples {
        at: Place,
        protect: u8,
    },
    /// WRITE(10) with WRPROTECT `protect` (1-5), each block followed by
    /// its generated tuple; `spoil` damages the guard or reference tag of
    /// one block in a way the field checks, so nothing may be written.
    WriteWithTuples {
        at: Place,
        protect: u8,
        seed: u8,
        spoil: Option<(u8, bool)>,
    },
}

/// The scratch directory for this process's LUN files.
fn scratch(direct: bool) -> &'static Path {
    lun_files::scratch(SCRATCH_PREFIX, direct)
}

/// Bytes a step writes: a pattern from `seed` that differs block to block,
/// or zeros for seed 0 (a zero block is what deallocation reads as).
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    if seed == 0 {
        return vec![0; len];
    }
    (0..len)
        .map(|i| (usize::from(seed).wrapping_mul(31) ^ i.wrapping_mul(7) ^ (i >> 9)) as u8)
        .collect()
}

struct Rig {
    kind: StoreKind,
    paths: Vec<PathBuf>,
    stripe: u64,
    journal: Option<PathBuf>,
    bs: u64,
    thin: bool,
    /// The tuples of a protected unit (8 bytes per block, inverted).
    pi: Option<Arc<dyn Backstore>>,
    table: LunTable,
    lu: Arc<LogicalUnit>,
    model: Vec<u8>,
    /// The medium as last read back, kept to spare a fresh allocation
    /// (and its page faults) per check.
    readback: std::cell::RefCell<Vec<u8>>,
    nexus: ItNexus,
    tag: u32,
    step: usize,
}

impl Rig {
    fn new(input: &Input) -> Option<Rig> {
        let bs: u64 = if input.four_k_blocks { 4096 } else { 512 };
        let direct = matches!(
            input.store,
            StoreKind::File { direct: true, .. } | StoreKind::Striped { direct: true, .. }
        );
        // Sizes that span one RAM chunk or more than one (1 MiB), and
        // whole 4 KiB units for O_DIRECT.
        let sizes: [u64; 4] = [64 << 10, 200 << 10, 1 << 20, (2 << 20) + (12 << 10)];
        let size = sizes[usize::from(input.size) % sizes.len()];
        let dir = scratch(direct);
        let (paths, stripe, journal) = match input.store {
            StoreKind::Ram => (vec![], 0, None),
            StoreKind::File { journal, .. } => {
                let p = dir.join("lun.img");
                let j = journal.then(|| FileBackstore::default_journal_path(&p));
                (vec![p], 0, j)
            }
            StoreKind::Striped {
                members, stripe, ..
            } => {
                let n = 2 + usize::from(members % 3);
                let paths = (0..n).map(|i| dir.join(format!("member{i}.img"))).collect();
                let stripe = [512u64, 4096, 8192, 65536][usize::from(stripe) % 4];
                if direct && stripe < 4096 {
                    return None;
                }
                (paths, stripe, None)
            }
        };
        for p in paths.iter().chain(journal.iter()) {
            let _ = std::fs::remove_file(p);
        }
        let mut rig = Rig {
            kind: input.store,
            paths,
            stripe,
            journal,
            bs,
            thin: input.thin,
            pi: input
                .protected
                .then(|| Arc::new(RamBackstore::new(size / bs * 8)) as Arc<dyn Backstore>),
            table: LunTable::new(vec![]),
            lu: Arc::new(LogicalUnit::new(LuConfig::new(Arc::new(
                RamBackstore::new(bs),
            )))),
            model: vec![],
            readback: Default::default(),
            nexus: ItNexus::iscsi(
                "iqn.2026-11.io.blockwire:fuzzer",
                [0x40, 0, 0, 0, 0, 1],
                "iqn.2026-11.io.blockwire:media",
                1,
            ),
            tag: 0,
            step: 0,
        };
        let store = rig.open_store(Some(size));
        rig.model = vec![0; store.size() as usize];
        rig.mount(store);
        Some(rig)
    }

    fn open_store(&self, size: Option<u64>) -> Arc<dyn Backstore> {
        match self.kind {
            StoreKind::Ram => Arc::new(RamBackstore::new(size.expect("a RAM store is made once"))),
            StoreKind::File { direct, .. } => {
                let mode = lun_files::file_mode(direct);
                let f = FileBackstore::open_with(&self.paths[0], size, false, mode)
                    .expect("file store");
                match &self.journal {
                    Some(j) => {
                        let (f, replayed) = f.with_atomic_journal(j).expect("journal");
                        assert_eq!(
                            replayed, 0,
                            "a cleanly closed journal held {replayed} unfinished writes"
                        );
                        Arc::new(f)
                    }
                    None => Arc::new(f),
                }
            }
            StoreKind::Striped { direct, .. } => {
                let mode = lun_files::file_mode(direct);
                Arc::new(
                    StripedBackstore::open(&self.paths, self.stripe, size, false, mode)
                        .expect("striped store"),
                )
            }
        }
    }

    fn mount(&mut self, store: Arc<dyn Backstore>) {
        let mut cfg = LuConfig::new(store);
        cfg.block_size = self.bs as u32;
        cfg.thin_provisioning = self.thin;
        cfg.pi_store = self.pi.clone();
        self.lu = Arc::new(LogicalUnit::new(cfg));
        self.table = LunTable::new(vec![(0, self.lu.clone())]);
    }

    fn blocks(&self) -> u64 {
        self.model.len() as u64 / self.bs
    }

    /// An LBA and block count from `p`: within the capacity unless
    /// `past_end` says to run over it. The bool: the range fits.
    fn place(&self, p: Place, max_blocks: u64) -> (u64, u64, bool) {
        let cap = self.blocks();
        let blocks = 1 + u64::from(p.blocks) % max_blocks.max(1);
        if p.past_end % 16 == 1 {
            // Over the end: the last block and beyond, or far past it.
            let lba = if p.past_end & 0x80 != 0 {
                cap + u64::from(p.lba)
            } else {
                cap.saturating_sub(1)
            };
            return (lba, blocks.max(2), false);
        }
        // Three steps in four work in the first 128 blocks, so that they
        // meet; the rest anywhere (RAM chunk and stripe boundaries).
        let lba = if p.past_end & 0x60 == 0 {
            u64::from(p.lba) % cap
        } else {
            u64::from(p.lba) % cap.min(128)
        };
        let blocks = blocks.min(cap - lba);
        (lba, blocks, true)
    }

    fn bytes(&self, lba: u64, blocks: u64) -> std::ops::Range<usize> {
        (lba * self.bs) as usize..((lba + blocks) * self.bs) as usize
    }

    fn request<'a>(&'a self, cdb: &'a [u8], out: &'a [u8], cap: u32) -> ScsiRequest<'a> {
        ScsiRequest {
            lun: 0,
            cdb,
            nexus: &self.nexus,
            task_tag: self.tag,
            attr: TaskAttr::Simple,
            data_out: out,
            data_in_capacity: cap,
            initiator_stats: None,
        }
    }

    /// Runs a command by `road`, again after each unit attention (as an
    /// initiator does: power on, capacity and mode changes report one).
    fn run_by(
        &mut self,
        cdb: &[u8],
        out: &[u8],
        cap: u32,
        road: impl Fn(&Rig, &ScsiRequest) -> ScsiResult,
    ) -> ScsiResult {
        for _ in 0..8 {
            self.tag = self.tag.wrapping_add(1);
            let r = road(self, &self.request(cdb, out, cap));
            if r.status == CHECK_CONDITION && sense(&r).key == SenseKey::UnitAttention {
                self.check_medium("a unit attention");
                continue;
            }
            assert!(
                r.status == GOOD || r.status == CHECK_CONDITION,
                "step {}: status {:#x} for {:?}",
                self.step,
                r.status,
                Cdb::decode(cdb)
            );
            assert_eq!(
                r.status == GOOD,
                r.sense.is_none(),
                "step {}: {r:?}",
                self.step
            );
            return r;
        }
        panic!("step {}: unit attentions never end", self.step);
    }

    fn run(&mut self, cdb: &[u8], out: &[u8], cap: u32) -> ScsiResult {
        self.run_by(cdb, out, cap, |rig, req| rig.table.execute(req))
    }

    /// The whole medium, read from the backstore itself, must be the model.
    fn check_medium(&self, after: &str) {
        let store = &self.lu.config().backstore;
        assert_eq!(
            store.size(),
            self.model.len() as u64,
            "step {}: capacity after {after}",
            self.step
        );
        let mut buf = self.readback.borrow_mut();
        buf.resize(self.model.len(), 0);
        store.read_at(0, &mut buf).expect("backstore read");
        self.check_tuples(after);
        // Slice equality is one memcmp, outside the coverage instrumentation
        // a byte loop would pay for on every byte.
        if *buf == self.model {
            return;
        }
        if let Some(i) = buf.iter().zip(&self.model).position(|(a, b)| a != b) {
            panic!(
                "step {}: after {after}, byte {i} (block {}) holds {:#04x}, the model {:#04x}",
                self.step,
                i as u64 / self.bs,
                buf[i],
                self.model[i]
            );
        }
    }

    /// Every stored tuple of a protected unit: the model's block's, or
    /// FFh throughout.
    fn check_tuples(&self, after: &str) {
        let Some(pi) = &self.pi else {
            return;
        };
        assert_eq!(pi.size(), self.blocks() * 8, "step {}: tuples' size after {after}", self.step);
        let mut stored = vec![0u8; pi.size() as usize];
        pi.read_at(0, &mut stored).expect("tuples read");
        for (lba, (t, block)) in stored
            .chunks(8)
            .zip(self.model.chunks(self.bs as usize))
            .enumerate()
        {
            let wire: [u8; 8] = std::array::from_fn(|i| !t[i]);
            let tuple = PiTuple::decode(&wire);
            let generated = PiTuple::generate(block, lba as u64);
            assert!(
                tuple == generated || tuple == PiTuple::UNWRITTEN,
                "step {}: after {after}, block {lba}'s tuple is {tuple:?}, generated from the model {generated:?}",
                self.step
            );
        }
    }

    /// A command whose range runs past the end must be refused as an
    /// illegal request.
    fn expect_refused_past_end(&self, r: &ScsiResult, what: &str) {
        assert_eq!(
            r.status, CHECK_CONDITION,
            "step {}: {what} past the end answered GOOD",
            self.step
        );
        let s = sense(r);
        assert_eq!(
            s.key,
            SenseKey::IllegalRequest,
            "step {}: {what} past the end: {s:?}",
            self.step
        );
    }

    fn expect_good(&self, r: &ScsiResult, what: &str) {
        assert_eq!(
            r.status,
            GOOD,
            "step {}: {what} refused: {:?}",
            self.step,
            r.sense.as_deref().map(Sense::decode)
        );
    }

    /// GOOD, or refused as an illegal request (a limit or a feature this
    /// unit does not offer). True: GOOD.
    fn good_or_illegal(&self, r: &ScsiResult, what: &str) -> bool {
        if r.status == GOOD {
            return true;
        }
        let s = sense(r);
        assert_eq!(
            s.key,
            SenseKey::IllegalRequest,
            "step {}: {what}: {s:?}",
            self.step
        );
        false
    }

    /// A command that must work within the capacity and be refused past
    /// it. True: it took effect.
    fn required(&self, r: &ScsiResult, fits: bool, what: &str) -> bool {
        if fits {
            self.expect_good(r, what);
        } else {
            self.expect_refused_past_end(r, what);
        }
        fits
    }

    /// A command that may be refused as an illegal request within the
    /// capacity (a limit, a feature the unit lacks) and must be past it.
    /// True: it took effect.
    fn allowed(&self, r: &ScsiResult, fits: bool, what: &str) -> bool {
        if !fits {
            self.expect_refused_past_end(r, what);
            return false;
        }
        self.good_or_illegal(r, what)
    }

    fn step(&mut self, op: &Op) {
        self.step += 1;
        match *op {
            Op::Write {
                size,
                at,
                fua,
                seed,
                road,
            } => self.write(size, at, fua, seed, road),
            Op::Read { size, at, road } => self.read(size, at, road),
            Op::WriteSame {
                sixteen,
                at,
                whole,
                unmap,
                ndob,
                seed,
            } => self.write_same(sixteen, at, whole, unmap, ndob, seed),
            Op::Unmap { ref places } => self.unmap(places),
            Op::CompareAndWrite {
                at,
                differ_at,
                seed,
            } => self.compare_and_write(at, differ_at, seed),
            Op::OrWrite { at, seed } => {
                let (lba, blocks, fits) = self.place(at, MAX_STEP_BLOCKS);
                let data = pattern(seed, (blocks * self.bs) as usize);
                let cdb = Cdb::OrWrite16(rw(CdbSize::Sixteen, lba, blocks as u32, false)).encode();
                let r = self.run(&cdb, &data, 0);
                if self.required(&r, fits, "ORWRITE") {
                    let range = self.bytes(lba, blocks);
                    for (m, d) in self.model[range].iter_mut().zip(&data) {
                        *m |= d;
                    }
                }
            }
            Op::WriteAndVerify { at, bytchk, seed } => {
                let (lba, blocks, fits) = self.place(at, MAX_STEP_BLOCKS);
                let data = pattern(seed, (blocks * self.bs) as usize);
                let cdb = Cdb::WriteAndVerify {
                    rw: rw(CdbSize::Sixteen, lba, blocks as u32, false),
                    bytchk: u8::from(bytchk),
                }
                .encode();
                let r = self.run(&cdb, &data, 0);
                if self.required(&r, fits, "WRITE AND VERIFY") {
                    let range = self.bytes(lba, blocks);
                    self.model[range].copy_from_slice(&data);
                }
            }
            Op::Verify {
                at,
                bytchk,
                differ_at,
            } => self.verify(at, bytchk, differ_at),
            Op::WriteAtomic { at, boundary, seed } => {
                let (lba, blocks, fits) = self.place(at, MAX_STEP_BLOCKS);
                let data = pattern(seed, (blocks * self.bs) as usize);
                let cdb = Cdb::WriteAtomic16 {
                    lba,
                    boundary: u16::from(boundary % 4),
                    blocks: blocks as u16,
                    wrprotect: 0,
                    dpo: false,
                    fua: boundary & 0x80 != 0,
                    group: 0,
                }
                .encode();
                let r = self.run(&cdb, &data, 0);
                if self.allowed(&r, fits, "WRITE ATOMIC") {
                    let range = self.bytes(lba, blocks);
                    self.model[range].copy_from_slice(&data);
                }
            }
            Op::SynchronizeCache { at } => {
                let (lba, blocks, fits) = self.place(at, u64::MAX);
                let cdb = Cdb::SynchronizeCache {
                    size: CdbSize::Sixteen,
                    immed: false,
                    lba,
                    blocks: blocks as u32,
                    group: 0,
                }
                .encode();
                let r = self.run(&cdb, &[], 0);
                self.required(&r, fits, "SYNCHRONIZE CACHE");
            }
            Op::GetLbaStatus { lba } => self.get_lba_status(lba),
            Op::ExtendedCopy { ref segments } => self.extended_copy(segments),
            Op::TokenCopy {
                ref sources,
                offset,
                ref dests,
                zero,
                delete,
            } => self.token_copy(sources, offset, dests, zero, delete),
            Op::Sanitize {
                erase,
                invert,
                count,
                ref pattern,
            } => self.sanitize(erase, invert, count, pattern),
            Op::Format { other } => self.format(other),
            Op::WriteCache(on) => self.write_cache(on),
            Op::ReadWithTuples { at, protect } => self.read_with_tuples(at, protect),
            Op::WriteWithTuples {
                at,
                protect,
                seed,
                spoil,
            } => self.write_with_tuples(at, protect, seed, spoil),
            Op::Resize { blocks } => {
                // Up to 5 MiB, whole 4 KiB units for O_DIRECT.
                let unit = if matches!(self.kind, StoreKind::File { direct: true, .. }) {
                    4096
                } else {
                    self.bs
                };
                let new = (1 + u64::from(blocks) * 512 % (5 << 20)).div_ceil(unit) * unit;
                if self.lu.resize(new).is_ok() {
                    self.model.resize(new as usize, 0);
                }
            }
            Op::Reopen => {
                if self.kind == StoreKind::Ram {
                    return;
                }
                self.table = LunTable::new(vec![]);
                self.mount(Arc::new(RamBackstore::new(self.bs)));
                // A file's length is its capacity; members striped over may
                // hold more than whole stripes of the LUN, so its
                // configuration names the size again.
                let size = matches!(self.kind, StoreKind::Striped { .. })
                    .then_some(self.model.len() as u64);
                let store = self.open_store(size);
                self.mount(store);
            }
        }
        self.check_medium(&format!("{op:?}"));
    }

    /// The tuple generated from the model's block `lba` (a block may
    /// instead hold FFh: never written, unmapped, sanitized).
    fn model_tuple(&self, lba: u64) -> PiTuple {
        PiTuple::generate(&self.model[self.bytes(lba, 1)], lba)
    }

    fn read_with_tuples(&mut self, at: Place, protect: u8) {
        let protect = 1 + protect % 7;
        let (lba, blocks, fits) = self.place(at, MAX_STEP_BLOCKS);
        let cdb = Cdb::Read {
            rw: Rw {
                protect,
                ..rw(CdbSize::Sixteen, lba, blocks as u32, false)
            },
            rarc: false,
        }
        .encode();
        let unit = self.bs as usize + 8;
        let r = self.run(&cdb, &[], (blocks as usize * unit) as u32);
        if self.pi.is_none() || protect >= 6 {
            let s = sense(&r);
            assert_eq!(
                (r.status, s.key, s.code()),
                (CHECK_CONDITION, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB),
                "step {}: RDPROTECT {protect} (protected: {})",
                self.step,
                self.pi.is_some()
            );
            return;
        }
        if !fits {
            self.expect_refused_past_end(&r, "READ with RDPROTECT");
            return;
        }
        self.expect_good(&r, "READ with RDPROTECT");
        assert_eq!(r.data_in.len(), blocks as usize * unit, "step {}", self.step);
        for (i, u) in r.data_in.chunks(unit).enumerate() {
            let at = lba + i as u64;
            let (data, tuple) = u.split_at(self.bs as usize);
            assert!(
                data == &self.model[self.bytes(at, 1)],
                "step {}: READ with RDPROTECT {protect}: block {at} differs from the model",
                self.step
            );
            let tuple = PiTuple::decode(tuple.try_into().expect("8 bytes"));
            assert!(
                tuple == self.model_tuple(at) || tuple == PiTuple::UNWRITTEN,
                "step {}: READ with RDPROTECT {protect}: block {at}'s tuple {tuple:?}",
                self.step
            );
        }
    }

    fn write_with_tuples(&mut self, at: Place, protect: u8, seed: u8, spoil: Option<(u8, bool)>) {
        let protect = 1 + protect % 5;
        let (lba, blocks, fits) = self.place(at, MAX_STEP_BLOCKS);
        let data = pattern(seed, (blocks * self.bs) as usize);
        let mut tuples: Vec<PiTuple> = data
            .chunks(self.bs as usize)
            .enumerate()
            .map(|(i, b)| PiTuple::generate(b, lba + i as u64))
            .collect();
        // Damage only what this WRPROTECT checks: 010b skips the guard,
        // 011b everything, 100b the reference tag.
        let checks_guard = matches!(protect, 1 | 4 | 5);
        let checks_ref = matches!(protect, 1 | 2 | 5);
        let spoilt = spoil.and_then(|(which, guard)| {
            let i = usize::from(which) % tuples.len();
            if guard && checks_guard {
                tuples[i].guard ^= 0x0101;
                Some((i, Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED))
            } else if !guard && checks_ref {
                tuples[i].ref_tag ^= 0x40;
                Some((i, Asc::LOGICAL_BLOCK_REFERENCE_TAG_CHECK_FAILED))
            } else {
                None
            }
        });
        let wire: Vec<u8> = data
            .chunks(self.bs as usize)
            .zip(&tuples)
            .flat_map(|(b, t)| b.iter().copied().chain(t.encode()))
            .collect();
        let cdb = Cdb::Write(Rw {
            protect,
            ..rw(CdbSize::Ten, lba, blocks as u32, false)
        })
        .encode();
        let r = self.run(&cdb, &wire, 0);
        if self.pi.is_none() {
            let s = sense(&r);
            assert_eq!(
                (s.key, s.code()),
                (SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB),
                "step {}: WRPROTECT on an unprotected unit",
                self.step
            );
            return;
        }
        if !fits {
            self.expect_refused_past_end(&r, "WRITE with WRPROTECT");
            return;
        }
        if let Some((i, asc)) = spoilt {
            let s = sense(&r);
            assert_eq!(
                (r.status, s.key, s.code(), s.information),
                (CHECK_CONDITION, SenseKey::AbortedCommand, asc, Some(lba + i as u64)),
                "step {}: WRPROTECT {protect} with block {i}'s tuple damaged",
                self.step
            );
            return;
        }
        self.expect_good(&r, "WRITE with WRPROTECT");
        let range = self.bytes(lba, blocks);
        self.model[range].copy_from_slice(&data);
    }

    fn write(&mut self, size: Size, at: Place, fua: bool, seed: u8, road: WriteRoad) {
        let (size, max) = cdb_size(size);
        let (lba, blocks, fits) = self.place(at, MAX_STEP_BLOCKS.min(max));
        let data = pattern(seed, (blocks * self.bs) as usize);
        let cdb = Cdb::Write(rw(size, lba, blocks as u32, fua)).encode();
        let r = match road {
            WriteRoad::Core => self.run(&cdb, &data, 0),
            WriteRoad::Planned => self.run_by(&cdb, &data, 0, |rig, req| {
                match rig.table.plan_write(req, req.data_out.len() as u64, false) {
                    WritePlan::Write(p) => {
                        let store = &p.lu.config().backstore;
                        let done = if p.write_through {
                            store.write_at_durable(p.offset, req.data_out)
                        } else {
                            store.write_at(p.offset, req.data_out)
                        };
                        match done {
                            Ok(()) => p.lu.write_done(p.len),
                            Err(e) => p.lu.write_failure(p.lba, p.len, &e),
                        }
                    }
                    WritePlan::Answer(r) => r,
                    WritePlan::NotPlanned => rig.table.execute(req),
                }
            }),
            WriteRoad::WithoutWaiting => self.run_by(&cdb, &data, 0, |rig, req| {
                rig.table
                    .write_without_waiting(req, 1 << 20)
                    .unwrap_or_else(|| rig.table.execute(req))
            }),
        };
        if self.required(&r, fits, "WRITE") {
            let range = self.bytes(lba, blocks);
            self.model[range].copy_from_slice(&data);
        }
    }

    fn read(&mut self, size: Size, at: Place, road: ReadRoad) {
        let (size, max) = cdb_size(size);
        let (lba, blocks, fits) = self.place(at, MAX_STEP_BLOCKS.min(max));
        let cdb = Cdb::Read {
            rw: rw(size, lba, blocks as u32, false),
            rarc: false,
        }
        .encode();
        let cap = (blocks * self.bs) as u32;
        let r = match road {
            ReadRoad::Core => self.run(&cdb, &[], cap),
            ReadRoad::Planned => {
                self.run_by(&cdb, &[], cap, |rig, req| match rig.table.plan_read(req) {
                    ReadPlan::Read(p) => {
                        let mut buf = vec![0u8; p.len as usize];
                        match p.lu.config().backstore.read_at(p.offset, &mut buf) {
                            Ok(()) => ScsiResult {
                                status: GOOD,
                                sense: None,
                                data_in: buf,
                                transfer_length: p.len as u32,
                            },
                            Err(e) => p.lu.read_failure(p.lba, p.len, &e),
                        }
                    }
                    // A protected unit's blocks are read and checked by the
                    // core: on the connection's task when in memory.
                    ReadPlan::Checked(p) => p
                        .lu
                        .read_checked_without_waiting(&p, cap)
                        .unwrap_or_else(|| p.lu.read_checked(&p, cap)),
                    ReadPlan::Answer(r) => r,
                    ReadPlan::NotPlanned | ReadPlan::WouldWait => rig.table.execute(req),
                })
            }
            ReadRoad::Engine { chunk, serial } => {
                self.run_by(&cdb, &[], cap, |rig, req| match rig.table.plan_read(req) {
                    ReadPlan::Read(p) => engine_read(&p, chunk, serial).unwrap_or_else(|| {
                        // What the engine cannot read (RAM, an unaligned
                        // O_DIRECT range) the fabric has the core answer.
                        drop(p);
                        rig.table.execute(req)
                    }),
                    ReadPlan::Checked(p) => p.lu.read_checked(&p, cap),
                    ReadPlan::Answer(r) => r,
                    ReadPlan::NotPlanned | ReadPlan::WouldWait => rig.table.execute(req),
                })
            }
            ReadRoad::FromMemory => self.run_by(&cdb, &[], cap, |rig, req| {
                rig.table
                    .execute_from_memory(req, 1 << 20)
                    .unwrap_or_else(|| rig.table.execute(req))
            }),
        };
        if !fits {
            self.expect_refused_past_end(&r, "READ");
            return;
        }
        self.expect_good(&r, "READ");
        let range = self.bytes(lba, blocks);
        if r.data_in[..] == self.model[range.clone()] {
            return;
        }
        if let Some(i) = r
            .data_in
            .iter()
            .zip(&self.model[range.clone()])
            .position(|(a, b)| a != b)
        {
            panic!("step {}: READ of {blocks} blocks at {lba} ({road:?}): byte {i} is {:#04x}, the model has {:#04x}", self.step, r.data_in[i], self.model[range.start + i]);
        }
        assert_eq!(
            r.data_in.len(),
            range.len(),
            "step {}: READ returned {} bytes",
            self.step,
            r.data_in.len()
        );
    }

    fn write_same(
        &mut self,
        sixteen: bool,
        at: Place,
        whole: bool,
        unmap: bool,
        ndob: bool,
        seed: u8,
    ) {
        let (lba, mut blocks, fits) = self.place(at, self.blocks());
        let ndob = ndob && sixteen;
        // NUMBER OF LOGICAL BLOCKS 0 asks for every block to the end (WSNZ=0).
        let to_end = whole && fits;
        if to_end {
            blocks = self.blocks() - lba;
        }
        let block = if ndob {
            vec![]
        } else {
            pattern(seed, self.bs as usize)
        };
        let cdb = Cdb::WriteSame {
            size: if sixteen {
                CdbSize::Sixteen
            } else {
                CdbSize::Ten
            },
            lba,
            blocks: if to_end { 0 } else { blocks as u32 },
            wrprotect: 0,
            anchor: false,
            unmap,
            ndob,
            group: 0,
        }
        .encode();
        let r = self.run(&cdb, &block, 0);
        if self.allowed(&r, fits, "WRITE SAME") {
            // With UNMAP each LBA is unmapped, whatever block was sent
            // (SBC-4 lets the device server write or unmap), and reads as
            // zeros (LBPRZ=1): what blockwire does, and what libiscsi's
            // WriteSame10.UnmapUntilEnd expects.
            let fill = if ndob || unmap {
                vec![0; self.bs as usize]
            } else {
                block
            };
            let range = self.bytes(lba, blocks);
            for b in self.model[range].chunks_mut(self.bs as usize) {
                b.copy_from_slice(&fill);
            }
        }
    }

    fn unmap(&mut self, places: &[Place]) {
        let ranges: Vec<(u64, u64, bool)> = places
            .iter()
            .take(6)
            .map(|&p| self.place(p, self.blocks()))
            .collect();
        let list = UnmapList {
            descriptors: ranges
                .iter()
                .map(|&(lba, blocks, _)| UnmapDescriptor {
                    lba,
                    blocks: blocks as u32,
                })
                .collect(),
        }
        .encode();
        let cdb = Cdb::Unmap {
            anchor: false,
            group: 0,
            parameter_list_length: list.len() as u16,
        }
        .encode();
        let r = self.run(&cdb, &list, 0);
        // One descriptor past the end refuses the whole list: none is
        // carried out.
        if self.allowed(&r, ranges.iter().all(|r| r.2), "UNMAP") {
            assert!(
                self.thin,
                "step {}: UNMAP on a unit without thin provisioning",
                self.step
            );
            for &(lba, blocks, _) in &ranges {
                let range = self.bytes(lba, blocks);
                self.model[range].fill(0);
            }
        }
    }

    fn compare_and_write(&mut self, at: Place, differ_at: Option<u16>, seed: u8) {
        let (lba, blocks, fits) = self.place(at, 8);
        let len = (blocks * self.bs) as usize;
        let mut data = if fits {
            self.model[self.bytes(lba, blocks)].to_vec()
        } else {
            vec![0; len]
        };
        let differ = differ_at.map(|d| usize::from(d) % len);
        if let Some(i) = differ {
            data[i] ^= 0x5a;
        }
        let new = pattern(seed, len);
        data.extend_from_slice(&new);
        let cdb = Cdb::CompareAndWrite {
            lba,
            blocks: blocks as u8,
            wrprotect: 0,
            dpo: false,
            fua: false,
            group: 0,
        }
        .encode();
        let r = self.run(&cdb, &data, 0);
        if !fits {
            self.expect_refused_past_end(&r, "COMPARE AND WRITE");
            return;
        }
        match differ {
            Some(i) => self.expect_miscompare(&r, i, "COMPARE AND WRITE"),
            None => {
                if self.good_or_illegal(&r, "COMPARE AND WRITE") {
                    let range = self.bytes(lba, blocks);
                    self.model[range].copy_from_slice(&new);
                }
            }
        }
    }

    fn verify(&mut self, at: Place, bytchk: u8, differ_at: Option<u16>) {
        let (lba, blocks, fits) = self.place(at, MAX_STEP_BLOCKS);
        let bytchk = [0u8, 1, 3][usize::from(bytchk) % 3];
        let range = if fits {
            self.bytes(lba, blocks)
        } else {
            0..(blocks * self.bs) as usize
        };
        let mut data = match bytchk {
            0 => vec![],
            1 if fits => self.model[range.clone()].to_vec(),
            3 if fits => self.model[range.start..range.start + self.bs as usize].to_vec(),
            _ => vec![
                0;
                if bytchk == 1 {
                    range.len()
                } else {
                    self.bs as usize
                }
            ],
        };
        let differ = differ_at
            .filter(|_| !data.is_empty())
            .map(|d| usize::from(d) % data.len());
        if let Some(i) = differ {
            data[i] ^= 0xa5;
        }
        let cdb = Cdb::Verify {
            rw: rw(CdbSize::Sixteen, lba, blocks as u32, false),
            bytchk,
        }
        .encode();
        let r = self.run(&cdb, &data, 0);
        if !fits {
            self.expect_refused_past_end(&r, "VERIFY");
            return;
        }
        // BYTCHK 3 compares one block against each: it miscompares where
        // any block differs from the one sent.
        let first_difference = match bytchk {
            0 => None,
            1 => data
                .iter()
                .zip(&self.model[range.clone()])
                .position(|(a, b)| a != b),
            _ => self.model[range.clone()]
                .chunks(self.bs as usize)
                .find_map(|b| b.iter().zip(&data).position(|(a, b)| a != b)),
        };
        match first_difference {
            Some(i) if bytchk == 1 => self.expect_miscompare(&r, i, "VERIFY"),
            Some(_) => {
                assert_eq!(
                    r.status, CHECK_CONDITION,
                    "step {}: VERIFY BYTCHK 3 missed a difference",
                    self.step
                );
                assert_eq!(
                    sense(&r).key,
                    SenseKey::Miscompare,
                    "step {}: {:?}",
                    self.step,
                    sense(&r)
                );
            }
            None => self.expect_good(&r, "VERIFY"),
        }
    }

    fn expect_miscompare(&self, r: &ScsiResult, offset: usize, what: &str) {
        assert_eq!(
            r.status, CHECK_CONDITION,
            "step {}: {what} missed the difference at byte {offset}",
            self.step
        );
        let s = sense(r);
        assert_eq!(
            (s.key, s.code()),
            (SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY),
            "step {}: {what}: {s:?}",
            self.step
        );
        assert_eq!(
            s.information,
            Some(offset as u64),
            "step {}: {what}: the first difference is at byte {offset}",
            self.step
        );
    }

    /// The unit's NAA designator as a copy source or destination names it
    /// (SPC-4 EXTENDED COPY: an identification descriptor CSCD of 32 bytes).
    fn cscd(&mut self) -> Vec<u8> {
        let cdb = Cdb::Inquiry {
            evpd: true,
            page_code: 0x83,
            allocation_length: 512,
        }
        .encode();
        let r = self.run(&cdb, &[], 512);
        self.expect_good(&r, "INQUIRY of VPD page 83h");
        let VpdPage::DeviceIdentification(ds) = Vpd::decode(&r.data_in).expect("VPD page 83h").page
        else {
            panic!(
                "step {}: VPD page 83h is not the device identification page",
                self.step
            );
        };
        let mut d = vec![0xe4, 0, 0, 0];
        let mut designator = ds[0].encode();
        designator.resize(20, 0);
        d.extend_from_slice(&designator);
        d.extend_from_slice(&[0, 0, 0, 0]);
        d.extend_from_slice(&(self.bs as u32).to_be_bytes());
        d
    }

    /// Segments run in order; the first whose range leaves the unit aborts
    /// the copy with the segments before it done (SPC-4 EXTENDED COPY).
    fn extended_copy(&mut self, segments: &[(Place, Place)]) {
        if segments.is_empty() {
            return;
        }
        let cscd = self.cscd();
        let mut segs = Vec::new();
        let mut list = vec![0u8; 16];
        // LIST ID USAGE 11b: no list identifier, nothing kept for RECEIVE
        // COPY RESULTS.
        list[1] = 0x18;
        list[2..4].copy_from_slice(&32u16.to_be_bytes());
        list.extend_from_slice(&cscd);
        for &(from, to) in segments.iter().take(4) {
            let (slba, blocks, src_fits) = self.place(from, MAX_STEP_BLOCKS);
            // The destination holds the source's block count: it fits or not
            // by where it starts.
            let (dlba, _, _) = self.place(to, 1);
            let dst_fits = dlba + blocks <= self.blocks();
            let mut d = vec![0x02, 0, 0, 0x18, 0, 0, 0, 0, 0, 0];
            d.extend_from_slice(&(blocks as u16).to_be_bytes());
            d.extend_from_slice(&slba.to_be_bytes());
            d.extend_from_slice(&dlba.to_be_bytes());
            list.extend_from_slice(&d);
            segs.push((slba, dlba, blocks, src_fits && dst_fits));
        }
        let seg_len = (list.len() - 16 - 32) as u32;
        list[8..12].copy_from_slice(&seg_len.to_be_bytes());
        let cdb = Cdb::ExtendedCopy {
            service_action: 0,
            parameter_list_length: list.len() as u32,
        }
        .encode();
        let r = self.run(&cdb, &list, 0);
        for &(slba, dlba, blocks, fits) in &segs {
            if !fits {
                assert_eq!(
                    r.status, CHECK_CONDITION,
                    "step {}: EXTENDED COPY past the end answered GOOD",
                    self.step
                );
                assert_eq!(
                    sense(&r).key,
                    SenseKey::CopyAborted,
                    "step {}: {:?}",
                    self.step,
                    sense(&r)
                );
                return;
            }
            // Ranges under one copy chunk (1 MiB) move as if read whole,
            // then written.
            let from = self.model[self.bytes(slba, blocks)].to_vec();
            let to = self.bytes(dlba, blocks);
            self.model[to].copy_from_slice(&from);
        }
        self.expect_good(&r, "EXTENDED COPY");
    }

    /// The ranges `places` name (at most four), and whether they all fit.
    fn token_ranges(&self, places: &[Place]) -> (Vec<BlockRange>, bool) {
        let mut fits = true;
        let ranges = places
            .iter()
            .take(4)
            .map(|&p| {
                let (lba, blocks, ok) = self.place(p, MAX_STEP_BLOCKS);
                fits &= ok;
                BlockRange {
                    lba,
                    blocks: blocks as u32,
                }
            })
            .collect();
        (ranges, fits)
    }

    /// The blocks of `ranges`, in order.
    fn flat(ranges: &[BlockRange]) -> Vec<u64> {
        ranges
            .iter()
            .flat_map(|r| r.lba..r.lba + u64::from(r.blocks))
            .collect()
    }

    /// RECEIVE ROD TOKEN INFORMATION for `list_id`: (COPY OPERATION
    /// STATUS, TRANSFER COUNT, the token if one came back).
    fn receive_token_information(
        &mut self,
        list_id: u32,
    ) -> (u8, u64, Option<Box<[u8; TOKEN_LEN]>>) {
        let cdb = Cdb::ReceiveCopyResults {
            service_action: 0x07,
            list_identifier: list_id,
            allocation_length: 1024,
        }
        .encode();
        let r = self.run(&cdb, &[], 1024);
        self.expect_good(&r, "RECEIVE ROD TOKEN INFORMATION");
        let d = &r.data_in;
        let at = 32 + usize::from(d[13]);
        let count = u64::from_be_bytes(d[16..24].try_into().unwrap());
        let len = u32::from_be_bytes(d[at..at + 4].try_into().unwrap()) as usize;
        let token = (len == TOKEN_LEN + 2).then(|| {
            let mut t = Box::new([0u8; TOKEN_LEN]);
            t.copy_from_slice(&d[at + 6..at + 6 + TOKEN_LEN]);
            t
        });
        (d[5], count, token)
    }

    /// Token copy within the unit. Tokens stand for the data when they are
    /// used (access upon reference), so the model copies at WRITE USING
    /// TOKEN; ranges that overlap each other are refused, and so is a
    /// destination asking for more than the token holds past the offset.
    /// Destinations overlapping the sources are not sent: their outcome
    /// depends on the order the copy moves its pieces in.
    fn token_copy(
        &mut self,
        sources: &[Place],
        offset: u8,
        dests: &[Place],
        zero: bool,
        delete: bool,
    ) {
        let (dst, dst_fit) = self.token_ranges(dests);
        if dst.is_empty() {
            return;
        }
        let overlapping = |rs: &[BlockRange]| {
            let mut b = Self::flat(rs);
            let n = b.len();
            b.sort_unstable();
            b.dedup();
            b.len() != n
        };
        let token = if zero {
            block_zero_token()
        } else {
            let (src, src_fit) = self.token_ranges(sources);
            if src.is_empty() {
                return;
            }
            let s_blocks = Self::flat(&src);
            if Self::flat(&dst).iter().any(|b| s_blocks.contains(b)) {
                return;
            }
            let p = encode_populate_token(&PopulateTokenParams {
                immed: false,
                rod_type: None,
                inactivity_timeout: 0,
                ranges: src.clone(),
            });
            let r = self.run(&token_cdb(0x10, 1, &p), &p, 0);
            if !src_fit || overlapping(&src) {
                self.expect_refused_past_end(&r, "POPULATE TOKEN of bad ranges");
                return;
            }
            self.expect_good(&r, "POPULATE TOKEN");
            let (status, count, token) = self.receive_token_information(1);
            assert_eq!(
                (status, count),
                (1, s_blocks.len() as u64),
                "step {}: POPULATE TOKEN's status",
                self.step
            );
            token.unwrap_or_else(|| panic!("step {}: no ROD token returned", self.step))
        };
        let p = encode_write_using_token(&WriteUsingTokenParams {
            immed: false,
            delete_token: delete,
            offset: u64::from(offset % 8),
            token: token.clone(),
            ranges: dst.clone(),
        });
        let cdb = token_cdb(0x11, 2, &p);
        let r = self.run(&cdb, &p, 0);
        let d_blocks = Self::flat(&dst);
        let source: Option<Vec<u64>> = if zero {
            None
        } else {
            let src = self.token_ranges(sources).0;
            Some(
                Self::flat(&src)
                    .into_iter()
                    .skip(usize::from(offset % 8))
                    .collect(),
            )
        };
        let too_long = source
            .as_ref()
            .is_some_and(|s| s.is_empty() || s.len() < d_blocks.len());
        if !dst_fit || overlapping(&dst) || too_long {
            self.expect_refused_past_end(&r, "WRITE USING TOKEN of bad ranges");
            let (status, _, _) = self.receive_token_information(2);
            assert_eq!(
                status, 2,
                "step {}: a refused WRITE USING TOKEN's status",
                self.step
            );
            return;
        }
        self.expect_good(&r, "WRITE USING TOKEN");
        let bs = self.bs as usize;
        for (i, &to) in d_blocks.iter().enumerate() {
            let block = match &source {
                Some(s) => self.model[self.bytes(s[i], 1)].to_vec(),
                None => vec![0u8; bs],
            };
            let at = self.bytes(to, 1);
            self.model[at].copy_from_slice(&block);
        }
        let (status, count, _) = self.receive_token_information(2);
        assert_eq!(
            (status, count),
            (1, d_blocks.len() as u64),
            "step {}: WRITE USING TOKEN's status",
            self.step
        );
        if delete && !zero {
            // DEL_TKN: the token is gone.
            let r = self.run(&cdb, &p, 0);
            assert_eq!(
                sense(&r).code(),
                Asc::TOKEN_UNKNOWN,
                "step {}: a deleted token was used",
                self.step
            );
        }
    }

    fn get_lba_status(&mut self, lba: u16) {
        let cap = self.blocks();
        let lba = if lba & 0x8000 != 0 {
            cap + u64::from(lba & 0xff)
        } else {
            u64::from(lba) % cap
        };
        let cdb = Cdb::GetLbaStatus {
            lba,
            allocation_length: 4096,
        }
        .encode();
        let r = self.run_by(&cdb, &[], 4096, |rig, req| {
            rig.table
                .execute_from_memory(req, 0)
                .unwrap_or_else(|| rig.table.execute(req))
        });
        if lba >= cap {
            self.expect_refused_past_end(&r, "GET LBA STATUS");
            return;
        }
        self.expect_good(&r, "GET LBA STATUS");
        let d = &r.data_in;
        assert!(
            d.len() >= 8,
            "step {}: GET LBA STATUS returned {} bytes",
            self.step,
            d.len()
        );
        let listed = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
        assert!(
            listed >= 4 && (listed - 4) % 16 == 0,
            "step {}: PARAMETER DATA LENGTH {listed}",
            self.step
        );
        let mut next = lba;
        for desc in d[8..d.len().min(listed + 4)].chunks_exact(16) {
            let start = u64::from_be_bytes(desc[0..8].try_into().unwrap());
            let blocks = u64::from(u32::from_be_bytes(desc[8..12].try_into().unwrap()));
            let status = desc[12] & 0x0f;
            assert_eq!(
                start, next,
                "step {}: GET LBA STATUS descriptors are not consecutive from LBA {lba}",
                self.step
            );
            assert!(
                blocks > 0 && start + blocks <= cap,
                "step {}: descriptor {start}+{blocks} of {cap} blocks",
                self.step
            );
            assert!(
                status <= 2,
                "step {}: provisioning status {status}",
                self.step
            );
            if status != 0 {
                let range = self.bytes(start, blocks);
                if !is_zero(&self.model[range.clone()]) {
                    let i = self.model[range.clone()]
                        .iter()
                        .position(|&b| b != 0)
                        .unwrap_or(0);
                    panic!("step {}: GET LBA STATUS calls blocks {start}+{blocks} deallocated, but block {} holds data", self.step, (range.start + i) as u64 / self.bs);
                }
            }
            next = start + blocks;
        }
        assert!(
            next > lba,
            "step {}: GET LBA STATUS described nothing at LBA {lba}",
            self.step
        );
    }

    fn sanitize(&mut self, erase: bool, invert: bool, count: u8, pat: &[u8]) {
        let count = 1 + count % 3;
        let pat: Vec<u8> = if pat.is_empty() {
            vec![0xc3]
        } else {
            pat.iter().copied().take(self.bs as usize).collect()
        };
        let params = if erase {
            vec![]
        } else {
            let mut p = vec![u8::from(invert) << 7 | count, 0];
            p.extend_from_slice(&(pat.len() as u16).to_be_bytes());
            p.extend_from_slice(&pat);
            p
        };
        let sa = if erase { 0x02 } else { 0x01 };
        let len = (params.len() as u16).to_be_bytes();
        let cdb = [0x48, sa, 0, 0, 0, 0, 0, len[0], len[1], 0];
        let r = self.run(&cdb, &params, 0);
        if !self.good_or_illegal(&r, "SANITIZE") {
            return;
        }
        if erase {
            self.model.fill(0);
        } else {
            // The last of `count` passes leaves the pattern, inverted when
            // INVERT is set and the count even (SBC-4 5.30).
            let last: Vec<u8> = if invert && count % 2 == 0 {
                pat.iter().map(|b| !b).collect()
            } else {
                pat
            };
            for block in self.model.chunks_mut(self.bs as usize) {
                for (b, p) in block.iter_mut().zip(last.iter().cycle()) {
                    *b = *p;
                }
            }
        }
    }

    /// FORMAT UNIT without a parameter list: a thin unit reads as zeros
    /// afterwards, a fully provisioned one as before; a request for the
    /// protection the unit has not is refused and changes nothing.
    fn format(&mut self, other: bool) {
        let own = if self.pi.is_some() { 0x80 } else { 0 };
        let fmtpinfo = if other { own ^ 0x80 } else { own };
        let r = self.run(&[0x04, fmtpinfo, 0, 0, 0, 0], &[], 0);
        let good = self.good_or_illegal(&r, "FORMAT UNIT");
        assert_eq!(good, !other, "step {}: FORMAT UNIT {fmtpinfo:#x}", self.step);
        if good && self.thin {
            self.model.fill(0);
        }
    }

    fn write_cache(&mut self, on: bool) {
        let sense_cdb = Cdb::ModeSense6 {
            dbd: true,
            page_control: PageControl::Current,
            page_code: 0x08,
            subpage_code: 0,
            allocation_length: 255,
        }
        .encode();
        let r = self.run(&sense_cdb, &[], 255);
        self.expect_good(&r, "MODE SENSE");
        let mut m = ModeParameters::decode6(&r.data_in).expect("mode parameters");
        let Some(ModePage::Caching(c)) = m.pages.first_mut() else {
            panic!("step {}: no caching page in {m:?}", self.step);
        };
        c.wce = on;
        c.ps = false;
        m.header = Default::default();
        let list = m.encode6();
        let cdb = Cdb::ModeSelect6 {
            pf: true,
            sp: false,
            parameter_list_length: list.len() as u8,
        }
        .encode();
        let r = self.run(&cdb, &list, 0);
        self.expect_good(&r, "MODE SELECT of the caching page");
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for p in self.paths.iter().chain(self.journal.iter()) {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn cdb_size(s: Size) -> (CdbSize, u64) {
    match s {
        Size::Six => (CdbSize::Six, 255),
        Size::Ten => (CdbSize::Ten, u64::MAX),
        Size::Twelve => (CdbSize::Twelve, u64::MAX),
        Size::Sixteen => (CdbSize::Sixteen, u64::MAX),
    }
}

fn rw(size: CdbSize, lba: u64, length: u32, fua: bool) -> Rw {
    Rw {
        size,
        lba,
        length,
        protect: 0,
        dpo: false,
        fua: fua && size != CdbSize::Six,
        group: 0,
    }
}

/// The I/O engine of the process (io_uring where the kernel has it).
fn engine() -> &'static dyn Engine {
    &**lun_files::io_engine()
}

/// Reads a planned READ as the fabric's engine path does: from the store's
/// engine source, in chunks, into a pool buffer, each unit taken as the
/// `Bytes` view the data mover sends from. None: the engine does not take
/// this one.
fn engine_read(p: &PlannedRead, chunk: u8, serial: bool) -> Option<ScsiResult> {
    let (src, direct) =
        p.lu.config()
            .backstore
            .engine_source()
            .expect("engine source")?;
    if direct && (p.offset % 4096 != 0 || p.len % 4096 != 0)
        || p.len > engine().pool().max_len() as u64
    {
        return None;
    }
    let chunk = [4096, 8192, 65536][usize::from(chunk) % 3];
    let cfg = if serial {
        ReadConfig::serial(chunk)
    } else {
        ReadConfig::synchronized(chunk)
    };
    let (mut cmd, mut rx) = ReadCommand::start(
        engine(),
        &src,
        p.offset,
        p.len as usize,
        SendOrder::InOrder,
        &cfg,
        std::time::Instant::now(),
    )
    .expect("engine READ start");
    let mut units = Vec::new();
    loop {
        units.extend(cmd.take_ready().into_iter().map(|u| cmd.unit_bytes(u)));
        if cmd.all_released() {
            break;
        }
        let c = rx.blocking_recv().expect("the engine dropped a completion");
        cmd.on_completion(c, std::time::Instant::now())
            .expect("engine read");
    }
    drop(cmd);
    let mut data = Vec::with_capacity(p.len as usize);
    for (range, bytes) in units {
        assert_eq!(range.start, data.len() as u64, "units out of order");
        data.extend_from_slice(&bytes);
    }
    Some(ScsiResult {
        status: GOOD,
        sense: None,
        data_in: data,
        transfer_length: p.len as u32,
    })
}

/// Whether every byte is zero, by memcmp against zeros.
fn is_zero(b: &[u8]) -> bool {
    static ZEROS: [u8; 4096] = [0; 4096];
    b.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

fn sense(r: &ScsiResult) -> Sense {
    Sense::decode(
        r.sense
            .as_deref()
            .expect("CHECK CONDITION without sense data"),
    )
    .expect("sense data decode")
}

fuzz_target!(|input: Input| {
    let Some(mut rig) = Rig::new(&input) else {
        return;
    };
    for op in input.ops.iter().take(48) {
        rig.step(op);
    }
});

/// POPULATE TOKEN (10h) or WRITE USING TOKEN (11h) with parameter list `p`.
fn token_cdb(service_action: u8, list_identifier: u32, p: &[u8]) -> Vec<u8> {
    Cdb::TokenCopy {
        service_action,
        list_identifier,
        parameter_list_length: p.len() as u32,
        group: 0,
    }
    .encode()
}
