//! The login phase of a connection and its hand-off to the session table:
//! the target's offers (RFC 7143 §13), the [`LoginMachine`] exchange, the
//! digest policy, and attaching (or reinstating) the session before the
//! final Login Response.

use std::net::SocketAddr;
use std::sync::Arc;

use blockwire_pdu::keys::Digest;
use blockwire_pdu::{Bhs, LoginStatus, Pdu};
use rand::RngCore;
use tracing::info;

use crate::iscsi::login::{LoginMachine, LoginOutcome, LoginSettings, LoginStep, RdmaOffer};
use crate::iscsi::session::{Session, SessionError, SessionRequest};
use crate::iscsi::Fabric;

/// What the driver does with a login PDU's answer.
pub(in crate::iscsi) enum LoginAction {
    /// Send this Login Response and wait for the next request.
    Respond(Pdu),
    /// Send this (a Login Response with an error status, or a Reject) and
    /// close the connection.
    Refuse(Pdu),
    /// Send this final Login Response: the full feature phase of `session`
    /// begins.
    LoggedIn {
        response: Pdu,
        session: Arc<Session>,
        /// The generation of `session` this connection owns
        /// ([`SessionTable::attach_connection`](crate::iscsi::session::SessionTable::attach_connection)).
        generation: u64,
        /// What the response waits for
        /// ([`Attached::still_changing_medium`](crate::iscsi::session::Attached::still_changing_medium)).
        still_changing_medium: Vec<Arc<std::sync::atomic::AtomicUsize>>,
        outcome: Box<LoginOutcome>,
    },
}

/// One connection's login phase.
pub(in crate::iscsi) struct LoginPhase {
    fabric: Arc<Fabric>,
    machine: LoginMachine,
    tpgt: u16,
    local: SocketAddr,
    /// The initiator's address, where the connection has one.
    peer: Option<std::net::IpAddr>,
}

impl LoginPhase {
    /// This login phase for a connection from `peer`.
    pub(in crate::iscsi) fn from_peer(mut self, peer: Option<std::net::IpAddr>) -> LoginPhase {
        self.peer = peer;
        self
    }

    /// The login phase of a connection accepted on `local` in portal group
    /// `tpgt`; `rng` makes CHAP challenges.
    pub(in crate::iscsi) fn new<R: RngCore + Send + 'static>(
        fabric: Arc<Fabric>,
        tpgt: u16,
        local: SocketAddr,
        rng: R,
    ) -> LoginPhase {
        let settings = offers(&fabric, local);
        Self::with_offers(fabric, tpgt, local, settings, rng)
    }

    /// The login phase of an iSER connection (RFC 7145 §6): RDMAExtensions=Yes,
    /// TargetRecvDataSegmentLength declared, no digests, no RDMA-assisted offload.
    pub(in crate::iscsi) fn new_iser<R: RngCore + Send + 'static>(
        fabric: Arc<Fabric>,
        tpgt: u16,
        local: SocketAddr,
        rng: R,
    ) -> LoginPhase {
        let mut settings = offers(&fabric, local);
        settings.rdma_offload = None;
        let n = &mut settings.negotiation;
        n.rdma_extensions = true;
        n.rdma_recv_data_segment_length = crate::iscsi::iser::TARGET_RECV_DATA_SEGMENT_LENGTH;
        n.max_recv_data_segment_length = crate::iscsi::iser::TARGET_RECV_DATA_SEGMENT_LENGTH;
        n.header_digests = vec![Digest::None];
        n.data_digests = vec![Digest::None];
        n.first_burst_length = n
            .first_burst_length
            .min(crate::iscsi::iser::TARGET_RECV_DATA_SEGMENT_LENGTH);
        // InitialR2T=Yes (an OR key: it wins): every byte of a WRITE is solicited, that
        // is RDMA-Read by the target. open-iscsi sizes unsolicited data from
        // MaxXmitDataSegmentLength, which it does not take from the target on RDMA
        // transports, so unsolicited data would come as empty Data-Out PDUs forever.
        n.initial_r2t = true;
        Self::with_offers(fabric, tpgt, local, settings, rng)
    }

    fn with_offers<R: RngCore + Send + 'static>(
        fabric: Arc<Fabric>,
        tpgt: u16,
        local: SocketAddr,
        settings: LoginSettings,
        rng: R,
    ) -> LoginPhase {
        let machine = LoginMachine::with_settings(fabric.catalog(), tpgt, local, settings, rng);
        LoginPhase {
            fabric,
            machine,
            tpgt,
            local,
            peer: None,
        }
    }

    /// One PDU from the initiator.
    pub(in crate::iscsi) fn on_pdu(&mut self, pdu: &Pdu) -> LoginAction {
        let Bhs::LoginRequest(req) = pdu.bhs else {
            info!(opcode = ?pdu.bhs.opcode(), "non-login PDU during login: closing");
            crate::events::login_failed(LoginStatus::INVALID_DURING_LOGIN);
            return LoginAction::Refuse(self.machine.reject(LoginStatus::INVALID_DURING_LOGIN));
        };
        match self.machine.on_request(&req, &pdu.data) {
            LoginStep::Respond(resp) => LoginAction::Respond(resp),
            LoginStep::Fail(resp) => {
                if let Bhs::LoginResponse(r) = &resp.bhs {
                    crate::events::login_failed(r.status);
                }
                LoginAction::Refuse(resp)
            }
            LoginStep::Complete(outcome) => self.hand_off(outcome),
        }
    }

    /// Bytes from the initiator that did not decode as a PDU (`header` is
    /// their first 48 when there were that many): refused with a Login
    /// Response that says so.
    pub(in crate::iscsi) fn on_undecodable(
        &mut self,
        header: Option<&[u8; 48]>,
        why: &str,
    ) -> LoginAction {
        let response = self.machine.refuse_undecodable(header, why);
        if let Bhs::LoginResponse(r) = &response.bhs {
            crate::events::login_failed(r.status);
        }
        LoginAction::Refuse(response)
    }

    /// The login succeeded as far as the keys go: check the digest policy
    /// and attach the session.
    fn hand_off(&mut self, mut outcome: Box<LoginOutcome>) -> LoginAction {
        // A digest the initiator would not agree to is answered Reject and
        // falls back to None (RFC 7143 §6.2); when the target insists on
        // CRC32C, such a login must fail.
        let s = &self.fabric.settings;
        if (s.require_header_digest && outcome.params.header_digest != Digest::Crc32c)
            || (s.require_data_digest && outcome.params.data_digest != Digest::Crc32c)
        {
            info!(initiator = %outcome.initiator_name, "login refused: the target requires CRC32C digests");
            crate::events::login_failed(LoginStatus::INITIATOR_ERROR);
            return LoginAction::Refuse(self.machine.reject(LoginStatus::INITIATOR_ERROR));
        }
        // The login was admitted against what was served when its
        // connection came; a live change since (a target removed, an
        // initiator taken off its access list) must not let it through
        // with a session that change never closed. The session takes the
        // target as served now. The gate keeps a change from listing the
        // sessions to close between this look and the attach below.
        let gate = self.fabric.admission_gate();
        if let Some(then) = outcome.target.clone() {
            let catalog = self.fabric.catalog();
            let now = catalog
                .target(&then.name)
                .filter(|t| t.portal_groups.is_empty() || t.portal_groups.contains(&self.tpgt));
            let refusal = match now {
                None => Some(LoginStatus::TARGET_REMOVED),
                Some(t) if !t.acl.allows(&outcome.initiator_name) => {
                    Some(LoginStatus::AUTHORIZATION_FAILURE)
                }
                Some(t) => {
                    outcome.target = Some(Arc::clone(t));
                    None
                }
            };
            if let Some(status) = refusal {
                info!(initiator = %outcome.initiator_name, target = %then.name, "login refused: a live change during the login took the target or its access away");
                crate::events::login_failed(status);
                return LoginAction::Refuse(self.machine.reject(status));
            }
        }
        let request = SessionRequest {
            initiator_name: outcome.initiator_name.clone(),
            isid: outcome.isid,
            tsih: outcome.tsih_requested,
            cid: outcome.cid,
            target: outcome.target.clone(),
            tpgt: self.tpgt,
            portal: self.local,
            peer: self.peer,
            params: outcome.params.clone(),
        };
        let attached = self.fabric.sessions.attach_connection(request);
        drop(gate);
        match attached {
            Ok(crate::iscsi::session::Attached {
                session,
                generation,
                still_changing_medium,
            }) => {
                let window = self.fabric.settings.queue_depth;
                let response = self.machine.final_response(
                    session.tsih,
                    outcome.stat_sn,
                    outcome.exp_cmd_sn.wrapping_add(window).wrapping_sub(1),
                );
                LoginAction::LoggedIn {
                    response,
                    session,
                    generation,
                    still_changing_medium,
                    outcome,
                }
            }
            Err(e) => {
                info!(initiator = %outcome.initiator_name, error = %e, "login refused by the session table");
                let status = match e {
                    SessionError::DoesNotExist(_) => LoginStatus::SESSION_DOES_NOT_EXIST,
                    SessionError::TooManyConnections => LoginStatus::TOO_MANY_CONNECTIONS,
                    SessionError::OutOfResources
                    | SessionError::TooManyDiscoverySessions(_)
                    | SessionError::TooManyDiscoverySessionsFromAddress(_) => {
                        LoginStatus::OUT_OF_RESOURCES
                    }
                };
                crate::events::login_failed(status);
                LoginAction::Refuse(self.machine.reject(status))
            }
        }
    }
}

/// What the target offers in login negotiation on `local`.
fn offers(fabric: &Fabric, local: SocketAddr) -> LoginSettings {
    let mut settings = LoginSettings {
        cmd_window: fabric.settings.queue_depth,
        rdma_offload: fabric.rdma.get().map(|svc| {
            let ep = svc.endpoint();
            RdmaOffer {
                backend: svc.backend().to_owned(),
                // A wildcard listener is reached at the address the
                // initiator already uses.
                endpoint: if ep.ip().is_unspecified() {
                    SocketAddr::new(local.ip(), ep.port())
                } else {
                    ep
                },
            }
        }),
        ..LoginSettings::default()
    };
    let n = &mut settings.negotiation;
    n.max_recv_data_segment_length = fabric.settings.max_recv_data_segment_length;
    // The target accepts either digest unless told to insist on CRC32C;
    // otherwise the initiator's order decides.
    let accepted = |required: bool| {
        if required {
            vec![Digest::Crc32c]
        } else {
            vec![Digest::Crc32c, Digest::None]
        }
    };
    n.header_digests = accepted(fabric.settings.require_header_digest);
    n.data_digests = accepted(fabric.settings.require_data_digest);
    // InitialR2T is OR-ed and ImmediateData AND-ed: offering No/Yes leaves
    // the choice to the initiator, whose unsolicited data saves a round trip.
    n.initial_r2t = false;
    n.immediate_data = true;
    n.first_burst_length = 256 * 1024;
    n.max_burst_length = (1 << 20).min(fabric.settings.max_io_bytes);
    n.max_outstanding_r2t = 8;
    // An OR key: answering No leaves the choice to the initiator.
    n.data_pdu_in_order = fabric.settings.data_pdu_in_order;
    settings
}
