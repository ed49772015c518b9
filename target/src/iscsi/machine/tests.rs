//! In-memory tests of the connection state machine: the test plays the
//! initiator, PDU by PDU, against [`LoginPhase`] and [`ConnMachine`] with
//! the time injected; commands run on the real SCSI core (a RAM LUN that
//! can be stalled) through the driver's own [`carry_out`] and
//! [`Launcher`], and what would go on the wire is read from the writer
//! queue. Nothing touches a socket except the last test, which drives the
//! real driver over an in-memory byte pipe.
//!
//! One file over the usual size: every test shares the one in-memory
//! harness (`Conn`) and its PDU builders.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_pdu::keys::encode_text;
use blockwire_pdu::pdu::codes::{
    AsyncEvent, LogoutReason, LogoutResponseCode, RejectReason, TaskAttr, TmfFunction, TmfResponse,
};
use blockwire_pdu::pdu::{
    DataOut, LoginRequest, LogoutRequest, NopOut, ScsiCommand, TaskMgmtRequest, TextRequest,
    RESERVED_TAG,
};
use blockwire_pdu::{Bhs, DecodeError, Digests, LoginStatus, Lun, Pdu, Stage};
use rand::SeedableRng;
use tokio::sync::{mpsc, watch};

use super::{Action, ConnMachine, EndReason, LoginAction, LoginPhase};
use crate::backstore::RamBackstore;
use crate::iscsi::catalog::{Acl, Catalog};
use crate::iscsi::connection::{carry_out, Outgoing, Stop};
use crate::iscsi::launch::Launcher;
use crate::iscsi::session::Session;
use crate::iscsi::{Fabric, FabricSettings};
use crate::scsi::{LogicalUnit, LuConfig};

const TARGET: &str = "iqn.2026-11.test:machine";
const INITIATOR: &str = "iqn.2026-11.test:host";
const ISID: [u8; 6] = [0x80, 0, 0, 0, 0x42, 1];
const BLOCK: u32 = 512;
const NOP_INTERVAL: Duration = Duration::from_secs(10);
const NOP_TIMEOUT: Duration = Duration::from_secs(30);
const LOGOUT_GRACE: Duration = Duration::from_secs(5);

fn local() -> std::net::SocketAddr {
    "127.0.0.1:3260".parse().unwrap()
}

/// A fabric serving one target with a 1 MiB RAM LUN 0.
fn fabric() -> Arc<Fabric> {
    fabric_pinging(NOP_INTERVAL, NOP_TIMEOUT)
}

/// [`fabric`], pinging every `interval`, each ping timing out after
/// `timeout`.
fn fabric_pinging(interval: Duration, timeout: Duration) -> Arc<Fabric> {
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(1 << 20))));
    let catalog = Catalog::one_target(TARGET, local(), Acl::Any, Arc::new(lu));
    let settings = FabricSettings {
        queue_depth: 16,
        nop_interval: Some(interval),
        nop_timeout: timeout,
        logout_grace: LOGOUT_GRACE,
        ..FabricSettings::default()
    };
    // The sender is dropped: these tests shut down through the machine.
    let (_, shutdown) = watch::channel(false);
    Fabric::new(Arc::new(catalog), settings, shutdown)
}

fn login_pdu(csg: Stage, nsg: Stage, pairs: &[(&str, &str)]) -> Pdu {
    let bhs = Bhs::LoginRequest(LoginRequest {
        transit: true,
        continue_bit: false,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid: ISID,
        tsih: 0,
        itt: 0x77,
        cid: 1,
        cmd_sn: 1,
        exp_stat_sn: 0,
    });
    Pdu::with_data(bhs, encode_text(pairs).unwrap())
}

/// Logs in to `target` (None: a discovery session) with the operational
/// keys `keys`, security stage then operational stage.
fn login(
    fabric: &Arc<Fabric>,
    target: Option<&str>,
    keys: &[(&str, &str)],
) -> Result<(Pdu, Arc<Session>, Box<crate::iscsi::login::LoginOutcome>), Pdu> {
    let phase = LoginPhase::new(
        fabric.clone(),
        1,
        local(),
        rand::rngs::StdRng::seed_from_u64(1),
    );
    login_through(phase, target, keys)
}

/// `login` through a given login phase (TCP's or iSER's).
fn login_through(
    mut phase: LoginPhase,
    target: Option<&str>,
    keys: &[(&str, &str)],
) -> Result<(Pdu, Arc<Session>, Box<crate::iscsi::login::LoginOutcome>), Pdu> {
    let mut security = vec![("InitiatorName", INITIATOR), ("AuthMethod", "None")];
    match target {
        Some(t) => security.extend([("SessionType", "Normal"), ("TargetName", t)]),
        None => security.push(("SessionType", "Discovery")),
    }
    match phase.on_pdu(&login_pdu(Stage::Security, Stage::Operational, &security)) {
        LoginAction::Respond(_) => {}
        LoginAction::Refuse(p) => return Err(p),
        LoginAction::LoggedIn { .. } => panic!("logged in before the operational stage"),
    }
    let mut request = login_pdu(Stage::Operational, Stage::FullFeature, keys);
    for _round in 0..4 {
        match phase.on_pdu(&request) {
            LoginAction::LoggedIn {
                response,
                session,
                outcome,
                ..
            } => return Ok((response, session, outcome)),
            LoginAction::Refuse(p) => return Err(p),
            LoginAction::Respond(p) => {
                // The target offered keys of its own: accept its values
                // (the ones it answered for us are settled already).
                let offered = blockwire_pdu::keys::parse_text(&p.data).unwrap();
                let pairs: Vec<(&str, &str)> = offered
                    .iter()
                    .filter(|(k, _)| !keys.iter().any(|(mine, _)| mine == k))
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                request = login_pdu(Stage::Operational, Stage::FullFeature, &pairs);
            }
        }
    }
    panic!("login did not finish in 4 rounds")
}

/// One logged-in connection: the machine, the driver's launcher and the
/// writer queue it fills, and the test's clock.
struct Conn {
    session: Arc<Session>,
    machine: ConnMachine,
    launcher: Launcher,
    wire: mpsc::Receiver<Outgoing>,
    now: Instant,
    cmd_sn: u32,
    next_itt: u32,
}

/// A SCSI command without data on LUN 0, `cdb` padded to 16 bytes.
fn no_data_command(itt: u32, cmd_sn: u32, exp_stat_sn: u32, cdb: &[u8]) -> ScsiCommand {
    let mut full = [0; 16];
    full[..cdb.len()].copy_from_slice(cdb);
    ScsiCommand {
        immediate: false,
        final_bit: true,
        read: false,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt,
        expected_data_transfer_length: 0,
        cmd_sn,
        exp_stat_sn,
        cdb: full,
    }
}

impl Conn {
    /// A connection to the test target whose first command (a TEST UNIT
    /// READY that takes the LUN's power-on unit attention) is done.
    async fn open(keys: &[(&str, &str)]) -> Conn {
        let mut c = Self::open_on(fabric(), Some(TARGET), keys);
        let (itt, tur) = c.no_data_command(&[0; 6]);
        assert_eq!(c.feed(tur).await, None);
        let (status, _) = c.response(itt).await;
        assert_eq!(status, 0x02, "the first command hears of the power-on");
        c
    }

    fn open_on(fabric: Arc<Fabric>, target: Option<&str>, keys: &[(&str, &str)]) -> Conn {
        let (_, session, outcome) = login(&fabric, target, keys).expect("login accepted");
        Self::attach(fabric, session, outcome)
    }

    /// [`Self::open`] through an iSER login (RDMAExtensions=Yes and `keys`).
    async fn open_iser(keys: &[(&str, &str)]) -> Conn {
        let fabric = fabric();
        let phase = LoginPhase::new_iser(
            fabric.clone(),
            1,
            local(),
            rand::rngs::StdRng::seed_from_u64(2),
        );
        let mut offers = vec![("RDMAExtensions", "Yes")];
        offers.extend_from_slice(keys);
        let (_, session, outcome) =
            login_through(phase, Some(TARGET), &offers).expect("iSER login accepted");
        let mut c = Self::attach(fabric, session, outcome);
        let (itt, tur) = c.no_data_command(&[0; 6]);
        assert_eq!(c.feed(tur).await, None);
        assert_eq!(c.response(itt).await.0, 0x02, "the power-on");
        c
    }

    fn attach(
        fabric: Arc<Fabric>,
        session: Arc<Session>,
        outcome: Box<crate::iscsi::login::LoginOutcome>,
    ) -> Conn {
        let now = Instant::now();
        let machine = ConnMachine::new(
            fabric.clone(),
            session.clone(),
            session.generation(),
            &outcome,
            local(),
            None,
            now,
        );
        let (tx, wire) = mpsc::channel(1024);
        let launcher = Launcher::new(&fabric, &session, &machine, tx);
        Conn {
            cmd_sn: outcome.exp_cmd_sn,
            session,
            machine,
            launcher,
            wire,
            now,
            next_itt: 0x100,
        }
    }

    fn lu(&self) -> Arc<LogicalUnit> {
        self.session
            .target
            .as_ref()
            .unwrap()
            .luns
            .get(0)
            .unwrap()
            .clone()
    }

    /// Feeds one PDU and carries out what the machine returns, as the
    /// driver does; Some once the connection ends.
    async fn feed(&mut self, pdu: Pdu) -> Option<Stop> {
        let actions = self.machine.on_pdu(pdu, self.now);
        carry_out(&mut self.launcher, actions).await
    }

    /// Actions for one PDU, not carried out.
    fn actions(&mut self, pdu: Pdu) -> Vec<Action> {
        self.machine.on_pdu(pdu, self.now)
    }

    async fn advance(&mut self, by: Duration) -> Option<Stop> {
        self.now += by;
        let actions = self.machine.on_timeout(self.now);
        carry_out(&mut self.launcher, actions).await
    }

    /// A TEST UNIT READY, RESERVE(6) or other command without data on LUN 0.
    fn no_data_command(&mut self, cdb: &[u8]) -> (u32, Pdu) {
        let itt = self.itt();
        let cmd = no_data_command(itt, self.take_cmd_sn(), 0, cdb);
        (itt, Pdu::new(Bhs::ScsiCommand(cmd)))
    }

    fn take_cmd_sn(&mut self) -> u32 {
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.cmd_sn.wrapping_sub(1)
    }

    fn itt(&mut self) -> u32 {
        self.next_itt += 1;
        self.next_itt
    }

    /// A READ(10) or WRITE(10) of `blocks` at `lba` with `immediate` data.
    fn rw(&mut self, write: bool, lba: u32, blocks: u16, immediate: Vec<u8>) -> (u32, Pdu) {
        let itt = self.itt();
        let mut cdb = [0u8; 16];
        cdb[0] = if write { 0x2a } else { 0x28 };
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let len = u32::from(blocks) * BLOCK;
        let bhs = Bhs::ScsiCommand(ScsiCommand {
            immediate: false,
            final_bit: !write || immediate.len() as u32 == len,
            read: !write,
            write,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(0),
            itt,
            expected_data_transfer_length: len,
            cmd_sn: self.take_cmd_sn(),
            exp_stat_sn: 0,
            cdb,
        });
        (itt, Pdu::with_data(bhs, immediate))
    }

    fn data_out(
        &self,
        itt: u32,
        ttt: u32,
        data_sn: u32,
        offset: u32,
        data: &[u8],
        last: bool,
    ) -> Pdu {
        Pdu::with_data(
            Bhs::DataOut(DataOut {
                final_bit: last,
                lun: Lun::from_index(0),
                itt,
                ttt,
                exp_stat_sn: 0,
                data_sn,
                buffer_offset: offset,
            }),
            data.to_vec(),
        )
    }

    fn tmf(&mut self, function: TmfFunction, lun: u16, referenced: u32) -> (u32, Pdu) {
        let itt = self.itt();
        let pdu = Pdu::new(Bhs::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function,
            lun: Lun::from_index(lun),
            itt,
            referenced_task_tag: referenced,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            ref_cmd_sn: 0,
            exp_data_sn: 0,
        }));
        (itt, pdu)
    }

    fn logout(&mut self) -> Pdu {
        let itt = self.itt();
        Pdu::new(Bhs::LogoutRequest(LogoutRequest {
            immediate: false,
            reason: LogoutReason::CloseSession,
            itt,
            cid: 1,
            cmd_sn: self.take_cmd_sn(),
            exp_stat_sn: 0,
        }))
    }

    /// What the writer queue holds now.
    fn sent(&mut self) -> Vec<Pdu> {
        let mut out = Vec::new();
        while let Ok(o) = self.wire.try_recv() {
            match o {
                Outgoing::Pdu(p) => out.push(p),
                other => panic!("unexpected writer item {other:?}"),
            }
        }
        out
    }

    /// Everything queued until nothing more comes for `quiet`.
    async fn sent_until_quiet(&mut self, quiet: Duration) -> Vec<Pdu> {
        let mut out = Vec::new();
        while let Ok(Some(o)) = tokio::time::timeout(quiet, self.wire.recv()).await {
            match o {
                Outgoing::Pdu(p) => out.push(p),
                other => panic!("unexpected writer item {other:?}"),
            }
        }
        out
    }

    /// The SCSI Response of `itt` (waiting for the command to finish).
    async fn response(&mut self, itt: u32) -> (u8, Vec<Pdu>) {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let o = tokio::time::timeout_at(deadline, self.wire.recv())
                .await
                .expect("a response in time")
                .expect("writer queue open");
            let Outgoing::Pdu(p) = o else { continue };
            let status = status_of(std::slice::from_ref(&p), itt);
            got.push(p);
            if let Some(s) = status {
                return (s, got);
            }
        }
    }
}

fn tmf_response(pdus: &[Pdu], itt: u32) -> TmfResponse {
    pdus.iter()
        .find_map(|p| match p.bhs {
            Bhs::TaskMgmtResponse(r) if r.itt == itt => Some(r.response),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no task management response for {itt:#x} in {pdus:?}"))
}

/// Whether any PDU in `pdus` answers task `itt`.
fn mentions(pdus: &[Pdu], itt: u32) -> bool {
    pdus.iter().any(|p| match p.bhs {
        Bhs::ScsiResponse(r) => r.itt == itt,
        Bhs::DataIn(d) => d.itt == itt,
        Bhs::R2t(r) => r.itt == itt,
        _ => false,
    })
}

/// The status `itt` ended with, if one of `pdus` carries it (a SCSI
/// Response, or a Data-In with the S bit).
fn status_of(pdus: &[Pdu], itt: u32) -> Option<u8> {
    pdus.iter().find_map(|p| match &p.bhs {
        Bhs::ScsiResponse(r) if r.itt == itt => Some(r.status),
        Bhs::DataIn(d) if d.itt == itt => d.status,
        _ => None,
    })
}

fn r2ts(pdus: &[Pdu]) -> Vec<blockwire_pdu::pdu::R2t> {
    pdus.iter()
        .filter_map(|p| match p.bhs {
            Bhs::R2t(r) => Some(r),
            _ => None,
        })
        .collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Reads `blocks` at `lba` back through the machine.
async fn read_back(c: &mut Conn, lba: u32, blocks: u16) -> Vec<u8> {
    let (itt, pdu) = c.rw(false, lba, blocks, Vec::new());
    assert_eq!(c.feed(pdu).await, None);
    let (status, pdus) = c.response(itt).await;
    assert_eq!(status, 0, "READ GOOD");
    let mut data = vec![0u8; usize::from(blocks) * BLOCK as usize];
    for p in pdus {
        if let Bhs::DataIn(d) = p.bhs {
            let at = d.buffer_offset as usize;
            data[at..at + p.data.len()].copy_from_slice(&p.data);
        }
    }
    data
}

/// The data segment lengths of the Data-In PDUs a READ of `blocks` at
/// LBA 0 brings, checking the data against `want`.
async fn data_in_segments(c: &mut Conn, blocks: u16, want: &[u8]) -> Vec<usize> {
    let (itt, pdu) = c.rw(false, 0, blocks, Vec::new());
    assert_eq!(c.feed(pdu).await, None);
    let (status, pdus) = c.response(itt).await;
    assert_eq!(status, 0, "READ GOOD");
    let mut data = vec![0u8; want.len()];
    let mut segments = Vec::new();
    for p in pdus {
        if let Bhs::DataIn(d) = p.bhs {
            let at = d.buffer_offset as usize;
            data[at..at + p.data.len()].copy_from_slice(&p.data);
            segments.push(p.data.len());
        }
    }
    assert_eq!(data, want, "the READ brought the data written");
    segments
}

#[tokio::test]
async fn a_max_recv_data_segment_length_declared_in_a_text_exchange_cuts_the_data_in() {
    let mut c = Conn::open(&[("MaxRecvDataSegmentLength", "65536")]).await;
    let data = pattern(128 * BLOCK as usize, 9);
    // 64 KiB: all of it fits the first burst, as immediate data.
    let (itt, pdu) = c.rw(true, 0, 128, data.clone());
    assert_eq!(c.feed(pdu).await, None);
    assert_eq!(c.response(itt).await.0, 0, "WRITE GOOD");
    let at_login = data_in_segments(&mut c, 128, &data).await;
    assert!(at_login.iter().all(|&n| n <= 65536), "{at_login:?}");
    assert!(at_login.iter().any(|&n| n > 4096), "{at_login:?}");

    // RFC 7143 §13.12: the initiator may declare a new
    // MaxRecvDataSegmentLength in full feature phase, by a Text Request.
    let itt = c.itt();
    let text = text_request(&mut c, itt, &[("MaxRecvDataSegmentLength", "4096")]);
    assert_eq!(c.feed(text).await, None);
    let answered = c.sent();
    assert!(
        answered
            .iter()
            .any(|p| matches!(p.bhs, Bhs::TextResponse(r) if r.itt == itt && r.final_bit)),
        "{answered:?}"
    );
    let after = data_in_segments(&mut c, 128, &data).await;
    assert!(
        after.iter().all(|&n| n <= 4096),
        "Data-In past the new limit: {after:?}"
    );
}

// ---- login and the hand-off ------------------------------------------------

#[tokio::test]
async fn login_hands_off_a_session_to_the_full_feature_phase() {
    let fabric = fabric();
    let (response, session, outcome) = login(&fabric, Some(TARGET), &[]).expect("accepted");
    let Bhs::LoginResponse(r) = response.bhs else {
        panic!("final answer is a Login Response")
    };
    assert!(r.transit && r.nsg == Stage::FullFeature, "{r:?}");
    assert_eq!(r.status, LoginStatus::SUCCESS);
    assert_ne!(r.tsih, 0, "the new session's TSIH");
    assert_eq!(r.tsih, session.tsih);
    assert_eq!(
        r.max_cmd_sn,
        outcome.exp_cmd_sn + fabric.settings.queue_depth - 1,
        "the window opens at the configured depth"
    );
    assert_eq!(
        fabric.sessions.all().len(),
        1,
        "attached to the session table"
    );

    // Full feature phase: a NOP-Out ping comes back with its data.
    let generation = session.generation();
    let mut machine = ConnMachine::new(
        fabric.clone(),
        session,
        generation,
        &outcome,
        local(),
        None,
        Instant::now(),
    );
    let ping = Pdu::with_data(
        Bhs::NopOut(NopOut {
            immediate: true,
            lun: Lun::default(),
            itt: 9,
            ttt: RESERVED_TAG,
            cmd_sn: outcome.exp_cmd_sn,
            exp_stat_sn: 0,
        }),
        b"echo".to_vec(),
    );
    let actions = machine.on_pdu(ping, Instant::now());
    match &actions[..] {
        [Action::Send(p)] => {
            assert!(matches!(p.bhs, Bhs::NopIn(n) if n.itt == 9 && n.ttt == RESERVED_TAG));
            assert_eq!(&p.data[..], b"echo");
        }
        other => panic!("{other:?}"),
    }
}

/// RFC 7145 §6.3: on an iSER connection (RDMAExtensions=Yes) the digests are
/// None: the RDMA fabric's own CRC protects the data. An initiator that offers
/// CRC32C gets None, never a digest.
#[tokio::test]
async fn iser_login_answers_none_to_offered_digests() {
    let fabric = fabric();
    let iser = || {
        LoginPhase::new_iser(
            fabric.clone(),
            1,
            local(),
            rand::rngs::StdRng::seed_from_u64(2),
        )
    };
    let offers = [
        ("RDMAExtensions", "Yes"),
        ("HeaderDigest", "CRC32C,None"),
        ("DataDigest", "CRC32C,None"),
    ];
    let (_, _, outcome) = login_through(iser(), Some(TARGET), &offers).expect("accepted");
    assert!(outcome.params.rdma_extensions, "RDMAExtensions=Yes");
    assert_eq!(
        outcome.params.header_digest,
        blockwire_pdu::keys::Digest::None
    );
    assert_eq!(
        outcome.params.data_digest,
        blockwire_pdu::keys::Digest::None
    );
    // Insisting on CRC32C leaves no common value: never a session with digests.
    let insist = [
        ("RDMAExtensions", "Yes"),
        ("HeaderDigest", "CRC32C"),
        ("DataDigest", "CRC32C"),
    ];
    match login_through(iser(), Some(TARGET), &insist) {
        Err(_) => {}
        Ok((response, _, outcome)) => {
            let answers = blockwire_pdu::keys::parse_text(&response.data).unwrap();
            assert_eq!(
                outcome.params.header_digest,
                blockwire_pdu::keys::Digest::None,
                "{answers:?}"
            );
            assert_eq!(
                outcome.params.data_digest,
                blockwire_pdu::keys::Digest::None,
                "{answers:?}"
            );
        }
    }
    // The same offers over TCP get CRC32C: the refusal is iSER's alone.
    let (_, _, outcome) = login(&fabric, Some(TARGET), &offers[1..]).expect("accepted");
    assert_eq!(
        outcome.params.header_digest,
        blockwire_pdu::keys::Digest::Crc32c
    );
}

/// A target `name` of a live change: portal group 1, access as `acl`, the
/// LUNs of `old`'s first target.
fn served_as(old: &Catalog, name: &str, acl: Acl) -> Arc<crate::iscsi::catalog::TargetEntry> {
    Arc::new(crate::iscsi::catalog::TargetEntry {
        name: name.into(),
        alias: None,
        portal_groups: vec![1],
        acl,
        auth: Default::default(),
        luns: old.targets[0].luns.clone(),
        data_paths: Vec::new(),
        qos: Vec::new(),
    })
}

/// A live change that lands while a login is under way is held against
/// it when it ends: the login was admitted against what was served when
/// its connection came, and went on to a session the change never closed
/// (one to a removed target still reached that target's LUNs).
#[tokio::test]
async fn a_login_under_way_meets_a_live_change_when_it_ends() {
    let served = |targets| {
        Arc::new(Catalog {
            portal_groups: fabric().catalog().portal_groups.clone(),
            targets,
            discovery_auth: Default::default(),
        })
    };
    for (change, status) in [
        (
            "the initiator taken off the access list",
            LoginStatus::AUTHORIZATION_FAILURE,
        ),
        ("the target removed", LoginStatus::TARGET_REMOVED),
    ] {
        let fabric = fabric();
        let mut phase = LoginPhase::new(
            fabric.clone(),
            1,
            local(),
            rand::rngs::StdRng::seed_from_u64(1),
        );
        let security = [
            ("InitiatorName", INITIATOR),
            ("AuthMethod", "None"),
            ("SessionType", "Normal"),
            ("TargetName", TARGET),
        ];
        let first = phase.on_pdu(&login_pdu(Stage::Security, Stage::Operational, &security));
        assert!(matches!(first, LoginAction::Respond(_)), "{change}");
        let old = fabric.catalog();
        let targets = match status {
            LoginStatus::TARGET_REMOVED => Vec::new(),
            _ => vec![served_as(
                &old,
                TARGET,
                Acl::Only(vec!["iqn.2026-11.test:other".into()]),
            )],
        };
        fabric.replace_catalog(served(targets));
        let mut request = login_pdu(Stage::Operational, Stage::FullFeature, &[]);
        let last = loop {
            match phase.on_pdu(&request) {
                // The target's own offers: agreed to, as `login_through` does.
                LoginAction::Respond(p) => {
                    let offered = blockwire_pdu::keys::parse_text(&p.data).unwrap();
                    let pairs: Vec<(&str, &str)> = offered
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    request = login_pdu(Stage::Operational, Stage::FullFeature, &pairs);
                }
                other => break other,
            }
        };
        match last {
            LoginAction::Refuse(p) => match p.bhs {
                Bhs::LoginResponse(r) => assert_eq!(r.status, status, "{change}"),
                other => panic!("{change}: {other:?}"),
            },
            LoginAction::LoggedIn { .. } => panic!("{change}: logged in all the same"),
            LoginAction::Respond(p) => panic!("{change}: {p:?}"),
        }
        assert!(fabric.sessions.all().is_empty(), "{change}");
    }
}

#[tokio::test]
async fn login_refusals_name_their_status() {
    let fabric = fabric();
    let refused = |r: Result<_, Pdu>| match r {
        Err(p) => match p.bhs {
            Bhs::LoginResponse(r) => r.status,
            other => panic!("{other:?}"),
        },
        Ok(_) => panic!("login accepted"),
    };
    assert_eq!(
        refused(login(&fabric, Some("iqn.2026-11.test:nope"), &[])),
        LoginStatus::NOT_FOUND
    );
    // A target that insists on CRC32C refuses an initiator that offers None.
    let mut strict = fabric.settings.clone();
    strict.require_header_digest = true;
    let (_, rx) = watch::channel(false);
    let strict = Fabric::new(fabric.catalog(), strict, rx);
    let status = refused(login(&strict, Some(TARGET), &[("HeaderDigest", "None")]));
    assert_eq!(status.class, 2, "an initiator error: {status:?}");
    assert!(strict.sessions.all().is_empty(), "no session left behind");
    // A non-login PDU during login.
    let mut phase = LoginPhase::new(
        fabric.clone(),
        1,
        local(),
        rand::rngs::StdRng::seed_from_u64(2),
    );
    let nop = Pdu::new(Bhs::NopOut(NopOut {
        immediate: true,
        lun: Lun::default(),
        itt: 1,
        ttt: RESERVED_TAG,
        cmd_sn: 0,
        exp_stat_sn: 0,
    }));
    assert!(matches!(phase.on_pdu(&nop), LoginAction::Refuse(_)));
}

/// Sends a NOP-Out ping of `len` bytes under `itt` in its CmdSN turn and
/// checks the answer: the data echoed in a NOP-In when `echoed`, else a
/// Reject (protocol error).
async fn ping_answered(c: &mut Conn, itt: u32, len: usize, echoed: bool) {
    let cmd_sn = c.take_cmd_sn();
    let ping = Pdu::with_data(
        Bhs::NopOut(NopOut {
            immediate: false,
            lun: Lun::default(),
            itt,
            ttt: RESERVED_TAG,
            cmd_sn,
            exp_stat_sn: 0,
        }),
        vec![0x5a; len],
    );
    assert_eq!(c.feed(ping).await, None);
    match &c.sent()[..] {
        [Pdu {
            bhs: Bhs::NopIn(n),
            data,
            ..
        }] if echoed => assert_eq!((n.itt, data.len()), (itt, len)),
        [Pdu {
            bhs: Bhs::Reject(r),
            ..
        }] if !echoed => assert_eq!(r.reason, RejectReason::ProtocolError),
        other => panic!("{len} bytes of ping data answered {other:?}"),
    }
}

/// Ping data comes back in a NOP-In, whose data segment the initiator's
/// MaxRecvDataSegmentLength bounds: within it the data is echoed; past it
/// the NOP-Out is rejected (as LIO does), never answered with a PDU the
/// initiator must take as a protocol error. Its CmdSN is taken either way.
#[tokio::test]
async fn ping_data_past_the_initiators_segment_length_is_rejected() {
    let mut c = Conn::open(&[("MaxRecvDataSegmentLength", "8192")]).await;
    for (itt, len, echoed) in [(0x70, 8192, true), (0x71, 8193, false), (0x72, 16, true)] {
        ping_answered(&mut c, itt, len, echoed).await;
    }
    // No CmdSN gap: the next command runs.
    let (itt, tur) = c.no_data_command(&[0; 6]);
    assert_eq!(c.feed(tur).await, None);
    assert_eq!(c.response(itt).await.0, 0);
}

/// On iSER the echo lands in a buffer of the initiator's
/// InitiatorRecvDataSegmentLength (RFC 7145 §6.3), which MaxRecvDataSegmentLength
/// does not bound: ping data past it is rejected there.
#[tokio::test]
async fn iser_ping_data_past_the_initiators_receive_buffers_is_rejected() {
    let mut c = Conn::open_iser(&[("InitiatorRecvDataSegmentLength", "4096")]).await;
    for (itt, len, echoed) in [(0x80, 4096, true), (0x81, 4097, false)] {
        ping_answered(&mut c, itt, len, echoed).await;
    }
}

/// Closing a connection the session does not have is answered "CID not
/// found" (RFC 7143 §11.15.1); the session and this connection go on.
/// Closing this one, by its CID, ends it.
#[tokio::test]
async fn a_logout_of_another_connection_is_cid_not_found() {
    let mut c = Conn::open(&[]).await;
    for (cid, code) in [
        (7, LogoutResponseCode::CidNotFound),
        (1, LogoutResponseCode::Closed),
    ] {
        let itt = c.itt();
        let logout = Pdu::new(Bhs::LogoutRequest(LogoutRequest {
            immediate: false,
            reason: LogoutReason::CloseConnection,
            itt,
            cid,
            cmd_sn: c.take_cmd_sn(),
            exp_stat_sn: 0,
        }));
        let end = c.feed(logout).await;
        let answered = c.sent().iter().find_map(|p| match p.bhs {
            Bhs::LogoutResponse(r) if r.itt == itt => Some(r.response),
            _ => None,
        });
        assert_eq!(answered, Some(code), "CID {cid}");
        if code == LogoutResponseCode::CidNotFound {
            assert_eq!(end, None, "the connection goes on");
            let (itt, tur) = c.no_data_command(&[0; 6]);
            assert_eq!(c.feed(tur).await, None);
            assert_eq!(c.response(itt).await.0, 0);
        } else {
            assert!(end.is_some(), "closed");
        }
    }
}

// ---- full feature phase: commands and the CmdSN window ----------------------

#[tokio::test]
async fn write_with_immediate_data_then_read_back() {
    let mut c = Conn::open(&[]).await;
    let data = pattern(4 * BLOCK as usize, 3);
    let (itt, pdu) = c.rw(true, 8, 4, data.clone());
    // All of the data came in the command PDU: the command runs on those
    // very bytes, not on a copy.
    let data_at = pdu.data.as_ptr();
    let actions = c.actions(pdu);
    let run = actions
        .iter()
        .find_map(|a| match a {
            Action::Run(r) => Some(r),
            _ => None,
        })
        .expect("the WRITE runs at once");
    assert_eq!(run.data_out.as_ptr(), data_at, "immediate data copied");
    carry_out(&mut c.launcher, actions).await;
    let (status, pdus) = c.response(itt).await;
    assert_eq!(status, 0);
    assert!(r2ts(&pdus).is_empty(), "all the data came immediate");
    assert_eq!(read_back(&mut c, 8, 4).await, data);
    assert_eq!(c.machine.shared().in_flight(), 0, "both slots freed");
}

#[tokio::test]
async fn out_of_order_cmd_sn_waits_and_outside_the_window_is_dropped() {
    let mut c = Conn::open(&[]).await;
    let (first, p1) = c.rw(false, 0, 1, Vec::new());
    let (second, p2) = c.rw(false, 1, 1, Vec::new());
    // The second arrives first: held until the first fills the gap.
    assert!(c.actions(p2).is_empty(), "CmdSN ahead of ExpCmdSN waits");
    let actions = c.actions(p1);
    let ran: Vec<u32> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Run(r) => Some(r.cmd.itt),
            _ => None,
        })
        .collect();
    assert_eq!(ran, vec![first, second], "delivered in CmdSN order");
    carry_out(&mut c.launcher, actions).await;
    c.response(first).await;
    // Far outside the window: dropped without an answer.
    let (_, mut stray) = c.rw(false, 0, 1, Vec::new());
    if let Bhs::ScsiCommand(ref mut s) = stray.bhs {
        s.cmd_sn = s.cmd_sn.wrapping_add(1000);
    }
    assert!(c.actions(stray).is_empty());
}

#[tokio::test]
async fn r2t_sequence_within_max_burst_and_outstanding_r2t() {
    r2t_sequence_from_tag(1).await;
}

/// The Target Transfer Tags of a connection's R2Ts wrap past FFFFFFFFh,
/// which says "no tag" (RFC 7143 §11.8): a Data-Out that echoed it would
/// be taken as unsolicited data, and the WRITE would fail.
#[tokio::test]
async fn r2t_tags_wrap_around_the_reserved_tag() {
    r2t_sequence_from_tag(0xffff_fffc).await;
}

/// A 4 KiB WRITE in bursts of 1 KiB, two R2Ts outstanding; the
/// connection's last Target Transfer Tag given is `last_ttt`.
async fn r2t_sequence_from_tag(last_ttt: u32) {
    let keys = [
        ("InitialR2T", "Yes"),
        ("ImmediateData", "No"),
        ("MaxBurstLength", "1024"),
        ("FirstBurstLength", "512"),
        ("MaxOutstandingR2T", "2"),
    ];
    let mut c = Conn::open(&keys).await;
    c.machine.next_ttt = last_ttt;
    let data = pattern(8 * BLOCK as usize, 9);
    let (itt, cmd) = c.rw(true, 100, 8, Vec::new());
    assert_eq!(c.feed(cmd).await, None);
    let mut asked = r2ts(&c.sent());
    assert_eq!(asked.len(), 2, "MaxOutstandingR2T R2Ts at a time");
    let mut seen_ttt = std::collections::HashSet::new();
    let mut next_r2t_sn = 0;
    let mut answered = 0;
    let mut early_status = None;
    while let Some(r) = asked.first().copied() {
        asked.remove(0);
        assert_eq!(r.itt, itt);
        assert_eq!(r.r2t_sn, next_r2t_sn, "R2TSN counts from 0");
        next_r2t_sn += 1;
        assert!(
            r.desired_data_transfer_length <= 1024,
            "within MaxBurstLength"
        );
        assert!(
            r.ttt != RESERVED_TAG && seen_ttt.insert(r.ttt),
            "fresh TTT per R2T"
        );
        let (at, len) = (
            r.buffer_offset as usize,
            r.desired_data_transfer_length as usize,
        );
        // Each burst in two Data-Out PDUs, DataSN from 0 per burst.
        let half = len / 2;
        let p1 = c.data_out(itt, r.ttt, 0, at as u32, &data[at..at + half], false);
        let p2 = c.data_out(
            itt,
            r.ttt,
            1,
            (at + half) as u32,
            &data[at + half..at + len],
            true,
        );
        assert_eq!(c.feed(p1).await, None);
        assert_eq!(c.feed(p2).await, None);
        answered += 1;
        let sent = c.sent();
        asked.extend(r2ts(&sent));
        // The last burst completes the command, which may be answered at
        // once (a small WRITE to memory runs on the connection's reader).
        early_status = early_status.or_else(|| status_of(&sent, itt));
    }
    assert_eq!(answered, 4, "4 KiB in bursts of 1 KiB");
    let status = match early_status {
        Some(s) => s,
        None => c.response(itt).await.0,
    };
    assert_eq!(status, 0);
    assert_eq!(read_back(&mut c, 100, 8).await, data);
}

#[tokio::test]
async fn data_pdu_in_order_no_takes_a_burst_in_any_order() {
    let keys = [
        ("InitialR2T", "Yes"),
        ("ImmediateData", "No"),
        ("DataPDUInOrder", "No"),
        ("DataSequenceInOrder", "Yes"),
    ];
    let mut c = Conn::open(&keys).await;
    assert!(!c.machine.data_pdu_in_order(), "No was accepted");
    let data = pattern(4 * BLOCK as usize, 21);
    let (itt, cmd) = c.rw(true, 40, 4, Vec::new());
    c.feed(cmd).await;
    let r = r2ts(&c.sent())[0];
    assert_eq!(r.desired_data_transfer_length, 4 * BLOCK);
    // Last block first, the final bit on the last PDU sent.
    let order = [3u32, 1, 0, 2];
    for (sn, &blk) in order.iter().enumerate() {
        let at = (blk * BLOCK) as usize;
        let p = c.data_out(
            itt,
            r.ttt,
            sn as u32,
            blk * BLOCK,
            &data[at..at + BLOCK as usize],
            sn == 3,
        );
        assert_eq!(c.feed(p).await, None);
    }
    assert_eq!(c.response(itt).await.0, 0);
    assert_eq!(read_back(&mut c, 40, 4).await, data);
}

#[tokio::test]
async fn data_pdu_in_order_yes_fails_a_command_whose_data_jumps() {
    let keys = [
        ("InitialR2T", "Yes"),
        ("ImmediateData", "No"),
        ("DataPDUInOrder", "Yes"),
    ];
    let mut c = Conn::open(&keys).await;
    let data = pattern(2 * BLOCK as usize, 5);
    let (itt, cmd) = c.rw(true, 60, 2, Vec::new());
    c.feed(cmd).await;
    let r = r2ts(&c.sent())[0];
    let p = c.data_out(itt, r.ttt, 0, BLOCK, &data[BLOCK as usize..], true);
    assert_eq!(c.feed(p).await, None, "the connection stays up");
    let (status, pdus) = c.response(itt).await;
    assert_eq!(status, 0x02, "CHECK CONDITION");
    let sense = &pdus.last().unwrap().data;
    assert_eq!(
        (sense[2 + 2] & 0x0f, sense[2 + 12]),
        (0x0b, 0x4b),
        "ABORTED COMMAND, DATA PHASE ERROR"
    );
    // ExpDataSN counts the R2T sent for it (RFC 7143 §11.4.8).
    let Bhs::ScsiResponse(resp) = pdus.last().unwrap().bhs else {
        panic!("a SCSI Response ends the command: {pdus:?}")
    };
    assert_eq!(resp.exp_data_sn, 1, "ExpDataSN after one R2T");
    assert_eq!(c.machine.collecting(), 0);
    assert_eq!(c.machine.shared().in_flight(), 0);
}

// ---- task management ----------------------------------------------------------

/// Starts a READ the stalled LUN holds; returns its ITT.
async fn held_read(c: &mut Conn) -> u32 {
    c.lu().set_stalled(true);
    let (itt, pdu) = c.rw(false, 0, 1, Vec::new());
    assert_eq!(c.feed(pdu).await, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.lu().held_commands() == 0 {
        assert!(Instant::now() < deadline, "the READ reached the stall gate");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    itt
}

/// Immediate commands bypass the CmdSN window, so nothing else bounds how
/// many an initiator has the target hold: past the session's depth each is
/// answered TASK SET FULL, and those within it run as usual.
#[tokio::test]
async fn immediate_commands_past_the_depth_are_told_task_set_full() {
    let mut c = Conn::open(&[]).await;
    c.lu().set_stalled(true);
    let depth = c.machine.fabric.settings.queue_depth as usize;
    let mut itts = Vec::new();
    for _ in 0..depth + 3 {
        let (itt, mut pdu) = c.rw(false, 0, 1, Vec::new());
        // An immediate command does not advance CmdSN (RFC 7143 §3.2.2.1).
        c.cmd_sn = c.cmd_sn.wrapping_sub(1);
        let Bhs::ScsiCommand(cmd) = &mut pdu.bhs else {
            unreachable!("rw makes a SCSI Command")
        };
        cmd.immediate = true;
        assert_eq!(c.feed(pdu).await, None);
        itts.push(itt);
    }
    let sent = c.sent_until_quiet(Duration::from_millis(300)).await;
    for &itt in &itts[..depth] {
        assert_eq!(
            status_of(&sent, itt),
            None,
            "ITT {itt} is held, not refused"
        );
    }
    for &itt in &itts[depth..] {
        assert_eq!(
            status_of(&sent, itt),
            Some(0x28),
            "ITT {itt}: TASK SET FULL"
        );
    }
    c.lu().set_stalled(false);
    let sent = c.sent_until_quiet(Duration::from_millis(300)).await;
    for &itt in &itts[..depth] {
        assert_eq!(status_of(&sent, itt), Some(0), "ITT {itt} ran");
    }
    assert_eq!(c.machine.shared().in_flight(), 0);
}

/// With an Expected Data Transfer Length, R or W must say which way the
/// data go (RFC 7143 §11.3.1): a WRITE sent with neither was answered GOOD
/// with nothing written, and a command with both (bidirectional, not
/// served) was answered as one way. Both are rejected now; nothing is
/// written.
#[tokio::test]
async fn a_command_with_data_and_neither_or_both_directions_is_rejected() {
    let mut c = Conn::open(&[]).await;
    for (read, write) in [(false, false), (true, true)] {
        let (_, mut pdu) = c.rw(true, 0, 1, vec![0xab; BLOCK as usize]);
        let Bhs::ScsiCommand(cmd) = &mut pdu.bhs else {
            unreachable!("rw makes a SCSI Command")
        };
        (cmd.read, cmd.write) = (read, write);
        c.feed(pdu).await;
        let sent = c.sent();
        assert!(
            matches!(&sent[..], [Pdu { bhs: Bhs::Reject(r), .. }] if r.reason == RejectReason::ProtocolError),
            "R={read} W={write}: {sent:?}"
        );
    }
    let (itt, pdu) = c.rw(false, 0, 1, Vec::new());
    c.feed(pdu).await;
    let sent = c.sent_until_quiet(Duration::from_millis(300)).await;
    let data: Vec<u8> = sent
        .iter()
        .filter(|p| matches!(&p.bhs, Bhs::DataIn(d) if d.itt == itt))
        .flat_map(|p| p.data.iter().copied())
        .collect();
    assert_eq!(data, vec![0; BLOCK as usize], "nothing was written");
}

/// A task is known by its Initiator Task Tag session-wide (RFC 7143
/// §11.2.1.8): a command naming the reserved tag, or the tag of a task
/// still running, is rejected, and the running task still answers.
#[tokio::test]
async fn a_command_under_the_reserved_tag_or_a_running_tasks_tag_is_rejected() {
    fn retagged(mut pdu: Pdu, itt: u32) -> Pdu {
        let Bhs::ScsiCommand(cmd) = &mut pdu.bhs else {
            unreachable!("rw makes a SCSI Command")
        };
        cmd.itt = itt;
        pdu
    }
    let rejected = |sent: &[Pdu]| match sent {
        [Pdu {
            bhs: Bhs::Reject(r),
            ..
        }] => Some(r.reason),
        _ => None,
    };
    let mut c = Conn::open(&[]).await;
    let (_, pdu) = c.rw(false, 0, 1, Vec::new());
    c.feed(retagged(pdu, RESERVED_TAG)).await;
    assert_eq!(
        rejected(&c.sent()),
        Some(RejectReason::InvalidPduField),
        "a command under ITT 0xffffffff"
    );
    let running = held_read(&mut c).await;
    let (_, pdu) = c.rw(false, 8, 1, Vec::new());
    c.feed(retagged(pdu, running)).await;
    let second = rejected(&c.sent());
    // Unstalled before the assertion: a failing one must not leave the held
    // READ's thread blocking the runtime's shutdown.
    c.lu().set_stalled(false);
    assert_eq!(
        second,
        Some(RejectReason::TaskInProgress),
        "a second command under a running task's ITT"
    );
    let sent = c.sent_until_quiet(Duration::from_millis(300)).await;
    assert_eq!(
        status_of(&sent, running),
        Some(0),
        "the running READ answers"
    );
    assert_eq!(c.machine.shared().in_flight(), 0, "the window is whole");
}

#[tokio::test]
async fn abort_task_of_a_running_command_then_nothing_of_it_ever_leaves() {
    let mut c = Conn::open(&[]).await;
    let victim = held_read(&mut c).await;
    let (tmf, req) = c.tmf(TmfFunction::AbortTask, 0, victim);
    assert_eq!(c.feed(req).await, None);
    let before = c.sent();
    assert_eq!(tmf_response(&before, tmf), TmfResponse::FunctionComplete);
    // The race: the command is released after "Function complete" left.
    c.lu().set_stalled(false);
    let after = c.sent_until_quiet(Duration::from_millis(300)).await;
    assert!(
        !mentions(&before, victim) && !mentions(&after, victim),
        "{after:?}"
    );
    assert!(!c.session.tasks.contains(victim));
    assert_eq!(
        c.machine.shared().in_flight(),
        0,
        "its window slot came back"
    );
}

#[tokio::test]
async fn abort_task_of_a_finished_or_unknown_task_does_not_exist() {
    let mut c = Conn::open(&[]).await;
    let (done, pdu) = c.rw(false, 0, 1, Vec::new());
    c.feed(pdu).await;
    c.response(done).await;
    let (tmf, req) = c.tmf(TmfFunction::AbortTask, 0, done);
    c.feed(req).await;
    assert_eq!(tmf_response(&c.sent(), tmf), TmfResponse::TaskDoesNotExist);
    let (tmf, req) = c.tmf(TmfFunction::AbortTask, 0, 0xdead);
    c.feed(req).await;
    assert_eq!(tmf_response(&c.sent(), tmf), TmfResponse::TaskDoesNotExist);
}

#[tokio::test]
async fn abort_task_of_a_write_waiting_for_data_drops_it_unrun() {
    let mut c = Conn::open(&[("InitialR2T", "Yes"), ("ImmediateData", "No")]).await;
    let (itt, cmd) = c.rw(true, 200, 2, Vec::new());
    c.feed(cmd).await;
    let r = r2ts(&c.sent())[0];
    let (tmf, req) = c.tmf(TmfFunction::AbortTask, 0, itt);
    c.feed(req).await;
    assert_eq!(tmf_response(&c.sent(), tmf), TmfResponse::FunctionComplete);
    assert_eq!(c.machine.collecting(), 0);
    // Its data still arrives: ignored, never executed.
    let late = c.data_out(itt, r.ttt, 0, 0, &pattern(2 * BLOCK as usize, 1), true);
    let actions = c.actions(late);
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(c.machine.shared().in_flight(), 0);
    assert_eq!(
        read_back(&mut c, 200, 2).await,
        vec![0u8; 2 * BLOCK as usize],
        "nothing written"
    );
}

#[tokio::test]
async fn task_set_functions_and_resets_against_running_tasks() {
    for function in [
        TmfFunction::AbortTaskSet,
        TmfFunction::ClearTaskSet,
        TmfFunction::LogicalUnitReset,
        TmfFunction::TargetWarmReset,
    ] {
        let mut c = Conn::open(&[]).await;
        let victim = held_read(&mut c).await;
        let (tmf, req) = c.tmf(function, 0, 0);
        assert_eq!(c.feed(req).await, None, "{function:?} keeps the connection");
        let before = c.sent();
        assert_eq!(
            tmf_response(&before, tmf),
            TmfResponse::FunctionComplete,
            "{function:?}"
        );
        c.lu().set_stalled(false);
        let after = c.sent_until_quiet(Duration::from_millis(200)).await;
        assert!(
            !mentions(&after, victim),
            "{function:?}: aborted READ answered"
        );
        assert_eq!(c.machine.shared().in_flight(), 0);
    }
}

/// The I_T nexus of another session to the unit, whose commands a test
/// counts in flight by hand.
fn another_sessions_nexus() -> crate::scsi::ItNexus {
    crate::scsi::ItNexus::iscsi(
        "iqn.2024-01.test:other",
        [0x40, 0, 0, 0, 0, 9],
        "iqn.2024-01.test:t",
        1,
    )
}

/// A reset ends when every task it aborted has ended (SAM-5 6.3), other
/// sessions' included: a command of another session already in the
/// backstore when the reset came (or a pipelined WRITE's chunk writes)
/// must not reach the medium after the reset's FUNCTION COMPLETE, so the
/// response waits for it. The connection goes on meanwhile: a NOP-Out is
/// answered (an initiator would otherwise take it for dead).
#[tokio::test]
async fn a_reset_answers_after_the_commands_of_other_sessions_running_at_it() {
    for function in [TmfFunction::LogicalUnitReset, TmfFunction::TargetWarmReset] {
        let mut c = Conn::open(&[]).await;
        let lu = c.lu();
        let other = another_sessions_nexus();
        // Another session's WRITE, counted in flight on the unit.
        let entry = lu.in_flight.hold(&other);
        let (tmf, req) = c.tmf(function, 0, 0);
        let ends = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let ended = Instant::now();
            lu.in_flight.release(&other, entry);
            ended
        });
        assert_eq!(c.feed(req).await, None);
        let ping = Pdu::new(Bhs::NopOut(NopOut {
            immediate: true,
            lun: Lun::default(),
            itt: 0x7e57,
            ttt: RESERVED_TAG,
            cmd_sn: c.cmd_sn,
            exp_stat_sn: 0,
        }));
        assert_eq!(c.feed(ping).await, None);
        let mut sent = c.sent();
        let pinged = sent
            .iter()
            .any(|p| matches!(p.bhs, Bhs::NopIn(n) if n.itt == 0x7e57));
        assert!(
            pinged,
            "{function:?}: the NOP-Out answered while the reset waits"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let answered = loop {
            if sent
                .iter()
                .any(|p| matches!(p.bhs, Bhs::TaskMgmtResponse(r) if r.itt == tmf))
            {
                break Instant::now();
            }
            assert!(Instant::now() < deadline, "{function:?} never answered");
            tokio::time::sleep(Duration::from_millis(5)).await;
            sent.extend(c.sent());
        };
        let ended = ends.join().unwrap();
        assert_eq!(
            tmf_response(&sent, tmf),
            TmfResponse::FunctionComplete,
            "{function:?}"
        );
        assert!(
            answered >= ended,
            "{function:?} answered {:?} before the other session's command ended",
            ended - answered
        );
    }
}

/// A logout that comes while a reset's answer waits for other sessions'
/// commands is answered after it: nothing of the connection's tasks may
/// follow the Logout Response (RFC 7143 §11.14).
#[tokio::test]
async fn a_logout_is_answered_after_a_waiting_resets_answer() {
    let mut c = Conn::open(&[]).await;
    let lu = c.lu();
    let other = another_sessions_nexus();
    let entry = lu.in_flight.hold(&other);
    let (tmf, req) = c.tmf(TmfFunction::LogicalUnitReset, 0, 0);
    assert_eq!(c.feed(req).await, None);
    let ends = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        lu.in_flight.release(&other, entry);
    });
    let logout = c.logout();
    let actions = c.actions(logout);
    carry_out(&mut c.launcher, actions).await;
    ends.join().unwrap();
    let sent = c.sent_until_quiet(Duration::from_millis(200)).await;
    let at = |want: &dyn Fn(&Bhs) -> bool| sent.iter().position(|p| want(&p.bhs));
    let reset = at(&|b| matches!(b, Bhs::TaskMgmtResponse(r) if r.itt == tmf));
    let logout = at(&|b| matches!(b, Bhs::LogoutResponse(_)));
    assert!(
        matches!((reset, logout), (Some(r), Some(l)) if r < l),
        "the reset's answer, then the logout's: {sent:?}"
    );
}

#[tokio::test]
async fn task_management_of_a_missing_lun_and_unsupported_functions() {
    let mut c = Conn::open(&[]).await;
    for (function, lun, want) in [
        (TmfFunction::AbortTaskSet, 7, TmfResponse::LunDoesNotExist),
        (TmfFunction::ClearTaskSet, 7, TmfResponse::LunDoesNotExist),
        (
            TmfFunction::LogicalUnitReset,
            7,
            TmfResponse::LunDoesNotExist,
        ),
        (TmfFunction::ClearAca, 0, TmfResponse::FunctionComplete),
        (
            TmfFunction::TaskReassign,
            0,
            TmfResponse::ReassignmentNotSupported,
        ),
    ] {
        let (tmf, req) = c.tmf(function, lun, 0);
        assert_eq!(c.feed(req).await, None);
        assert_eq!(tmf_response(&c.sent(), tmf), want, "{function:?}");
    }
}

#[tokio::test]
async fn target_cold_reset_answers_then_ends_the_connection() {
    let mut c = Conn::open(&[]).await;
    let victim = held_read(&mut c).await;
    let (tmf, req) = c.tmf(TmfFunction::TargetColdReset, 0, 0);
    let actions = c.actions(req);
    assert!(
        matches!(actions.last(), Some(Action::End(EndReason::ColdReset))),
        "{actions:?}"
    );
    assert_eq!(carry_out(&mut c.launcher, actions).await, Some(Stop::Close));
    assert_eq!(tmf_response(&c.sent(), tmf), TmfResponse::FunctionComplete);
    c.lu().set_stalled(false);
    assert!(!mentions(
        &c.sent_until_quiet(Duration::from_millis(200)).await,
        victim
    ));
}

#[tokio::test]
async fn discovery_sessions_refuse_task_management_and_scsi_commands() {
    let mut c = Conn::open_on(fabric(), None, &[]);
    let (tmf, req) = c.tmf(TmfFunction::AbortTaskSet, 0, 0);
    c.feed(req).await;
    assert_eq!(tmf_response(&c.sent(), tmf), TmfResponse::NotSupported);
    let (_, cmd) = c.rw(false, 0, 1, Vec::new());
    c.feed(cmd).await;
    let sent = c.sent();
    assert!(
        matches!(sent[..], [Pdu { bhs: Bhs::Reject(r), .. }] if r.reason == RejectReason::ProtocolError),
        "{sent:?}"
    );
}

// ---- NOP pings, shutdown and logout, with injected time ------------------------

/// A ping times out `nop_timeout` after it went, not at the next ping's
/// tick: with pings every 60 s and a 10 s timeout, a gone initiator was
/// dropped 60 s after the unanswered ping, and with a timeout just past an
/// interval, two intervals after it.
#[tokio::test]
async fn an_unanswered_ping_times_out_when_its_timeout_ends() {
    let (interval, timeout) = (Duration::from_secs(60), Duration::from_secs(10));
    let mut c = Conn::open_on(fabric_pinging(interval, timeout), Some(TARGET), &[]);
    assert_eq!(c.advance(interval).await, None);
    assert!(
        matches!(
            c.sent()[..],
            [Pdu {
                bhs: Bhs::NopIn(_),
                ..
            }]
        ),
        "the ping is due"
    );
    assert_eq!(c.machine.poll_timeout(), Some(c.now + timeout));
    assert_eq!(
        c.advance(timeout - Duration::from_millis(1)).await,
        None,
        "not timed out yet"
    );
    assert_eq!(c.advance(Duration::from_millis(1)).await, Some(Stop::Close));
}

/// A WRITE whose Data-Out stops coming ends its connection once the NOP
/// timeout (at least 30 s) has passed since its R2T or its last Data-Out,
/// and since any Data-Out came on the connection, and a second look a
/// moment later still finds it so; the write budget it held is given
/// back. Each Data-Out that brings data gives it the whole timeout again;
/// an empty one does not. An initiator that
/// answers pings but never sends a WRITE's data held its buffer and its
/// share of the budgets for the connection's life.
#[tokio::test]
async fn a_write_whose_data_out_stops_ends_its_connection_after_the_nop_timeout() {
    use super::writes::{DATA_OUT_STALL_CONFIRM, DATA_OUT_TIMEOUT_FLOOR};
    // Pings far apart, so that only the WRITE's wait can end the
    // connection; a NOP timeout under the floor.
    let fabric = fabric_pinging(Duration::from_secs(3600), Duration::from_secs(5));
    let timeout = DATA_OUT_TIMEOUT_FLOOR;
    let keys = [
        ("InitialR2T", "Yes"),
        ("ImmediateData", "No"),
        ("MaxBurstLength", "1024"),
        ("MaxOutstandingR2T", "1"),
    ];
    let open = |fabric: &Arc<Fabric>| {
        let mut c = Conn::open_on(fabric.clone(), Some(TARGET), &keys);
        async move {
            let (itt, tur) = c.no_data_command(&[0; 6]);
            assert_eq!(c.feed(tur).await, None);
            assert_eq!(c.response(itt).await.0, 0x02, "the power-on");
            c
        }
    };
    let mut c = open(&fabric).await;
    let (itt, cmd) = c.rw(true, 300, 4, Vec::new());
    assert_eq!(c.feed(cmd).await, None);
    let first = r2ts(&c.sent())[0];
    assert!(fabric.write_budget.used() > 0, "the WRITE holds its share");
    assert_eq!(c.machine.poll_timeout(), Some(c.now + timeout));
    let almost = timeout - Duration::from_millis(1);
    assert_eq!(c.advance(almost).await, None, "within the timeout");
    let burst = c.data_out(itt, first.ttt, 0, 0, &pattern(1024, 3), true);
    assert_eq!(c.feed(burst).await, None);
    let second = r2ts(&c.sent())[0];
    assert_eq!(
        c.advance(almost).await,
        None,
        "the Data-Out gave it the whole timeout again"
    );
    assert_eq!(
        c.advance(Duration::from_millis(1)).await,
        None,
        "a stall seen once"
    );
    // The Data-Out was in the socket while the driver was busy: read
    // before the second look, it keeps the connection.
    let burst = c.data_out(itt, second.ttt, 0, 1024, &pattern(1024, 5), true);
    assert_eq!(c.feed(burst).await, None);
    assert_eq!(c.response(itt).await.0, 0, "the WRITE done");
    assert_eq!(c.advance(DATA_OUT_STALL_CONFIRM).await, None);
    // Another WRITE whose data never come: an empty Data-Out brings
    // nothing, and does not restart its wait.
    let (itt, cmd) = c.rw(true, 300, 4, Vec::new());
    assert_eq!(c.feed(cmd).await, None);
    let asked = r2ts(&c.sent())[0];
    assert_eq!(c.advance(almost).await, None);
    let empty = c.data_out(itt, asked.ttt, 0, 0, &[], false);
    assert_eq!(c.feed(empty).await, None);
    assert!(c.sent().is_empty(), "the empty Data-Out is taken");
    assert_eq!(
        c.advance(Duration::from_millis(1)).await,
        None,
        "a stall seen once"
    );
    assert_eq!(
        c.advance(DATA_OUT_STALL_CONFIRM).await,
        Some(Stop::Close),
        "and seen again"
    );
    drop(c);
    assert_eq!(fabric.write_budget.used(), 0, "its share given back");

    // Two WRITEs, the initiator sending the second's data first, a burst
    // every 20 s (a slow link): the first's wait is no stall while data
    // flow, and the connection ends only once none has come for the
    // timeout.
    let mut c = open(&fabric).await;
    let (_, waiting) = c.rw(true, 300, 4, Vec::new());
    let (sent_first, cmd) = c.rw(true, 400, 16, Vec::new());
    assert_eq!(c.feed(waiting).await, None);
    assert_eq!(c.feed(cmd).await, None);
    let mut asked = r2ts(&c.sent())
        .into_iter()
        .find(|r| r.itt == sent_first)
        .expect("an R2T for the second WRITE");
    for _ in 0..3 {
        assert_eq!(c.advance(Duration::from_secs(20)).await, None, "data flow");
        let at = asked.buffer_offset;
        let burst = c.data_out(sent_first, asked.ttt, 0, at, &pattern(1024, 4), true);
        assert_eq!(c.feed(burst).await, None);
        asked = r2ts(&c.sent())[0];
    }
    assert_eq!(c.advance(timeout).await, None);
    assert_eq!(c.advance(DATA_OUT_STALL_CONFIRM).await, Some(Stop::Close));
}

#[tokio::test]
async fn unanswered_nop_in_times_out_and_an_answered_one_does_not() {
    let mut c = Conn::open(&[]).await;
    assert_eq!(c.machine.poll_timeout(), Some(c.now + NOP_INTERVAL));
    assert_eq!(
        c.advance(NOP_INTERVAL - Duration::from_millis(1)).await,
        None
    );
    assert!(c.sent().is_empty(), "not due yet");
    assert_eq!(c.advance(Duration::from_millis(1)).await, None);
    let ping = match c.sent()[..] {
        [Pdu {
            bhs: Bhs::NopIn(n), ..
        }] => n,
        ref other => panic!("{other:?}"),
    };
    assert_eq!(
        ping.itt, RESERVED_TAG,
        "a target ping wants an answer by TTT"
    );
    // Answered: the next interval sends a new ping, nothing ends.
    let answer = Pdu::new(Bhs::NopOut(NopOut {
        immediate: true,
        lun: Lun::default(),
        itt: RESERVED_TAG,
        ttt: ping.ttt,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: 0,
    }));
    assert_eq!(c.feed(answer).await, None);
    assert_eq!(c.advance(NOP_INTERVAL).await, None);
    let second = match c.sent()[..] {
        [Pdu {
            bhs: Bhs::NopIn(n), ..
        }] => n,
        ref other => panic!("{other:?}"),
    };
    assert_ne!(second.ttt, ping.ttt);
    // Unanswered: pings are not repeated while one is out, and the
    // connection ends once the NOP timeout has passed since it was sent.
    let mut waited = Duration::ZERO;
    while waited + NOP_INTERVAL < NOP_TIMEOUT {
        assert_eq!(c.advance(NOP_INTERVAL).await, None);
        waited += NOP_INTERVAL;
        assert!(c.sent().is_empty());
    }
    assert_eq!(c.advance(NOP_INTERVAL).await, Some(Stop::Close));
}

#[tokio::test]
async fn shutdown_asks_for_logout_and_closes_after_the_grace() {
    let mut c = Conn::open(&[]).await;
    let actions = c.machine.on_shutdown(c.now);
    carry_out(&mut c.launcher, actions).await;
    let msg = match c.sent()[..] {
        [Pdu {
            bhs: Bhs::AsyncMessage(m),
            ..
        }] => m,
        ref other => panic!("{other:?}"),
    };
    assert_eq!(msg.event, AsyncEvent::LogoutRequest);
    assert_eq!(u64::from(msg.parameter3), LOGOUT_GRACE.as_secs());
    assert!(c.machine.on_shutdown(c.now).is_empty(), "asked once");
    assert_eq!(c.machine.poll_timeout(), Some(c.now + LOGOUT_GRACE));
    assert_eq!(c.advance(LOGOUT_GRACE).await, Some(Stop::Close));
}

#[tokio::test]
async fn logout_with_commands_in_flight_ends_and_frees_everything() {
    let mut c = Conn::open(&[("InitialR2T", "Yes"), ("ImmediateData", "No")]).await;
    let running = held_read(&mut c).await;
    let (collecting, cmd) = c.rw(true, 300, 2, Vec::new());
    c.feed(cmd).await;
    assert_eq!(c.machine.collecting(), 1);
    let logout = c.logout();
    assert_eq!(c.feed(logout).await, Some(Stop::Close));
    let sent = c.sent();
    let resp = sent
        .iter()
        .find_map(|p| match p.bhs {
            Bhs::LogoutResponse(r) => Some(r),
            _ => None,
        })
        .expect("a Logout Response");
    assert_eq!(resp.response, LogoutResponseCode::Closed);
    // Pending commands are terminated before the Logout Response
    // (RFC 7143 §11.14); the driver then drops the machine, and with it the
    // WRITE still collecting.
    let aborted_by_logout = !c.session.tasks.contains(running);
    let shared = c.machine.shared().clone();
    let lu = c.lu();
    let Conn {
        machine,
        mut wire,
        session,
        launcher,
        ..
    } = c;
    drop(machine);
    // Unstalled before any assertion: a failing one must not leave the
    // held READ's thread blocking the runtime's shutdown.
    lu.set_stalled(false);
    assert!(
        aborted_by_logout,
        "the running READ was aborted by the logout"
    );
    let mut after = Vec::new();
    while let Ok(Some(Outgoing::Pdu(p))) =
        tokio::time::timeout(Duration::from_millis(300), wire.recv()).await
    {
        after.push(p);
    }
    assert!(
        !mentions(&after, running) && !mentions(&after, collecting),
        "{after:?}"
    );
    assert!(!session.tasks.contains(running) && !session.tasks.contains(collecting));
    assert_eq!(shared.in_flight(), 0, "every window slot came back");
    drop(launcher);
}

#[tokio::test]
async fn logout_loses_the_i_t_nexus_before_its_response_leaves() {
    let mut c = Conn::open(&[]).await;
    let (itt, reserve) = c.no_data_command(&[0x16, 0, 0, 0, 0, 0]);
    assert_eq!(c.feed(reserve).await, None);
    assert_eq!(c.response(itt).await.0, 0, "RESERVE(6) granted");
    let lu = c.lu();
    let other =
        crate::scsi::ItNexus::iscsi("iqn.2026-11.test:other", [0x80, 0, 0, 0, 0, 9], TARGET, 1);
    assert!(
        lu.reserve_spc2(&other).is_err(),
        "the session holds the unit"
    );

    let logout = c.logout();
    assert_eq!(c.feed(logout).await, Some(Stop::Close));
    assert!(
        c.sent()
            .iter()
            .any(|p| matches!(p.bhs, Bhs::LogoutResponse(_))),
        "the Logout Response is queued"
    );
    // The initiator may act on the response at once, on another session,
    // before this connection's driver has wound down.
    assert!(
        !c.machine
            .fabric
            .sessions
            .all()
            .iter()
            .any(|s| Arc::ptr_eq(s, &c.session)),
        "the session left the table"
    );
    assert!(
        lu.reserve_spc2(&other).is_ok(),
        "its RESERVE(6) went with the I_T nexus"
    );

    lu.release_spc2(&other).unwrap();

    // A new session of the same initiator port (same ISID) reserves the
    // unit; the old connection's driver then ends the old session as it
    // winds down. That must not take the new session's reservation.
    let same_port = crate::scsi::ItNexus::iscsi(INITIATOR, ISID, TARGET, 1);
    lu.reserve_spc2(&same_port).unwrap();
    let generation = c.session.generation();
    c.machine.fabric.sessions.end(&c.session, generation);
    assert!(
        lu.reserve_spc2(&other).is_err(),
        "the new session still holds the unit"
    );
}

// ---- the driver over an in-memory byte stream -----------------------------------

/// The initiator's end of a pipe.
type PipeReader = crate::iscsi::io::PduReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>;

/// Sends `pdu` and reads the next PDU (in 10 s at most).
async fn exchange<R: tokio::io::AsyncRead + Unpin>(
    writer: &mut crate::iscsi::io::PduWriter,
    reader: &mut crate::iscsi::io::PduReader<R>,
    pdu: Pdu,
) -> Pdu {
    writer.push(&pdu).await.unwrap();
    writer.flush().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), reader.next())
        .await
        .expect("an answer in time")
        .expect("a PDU")
        .expect("the stream is open")
}

/// A normal session of `fabric`'s target logged in over an in-memory pipe
/// (1 MiB each way): the driver serving it, the initiator's reader and
/// writer, the final Login Response, and the portal's cut switch (which
/// cuts the connection when dropped).
async fn log_in_over_a_pipe(
    fabric: &Arc<Fabric>,
) -> (
    tokio::task::JoinHandle<()>,
    PipeReader,
    crate::iscsi::io::PduWriter,
    blockwire_pdu::pdu::LoginResponse,
    watch::Sender<bool>,
) {
    log_in_over_a_pipe_of(fabric, 1 << 20, |_, _| AtAttach::GoOn)
        .await
        .expect("logged in")
}

/// What the initiator of [`log_in_over_a_pipe_of`] does once the target
/// attached its session.
enum AtAttach {
    /// Reads the final Login Response.
    GoOn,
    /// Hangs up: the pipe is dropped, and the driver waited for.
    HangUp,
}

/// [`log_in_over_a_pipe`] over a pipe of `pipe_bytes` each way; `at_attach`
/// runs once the target has attached the session, before the initiator
/// reads the final Login Response (which a pipe smaller than it leaves the
/// target still sending), with the portal's cut switch. None: the
/// initiator hung up there, and the driver has ended.
async fn log_in_over_a_pipe_of(
    fabric: &Arc<Fabric>,
    pipe_bytes: usize,
    at_attach: impl FnOnce(&Arc<crate::iscsi::session::Session>, &watch::Sender<bool>) -> AtAttach,
) -> Option<(
    tokio::task::JoinHandle<()>,
    PipeReader,
    crate::iscsi::io::PduWriter,
    blockwire_pdu::pdu::LoginResponse,
    watch::Sender<bool>,
)> {
    use crate::iscsi::io::{PduReader, PduWriter};
    let (client, server) = tokio::io::duplex(pipe_bytes);
    let (keep, cut) = watch::channel(false);
    let served = tokio::spawn(crate::iscsi::connection::serve_stream(
        fabric.clone(),
        server,
        1,
        local(),
        None,
        cut,
    ));
    let (rd, wr) = tokio::io::split(client);
    let mut reader = PduReader::new(rd);
    reader.framer = blockwire_pdu::FrameDecoder::new(1 << 20, Digests::NONE);
    let mut writer = PduWriter::over_stream(wr);
    let security = [
        ("InitiatorName", INITIATOR),
        ("AuthMethod", "None"),
        ("SessionType", "Normal"),
        ("TargetName", TARGET),
    ];
    let r = exchange(
        &mut writer,
        &mut reader,
        login_pdu(Stage::Security, Stage::Operational, &security),
    )
    .await;
    assert!(matches!(r.bhs, Bhs::LoginResponse(l) if l.status == LoginStatus::SUCCESS));
    let mut at_attach = Some(at_attach);
    let mut request = login_pdu(Stage::Operational, Stage::FullFeature, &[]);
    let r = loop {
        writer.push(&request).await.unwrap();
        writer.flush().await.unwrap();
        // The target takes the request in; the final one attaches the
        // session before its answer leaves.
        for _ in 0..1000 {
            if !fabric.sessions.all().is_empty() {
                break;
            }
            tokio::task::yield_now().await;
        }
        if let Some(session) = fabric.sessions.all().first() {
            if let Some(hook) = at_attach.take() {
                if let AtAttach::HangUp = hook(session, &keep) {
                    drop((reader, writer));
                    tokio::time::timeout(Duration::from_secs(10), served)
                        .await
                        .expect("the driver ends")
                        .unwrap();
                    return None;
                }
            }
        }
        let r = tokio::time::timeout(Duration::from_secs(10), reader.next())
            .await
            .expect("an answer in time")
            .expect("a PDU")
            .expect("the stream is open");
        if !matches!(r.bhs, Bhs::LoginResponse(l) if !l.transit) {
            break r;
        }
        // Accept what the target offered.
        let offered = blockwire_pdu::keys::parse_text(&r.data).unwrap();
        let pairs: Vec<(&str, &str)> = offered
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        request = login_pdu(Stage::Operational, Stage::FullFeature, &pairs);
    };
    assert!(at_attach.is_none(), "the session was never attached");
    let Bhs::LoginResponse(fin) = r.bhs else {
        panic!("{r:?}")
    };
    assert!(fin.transit && fin.nsg == Stage::FullFeature && fin.tsih != 0);
    Some((served, reader, writer, fin, keep))
}

/// A session closed (by an operator, a live change or a reinstatement)
/// after the login attached it but while its final Login Response was still
/// being sent: the connection must not take the session's next generation
/// for its own and serve commands on a session no longer in the table.
#[tokio::test]
async fn a_session_closed_before_its_full_feature_phase_serves_nothing() {
    let fabric = fabric();
    // Smaller than a Login Response's header: the target is still sending
    // the final one when the session is closed.
    let closer = fabric.clone();
    let (served, mut reader, mut writer, fin, _keep) =
        log_in_over_a_pipe_of(&fabric, 16, |session, _| {
            closer.sessions.close(session);
            AtAttach::GoOn
        })
        .await
        .expect("logged in");
    assert!(fabric.sessions.all().is_empty());
    let tur = no_data_command(9, fin.exp_cmd_sn, fin.stat_sn + 1, &[0; 6]);
    writer.push(&Pdu::new(Bhs::ScsiCommand(tur))).await.unwrap();
    let _ = writer.flush().await;
    let next = tokio::time::timeout(Duration::from_secs(10), reader.next())
        .await
        .expect("the connection ends in time");
    assert!(
        matches!(next, Ok(None) | Err(_)),
        "a closed session answered a command: {next:?}"
    );
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the driver ends")
        .unwrap();
}

/// A connection that goes after its login attached the session but before
/// its full feature phase began (the initiator hung up while the final
/// Login Response was on its way, the portal cut meanwhile or not) ends that
/// session: at ErrorRecoveryLevel 0 no other connection will. Before, the
/// session stayed in the table for good, its TSIH and I_T nexus taken, one
/// more for each such login.
#[tokio::test]
async fn a_connection_gone_before_its_full_feature_phase_ends_its_session() {
    for cut in [false, true] {
        let fabric = fabric();
        let hung_up = log_in_over_a_pipe_of(&fabric, 16, |_, keep| {
            if cut {
                keep.send_replace(true);
            }
            AtAttach::HangUp
        })
        .await;
        assert!(hung_up.is_none());
        let left: Vec<u16> = fabric.sessions.all().iter().map(|s| s.tsih).collect();
        assert!(
            left.is_empty(),
            "cut {cut}: sessions left in the table: {left:?}"
        );
    }
}

/// WRITE(10) of one block at LBA 4 on LUN 0, tag 1, the first command
/// after a TEST UNIT READY of the session `fin` logged in.
fn write_of_block_4(fin: &blockwire_pdu::pdu::LoginResponse) -> ScsiCommand {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x2a;
    cdb[5] = 4;
    cdb[8] = 1;
    ScsiCommand {
        immediate: false,
        final_bit: true,
        read: false,
        write: true,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt: 1,
        expected_data_transfer_length: BLOCK,
        cmd_sn: fin.exp_cmd_sn + 1,
        exp_stat_sn: fin.stat_sn + 1,
        cdb,
    }
}

/// A session closed (`ctl session.close`, a live change) while its WRITE
/// waits at a stalled unit: the close aborts the WRITE (its task leaves the
/// session's task set, and the unit's gate drops it), and nothing lands
/// once the unit goes on. Before, the close left the session's tasks
/// running: its connection, the generation moved on, took itself for
/// replaced and left them to a session nobody served any more, and the
/// WRITE went on into the unit after the session's I_T nexus was released
/// (where the unit, no longer knowing the nexus, took it for a new one).
#[tokio::test]
async fn a_closed_sessions_write_waiting_at_a_stalled_unit_never_lands() {
    let fabric = fabric();
    let (served, mut reader, mut writer, fin, _keep) = log_in_over_a_pipe(&fabric).await;
    let tur = no_data_command(9, fin.exp_cmd_sn, fin.stat_sn + 1, &[0; 6]);
    let r = exchange(&mut writer, &mut reader, Pdu::new(Bhs::ScsiCommand(tur))).await;
    assert!(
        matches!(r.bhs, Bhs::ScsiResponse(s) if s.status == 2),
        "{r:?}"
    );
    let luns = fabric.catalog().targets[0].luns.clone();
    luns.set_stalled(0, true).unwrap();
    let write = write_of_block_4(&fin);
    let data = pattern(BLOCK as usize, 91);
    writer
        .push(&Pdu::with_data(Bhs::ScsiCommand(write), data.clone()))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    let unit = fabric.catalog().targets[0].luns.get(0).unwrap();
    for _ in 0..500 {
        if unit.held_commands() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        unit.held_commands(),
        1,
        "the WRITE waits at the stalled unit"
    );
    let session = fabric.sessions.all()[0].clone();
    fabric.sessions.close(&session);
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the closed session's driver ends")
        .unwrap();
    // Asserted once the unit goes on: a failing test must not leave the
    // WRITE's thread held at the gate, which the runtime waits for.
    let still_a_task = session.tasks.contains(1);
    luns.set_stalled(0, false).unwrap();
    assert!(
        !still_a_task,
        "the closed session's WRITE is still a task of it"
    );
    for _ in 0..500 {
        if unit.held_commands() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Another session reads block 4 back.
    let (_served, mut reader, mut writer, fin, _keep) = log_in_over_a_pipe(&fabric).await;
    let tur = no_data_command(9, fin.exp_cmd_sn, fin.stat_sn + 1, &[0; 6]);
    let r = exchange(&mut writer, &mut reader, Pdu::new(Bhs::ScsiCommand(tur))).await;
    assert!(matches!(r.bhs, Bhs::ScsiResponse(s) if s.itt == 9), "{r:?}");
    let mut read = write;
    read.cdb[0] = 0x28;
    read.write = false;
    read.read = true;
    read.itt = 2;
    read.cmd_sn = fin.exp_cmd_sn + 1;
    read.exp_stat_sn = fin.stat_sn + 2;
    let r = exchange(&mut writer, &mut reader, Pdu::new(Bhs::ScsiCommand(read))).await;
    assert!(
        matches!(r.bhs, Bhs::DataIn(d) if d.itt == 2 && d.status == Some(0)),
        "{r:?}"
    );
    assert!(r.data[..] != data[..], "the closed session's WRITE landed");
}

/// Commands already read when the session is closed (or taken over by
/// another connection) do not run: the connection stops before carrying
/// out anything more. Before, the connection ran what it had read and
/// waited on its select for the stop, which picks among ready branches at
/// random, so a command read in the same wake-up as the close still ran
/// for a nexus already released.
#[tokio::test]
async fn commands_read_when_the_session_is_closed_do_not_run() {
    for round in 0..20 {
        let fabric = fabric();
        let (served, mut reader, mut writer, fin, _keep) = log_in_over_a_pipe(&fabric).await;
        let session = fabric.sessions.all()[0].clone();
        for (i, itt) in [9, 10].into_iter().enumerate() {
            let tur = no_data_command(itt, fin.exp_cmd_sn + i as u32, fin.stat_sn + 1, &[0; 6]);
            writer.push(&Pdu::new(Bhs::ScsiCommand(tur))).await.unwrap();
        }
        // On this one-thread runtime the target reads nothing until this
        // task waits below: it finds both commands and the close at once.
        writer.flush().await.unwrap();
        fabric.sessions.close(&session);
        let next = tokio::time::timeout(Duration::from_secs(10), reader.next())
            .await
            .expect("the connection ends in time");
        assert!(
            matches!(next, Ok(None) | Err(_)),
            "round {round}: a closed session answered a command: {next:?}"
        );
        tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("the driver ends")
            .unwrap();
    }
}

#[tokio::test]
async fn the_driver_serves_an_in_memory_byte_pipe() {
    let fabric = fabric();
    let (served, mut reader, mut writer, fin, _keep) = log_in_over_a_pipe(&fabric).await;
    // TEST UNIT READY takes the power-on unit attention; then a WRITE with
    // immediate data, then a READ of it.
    let tur = no_data_command(9, fin.exp_cmd_sn, fin.stat_sn + 1, &[0; 6]);
    let r = exchange(&mut writer, &mut reader, Pdu::new(Bhs::ScsiCommand(tur))).await;
    assert!(
        matches!(r.bhs, Bhs::ScsiResponse(s) if s.itt == 9 && s.status == 2),
        "{r:?}"
    );
    let data = pattern(BLOCK as usize, 77);
    let mut cmd = write_of_block_4(&fin);
    let r = exchange(
        &mut writer,
        &mut reader,
        Pdu::with_data(Bhs::ScsiCommand(cmd), data.clone()),
    )
    .await;
    assert!(
        matches!(r.bhs, Bhs::ScsiResponse(s) if s.itt == 1 && s.status == 0),
        "{r:?}"
    );
    cmd.cdb[0] = 0x28;
    cmd.write = false;
    cmd.read = true;
    cmd.itt = 2;
    cmd.cmd_sn += 1;
    let r = exchange(&mut writer, &mut reader, Pdu::new(Bhs::ScsiCommand(cmd))).await;
    assert!(
        matches!(r.bhs, Bhs::DataIn(d) if d.itt == 2 && d.status == Some(0)),
        "{r:?}"
    );
    assert_eq!(&r.data[..], &data[..]);
    // Logout: the answer, then the end of the stream and of the driver.
    let logout = Pdu::new(Bhs::LogoutRequest(LogoutRequest {
        immediate: false,
        reason: LogoutReason::CloseSession,
        itt: 3,
        cid: 1,
        cmd_sn: cmd.cmd_sn + 1,
        exp_stat_sn: 0,
    }));
    let r = exchange(&mut writer, &mut reader, logout).await;
    assert!(matches!(r.bhs, Bhs::LogoutResponse(l) if l.response == LogoutResponseCode::Closed));
    let end = tokio::time::timeout(Duration::from_secs(10), reader.next()).await;
    assert!(matches!(end, Ok(Ok(None))), "the target closed the stream");
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the driver returns")
        .unwrap();
    assert!(
        fabric.sessions.all().is_empty(),
        "the session ended with its connection"
    );
}

/// A fabric serving a RAM LUN 0 of `lun_bytes`, with NOP-In pings off and
/// a NOP timeout of 500 ms.
fn fabric_without_pings(lun_bytes: u64) -> Arc<Fabric> {
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(lun_bytes))));
    let catalog = Catalog::one_target(TARGET, local(), Acl::Any, Arc::new(lu));
    let settings = FabricSettings {
        queue_depth: 16,
        nop_interval: None,
        nop_timeout: Duration::from_millis(500),
        logout_grace: LOGOUT_GRACE,
        ..FabricSettings::default()
    };
    let (_, shutdown) = watch::channel(false);
    Fabric::new(Arc::new(catalog), settings, shutdown)
}

/// An initiator that sends and never reads fills the socket, then the
/// writer's queue; the connection's reader then waited on that queue for
/// good, hearing neither its NOP-In timer nor a shutdown, and the session
/// and all it held stayed. Now one that takes no data for the NOP-In
/// timeout is cut.
#[tokio::test]
async fn an_initiator_that_never_reads_is_cut_after_the_nop_timeout() {
    let fabric = fabric_without_pings(1 << 20);
    let (served, reader, mut writer, fin, _keep) = log_in_over_a_pipe(&fabric).await;
    // Pings with 8 KiB of data, each echoed: 3000 of them are 24 MiB back,
    // far more than the pipe and the writer's queue hold.
    let sender = tokio::spawn(async move {
        for itt in 100..3100u32 {
            let ping = Pdu::with_data(
                Bhs::NopOut(NopOut {
                    immediate: true,
                    lun: Lun::from_index(0),
                    itt,
                    ttt: RESERVED_TAG,
                    cmd_sn: fin.exp_cmd_sn,
                    exp_stat_sn: fin.stat_sn + 1,
                }),
                vec![0x5a; 8192],
            );
            if writer.push(&ping).await.is_err() || writer.flush().await.is_err() {
                return;
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), served)
        .await
        .expect("the driver returns once the initiator took nothing for the NOP-In timeout")
        .unwrap();
    assert!(
        fabric.sessions.all().is_empty(),
        "the session ended with its connection"
    );
    drop(reader);
    sender.abort();
}

/// With NOP-In pings off, an initiator that sends READs and then takes
/// none of their data is still cut once the writer has waited the NOP
/// timeout on it, and the READ data held for it are given back: nothing
/// else would have noticed, and the connection, its READ budget shares and
/// the data read held for good.
#[tokio::test]
async fn an_initiator_that_stops_reading_is_cut_with_pings_off() {
    let fabric = fabric_without_pings(8 << 20);
    let (served, reader, mut writer, fin, _keep) = log_in_over_a_pipe(&fabric).await;
    // Eight READs of 1 MiB: far more than the 1 MiB pipe.
    for i in 0..8u32 {
        let read = read10_over_a_pipe(&fin, i, i * 2048, 2048);
        writer.push(&read).await.unwrap();
    }
    writer.flush().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), served)
        .await
        .expect("the driver returns once the initiator took nothing for the NOP timeout")
        .unwrap();
    assert!(
        fabric.sessions.all().is_empty(),
        "the session ended with its connection"
    );
    let released = async {
        while fabric.read_data_held() != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), released)
        .await
        .expect("the READ data held given back");
    drop((reader, writer));
}

/// The writer's limit is on the initiator taking nothing, not on how long
/// a send takes: an initiator that reads a large READ's Data-In slowly but
/// steadily (a slow link), so that sending it takes several NOP timeouts,
/// gets all of it and keeps its connection.
#[tokio::test(start_paused = true)]
async fn an_initiator_reading_slowly_keeps_its_connection_however_long_a_read_takes() {
    let fabric = fabric_without_pings(1 << 20);
    // A pipe of 16 KiB: the writer waits on the reader from the start.
    let (served, mut reader, mut writer, fin, _keep) =
        log_in_over_a_pipe_of(&fabric, 16 << 10, |_, _| AtAttach::GoOn)
            .await
            .expect("logged in");
    // 512 KiB taken 8 KiB each 40 ms: about 200 KB/s, so sending it all
    // takes about five NOP timeouts (500 ms), each wait of the writer less
    // than one.
    // The session's first command is answered with its UNIT ATTENTION.
    writer
        .push(&read10_over_a_pipe(&fin, 0, 0, 1))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    let ua = reader.next().await.unwrap().unwrap();
    assert!(
        matches!(ua.bhs, Bhs::ScsiResponse(r) if r.status == 2),
        "{ua:?}"
    );
    writer
        .push(&read10_over_a_pipe(&fin, 1, 0, 1024))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    use tokio::io::AsyncReadExt;
    let mut pipe = reader.into_stream();
    let framer = blockwire_pdu::FrameDecoder::new(1 << 20, Digests::NONE);
    let started = tokio::time::Instant::now();
    let (mut bytes, mut got, mut chunk) = (Vec::new(), 0usize, [0u8; 8192]);
    let status = 'read: loop {
        let n = tokio::time::timeout(Duration::from_secs(5), pipe.read(&mut chunk))
            .await
            .expect("Data-In keep coming")
            .unwrap();
        assert_ne!(
            n, 0,
            "the connection is not cut while its initiator takes data"
        );
        bytes.extend_from_slice(&chunk[..n]);
        while let blockwire_pdu::Frame::Pdu { pdu, consumed } = framer.decode(&bytes).unwrap() {
            bytes.drain(..consumed);
            let Bhs::DataIn(d) = pdu.bhs else {
                panic!("{:?}", pdu.bhs);
            };
            assert_eq!(d.buffer_offset as usize, got, "Data-In in order");
            got += pdu.data.len();
            if let Some(status) = d.status {
                break 'read status;
            }
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    };
    assert_eq!((got, status), (512 << 10, 0), "the whole READ, GOOD");
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "sending took longer than the NOP timeout ({:?}), as the test needs",
        started.elapsed()
    );
    assert!(!served.is_finished(), "the connection is still served");
    assert_eq!(fabric.sessions.all().len(), 1, "and its session stays");
    drop((pipe, writer));
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the driver ends once the initiator hung up")
        .unwrap();
}

/// The connection's reader queues its own answers (here NOP-In echoes)
/// behind the writer; while the writer spends several NOP timeouts sending
/// one large Data-In to a slow but steady initiator, the queue fills and
/// the reader waits on it. That wait ends the connection only when the
/// writer's bytes stop moving, not when the queue has stayed full for the
/// NOP timeout.
#[tokio::test(start_paused = true)]
async fn a_reader_waiting_on_a_slow_writer_keeps_the_connection() {
    let fabric = fabric_without_pings(1 << 20);
    let (served, reader, mut writer, fin, _keep) =
        log_in_over_a_pipe_of(&fabric, 16 << 10, |_, _| AtAttach::GoOn)
            .await
            .expect("logged in");
    let mut reader = reader;
    // The session's first command is answered with its UNIT ATTENTION.
    writer
        .push(&read10_over_a_pipe(&fin, 0, 0, 1))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    let ua = reader.next().await.unwrap().unwrap();
    assert!(
        matches!(ua.bhs, Bhs::ScsiResponse(r) if r.status == 2),
        "{ua:?}"
    );
    // One READ of 512 KiB (one Data-In PDU), then 1100 pings: more echoes
    // than the writer's queue holds (1024) while it sends the READ's data.
    writer
        .push(&read10_over_a_pipe(&fin, 1, 0, 1024))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    const PINGS: u32 = 1100;
    let sender = tokio::spawn(async move {
        for itt in 0..PINGS {
            let ping = Pdu::new(Bhs::NopOut(NopOut {
                immediate: true,
                lun: Lun::from_index(0),
                itt: 0x1000 + itt,
                ttt: RESERVED_TAG,
                cmd_sn: fin.exp_cmd_sn + 2,
                exp_stat_sn: fin.stat_sn + 1,
            }));
            writer.push(&ping).await.unwrap();
        }
        writer.flush().await.unwrap();
        writer
    });
    // Taken 8 KiB each 40 ms: the READ's data alone take about five NOP
    // timeouts (500 ms).
    use tokio::io::AsyncReadExt;
    let mut pipe = reader.into_stream();
    let framer = blockwire_pdu::FrameDecoder::new(1 << 20, Digests::NONE);
    let started = tokio::time::Instant::now();
    let (mut bytes, mut chunk) = (Vec::new(), [0u8; 8192]);
    let (mut got, mut echoes) = (0usize, 0u32);
    while echoes < PINGS {
        let n = tokio::time::timeout(Duration::from_secs(5), pipe.read(&mut chunk))
            .await
            .expect("answers keep coming")
            .unwrap();
        assert_ne!(
            n, 0,
            "the connection is not cut while its initiator takes data"
        );
        bytes.extend_from_slice(&chunk[..n]);
        while let blockwire_pdu::Frame::Pdu { pdu, consumed } = framer.decode(&bytes).unwrap() {
            bytes.drain(..consumed);
            match pdu.bhs {
                Bhs::DataIn(d) => {
                    got += pdu.data.len();
                    if d.status.is_some() {
                        assert_eq!(got, 512 << 10, "the whole READ");
                    }
                }
                Bhs::NopIn(n) => {
                    assert_eq!(n.itt, 0x1000 + echoes, "echoes in order");
                    echoes += 1;
                }
                other => panic!("{other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert_eq!(got, 512 << 10);
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "sending took longer than the NOP timeout ({:?}), as the test needs",
        started.elapsed()
    );
    assert!(!served.is_finished(), "the connection is still served");
    let writer = sender.await.unwrap();
    drop((pipe, writer));
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the driver ends once the initiator hung up")
        .unwrap();
}

/// A READ(10) of `blocks` 512-byte blocks at `lba`, the `n`th command of a
/// session logged in over a pipe with `fin`.
fn read10_over_a_pipe(
    fin: &blockwire_pdu::pdu::LoginResponse,
    n: u32,
    lba: u32,
    blocks: u16,
) -> Pdu {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x28;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    Pdu::new(Bhs::ScsiCommand(ScsiCommand {
        immediate: false,
        final_bit: true,
        read: true,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt: 0x200 + n,
        expected_data_transfer_length: u32::from(blocks) * 512,
        cmd_sn: fin.exp_cmd_sn + n,
        exp_stat_sn: fin.stat_sn + 1,
        cdb,
    }))
}

#[tokio::test]
async fn decode_errors_reject_and_end_unless_skippable() {
    let mut c = Conn::open(&[]).await;
    let header = [0u8; 48];
    let skippable =
        c.machine
            .on_decode_error(&DecodeError::UnknownOpcode(0x3f), Some(&header), true);
    assert!(
        matches!(&skippable[..], [Action::Send(p)] if matches!(p.bhs, Bhs::Reject(r) if r.reason == RejectReason::CommandNotSupported)),
        "{skippable:?}"
    );
    let digest = c.machine.on_decode_error(
        &DecodeError::HeaderDigest {
            expected: 1,
            got: 2,
        },
        None,
        false,
    );
    assert!(
        matches!(&digest[..], [Action::End(EndReason::ProtocolError)]),
        "a header that failed its digest is not answered: {digest:?}"
    );
}

// ---- stateful fuzzing: random initiator behaviour against the machine --------------

mod held_writes;
mod login_deadline;

mod stateful {
    use super::*;
    use proptest::prelude::*;

    /// One thing an initiator (well-behaved or not) can do.
    #[derive(Debug, Clone)]
    enum Ev {
        Read {
            lba: u8,
            blocks: u8,
            skew: u8,
        },
        Write {
            lba: u8,
            blocks: u8,
            immediate: u8,
        },
        DataOut {
            which: u8,
            honest_ttt: bool,
            offset: u16,
            len: u16,
            data_sn: u8,
            last: bool,
        },
        Tmf {
            function: u8,
            which: u8,
            lun: u8,
        },
        AnswerPing,
        Tick {
            secs: u8,
        },
        Shutdown,
        Logout,
        Stall(bool),
        /// LUN 0's IOPS ceiling: none, 1 or 10.
        Qos(u8),
        Junk,
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            4 => (any::<u8>(), 1..8u8, 0..3u8).prop_map(|(lba, blocks, skew)| Ev::Read { lba, blocks, skew }),
            4 => (any::<u8>(), 1..8u8, any::<u8>()).prop_map(|(lba, blocks, immediate)| Ev::Write { lba, blocks, immediate }),
            5 => (any::<u8>(), any::<bool>(), 0..4096u16, 0..2048u16, 0..4u8, any::<bool>()).prop_map(
                |(which, honest_ttt, offset, len, data_sn, last)| Ev::DataOut { which, honest_ttt, offset, len, data_sn, last }),
            3 => (0..10u8, any::<u8>(), 0..2u8).prop_map(|(function, which, lun)| Ev::Tmf { function, which, lun }),
            1 => Just(Ev::AnswerPing),
            3 => (0..40u8).prop_map(|secs| Ev::Tick { secs }),
            1 => Just(Ev::Shutdown),
            1 => Just(Ev::Logout),
            1 => any::<bool>().prop_map(Ev::Stall),
            1 => (0..5u8).prop_map(Ev::Qos),
            1 => Just(Ev::Junk),
        ]
    }

    const FUNCTIONS: [TmfFunction; 9] = [
        TmfFunction::AbortTask,
        TmfFunction::AbortTaskSet,
        TmfFunction::ClearAca,
        TmfFunction::ClearTaskSet,
        TmfFunction::LogicalUnitReset,
        TmfFunction::TargetWarmReset,
        TmfFunction::TargetColdReset,
        TmfFunction::TaskReassign,
        TmfFunction::AbortTask,
    ];

    /// LUN 0's IOPS ceilings (`pick` modulo 5): none, the LUN's at 1 or 10,
    /// each initiator's at 10, or the LUN's at 10 and each initiator's at 1
    /// (commands wait at the initiator's, then at the LUN's).
    fn set_iops(c: &Conn, pick: u8) {
        let (iops, initiator_iops) = [
            (None, None),
            (Some(1), None),
            (Some(10), None),
            (None, Some(10)),
            (Some(10), Some(1)),
        ][usize::from(pick % 5)];
        c.lu().set_qos(crate::scsi::QosLimits {
            iops,
            initiator_iops,
            ..Default::default()
        });
    }

    /// Plays `evs` with LUN 0's IOPS ceiling `qos` (see [`set_iops`]) at the start,
    /// then ends the connection as the driver does, and checks what the initiator
    /// saw and what the target kept.
    async fn play(evs: Vec<Ev>, qos: u8) -> Result<(), TestCaseError> {
        let mut c = Conn::open(&[
            ("InitialR2T", "Yes"),
            ("MaxBurstLength", "2048"),
            ("FirstBurstLength", "1024"),
        ])
        .await;
        set_iops(&c, qos);
        let depth = c.machine.fabric.settings.queue_depth;
        let mut wire: Vec<Pdu> = Vec::new();
        let mut cmds: Vec<u32> = Vec::new();
        let mut writes: Vec<u32> = Vec::new();
        let mut tmfs: Vec<u32> = Vec::new();
        // ABORT TASKs answered "Function complete": (TMF ITT, aborted ITT).
        let mut aborted: Vec<(u32, u32)> = Vec::new();
        let mut ping_ttt = None;
        for e in evs {
            let actions = match e {
                Ev::Read { lba, blocks, skew } => {
                    let (itt, mut pdu) = c.rw(false, u32::from(lba), u16::from(blocks), Vec::new());
                    if let Bhs::ScsiCommand(ref mut s) = pdu.bhs {
                        // CmdSN ahead of its turn, or a duplicate of an old one.
                        s.cmd_sn = s
                            .cmd_sn
                            .wrapping_add(u32::from(skew))
                            .wrapping_sub(u32::from(skew == 2) * 3);
                    }
                    cmds.push(itt);
                    c.actions(pdu)
                }
                Ev::Write {
                    lba,
                    blocks,
                    immediate,
                } => {
                    let len = usize::from(blocks) * BLOCK as usize;
                    let imm = (usize::from(immediate) * 8).min(len);
                    let (itt, pdu) = c.rw(
                        true,
                        u32::from(lba),
                        u16::from(blocks),
                        pattern(imm, immediate),
                    );
                    cmds.push(itt);
                    writes.push(itt);
                    c.actions(pdu)
                }
                Ev::DataOut {
                    which,
                    honest_ttt,
                    offset,
                    len,
                    data_sn,
                    last,
                } => {
                    let Some(&itt) = writes.get(usize::from(which) % writes.len().max(1)) else {
                        continue;
                    };
                    let ttt = wire
                        .iter()
                        .rev()
                        .find_map(|p| match p.bhs {
                            Bhs::R2t(r) if r.itt == itt => Some(r.ttt),
                            _ => None,
                        })
                        .filter(|_| honest_ttt)
                        .unwrap_or(u32::from(offset) | 0x8000_0000);
                    let pdu = c.data_out(
                        itt,
                        ttt,
                        u32::from(data_sn),
                        u32::from(offset),
                        &pattern(usize::from(len), 3),
                        last,
                    );
                    c.actions(pdu)
                }
                Ev::Tmf {
                    function,
                    which,
                    lun,
                } => {
                    let referenced = cmds
                        .get(usize::from(which) % cmds.len().max(1))
                        .copied()
                        .unwrap_or(0x7777);
                    let f = FUNCTIONS[usize::from(function) % FUNCTIONS.len()];
                    let (itt, pdu) = c.tmf(f, u16::from(lun), referenced);
                    tmfs.push(itt);
                    let actions = c.actions(pdu);
                    let ended = carry_out(&mut c.launcher, actions).await;
                    let sent = c.sent();
                    if f == TmfFunction::AbortTask
                        && sent.iter().any(|p| matches!(p.bhs, Bhs::TaskMgmtResponse(r) if r.itt == itt && r.response == TmfResponse::FunctionComplete))
                    {
                        aborted.push((itt, referenced));
                    }
                    wire.extend(sent);
                    if ended.is_some() {
                        break;
                    }
                    continue;
                }
                Ev::AnswerPing => {
                    let Some(ttt) = ping_ttt.take() else { continue };
                    c.actions(Pdu::new(Bhs::NopOut(NopOut {
                        immediate: true,
                        lun: Lun::default(),
                        itt: RESERVED_TAG,
                        ttt,
                        cmd_sn: c.cmd_sn,
                        exp_stat_sn: 0,
                    })))
                }
                Ev::Tick { secs } => {
                    c.now += Duration::from_secs(u64::from(secs));
                    c.machine.on_timeout(c.now)
                }
                Ev::Shutdown => c.machine.on_shutdown(c.now),
                Ev::Logout => {
                    let pdu = c.logout();
                    c.actions(pdu)
                }
                Ev::Stall(on) => {
                    c.lu().set_stalled(on);
                    continue;
                }
                Ev::Qos(pick) => {
                    set_iops(&c, pick);
                    continue;
                }
                Ev::Junk => c.machine.on_decode_error(
                    &DecodeError::UnknownOpcode(0x3e),
                    Some(&[0u8; 48]),
                    true,
                ),
            };
            let ended = carry_out(&mut c.launcher, actions).await;
            let sent = c.sent();
            for p in &sent {
                if let Bhs::NopIn(n) = p.bhs {
                    if n.itt == RESERVED_TAG {
                        ping_ttt = Some(n.ttt);
                    }
                }
            }
            wire.extend(sent);
            let (exp, max) = c.machine.shared().numbers();
            prop_assert!(
                max.wrapping_sub(exp).wrapping_add(1) <= depth,
                "window {exp}..{max} over {depth}"
            );
            if ended.is_some() {
                break;
            }
        }
        // The connection ends: the driver aborts the session's tasks and drops the
        // machine; released commands then finish (or give up) on their own.
        c.lu().set_stalled(false);
        c.session.tasks.abort_where(|_, _| true);
        let shared = c.machine.shared().clone();
        let lu = c.lu();
        let Conn {
            machine,
            wire: mut rx,
            session,
            launcher,
            ..
        } = c;
        drop(machine);
        let deadline = Instant::now() + Duration::from_secs(10);
        while shared.in_flight() > 0 || !cmds.iter().all(|i| !session.tasks.contains(*i)) {
            prop_assert!(
                Instant::now() < deadline,
                "window slots or tasks leaked: {} in flight",
                shared.in_flight()
            );
            while let Ok(Outgoing::Pdu(p)) = rx.try_recv() {
                wire.push(p);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        while let Ok(Some(Outgoing::Pdu(p))) =
            tokio::time::timeout(Duration::from_millis(50), rx.recv()).await
        {
            wire.push(p);
        }
        drop(launcher);
        // Every command booked at the QoS ceiling started or gave its place up.
        let waiting = lu.qos().counters().waiting;
        prop_assert_eq!(waiting, 0, "commands still counted waiting at the ceiling");
        // Every task management request was answered exactly once.
        for t in &tmfs {
            let n = wire
                .iter()
                .filter(|p| matches!(p.bhs, Bhs::TaskMgmtResponse(r) if r.itt == *t))
                .count();
            prop_assert!(n <= 1, "TMF {t:#x} answered {n} times");
        }
        // No command answered twice; none answered after "Function complete" for it.
        let status_of = |p: &Pdu| match p.bhs {
            Bhs::ScsiResponse(r) => Some(r.itt),
            Bhs::DataIn(d) if d.status.is_some() => Some(d.itt),
            _ => None,
        };
        for i in &cmds {
            let n = wire.iter().filter(|p| status_of(p) == Some(*i)).count();
            prop_assert!(n <= 1, "command {i:#x} answered {n} times");
        }
        for (tmf, victim) in &aborted {
            let at = wire
                .iter()
                .position(|p| matches!(p.bhs, Bhs::TaskMgmtResponse(r) if r.itt == *tmf))
                .expect("the TMF response is on the wire");
            prop_assert!(
                !wire[at..].iter().any(|p| status_of(p) == Some(*victim)
                    || matches!(p.bhs, Bhs::DataIn(d) if d.itt == *victim)),
                "task {victim:#x} answered after ABORT TASK {tmf:#x} completed"
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn random_initiators_never_leak_or_answer_twice(evs in proptest::collection::vec(ev(), 1..40), qos in 0..5u8) {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(play(evs, qos))?;
        }
    }
}

/// A final Text Request `itt` with `pairs`, in the CmdSN order.
fn text_request(c: &mut Conn, itt: u32, pairs: &[(&str, &str)]) -> Pdu {
    Pdu::with_data(
        Bhs::TextRequest(TextRequest {
            immediate: false,
            final_bit: true,
            continue_bit: false,
            lun: Lun::from_index(0),
            itt,
            ttt: RESERVED_TAG,
            cmd_sn: c.take_cmd_sn(),
            exp_stat_sn: 0,
        }),
        encode_text(pairs).unwrap(),
    )
}

/// A discovery session kept open answers each SendTargets from what is
/// served when it is asked (RFC 7143 appendix C: an initiator may keep it
/// open to find new targets): a target added since the login is listed, and
/// one whose access list no longer admits the initiator is not. Before, the
/// session answered from the targets of its login for as long as it lasted.
#[tokio::test]
async fn send_targets_answers_from_what_is_served_when_asked() {
    let fabric = fabric();
    let mut c = Conn::open_on(fabric.clone(), None, &[]);
    let listed = |c: &mut Conn| {
        let itt = c.itt();
        let req = text_request(c, itt, &[("SendTargets", "All")]);
        (itt, req)
    };
    let names = |sent: Vec<Pdu>| -> Vec<String> {
        let [Pdu {
            bhs: Bhs::TextResponse(_),
            data,
            ..
        }] = &sent[..]
        else {
            panic!("{sent:?}")
        };
        blockwire_pdu::keys::parse_text(data)
            .unwrap()
            .into_iter()
            .filter(|(k, _)| k == "TargetName")
            .map(|(_, v)| v)
            .collect()
    };
    let (_, req) = listed(&mut c);
    assert_eq!(c.feed(req).await, None);
    assert_eq!(names(c.sent()), [TARGET]);
    // A live change: the first target now admits another initiator only,
    // and a second target is served.
    let old = fabric.catalog();
    let entry = |name: &str, acl: Acl| served_as(&old, name, acl);
    fabric.replace_catalog(Arc::new(Catalog {
        portal_groups: old.portal_groups.clone(),
        targets: vec![
            entry(
                TARGET,
                Acl::Only(vec!["iqn.2026-11.test:another-host".into()]),
            ),
            entry("iqn.2026-11.test:added", Acl::Any),
        ],
        discovery_auth: Default::default(),
    }));
    let (_, req) = listed(&mut c);
    assert_eq!(c.feed(req).await, None);
    assert_eq!(names(c.sent()), ["iqn.2026-11.test:added"]);
}

/// On iSER a Text Response lands in one of the initiator's receive buffers,
/// InitiatorRecvDataSegmentLength bytes (RFC 7145 §6.3), which
/// MaxRecvDataSegmentLength does not bound: a longer answer goes in pieces
/// of at most that, each with C=1, as on TCP.
#[tokio::test]
async fn iser_text_answers_fit_the_initiators_receive_buffers() {
    let mut c = Conn::open_iser(&[
        ("InitiatorRecvDataSegmentLength", "512"),
        ("MaxRecvDataSegmentLength", "262144"),
    ])
    .await;
    let keys: Vec<(String, String)> = (0..40)
        .map(|i| (format!("X-com.example.key{i}"), "value".to_owned()))
        .collect();
    let pairs: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    let itt = c.itt();
    let text = text_request(&mut c, itt, &pairs);
    assert_eq!(c.feed(text).await, None);
    let answer = c
        .sent()
        .into_iter()
        .find_map(|p| match p.bhs {
            Bhs::TextResponse(r) if r.itt == itt => Some((r, p.data.len())),
            _ => None,
        })
        .expect("a Text Response");
    assert!(answer.1 <= 512, "{} bytes in one Text Response", answer.1);
    assert!(
        answer.0.continue_bit && !answer.0.final_bit,
        "{:?}",
        answer.0
    );
}
