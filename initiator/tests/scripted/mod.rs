//! A scripted target's answers, shared by the tests that play one: a login step agreed
//! to, and a logout; and its reading of the initiator's PDUs.
// Each test binary uses what its script needs.
#![allow(dead_code)]

pub mod soft_rdma;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;

use blockwire_initiator::{InitiatorConfig, Session};

use blockwire_pdu::keys::{encode_text, parse_text};
use blockwire_pdu::pdu::codes::{LogoutResponseCode, ServiceResponse, TmfResponse};
use blockwire_pdu::pdu::{
    DataIn, LoginRequest, LoginResponse, LogoutRequest, LogoutResponse, ScsiCommand, ScsiResponse,
    TaskMgmtRequest, TaskMgmtResponse, RESERVED_TAG,
};
use blockwire_pdu::{Bhs, Digests, LoginStatus, Pdu, Stage};

/// Agrees to the login step `r` (with its text `data`): every negotiated key gets an
/// answer the initiator offered, its value or the last of a list (AuthMethod=CHAP,None:
/// None); declarations are not answered. The target moves to the stage the initiator
/// asks for, and gives TSIH 1 on entering full feature phase.
pub fn agree_to_login(r: &LoginRequest, data: &[u8], stat_sn: u32) -> Pdu {
    let declarative = [
        "InitiatorName",
        "InitiatorAlias",
        "SessionType",
        "TargetName",
        "MaxRecvDataSegmentLength",
        "InitiatorRecvDataSegmentLength",
    ];
    let keys: Vec<(String, String)> = parse_text(data)
        .expect("login keys")
        .into_iter()
        .filter(|(k, _)| !declarative.contains(&k.as_str()))
        .map(|(k, v)| {
            let last = v.rsplit(',').next().unwrap_or_default().to_owned();
            (k, last)
        })
        .collect();
    let nsg = if r.transit { r.nsg } else { r.csg };
    let full_feature = r.transit && nsg == Stage::FullFeature;
    Pdu::with_data(
        Bhs::LoginResponse(LoginResponse {
            transit: r.transit,
            continue_bit: false,
            csg: r.csg,
            nsg,
            version_max: 0,
            version_active: 0,
            isid: r.isid,
            tsih: u16::from(full_feature),
            itt: r.itt,
            stat_sn,
            exp_cmd_sn: r.cmd_sn,
            max_cmd_sn: r.cmd_sn.wrapping_add(8),
            status: LoginStatus::SUCCESS,
        }),
        encode_text(&keys).unwrap(),
    )
}

/// The initiator's next Logout Request on `s`, NOP-Outs passed over;
/// panics on any other PDU, or when the stream ends first.
pub fn next_logout(s: &mut TcpStream) -> LogoutRequest {
    loop {
        match read_pdu(s).map(|p| p.bhs) {
            Some(Bhs::LogoutRequest(r)) => return r,
            Some(Bhs::NopOut(_)) => {}
            other => panic!("expected a Logout Request, got {other:?}"),
        }
    }
}

/// Takes the initiator's next Logout Request on `s` ([`next_logout`]) and
/// closes the session as it asks.
pub fn agree_to_next_logout(s: &mut TcpStream, stat_sn: u32) {
    let r = next_logout(s);
    s.write_all(&agree_to_logout(&r, stat_sn).encode(Digests::NONE))
        .unwrap();
}

/// An Async Message of `event` with Parameter2 and Parameter3, numbered
/// with `stat_sn` and opening the window from `cmd_sn`.
pub fn async_message(
    event: blockwire_pdu::pdu::codes::AsyncEvent,
    stat_sn: u32,
    cmd_sn: u32,
    parameter2: u16,
    parameter3: u16,
) -> Pdu {
    Pdu::new(Bhs::AsyncMessage(blockwire_pdu::pdu::AsyncMessage {
        lun: blockwire_pdu::Lun::default(),
        stat_sn,
        exp_cmd_sn: cmd_sn,
        max_cmd_sn: cmd_sn.wrapping_add(8),
        event,
        vcode: 0,
        parameter1: 0,
        parameter2,
        parameter3,
    }))
}

/// Closes the session as `r` asks.
pub fn agree_to_logout(r: &LogoutRequest, stat_sn: u32) -> Pdu {
    Pdu::new(Bhs::LogoutResponse(LogoutResponse {
        response: LogoutResponseCode::Closed,
        itt: r.itt,
        stat_sn,
        exp_cmd_sn: r.cmd_sn,
        max_cmd_sn: r.cmd_sn.wrapping_add(8),
        time2wait: 0,
        time2retain: 0,
    }))
}

/// The next PDU the initiator sent on `s` (none: the stream ended or held no
/// PDU).
pub fn read_pdu(s: &mut TcpStream) -> Option<Pdu> {
    let mut head = [0u8; 48];
    s.read_exact(&mut head).ok()?;
    let ahs = usize::from(head[4]) * 4;
    let data = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    let mut rest = vec![0u8; ahs + data.next_multiple_of(4)];
    s.read_exact(&mut rest).ok()?;
    let whole = [&head[..], &rest[..]].concat();
    Some(Pdu::decode(&whole, Digests::NONE).ok()?.0)
}

/// Plays the target's side of a login on `s` to full feature phase, agreeing
/// to every step (see [`agree_to_login`]): the StatSN and CmdSN to go on with.
pub fn log_in(s: &mut TcpStream) -> (u32, u32) {
    let mut stat_sn = 0u32;
    loop {
        let pdu = read_pdu(s).expect("a login request");
        let Bhs::LoginRequest(r) = pdu.bhs else {
            panic!("expected a login request, got {:?}", pdu.bhs)
        };
        let reply = agree_to_login(&r, &pdu.data, stat_sn);
        stat_sn += 1;
        s.write_all(&reply.encode(Digests::NONE)).unwrap();
        if r.transit && r.nsg == Stage::FullFeature {
            return (stat_sn, r.cmd_sn);
        }
    }
}

/// Takes one connection on `listener`, logs the initiator in, and answers
/// each SCSI command with the PDUs `answer` makes of it: the command, its
/// StatSN and the CmdSN to acknowledge, and how many commands came before
/// it. Keepalive NOP-Outs go unanswered; the logout is agreed to. Returns
/// how many commands came.
pub fn serve_commands(
    listener: TcpListener,
    mut answer: impl FnMut(&ScsiCommand, u32, u32, usize) -> Vec<Pdu>,
) -> usize {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let (mut stat_sn, mut cmd_sn) = log_in(&mut s);
    let mut commands = 0;
    while let Some(pdu) = read_pdu(&mut s) {
        match pdu.bhs {
            Bhs::ScsiCommand(c) => {
                cmd_sn = cmd_sn.wrapping_add(1);
                for reply in answer(&c, stat_sn, cmd_sn, commands) {
                    s.write_all(&reply.encode(Digests::NONE)).unwrap();
                }
                commands += 1;
                stat_sn += 1;
            }
            Bhs::LogoutRequest(r) => {
                let reply = agree_to_logout(&r, stat_sn);
                s.write_all(&reply.encode(Digests::NONE)).unwrap();
                return commands;
            }
            Bhs::NopOut(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    commands
}

/// Plays `script` on a thread as the target of a loopback portal and logs
/// a session of `initiator` in to it: the session, and the script's thread.
pub async fn session_with<T: Send + 'static>(
    initiator: &str,
    script: impl FnOnce(TcpListener) -> T + Send + 'static,
) -> (Session, JoinHandle<T>) {
    session_configured(InitiatorConfig::new(initiator), script).await
}

/// [`session_with`] for an initiator configured as `config` says.
pub async fn session_configured<T: Send + 'static>(
    config: InitiatorConfig,
    script: impl FnOnce(TcpListener) -> T + Send + 'static,
) -> (Session, JoinHandle<T>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = listener.local_addr().unwrap().to_string();
    let target = std::thread::spawn(move || script(listener));
    let session = Session::connect(config, &portal, "iqn.2026-12.io.blockwire:scripted")
        .await
        .expect("the scripted target logs the initiator in");
    (session, target)
}

/// One Data-In answering `c` with `data` from offset 0, the last of the
/// command (F set), carrying `status` when given; no residual.
pub fn single_data_in(
    c: &ScsiCommand,
    status: Option<u8>,
    stat_sn: u32,
    cmd_sn: u32,
    data: Vec<u8>,
) -> Pdu {
    Pdu::with_data(
        Bhs::DataIn(DataIn {
            final_bit: true,
            acknowledge: false,
            overflow: false,
            underflow: false,
            status,
            lun: c.lun,
            itt: c.itt,
            ttt: RESERVED_TAG,
            stat_sn,
            exp_cmd_sn: cmd_sn,
            max_cmd_sn: cmd_sn.wrapping_add(8),
            data_sn: 0,
            buffer_offset: 0,
            residual_count: 0,
        }),
        data,
    )
}

/// A SCSI Response ending `c` with `status`, saying `underflow` bytes were
/// not transferred (none: no residual), after `data_sns` Data-In PDUs.
pub fn response(
    c: &ScsiCommand,
    status: u8,
    underflow: Option<u32>,
    data_sns: u32,
    stat_sn: u32,
    cmd_sn: u32,
) -> Pdu {
    Pdu::new(Bhs::ScsiResponse(ScsiResponse {
        bidi_read_overflow: false,
        bidi_read_underflow: false,
        overflow: false,
        underflow: underflow.is_some(),
        response: ServiceResponse::CommandCompleted,
        status,
        itt: c.itt,
        snack_tag: 0,
        stat_sn,
        exp_cmd_sn: cmd_sn,
        max_cmd_sn: cmd_sn.wrapping_add(8),
        exp_data_sn: data_sns,
        bidi_read_residual_count: 0,
        residual_count: underflow.unwrap_or(0),
    }))
}

/// The answer `response` to the task management request `r`.
pub fn tmf_answer(r: &TaskMgmtRequest, response: TmfResponse, stat_sn: u32, cmd_sn: u32) -> Pdu {
    Pdu::new(Bhs::TaskMgmtResponse(TaskMgmtResponse {
        response,
        itt: r.itt,
        stat_sn,
        exp_cmd_sn: cmd_sn,
        max_cmd_sn: cmd_sn.wrapping_add(8),
    }))
}

/// Sense key, ASC and ASCQ.
pub type Sense = (u8, u8, u8);

/// A SCSI Response ending `c` in CHECK CONDITION with fixed-format sense
/// data (SPC-4 4.5.3), after the two-byte SenseLength the iSCSI data
/// segment carries (RFC 7143 §11.4.7.2).
pub fn check_condition(c: &ScsiCommand, stat_sn: u32, cmd_sn: u32, (key, asc, ascq): Sense) -> Pdu {
    let mut sense = vec![0u8; 18];
    sense[0] = 0x70;
    sense[2] = key;
    sense[7] = 10;
    sense[12] = asc;
    sense[13] = ascq;
    let mut data = (sense.len() as u16).to_be_bytes().to_vec();
    data.extend(sense);
    Pdu::with_data(response(c, 0x02, None, 0, stat_sn, cmd_sn).bhs, data)
}
