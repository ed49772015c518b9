//! Admission to a login: who logs in, to what, and with which proof.
//!
//! The first request's declarations (InitiatorName, SessionType,
//! TargetName) are checked against the catalog (the target on this portal
//! group, its ACL) and set up the key engine; CHAP (RFC 7143 12.1.3,
//! RFC 1994) runs in the security stage; an RDMA offload offer gets a grant
//! with a fresh token or `No`. The stage, text and sequence-number rules of
//! the login phase stay in the parent module.

use std::sync::Arc;

use blockwire_pdu::chap::{ChapAlgorithm, ChapResponder, Credential, ResponderStep};
use blockwire_pdu::keys::{
    check_peer_name, AuthMethod, LocalConfig, Negotiator, Role, SessionType, TextPairs,
};
use blockwire_pdu::pdu::LoginRequest;
use blockwire_pdu::LoginStatus;
use rand::RngCore;

use super::{isid_hex, refuse, value, Context, LoginMachine, Refusal};
use crate::iscsi::catalog::{AuthPolicy, ChapSecret};

/// Converts a catalog credential for the CHAP engine.
fn credential(c: &ChapSecret) -> Credential {
    Credential::new(c.user.clone(), c.secret.as_str())
}

fn algorithms(policy: &AuthPolicy) -> Vec<ChapAlgorithm> {
    policy
        .algorithms
        .iter()
        .filter_map(|&a| ChapAlgorithm::from_code(a.into()))
        .collect()
}

impl LoginMachine {
    /// The answer to an RDMA offload offer: a grant with a fresh token when
    /// the target has RDMA, the initiator can use its backend and data
    /// digests are off (offloaded data carry no iSCSI digest); else `No`.
    pub(super) fn rdma_answer(
        &mut self,
        offer: &str,
        data_digest: blockwire_pdu::keys::Digest,
    ) -> String {
        use blockwire_transport::assist::{parse_offer, Grant, TOKEN_LEN};
        let normal = self
            .ctx
            .as_ref()
            .is_some_and(|c| c.session_type == SessionType::Normal);
        let Some(o) = self.settings.rdma_offload.clone() else {
            return "No".into();
        };
        if !normal
            || data_digest == blockwire_pdu::keys::Digest::Crc32c
            || !parse_offer(offer).contains(&o.backend.as_str())
        {
            return "No".into();
        }
        let mut token = [0u8; TOKEN_LEN];
        self.rng.fill_bytes(&mut token);
        self.rdma_token = Some(token);
        Grant {
            backend: o.backend,
            endpoint: o.endpoint,
            token,
        }
        .to_value()
    }

    /// Reads the first request's declarations: who logs in, to what, and
    /// whether that is allowed; builds the key engine accordingly.
    pub(super) fn establish(
        &mut self,
        req: &LoginRequest,
        pairs: &[(String, String)],
    ) -> Result<(), Refusal> {
        let initiator_name = match value(pairs, "InitiatorName") {
            Some(n) if !n.is_empty() => n.to_owned(),
            _ => {
                return Err(refuse(
                    LoginStatus::MISSING_PARAMETER,
                    "no InitiatorName in the first login request",
                ))
            }
        };
        // The name goes into ACL checks, logs and reservation records (and the
        // saved reservation file): a space, line break or '/' that no iSCSI name
        // has (RFC 7143 §4.2.7) is refused here, once.
        if let Err(why) = check_peer_name(&initiator_name) {
            return Err(refuse(
                LoginStatus::INITIATOR_ERROR,
                format!("InitiatorName refused: {why}"),
            ));
        }
        let session_type = match value(pairs, "SessionType") {
            None => SessionType::Normal,
            Some(v) => SessionType::from_name(v).ok_or_else(|| {
                refuse(
                    LoginStatus::SESSION_TYPE_NOT_SUPPORTED,
                    format!("SessionType={v}"),
                )
            })?,
        };
        let catalog = Arc::clone(&self.catalog);
        let (target, policy) = match session_type {
            SessionType::Discovery => (None, &catalog.discovery_auth),
            SessionType::Normal => {
                let name = value(pairs, "TargetName")
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| {
                        refuse(
                            LoginStatus::MISSING_PARAMETER,
                            "normal session without TargetName",
                        )
                    })?;
                let target = catalog
                    .target(name)
                    .filter(|t| t.portal_groups.is_empty() || t.portal_groups.contains(&self.tpgt))
                    .ok_or_else(|| {
                        refuse(
                            LoginStatus::NOT_FOUND,
                            format!("no target {name} on this portal group"),
                        )
                    })?;
                if !target.acl.allows(&initiator_name) {
                    self.ctx = Some(Context {
                        initiator_name,
                        session_type,
                        target: Some(Arc::clone(target)),
                        auth_required: true,
                    });
                    return Err(refuse(
                        LoginStatus::AUTHORIZATION_FAILURE,
                        "initiator not in the target's ACL",
                    ));
                }
                (Some(Arc::clone(target)), &target.auth)
            }
        };
        let auth_required = policy.requires_chap();
        let normal = session_type == SessionType::Normal;
        let mut vendor_keys = self.settings.negotiation.vendor_keys.clone();
        if normal && self.settings.rdma_offload.is_some() {
            vendor_keys.push(blockwire_transport::assist::OFFLOAD_KEY.to_owned());
        }
        let config = LocalConfig {
            vendor_keys,
            leading: req.tsih == 0,
            target_portal_group_tag: normal.then_some(self.tpgt),
            target_alias: if normal {
                target.as_ref().and_then(|t| t.alias.clone())
            } else {
                None
            },
            auth_methods: vec![if auth_required {
                AuthMethod::Chap
            } else {
                AuthMethod::None
            }],
            ..self.settings.negotiation.clone()
        };
        let negotiator = Negotiator::new(Role::Target, config).map_err(|e| {
            refuse(
                LoginStatus::TARGET_ERROR,
                format!("target configuration: {e}"),
            )
        })?;
        if auth_required {
            let credentials = policy
                .credentials_for(&initiator_name)
                .map(credential)
                .collect();
            self.chap = Some(ChapResponder::new(
                algorithms(policy),
                credentials,
                policy.outgoing.as_ref().map(credential),
            ));
        }
        tracing::debug!(
            target = %target.as_ref().map_or("(discovery)", |t| t.name.as_str()),
            initiator = %initiator_name,
            isid = %isid_hex(&req.isid),
            chap = auth_required,
            "login started"
        );
        self.negotiator = Some(negotiator);
        self.ctx = Some(Context {
            initiator_name,
            session_type,
            target,
            auth_required,
        });
        Ok(())
    }

    pub(super) fn run_chap(
        &mut self,
        pairs: &[(String, String)],
        answers: &mut TextPairs,
    ) -> Result<(), Refusal> {
        let rng = &mut self.rng;
        let Some(chap) = self.chap.as_mut() else {
            return Err(refuse(
                LoginStatus::AUTHENTICATION_FAILURE,
                "CHAP without credentials",
            ));
        };
        if chap.is_done() && pairs.is_empty() {
            return Ok(());
        }
        match chap.receive(pairs, &mut |buf: &mut [u8]| rng.fill_bytes(buf)) {
            Ok(ResponderStep::Wait) => Ok(()),
            Ok(ResponderStep::Challenge(out)) => {
                answers.extend(out);
                Ok(())
            }
            Ok(ResponderStep::Authenticated {
                user,
                mutual,
                answers: out,
            }) => {
                answers.extend(out);
                self.auth_done = true;
                let (target, initiator) = self.names();
                tracing::info!(target = %target, initiator = %initiator, chap_user = %user, mutual, "CHAP authentication succeeded");
                self.chap_user = Some(user);
                Ok(())
            }
            Err(e) => Err(refuse(
                LoginStatus::AUTHENTICATION_FAILURE,
                format!("CHAP: {e}"),
            )),
        }
    }
}
