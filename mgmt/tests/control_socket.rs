//! The daemon's control socket end to end: the real `blockwire-target`
//! binary with a configuration of two portal groups (ALUA) and a control
//! socket, driven by `blockwire-target ctl` and the control library, and a
//! bare-bones iSCSI initiator (target/tests/support's RawConn: the pdu
//! crate's typed PDUs over a TcpStream), so each test sees exactly what the
//! target sends.
//!
//! - A stalled LUN holds a READ while TEST UNIT READY is answered; ABORT
//!   TASK (and LUN RESET for a held WRITE) get their responses while the
//!   LUN is still stalled; once released, new I/O works, and the aborted
//!   tasks never got a Data-In or a SCSI Response (the aborted WRITE never
//!   reached the medium).
//! - portal.close cuts the session that came in through that portal while
//!   the session on the other portal keeps working; portal.open lets
//!   initiators in again. The ALUA view from the second portal is checked
//!   on the way (REPORT TARGET PORT GROUPS, VPD 83h).

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use blockwire_mgmt::control::ctl;
use blockwire_pdu::pdu::codes::{TaskAttr, TmfFunction, TmfResponse};
use blockwire_pdu::pdu::{ScsiCommand, TaskMgmtRequest};
use blockwire_pdu::{Bhs, Digests, Lun, Pdu};
use serde_json::{json, Value};

#[path = "../../target/tests/support/mod.rs"]
mod support;
use support::{rw10, RawConn};

mod daemon;
use daemon::{DaemonProcess, BIN};

#[path = "../../target/tests/support/loop_device.rs"]
mod loop_device;

const TARGET: &str = "iqn.2026-11.io.blockwire:ctl-e2e";
const INITIATOR: &str = "iqn.2026-11.io.blockwire:ctl-e2e-initiator";
/// The daemon and its control socket.
struct Daemon {
    _process: DaemonProcess,
    socket: PathBuf,
}

impl Daemon {
    /// Starts the daemon: two portal groups on free ports of 127.0.0.1
    /// (group 2 active/non-optimized), one target in both, LUN 0 of 8 MiB
    /// RAM, and a control socket; returns once the socket answers.
    async fn start() -> Daemon {
        Self::start_with(|_| "[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\n".into())
            .await
    }

    /// [`Self::start`] with the target's LUNs from `luns` (given the
    /// test's scratch directory).
    async fn start_with(luns: impl FnOnce(&std::path::Path) -> String) -> Daemon {
        Self::start_with_fabric("", luns).await
    }

    /// [`Self::start_with`] with `fabric` added to the `[fabric]` table.
    async fn start_with_fabric(
        fabric: &str,
        luns: impl FnOnce(&std::path::Path) -> String,
    ) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("two-groups.toml");
        std::fs::write(
            &config,
            format!(
                "[fabric]\nnop_interval_secs = 0\nstate_dir = {:?}\n{fabric}\n\
                 [[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:0\"]\n\n\
                 [[portal_group]]\ntag = 2\nlisten = [\"127.0.0.1:0\"]\nalua_state = \"active_non_optimized\"\n\n\
                 [[target]]\nname = \"{TARGET}\"\nportal_groups = [1, 2]\n\n{}",
                dir.path().join("state"),
                luns(dir.path())
            ),
        )
        .unwrap();
        let socket = dir.path().join("control.sock");
        let _process = DaemonProcess::spawn(dir, &config, Self::args(&socket));
        let d = Daemon { _process, socket };
        d.answering().await;
        d
    }

    /// The daemon's arguments besides its configuration.
    fn args(socket: &std::path::Path) -> [&OsStr; 4] {
        [
            OsStr::new("--control"),
            socket.as_os_str(),
            OsStr::new("--log"),
            OsStr::new("info"),
        ]
    }

    /// Waits (at most 20 s) until the control socket answers.
    async fn answering(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while self.try_call("lun.list", Value::Null).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the control socket never answered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the daemon with SIGTERM and starts it again from its
    /// configuration file as it is now; returns once the socket answers.
    async fn restart(&mut self) {
        let config = self._process.dir().join("two-groups.toml");
        let socket = self.socket.clone();
        self._process.restart(&config, Self::args(&socket));
        self.answering().await;
    }

    async fn try_call(
        &self,
        method: &str,
        params: Value,
    ) -> Result<Value, blockwire_mgmt::control::CtlError> {
        ctl(&self.socket, method, params, Duration::from_secs(10)).await
    }

    /// The error a call that must be refused gets, as text.
    async fn refusal(&self, method: &str, params: Value) -> String {
        match self.try_call(method, params).await {
            Ok(v) => panic!("{method} was accepted: {v}"),
            Err(e) => e.to_string(),
        }
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        self.try_call(method, params)
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// The portals' bound addresses, by TPGT.
    async fn portal(&self, tpgt: u64) -> SocketAddr {
        let v = self.call("portal.list", Value::Null).await;
        let p = v["portals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["tpgt"] == tpgt)
            .unwrap_or_else(|| panic!("no portal of group {tpgt}: {v}"));
        p["listen"].as_str().unwrap().parse().unwrap()
    }

    /// Commands held at `lun`'s stall gate.
    async fn held_on(&self, lun: u64) -> u64 {
        let v = self.call("lun.list", Value::Null).await;
        let l = v["targets"][0]["luns"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lun"] == lun)
            .unwrap_or_else(|| panic!("no LUN {lun}: {v}"))
            .clone();
        l["held"].as_u64().unwrap()
    }

    async fn wait_held(&self, n: u64) {
        self.wait_held_on(0, n).await
    }

    async fn wait_held_on(&self, lun: u64, n: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.held_on(lun).await != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "LUN {lun} never held {n} command(s) (holds {})",
                self.held_on(lun).await
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `blockwire-target ctl` as a user runs it: (exit code, stdout, stderr).
    fn ctl_cli(&self, method: &str, params: &str) -> (i32, String, String) {
        let out = Command::new(BIN)
            .arg("ctl")
            .arg("--control")
            .arg(&self.socket)
            .arg(method)
            .arg(params)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// One raw session, with the tags it used and every PDU it saw.
struct Client {
    conn: RawConn,
    cmd_sn: u32,
    itt: u32,
    /// Every PDU received, for the "never answered" checks.
    seen: Vec<Pdu>,
    /// The LUN commands and task management address.
    lun: u16,
}

impl Client {
    async fn login(addr: SocketAddr, isid_low: u8) -> Client {
        Client::login_to(addr, isid_low, TARGET).await
    }

    async fn login_to(addr: SocketAddr, isid_low: u8, target: &str) -> Client {
        Client::login_as(addr, isid_low, INITIATOR, target).await
    }

    async fn login_as(addr: SocketAddr, isid_low: u8, initiator: &str, target: &str) -> Client {
        let l = RawConn::login(
            addr,
            initiator,
            target,
            [0x80, 0, 0, 0, 0x2a, isid_low],
            0,
            Digests::NONE,
            0x100,
            1,
        )
        .await;
        Client {
            conn: l.conn,
            cmd_sn: 1,
            itt: 0x100,
            seen: Vec::new(),
            lun: 0,
        }
    }

    fn command(&mut self, cdb: &[u8], read: bool, write: bool, edtl: u32) -> ScsiCommand {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        self.itt += 1;
        let cmd = ScsiCommand {
            immediate: false,
            final_bit: true,
            read,
            write,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(self.lun),
            itt: self.itt,
            expected_data_transfer_length: edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb: c,
        };
        self.cmd_sn += 1;
        cmd
    }

    async fn recv_within(&mut self, wait: Duration) -> Option<Pdu> {
        let pdu = self.conn.recv_within(wait).await?;
        self.seen.push(pdu.clone());
        Some(pdu)
    }

    /// Sends a command (with `data` as immediate data) and returns its
    /// status and Data-In bytes.
    async fn run(&mut self, cdb: &[u8], read_len: u32, data: &[u8]) -> (u8, Vec<u8>) {
        let write = !data.is_empty();
        let cmd = self.command(
            cdb,
            read_len > 0,
            write,
            if write { data.len() as u32 } else { read_len },
        );
        self.conn
            .send(Pdu::with_data(Bhs::ScsiCommand(cmd), data.to_vec()))
            .await;
        self.wait_status(cmd.itt, read_len as usize).await
    }

    async fn wait_status(&mut self, itt: u32, len: usize) -> (u8, Vec<u8>) {
        let mut buf = vec![0u8; len];
        loop {
            let pdu = self
                .recv_within(Duration::from_secs(5))
                .await
                .unwrap_or_else(|| panic!("no answer to ITT {itt:#x}"));
            match pdu.bhs {
                Bhs::DataIn(d) if d.itt == itt => {
                    let at = d.buffer_offset as usize;
                    buf[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
                    if let Some(s) = d.status {
                        return (s, buf);
                    }
                }
                Bhs::ScsiResponse(r) if r.itt == itt => return (r.status, buf),
                _ => {}
            }
        }
    }

    /// TEST UNIT READY until GOOD (unit attentions consumed).
    async fn ready(&mut self) {
        for _ in 0..8 {
            if self.run(&[0; 6], 0, &[]).await.0 == 0 {
                return;
            }
        }
        panic!("unit attentions never cleared");
    }

    async fn tmf(
        &mut self,
        function: TmfFunction,
        referenced: u32,
        ref_cmd_sn: u32,
    ) -> TmfResponse {
        self.itt += 1;
        let itt = self.itt;
        let req = TaskMgmtRequest {
            immediate: true,
            function,
            lun: Lun::from_index(self.lun),
            itt,
            referenced_task_tag: referenced,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            ref_cmd_sn,
            exp_data_sn: 0,
        };
        self.conn.send(Pdu::new(Bhs::TaskMgmtRequest(req))).await;
        loop {
            let pdu = self
                .recv_within(Duration::from_secs(3))
                .await
                .unwrap_or_else(|| panic!("no answer to {function:?} within 3 s"));
            if let Bhs::TaskMgmtResponse(r) = pdu.bhs {
                if r.itt == itt {
                    return r.response;
                }
            }
        }
    }

    /// Panics if any PDU seen so far answered `itt`.
    fn assert_never_answered(&self, itt: u32, what: &str) {
        for pdu in &self.seen {
            match &pdu.bhs {
                Bhs::DataIn(d) if d.itt == itt => panic!("Data-In for the aborted {what}: {pdu:?}"),
                Bhs::ScsiResponse(r) if r.itt == itt => {
                    panic!("SCSI Response for the aborted {what}: {pdu:?}")
                }
                Bhs::R2t(r) if r.itt == itt => panic!("R2T for the aborted {what}"),
                _ => {}
            }
        }
    }
}

fn stall(stalled: bool) -> Value {
    stall_lun(0, stalled)
}

fn stall_lun(lun: u16, stalled: bool) -> Value {
    json!({"target": TARGET, "lun": lun, "stalled": stalled})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_lun_holds_io_while_tmfs_are_answered_and_aborted_tasks_stay_silent() {
    let d = Daemon::start().await;
    let mut c = Client::login(d.portal(1).await, 1).await;
    c.ready().await;
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(c.run(&rw10(0x2a, 0, 8), 0, &pattern).await.0, 0, "WRITE");

    // Stall with the CLI, as a test script would.
    let (code, out, err) = d.ctl_cli("lun.stall", &stall(true).to_string());
    assert_eq!(code, 0, "ctl lun.stall: {err}");
    let v: Value = serde_json::from_str(&out).expect("ctl prints the result as JSON");
    assert_eq!(
        (v["stalled"].clone(), v["was_stalled"].clone()),
        (json!(true), json!(false))
    );

    // A READ blocks...
    let read = c.command(&rw10(0x28, 0, 8), true, false, 4096);
    c.conn.send(Pdu::new(Bhs::ScsiCommand(read))).await;
    d.wait_held(1).await;
    assert!(
        c.recv_within(Duration::from_millis(300)).await.is_none(),
        "nothing comes back for a READ of a stalled LUN"
    );
    // ...while non-media commands are answered.
    assert_eq!(
        c.run(&[0; 6], 0, &[]).await.0,
        0,
        "TEST UNIT READY while stalled"
    );
    let inquiry = [0x12, 0, 0, 0, 96, 0];
    assert_eq!(c.run(&inquiry, 96, &[]).await.0, 0, "INQUIRY while stalled");

    // ABORT TASK is answered while the LUN is still stalled, and the held
    // READ leaves the gate without reaching the backstore.
    let t0 = std::time::Instant::now();
    let r = c.tmf(TmfFunction::AbortTask, read.itt, read.cmd_sn).await;
    assert_eq!(r, TmfResponse::FunctionComplete);
    eprintln!(
        "ABORT TASK answered in {:?} with the LUN stalled",
        t0.elapsed()
    );
    d.wait_held(0).await;

    // A held WRITE, ended by LUN RESET (also answered while stalled).
    let write = c.command(&rw10(0x2a, 16, 8), false, true, 4096);
    c.conn
        .send(Pdu::with_data(Bhs::ScsiCommand(write), vec![0xee; 4096]))
        .await;
    d.wait_held(1).await;
    let r = c.tmf(TmfFunction::LogicalUnitReset, 0, 0).await;
    assert_eq!(r, TmfResponse::FunctionComplete);
    d.wait_held(0).await;
    let listed = d.call("lun.list", Value::Null).await;
    assert_eq!(
        listed["targets"][0]["luns"][0]["stalled"], true,
        "still stalled"
    );

    // Released: new I/O runs normally.
    let v = d.call("lun.stall", stall(false)).await;
    assert_eq!(
        (v["was_stalled"].clone(), v["held"].clone()),
        (json!(true), json!(0))
    );
    c.ready().await; // the LUN reset's unit attention
    let (status, data) = c.run(&rw10(0x28, 0, 8), 4096, &[]).await;
    assert_eq!(
        (status, data == pattern),
        (0, true),
        "READ after the release"
    );
    let (status, data) = c.run(&rw10(0x28, 16, 8), 4096, &[]).await;
    assert_eq!(status, 0);
    assert!(
        data.iter().all(|&b| b == 0),
        "the aborted WRITE never landed"
    );

    // Nothing ever answers the aborted tasks, however long we listen.
    while c.recv_within(Duration::from_millis(500)).await.is_some() {}
    c.assert_never_answered(read.itt, "READ");
    c.assert_never_answered(write.itt, "WRITE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portal_close_cuts_only_the_sessions_of_that_portal() {
    let d = Daemon::start().await;
    let (p1, p2) = (d.portal(1).await, d.portal(2).await);
    let mut a = Client::login(p1, 1).await;
    let mut b = Client::login(p2, 2).await;
    a.ready().await;
    b.ready().await;

    // ALUA through the second portal: two groups, the first preferred and
    // active/optimized, the second active/non-optimized; VPD 83h names
    // group 2 and relative port 2.
    let rtpg = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let (status, data) = b.run(&rtpg, 256, &[]).await;
    assert_eq!(status, 0);
    assert_eq!(u32::from_be_bytes(data[0..4].try_into().unwrap()), 24);
    assert_eq!(&data[4..16], &[0x80, 0x07, 0, 1, 0, 2, 0, 1, 0, 0, 0, 1]);
    assert_eq!(&data[16..28], &[0x01, 0x07, 0, 2, 0, 2, 0, 1, 0, 0, 0, 2]);
    let (status, vpd) = b.run(&[0x12, 1, 0x83, 1, 0, 0], 256, &[]).await;
    assert_eq!(status, 0);
    let designators = designators(&vpd);
    assert!(
        designators.contains(&(5, vec![0, 0, 0, 2])),
        "target port group 2: {designators:?}"
    );
    assert!(
        designators.contains(&(4, vec![0, 0, 0, 2])),
        "relative port 2: {designators:?}"
    );

    let sessions = d.call("session.list", Value::Null).await;
    let tpgts: Vec<(u64, String)> = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["tpgt"].as_u64().unwrap(),
                s["portal"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(tpgts, [(1, p1.to_string()), (2, p2.to_string())]);

    let v = d
        .call("portal.close", json!({"listen": p1.to_string()}))
        .await;
    assert_eq!(v["connections_cut"], 1, "{v}");
    // The session through portal 1 is gone: its socket closes, and the
    // portal accepts nothing.
    assert!(
        a.recv_within(Duration::from_secs(3)).await.is_none(),
        "the connection through the closed portal is cut"
    );
    assert!(
        tokio::net::TcpStream::connect(p1).await.is_err(),
        "portal 1 refuses connections"
    );
    // The session through portal 2 keeps working.
    let (status, _) = b.run(&rw10(0x28, 0, 8), 4096, &[]).await;
    assert_eq!(status, 0, "READ through portal 2 after portal 1 closed");
    let sessions = d.call("session.list", Value::Null).await;
    assert_eq!(sessions["sessions"].as_array().unwrap().len(), 1);
    assert_eq!(sessions["sessions"][0]["tpgt"], 2);
    // The initiator's totals on the target, over both its sessions: that one READ
    // (TEST UNIT READY, REPORT TARGET PORT GROUPS and INQUIRY are not READs or WRITEs).
    assert_eq!(
        sessions["sessions"][0]["initiator_io"],
        json!({
            "read": {"commands": 1, "errors": 0, "bytes": 4096},
            "write": {"commands": 0, "errors": 0, "bytes": 0},
        }),
        "{sessions}"
    );

    // Closing it again is a conflict the CLI reports with exit code 1.
    let (code, _, err) = d.ctl_cli(
        "portal.close",
        &json!({"listen": p1.to_string()}).to_string(),
    );
    assert_eq!(code, 1);
    assert!(err.contains("is closed already"), "{err}");

    // Re-opened, it lets initiators in again.
    d.call("portal.open", json!({"listen": p1.to_string()}))
        .await;
    let mut again = Client::login(p1, 3).await;
    again.ready().await;
    assert_eq!(again.run(&rw10(0x28, 0, 8), 4096, &[]).await.0, 0);
}

/// (designator type, value) of each VPD 83h designator.
fn designators(vpd: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let len = u16::from_be_bytes([vpd[2], vpd[3]]) as usize;
    let mut out = Vec::new();
    let mut at = 4;
    while at + 4 <= 4 + len {
        let n = vpd[at + 3] as usize;
        out.push((vpd[at + 1] & 0x0f, vpd[at + 4..at + 4 + n].to_vec()));
        at += 4 + n;
    }
    out
}

/// The data paths a file LUN can be served by: (name, its keys, whether the
/// path is a WRITE's).
const DATA_PATHS: [(&str, &str, bool); 5] = [
    ("sendfile", "", false),
    ("copy", "zero_copy = false\n", false),
    ("engine serial (direct)", "mode = \"direct\"\n", false),
    ("engine synchronized", "sync_send = true\n", false),
    ("double-buffered write", "sync_write = true\n", true),
];

/// Addresses `lun` of [`data_path_luns`] from `c`, its unit attentions
/// taken, and gives the 64 KiB pattern of that LUN and its length in blocks.
async fn on_path_lun(c: &mut Client, lun: u16) -> (Vec<u8>, u16) {
    c.lun = lun;
    c.ready().await;
    let data: Vec<u8> = (0..65536u32).map(|b| (b as u8) ^ (lun as u8 + 1)).collect();
    let blocks = (data.len() / 512) as u16;
    (data, blocks)
}

/// One 4 MiB file LUN in `dir` per entry of [`DATA_PATHS`], LUN i on path i,
/// each with `keys` more.
fn data_path_luns(dir: &std::path::Path, keys: &str) -> String {
    DATA_PATHS
        .iter()
        .enumerate()
        .map(|(i, (_, path_keys, _))| {
            format!(
                "[[target.lun]]\nid = {i}\nbackstore = \"file\"\npath = {:?}\nsize = \"4M\"\n{keys}{path_keys}\n",
                dir.join(format!("lun{i}.img"))
            )
        })
        .collect()
}

/// Every data path of the fabric reaches the stall gate: on file LUNs
/// served by sendfile (cached, the default), the copy path (zero_copy =
/// false), the I/O engine (direct: serial; cached with sync_send:
/// synchronized sends) and double-buffered WRITEs (sync_write), a stalled
/// LUN holds the command, ABORT TASK is answered while it is held, the
/// aborted command never answers nor lands, and after the release the same
/// command runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_data_path_waits_at_the_stall_gate() {
    let paths = DATA_PATHS;
    let d = Daemon::start_with(|dir| data_path_luns(dir, "")).await;
    let mut c = Client::login(d.portal(1).await, 1).await;
    for (i, (name, _, is_write)) in paths.iter().enumerate() {
        let lun = i as u16;
        let (data, blocks) = on_path_lun(&mut c, lun).await;
        assert_eq!(
            c.run(&rw10(0x2a, 0, blocks), 0, &data).await.0,
            0,
            "{name}: WRITE"
        );
        d.call("lun.stall", stall_lun(lun, true)).await;
        let cmd = if *is_write {
            let cmd = c.command(&rw10(0x2a, 256, blocks), false, true, data.len() as u32);
            // Immediate data up to FirstBurstLength; the rest would follow
            // R2Ts, which a held WRITE never gets.
            let imm = data.len().min(65536);
            c.conn
                .send(Pdu::with_data(Bhs::ScsiCommand(cmd), data[..imm].to_vec()))
                .await;
            cmd
        } else {
            let cmd = c.command(&rw10(0x28, 0, blocks), true, false, data.len() as u32);
            c.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
            cmd
        };
        d.wait_held_on(i as u64, 1).await;
        assert_eq!(
            c.run(&[0; 6], 0, &[]).await.0,
            0,
            "{name}: TUR while stalled"
        );
        let r = c.tmf(TmfFunction::AbortTask, cmd.itt, cmd.cmd_sn).await;
        assert_eq!(r, TmfResponse::FunctionComplete, "{name}");
        d.wait_held_on(i as u64, 0).await;
        d.call("lun.stall", stall_lun(lun, false)).await;
        let (status, back) = c.run(&rw10(0x28, 0, blocks), data.len() as u32, &[]).await;
        assert_eq!(
            (status, back == data),
            (0, true),
            "{name}: READ after the release"
        );
        if *is_write {
            let (status, back) = c
                .run(&rw10(0x28, 256, blocks), data.len() as u32, &[])
                .await;
            assert_eq!(status, 0);
            assert!(
                back.iter().all(|&b| b == 0),
                "{name}: the aborted WRITE never landed"
            );
        }
        while c.recv_within(Duration::from_millis(200)).await.is_some() {}
        c.assert_never_answered(cmd.itt, name);
    }
}

/// The sense key, ASC and ASCQ of the next TEST UNIT READY's CHECK
/// CONDITION, or None when it ends GOOD.
async fn tur_sense(c: &mut Client) -> Option<(u8, u8, u8)> {
    let cmd = c.command(&[0; 6], false, false, 0);
    c.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    loop {
        let pdu = c
            .recv_within(Duration::from_secs(5))
            .await
            .expect("no answer to TEST UNIT READY");
        if let Bhs::ScsiResponse(r) = &pdu.bhs {
            if r.itt != cmd.itt {
                continue;
            }
            if r.status == 0 {
                return None;
            }
            // Sense data: a two-byte length, then fixed-format sense.
            let s = &pdu.data[2..];
            return Some((s[2] & 0x0f, s[12], s[13]));
        }
    }
}

/// Unit attentions until GOOD, in the order TEST UNIT READY reported them.
async fn unit_attentions(c: &mut Client) -> Vec<(u8, u8)> {
    let mut seen = Vec::new();
    while let Some((key, asc, ascq)) = tur_sense(c).await {
        assert_eq!(key, 6, "not a unit attention: {asc:#x}/{ascq:#x}");
        seen.push((asc, ascq));
        assert!(seen.len() < 8, "unit attentions never cleared: {seen:?}");
    }
    seen
}

/// REPORT LUNS through `c`: the LUN numbers.
async fn report_luns(c: &mut Client) -> Vec<u16> {
    let (status, data) = c
        .run(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256, &[])
        .await;
    assert_eq!(status, 0);
    let n = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize / 8;
    (0..n)
        .map(|i| u16::from_be_bytes([data[8 + 8 * i] & 0x3f, data[9 + 8 * i]]))
        .collect()
}

/// The one session's TSIH, from session.list.
async fn only_tsih(d: &Daemon) -> Option<u64> {
    let v = d.call("session.list", Value::Null).await;
    let s = v["sessions"].as_array().unwrap();
    assert!(s.len() <= 1, "{v}");
    s.first().map(|s| s["tsih"].as_u64().unwrap())
}

/// A target taken out of a portal group by a reload loses that group's
/// sessions, as a login there is refused from then on; its sessions
/// through the groups it keeps go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_leaving_a_portal_group_ends_its_sessions_there() {
    let d = Daemon::start().await;
    let mut kept = Client::login(d.portal(1).await, 1).await;
    kept.ready().await;
    let mut cut = Client::login(d.portal(2).await, 2).await;
    cut.ready().await;
    let config = d._process.dir().join("two-groups.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("portal_groups = [1, 2]"), "{text}");
    std::fs::write(
        &config,
        text.replace("portal_groups = [1, 2]", "portal_groups = [1]"),
    )
    .unwrap();
    let v = d.call("config.reload", Value::Null).await;
    assert!(
        v["changes"]
            .to_string()
            .contains("is no longer served through portal group 2"),
        "{v}"
    );
    assert!(
        cut.recv_within(Duration::from_secs(3)).await.is_none(),
        "the session through group 2 was closed"
    );
    let block = kept.run(&rw10(0x28, 0, 1), 512, &[]).await;
    assert_eq!(block.0, 0, "the session through group 1 goes on");
    let v = d.call("session.list", Value::Null).await;
    assert_eq!(v["sessions"].as_array().unwrap().len(), 1, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn luns_acls_and_reloads_change_live_while_the_session_runs() {
    let mut d = Daemon::start().await;
    let mut c = Client::login(d.portal(1).await, 1).await;
    c.ready().await;
    let tsih = only_tsih(&d).await.expect("a session");
    let block: Vec<u8> = (0..512u32).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(c.run(&rw10(0x2a, 0, 1), 0, &block).await.0, 0);

    // A LUN added live: REPORTED LUNS DATA HAS CHANGED, then REPORT LUNS has it.
    let v = d
        .call(
            "lun.add",
            json!({"target": TARGET, "lun": {"id": 1, "backstore": "ram", "size": "4M"}}),
        )
        .await;
    assert!(v["changes"].to_string().contains("LUN 1 of"), "{v}");
    assert_eq!(unit_attentions(&mut c).await, [(0x3f, 0x0e)]);
    assert_eq!(report_luns(&mut c).await, [0, 1]);
    let (status, data) = c.run(&rw10(0x28, 0, 1), 512, &[]).await;
    assert_eq!((status, data), (0, block.clone()), "LUN 0's data survived");

    // Removing the LUN that just served I/O is refused and names why;
    // the unused one goes.
    let e = d
        .refusal("lun.remove", json!({"target": TARGET, "lun": 0}))
        .await;
    assert!(
        e.contains("removing LUN 0 of")
            && e.contains("served a READ or WRITE")
            && e.contains("force"),
        "{e}"
    );
    // As a dry run: the same refusal; forced, what it would do, and
    // nothing done (no unit attention, both LUNs still reported).
    let dry = d
        .refusal(
            "lun.remove",
            json!({"target": TARGET, "lun": 0, "dry_run": true}),
        )
        .await;
    assert!(
        dry.contains("removing LUN 0 of") && dry.contains("served a READ or WRITE"),
        "{dry}"
    );
    let v = d
        .call(
            "lun.remove",
            json!({"target": TARGET, "lun": 0, "force": true, "dry_run": true}),
        )
        .await;
    assert_eq!(v["dry_run"], json!(true), "{v}");
    assert_eq!(
        v["changes"],
        json!([format!("LUN 0 of {TARGET} removed")]),
        "{v}"
    );
    assert_eq!(unit_attentions(&mut c).await, []);
    assert_eq!(report_luns(&mut c).await, [0, 1]);
    let (status, data) = c.run(&rw10(0x28, 0, 1), 512, &[]).await;
    assert_eq!((status, data), (0, block.clone()), "LUN 0 serves on");

    d.call("lun.remove", json!({"target": TARGET, "lun": 1}))
        .await;
    assert_eq!(unit_attentions(&mut c).await, [(0x3f, 0x0e)]);
    assert_eq!(report_luns(&mut c).await, [0]);

    // A resize: CAPACITY DATA HAS CHANGED, READ CAPACITY has the new size,
    // the data stays.
    d.call(
        "lun.resize",
        json!({"target": TARGET, "lun": 0, "size": "16M"}),
    )
    .await;
    assert_eq!(unit_attentions(&mut c).await, [(0x2a, 0x09)]);
    let (status, cap) = c.run(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8, &[]).await;
    assert_eq!(status, 0);
    assert_eq!(
        u32::from_be_bytes(cap[0..4].try_into().unwrap()),
        (16 << 20) / 512 - 1
    );
    assert_eq!(c.run(&rw10(0x28, 0, 1), 512, &[]).await.1, block);
    assert_eq!(only_tsih(&d).await, Some(tsih), "the session never dropped");

    // The running configuration saved over the file it came from (the old
    // one kept as a backup) is what a start reads.
    let config = d._process.dir().join("two-groups.toml");
    let v = d.call("config.save", Value::Null).await;
    assert!(
        v["backup"].as_str().is_some_and(|b| b.contains("/backup/")),
        "{v}"
    );
    let saved = std::fs::read_to_string(&config).unwrap();
    assert!(
        saved.contains("size = \"16M\"") && !saved.contains("id = 1"),
        "{saved}"
    );
    let check = Command::new(BIN)
        .args(["--check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    // A second daemon starts from it (its portals are on port 0 again).
    let copy_dir = tempfile::tempdir().unwrap();
    let copy = copy_dir.path().join("saved.toml");
    std::fs::copy(&config, &copy).unwrap();
    let mut second = daemon::DaemonProcess::spawn(copy_dir, &copy, ["--log", "info"]);
    second.wait_log("the saved configuration serving", |l| {
        l.contains(&format!("serving target={TARGET} lun=0"))
            .then_some(())
    });
    drop(second);

    // SIGHUP applies an edited file: a new LUN, the session untouched.
    std::fs::write(
        &config,
        format!("{saved}\n[[target.lun]]\nid = 2\nbackstore = \"ram\"\nsize = \"1M\"\n"),
    )
    .unwrap();
    d._process.signal("HUP");
    d._process
        .wait_log("the reload", |l| l.contains("LUN 2 of").then_some(()));
    assert_eq!(unit_attentions(&mut c).await, [(0x3f, 0x0e)]);
    assert_eq!(report_luns(&mut c).await, [0, 2]);
    // A broken file changes nothing and says why.
    std::fs::write(
        &config,
        format!("{saved}\n[[target.lun]]\nid = 3\nbackstore = \"tape\"\n"),
    )
    .unwrap();
    d._process.signal("HUP");
    d._process.wait_log("the failed reload", |l| {
        l.contains("reload failed, still serving the previous configuration")
            .then_some(())
    });
    let log = d._process.log_text();
    assert!(log.contains("\"tape\" is not a backstore"), "{log}");
    assert_eq!(report_luns(&mut c).await, [0, 2]);
    assert_eq!(only_tsih(&d).await, Some(tsih));

    // An access list without this initiator ends its session; adding it
    // lets it back in.
    let v = d
        .call(
            "acl.add",
            json!({"target": TARGET, "initiator": "iqn.2026-11.io.blockwire:someone-else"}),
        )
        .await;
    assert!(
        v["changes"]
            .to_string()
            .contains("no longer in the access list"),
        "{v}"
    );
    assert!(
        c.recv_within(Duration::from_secs(3)).await.is_none(),
        "the session was closed"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while only_tsih(&d).await.is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the session stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    d.call("acl.add", json!({"target": TARGET, "initiator": INITIATOR}))
        .await;
    let mut c = Client::login(d.portal(1).await, 1).await;
    c.ready().await;
    assert_eq!(c.run(&rw10(0x28, 0, 1), 512, &[]).await.1, block);

    // Errors name what is missing and what there is.
    let e = d
        .refusal(
            "lun.resize",
            json!({"target": TARGET, "lun": 9, "size": "1G"}),
        )
        .await;
    assert!(
        e.contains("no LUN 9 in target") && e.contains("LUNs are 0, 2"),
        "{e}"
    );

    // A list of LUNs is one change: all of them, with one unit attention, or none.
    let ram = |id: u16| json!({"id": id, "backstore": "ram", "size": "1M"});
    let e = d
        .refusal(
            "lun.add",
            json!({"target": TARGET, "lun": [ram(3), ram(4), ram(3)]}),
        )
        .await;
    assert!(
        e.contains("LUN 3 exists in") && e.contains("already"),
        "{e}"
    );
    assert_eq!(report_luns(&mut c).await, [0, 2], "none of the list added");
    let v = d
        .call(
            "lun.add",
            json!({"target": TARGET, "lun": [ram(3), ram(4), ram(5)]}),
        )
        .await;
    for id in 3..=5 {
        assert!(
            v["changes"].to_string().contains(&format!("LUN {id} of")),
            "{v}"
        );
    }
    assert_eq!(unit_attentions(&mut c).await, [(0x3f, 0x0e)]);
    assert_eq!(report_luns(&mut c).await, [0, 2, 3, 4, 5]);
    let e = d
        .refusal("lun.add", json!({"target": TARGET, "lun": []}))
        .await;
    assert!(e.contains("the list of LUNs is empty"), "{e}");
}

/// A change that resizes several LUNs is checked whole before any resize
/// is made: one that its unit refuses (a file LUN only grows) leaves every
/// LUN as it was and says nothing was changed. Before, the LUNs resized
/// ahead of the refused one stayed resized (their initiators told so) while
/// the running configuration kept their old sizes, which the next save and
/// start would serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_with_one_refused_resize_resizes_nothing() {
    let d = Daemon::start_with(|dir| {
        format!(
            "[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\n\n\
             [[target.lun]]\nid = 1\nbackstore = \"file\"\npath = {:?}\nsize = \"4M\"\n",
            dir.join("d1.img")
        )
    })
    .await;
    let config = d._process.dir().join("two-groups.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let edited = text
        .replacen("size = \"8M\"", "size = \"16M\"", 1)
        .replacen("size = \"4M\"", "size = \"2M\"", 1);
    assert_ne!(edited, text);
    std::fs::write(&config, edited).unwrap();
    let e = d.refusal("config.reload", Value::Null).await;
    assert!(
        e.contains("only grows") && e.contains("nothing was changed"),
        "{e}"
    );
    let v = d.call("lun.list", Value::Null).await;
    let sizes: Vec<u64> = v["targets"][0]["luns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [8 << 20, 4 << 20], "{v}");
}

/// A cluster fences with persistent reservations; kept in memory only
/// (APTPL off), they live in the unit, and a unit built in its place starts
/// without them: the fenced node would write again. So a change that
/// removes or replaces a LUN holding registrations is refused, as for a
/// LUN in use, unless forced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_holding_unsaved_reservation_registrations_is_not_removed_unforced() {
    let d = Daemon::start().await;
    let mut c = Client::login(d.portal(1).await, 1).await;
    c.ready().await;
    d.call(
        "lun.add",
        json!({"target": TARGET, "lun": {"id": 1, "backstore": "ram", "size": "4M"}}),
    )
    .await;
    c.lun = 1;
    unit_attentions(&mut c).await;
    // PERSISTENT RESERVE OUT, REGISTER, service action key 0x1234.
    let mut params = vec![0u8; 24];
    params[8..16].copy_from_slice(&0x1234u64.to_be_bytes());
    let (status, _) = c
        .run(&[0x5f, 0x00, 0, 0, 0, 0, 0, 0, 24, 0], 0, &params)
        .await;
    assert_eq!(status, 0, "REGISTER");
    let e = d
        .refusal("lun.remove", json!({"target": TARGET, "lun": 1}))
        .await;
    assert!(
        e.contains("removing LUN 1 of")
            && e.contains("persistent reservation registration")
            && e.contains("force"),
        "{e}"
    );
    d.call(
        "lun.remove",
        json!({"target": TARGET, "lun": 1, "force": true}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_and_portals_come_and_go_without_touching_other_sessions() {
    let d = Daemon::start().await;
    let mut c = Client::login(d.portal(1).await, 1).await;
    c.ready().await;
    let tsih = only_tsih(&d).await.unwrap();

    // A new target on a new portal.
    let other = "iqn.2026-11.io.blockwire:ctl-e2e-second";
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let v = d
        .call("portal.add", json!({"tag": 3, "listen": free.to_string()}))
        .await;
    // A new group without iSER changes no iSER portal: nothing waits for a restart.
    assert_eq!(v["restart_needed"], json!([]), "{v}");
    let v = d
        .call(
            "target.add",
            json!({"target": {"name": other, "portal_groups": [3],
                   "lun": [{"id": 0, "backstore": "ram", "size": "2M"}]}}),
        )
        .await;
    assert!(
        v["changes"]
            .to_string()
            .contains("target iqn.2026-11.io.blockwire:ctl-e2e-second added"),
        "{v}"
    );
    let p3 = d.portal(3).await;
    assert_eq!(p3, free);
    // Removing a target with a session needs force.
    let mut second = Client {
        conn: RawConn::login(
            p3,
            INITIATOR,
            other,
            [0x80, 0, 0, 0, 0x2b, 2],
            0,
            Digests::NONE,
            0x100,
            1,
        )
        .await
        .conn,
        cmd_sn: 1,
        itt: 0x100,
        seen: Vec::new(),
        lun: 0,
    };
    second.ready().await;
    let e = d.refusal("target.remove", json!({"target": other})).await;
    assert!(
        e.contains("has 1 session(s)") && e.contains(INITIATOR),
        "{e}"
    );
    d.call("target.remove", json!({"target": other, "force": true}))
        .await;
    assert!(
        second.recv_within(Duration::from_secs(3)).await.is_none(),
        "forced out"
    );
    let v = d
        .call("portal.remove", json!({"listen": free.to_string()}))
        .await;
    assert!(v["changes"].to_string().contains("removed"), "{v}");
    assert!(
        tokio::net::TcpStream::connect(free).await.is_err(),
        "portal 3 is gone"
    );
    let e = d
        .refusal("portal.remove", json!({"listen": "127.0.0.1:0"}))
        .await;
    assert!(e.contains("portal groups 1, 2") && e.contains("tag"), "{e}");
    // The first session never noticed.
    assert_eq!(tur_sense(&mut c).await, None);
    assert_eq!(only_tsih_of(&d, TARGET).await, Some(tsih));

    // Both groups list 127.0.0.1:0, each with a port of its own: taking
    // it out of group 1 closes group 1's portal, not group 2's.
    let (p1, p2) = (d.portal(1).await, d.portal(2).await);
    d.call("portal.add", json!({"tag": 1, "listen": "127.0.0.2:0"}))
        .await;
    d.call("portal.remove", json!({"listen": "127.0.0.1:0", "tag": 1}))
        .await;
    assert!(
        tokio::net::TcpStream::connect(p1).await.is_err(),
        "group 1's portal {p1} still listens"
    );
    assert!(
        tokio::net::TcpStream::connect(p2).await.is_ok(),
        "group 2's portal {p2} was closed"
    );
    let listed = d.call("portal.list", Value::Null).await;
    let listed: Vec<(u64, String)> = listed["portals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["tpgt"].as_u64().unwrap(),
                p["listen"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.contains(&(2, p2.to_string())), "{listed:?}");
    assert!(
        listed
            .iter()
            .any(|(t, a)| *t == 1 && a.starts_with("127.0.0.2:")),
        "{listed:?}"
    );
}

/// A change that moves a portal to another group and then fails to bind a
/// new address leaves the moved portal listening in its old group, as the
/// error says nothing else changed (it used to listen nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_change_leaves_a_moving_portal_where_it_was() {
    let d = Daemon::start().await;
    let moving = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().to_string()
    };
    d.call("portal.add", json!({"tag": 1, "listen": moving}))
        .await;
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().to_string();
    d.call("config.save", Value::Null).await;
    let config = d._process.dir().join("two-groups.toml");
    let mut doc: toml::Table = std::fs::read_to_string(&config).unwrap().parse().unwrap();
    for g in doc["portal_group"].as_array_mut().unwrap() {
        let g = g.as_table_mut().unwrap();
        let tag = g["tag"].as_integer().unwrap();
        let listen = g.get_mut("listen").unwrap().as_array_mut().unwrap();
        if tag == 1 {
            listen.retain(|a| a.as_str() != Some(moving.as_str()));
        } else {
            listen.push(moving.clone().into());
            listen.push(taken.clone().into());
        }
    }
    std::fs::write(&config, toml::to_string(&doc).unwrap()).unwrap();
    let e = d.refusal("config.reload", Value::Null).await;
    assert!(e.contains(&format!("cannot listen on {taken}")), "{e}");
    std::net::TcpStream::connect(&moving).expect("the moving portal listens again");
    let listed = d.call("portal.list", Value::Null).await;
    let group = listed["portals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["listen"] == moving.as_str())
        .map(|p| p["tpgt"].clone());
    assert_eq!(group, Some(json!(1)), "{listed}");
    drop(held);
}

/// A dry run tries what only trying tells, and undoes it: it binds a new
/// portal's address (one another program holds fails it, as it would fail
/// the change, and once free the address is let go again), and it opens a
/// new LUN's existing file or device as the change would (the daemon's own
/// running binary, busy for writing, fails it; a block device shows its
/// real size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_binds_and_opens_what_the_change_would() {
    let d = Daemon::start().await;
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let add_portal = json!({"tag": 1, "listen": addr, "dry_run": true});
    let e = d.refusal("portal.add", add_portal.clone()).await;
    assert!(
        e.contains(&format!("cannot listen on {addr}")) && e.contains("in use"),
        "{e}"
    );
    drop(held);
    let v = d.call("portal.add", add_portal).await;
    assert!(v["changes"].to_string().contains("listening"), "{v}");
    // Let go again: the address binds, and the daemon lists no such portal.
    std::net::TcpListener::bind(&addr).expect("the dry run let the address go");
    let listed = d.call("portal.list", Value::Null).await.to_string();
    assert!(!listed.contains(&addr), "{listed}");

    // The daemon's own binary: writable by access(2), busy for an open
    // for writing while it runs.
    let bin = std::fs::canonicalize(BIN).unwrap();
    let e = d
        .refusal(
            "lun.add",
            json!({"target": TARGET, "dry_run": true,
                   "lun": {"id": 1, "backstore": "file", "path": bin}}),
        )
        .await;
    assert!(
        e.contains("cannot open backstore") && e.contains("Text file busy"),
        "{e}"
    );
    // A 3 MiB loop device: its size is known without a size key.
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("loop.img");
    std::fs::write(&backing, vec![0u8; 3 << 20]).unwrap();
    // Detached when the test ends, passed or not.
    let device = loop_device::LoopDevice::over(&backing);
    let dev = device.0.display().to_string();
    let v = d
        .try_call(
            "lun.add",
            json!({"target": TARGET, "dry_run": true,
                   "lun": {"id": 1, "backstore": "file", "path": dev}}),
        )
        .await;
    let v = v.expect("a dry run over a loop device");
    assert!(
        v["changes"]
            .to_string()
            .contains(&format!("file {dev} (3 MiB")),
        "{v}"
    );
}

/// `blockwire-target ctl --dry-run`, as an operator checks a change before
/// making it: a LUN over a file that does not exist yet, and an edited file
/// before `systemctl reload`. The daemon changes nothing until asked for
/// real, and then says what the dry run said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_dry_run_says_what_a_change_would_do_and_does_nothing() {
    let d = Daemon::start().await;
    let dir = d._process.dir().to_path_buf();
    let disk = dir.join("d1.img");
    let dry_cli = |method: &str, params: &str| {
        let out = Command::new(BIN)
            .args(["ctl", "--dry-run", "--control"])
            .arg(&d.socket)
            .arg(method)
            .args((!params.is_empty()).then_some(params))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "ctl --dry-run {method}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<Value>(&stdout).unwrap()
    };
    let luns = |v: &Value| -> Vec<u64> {
        v["targets"][0]["luns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["lun"].as_u64().unwrap())
            .collect()
    };
    let add = json!({"target": TARGET, "lun": {"id": 1, "backstore": "file",
        "path": disk.to_str().unwrap(), "size": "4M"}});
    let said = dry_cli("lun.add", &add.to_string());
    assert_eq!(said["dry_run"], json!(true), "{said}");
    let changes = said["changes"].to_string();
    assert!(
        changes.contains(&format!(
            "{} does not exist: it will be created (4194304 bytes)",
            disk.display()
        )) && changes.contains(&format!(
            "LUN 1 of {TARGET} added: file {} (4 MiB, cached",
            disk.display()
        )),
        "{said}"
    );
    assert!(!disk.exists(), "a dry run created the file");
    assert_eq!(luns(&d.call("lun.list", Value::Null).await), [0]);
    let done = d.call("lun.add", add).await;
    assert!(done.get("dry_run").is_none(), "{done}");
    assert!(disk.exists());
    assert_eq!(luns(&d.call("lun.list", Value::Null).await), [0, 1]);

    // An edited file: what a reload would change, then the reload.
    let config = dir.join("two-groups.toml");
    d.call("config.save", Value::Null).await;
    let saved = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{saved}\n[[target.lun]]\nid = 2\nbackstore = \"ram\"\nsize = \"1M\"\n"),
    )
    .unwrap();
    let said = dry_cli("config.reload", "");
    assert_eq!(
        said["changes"],
        json!([format!(
            "LUN 2 of {TARGET} added: ram (1 MiB, allocated on write) (initiators hear \
             REPORTED LUNS DATA HAS CHANGED; rescan to see it)"
        )]),
        "{said}"
    );
    assert_eq!(luns(&d.call("lun.list", Value::Null).await), [0, 1]);
    let done = d.call("config.reload", Value::Null).await;
    assert_eq!(done["changes"], said["changes"]);
    assert_eq!(luns(&d.call("lun.list", Value::Null).await), [0, 1, 2]);

    // Only changes take a dry run.
    let e = d.refusal("lun.list", json!({"dry_run": true})).await;
    assert!(e.contains("lun.list changes no configuration"), "{e}");
}

/// A portal group's ALUA state changed by a reload (a path put in standby
/// for maintenance, then back): a dry run says so and changes nothing; the
/// reload gives every session ASYMMETRIC ACCESS STATE CHANGED, REPORT
/// TARGET PORT GROUPS the new state, and media commands through the port
/// in standby NOT READY; the session stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alua_state_changed_live_is_heard_by_every_session() {
    let d = Daemon::start().await;
    let mut c = Client::login(d.portal(1).await, 1).await;
    c.ready().await;
    let config = d._process.dir().join("two-groups.toml");
    d.call("config.save", Value::Null).await;
    let saved = std::fs::read_to_string(&config).unwrap();
    let set_group_1 = |state: &str| {
        let mut doc: toml::Table = saved.parse().unwrap();
        let groups = doc["portal_group"].as_array_mut().unwrap();
        let g1 = groups
            .iter_mut()
            .find(|g| g["tag"].as_integer() == Some(1))
            .unwrap();
        g1.as_table_mut()
            .unwrap()
            .insert("alua_state".into(), state.into());
        std::fs::write(&config, toml::to_string(&doc).unwrap()).unwrap();
    };
    let rtpg = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let group_1_state = |data: &[u8]| data[4] & 0x0f;
    let line = |from: &str, to: &str| {
        json!([format!(
            "ALUA state of portal group 1 of {TARGET}: {from} -> {to} (initiators hear \
             ASYMMETRIC ACCESS STATE CHANGED)"
        )])
    };

    set_group_1("standby");
    let said = d.call("config.reload", json!({"dry_run": true})).await;
    assert_eq!(
        said["changes"],
        line("active_optimized", "standby"),
        "{said}"
    );
    assert_eq!(
        unit_attentions(&mut c).await,
        [],
        "a dry run changes nothing"
    );
    assert_eq!(c.run(&rw10(0x28, 0, 1), 512, &[]).await.0, 0);

    let done = d.call("config.reload", Value::Null).await;
    assert_eq!(done["changes"], said["changes"]);
    assert_eq!(unit_attentions(&mut c).await, [(0x2a, 0x06)]);
    let (status, data) = c.run(&rtpg, 256, &[]).await;
    assert_eq!((status, group_1_state(&data)), (0, 2), "group 1 in standby");
    assert_eq!(
        c.run(&rw10(0x28, 0, 1), 512, &[]).await.0,
        2,
        "a READ through a port in standby is refused"
    );

    set_group_1("active_optimized");
    let done = d.call("config.reload", Value::Null).await;
    assert_eq!(
        done["changes"],
        line("standby", "active_optimized"),
        "{done}"
    );
    assert_eq!(unit_attentions(&mut c).await, [(0x2a, 0x06)]);
    let (status, data) = c.run(&rtpg, 256, &[]).await;
    assert_eq!((status, group_1_state(&data)), (0, 0));
    assert_eq!(c.run(&rw10(0x28, 0, 1), 512, &[]).await.0, 0);
    assert_eq!(
        d.call("session.list", Value::Null).await["sessions"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "the session stayed"
    );
}

/// Explicit ALUA, turned on by a reload: an initiator's SET TARGET PORT
/// GROUPS through the non-optimized port fails the target over (group 2
/// active/optimized, group 1 standby); the other session hears ASYMMETRIC
/// ACCESS STATE CHANGED, the asking one does not; `lun.list` says an
/// initiator set it; the running configuration keeps it as
/// `[target.alua_state]` through a control-socket change and a save; a
/// reload from a file without it puts the file's states back and says
/// so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initiators_stpg_fails_the_target_over_and_the_running_configuration_keeps_it() {
    let d = Daemon::start().await;
    let config = d._process.dir().join("two-groups.toml");
    d.call("config.save", Value::Null).await;
    let saved = std::fs::read_to_string(&config).unwrap();

    let mut passive = Client::login(d.portal(2).await, 2).await;
    let mut active = Client::login(d.portal(1).await, 1).await;
    passive.ready().await;
    active.ready().await;
    let (cdb, list) = stpg_command(&[(2, 0), (1, 2)]);
    let (status, _) = passive.run(&cdb, 0, &list).await;
    assert_eq!(
        status, 2,
        "refused while the target allows implicit ALUA only"
    );

    let mut doc: toml::Table = saved.parse().unwrap();
    doc["target"].as_array_mut().unwrap()[0]
        .as_table_mut()
        .unwrap()
        .insert("explicit_alua".into(), true.into());
    std::fs::write(&config, toml::to_string(&doc).unwrap()).unwrap();
    let done = d.call("config.reload", Value::Null).await;
    assert_eq!(
        done["changes"],
        json!([format!(
            "explicit ALUA of {TARGET}: on, initiators may set its ALUA states with SET TARGET \
             PORT GROUPS (initiators hear INQUIRY DATA HAS CHANGED)"
        )]),
        "{done}"
    );
    assert_eq!(unit_attentions(&mut passive).await, [(0x3f, 0x03)]);
    assert_eq!(unit_attentions(&mut active).await, [(0x3f, 0x03)]);
    let (status, inquiry) = passive.run(&[0x12, 0, 0, 0, 96, 0], 96, &[]).await;
    assert_eq!((status, (inquiry[5] >> 4) & 3), (0, 3), "TPGS 11b");

    let (status, _) = passive.run(&cdb, 0, &list).await;
    assert_eq!(status, 0, "SET TARGET PORT GROUPS");
    assert_eq!(
        unit_attentions(&mut passive).await,
        [],
        "the asker is not told"
    );
    assert_eq!(unit_attentions(&mut active).await, [(0x2a, 0x06)]);
    assert_eq!(
        group_states(&mut passive).await,
        [(2, 1), (0, 1)],
        "both set by the command"
    );
    assert_eq!(passive.run(&rw10(0x28, 0, 1), 512, &[]).await.0, 0);
    assert_eq!(
        active.run(&rw10(0x28, 0, 1), 512, &[]).await.0,
        2,
        "group 1 is in standby now"
    );
    let list = d.call("lun.list", Value::Null).await;
    assert_eq!(list["targets"][0]["explicit_alua"], true);
    // What runs is what the configuration says, and a control-socket
    // change keeps it.
    failed_over_by_an_initiator(&d).await;
    let added = d
        .call("acl.add", json!({"target": TARGET, "initiator": INITIATOR}))
        .await;
    assert!(!added["changes"].to_string().contains("ALUA"), "{added}");
    assert_eq!(unit_attentions(&mut active).await, []);
    assert_eq!(active.run(&rw10(0x28, 0, 1), 512, &[]).await.0, 2);

    // Saved, the file keeps it: a reload of it changes nothing.
    d.call("config.save", Value::Null).await;
    let done = d.call("config.reload", Value::Null).await;
    assert_eq!(done["changes"], json!([]), "{done}");

    // A file without it puts its own states back, and says what that undoes.
    let mut doc: toml::Table = std::fs::read_to_string(&config).unwrap().parse().unwrap();
    doc["target"].as_array_mut().unwrap()[0]
        .as_table_mut()
        .unwrap()
        .remove("alua_state");
    std::fs::write(&config, toml::to_string(&doc).unwrap()).unwrap();
    let done = d.call("config.reload", Value::Null).await;
    let undo = |id: u16, from: &str, to: &str| {
        format!(
            "ALUA state of portal group {id} of {TARGET}: {from} -> {to} (initiators hear \
             ASYMMETRIC ACCESS STATE CHANGED; this undoes the state an initiator set with SET \
             TARGET PORT GROUPS (`config.save` before a reload keeps such states))"
        )
    };
    assert_eq!(
        done["changes"],
        json!([
            undo(1, "standby", "active_optimized"),
            undo(2, "active_optimized", "active_non_optimized")
        ]),
        "{done}"
    );
    assert_eq!(unit_attentions(&mut passive).await, [(0x2a, 0x06)]);
    assert_eq!(
        group_states(&mut passive).await,
        [(0, 2), (1, 2)],
        "the file's states, set implicitly"
    );
}

/// A SET TARGET PORT GROUPS asking each (group, state code): its CDB and
/// parameter list.
fn stpg_command(requests: &[(u16, u8)]) -> (Vec<u8>, Vec<u8>) {
    let mut list = vec![0u8; 4];
    for (group, state) in requests {
        list.extend_from_slice(&[*state, 0]);
        list.extend_from_slice(&group.to_be_bytes());
    }
    let mut cdb = vec![0xa4, 0x0a, 0, 0, 0, 0];
    cdb.extend_from_slice(&(list.len() as u32).to_be_bytes());
    cdb.extend_from_slice(&[0, 0]);
    (cdb, list)
}

/// With `[fabric] state_dir`, the states an initiator set with SET TARGET
/// PORT GROUPS outlive a restart of the daemon from a configuration file
/// that was never saved: the target comes back failed over, its groups
/// reported as set by the command, and `config.show` says so. A reload of
/// that file undoes them (and says so), and a restart after that comes
/// back with the file's own states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_an_initiator_set_outlive_a_restart_of_the_daemon() {
    let mut d = Daemon::start_with(|_| {
        "explicit_alua = true\n\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\n"
            .into()
    })
    .await;
    let mut passive = Client::login(d.portal(2).await, 2).await;
    passive.ready().await;
    let (cdb, list) = stpg_command(&[(2, 0), (1, 2)]);
    assert_eq!(
        passive.run(&cdb, 0, &list).await.0,
        0,
        "SET TARGET PORT GROUPS"
    );
    assert_eq!(group_states(&mut passive).await, [(2, 1), (0, 1)]);
    drop(passive);

    d.restart().await;
    let log = d._process.log_text();
    assert!(
        log.contains("ALUA state set by SET TARGET PORT GROUPS before the restart restored"),
        "{log}"
    );
    let mut passive = Client::login(d.portal(2).await, 2).await;
    let mut active = Client::login(d.portal(1).await, 1).await;
    passive.ready().await;
    active.ready().await;
    assert_eq!(
        group_states(&mut passive).await,
        [(2, 1), (0, 1)],
        "failed over still, set by the command"
    );
    assert_eq!(passive.run(&rw10(0x28, 0, 1), 512, &[]).await.0, 0);
    assert_eq!(
        active.run(&rw10(0x28, 0, 1), 512, &[]).await.0,
        2,
        "group 1 is in standby still"
    );
    failed_over_by_an_initiator(&d).await;

    // A reload of the file (which never had them) puts its states back and
    // says what that undoes; a restart after it keeps the file's states.
    let done = d.call("config.reload", Value::Null).await;
    assert_eq!(done["changes"].as_array().unwrap().len(), 2, "{done}");
    assert!(
        done["changes"][0]
            .as_str()
            .unwrap()
            .contains("this undoes the state an initiator set"),
        "{done}"
    );
    drop((passive, active));
    d.restart().await;
    let mut passive = Client::login(d.portal(2).await, 2).await;
    passive.ready().await;
    assert_eq!(
        group_states(&mut passive).await,
        [(0, 2), (1, 2)],
        "the file's states"
    );
}

/// `lun.list` and `config.show` agree that an initiator failed the target
/// over: group 1 in standby, group 2 active/optimized, both set by it.
async fn failed_over_by_an_initiator(d: &Daemon) {
    let list = d.call("lun.list", Value::Null).await;
    assert_eq!(
        list["targets"][0]["port_groups"],
        json!([
            {"id": 1, "state": "standby", "ports": [1], "set_by": "initiator"},
            {"id": 2, "state": "active_optimized", "ports": [2], "set_by": "initiator"},
        ])
    );
    let shown: toml::Table = d.call("config.show", Value::Null).await["toml"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let states = &shown["target"][0]["alua_state"];
    assert_eq!(
        (states["1"].as_str(), states["2"].as_str()),
        (Some("standby"), Some("active_optimized")),
        "{shown}"
    );
}

/// REPORT TARGET PORT GROUPS through `c`: (state, STATUS CODE) of groups 1
/// and 2 (one port each).
async fn group_states(c: &mut Client) -> [(u8, u8); 2] {
    let rtpg = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let (status, data) = c.run(&rtpg, 256, &[]).await;
    assert_eq!(status, 0, "REPORT TARGET PORT GROUPS");
    [(data[4] & 0x0f, data[9]), (data[16] & 0x0f, data[21])]
}

/// A target removed by mistake comes back from the saved file as it was
/// defined there (`target.restore`), the rest of the running configuration
/// untouched; a dry run first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_target_is_restored_from_the_saved_file() {
    let d = Daemon::start().await;
    let config = d._process.dir().join("two-groups.toml");
    let other = "iqn.2026-11.io.blockwire:ctl-e2e-other";
    d.call(
        "target.add",
        json!({"target": {"name": other, "alias": "kept alias", "portal_groups": [2],
            "allow": [INITIATOR], "lun": [{"id": 4, "backstore": "ram", "size": "2M"}]}}),
    )
    .await;
    d.call("config.save", Value::Null).await;
    d.call("target.remove", json!({"target": other})).await;
    // Meanwhile the running configuration moves on.
    d.call(
        "lun.add",
        json!({"target": TARGET, "lun": {"id": 1, "backstore": "ram", "size": "1M"}}),
    )
    .await;
    let names = |v: &Value| -> Vec<String> {
        v["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let from = config.to_str().unwrap();
    let said = d
        .call(
            "target.restore",
            json!({"from": from, "target": other, "dry_run": true}),
        )
        .await;
    assert_eq!(
        said["changes"],
        json!([format!("target {other} added (1 LUNs)")]),
        "{said}"
    );
    assert_eq!(names(&d.call("lun.list", Value::Null).await), [TARGET]);
    let done = d
        .call("target.restore", json!({"from": from, "target": other}))
        .await;
    assert_eq!(done["changes"], said["changes"]);
    let list = d.call("lun.list", Value::Null).await;
    assert_eq!(names(&list), [TARGET, other]);
    let shown = d.call("config.show", Value::Null).await["toml"]
        .as_str()
        .unwrap()
        .to_owned();
    let doc: toml::Table = shown.parse().unwrap();
    let restored = doc["target"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"].as_str() == Some(other))
        .unwrap();
    assert_eq!(restored["alias"].as_str(), Some("kept alias"));
    assert_eq!(
        restored["allow"],
        toml::Value::Array(vec![INITIATOR.into()])
    );
    assert_eq!(restored["lun"][0]["id"].as_integer(), Some(4));
    let first = doc["target"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"].as_str() == Some(TARGET))
        .unwrap();
    assert_eq!(first["lun"].as_array().unwrap().len(), 2, "LUN 1 stays");

    // Its reservations come back with it: a registration made with APTPL
    // (kept under state_dir) before the target was removed again.
    let mut c = Client::login_to(d.portal(2).await, 3, other).await;
    c.lun = 4;
    c.ready().await;
    let mut register = [0u8; 24];
    register[8..16].copy_from_slice(&0xfeed_f00d_u64.to_be_bytes());
    register[20] = 1; // APTPL
    let prout = [0x5f, 0x00, 0, 0, 0, 0, 0, 0, 24, 0];
    assert_eq!(
        c.run(&prout, 0, &register).await.0,
        0,
        "PROUT REGISTER with APTPL"
    );
    drop(c);
    d.call("target.remove", json!({"target": other, "force": true}))
        .await;
    d.call("target.restore", json!({"from": from, "target": other}))
        .await;
    let mut c = Client::login_to(d.portal(2).await, 4, other).await;
    c.lun = 4;
    c.ready().await;
    let read_keys = [0x5e, 0x00, 0, 0, 0, 0, 0, 0, 64, 0];
    let (status, keys) = c.run(&read_keys, 64, &[]).await;
    assert_eq!(status, 0, "PRIN READ KEYS");
    assert_eq!(&keys[4..8], &8u32.to_be_bytes(), "one key: {keys:02x?}");
    assert_eq!(&keys[8..16], &0xfeed_f00d_u64.to_be_bytes(), "{keys:02x?}");

    // Nothing left to restore, and a target that runs is not overwritten.
    let e = d.refusal("target.restore", json!({"from": from})).await;
    assert!(e.contains("nothing to restore"), "{e}");
    let e = d
        .refusal("target.restore", json!({"from": from, "target": TARGET}))
        .await;
    assert!(e.contains("runs already"), "{e}");
}

async fn only_tsih_of(d: &Daemon, target: &str) -> Option<u64> {
    let v = d.call("session.list", Value::Null).await;
    v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["target"] == target)
        .map(|s| s["tsih"].as_u64().unwrap())
}

/// The QoS fields of LUN `lun` in `lun.list`.
async fn qos_of(d: &Daemon, lun: u64) -> Value {
    let v = d.call("lun.list", Value::Null).await;
    v["targets"][0]["luns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lun"] == lun)
        .unwrap_or_else(|| panic!("no LUN {lun}: {v}"))["qos"]
        .clone()
}

/// A LUN's IOPS ceiling holds back its commands (not another LUN's, not
/// INQUIRY), an aborted held command never runs nor delays the rest, and
/// `lun.limit` changes the ceiling while the session runs, dry run first.
/// Two hosts share LUN 0, each held to 20 IOPS of its own: one host's deep
/// queue paces that host, and the other's READ goes at once.
#[tokio::test]
async fn each_initiator_keeps_to_its_own_ceiling_on_a_shared_lun() {
    const OTHER_HOST: &str = "iqn.2026-12.io.blockwire:ctl-e2e-other-host";
    let d = Daemon::start_with(|_| {
        "[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\ninitiator_iops_limit = 20\n"
            .into()
    })
    .await;
    let portal = d.portal(1).await;
    let mut busy = Client::login(portal, 1).await;
    busy.ready().await;
    let mut other = Client::login_as(portal, 2, OTHER_HOST, TARGET).await;
    other.ready().await;
    let q = qos_of(&d, 0).await;
    assert_eq!(
        (q["iops_limit"].clone(), q["initiator_iops_limit"].clone()),
        (Value::Null, json!(20)),
        "{q}"
    );

    // 12 READs at once from the busy host: at 20 IOPS (one every 50 ms, a
    // burst of two) its last starts no sooner than 10 x 50 ms on.
    let t0 = std::time::Instant::now();
    let reads: Vec<ScsiCommand> = (0..12)
        .map(|i| busy.command(&rw10(0x28, i * 8, 8), true, false, 4096))
        .collect();
    for r in &reads {
        busy.conn.send(Pdu::new(Bhs::ScsiCommand(*r))).await;
    }
    // Once the busy host's queue is booked (all but the burst waiting),
    // the other host's READ.
    loop {
        let q = qos_of(&d, 0).await;
        if q["waiting"] == 10 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "never booked: {q}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let t1 = std::time::Instant::now();
    let (status, data) = other.run(&rw10(0x28, 0, 8), 4096, &[]).await;
    let other_took = t1.elapsed();
    assert_eq!((status, data.len()), (0, 4096));
    let mut answered = 0;
    while answered < reads.len() {
        let pdu = busy
            .recv_within(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{answered} of the busy host's READs answered"));
        answered += match &pdu.bhs {
            Bhs::ScsiResponse(_) => 1,
            Bhs::DataIn(di) if di.status == Some(0) => 1,
            _ => 0,
        };
    }
    let busy_took = t0.elapsed();
    eprintln!("the busy host's 12 READs took {busy_took:?}, the other host's one {other_took:?}");
    assert!(
        busy_took >= Duration::from_millis(500),
        "{busy_took:?}: faster than 20 IOPS"
    );
    // Under one ceiling for both, the other host's READ would be booked
    // behind the busy host's queue, and answered with its last READs.
    assert!(
        other_took * 2 < busy_took,
        "the other host waited for the busy one's queue: {other_took:?} of {busy_took:?}"
    );
    let q = qos_of(&d, 0).await;
    assert!(q["delayed_commands"].as_u64().unwrap() >= 9, "{q}");
    assert_eq!(q["waiting"], 0, "{q}");

    // Lifted live; the change names it.
    let done = d
        .call(
            "lun.limit",
            json!({"target": TARGET, "lun": 0, "initiator_iops": 0}),
        )
        .await;
    assert_eq!(
        done["changes"],
        json!([format!(
            "QoS of LUN 0 of {TARGET}: each initiator 20 IOPS -> no limit (commands from now on)"
        )]),
        "{done}"
    );
    assert_eq!(qos_of(&d, 0).await["initiator_iops_limit"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_qos_ceiling_paces_its_commands_and_changes_live() {
    let d = Daemon::start_with(|_| {
        "[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\niops_limit = 20\n\n\
         [[target.lun]]\nid = 1\nbackstore = \"ram\"\nsize = \"8M\"\n"
            .into()
    })
    .await;
    let mut c = Client::login(d.portal(1).await, 1).await;
    c.ready().await;
    c.lun = 1;
    c.ready().await;
    c.lun = 0;
    let q = qos_of(&d, 0).await;
    assert_eq!(
        (q["iops_limit"].clone(), q["bandwidth_limit"].clone()),
        (json!(20), Value::Null),
        "{q}"
    );
    assert_eq!(qos_of(&d, 1).await["iops_limit"], Value::Null);

    // 16 READs of LUN 0 at once: at 20 IOPS (one every 50 ms, a burst of
    // one) the last can start no sooner than 14 x 50 ms after the first.
    let t0 = std::time::Instant::now();
    let reads: Vec<ScsiCommand> = (0..16)
        .map(|i| c.command(&rw10(0x28, i * 8, 8), true, false, 4096))
        .collect();
    for r in &reads {
        c.conn.send(Pdu::new(Bhs::ScsiCommand(*r))).await;
    }
    // Meanwhile LUN 1 and INQUIRY of LUN 0 are answered at once: before
    // LUN 0's queue drains.
    c.lun = 1;
    let other = c.command(&rw10(0x28, 0, 8), true, false, 4096);
    c.conn.send(Pdu::new(Bhs::ScsiCommand(other))).await;
    c.lun = 0;
    let inquiry = c.command(&[0x12, 0, 0, 0, 96, 0], true, false, 96);
    c.conn.send(Pdu::new(Bhs::ScsiCommand(inquiry))).await;
    let waiting = loop {
        let q = qos_of(&d, 0).await;
        if q["waiting"].as_u64().unwrap() > 0 {
            break q["waiting"].as_u64().unwrap();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no command ever waited: {q}"
        );
    };
    // Abort the last READ while it waits its turn.
    let last = *reads.last().unwrap();
    assert_eq!(
        c.tmf(TmfFunction::AbortTask, last.itt, last.cmd_sn).await,
        TmfResponse::FunctionComplete
    );
    // Statuses in the order they came (the TMF's wait saw some of them).
    let ours: Vec<u32> = reads
        .iter()
        .map(|r| r.itt)
        .chain([other.itt, inquiry.itt])
        .collect();
    let statuses = |seen: &[Pdu]| -> Vec<(u32, u8)> {
        seen.iter()
            .filter_map(|p| match &p.bhs {
                Bhs::ScsiResponse(r) => Some((r.itt, r.status)),
                Bhs::DataIn(di) => di.status.map(|s| (di.itt, s)),
                _ => None,
            })
            .filter(|(itt, _)| ours.contains(itt))
            .collect()
    };
    while statuses(&c.seen).len() < reads.len() + 1 {
        let got = statuses(&c.seen);
        c.recv_within(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("answers stopped after {got:x?}"));
    }
    let answered = statuses(&c.seen);
    assert!(answered.iter().all(|&(_, s)| s == 0), "{answered:x?}");
    let order: Vec<u32> = answered.iter().map(|&(itt, _)| itt).collect();
    let paced = t0.elapsed();
    eprintln!("15 READs at 20 IOPS answered in {paced:?} ({waiting} waited at once)");
    assert!(
        paced >= Duration::from_millis(600),
        "{paced:?}: faster than 20 IOPS"
    );
    let at = |itt: u32| order.iter().position(|&i| i == itt);
    let first_held = at(reads[2].itt).expect("answered");
    assert!(
        at(other.itt).unwrap() < first_held,
        "LUN 1 waited for LUN 0: {order:x?}"
    );
    assert!(
        at(inquiry.itt).unwrap() < first_held,
        "INQUIRY waited: {order:x?}"
    );
    while c.recv_within(Duration::from_millis(300)).await.is_some() {}
    c.assert_never_answered(last.itt, "READ held by the QoS ceiling");
    let q = qos_of(&d, 0).await;
    assert_eq!(q["waiting"], 0, "{q}");
    let delayed = q["delayed_commands"].as_u64().unwrap();
    assert!(delayed >= 13, "{q}");
    assert_eq!(qos_of(&d, 1).await["delayed_commands"], 0);

    // Lifted live, a dry run first.
    let lift = json!({"target": TARGET, "lun": 0, "iops": 0});
    let line = json!([format!(
        "QoS of LUN 0 of {TARGET}: 20 IOPS -> no limit (commands from now on)"
    )]);
    let mut dry = lift.clone();
    dry["dry_run"] = json!(true);
    let said = d.call("lun.limit", dry).await;
    assert_eq!(said["changes"], line, "{said}");
    assert_eq!(
        qos_of(&d, 0).await["iops_limit"],
        20,
        "a dry run changed the ceiling"
    );
    let done = d.call("lun.limit", lift).await;
    assert_eq!(done["changes"], line, "{done}");
    for i in 0..40 {
        assert_eq!(c.run(&rw10(0x28, i * 8, 8), 4096, &[]).await.0, 0);
    }
    let q = qos_of(&d, 0).await;
    assert_eq!(
        (q["iops_limit"].clone(), q["delayed_commands"].as_u64()),
        (Value::Null, Some(delayed)),
        "{q}"
    );

    // A bandwidth ceiling through the CLI: 1 MiB/s holds the second and
    // third 512 KiB READ back.
    let (code, out, err) = d.ctl_cli(
        "lun.limit",
        &json!({"target": TARGET, "lun": 0, "bandwidth": "1M"}).to_string(),
    );
    assert_eq!(code, 0, "ctl lun.limit: {out}{err}");
    assert!(
        out.contains("QoS of LUN 0 of") && out.contains("no limit -> 1 MiB/s"),
        "{out}"
    );
    let t1 = std::time::Instant::now();
    for i in 0..3 {
        assert_eq!(
            c.run(&rw10(0x28, i * 1024, 1024), 512 << 10, &[]).await.0,
            0
        );
    }
    assert!(
        t1.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t1.elapsed()
    );
    assert_eq!(qos_of(&d, 0).await["bandwidth_limit"], 1 << 20);
    // What the operator gets wrong is named.
    let bad = d
        .refusal(
            "lun.limit",
            json!({"target": TARGET, "lun": 0, "bandwidth": "10K"}),
        )
        .await;
    assert!(
        bad.contains("below the least") && bad.contains("nothing was changed"),
        "{bad}"
    );
    let bad = d
        .refusal("lun.limit", json!({"target": TARGET, "lun": 0}))
        .await;
    assert!(bad.contains("needs \"iops\""), "{bad}");
}

/// Every data path is held to its LUN's QoS ceiling: at 1 IOPS, on a file
/// LUN served by sendfile, the copy path, the I/O engine (serial and
/// synchronized) and double-buffered WRITEs, the second command waits its
/// turn and then runs, and a third one, aborted while it waits, never
/// answers nor lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_data_path_waits_for_its_qos_turn() {
    let paths = DATA_PATHS;
    let d = Daemon::start_with(|dir| data_path_luns(dir, "iops_limit = 1\n")).await;
    let mut c = Client::login(d.portal(1).await, 1).await;
    for (i, (name, _, is_write)) in paths.iter().enumerate() {
        let lun = i as u16;
        let (data, blocks) = on_path_lun(&mut c, lun).await;
        // The first command fits in the burst; the second waits about a
        // second for its turn, the third about two.
        let t0 = std::time::Instant::now();
        assert_eq!(
            c.run(&rw10(0x2a, 0, blocks), 0, &data).await.0,
            0,
            "{name}: WRITE"
        );
        let second = c.command(&rw10(0x28, 0, blocks), true, false, data.len() as u32);
        c.conn.send(Pdu::new(Bhs::ScsiCommand(second))).await;
        let third = if *is_write {
            let cmd = c.command(&rw10(0x2a, 256, blocks), false, true, data.len() as u32);
            c.conn
                .send(Pdu::with_data(Bhs::ScsiCommand(cmd), data.clone()))
                .await;
            cmd
        } else {
            let cmd = c.command(&rw10(0x28, 0, blocks), true, false, data.len() as u32);
            c.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
            cmd
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while qos_of(&d, lun.into()).await["waiting"].as_u64() < Some(2) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}: nothing waited"
            );
        }
        let r = c.tmf(TmfFunction::AbortTask, third.itt, third.cmd_sn).await;
        assert_eq!(r, TmfResponse::FunctionComplete, "{name}");
        let (status, back) = c.wait_status(second.itt, data.len()).await;
        assert_eq!(
            (status, back == data),
            (0, true),
            "{name}: the second command"
        );
        assert!(
            t0.elapsed() >= Duration::from_millis(900),
            "{name}: {:?}",
            t0.elapsed()
        );
        let q = qos_of(&d, lun.into()).await;
        assert_eq!(
            (q["waiting"].as_u64(), q["delayed_commands"].as_u64()),
            (Some(0), Some(2)),
            "{name}: {q}"
        );
        if *is_write {
            // Past the aborted WRITE's turn, had it kept its place.
            tokio::time::sleep(Duration::from_millis(1200)).await;
            let (status, back) = c
                .run(&rw10(0x28, 256, blocks), data.len() as u32, &[])
                .await;
            assert_eq!(status, 0);
            assert!(
                back.iter().all(|&b| b == 0),
                "{name}: the aborted WRITE landed"
            );
        }
        while c.recv_within(Duration::from_millis(200)).await.is_some() {}
        c.assert_never_answered(third.itt, name);
    }
}

/// A WRITE that its LUN's ceiling holds back gets its R2Ts only when its
/// turn comes, and takes no share of the connection's write budget before:
/// with a 1 MiB budget, one 512 KiB WRITE of LUN 0 holding its share (its
/// data not sent yet) and two more held by LUN 0's 1 IOPS ceiling, a 512
/// KiB WRITE of LUN 1 is asked for its data at once (had the held WRITEs
/// taken their shares on arrival, it and the third would have been
/// answered TASK SET FULL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_write_asks_for_its_data_at_its_turn_and_holds_no_budget_before() {
    let d = Daemon::start_with_fabric("write_budget = \"1M\"\n", |_| {
        "[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\niops_limit = 1\n\n\
         [[target.lun]]\nid = 1\nbackstore = \"ram\"\nsize = \"8M\"\n"
            .into()
    })
    .await;
    let mut c = Client::login(d.portal(1).await, 1).await;
    c.lun = 1;
    c.ready().await;
    c.lun = 0;
    c.ready().await;
    const LEN: usize = 512 << 10;
    let blocks = (LEN / 512) as u16;
    let data = |seed: u8| -> Vec<u8> { (0..LEN).map(|i| (i % 251) as u8 ^ seed).collect() };
    let mut writes = std::collections::HashMap::new();
    let mut sent_at = std::collections::HashMap::new();
    let mut send_write = |c: &mut Client, lba: u32, seed: u8| {
        let cmd = c.command(&rw10(0x2a, lba, blocks), false, true, LEN as u32);
        writes.insert(cmd.itt, (c.lun, data(seed)));
        sent_at.insert(cmd.itt, std::time::Instant::now());
        cmd
    };
    let a = send_write(&mut c, 0, 1);
    let b = send_write(&mut c, 2048, 2);
    let third = send_write(&mut c, 4096, 3);
    c.lun = 1;
    let other = send_write(&mut c, 0, 4);
    c.lun = 0;
    for cmd in [a, b, third, other] {
        c.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    }
    // Answer R2Ts as they come, but A's only once LUN 1's WRITE is done, so
    // A holds its share of the budget all that time.
    let mut stashed = Vec::new();
    let mut first_r2t = std::collections::HashMap::new();
    let mut status = std::collections::HashMap::new();
    while status.len() < 4 {
        let pdu = c
            .recv_within(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("stuck with statuses {status:?}"));
        let r = match pdu.bhs {
            Bhs::R2t(r) => r,
            Bhs::ScsiResponse(r) => {
                status.insert(r.itt, r.status);
                if r.itt == other.itt {
                    for r in std::mem::take(&mut stashed) {
                        answer_r2t(&mut c, &r, &writes[&r.itt].1).await;
                    }
                }
                continue;
            }
            other => panic!("unexpected {other:?}"),
        };
        first_r2t
            .entry(r.itt)
            .or_insert_with(std::time::Instant::now);
        if r.itt == a.itt && !status.contains_key(&other.itt) {
            stashed.push(r);
        } else {
            answer_r2t(&mut c, &r, &writes[&r.itt].1).await;
        }
    }
    for (itt, s) in &status {
        assert_eq!(*s, 0, "WRITE {itt:#x}: statuses {status:?}");
    }
    let asked_after = |itt: u32| first_r2t[&itt].duration_since(sent_at[&itt]);
    assert!(
        asked_after(other.itt) < Duration::from_millis(900),
        "{:?}",
        asked_after(other.itt)
    );
    assert!(
        asked_after(b.itt) >= Duration::from_millis(900),
        "{:?}",
        asked_after(b.itt)
    );
    assert!(
        asked_after(third.itt) >= Duration::from_millis(1900),
        "{:?}",
        asked_after(third.itt)
    );
    let q = qos_of(&d, 0).await;
    assert_eq!(q["waiting"].as_u64(), Some(0), "{q}");
    d.call("lun.limit", json!({"target": TARGET, "lun": 0, "iops": 0}))
        .await;
    for (cmd, lba) in [(a, 0), (b, 2048), (third, 4096), (other, 0)] {
        let (lun, expected) = &writes[&cmd.itt];
        c.lun = *lun;
        let (s, back) = c.run(&rw10(0x28, lba, blocks), LEN as u32, &[]).await;
        assert_eq!(
            (s, &back == expected),
            (0, true),
            "WRITE {:#x} read back",
            cmd.itt
        );
    }
}

/// Sends the data R2T `r` asks for, from `data`, in 8 KiB Data-Out PDUs.
async fn answer_r2t(c: &mut Client, r: &blockwire_pdu::pdu::R2t, data: &[u8]) {
    let (start, end) = (
        r.buffer_offset as usize,
        (r.buffer_offset + r.desired_data_transfer_length) as usize,
    );
    for (sn, at) in (start..end).step_by(8192).enumerate() {
        let to = (at + 8192).min(end);
        let out = blockwire_pdu::pdu::DataOut {
            final_bit: to == end,
            lun: r.lun,
            itt: r.itt,
            ttt: r.ttt,
            exp_stat_sn: 0,
            data_sn: sn as u32,
            buffer_offset: at as u32,
        };
        c.conn
            .send(Pdu::with_data(Bhs::DataOut(out), data[at..to].to_vec()))
            .await;
    }
}

/// Soft-threshold unit attentions (THIN PROVISIONING SOFT THRESHOLD REACHED)
/// `c` has pending: TEST UNIT READY until GOOD; any other unit attention
/// fails the test.
async fn soft_threshold_warnings(c: &mut Client) -> usize {
    let seen = unit_attentions(c).await;
    assert!(seen.iter().all(|&s| s == (0x38, 0x07)), "{seen:?}");
    seen.len()
}

/// Polls `c` (every 100 ms, at most 5 s) for one soft-threshold warning.
async fn wait_for_soft_threshold(c: &mut Client, what: &str) {
    for _ in 0..50 {
        match soft_threshold_warnings(c).await {
            0 => tokio::time::sleep(Duration::from_millis(100)).await,
            1 => return,
            n => panic!("{n} warnings for one crossing {what}"),
        }
    }
    panic!("no THIN PROVISIONING SOFT THRESHOLD REACHED within 5 s {what}");
}

/// A RAM LUN with `low_space_threshold` against a small `ram_limit`: once the
/// RAM left falls below the threshold, an initiator hears THIN PROVISIONING
/// SOFT THRESHOLD REACHED (the daemon's watcher looks once a second), once;
/// a reload that raises the threshold sets it on the running unit (no LUN
/// changes, sessions go on) and warns again; the log page tells the space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_low_on_space_warns_its_initiators_and_a_reload_moves_the_threshold() {
    use blockwire_initiator::{InitiatorConfig, Session};
    let lun = |threshold: &str| {
        format!(
            "[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"64M\"\n\
             low_space_threshold = \"{threshold}\"\n"
        )
    };
    let mut d = Daemon::start_with_fabric("ram_limit = \"16M\"", |_| lun("8M")).await;
    let portal = d.portal(1).await;
    // The writer (blockwire's initiator, which sends a command that meets a
    // unit attention again, as the SCSI mid-layer does) and a watcher on a
    // nexus of its own.
    let writer = Session::connect(
        InitiatorConfig::new("iqn.2026-12.io.blockwire.test:thin-writer"),
        &portal.to_string(),
        TARGET,
    )
    .await
    .expect("login");
    let mut c = Client::login(portal, 1).await;
    assert_eq!(unit_attentions(&mut c).await, [(0x29, 0x00)]);
    let mib = vec![0x5au8; 1 << 20];
    for m in 0..7 {
        writer.write(0, m * 2048, 2048, &mib).await.expect("WRITE");
    }
    // 7 MiB held, 9 left of 16: above the threshold's range.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(soft_threshold_warnings(&mut c).await, 0);
    for m in 7..9 {
        writer.write(0, m * 2048, 2048, &mib).await.expect("WRITE");
    }
    // 7 left: below the range (7.5 to 8.5 MiB).
    wait_for_soft_threshold(&mut c, "after the RAM left fell below the threshold").await;
    // Lower still is no news: no second warning.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(soft_threshold_warnings(&mut c).await, 0, "warned twice");
    let log = d._process.log_text();
    assert_eq!(log.matches("low on space").count(), 1, "{log}");
    assert!(log.contains("available=7340032 threshold=8388608"), "{log}");

    // LOG SENSE, Logical Block Provisioning page: 7 MiB available (shared
    // with the other RAM LUNs), 9 used, in 1 MiB threshold sets.
    let (status, page) = c.run(&[0x4d, 0, 0x4c, 0, 0, 0, 0, 0, 64, 0], 64, &[]).await;
    assert_eq!(status, 0);
    let page = blockwire_pdu::scsi::LogPage::decode(&page[..28]).unwrap();
    let count = |code| {
        blockwire_pdu::scsi::ResourceCount::from_parameter(page.parameter(code).unwrap())
            .unwrap()
            .count
    };
    assert_eq!((count(1), count(2)), (7, 9));
    // lun.list says the same in bytes.
    let v = d.call("lun.list", Value::Null).await;
    assert_eq!(
        v["targets"][0]["luns"][0]["space"],
        json!({"used": 9 << 20, "available": 7 << 20, "low_space_threshold": 8 << 20}),
        "{v}"
    );

    // A reload raising the threshold to 12 MiB: the running unit takes it
    // and, 7 MiB left, warns again.
    let config = d._process.dir().join("two-groups.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\"8M\"", "\"12M\"")).unwrap();
    let v = d.call("config.reload", Value::Null).await;
    let changes = v.to_string();
    assert!(
        changes.contains(&format!(
            "low-space threshold of LUN 0 of {TARGET}: 12582912 bytes"
        )),
        "{changes}"
    );
    // The threshold's descriptor is in a mode page that changed (SBC-4
    // 6.5.9.1): MODE PARAMETERS CHANGED first; then, 7 MiB left, the
    // warning.
    let mut seen = Vec::new();
    for _ in 0..50 {
        seen.extend(unit_attentions(&mut c).await);
        if seen.contains(&(0x38, 0x07)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        seen,
        [(0x2a, 0x01), (0x38, 0x07)],
        "after the threshold rose above the RAM left"
    );
    let mut back = vec![0u8; 1 << 20];
    writer
        .read(0, 0, 2048, &mut back)
        .await
        .expect("READ on the same session");
    assert!(back.iter().all(|&b| b == 0x5a));
    // A block device takes no space as it is written: a threshold on it is
    // refused, by name, and nothing changes.
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("loop.img");
    std::fs::write(&backing, vec![0u8; 3 << 20]).unwrap();
    let device = loop_device::LoopDevice::over(&backing);
    let e = d
        .refusal(
            "lun.add",
            json!({"target": TARGET, "lun": {"id": 1, "backstore": "file",
                   "path": device.0.display().to_string(), "low_space_threshold": "1M"}}),
        )
        .await;
    assert!(
        e.contains("target.lun.low_space_threshold")
            && e.contains("does not take space as it is written"),
        "{e}"
    );
    // The file with the threshold starts again as it was changed.
    d.restart().await;
}

/// The sense key, ASC, ASCQ and INFORMATION of the answer to a READ(10)
/// of one block at `lba`; None: GOOD.
async fn read_sense(c: &mut Client, lba: u32) -> Option<(u8, u8, u8, u32)> {
    let cmd = c.command(&rw10(0x28, lba, 1), true, false, 512);
    c.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    loop {
        let pdu = c
            .recv_within(Duration::from_secs(5))
            .await
            .expect("no answer to READ(10)");
        match &pdu.bhs {
            Bhs::DataIn(d) if d.itt == cmd.itt && d.status == Some(0) => return None,
            Bhs::ScsiResponse(r) if r.itt == cmd.itt => {
                if r.status == 0 {
                    return None;
                }
                let s = &pdu.data[2..];
                let info = u32::from_be_bytes([s[3], s[4], s[5], s[6]]);
                return Some((s[2] & 0x0f, s[12], s[13], info));
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_changed_behind_a_protected_lun_is_reported_not_returned() {
    let mut image = PathBuf::new();
    let d = Daemon::start_with(|dir| {
        image = dir.join("pi.img");
        format!(
            "[[target.lun]]\nid = 0\nbackstore = \"file\"\npath = {image:?}\nsize = \"8M\"\n\
             protection = \"type1\"\n"
        )
    })
    .await;
    let portal = d.portal(1).await;
    let mut c = Client::login(portal, 1).await;
    c.ready().await;
    let data: Vec<u8> = (0..4 * 512).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(c.run(&rw10(0x2a, 100, 4), 0, &data).await.0, 0);
    assert_eq!(read_sense(&mut c, 102).await, None);
    // One byte of LBA 102 changed in the backing file, not through the target.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&image)
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, 102 * 512 + 9).unwrap();
        f.write_all_at(&[b[0] ^ 0x80], 102 * 512 + 9).unwrap();
    }
    // ABORTED COMMAND, LOGICAL BLOCK GUARD CHECK FAILED at LBA 102.
    assert_eq!(read_sense(&mut c, 102).await, Some((0x0b, 0x10, 0x01, 102)));
    assert_eq!(read_sense(&mut c, 101).await, None);
    let v = d.call("lun.list", Value::Null).await;
    assert_eq!(
        v["targets"][0]["luns"][0]["protection"],
        json!({"type": "type1", "guard_check_failures": 1, "reference_tag_check_failures": 0}),
        "{v}"
    );
    let log = d._process.log_text();
    assert!(log.contains("protection information check failed"), "{log}");
    assert!(log.contains("lba=102"), "{log}");
    // The tuples' file sits beside the image: 16 384 blocks, 8 bytes each.
    let tuples = image.with_file_name("pi.img.protection");
    assert_eq!(std::fs::metadata(tuples).unwrap().len(), 16_384 * 8);

    // A block device names the file its tuples go to (beside the device
    // node they would be in /dev); without one it is refused, by name.
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("loop.img");
    std::fs::write(&backing, vec![0u8; 4 << 20]).unwrap();
    let device = loop_device::LoopDevice::over(&backing);
    let lun = |extra: Value| {
        let mut l = json!({"id": 1, "backstore": "file",
                           "path": device.0.display().to_string(), "protection": "type1"});
        if let (Some(l), Some(extra)) = (l.as_object_mut(), extra.as_object()) {
            l.extend(extra.clone());
        }
        json!({"target": TARGET, "lun": l})
    };
    // Found by the dry run every change makes first, as by a start.
    let e = d.refusal("lun.add", lun(json!({}))).await;
    assert!(
        e.contains("target.lun.protection")
            && e.contains("is a block device")
            && e.contains("protection_file"),
        "{e}"
    );
    let named = dir.path().join("loop.protection");
    d.call(
        "lun.add",
        lun(json!({"protection_file": named.display().to_string()})),
    )
    .await;
    assert_eq!(std::fs::metadata(&named).unwrap().len(), 8192 * 8);
    let v = d.call("lun.list", Value::Null).await;
    assert_eq!(
        v["targets"][0]["luns"][1]["protection"]["type"], "type1",
        "{v}"
    );
}
