//! Tests of the PDU reader and writer.
use super::*;
use blockwire_pdu::pdu::{DataIn, NopIn};
use blockwire_pdu::Lun;
use bytes::Bytes;
use std::time::Duration;
use tokio::net::TcpListener;

/// A connected pair on loopback: (our writer over the accepted side, the
/// peer's stream). The send buffer is made large so a gathered send is
/// never cut short by a full socket (the test then counts calls).
async fn pair() -> (PduWriter, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (ours, _) = l.accept().await.unwrap();
    let big: libc::c_int = 8 << 20;
    // SAFETY: valid socket fd, int-sized option.
    unsafe {
        libc::setsockopt(
            ours.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&big as *const libc::c_int).cast(),
            4,
        );
    }
    let (_rd, wr) = ours.into_split();
    // The read half is dropped: only writing matters here.
    (PduWriter::new(wr), peer)
}

fn data_in(sn: u32, offset: u32, data: Bytes, status: bool) -> Pdu {
    Pdu::with_data(
        Bhs::DataIn(DataIn {
            final_bit: status,
            acknowledge: false,
            overflow: false,
            underflow: false,
            status: status.then_some(0),
            lun: Lun::from_index(0),
            itt: 7,
            ttt: RESERVED_TAG,
            stat_sn: 1,
            exp_cmd_sn: 1,
            max_cmd_sn: 1,
            data_sn: sn,
            buffer_offset: offset,
            residual_count: 0,
        }),
        data,
    )
}

/// Reads PDUs from `peer` until `n` arrived.
async fn read_pdus(peer: &mut TcpStream, digests: Digests, n: usize) -> Vec<Pdu> {
    let framer = FrameDecoder::new(1 << 20, digests);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    while out.len() < n {
        match framer.decode(&buf).unwrap() {
            Frame::Pdu { pdu, consumed } => {
                let _ = buf.split_to(consumed);
                out.push(pdu);
            }
            Frame::NeedMore(_) => {
                let r = tokio::time::timeout(Duration::from_secs(10), peer.read_buf(&mut buf))
                    .await
                    .expect("PDU within 10 s")
                    .unwrap();
                assert!(r > 0, "stream ended after {} PDUs", out.len());
            }
        }
    }
    out
}

/// No digests, and both header and data digests.
const NO_AND_ALL_DIGESTS: [Digests; 2] = [
    Digests::NONE,
    Digests {
        header: true,
        data: true,
    },
];

fn payload(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn large_payloads_leave_in_one_gathered_send_each_with_padding_and_digests() {
    for digests in NO_AND_ALL_DIGESTS {
        let (mut w, mut peer) = pair().await;
        w.digests = digests;
        let nop = Pdu::new(Bhs::NopIn(NopIn {
            lun: Lun::default(),
            itt: RESERVED_TAG,
            ttt: 5,
            stat_sn: 1,
            exp_cmd_sn: 1,
            max_cmd_sn: 1,
        }));
        // Odd lengths: 1 to 3 bytes of padding.
        let sent: Vec<Pdu> = (0..8)
            .map(|i| data_in(i, i * 30000, payload(20001 + i as usize, i as u8), i == 7))
            .collect();
        let reader = tokio::spawn(async move {
            let got = read_pdus(&mut peer, digests, 9).await;
            (got, peer)
        });
        w.push(&nop).await.unwrap();
        for p in &sent {
            w.push(p).await.unwrap();
        }
        w.flush().await.unwrap();
        let (got, _peer) = reader.await.unwrap();
        assert_eq!(got[0].bhs, nop.bhs, "the queued small PDU goes first");
        for (g, s) in got[1..].iter().zip(&sent) {
            assert_eq!(g.bhs, s.bhs);
            assert_eq!(g.data, s.data, "payload intact");
        }
        assert_eq!(w.stats.gathered_pdus, 8);
        assert_eq!(
            w.stats.gathered_calls, 8,
            "one writev per PDU (header, payload, padding, digest together)"
        );
    }
}

#[tokio::test]
async fn zero_copy_sends_keep_data_intact_and_get_notified() {
    let (mut w, mut peer) = pair().await;
    assert!(w.enable_zero_copy(), "SO_ZEROCOPY works on this kernel");
    w.digests = Digests {
        header: true,
        data: false,
    };
    let buf = payload(64 * 1024 * 16, 3);
    let sent: Vec<Pdu> = (0..16u32)
        .map(|i| {
            let at = i as usize * 65536;
            data_in(i, at as u32, buf.slice(at..at + 65536), i == 15)
        })
        .collect();
    let reader = tokio::spawn(async move {
        read_pdus(
            &mut peer,
            Digests {
                header: true,
                data: false,
            },
            16,
        )
        .await
    });
    for p in &sent {
        w.push(p).await.unwrap();
    }
    w.flush().await.unwrap();
    let got = reader.await.unwrap();
    for (g, s) in got.iter().zip(&sent) {
        assert_eq!(g.data, s.data);
    }
    w.release_zero_copy().await;
    let zc = w.zero_copy().unwrap();
    assert!(
        w.stats.zc_calls >= 16,
        "every 64 KiB payload went zero-copy"
    );
    assert_eq!(zc.inflight(), 0, "every zero-copy send completed");
    assert!(zc.notifications > 0);
    assert_eq!(zc.copied_calls + zc.zero_calls, w.stats.zc_calls);
    drop(sent);
    let mut buf = buf;
    assert!(buf.is_unique(), "the kernel's references were released");
    buf.truncate(0);
}

/// A payload's memory that says when it is freed (back to its pool, for
/// a READ's buffer).
struct Watched(Vec<u8>, Arc<std::sync::atomic::AtomicBool>);

impl AsRef<[u8]> for Watched {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A zero-copy writer whose one Data-In of `len` bytes the peer, reading
/// nothing, has left half sent: (the writer, the peer, the payload's bytes,
/// whether its memory was freed). The writer holds the only reference.
async fn writer_stalled_in_a_zero_copy_send(
    len: usize,
) -> (
    PduWriter,
    TcpStream,
    Vec<u8>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    let (mut w, peer) = pair().await;
    assert!(w.enable_zero_copy(), "SO_ZEROCOPY works on this kernel");
    let bytes = payload(len, 9).to_vec();
    let freed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pdu = data_in(
        0,
        0,
        Bytes::from_owner(Watched(bytes.clone(), freed.clone())),
        true,
    );
    let stalled = tokio::time::timeout(Duration::from_secs(2), w.push(&pdu)).await;
    assert!(
        stalled.is_err(),
        "the peer's window and our socket buffer took it all"
    );
    drop(pdu);
    assert!(w.zero_copy().unwrap().inflight() > 0);
    (w, peer, bytes, freed)
}

/// Reads `peer` to its end, which must be a reset (the unsent data were
/// discarded), within 10 s.
async fn expect_reset(peer: &mut TcpStream) {
    let mut got = Vec::new();
    let e = tokio::time::timeout(Duration::from_secs(10), peer.read_to_end(&mut got))
        .await
        .expect("the stream ends within 10 s")
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
}

/// Waits up to `within` for `flag`.
async fn set_within(flag: &std::sync::atomic::AtomicBool, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while !flag.load(std::sync::atomic::Ordering::SeqCst) {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// A writer that goes away (its connection ended, or its send was given
/// up) while the kernel still holds pages of a zero-copy send must not
/// free that payload's buffer: back in its pool, the next READ would fill
/// it, and the socket would send that READ's data in this one's place.
/// The buffer is kept until the initiator has taken the data.
#[tokio::test]
async fn zero_copy_buffers_outlive_their_writer_until_the_initiator_takes_the_data() {
    let (w, mut peer, bytes, freed) = writer_stalled_in_a_zero_copy_send(64 << 20).await;
    drop(w);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !freed.load(std::sync::atomic::Ordering::SeqCst),
        "the payload's buffer was freed while the kernel still held its pages"
    );
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), peer.read_to_end(&mut got))
        .await
        .expect("the stream ends within 30 s")
        .unwrap();
    assert!(
        got.len() > blockwire_pdu::pdu::BHS_LEN,
        "{} bytes",
        got.len()
    );
    let data = &got[blockwire_pdu::pdu::BHS_LEN..];
    assert!(
        data == &bytes[..data.len()],
        "the data sent is the payload's"
    );
    assert!(
        set_within(&freed, Duration::from_secs(10)).await,
        "the buffer is freed once the kernel lets it go"
    );
}

/// An initiator that never takes the data gets its connection reset; the
/// buffer is freed once the reset made the kernel let it go (not leaked).
#[tokio::test]
async fn zero_copy_buffers_of_an_initiator_that_takes_nothing_are_freed_after_a_reset() {
    let (mut w, mut peer, _bytes, freed) = writer_stalled_in_a_zero_copy_send(64 << 20).await;
    let zc = w.zc.take().unwrap();
    let retiring = zc
        .retire_within(
            w.tcp_stream().unwrap(),
            Duration::from_millis(500),
            Duration::from_secs(10),
        )
        .expect("calls in flight");
    drop(w);
    assert!(!freed.load(std::sync::atomic::Ordering::SeqCst));
    tokio::task::spawn_blocking(move || retiring.join().unwrap())
        .await
        .unwrap();
    assert!(
        freed.load(std::sync::atomic::Ordering::SeqCst),
        "freed after the reset, not leaked"
    );
    expect_reset(&mut peer).await;
}

/// A connection cut on purpose (an initiator that takes no data) is reset
/// at once, not after the grace an ending connection's initiator has to
/// take its data, and the buffers are freed then.
#[tokio::test]
async fn a_cut_writer_resets_the_connection_at_once_and_frees_its_zero_copy_buffers() {
    let (w, mut peer, _bytes, freed) = writer_stalled_in_a_zero_copy_send(64 << 20).await;
    w.cut_flag()
        .store(true, std::sync::atomic::Ordering::Release);
    drop(w);
    assert!(
        set_within(&freed, Duration::from_secs(10)).await,
        "freed well before the 30 s grace of an ending connection"
    );
    expect_reset(&mut peer).await;
}

/// A LUN file cut short within its last page, its pages cached: a mapped
/// send for an initiator on this host is refused as sendfile's is, where
/// it faulted only past that page and so carried the cut bytes as zeros,
/// the READ ending GOOD.
#[tokio::test]
async fn a_mapped_send_past_the_end_of_a_shrunk_file_is_refused() {
    use std::io::Write;
    let mut f = tempfile::tempfile().unwrap();
    let content = payload(300_000, 3);
    f.write_all(&content).unwrap();
    let lun = SendfileLun::new(f.try_clone().unwrap(), "iqn.x LUN 4".into());
    assert!(lun.map.is_some(), "the file is mapped");
    let (mut w, _peer) = pair().await;
    assert!(w.copy_local_sends());
    f.set_len(300_000 - 512).unwrap();
    let h = data_in(0, 0, Bytes::new(), true);
    let e = w
        .push_file(&h.bhs, &lun, 200_000, 100_000)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    assert!(e.to_string().contains("iqn.x LUN 4"), "{e}");
    assert_eq!(w.stats.mapped_bytes, 0);
}

#[tokio::test]
async fn file_payloads_go_by_sendfile_unless_data_digests_need_the_bytes() {
    use std::io::Write;
    let mut f = tempfile::tempfile().unwrap();
    let content = payload(300_000, 9);
    f.write_all(&content).unwrap();
    let f = SendfileLun::new(f, "test LUN".into());
    for digests in [
        Digests {
            header: true,
            data: false,
        },
        Digests {
            header: false,
            data: true,
        },
    ] {
        let (mut w, mut peer) = pair().await;
        w.digests = digests;
        let reader = tokio::spawn(async move { read_pdus(&mut peer, digests, 2).await });
        let a = data_in(0, 0, Bytes::new(), false);
        let b = data_in(1, 4097, Bytes::new(), true);
        w.push_file(&a.bhs, &f, 0, 4097).await.unwrap();
        w.push_file(&b.bhs, &f, 4097, 200_001).await.unwrap();
        w.flush().await.unwrap();
        let got = reader.await.unwrap();
        assert_eq!(got[0].data, content.slice(0..4097));
        assert_eq!(got[1].data, content.slice(4097..204_098));
        assert_eq!(got[1].bhs, b.bhs);
        // The 4097-byte payload is copied when the file is in memory or the
        // file system answers RWF_NOWAIT reads, else sent by sendfile like
        // the large one.
        let expect = if digests.data { 0 } else { 204_098 };
        assert_eq!(
            w.stats.sendfile_bytes + w.stats.file_copied_bytes,
            expect,
            "{digests:?}"
        );
        if !digests.data {
            assert!(w.stats.sendfile_bytes >= 200_001, "{:?}", w.stats);
        }
    }
    // A file shorter than the PDU: an error naming the LUN, for a large
    // payload and for a small one (the copy comes up short and sendfile
    // reports it).
    for len in [20_000, 4_000] {
        let (mut w, _peer) = pair().await;
        let f = SendfileLun::new(f.file.try_clone().unwrap(), "iqn.x LUN 3".into());
        let h = data_in(0, 0, Bytes::new(), true);
        let e = w.push_file(&h.bhs, &f, 298_000, len).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("iqn.x LUN 3"), "{e}");
    }
}

#[tokio::test]
async fn small_cached_file_payloads_are_copied_beside_their_headers() {
    use std::io::Write;
    // A file in tmpfs is memory, as the LUN files of the benchmarks.
    let mut f = tempfile::tempfile_in("/dev/shm").expect("a file in /dev/shm (tmpfs)");
    let content = payload(64 * 1024, 3);
    f.write_all(&content).unwrap();
    let f = SendfileLun::new(f, "shm LUN".into());
    let digests = Digests::NONE;
    let (mut w, mut peer) = pair().await;
    let reader = tokio::spawn(async move { read_pdus(&mut peer, digests, 4).await });
    // Three small READs and one above the copy limit, queued back to back.
    let spans = [
        (0u64, 4096u32),
        (4096, 513),
        (10_000, FILE_COPY_MAX),
        (20_000, FILE_COPY_MAX + 1),
    ];
    for (i, (off, len)) in spans.iter().enumerate() {
        let h = data_in(i as u32, 0, Bytes::new(), true);
        w.push_file(&h.bhs, &f, *off, *len).await.unwrap();
    }
    w.flush().await.unwrap();
    let got = reader.await.unwrap();
    for (pdu, (off, len)) in got.iter().zip(spans) {
        let (off, len) = (off as usize, len as usize);
        assert_eq!(pdu.data, content.slice(off..off + len));
    }
    let copied = u64::from(4096 + 513 + FILE_COPY_MAX);
    assert_eq!(w.stats.file_copied_bytes, copied, "{:?}", w.stats);
    assert_eq!(w.stats.sendfile_bytes, u64::from(FILE_COPY_MAX + 1));
    assert!(f.in_memory);
}

#[tokio::test]
async fn small_payloads_leave_by_reference_in_order_with_everything_queued() {
    use std::io::Write;
    let mut f = tempfile::tempfile_in("/dev/shm").expect("a file in /dev/shm (tmpfs)");
    let content = payload(64 * 1024, 5);
    f.write_all(&content).unwrap();
    let f = SendfileLun::new(f, "shm LUN".into());
    for digests in NO_AND_ALL_DIGESTS {
        let (mut w, mut peer) = pair().await;
        w.digests = digests;
        // Below the gather size (copied), gathered sizes with 0 to 3 bytes
        // of padding, a file payload between them, then a large payload
        // that must leave after everything gathered before it.
        let sizes = [100usize, GATHER_MIN, 4095, 4096, 9999, DIRECT_WRITE_MIN - 1];
        let mut sent: Vec<Pdu> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| data_in(i as u32, 0, payload(n, i as u8), false))
            .collect();
        let file_pdu = data_in(90, 0, Bytes::new(), false);
        let large = data_in(91, 0, payload(100_000, 77), true);
        let expect = 2 * sent.len() + 2;
        let reader = tokio::spawn(async move { read_pdus(&mut peer, digests, expect).await });
        for p in &sent {
            w.push(p).await.unwrap();
        }
        w.push_file(&file_pdu.bhs, &f, 100, 3000).await.unwrap();
        for p in &sent {
            w.push(p).await.unwrap();
        }
        w.push(&large).await.unwrap();
        w.flush().await.unwrap();
        let got = reader.await.unwrap();
        let mut want = sent.clone();
        want.push(Pdu::with_data(file_pdu.bhs, content.slice(100..3100)));
        want.append(&mut sent);
        want.push(large.clone());
        assert_eq!(got.len(), want.len());
        for (i, (g, s)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.bhs, s.bhs, "PDU {i} in order ({digests:?})");
            assert_eq!(g.data, s.data, "PDU {i} intact ({digests:?})");
        }
        if !digests.data {
            assert_eq!(w.stats.file_copied_bytes, 3000);
        }
    }
}

/// One socket read that brings several PDUs: the first comes from `next`,
/// the rest from `next_buffered` without touching the socket, which says
/// None at a PDU that is only partly there; a bad PDU among them is
/// reported and skipped, and the PDU behind it still comes whole.
#[tokio::test]
async fn pdus_one_read_brought_are_cut_without_reading_again() {
    let (mut ours, theirs) = tokio::io::duplex(1 << 20);
    let mut reader = PduReader::new(theirs);
    let pdus: Vec<Pdu> = (0..4)
        .map(|i| data_in(i, i * 512, payload(512, i as u8), false))
        .collect();
    let mut unknown = [0u8; 48];
    unknown[0] = 0x1d; // no such opcode (RFC 7143 section 11.1.1)
    let mut bytes = Vec::new();
    for p in &pdus[..2] {
        bytes.extend_from_slice(&p.encode(Digests::NONE));
    }
    bytes.extend_from_slice(&unknown);
    bytes.extend_from_slice(&pdus[2].encode(Digests::NONE));
    let last = pdus[3].encode(Digests::NONE);
    bytes.extend_from_slice(&last[..100]);
    ours.write_all(&bytes).await.unwrap();

    let first = reader.next().await.unwrap().expect("a PDU");
    assert_eq!(first.encode(Digests::NONE), pdus[0].encode(Digests::NONE));
    let second = reader.next_buffered().expect("buffered").unwrap();
    assert_eq!(second.encode(Digests::NONE), pdus[1].encode(Digests::NONE));
    match reader.next_buffered() {
        Some(Err(ReadError::Decode { header, skip, .. })) => {
            assert_eq!(header, Some(unknown));
            assert_eq!(skip, Some(48));
        }
        other => panic!("expected the unknown opcode, got {other:?}"),
    }
    let third = reader.next_buffered().expect("buffered").unwrap();
    assert_eq!(third.encode(Digests::NONE), pdus[2].encode(Digests::NONE));
    assert!(
        reader.next_buffered().is_none(),
        "the fourth PDU is only partly there"
    );
    assert!(
        reader.next_buffered().is_none(),
        "and asking again reads nothing"
    );

    ours.write_all(&last[100..]).await.unwrap();
    let fourth = tokio::time::timeout(Duration::from_secs(10), reader.next())
        .await
        .expect("the rest arrives")
        .unwrap()
        .expect("a PDU");
    assert_eq!(fourth.encode(Digests::NONE), pdus[3].encode(Digests::NONE));
    drop(ours);
    assert!(
        reader.next().await.unwrap().is_none(),
        "clean end of stream"
    );
}
