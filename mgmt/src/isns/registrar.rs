//! The iSNS client's state machine, without I/O: it decides when to
//! connect, what to send, what an answer means and when to give up, and
//! its driver ([`super::driver`]) only moves bytes and keeps time. So it
//! can be run against a server model in memory, as its tests do.
//!
//! The life of a registration (RFC 4171 §5.6.5): connect; DevAttrReg with
//! the Replace flag (then further DevAttrRegs when the targets do not fit
//! one PDU); refresh before the registration period the server granted
//! runs out (a DevAttrQry of the entity from one of its nodes: any message
//! from the entity counts as activity; an answer without the entity means
//! the server lost it, and it is registered again); register again whenever the
//! configuration changes; DevDereg of the entity at shutdown. A server may
//! close a connection that has been idle (open-isns does after 300 s): a
//! registration stands without one, and the next refresh or change opens
//! another. A failure (no answer, an error status, the connection lost
//! with a request out) is said in the status, and the whole registration
//! is sent again on a new connection after a pause that doubles up to a
//! minute.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use blockwire_pdu::isns::{function, status, tag, Attr, Message};

use super::registration::Registration;

/// How long an answer may take.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The first pause after a failure; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pause between attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The shortest refresh interval, whatever period a server grants.
const MIN_REFRESH: Duration = Duration::from_secs(5);

/// What the registration is doing, for `isns.status` and the log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Waiting to connect (first attempt, or after a failure).
    Waiting,
    /// Connecting to the server.
    Connecting,
    /// Registration sent, answers outstanding.
    Registering,
    /// The server holds the registration.
    Registered,
    /// Deregistration sent at shutdown.
    Deregistering,
    /// Finished: deregistered, or stopped.
    Stopped,
}

/// A snapshot of the registration's state.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Status {
    /// Where it stands.
    pub state: State,
    /// Targets in the registration.
    pub targets: usize,
    /// Portals in the registration.
    pub portals: usize,
    /// The registration period the server granted, in seconds (0: none
    /// granted yet, or the registration does not expire).
    pub period_secs: u32,
    /// Registrations the server accepted since the daemon started
    /// (changes and reconnections each count once).
    pub registrations: u64,
    /// Refreshes the server answered.
    pub refreshes: u64,
    /// Attempts that failed (no connection, no answer, an error status, a
    /// connection broken with a request out).
    pub failures: u64,
    /// The last failure, if the last attempt failed.
    pub last_error: Option<String>,
}

#[derive(Debug)]
enum Phase {
    /// Not connected; connect at `at`.
    Idle { at: Instant },
    /// The driver is connecting.
    Connecting,
    /// DevAttrRegs: `awaiting` answered before the next of `rest` goes.
    Registering {
        awaiting: u16,
        rest: VecDeque<Message>,
        deadline: Instant,
    },
    /// Registered; refresh at `refresh_at` (connected or not).
    Registered { refresh_at: Instant },
    /// Stopping while registered and not connected: deregister on the
    /// next connection.
    DeregisterOnConnect,
    /// A refresh query is out.
    Refreshing { awaiting: u16, deadline: Instant },
    /// DevDereg is out.
    Deregistering { awaiting: u16, deadline: Instant },
    /// Nothing more to do.
    Done,
}

/// The registration's state machine.
#[derive(Debug)]
pub struct Registrar {
    wanted: Registration,
    /// The configuration changed while a registration was under way.
    changed: bool,
    stopping: bool,
    phase: Phase,
    /// The address this side reaches the server from.
    local: Option<IpAddr>,
    /// A connection is open.
    link: bool,
    next_transaction: u16,
    outbox: VecDeque<Message>,
    close: bool,
    backoff: Duration,
    status: Status,
}

impl Registrar {
    /// A registrar for `wanted` that connects at once.
    pub fn new(wanted: Registration, now: Instant) -> Registrar {
        let status = Status {
            state: State::Waiting,
            targets: wanted.nodes.len(),
            portals: wanted.portals.len(),
            period_secs: 0,
            registrations: 0,
            refreshes: 0,
            failures: 0,
            last_error: None,
        };
        Registrar {
            wanted,
            changed: false,
            stopping: false,
            phase: Phase::Idle { at: now },
            local: None,
            link: false,
            next_transaction: 1,
            outbox: VecDeque::new(),
            close: false,
            backoff: FIRST_BACKOFF,
            status,
        }
    }

    /// The registration's state.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// Whether the driver should connect now.
    pub fn wants_connection(&self, now: Instant) -> bool {
        if self.link {
            return false;
        }
        match self.phase {
            Phase::Idle { at } => now >= at && !self.stopping,
            // A registration without a connection: one is needed for the
            // refresh, or to register a change.
            Phase::Registered { refresh_at } => now >= refresh_at || self.changed,
            Phase::DeregisterOnConnect => true,
            _ => false,
        }
    }

    /// The driver started connecting.
    pub fn connecting(&mut self) {
        if let Phase::Idle { .. } = self.phase {
            self.phase = Phase::Connecting;
            self.status.state = State::Connecting;
        }
    }

    /// The connection could not be made, or broke (a write failed, the
    /// server sent what is not iSNS): `why` says which.
    pub fn failed(&mut self, why: String, now: Instant) {
        self.link = false;
        if self.stopping {
            self.status.last_error = Some(why);
            self.finish();
            return;
        }
        self.fail(why, now);
    }

    /// Connected; `local` is this side's address on the connection.
    pub fn connected(&mut self, local: IpAddr, now: Instant) {
        self.local = Some(local);
        self.link = true;
        match self.phase {
            Phase::DeregisterOnConnect => self.deregister(now),
            _ if self.stopping => self.finish(),
            // Reconnected for a refresh: the registration stands.
            Phase::Registered { .. } if !self.changed => self.refresh(now),
            _ => self.register(now),
        }
    }

    /// The connection closed (or broke).
    pub fn closed(&mut self, now: Instant) {
        self.link = false;
        self.close = false;
        match self.phase {
            Phase::Done | Phase::Idle { .. } => {}
            // Nothing was outstanding: a server closing an idle connection.
            Phase::Registered { .. } | Phase::DeregisterOnConnect => {}
            _ if self.stopping => self.finish(),
            _ => self.fail("the server closed the connection".into(), now),
        }
    }

    /// Whether the driver should close the connection (after a failure,
    /// or when finished). Asking clears the request.
    pub fn take_close(&mut self) -> bool {
        std::mem::take(&mut self.close)
    }

    /// Finished: the driver may end.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<Message> {
        self.outbox.pop_front()
    }

    /// When [`Registrar::handle_timeout`] wants to be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Idle { at } => Some(*at),
            Phase::Registering { deadline, .. }
            | Phase::Refreshing { deadline, .. }
            | Phase::Deregistering { deadline, .. } => Some(*deadline),
            Phase::Registered { refresh_at } => Some(*refresh_at),
            Phase::Connecting | Phase::DeregisterOnConnect | Phase::Done => None,
        }
    }

    /// Time has come to `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &self.phase {
            Phase::Registering {
                awaiting, deadline, ..
            }
            | Phase::Refreshing { awaiting, deadline }
                if now >= *deadline =>
            {
                let why = format!(
                    "no answer from the server to transaction {awaiting} in {} s",
                    ANSWER_TIMEOUT.as_secs()
                );
                self.fail(why, now);
            }
            Phase::Deregistering { deadline, .. } if now >= *deadline => {
                self.status.last_error = Some(format!(
                    "no answer to the deregistration in {} s",
                    ANSWER_TIMEOUT.as_secs()
                ));
                self.finish();
            }
            Phase::Registered { refresh_at } if now >= *refresh_at && self.link => {
                self.refresh(now)
            }
            _ => {}
        }
    }

    /// The configuration changed: register `wanted` instead.
    pub fn update(&mut self, wanted: Registration, now: Instant) {
        if wanted == self.wanted {
            return;
        }
        self.status.targets = wanted.nodes.len();
        self.status.portals = wanted.portals.len();
        self.wanted = wanted;
        match self.phase {
            Phase::Registered { .. } if self.link => self.register(now),
            // Registered without a connection (one is opened for it), or a
            // registration or refresh is out: registered next.
            Phase::Registered { .. } | Phase::Registering { .. } | Phase::Refreshing { .. } => {
                self.changed = true
            }
            // The next connection registers what is wanted then.
            _ => {}
        }
    }

    /// The daemon is stopping: deregister if registered (or on the way),
    /// else finish.
    pub fn stop(&mut self, now: Instant) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        match self.phase {
            Phase::Registered { .. } if !self.link => {
                self.phase = Phase::DeregisterOnConnect;
                self.status.state = State::Deregistering;
            }
            Phase::Registering { .. } | Phase::Registered { .. } | Phase::Refreshing { .. } => {
                self.deregister(now)
            }
            _ => self.finish(),
        }
    }

    fn deregister(&mut self, now: Instant) {
        let t = self.transaction();
        self.outbox.clear();
        self.outbox.push_back(self.wanted.deregistration(t));
        self.phase = Phase::Deregistering {
            awaiting: t,
            deadline: now + ANSWER_TIMEOUT,
        };
        self.status.state = State::Deregistering;
    }

    /// A message from the server.
    pub fn received(&mut self, m: Message, now: Instant) {
        if !m.is_response() {
            self.answer_server(&m);
            return;
        }
        let code = m.status.unwrap_or(status::SUCCESSFUL);
        match &mut self.phase {
            Phase::Registering {
                awaiting,
                rest,
                deadline,
            } if m.transaction == *awaiting => {
                if code != status::SUCCESSFUL {
                    let why = refusal("registration (DevAttrReg)", code);
                    self.fail(why, now);
                    return;
                }
                if let Some(p) = m.attr(tag::REGISTRATION_PERIOD).and_then(Attr::as_u32) {
                    self.status.period_secs = p;
                }
                if let Some(next) = rest.pop_front() {
                    *awaiting = next.transaction;
                    *deadline = now + ANSWER_TIMEOUT;
                    self.outbox.push_back(next);
                    return;
                }
                self.status.registrations += 1;
                self.registered(now);
            }
            Phase::Refreshing { awaiting, .. } if m.transaction == *awaiting => {
                match code {
                    // A query that matches nothing is answered Successful
                    // with no object (open-isns): the server no longer
                    // holds the entity (restarted without its database,
                    // or expired it).
                    status::SUCCESSFUL if !holds_entity(&m, &self.wanted.entity) => {
                        self.status.last_error = Some(
                            "the server no longer holds the registration; registering again".into(),
                        );
                        self.register(now);
                    }
                    status::SUCCESSFUL => {
                        if let Some(p) = m.attr(tag::REGISTRATION_PERIOD).and_then(Attr::as_u32) {
                            self.status.period_secs = p;
                        }
                        self.status.refreshes += 1;
                        self.registered(now);
                    }
                    // The server lost the registration (restarted without
                    // its database, or expired it): register again.
                    status::NO_SUCH_ENTRY | 6 | 7 => {
                        self.status.last_error =
                            Some(format!("{}; registering again", refusal("refresh", code)));
                        self.register(now);
                    }
                    _ => {
                        let why = refusal("refresh (DevAttrQry)", code);
                        self.fail(why, now);
                    }
                }
            }
            Phase::Deregistering { awaiting, .. } if m.transaction == *awaiting => {
                if code != status::SUCCESSFUL {
                    self.status.last_error = Some(refusal("deregistration (DevDereg)", code));
                }
                self.finish();
            }
            // An answer to nothing outstanding (a transaction given up on).
            _ => {}
        }
    }

    /// Answers a server's own message: an Entity Status Inquiry is echoed
    /// back as RFC 4171 §5.7.5.13 asks; anything else is declined.
    fn answer_server(&mut self, m: &Message) {
        let answer = if m.function == function::ESI {
            Message::response_to(m, status::SUCCESSFUL, m.attrs.clone())
        } else {
            // Message (FUNCTION_ID) Not Supported.
            Message::response_to(m, 15, Vec::new())
        };
        self.outbox.push_back(answer);
    }

    fn transaction(&mut self) -> u16 {
        let t = self.next_transaction;
        self.next_transaction = self.next_transaction.wrapping_add(1).max(1);
        t
    }

    fn register(&mut self, now: Instant) {
        let local = self
            .local
            .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        let first = self.next_transaction;
        let mut msgs: VecDeque<Message> = self.wanted.messages(local, first).into();
        for _ in 0..msgs.len() {
            self.transaction();
        }
        self.changed = false;
        let Some(head) = msgs.pop_front() else {
            return;
        };
        let awaiting = head.transaction;
        self.outbox.push_back(head);
        self.phase = Phase::Registering {
            awaiting,
            rest: msgs,
            deadline: now + ANSWER_TIMEOUT,
        };
        self.status.state = State::Registering;
    }

    fn registered(&mut self, now: Instant) {
        self.backoff = FIRST_BACKOFF;
        if self.changed {
            self.register(now);
            return;
        }
        self.status.state = State::Registered;
        self.status.last_error = None;
        self.phase = Phase::Registered {
            refresh_at: now + self.refresh_interval(),
        };
    }

    /// Half the granted period, so that one lost refresh still leaves time
    /// for another attempt; the asked period when the server named none.
    fn refresh_interval(&self) -> Duration {
        let period = match self.status.period_secs {
            0 => self.wanted.period_secs,
            p => p,
        };
        Duration::from_secs(u64::from(period) / 2).max(MIN_REFRESH)
    }

    fn refresh(&mut self, now: Instant) {
        let t = self.transaction();
        let source = self.wanted.source();
        self.outbox.push_back(Message::request(
            function::DEV_ATTR_QRY,
            t,
            vec![
                Attr::string(tag::ISCSI_NAME, source),
                Attr::string(tag::ENTITY_IDENTIFIER, &self.wanted.entity),
                Attr::empty(tag::DELIMITER),
                // The entity's identifier, to see that the server holds
                // it, and its period: the server may have changed it.
                Attr::empty(tag::ENTITY_IDENTIFIER),
                Attr::empty(tag::REGISTRATION_PERIOD),
            ],
        ));
        self.phase = Phase::Refreshing {
            awaiting: t,
            deadline: now + ANSWER_TIMEOUT,
        };
    }

    fn fail(&mut self, why: String, now: Instant) {
        self.status.failures += 1;
        self.status.last_error = Some(why);
        self.outbox.clear();
        self.close = self.link;
        self.link = false;
        if self.stopping {
            self.finish();
            return;
        }
        self.phase = Phase::Idle {
            at: now + self.backoff,
        };
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        self.status.state = State::Waiting;
    }

    fn finish(&mut self) {
        self.outbox.clear();
        self.close = self.link;
        self.link = false;
        self.phase = Phase::Done;
        self.status.state = State::Stopped;
    }
}

/// Whether a query's answer lists the entity `eid` among its operating
/// attributes (after the delimiter that ends the echoed key).
fn holds_entity(answer: &Message, eid: &str) -> bool {
    answer
        .operating_attrs()
        .iter()
        .any(|a| a.tag == tag::ENTITY_IDENTIFIER && a.as_str() == Some(eid))
}

/// A server's refusal, named.
fn refusal(what: &str, code: u32) -> String {
    format!(
        "the server refused the {what}: status {code} ({})",
        status::name(code)
    )
}

#[cfg(test)]
mod tests;
