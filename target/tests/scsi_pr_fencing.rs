//! Fencing with persistent reservations over real sockets, as a cluster
//! fencing agent does it: two initiators register, A reserves WRITE
//! EXCLUSIVE - REGISTRANTS ONLY, A fences B with PREEMPT AND ABORT while B
//! has writes in flight (held inside the backstore), B's in-flight
//! commands are aborted (no status ever comes back: TAS=0), B gets the
//! REGISTRATIONS PREEMPTED unit attention, then RESERVATION CONFLICT on
//! writes while reads still work. The state was saved with APTPL and
//! survives a target restart.
//!
//! What happens when an initiator returns with a new ISID: registrations
//! and reservations belong to the I_T nexus, i.e. initiator port = iSCSI
//! name + ISID (SPC-4 5.9.1, RFC 7143 4.4.1). A session of the same
//! initiator name with another ISID is a different nexus: it is not
//! registered, so under a REGISTRANTS ONLY reservation its writes conflict
//! and it does not hold the reservation, even though READ KEYS still shows
//! the key its old nexus registered. It must register itself (REGISTER AND
//! IGNORE EXISTING KEY works without knowing the old key); the old nexus's
//! registration and reservation stay until preempted or cleared. Fencing
//! agents that log in afresh (new ISID) must therefore register before
//! they reserve or preempt, which is what fence_scsi does.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use blockwire_pdu::pdu::codes::TaskAttr;
use blockwire_pdu::pdu::ScsiCommand;
use blockwire_pdu::scsi::{Asc, Sense, SenseKey};
use blockwire_pdu::{Bhs, Digests, Lun, Pdu};
use blockwire_target::backstore::{Backstore, RamBackstore};
use blockwire_target::iscsi::catalog::Acl;
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{LogicalUnit, LuConfig};
use tokio::sync::watch;

mod support;
use support::{start_target, RawConn};

const TARGET: &str = "iqn.2026-11.io.blockwire:pr-fencing";
const NODE_A: &str = "iqn.2026-11.io.blockwire:node-a";
const NODE_B: &str = "iqn.2026-11.io.blockwire:node-b";
const ISID_A: [u8; 6] = [0x40, 0, 0, 0, 0, 0xa];
const ISID_B: [u8; 6] = [0x40, 0, 0, 0, 0, 0xb];

const GOOD: u8 = 0x00;
const CHECK: u8 = 0x02;
const CONFLICT: u8 = 0x18;

/// Writes to LBAs at or above this one wait until the gate opens: they
/// stay in flight inside the backstore.
const GATED_LBA: u32 = 1000;

/// RAM whose writes at GATED_LBA and above block until `open()`.
#[derive(Debug)]
struct Gated {
    inner: RamBackstore,
    open: Mutex<bool>,
    cv: Condvar,
    waiting: Mutex<usize>,
}

impl Gated {
    fn new() -> Gated {
        Gated {
            inner: RamBackstore::new(8 << 20),
            open: Mutex::new(false),
            cv: Condvar::new(),
            waiting: Mutex::new(0),
        }
    }
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
    fn waiting(&self) -> usize {
        *self.waiting.lock().unwrap()
    }
}

impl Backstore for Gated {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if offset >= u64::from(GATED_LBA) * 512 {
            *self.waiting.lock().unwrap() += 1;
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.cv.wait(open).unwrap();
            }
            drop(open);
            *self.waiting.lock().unwrap() -= 1;
        }
        self.inner.write_at(offset, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "gated".into()
    }
}

/// Starts a target whose LUN 0 is `store`, with APTPL state in `pr_path`.
async fn start(
    store: Arc<dyn Backstore>,
    pr_path: &std::path::Path,
) -> (std::net::SocketAddr, watch::Sender<bool>) {
    let mut cfg = LuConfig::new(store);
    cfg.pr_state_path = Some(pr_path.to_owned());
    let lu = LogicalUnit::new(cfg);
    let acl = Acl::Only(vec![NODE_A.into(), NODE_B.into()]);
    let t = start_target(TARGET, acl, lu, FabricSettings::default()).await;
    (t.addr, t.stop)
}

/// A minimal initiator session (no digests, immediate data).
struct Node {
    conn: RawConn,
    cmd_sn: u32,
    itt: u32,
}

/// A command's outcome: status, sense, Data-In.
#[derive(Debug)]
struct Outcome {
    status: u8,
    sense: Option<Sense>,
    data: Vec<u8>,
}

impl Node {
    async fn login(addr: std::net::SocketAddr, name: &str, isid: [u8; 6]) -> Node {
        let l = RawConn::login(addr, name, TARGET, isid, 0, Digests::NONE, 0x1000, 1).await;
        Node {
            conn: l.conn,
            cmd_sn: 1,
            itt: 0x1000,
        }
    }

    async fn send(&mut self, pdu: Pdu) {
        self.conn.send(pdu).await;
    }

    async fn recv(&mut self, wait: Duration) -> Option<Pdu> {
        self.conn.recv_within(wait).await
    }

    /// Sends a command (all Data-Out as immediate data); returns its ITT.
    async fn submit(&mut self, cdb: &[u8], data_out: &[u8], read_len: u32) -> u32 {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        self.itt += 1;
        let cmd = ScsiCommand {
            immediate: false,
            final_bit: true,
            read: read_len > 0,
            write: !data_out.is_empty(),
            attr: TaskAttr::Simple,
            lun: Lun::from_index(0),
            itt: self.itt,
            expected_data_transfer_length: if data_out.is_empty() {
                read_len
            } else {
                data_out.len() as u32
            },
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb: c,
        };
        self.cmd_sn += 1;
        self.send(Pdu::with_data(Bhs::ScsiCommand(cmd), data_out.to_vec()))
            .await;
        self.itt
    }

    /// Waits for the outcome of `itt`; outcomes of other ITTs that arrive
    /// meanwhile are returned in `others`. None: nothing within `wait`.
    async fn outcome(
        &mut self,
        itt: u32,
        wait: Duration,
        others: &mut Vec<(u32, u8)>,
    ) -> Option<Outcome> {
        let mut data = Vec::new();
        loop {
            let pdu = self.recv(wait).await?;
            match pdu.bhs {
                Bhs::DataIn(d) if d.itt == itt => {
                    data.extend_from_slice(&pdu.data);
                    if let Some(status) = d.status {
                        return Some(Outcome {
                            status,
                            sense: None,
                            data,
                        });
                    }
                }
                Bhs::ScsiResponse(r) if r.itt == itt => {
                    let sense =
                        (pdu.data.len() > 2).then(|| Sense::decode(&pdu.data[2..]).unwrap());
                    return Some(Outcome {
                        status: r.status,
                        sense,
                        data,
                    });
                }
                Bhs::ScsiResponse(r) => others.push((r.itt, r.status)),
                Bhs::DataIn(d) if d.status.is_some() => others.push((d.itt, d.status.unwrap())),
                _ => {}
            }
        }
    }

    async fn run(&mut self, cdb: &[u8], data_out: &[u8], read_len: u32) -> Outcome {
        let itt = self.submit(cdb, data_out, read_len).await;
        let mut others = Vec::new();
        let o = self
            .outcome(itt, Duration::from_secs(5), &mut others)
            .await
            .expect("command outcome");
        assert!(others.is_empty(), "unexpected completions {others:?}");
        o
    }

    /// TEST UNIT READY until GOOD; returns the unit attentions seen.
    async fn clear_unit_attentions(&mut self) -> Vec<Asc> {
        let mut seen = Vec::new();
        for _ in 0..8 {
            let o = self.run(&[0; 6], &[], 0).await;
            if o.status == GOOD {
                return seen;
            }
            let s = o.sense.expect("sense");
            assert_eq!(s.key, SenseKey::UnitAttention, "{s:?}");
            seen.push(s.code());
        }
        panic!("unit attentions never cleared: {seen:?}");
    }

    async fn write(&mut self, lba: u32, byte: u8) -> Outcome {
        self.run(&rw10(0x2a, lba), &[byte; 512], 0).await
    }

    async fn read(&mut self, lba: u32) -> Outcome {
        self.run(&rw10(0x28, lba), &[], 512).await
    }

    async fn pr_out(&mut self, sa: u8, pr_type: u8, key: u64, sa_key: u64, aptpl: bool) -> Outcome {
        let mut p = Vec::with_capacity(24);
        p.extend_from_slice(&key.to_be_bytes());
        p.extend_from_slice(&sa_key.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
        p.extend_from_slice(&[u8::from(aptpl), 0, 0, 0]);
        let cdb = [0x5f, sa, pr_type, 0, 0, 0, 0, 0, 24, 0];
        self.run(&cdb, &p, 0).await
    }

    /// READ KEYS: the registered keys.
    async fn read_keys(&mut self) -> Vec<u64> {
        let o = self.run(&[0x5e, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256).await;
        assert_eq!(o.status, GOOD, "{o:?}");
        let len = u32::from_be_bytes(o.data[4..8].try_into().unwrap()) as usize;
        o.data[8..8 + len]
            .chunks(8)
            .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
            .collect()
    }

    /// READ RESERVATION: (key, type) of the reservation, if any.
    async fn read_reservation(&mut self) -> Option<(u64, u8)> {
        let o = self.run(&[0x5e, 1, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256).await;
        assert_eq!(o.status, GOOD, "{o:?}");
        let len = u32::from_be_bytes(o.data[4..8].try_into().unwrap());
        (len >= 16).then(|| {
            (
                u64::from_be_bytes(o.data[8..16].try_into().unwrap()),
                o.data[21] & 0x0f,
            )
        })
    }
}

fn rw10(op: u8, lba: u32) -> Vec<u8> {
    let mut cdb = vec![op, 0];
    cdb.extend_from_slice(&lba.to_be_bytes());
    cdb.extend_from_slice(&[0, 0, 1, 0]);
    cdb
}

const REGISTER: u8 = 0;
const RESERVE: u8 = 1;
const PREEMPT_AND_ABORT: u8 = 5;
const REGISTER_AND_IGNORE: u8 = 6;
/// WRITE EXCLUSIVE - REGISTRANTS ONLY.
const WE_RO: u8 = 5;
const KEY_A: u64 = 0xaaaa_0001;
const KEY_B: u64 = 0xbbbb_0002;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn preempt_and_abort_fences_the_other_node_and_aptpl_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let pr_path = dir.path().join("lun0.pr");
    let store = Arc::new(Gated::new());
    let (addr, stop) = start(store.clone(), &pr_path).await;

    let mut a = Node::login(addr, NODE_A, ISID_A).await;
    let mut b = Node::login(addr, NODE_B, ISID_B).await;
    a.clear_unit_attentions().await;
    b.clear_unit_attentions().await;

    // Both register (APTPL), A reserves WE-RO.
    assert_eq!(a.pr_out(REGISTER, 0, 0, KEY_A, true).await.status, GOOD);
    assert_eq!(b.pr_out(REGISTER, 0, 0, KEY_B, true).await.status, GOOD);
    assert_eq!(a.pr_out(RESERVE, WE_RO, KEY_A, 0, true).await.status, GOOD);
    assert_eq!(a.read_reservation().await, Some((KEY_A, WE_RO)));
    // A registrant may write under WE-RO.
    assert_eq!(b.write(10, 0xb0).await.status, GOOD);

    // B puts two writes in flight; they wait inside the backstore.
    let t1 = b.submit(&rw10(0x2a, GATED_LBA), &[0xb1; 512], 0).await;
    let t2 = b.submit(&rw10(0x2a, GATED_LBA + 8), &[0xb2; 512], 0).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.waiting() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "writes never reached the backstore"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // A fences B. The backstore lets B's writes go 300 ms later: PREEMPT
    // AND ABORT must not report GOOD before they are out of the unit, or a
    // fenced node's write could land after the fencing node moved on.
    let opener = store.clone();
    let gate = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        opener.open();
    });
    let o = a.pr_out(PREEMPT_AND_ABORT, WE_RO, KEY_A, KEY_B, true).await;
    assert_eq!(o.status, GOOD, "{o:?}");
    assert_eq!(
        store.waiting(),
        0,
        "PREEMPT AND ABORT returned with B's writes still running"
    );
    let fenced_view = a.read(GATED_LBA).await.data;
    gate.join().unwrap();
    assert_eq!(a.read_keys().await, vec![KEY_A]);

    // B's in-flight commands were aborted: no status ever comes back.
    let mut others = Vec::new();
    assert!(
        b.outcome(t1, Duration::from_millis(1500), &mut others)
            .await
            .is_none(),
        "the aborted write got a status"
    );
    assert!(
        !others.iter().any(|(itt, _)| *itt == t1 || *itt == t2),
        "aborted writes answered: {others:?}"
    );

    // Nothing of B's changes the medium after the fencing completed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.read(GATED_LBA).await.data, fenced_view);

    // B learns it was preempted, then conflicts on writes; reads still work.
    let uas = b.clear_unit_attentions().await;
    assert!(uas.contains(&Asc::REGISTRATIONS_PREEMPTED), "B saw {uas:?}");
    assert_eq!(b.write(11, 0xb3).await.status, CONFLICT);
    let o = b.read(10).await;
    assert_eq!(o.status, GOOD);
    assert_eq!(o.data, vec![0xb0; 512]);
    // B cannot take the reservation back: it is no longer registered.
    assert_eq!(
        b.pr_out(RESERVE, WE_RO, KEY_B, 0, false).await.status,
        CONFLICT
    );
    assert_eq!(a.write(12, 0xa0).await.status, GOOD);

    // Restart the target over the same state file: the APTPL state is back.
    let _ = stop.send(true);
    drop((a, b));
    let store2 = Arc::new(RamBackstore::new(8 << 20));
    let (addr2, _stop2) = start(store2, &pr_path).await;
    let mut a = Node::login(addr2, NODE_A, ISID_A).await;
    let mut b = Node::login(addr2, NODE_B, ISID_B).await;
    a.clear_unit_attentions().await;
    b.clear_unit_attentions().await;
    assert_eq!(a.read_keys().await, vec![KEY_A]);
    assert_eq!(b.read_reservation().await, Some((KEY_A, WE_RO)));
    assert_eq!(b.write(11, 0xb4).await.status, CONFLICT);
    assert_eq!(a.write(11, 0xa1).await.status, GOOD);

    // A returns with a new ISID: a different I_T nexus, not registered.
    let mut a2 = Node::login(addr2, NODE_A, [0x40, 0, 0, 0, 0, 0x2a]).await;
    a2.clear_unit_attentions().await;
    assert_eq!(
        a2.read_keys().await,
        vec![KEY_A],
        "the old nexus's key stays"
    );
    assert_eq!(a2.write(13, 0xa2).await.status, CONFLICT);
    // It registers for itself, without knowing the old key, and may then
    // write (WE-RO admits every registrant); the reservation stays with the
    // old nexus.
    let o = a2.pr_out(REGISTER_AND_IGNORE, 0, 0, KEY_A + 1, false).await;
    assert_eq!(o.status, GOOD, "{o:?}");
    assert_eq!(a2.write(13, 0xa2).await.status, GOOD);
    let mut keys = a2.read_keys().await;
    keys.sort_unstable();
    assert_eq!(keys, vec![KEY_A, KEY_A + 1]);
    assert_eq!(a2.read_reservation().await, Some((KEY_A, WE_RO)));
    let o = b.read(13).await;
    assert_eq!((o.status, o.data), (GOOD, vec![0xa2; 512]));
}

/// A helper sanity check: the outcome of a command B sends after the
/// reservation is gone is not confused with a stale one.
#[tokio::test]
async fn sense_is_reported_for_check_conditions() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _stop) = start(Arc::new(RamBackstore::new(1 << 20)), &dir.path().join("pr")).await;
    let mut a = Node::login(addr, NODE_A, ISID_A).await;
    a.clear_unit_attentions().await;
    let o = a.run(&rw10(0x28, 1 << 20), &[], 512).await;
    assert_eq!(o.status, CHECK);
    assert_eq!(o.sense.unwrap().code(), Asc::LBA_OUT_OF_RANGE);
}
