//! Tests of the engine READ path: Data-In stamping under DataPDUInOrder
//! Yes/No (RFC 7143 13.18, 13.19) with chunk completions released in the
//! order a test chooses.

use super::*;
use crate::datapath::{Completion, CompletionTx, EngineKind, IoOp, Phase, SendOrder};
use crate::iscsi::datain;
use proptest::prelude::*;
use std::io::Write;

/// An engine whose completions the test releases one op at a time, in
/// the order it chooses: each op is really run (pread into the
/// registered buffer) only when released.
struct GatedEngine {
    pool: BufferPool,
    held: Mutex<Vec<(IoOp, CompletionTx)>>,
}

impl Engine for GatedEngine {
    fn kind(&self) -> crate::datapath::EngineKind {
        EngineKind::Emulated
    }
    fn describe(&self) -> String {
        "gated (test)".into()
    }
    fn pool(&self) -> &BufferPool {
        &self.pool
    }
    fn submit(&self, ops: Vec<IoOp>, done: &CompletionTx) -> io::Result<()> {
        let mut h = self.held.lock().unwrap();
        h.extend(ops.into_iter().map(|o| (o, done.clone())));
        Ok(())
    }
}

impl GatedEngine {
    fn new() -> GatedEngine {
        GatedEngine {
            pool: BufferPool::new(&[(1 << 20, 2)]),
            held: Mutex::new(Vec::new()),
        }
    }
    /// Runs the op tagged `tag` (chunk index) and delivers its completion.
    fn complete(&self, tag: u64) {
        let (op, tx) = {
            let mut h = self.held.lock().unwrap();
            let i = h.iter().position(|(o, _)| o.tag == tag).expect("op held");
            h.remove(i)
        };
        let result = crate::datapath::threadpool::run_op(&op);
        drop(op);
        tx.send(Completion { tag, result }).unwrap();
    }
}

fn file_with(data: &[u8]) -> (tempfile::NamedTempFile, Source) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(data).unwrap();
    f.flush().unwrap();
    let src = Source::File(Arc::new(std::fs::File::open(f.path()).unwrap()));
    (f, src)
}

/// PDUs in send order: unit, segment as sent, bytes.
type Sent = Vec<(usize, DataInSegment, Vec<u8>)>;

/// Drives a read the way the Data-In mover does, completing chunks in
/// `completion_order`; returns every PDU sent, in send order, with its
/// bytes.
fn run(
    len: u32,
    chunk: usize,
    mrdsl: u32,
    mbl: u32,
    order: SendOrder,
    completion_order: &[u64],
) -> (Sent, Vec<u8>, CommandTimers) {
    let data: Vec<u8> = (0..len).map(|i| (i / 512) as u8 ^ (i as u8)).collect();
    let (_f, src) = file_with(&data);
    let engine = GatedEngine::new();
    let segs: Vec<DataInSegment> = datain::segments(len, mrdsl, mbl).collect();
    let cfg = ReadConfig {
        mode: Mode::Synchronized,
        chunk,
        units: Some(
            segs.iter()
                .map(|s| u64::from(s.offset)..u64::from(s.offset + s.length))
                .collect(),
        ),
    };
    let received = Instant::now();
    let (mut read, mut rx) =
        ReadCommand::start(&engine, &src, 0, len as usize, order, &cfg, received).unwrap();
    let mut stamper = DataInStamper::new(segs);
    let mut sent = Vec::new();
    for &c in completion_order {
        engine.complete(c);
        read.on_completion(rx.try_recv().unwrap(), Instant::now())
            .unwrap();
        let ready: Vec<_> = read
            .take_ready()
            .into_iter()
            .map(|u| (u, read.unit_bytes(u)))
            .collect();
        for (u, seg, (r, bytes)) in stamper.release(ready) {
            assert_eq!(r.start, u64::from(seg.offset));
            let now = Instant::now();
            read.timers_mut().first_send.get_or_insert(now);
            read.timers_mut().last_send_done = Some(now);
            sent.push((u, seg, bytes.to_vec()));
        }
    }
    assert!(read.all_released());
    read.timers_mut().finished = Some(Instant::now());
    (sent, data, *read.timers_mut())
}

#[test]
fn any_order_sends_in_completion_order_with_offsets() {
    // 4 chunks of 64K, 8 PDUs of 32K, one sequence.
    let (sent, data, t) = run(
        256 << 10,
        64 << 10,
        32 << 10,
        1 << 20,
        SendOrder::AnyOrder,
        &[2, 0, 3, 1],
    );
    let units: Vec<usize> = sent.iter().map(|s| s.0).collect();
    assert_eq!(
        units,
        vec![4, 5, 0, 1, 6, 7, 2, 3],
        "PDUs leave as their chunk completes"
    );
    for (i, (_, seg, bytes)) in sent.iter().enumerate() {
        assert_eq!(seg.data_sn, i as u32, "DataSN counts sends");
        assert_eq!(seg.final_in_sequence, i == 7, "F bit on the last one sent");
        assert_eq!(seg.last, i == 7);
        let o = seg.offset as usize;
        assert_eq!(bytes[..], data[o..o + seg.length as usize]);
    }
    // The phases add up (all instants are monotone here).
    let parts = [
        Phase::Init,
        Phase::DiskRead,
        Phase::SendUnoverlapped,
        Phase::Fin,
    ]
    .iter()
    .map(|&p| t.phase(p))
    .sum::<std::time::Duration>();
    assert_eq!(parts, t.phase(Phase::Total));
    assert!(
        t.first_send.unwrap() < t.disk_done.unwrap(),
        "sends overlapped the disk"
    );
}

#[test]
fn later_sequences_wait_for_the_current_one() {
    // MaxBurstLength 128K: sequence 0 = chunks 0-1 (PDUs 0-3),
    // sequence 1 = chunks 2-3 (PDUs 4-7).
    let (sent, _, _) = run(
        256 << 10,
        64 << 10,
        32 << 10,
        128 << 10,
        SendOrder::AnyOrder,
        &[2, 0, 3, 1],
    );
    let units: Vec<usize> = sent.iter().map(|s| s.0).collect();
    assert_eq!(units, vec![0, 1, 2, 3, 4, 5, 6, 7]);
    let finals: Vec<bool> = sent.iter().map(|s| s.1.final_in_sequence).collect();
    assert_eq!(
        finals,
        vec![false, false, false, true, false, false, false, true]
    );
    // Within a sequence, completion order still wins.
    let (sent, _, _) = run(
        256 << 10,
        64 << 10,
        32 << 10,
        128 << 10,
        SendOrder::AnyOrder,
        &[1, 0, 3, 2],
    );
    let units: Vec<usize> = sent.iter().map(|s| s.0).collect();
    assert_eq!(units, vec![2, 3, 0, 1, 6, 7, 4, 5]);
    assert!(sent[3].1.final_in_sequence && !sent[1].1.final_in_sequence);
}

#[test]
fn in_order_matches_the_serial_segmentation() {
    let (sent, _, _) = run(
        200 << 10,
        16 << 10,
        24 << 10,
        64 << 10,
        SendOrder::InOrder,
        &[12, 3, 0, 1, 2, 5, 4, 6, 7, 8, 9, 11, 10],
    );
    let want: Vec<DataInSegment> = datain::segments(200 << 10, 24 << 10, 64 << 10).collect();
    let got: Vec<DataInSegment> = sent.iter().map(|s| s.1).collect();
    assert_eq!(got, want);
}

proptest! {
    #[test]
    fn stamper_keeps_the_rfc_rules(
        total in 1u32..400_000,
        mrdsl in 512u32..70_000,
        mbl in 512u32..200_000,
        seed in proptest::collection::vec(any::<u32>(), 1..2000),
    ) {
        let segs: Vec<DataInSegment> = datain::segments(total, mrdsl, mbl).collect();
        let n = segs.len();
        // A random release order (the sequencer's any-order output).
        let mut order: Vec<usize> = (0..n).collect();
        for i in 0..n {
            let j = i + seed[i % seed.len()] as usize % (n - i);
            order.swap(i, j);
        }
        let seq_of = |off: u32| segs.iter().take_while(|s| s.offset < off).filter(|s| s.final_in_sequence).count();
        let mut st = DataInStamper::new(segs.clone());
        let mut out = Vec::new();
        let mut k = 0;
        while k < n {
            let step = 1 + seed[k % seed.len()] as usize % 4;
            // Each unit's payload is its own number: it must travel with it.
            out.extend(st.release(order[k..(k + step).min(n)].iter().map(|&u| (u, u))));
            k += step;
        }
        prop_assert_eq!(out.len(), n);
        let mut seen = vec![false; n];
        let mut cur_seq = 0;
        let mut left_in_seq = segs.iter().filter(|s| seq_of(s.offset) == 0).count();
        for (i, (u, seg, payload)) in out.iter().enumerate() {
            prop_assert_eq!(u, payload);
            prop_assert!(!seen[*u]);
            seen[*u] = true;
            prop_assert_eq!(seg.data_sn, i as u32);
            prop_assert_eq!((seg.offset, seg.length), (segs[*u].offset, segs[*u].length));
            // Sequences go one after the other.
            prop_assert_eq!(seq_of(seg.offset), cur_seq);
            left_in_seq -= 1;
            prop_assert_eq!(seg.final_in_sequence, left_in_seq == 0);
            prop_assert_eq!(seg.last, i + 1 == n);
            if left_in_seq == 0 {
                cur_seq += 1;
                left_in_seq = segs.iter().filter(|s| seq_of(s.offset) == cur_seq).count();
            }
        }
    }
}

/// An initiator may negotiate DataPDUInOrder=No with the smallest
/// MaxBurstLength (512 bytes, RFC 7143 §13.14): each Data-In PDU of a large
/// READ is then a sequence of its own. When the first chunk completes
/// last, every later PDU waits behind it, and its release lets all of them
/// go at once, in order, on a small stack (a nested call per waiting
/// sequence overflowed the tokio worker's).
#[test]
fn a_long_run_of_waiting_sequences_is_released_in_order_on_a_small_stack() {
    const UNITS: u32 = 16 << 10;
    let released = std::thread::Builder::new()
        .stack_size(128 << 10)
        .spawn(|| {
            let segs: Vec<DataInSegment> = datain::segments(UNITS * 512, 512, 512).collect();
            assert_eq!(segs.len(), UNITS as usize);
            let mut st = DataInStamper::new(segs);
            assert!(st.release((1..UNITS as usize).map(|u| (u, ()))).is_empty());
            st.release([(0, ())])
        })
        .unwrap()
        .join()
        .expect("releasing the first PDU");
    assert_eq!(released.len(), UNITS as usize);
    for (i, (u, seg, ())) in released.iter().enumerate() {
        assert_eq!((*u, seg.data_sn, seg.offset), (i, i as u32, i as u32 * 512));
        assert!(seg.final_in_sequence);
        assert_eq!(seg.last, i + 1 == UNITS as usize);
    }
}
