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

fn payload(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn large_payloads_leave_in_one_gathered_send_each_with_padding_and_digests() {
    for digests in [
        Digests::NONE,
        Digests {
            header: true,
            data: true,
        },
    ] {
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

#[tokio::test]
async fn file_payloads_go_by_sendfile_unless_data_digests_need_the_bytes() {
    use std::io::Write;
    let mut f = tempfile::tempfile().unwrap();
    let content = payload(300_000, 9);
    f.write_all(&content).unwrap();
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
        w.push_file(&a.bhs, &f, 0, 4097, "test LUN").await.unwrap();
        w.push_file(&b.bhs, &f, 4097, 200_001, "test LUN")
            .await
            .unwrap();
        w.flush().await.unwrap();
        let got = reader.await.unwrap();
        assert_eq!(got[0].data, content.slice(0..4097));
        assert_eq!(got[1].data, content.slice(4097..204_098));
        assert_eq!(got[1].bhs, b.bhs);
        let expect = if digests.data { 0 } else { 204_098 };
        assert_eq!(w.stats.sendfile_bytes, expect, "{digests:?}");
    }
    // A file shorter than the PDU: an error naming the LUN.
    let (mut w, _peer) = pair().await;
    let h = data_in(0, 0, Bytes::new(), true);
    let e = w
        .push_file(&h.bhs, &f, 290_000, 20_000, "iqn.x LUN 3")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(e.to_string().contains("iqn.x LUN 3"), "{e}");
}
