//! Connecting, logging in, discovery and logout over TCP: the tokio shell
//! around [`crate::login::LoginMachine`] and [`crate::discovery::SendTargets`].

use blockwire_pdu::keys::Digest;
use blockwire_pdu::pdu::codes::LogoutReason;
use blockwire_pdu::pdu::LogoutRequest;
use blockwire_pdu::{Bhs, Digests, Pdu};
use rand::RngCore;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::config::InitiatorConfig;
use crate::discovery::{DiscoveredTarget, Portal, SendTargets, SendTargetsList, TextStep};
use crate::error::{Error, Result};
use crate::isid::isid_for;
use crate::login::{LoginMachine, LoginOutcome, LoginStep};
use crate::wire::{write_whole, PduReader};

/// `HOST[:PORT]` with 3260 as the default port; IPv6 in brackets.
pub fn normalize_portal(portal: &str) -> String {
    let p = portal.trim();
    if p.starts_with('[') {
        if p.contains("]:") {
            p.to_owned()
        } else {
            format!("{p}:3260")
        }
    } else if p.matches(':').count() == 1 {
        p.to_owned()
    } else if p.contains(':') {
        format!("[{p}]:3260")
    } else {
        format!("{p}:3260")
    }
}

/// A logged-in connection.
pub(crate) struct Connection {
    pub reader: PduReader<OwnedReadHalf>,
    pub writer: OwnedWriteHalf,
    pub outcome: LoginOutcome,
    pub digests: Digests,
}

/// The digests a login agreed on.
pub(crate) fn digests_of(outcome: &LoginOutcome) -> Digests {
    Digests {
        header: outcome.params.header_digest == Digest::Crc32c,
        data: outcome.params.data_digest == Digest::Crc32c,
    }
}

/// How many login redirections one login follows: storage arrays redirect
/// once, from a group portal to a member's; more is a loop.
const MAX_REDIRECTS: usize = 4;

/// Connects to `portal` and logs in (target None: discovery), bounded by
/// the configured login timeout. A target that moved (login status 0101h or
/// 0102h with a TargetAddress, RFC 7143 §11.13.5) is followed there, up to
/// [`MAX_REDIRECTS`] times; each later login asks at `portal` again, which
/// is what a temporary move wants and costs a permanent one a round trip.
/// The login timeout bounds the whole, redirections included.
pub(crate) async fn connect_login(
    config: &InitiatorConfig,
    portal: &str,
    target: Option<&str>,
    tsih: u16,
) -> Result<Connection> {
    let mut at = portal.to_owned();
    let deadline = tokio::time::Instant::now() + config.login_timeout;
    for hop in 0..=MAX_REDIRECTS {
        let fut = connect_login_inner(config, &at, target, tsih);
        match tokio::time::timeout_at(deadline, fut).await {
            Ok(Err(Error::Redirected { to, permanent, .. })) => {
                tracing::info!(
                    target = target.unwrap_or("discovery"),
                    from = %at,
                    %to,
                    permanent,
                    "login redirected"
                );
                at = to;
            }
            Ok(r) => return r,
            Err(_) => {
                let redirected = match hop {
                    0 => String::new(),
                    n => format!(" (redirected from {portal}, {n} hop(s))"),
                };
                return Err(Error::Timeout(format!(
                    "login to {} at {at}{redirected} took longer than {:?}",
                    target.unwrap_or("discovery"),
                    config.login_timeout
                )));
            }
        }
    }
    Err(Error::Protocol(format!(
        "login to {} at {portal} was redirected more than {MAX_REDIRECTS} times (last to {at}): \
         a redirection loop between portals",
        target.unwrap_or("discovery")
    )))
}

async fn connect_login_inner(
    config: &InitiatorConfig,
    portal: &str,
    target: Option<&str>,
    tsih: u16,
) -> Result<Connection> {
    let stream = TcpStream::connect(portal)
        .await
        .map_err(|e| Error::io(format!("connecting to {portal}"), e))?;
    stream.set_nodelay(true).ok();
    let (r, mut writer) = stream.into_split();
    let mut reader = PduReader::new(r);
    let isid = isid_for(&config.initiator_name, config.isid_qualifier);
    let mut machine = LoginMachine::new(
        config,
        target,
        isid,
        tsih,
        1,
        Box::new(|b: &mut [u8]| rand::thread_rng().fill_bytes(b)),
    )?;
    let mut pdu = machine.start()?;
    let outcome = loop {
        write_whole(&mut writer, &pdu, Digests::NONE)
            .await
            .map_err(|e| Error::io(format!("sending a Login Request to {portal}"), e))?;
        let resp = reader.read_pdu().await?;
        match machine.receive(resp) {
            Ok(LoginStep::Send(next)) => pdu = next,
            Ok(LoginStep::Done(o)) => break *o,
            Err(e) => return Err(e.at_portal(portal)),
        }
    };
    let digests = digests_of(&outcome);
    reader.set_limits(
        outcome.params.initiator_max_recv_data_segment_length,
        digests,
    );
    tracing::debug!(
        portal,
        target = target.unwrap_or("discovery"),
        tsih = outcome.tsih,
        "logged in"
    );
    Ok(Connection {
        reader,
        writer,
        outcome,
        digests,
    })
}

/// SendTargets discovery at `portal` (`HOST[:PORT]`): logs in a discovery
/// session (CHAP from `config.discovery_chap`), asks for all targets and
/// logs out. Names and addresses that are not iSCSI names and hosts are left
/// out with a warning (see [`discover_list`] for the reasons).
pub async fn discover(config: &InitiatorConfig, portal: &str) -> Result<Vec<DiscoveredTarget>> {
    let list = discover_list(config, portal).await?;
    for why in &list.refused {
        tracing::warn!(%portal, "SendTargets: {why}");
    }
    Ok(list.targets)
}

/// [`discover`], with what the answer listed that was left out, and why.
pub async fn discover_list(config: &InitiatorConfig, portal: &str) -> Result<SendTargetsList> {
    let portal = normalize_portal(portal);
    let mut conn = connect_login(config, &portal, None, 0).await?;
    let (host, port) = portal
        .rsplit_once(':')
        .map(|(h, p)| {
            (
                h.trim_matches(['[', ']']).to_owned(),
                p.parse().unwrap_or(3260),
            )
        })
        .unwrap_or((portal.clone(), 3260));
    let dp = Portal {
        host,
        port,
        tpgt: conn.outcome.params.target_portal_group_tag.unwrap_or(1),
    };
    let mut st = SendTargets::new(1, conn.outcome.exp_cmd_sn, dp);
    let mut exp_stat_sn = conn.outcome.stat_sn.wrapping_add(1);
    let mut pdu = st.start(exp_stat_sn)?;
    let fut = async {
        let targets = loop {
            write_whole(&mut conn.writer, &pdu, conn.digests)
                .await
                .map_err(|e| Error::io(format!("sending SendTargets to {portal}"), e))?;
            let resp = loop {
                let p = conn.reader.read_pdu().await?;
                if let Bhs::NopIn(_) = p.bhs {
                    continue;
                }
                break p;
            };
            if let Bhs::TextResponse(t) = &resp.bhs {
                exp_stat_sn = t.stat_sn.wrapping_add(1);
            }
            match st.receive(resp)? {
                TextStep::Send(next) => pdu = next,
                TextStep::Done(t) => break t,
            }
        };
        // Best-effort logout; the answer does not matter.
        let logout = Pdu::new(Bhs::LogoutRequest(LogoutRequest {
            immediate: true,
            reason: LogoutReason::CloseSession,
            itt: 2,
            cid: 0,
            cmd_sn: conn.outcome.exp_cmd_sn,
            exp_stat_sn,
        }));
        if write_whole(&mut conn.writer, &logout, conn.digests)
            .await
            .is_ok()
        {
            let _ = conn.reader.read_pdu().await;
        }
        Ok::<_, Error>(targets)
    };
    tokio::time::timeout(config.login_timeout, fut)
        .await
        .map_err(|_| Error::Timeout(format!("SendTargets at {portal}")))?
}

#[cfg(test)]
mod tests {
    use super::normalize_portal;

    #[test]
    fn portals() {
        assert_eq!(normalize_portal("127.0.0.1"), "127.0.0.1:3260");
        assert_eq!(normalize_portal("127.0.0.1:3261"), "127.0.0.1:3261");
        assert_eq!(normalize_portal("::1"), "[::1]:3260");
        assert_eq!(normalize_portal("[::1]:5"), "[::1]:5");
        assert_eq!(normalize_portal("[::1]"), "[::1]:3260");
    }
}
