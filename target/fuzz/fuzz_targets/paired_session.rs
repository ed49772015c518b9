//! Pairs the two sans-IO state machines of a session in memory, as
//! quinn-proto's tests pair two endpoints: the initiator's [`Engine`]
//! (blockwire's own, from `initiator/`) logs in to the target's connection
//! (through the fuzzing harness: the real PDU reader, login phase,
//! connection machine and writer) with operational keys the fuzzer picks,
//! then runs batches of READs and WRITEs of sizes the fuzzer picks, several
//! in flight at once, moving the data as the negotiated keys shape it
//! (immediate data, unsolicited Data-Out up to FirstBurstLength, R2Ts up to
//! MaxBurstLength and MaxOutstandingR2T, Data-Out and Data-In segments cut
//! to each side's MaxRecvDataSegmentLength, Data-Out and Data-In in or out
//! of order, header and data digests), READs whose Expected Data Transfer
//! Length differs from the CDB's. LUN 0 is RAM, or a file (through the page
//! cache or O_DIRECT) served by the data paths the fuzzer turns on, as a
//! daemon's `[[target.lun]]` would: READ payloads by sendfile, READs
//! through the I/O engine (synchronized or serial, in chunks of 4, 8 or 64
//! KiB) and double-buffered WRITEs, where each payload is copied into a
//! chunk at its BufferOffset and full chunks go to disk while the next
//! arrive; or files striped RAID0, read by the engine one stream per
//! member; or RAM or a file formatted with protection information, whose
//! READs check every block against the tuple its WRITEs generated.
//!
//! Checked: each side accepts everything the other sends (the engine
//! reports no protocol failure and the target does not end the
//! connection); every command completes GOOD with the residual RFC 7143
//! §11.4.5 gives; every READ returns the bytes a model of the LUN holds
//! (commands of one batch never overlap, so the model's order is the only
//! one); nothing stalls.
#![no_main]

use std::collections::HashMap;

#[path = "../common/commands.rs"]
mod commands;
#[path = "../common/lun_files.rs"]
mod lun_files;
#[path = "../common/storage.rs"]
mod storage;

use blockwire_initiator::engine::{
    data_out_sequence, DataOutPdu, Engine, Event, Limits, Placement, TaskResult,
};
use blockwire_initiator::rw16;
use blockwire_pdu::keys::{encode_text, parse_text, Digest};
use blockwire_pdu::pdu::{DataOut, LoginRequest};
use blockwire_pdu::{Bhs, Digests, Lun, Pdu, Stage};
use blockwire_target::iscsi::connection::fuzzing::{Harness, Phase, Wire, TARGET};
use blockwire_target::iscsi::FabricSettings;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

use commands::{blocks_of, edtl, pattern, Io, BLOCK, LUN_BYTES};

const INITIATOR: &str = "iqn.2026-11.io.blockwire:paired";
const GOOD: u8 = 0;
const SCRATCH_PREFIX: &str = "blockwire-fuzz-paired-";

#[derive(Arbitrary, Debug)]
struct Input {
    storage: storage::Storage,
    keys: Keys,
    target_mrdsl: u8,
    data_pdu_in_order: bool,
    /// With DataPDUInOrder=No negotiated, the seed of the order the PDUs
    /// of each Data-Out sequence are sent in (0: offset order).
    data_out_order: u64,
    queue_depth: u8,
    batches: Vec<Vec<Io>>,
}

/// The operational keys the initiator offers (RFC 7143 §13).
#[derive(Arbitrary, Debug)]
struct Keys {
    initial_r2t: bool,
    immediate_data: bool,
    mrdsl: u8,
    first_burst: u8,
    max_burst: u8,
    max_outstanding_r2t: u8,
    header_digest: u8,
    data_digest: u8,
}

/// Digest offers (RFC 7143 §13.1): the target picks the first it takes.
const DIGESTS: [&str; 3] = ["None", "CRC32C", "CRC32C,None"];

/// Sizes that fall on and between segment and burst boundaries.
const SIZES: [u32; 6] = [512, 1000, 4096, 8192, 65_536, 262_144];

impl Keys {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let yes_no = |b: bool| if b { "Yes" } else { "No" }.to_string();
        let size = |v: u8| SIZES[usize::from(v) % SIZES.len()].to_string();
        vec![
            ("InitialR2T", yes_no(self.initial_r2t)),
            ("ImmediateData", yes_no(self.immediate_data)),
            ("MaxRecvDataSegmentLength", size(self.mrdsl)),
            ("FirstBurstLength", size(self.first_burst)),
            ("MaxBurstLength", size(self.max_burst)),
            (
                "MaxOutstandingR2T",
                (1 + self.max_outstanding_r2t % 4).to_string(),
            ),
            (
                "HeaderDigest",
                DIGESTS[usize::from(self.header_digest) % 3].to_string(),
            ),
            (
                "DataDigest",
                DIGESTS[usize::from(self.data_digest) % 3].to_string(),
            ),
        ]
    }
}

/// A command in flight: what it asked for (None: TEST UNIT READY), and
/// its write data.
struct Pending {
    io: Option<Io>,
    data: Vec<u8>,
}

struct Pair {
    h: Harness,
    /// Each task's owner value is its number in `pending`.
    engine: Engine<u32>,
    lun: Lun,
    /// The digests the login negotiated, on every PDU after it.
    digests: Digests,
    pending: HashMap<u32, Pending>,
    /// Initiator Task Tag to owner, for the Data-Out of a task.
    owners: HashMap<u32, u32>,
    next: u32,
    model: Vec<u8>,
    /// The last TEST UNIT READY answered GOOD.
    ready: bool,
    /// DataPDUInOrder=No was negotiated and Data-Out PDUs go shuffled by
    /// this generator's state (xorshift; 0: in offset order).
    data_out_order: u64,
}

/// A Login Request of the leading connection of a new session.
fn login_request(csg: Stage, nsg: Stage, exp_stat_sn: u32, pairs: &[(&str, String)]) -> Pdu {
    Pdu::with_data(
        Bhs::LoginRequest(LoginRequest {
            transit: true,
            continue_bit: false,
            csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0, 0, 0x42, 2],
            tsih: 0,
            itt: 1,
            cid: 1,
            cmd_sn: 1,
            exp_stat_sn,
        }),
        encode_text(pairs).expect("login keys"),
    )
}

/// Logs in: the security stage, then the operational stage with the keys
/// (operational keys count only there, RFC 7143 §6.3), then the engine of
/// the full feature phase.
fn login(h: &mut Harness, keys: &Keys) -> (Engine<u32>, Digests) {
    let security = [
        ("InitiatorName", INITIATOR.to_string()),
        ("AuthMethod", "None".to_string()),
        ("SessionType", "Normal".to_string()),
        ("TargetName", TARGET.to_string()),
    ];
    let last_response = |h: &mut Harness| {
        h.take_log().iter().rev().find_map(|w| match w {
            Wire::FromTarget(Pdu {
                bhs: Bhs::LoginResponse(r),
                data,
                ..
            }) => Some((*r, data.to_vec())),
            _ => None,
        })
    };
    let no_digests = Digests::default();
    h.send(&login_request(Stage::Security, Stage::Operational, 0, &security).encode(no_digests));
    let (mut r, mut text) = last_response(h).expect("a Login Response");
    let mine = keys.pairs();
    let mut request: Vec<(String, String)> = mine
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    // The target may answer without T while it offers keys of its own: the
    // next request answers those (its first value), as RFC 7143 §6.2 has it.
    for _ in 0..4 {
        if h.phase() != Phase::Login {
            break;
        }
        let exp = r.stat_sn.wrapping_add(1);
        let pairs: Vec<(&str, String)> = request
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        h.send(
            &login_request(Stage::Operational, Stage::FullFeature, exp, &pairs).encode(no_digests),
        );
        (r, text) = last_response(h).expect("a Login Response");
        request = parse_text(&text)
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| !mine.iter().any(|(m, _)| m == k))
            .map(|(k, v)| {
                let first = v.split(',').next().unwrap_or_default().to_string();
                (k, first)
            })
            .collect();
    }
    assert_eq!(
        h.phase(),
        Phase::FullFeature,
        "login refused: {r:?} {}",
        String::from_utf8_lossy(&text)
    );
    let params = h.params().expect("negotiated parameters");
    let digests = Digests {
        header: params.header_digest == Digest::Crc32c,
        data: params.data_digest == Digest::Crc32c,
    };
    // The first command takes the login's CmdSN (RFC 7143 §4.2.2.1).
    let engine = Engine::new(
        1,
        Limits::from_params(params),
        1,
        r.exp_cmd_sn,
        r.max_cmd_sn,
        r.stat_sn,
    );
    (engine, digests)
}

impl Pair {
    fn send(&mut self, pdu: Pdu) {
        self.h.send(&pdu.encode(self.digests));
    }

    fn start(&mut self, io: Io) {
        let range = blocks_of(&io);
        let blocks = range.end - range.start;
        let io = Io {
            lba: range.start as u16,
            blocks: blocks as u16,
            ..io
        };
        let len = blocks as usize * BLOCK;
        let cdb: [u8; 16] = rw16(io.write, range.start, blocks as u32, false)
            .try_into()
            .expect("a 16-byte CDB");
        let data = if io.write {
            pattern(io.seed, len)
        } else {
            vec![]
        };
        let read_buf = (!io.write).then(|| vec![0u8; edtl(&io, len)]);
        let write_len = if io.write { len } else { 0 };
        let owner = self.next;
        self.next += 1;
        let (itt, header, immediate, unsolicited_end) =
            self.engine.start_scsi(0, &cdb, read_buf, write_len, owner);
        self.owners.insert(itt, owner);
        let unsolicited = data_out_sequence(
            itt,
            self.lun,
            0xffff_ffff,
            immediate..unsolicited_end,
            self.engine.limits().target_mrdsl,
            self.engine.exp_stat_sn(),
        );
        let command = Pdu::with_data(Bhs::ScsiCommand(header), data[..immediate].to_vec());
        self.pending.insert(owner, Pending { io: Some(io), data });
        self.send(command);
        self.send_sequence(unsolicited);
    }

    /// Sends one Data-Out sequence: in offset order, or with
    /// DataPDUInOrder=No in an order the fuzzer picked (RFC 7143 §13.19:
    /// the PDUs of a sequence may then go in any order), DataSN counting
    /// them as sent and the F bit on the last one sent.
    fn send_sequence(&mut self, mut seq: Vec<DataOutPdu>) {
        if self.data_out_order != 0 {
            for i in (1..seq.len()).rev() {
                let x = &mut self.data_out_order;
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                seq.swap(i, (*x % (i as u64 + 1)) as usize);
            }
            let last = seq.len().saturating_sub(1);
            for (i, d) in seq.iter_mut().enumerate() {
                d.header.data_sn = i as u32;
                d.header.final_bit = i == last;
            }
        }
        for d in seq {
            self.send_data_out(d.header, d.range);
        }
    }

    fn send_data_out(&mut self, header: DataOut, range: std::ops::Range<usize>) {
        let bytes = self.pending[&self.owners[&header.itt]].data[range].to_vec();
        self.send(Pdu::with_data(Bhs::DataOut(header), bytes));
    }

    /// Hands the target's PDUs to the engine and carries out what it asks.
    /// Returns whether anything arrived.
    fn pump(&mut self) -> bool {
        let log = self.h.take_log();
        let mut any = false;
        for w in log {
            let Wire::FromTarget(pdu) = w else { continue };
            any = true;
            let events = match pdu.bhs {
                Bhs::DataIn(d) => {
                    let len = pdu.data.len();
                    let (placement, mut events) = self.engine.data_in_begin(&d, len);
                    let back = match placement {
                        Placement::Into { mut buf, range } => {
                            buf[range].copy_from_slice(&pdu.data);
                            Some(buf)
                        }
                        Placement::Discard => None,
                    };
                    events.extend(self.engine.data_in_end(&d, back, len));
                    events
                }
                _ => self.engine.receive(pdu),
            };
            for e in events {
                self.carry_out(e);
            }
        }
        any
    }

    fn carry_out(&mut self, e: Event<u32>) {
        match e {
            Event::R2t { r2t, .. } => {
                // The whole sequence goes into the pipe at once, as the
                // session sends it under its writer.
                if let Some(seq) = self.engine.answer_r2t(&r2t) {
                    self.send_sequence(seq);
                }
            }
            Event::Complete { owner, result } => self.complete(owner, result),
            Event::Send(pdu) => self.send(pdu),
            Event::Drop { reason, .. } => panic!("the target asked to drop the session: {reason}"),
            Event::LogoutRequested { within } => {
                panic!("the target asked for a logout within {within:?}")
            }
        }
    }

    fn complete(&mut self, owner: u32, result: TaskResult) {
        let p = self
            .pending
            .remove(&owner)
            .expect("a completion for a task started");
        let TaskResult::Scsi(o) = result else {
            panic!("{:?} ended as {result:?}", p.io);
        };
        let Some(io) = p.io else {
            self.ready = o.status == GOOD;
            return;
        };
        assert_eq!((o.response, o.status), (0, GOOD), "{io:?} failed: {o:?}");
        let at = usize::from(io.lba) * BLOCK;
        let len = usize::from(io.blocks) * BLOCK;
        // Residuals (RFC 7143 §11.4.5): overflow when the CDB wanted more
        // than the Expected Data Transfer Length, underflow when less.
        let expected = edtl(&io, len);
        let residuals = match expected.cmp(&len) {
            std::cmp::Ordering::Equal => (None, None),
            std::cmp::Ordering::Less => (None, Some((len - expected) as u32)),
            std::cmp::Ordering::Greater => (Some((expected - len) as u32), None),
        };
        assert_eq!(
            (o.underflow, o.overflow),
            residuals,
            "residuals of {io:?}: {o:?}"
        );
        if io.write {
            self.model[at..at + len].copy_from_slice(&p.data);
        } else {
            let got = o.buf.expect("the read buffer back");
            let moved = expected.min(len);
            assert_eq!(o.data_in, moved as u64, "{io:?}: Data-In bytes");
            let (got, len) = (&got[..moved], moved);
            if got[..] != self.model[at..at + len] {
                let i = got
                    .iter()
                    .zip(&self.model[at..])
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                panic!(
                    "{io:?}: byte {i} read {:#04x}, the model holds {:#04x}",
                    got[i],
                    self.model[at + i]
                );
            }
        }
    }

    /// TEST UNIT READY until GOOD: the power-on unit attention of a new
    /// I_T nexus (SAM-5) goes to the first command otherwise.
    fn clear_unit_attention(&mut self) {
        for _ in 0..4 {
            let owner = self.next;
            self.next += 1;
            let (itt, header, _, _) = self.engine.start_scsi(0, &[0u8; 16], None, 0, owner);
            self.owners.insert(itt, owner);
            self.pending.insert(
                owner,
                Pending {
                    io: None,
                    data: vec![],
                },
            );
            self.send(Pdu::with_data(Bhs::ScsiCommand(header), vec![]));
            self.settle();
            if self.ready {
                return;
            }
        }
        panic!("the unit attention never cleared");
    }

    /// Pumps until every command of the batch completed.
    fn settle(&mut self) {
        while !self.pending.is_empty() {
            assert!(
                self.h.phase() == Phase::FullFeature,
                "the target ended the connection"
            );
            assert!(
                self.pump(),
                "{} command(s) never completed: {:?}",
                self.pending.len(),
                self.engine.in_flight()
            );
        }
    }
}

fuzz_target!(|input: Input| {
    let settings = FabricSettings {
        queue_depth: u32::from(input.queue_depth % 16) + 1,
        max_recv_data_segment_length: [262_144, 8192, 512, 4096]
            [usize::from(input.target_mrdsl % 4)],
        data_pdu_in_order: input.data_pdu_in_order,
        zero_copy_send: false,
        ..FabricSettings::default()
    };
    let (unit, paths) = storage::lun0(&input.storage, SCRATCH_PREFIX, LUN_BYTES as u64);
    let mut h = Harness::serving_unit(settings, unit, paths);
    let (engine, digests) = login(&mut h, &input.keys);
    let data_out_order = if h.params().expect("negotiated").data_pdu_in_order {
        0
    } else {
        input.data_out_order
    };
    let mut pair = Pair {
        h,
        engine,
        lun: Lun::from_index(0),
        digests,
        pending: HashMap::new(),
        owners: HashMap::new(),
        next: 0,
        model: vec![0; LUN_BYTES],
        ready: false,
        data_out_order,
    };
    pair.clear_unit_attention();
    for batch in input.batches.iter().take(8) {
        for io in commands::disjoint(batch) {
            while !pair.engine.window_open() {
                assert!(pair.pump(), "the CmdSN window stays closed");
            }
            pair.start(io);
            pair.pump();
        }
        pair.settle();
    }
});
