//! WRITEs that their LUN's QoS ceilings hold back (see the `writes`
//! module): their R2Ts wait for their place, and meanwhile they hold no
//! write budget, so other WRITEs on the connection are not refused.

use super::*;
use crate::scsi::QosLimits;

/// The test fabric with a write budget of one 4-block WRITE.
fn fabric_with_small_budget() -> Arc<Fabric> {
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(1 << 20))));
    let catalog = Catalog::one_target(TARGET, local(), Acl::Any, Arc::new(lu));
    let settings = FabricSettings {
        queue_depth: 16,
        write_budget_bytes: u64::from(4 * BLOCK),
        ..FabricSettings::default()
    };
    let (_, shutdown) = watch::channel(false);
    Fabric::new(Arc::new(catalog), settings, shutdown)
}

/// R2Ts for every WRITE; the first block of each comes as immediate data.
const KEYS: [(&str, &str); 3] = [
    ("InitialR2T", "Yes"),
    ("ImmediateData", "Yes"),
    ("FirstBurstLength", "512"),
];

/// A connection to the small-budget fabric whose LUN 0 has a ceiling of
/// 10 IOPS: the burst (50 ms) lets the first WRITE through, the second
/// waits 50 ms.
async fn open_at_10_iops() -> Conn {
    open_with(QosLimits {
        iops: Some(10),
        ..Default::default()
    })
    .await
}

/// A connection to the small-budget fabric whose LUN 0 has `limits`.
async fn open_with(limits: QosLimits) -> Conn {
    let mut c = Conn::open_on(fabric_with_small_budget(), Some(TARGET), &KEYS);
    let (itt, tur) = c.no_data_command(&[0; 6]);
    assert_eq!(c.feed(tur).await, None);
    assert_eq!(c.response(itt).await.0, 0x02, "the power-on unit attention");
    c.lu().set_qos(limits);
    c
}

/// Sends a 4-block WRITE at `lba` of `data`, its first block immediate;
/// its ITT.
async fn send_write(c: &mut Conn, lba: u32, data: &[u8]) -> u32 {
    let (itt, cmd) = c.rw(true, lba, 4, data[..BLOCK as usize].to_vec());
    assert_eq!(c.feed(cmd).await, None);
    itt
}

/// Sends the data the R2T `r` asks for, in one Data-Out.
async fn answer(c: &mut Conn, itt: u32, r: &blockwire_pdu::pdu::R2t, data: &[u8]) {
    let at = r.buffer_offset as usize;
    let len = r.desired_data_transfer_length as usize;
    let pdu = c.data_out(itt, r.ttt, 0, at as u32, &data[at..at + len], true);
    assert_eq!(c.feed(pdu).await, None);
}

fn r2t_of(pdus: &[Pdu], itt: u32) -> Option<blockwire_pdu::pdu::R2t> {
    r2ts(pdus).into_iter().find(|r| r.itt == itt)
}

#[tokio::test]
async fn a_held_write_asks_for_its_data_when_its_place_comes_and_holds_no_budget_meanwhile() {
    let mut c = open_at_10_iops().await;
    let (a_data, b_data) = (
        pattern(4 * BLOCK as usize, 3),
        pattern(4 * BLOCK as usize, 4),
    );
    let a = send_write(&mut c, 0, &a_data).await;
    let ra = r2t_of(&c.sent(), a).expect("the first WRITE asks for its data at once");
    let b = send_write(&mut c, 8, &b_data).await;
    let sent = c.sent();
    assert!(
        r2t_of(&sent, b).is_none() && status_of(&sent, b).is_none(),
        "the held WRITE neither asks for data nor is refused: {sent:?}"
    );
    assert_eq!(c.lu().qos().counters().waiting, 1);
    assert_eq!(
        c.machine.poll_timeout(),
        Some(c.now + Duration::from_millis(50))
    );
    // The budget holds one WRITE: A has it; B, held, took none (it would
    // have been refused TASK SET FULL had it taken its share on arrival).
    answer(&mut c, a, &ra, &a_data).await;
    assert_eq!(c.response(a).await.0, 0, "A GOOD");
    assert_eq!(c.advance(Duration::from_millis(49)).await, None);
    assert!(r2t_of(&c.sent(), b).is_none(), "asked for before its place");
    assert_eq!(c.advance(Duration::from_millis(1)).await, None);
    let rb = r2t_of(&c.sent(), b).expect("asked for when its place came");
    assert_eq!(rb.buffer_offset, BLOCK, "after its immediate block");
    assert_eq!(c.lu().qos().counters().waiting, 0);
    answer(&mut c, b, &rb, &b_data).await;
    assert_eq!(c.response(b).await.0, 0, "B GOOD");
    c.lu().set_qos(QosLimits::default());
    assert_eq!(read_back(&mut c, 0, 4).await, a_data);
    assert_eq!(read_back(&mut c, 8, 4).await, b_data);
}

/// A WRITE its LUN's ceiling holds for longer than the Data-Out timeout
/// asks for nothing meanwhile, so it waits no Data-Out: its connection is
/// not ended for the data it has not asked for yet, and its wait for them
/// begins when its place comes.
#[tokio::test]
async fn a_write_held_past_the_data_out_timeout_is_not_ended_for_its_data() {
    use crate::iscsi::machine::writes::DATA_OUT_TIMEOUT_FLOOR;
    // 2 KiB at 32 bytes a second: the second WRITE's place is 64 s on.
    let mut c = open_with(QosLimits {
        bytes_per_sec: Some(32),
        ..Default::default()
    })
    .await;
    let data = pattern(4 * BLOCK as usize, 6);
    let a = send_write(&mut c, 0, &data).await;
    let ra = r2t_of(&c.sent(), a).expect("the first WRITE asks at once");
    answer(&mut c, a, &ra, &data).await;
    assert_eq!(c.response(a).await.0, 0);
    let b = send_write(&mut c, 8, &data).await;
    assert!(r2t_of(&c.sent(), b).is_none(), "held");
    let mut waited = Duration::ZERO;
    let rb = loop {
        assert_eq!(
            c.advance(Duration::from_secs(1)).await,
            None,
            "ended after {waited:?} of a held WRITE's wait"
        );
        waited += Duration::from_secs(1);
        let sent = c.sent();
        // The target's pings answered: only a wait for data could end it.
        for p in &sent {
            if let Bhs::NopIn(n) = p.bhs {
                let answer = Pdu::new(Bhs::NopOut(NopOut {
                    immediate: true,
                    lun: Lun::default(),
                    itt: RESERVED_TAG,
                    ttt: n.ttt,
                    cmd_sn: c.cmd_sn,
                    exp_stat_sn: 0,
                }));
                assert_eq!(c.feed(answer).await, None);
            }
        }
        if let Some(r) = r2t_of(&sent, b) {
            break r;
        }
        assert!(waited < Duration::from_secs(120), "never asked for");
    };
    assert!(waited > 2 * DATA_OUT_TIMEOUT_FLOOR, "held for {waited:?}");
    answer(&mut c, b, &rb, &data).await;
    assert_eq!(c.response(b).await.0, 0, "B GOOD");
}

#[tokio::test]
async fn a_held_write_that_finds_the_budget_full_when_its_place_comes_is_told_task_set_full() {
    let mut c = open_at_10_iops().await;
    let data = pattern(4 * BLOCK as usize, 5);
    let a = send_write(&mut c, 0, &data).await;
    assert!(r2t_of(&c.sent(), a).is_some());
    let b = send_write(&mut c, 8, &data).await;
    // A still holds the whole budget when B's place comes.
    c.advance(Duration::from_millis(50)).await;
    let sent = c.sent();
    assert!(r2t_of(&sent, b).is_none(), "{sent:?}");
    assert_eq!(status_of(&sent, b), Some(0x28), "TASK SET FULL");
    assert!(!c.session.tasks.contains(b));
    assert_eq!(c.lu().qos().counters().waiting, 0);
}

#[tokio::test]
async fn a_held_write_aborted_before_its_place_never_asks_for_data_and_gives_its_place_back() {
    let mut c = open_at_10_iops().await;
    let data = pattern(4 * BLOCK as usize, 6);
    let a = send_write(&mut c, 0, &data).await;
    let ra = r2t_of(&c.sent(), a).unwrap();
    let b = send_write(&mut c, 8, &data).await;
    let (tmf, req) = c.tmf(TmfFunction::AbortTask, 0, b);
    c.feed(req).await;
    assert_eq!(tmf_response(&c.sent(), tmf), TmfResponse::FunctionComplete);
    assert_eq!(c.lu().qos().counters().waiting, 0);
    c.advance(Duration::from_millis(60)).await;
    let sent = c.sent();
    assert!(!mentions(&sent, b), "{sent:?}");
    // B's place was given back: the next WRITE waits as B would have, 50
    // ms from when B came, not 150.
    answer(&mut c, a, &ra, &data).await;
    assert_eq!(c.response(a).await.0, 0);
    let d = send_write(&mut c, 16, &data).await;
    assert!(
        r2t_of(&c.sent(), d).is_some(),
        "60 ms on, with B's place given back, D's place is free"
    );
    assert_eq!(c.machine.shared().in_flight(), 1, "only D is in the window");
}

#[tokio::test]
async fn a_write_held_by_its_initiators_ceiling_then_waits_its_turn_at_the_luns() {
    // 10 IOPS for the LUN and 10 for each initiator: 100 ms a command.
    let mut c = open_with(QosLimits {
        iops: Some(10),
        initiator_iops: Some(10),
        ..Default::default()
    })
    .await;
    // This host's last command took its place 100 ms ahead; another host's
    // two commands took the LUN's next 200 ms.
    let lu = c.lu();
    let gate = lu.qos();
    gate.reserve_for(INITIATOR, c.now, 0);
    gate.reserve(c.now, 0);
    gate.reserve(c.now, 0);
    assert_eq!(gate.counters().delayed, 1, "the other host's second");
    let data = pattern(4 * BLOCK as usize, 7);
    let w = send_write(&mut c, 0, &data).await;
    assert!(r2t_of(&c.sent(), w).is_none(), "held at its host's ceiling");
    assert_eq!(
        c.machine.poll_timeout(),
        Some(c.now + Duration::from_millis(50))
    );
    // Its host's turn comes at 50 ms; the LUN's, booked then, at 150 ms.
    assert_eq!(c.advance(Duration::from_millis(50)).await, None);
    assert!(
        r2t_of(&c.sent(), w).is_none(),
        "asked for before the LUN's turn"
    );
    assert_eq!(
        c.machine.poll_timeout(),
        Some(c.now + Duration::from_millis(100))
    );
    assert_eq!(c.lu().qos().counters().waiting, 1);
    assert_eq!(c.advance(Duration::from_millis(99)).await, None);
    assert!(r2t_of(&c.sent(), w).is_none());
    assert_eq!(c.advance(Duration::from_millis(1)).await, None);
    let r = r2t_of(&c.sent(), w).expect("asked for at the LUN's turn");
    let counters = c.lu().qos().counters();
    assert_eq!((counters.waiting, counters.delayed), (0, 2), "delayed once");
    answer(&mut c, w, &r, &data).await;
    assert_eq!(c.response(w).await.0, 0);
    c.lu().set_qos(QosLimits::default());
    assert_eq!(read_back(&mut c, 0, 4).await, data);
}

#[tokio::test]
async fn a_held_write_past_its_initiators_lookahead_books_its_turn_when_it_comes_back() {
    use crate::scsi::qos::LOOKAHEAD;
    let mut c = open_at_10_iops().await;
    let data = pattern(4 * BLOCK as usize, 8);
    let t0 = c.now;
    // A starts at once; B is booked 50 ms ahead; C, with B past the
    // look-ahead, books nothing and comes back 5 ms before B's start.
    let a = send_write(&mut c, 0, &data).await;
    let ra = r2t_of(&c.sent(), a).expect("A asks for its data at once");
    let b = send_write(&mut c, 8, &data).await;
    let w = send_write(&mut c, 16, &data).await;
    assert_eq!(c.lu().qos().counters().waiting, 2);
    let back = t0 + Duration::from_millis(50) - LOOKAHEAD;
    assert_eq!(c.machine.poll_timeout(), Some(back));
    answer(&mut c, a, &ra, &data).await;
    assert_eq!(c.response(a).await.0, 0, "A GOOD");
    // C comes back and books after B: at 150 ms.
    assert_eq!(c.advance(back - t0).await, None);
    let sent = c.sent();
    assert!(
        r2t_of(&sent, b).is_none() && r2t_of(&sent, w).is_none(),
        "{sent:?}"
    );
    assert_eq!(
        c.machine.poll_timeout(),
        Some(t0 + Duration::from_millis(50)),
        "B's turn next"
    );
    assert_eq!(
        c.advance(t0 + Duration::from_millis(50) - c.now).await,
        None
    );
    let rb = r2t_of(&c.sent(), b).expect("B asked for at its turn");
    answer(&mut c, b, &rb, &data).await;
    assert_eq!(c.response(b).await.0, 0, "B GOOD");
    assert_eq!(
        c.machine.poll_timeout(),
        Some(t0 + Duration::from_millis(150)),
        "C's turn, booked when it came back"
    );
    assert_eq!(c.advance(Duration::from_millis(99)).await, None);
    assert!(
        r2t_of(&c.sent(), w).is_none(),
        "C asked for before its turn"
    );
    assert_eq!(c.advance(Duration::from_millis(1)).await, None);
    let rw = r2t_of(&c.sent(), w).expect("C asked for at its turn");
    let counters = c.lu().qos().counters();
    assert_eq!(
        (counters.waiting, counters.delayed),
        (0, 2),
        "B and C, once each"
    );
    answer(&mut c, w, &rw, &data).await;
    assert_eq!(c.response(w).await.0, 0, "C GOOD");
    c.lu().set_qos(QosLimits::default());
    assert_eq!(read_back(&mut c, 16, 4).await, data);
}
