//! The registrar against an iSNS server model in memory: what the model
//! holds after each exchange is what the daemon wants registered.

use super::*;
use crate::isns::registration::{Node, Registration};
use blockwire_pdu::isns::{flag, MessageReader};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// What the model holds of one entity.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Entity {
    portals: Vec<(IpAddr, u16)>,
    /// Node name to its alias.
    nodes: BTreeMap<String, Option<String>>,
    /// (node, portal address, port) to the PG tag (None: NULL).
    groups: BTreeMap<(String, IpAddr, u16), Option<u32>>,
    period: u32,
}

/// A small iSNS server: DevAttrReg (replace and update), DevAttrQry of an
/// entity, DevDereg of an entity. It checks what RFC 4171 asks of each
/// message (source, key, delimiter) and answers errors where a real server
/// would.
#[derive(Debug, Default)]
struct Model {
    entities: BTreeMap<String, Entity>,
    /// Grants at most this period.
    max_period: u32,
    /// Answers every request with this status instead (0: serve).
    refuse_with: u32,
    requests: usize,
}

impl Model {
    fn new(max_period: u32) -> Model {
        Model {
            max_period,
            ..Model::default()
        }
    }

    fn answer(&mut self, bytes: &[u8]) -> Message {
        let mut r = MessageReader::new();
        r.feed(bytes);
        let m = r.next_message().unwrap().unwrap();
        assert!(m.flags & flag::CLIENT != 0);
        self.requests += 1;
        if self.refuse_with != 0 {
            return reply(&m, self.refuse_with, vec![]);
        }
        let a = &m.attrs;
        let delim = a
            .iter()
            .position(|x| x.tag == tag::DELIMITER)
            .expect("a delimiter");
        assert_eq!(a[0].tag, tag::ISCSI_NAME, "the source comes first");
        let source = a[0].as_str().unwrap().to_string();
        let key = &a[1..delim];
        let ops = &a[delim + 1..];
        match m.function {
            function::DEV_ATTR_REG => {
                let eid = key[0].as_str().unwrap().to_string();
                assert_eq!(
                    ops[0].as_str(),
                    Some(eid.as_str()),
                    "the key is among the operating attributes"
                );
                let existing = self.entities.contains_key(&eid);
                let replace = m.flags & flag::REPLACE != 0;
                let mut e = if replace || !existing {
                    Entity::default()
                } else {
                    self.entities[&eid].clone()
                };
                let registers_source = ops
                    .iter()
                    .any(|x| x.tag == tag::ISCSI_NAME && x.as_str() == Some(&source));
                if !registers_source && !e.nodes.contains_key(&source) {
                    return reply(&m, 6, vec![]); // Source Unknown
                }
                let mut i = 1;
                let mut node: Option<String> = None;
                let mut pg: (Option<String>, Option<IpAddr>, Option<u16>) = (None, None, None);
                while i < ops.len() {
                    let x = &ops[i];
                    match x.tag {
                        tag::ENTITY_PROTOCOL => assert_eq!(x.as_u32(), Some(2)),
                        tag::REGISTRATION_PERIOD => {
                            e.period = x.as_u32().unwrap().min(self.max_period)
                        }
                        tag::PORTAL_IP_ADDRESS => {
                            let port = ops[i + 1].as_port().unwrap().0;
                            e.portals.push((x.as_ip().unwrap(), port));
                            i += 1;
                        }
                        tag::ISCSI_NAME => {
                            let n = x.as_str().unwrap().to_string();
                            e.nodes.insert(n.clone(), None);
                            node = Some(n);
                        }
                        tag::ISCSI_NODE_TYPE => assert_eq!(x.as_u32(), Some(1)),
                        tag::ISCSI_ALIAS => {
                            let n = node.clone().unwrap();
                            e.nodes.insert(n, Some(x.as_str().unwrap().to_string()));
                        }
                        tag::PG_ISCSI_NAME => pg.0 = Some(x.as_str().unwrap().to_string()),
                        tag::PG_PORTAL_IP_ADDRESS => pg.1 = x.as_ip(),
                        tag::PG_PORTAL_PORT => pg.2 = x.as_port().map(|p| p.0),
                        tag::PG_TAG => {
                            let (n, ip, port) = (
                                pg.0.take().unwrap(),
                                pg.1.take().unwrap(),
                                pg.2.take().unwrap(),
                            );
                            assert!(e.nodes.contains_key(&n), "a PG of a node registered");
                            assert!(
                                e.portals.contains(&(ip, port)),
                                "a PG of a portal registered"
                            );
                            e.groups.insert((n, ip, port), x.as_u32());
                        }
                        other => panic!("unexpected attribute {other}"),
                    }
                    i += 1;
                }
                let period = e.period;
                self.entities.insert(eid.clone(), e);
                reply(
                    &m,
                    0,
                    vec![
                        Attr::string(tag::ENTITY_IDENTIFIER, &eid),
                        Attr::empty(tag::DELIMITER),
                        Attr::string(tag::ENTITY_IDENTIFIER, &eid),
                        Attr::u32(tag::REGISTRATION_PERIOD, period),
                    ],
                )
            }
            function::DEV_ATTR_QRY => {
                // As open-isns: the key echoed, then the asked attributes
                // of what matched (nothing: no attributes, still Successful).
                let eid = key[0].as_str().unwrap();
                let mut attrs = vec![key[0].clone(), Attr::empty(tag::DELIMITER)];
                if let Some(e) = self.entities.get(eid) {
                    assert!(
                        ops.iter().all(|x| x.value.is_empty()),
                        "a query asks with NULL values"
                    );
                    attrs.push(Attr::string(tag::ENTITY_IDENTIFIER, eid));
                    attrs.push(Attr::u32(tag::REGISTRATION_PERIOD, e.period));
                }
                reply(&m, 0, attrs)
            }
            function::DEV_DEREG => {
                let eid = ops[0].as_str().unwrap();
                match self.entities.remove(eid) {
                    Some(_) => reply(&m, 0, vec![]),
                    None => reply(&m, 9, vec![]),
                }
            }
            other => panic!("unexpected function {other:#x}"),
        }
    }
}

fn reply(m: &Message, code: u32, attrs: Vec<Attr>) -> Message {
    Message {
        function: m.function | function::RESPONSE,
        flags: flag::SERVER,
        transaction: m.transaction,
        status: Some(code),
        attrs,
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn wanted(targets: usize) -> Registration {
    Registration {
        entity: "host-a".into(),
        period_secs: 900,
        portals: vec![(addr("0.0.0.0:3260"), 1), (addr("192.0.2.5:3261"), 2)],
        nodes: (0..targets)
            .map(|i| Node {
                name: format!("iqn.2026-12.io.blockwire:t{i}"),
                alias: (i % 2 == 0).then(|| format!("disk {i}")),
                // Even targets on both groups, odd ones on group 2 only.
                groups: if i % 2 == 0 { vec![1, 2] } else { vec![2] },
            })
            .collect(),
    }
}

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9));

/// Moves every queued message to the model and its answers back; returns
/// how many went.
fn exchange(r: &mut Registrar, model: &mut Model, now: Instant) -> usize {
    let mut n = 0;
    while let Some(m) = r.poll_transmit() {
        let bytes = m.encode().unwrap();
        let answer = model.answer(&bytes);
        n += 1;
        r.received(answer, now);
    }
    n
}

/// What the model should hold for `w`, granted a period of 600 s.
fn expected(w: &Registration) -> Entity {
    expected_with(w, 600)
}

/// What the model should hold for `w`, granted `period`.
fn expected_with(w: &Registration, period: u32) -> Entity {
    let portals: Vec<(IpAddr, u16)> = w
        .portals
        .iter()
        .map(|(a, _)| {
            (
                if a.ip().is_unspecified() {
                    LOCAL
                } else {
                    a.ip()
                },
                a.port(),
            )
        })
        .collect();
    let mut e = Entity {
        portals: portals.clone(),
        period,
        ..Entity::default()
    };
    for n in &w.nodes {
        e.nodes.insert(n.name.clone(), n.alias.clone());
        for ((ip, port), (_, t)) in portals.iter().zip(&w.portals) {
            let tagged = n.groups.contains(t).then_some(u32::from(*t));
            e.groups.insert((n.name.clone(), *ip, *port), tagged);
        }
    }
    e
}

#[test]
fn registers_refreshes_and_deregisters() {
    let t0 = Instant::now();
    let w = wanted(3);
    let mut r = Registrar::new(w.clone(), t0);
    let mut model = Model::new(600);
    assert!(r.wants_connection(t0));
    r.connecting();
    r.connected(LOCAL, t0);
    assert_eq!(exchange(&mut r, &mut model, t0), 1);
    assert_eq!(r.status().state, State::Registered);
    assert_eq!(r.status().period_secs, 600);
    assert_eq!(model.entities["host-a"], expected(&w));
    // The odd target is not served through group 1's portal: a NULL tag.
    let odd = ("iqn.2026-12.io.blockwire:t1".to_string(), LOCAL, 3260);
    assert_eq!(model.entities["host-a"].groups[&odd], None);

    // Refreshed at half the granted period, not before.
    assert_eq!(r.poll_timeout(), Some(t0 + Duration::from_secs(300)));
    r.handle_timeout(t0 + Duration::from_secs(299));
    assert!(r.poll_transmit().is_none());
    let t1 = t0 + Duration::from_secs(300);
    r.handle_timeout(t1);
    assert_eq!(exchange(&mut r, &mut model, t1), 1);
    assert_eq!(r.status().refreshes, 1);
    assert_eq!(r.poll_timeout(), Some(t1 + Duration::from_secs(300)));

    r.stop(t1);
    assert_eq!(exchange(&mut r, &mut model, t1), 1);
    assert!(r.is_done());
    assert!(model.entities.is_empty());
}

#[test]
fn a_thousand_targets_go_in_several_messages_and_all_arrive() {
    let t0 = Instant::now();
    let w = wanted(1000);
    let mut r = Registrar::new(w.clone(), t0);
    let mut model = Model::new(600);
    r.connecting();
    r.connected(LOCAL, t0);
    let sent = exchange(&mut r, &mut model, t0);
    assert!(sent > 1, "{sent} message(s)");
    assert_eq!(r.status().state, State::Registered);
    assert_eq!(model.entities["host-a"], expected(&w));
    for m in w.messages(LOCAL, 1) {
        assert!(m.encode().is_ok());
    }
}

#[test]
fn changes_are_registered_at_once_or_right_after_the_one_under_way() {
    let t0 = Instant::now();
    let mut r = Registrar::new(wanted(2), t0);
    let mut model = Model::new(600);
    r.connecting();
    r.connected(LOCAL, t0);
    exchange(&mut r, &mut model, t0);
    // A target added and one removed while registered.
    let mut w = wanted(3);
    w.nodes.remove(0);
    r.update(w.clone(), t0);
    exchange(&mut r, &mut model, t0);
    assert_eq!(model.entities["host-a"], expected(&w));
    assert_eq!(r.status().registrations, 2);

    // A change while a registration is out: the registration under way is
    // answered, then the change goes.
    let w2 = wanted(5);
    r.update(wanted(4), t0);
    let out = r.poll_transmit().unwrap();
    r.update(w2.clone(), t0);
    let answer = model.answer(&out.encode().unwrap());
    r.received(answer, t0);
    assert_eq!(r.status().state, State::Registering);
    exchange(&mut r, &mut model, t0);
    assert_eq!(model.entities["host-a"], expected(&w2));
    assert_eq!(r.status().state, State::Registered);
}

#[test]
fn failures_back_off_and_a_success_starts_over() {
    let t0 = Instant::now();
    let mut r = Registrar::new(wanted(1), t0);
    let mut now = t0;
    let mut pauses = Vec::new();
    for _ in 0..8 {
        assert!(r.wants_connection(now));
        r.connecting();
        r.failed("connection refused".into(), now);
        let next = r.poll_timeout().unwrap();
        pauses.push((next - now).as_secs());
        assert!(!r.wants_connection(now));
        now = next;
    }
    assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 60, 60]);
    assert_eq!(r.status().failures, 8);
    assert_eq!(r.status().state, State::Waiting);
    assert!(r
        .status()
        .last_error
        .as_deref()
        .unwrap()
        .contains("refused"));

    // A server that refuses the registration: said, closed, retried.
    let mut model = Model::new(600);
    model.refuse_with = 3;
    r.connecting();
    r.connected(LOCAL, now);
    exchange(&mut r, &mut model, now);
    assert!(r.take_close());
    let e = r.status().last_error.clone().unwrap();
    assert!(e.contains("status 3 (Invalid Registration)"), "{e}");
    now = r.poll_timeout().unwrap();
    model.refuse_with = 0;
    r.connecting();
    r.connected(LOCAL, now);
    exchange(&mut r, &mut model, now);
    assert_eq!(r.status().state, State::Registered);
    assert_eq!(r.status().last_error, None);
    // A server closing the idle connection is no failure: the
    // registration stands, and the refresh opens a connection.
    r.closed(now);
    assert_eq!(r.status().state, State::Registered);
    assert_eq!(r.status().last_error, None);
    assert!(!r.wants_connection(now));
    let refresh = r.poll_timeout().unwrap();
    assert_eq!(refresh, now + Duration::from_secs(300));
    r.handle_timeout(refresh);
    assert!(r.wants_connection(refresh));
    r.connecting();
    r.connected(LOCAL, refresh);
    let q = r.poll_transmit().unwrap();
    assert_eq!(
        q.function,
        function::DEV_ATTR_QRY,
        "a refresh, not a new registration"
    );
    // Unanswered: a failure, and the first pause is one second again.
    r.handle_timeout(refresh + ANSWER_TIMEOUT);
    assert!(r.take_close());
    assert_eq!(
        r.poll_timeout(),
        Some(refresh + ANSWER_TIMEOUT + FIRST_BACKOFF)
    );
}

#[test]
fn changes_and_stops_without_a_connection_open_one() {
    let t0 = Instant::now();
    let mut r = Registrar::new(wanted(1), t0);
    let mut model = Model::new(600);
    r.connecting();
    r.connected(LOCAL, t0);
    exchange(&mut r, &mut model, t0);
    r.closed(t0);
    // A change: connect now and register it.
    r.update(wanted(2), t0);
    assert!(r.wants_connection(t0));
    r.connecting();
    r.connected(LOCAL, t0);
    exchange(&mut r, &mut model, t0);
    assert_eq!(model.entities["host-a"], expected(&wanted(2)));
    r.closed(t0);
    // A stop: connect and deregister.
    r.stop(t0);
    assert_eq!(r.status().state, State::Deregistering);
    assert!(r.wants_connection(t0));
    r.connecting();
    r.connected(LOCAL, t0);
    exchange(&mut r, &mut model, t0);
    assert!(r.is_done());
    assert!(model.entities.is_empty());
}

#[test]
fn a_server_that_forgot_the_entity_gets_it_again() {
    let t0 = Instant::now();
    let w = wanted(2);
    let mut r = Registrar::new(w.clone(), t0);
    let mut model = Model::new(60);
    r.connecting();
    r.connected(LOCAL, t0);
    exchange(&mut r, &mut model, t0);
    // Restarted without its database.
    model.entities.clear();
    let t1 = r.poll_timeout().unwrap();
    assert_eq!(t1, t0 + Duration::from_secs(30));
    r.handle_timeout(t1);
    exchange(&mut r, &mut model, t1);
    assert_eq!(r.status().state, State::Registered);
    assert_eq!(model.entities["host-a"].nodes.len(), 2);
    assert_eq!(r.status().registrations, 2);
}

#[test]
fn silence_is_a_failure_and_stopping_is_bounded() {
    let t0 = Instant::now();
    let mut r = Registrar::new(wanted(1), t0);
    r.connecting();
    r.connected(LOCAL, t0);
    assert!(r.poll_transmit().is_some());
    let late = t0 + ANSWER_TIMEOUT;
    assert_eq!(r.poll_timeout(), Some(late));
    r.handle_timeout(late);
    assert!(r.take_close());
    assert!(r
        .status()
        .last_error
        .as_deref()
        .unwrap()
        .contains("no answer"));
    assert_eq!(r.status().state, State::Waiting);

    // Stopping while registered: the deregistration gets ANSWER_TIMEOUT.
    let mut model = Model::new(600);
    let now = r.poll_timeout().unwrap();
    r.connecting();
    r.connected(LOCAL, now);
    exchange(&mut r, &mut model, now);
    r.stop(now);
    assert!(r.poll_transmit().is_some());
    r.handle_timeout(now + ANSWER_TIMEOUT);
    assert!(r.is_done());

    // Stopping while not connected sends nothing.
    let mut r = Registrar::new(wanted(1), t0);
    r.stop(t0);
    assert!(r.is_done());
    assert!(r.poll_transmit().is_none());
    assert!(!r.wants_connection(t0));
}

#[test]
fn entity_status_inquiries_are_echoed_and_other_server_messages_declined() {
    let t0 = Instant::now();
    let mut r = Registrar::new(wanted(1), t0);
    let esi = Message {
        function: function::ESI,
        flags: flag::SERVER,
        transaction: 77,
        status: None,
        attrs: vec![Attr::string(tag::ENTITY_IDENTIFIER, "host-a")],
    };
    r.received(esi.clone(), t0);
    let a = r.poll_transmit().unwrap();
    assert_eq!(a.function, function::ESI | function::RESPONSE);
    assert_eq!((a.transaction, a.status), (77, Some(0)));
    assert_eq!(a.attrs, esi.attrs);
    r.received(
        Message {
            function: function::SCN,
            ..esi
        },
        t0,
    );
    assert_eq!(r.poll_transmit().unwrap().status, Some(15));
}

/// One step of a random life.
#[derive(Debug, Clone)]
enum Step {
    /// Deliver every queued message and its answer.
    Exchange,
    /// Deliver the first queued message, lose its answer.
    LoseAnswer,
    /// The connection breaks.
    Break,
    /// The server restarts without its database.
    ServerForgets,
    /// The server refuses everything / serves again.
    Refuse(bool),
    /// Time passes (seconds).
    Wait(u16),
    /// The configuration changes to this many targets.
    Change(u8),
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Exchange),
        1 => Just(Step::LoseAnswer),
        1 => Just(Step::Break),
        1 => Just(Step::ServerForgets),
        1 => any::<bool>().prop_map(Step::Refuse),
        3 => (0u16..400).prop_map(Step::Wait),
        2 => (1u8..6).prop_map(Step::Change),
    ]
}

proptest! {
    /// Whatever the server and the network do, the registrar asks for
    /// nothing unbounded (at most one request out at a time, a deadline
    /// whenever it waits), comes back to Registered with exactly what is
    /// wanted once the server serves and answers, and stops within the
    /// answer timeout.
    #[test]
    fn any_life_ends_registered_with_what_is_wanted(steps in prop::collection::vec(any_step(), 0..40)) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut w = wanted(2);
        let mut r = Registrar::new(w.clone(), now);
        let mut model = Model::new(120);
        let mut connected = false;
        let drive = |r: &mut Registrar, connected: &mut bool, now: Instant| {
            if r.take_close() {
                *connected = false;
            }
            if !*connected && r.wants_connection(now) {
                r.connecting();
                r.connected(LOCAL, now);
                *connected = true;
            }
        };
        for step in steps {
            drive(&mut r, &mut connected, now);
            match step {
                Step::Exchange => { if connected { exchange(&mut r, &mut model, now); } }
                Step::LoseAnswer => {
                    if let Some(m) = r.poll_transmit() {
                        let _ = model.answer(&m.encode().unwrap());
                    }
                }
                Step::Break => { if connected { connected = false; r.closed(now); } }
                Step::ServerForgets => model.entities.clear(),
                Step::Refuse(on) => model.refuse_with = if on { 12 } else { 0 },
                Step::Wait(s) => {
                    let until = now + Duration::from_secs(u64::from(s));
                    while let Some(d) = r.poll_timeout().filter(|d| *d <= until) {
                        now = d.max(now);
                        r.handle_timeout(now);
                        drive(&mut r, &mut connected, now);
                        if connected { exchange(&mut r, &mut model, now); }
                    }
                    now = until;
                }
                Step::Change(n) => {
                    w = wanted(usize::from(n));
                    r.update(w.clone(), now);
                }
            }
            let out = r.outbox.len();
            prop_assert!(out <= 2, "{out} queued");
            if matches!(r.status().state, State::Registering | State::Deregistering) {
                prop_assert!(r.poll_timeout().is_some());
            }
        }
        // The server serves and answers from now on.
        model.refuse_with = 0;
        // (A server that forgot the entity hears of it at the next
        // refresh at the latest.)
        for _ in 0..20 {
            drive(&mut r, &mut connected, now);
            if connected { exchange(&mut r, &mut model, now); }
            if r.status().state == State::Registered && model.entities.contains_key("host-a") { break; }
            now = r.poll_timeout().unwrap().max(now);
            r.handle_timeout(now);
        }
        prop_assert_eq!(&r.status().state, &State::Registered);
        prop_assert_eq!(&model.entities["host-a"], &expected_with(&w, 120));
        r.stop(now);
        drive(&mut r, &mut connected, now);
        if connected { exchange(&mut r, &mut model, now); }
        prop_assert!(r.is_done());
        prop_assert!(model.entities.is_empty());
    }
}
