//! Stateful fuzzing of CHAP (RFC 7143 §12.1.3, RFC 1994): a target's `ChapResponder`
//! and an initiator's `ChapInitiator` exchange their messages through a channel the
//! fuzzer controls. Each step it delivers the honest message, or one with a key
//! dropped, doubled or given another value, or pairs of its own, or an old message
//! again.
//!
//! Whatever arrives, neither side panics; the target authenticates an initiator only
//! when the initiator holds a secret the target knows for that name; the initiator
//! accepts the target's mutual answer only when the target holds the secret the
//! initiator expects; a side that failed stays failed; and an exchange nobody touched,
//! between sides that share their secrets, completes.
#![no_main]

use blockwire_pdu::chap::{
    ChapAlgorithm, ChapInitiator, ChapResponder, Credential, InitiatorStep, ResponderStep,
};
use blockwire_pdu::keys::TextPairs;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Setup {
    initiator_algorithms: u8,
    target_algorithms: u8,
    initiator_knows_secret: bool,
    target_knows_user: bool,
    mutual: bool,
    target_knows_mutual_secret: bool,
    random: u64,
}

#[derive(Arbitrary, Debug)]
enum Delivery {
    Honest,
    DropKey(u8),
    DoubleKey(u8),
    NewValue(u8, String),
    ExtraPair(String, String),
    OwnPairs(Vec<(String, String)>),
    OldMessage(u8),
}

#[derive(Arbitrary, Debug)]
struct Step {
    to_target: bool,
    delivery: Delivery,
}

fn algorithms(mask: u8) -> Vec<ChapAlgorithm> {
    let all = ChapAlgorithm::ALL;
    (0..all.len()).filter(|i| mask & (1 << i) != 0).map(|i| all[i]).collect()
}

fn credential(user: &str, secret: &str) -> Credential {
    Credential::new(user, blockwire_pdu::chap::Secret::new(secret.as_bytes()))
}

/// `honest` as the fuzzer delivers it; `tampered` is set when it differs.
fn deliver(honest: &TextPairs, d: Delivery, sent: &[TextPairs], tampered: &mut bool) -> TextPairs {
    let mut m = honest.clone();
    let at = |i: u8, m: &TextPairs| usize::from(i) % m.len().max(1);
    match d {
        Delivery::Honest => return m,
        Delivery::DropKey(i) if !m.is_empty() => {
            m.remove(at(i, &m));
        }
        Delivery::DoubleKey(i) if !m.is_empty() => {
            let p = m[at(i, &m)].clone();
            m.push(p);
        }
        Delivery::NewValue(i, v) if !m.is_empty() => {
            let i = at(i, &m);
            m[i].1 = v;
        }
        Delivery::ExtraPair(k, v) => m.push((k, v)),
        Delivery::OwnPairs(pairs) => m = pairs,
        Delivery::OldMessage(i) if !sent.is_empty() => m = sent[usize::from(i) % sent.len()].clone(),
        _ => return m,
    }
    *tampered |= m != *honest;
    m
}

fuzz_target!(|input: (Setup, Vec<Step>)| {
    let (setup, steps) = input;
    let mut state = setup.random | 1;
    let mut fill = move |buf: &mut [u8]| {
        for b in buf {
            // xorshift: the challenges differ from run to run of one input only by seed.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = state as u8;
        }
    };
    let user = "iqn.2026-11.io.blockwire:fuzz";
    let secret = "initiator-secret-16";
    let target_secret = "target-secret-0016";
    let known_user = if setup.target_knows_user { user } else { "someone-else" };
    let known_secret = if setup.initiator_knows_secret { secret } else { "another-secret-00" };
    let mut target = ChapResponder::new(
        algorithms(setup.target_algorithms),
        vec![credential(known_user, known_secret)],
        Some(credential("target", target_secret)),
    );
    let expected_target_secret = if setup.target_knows_mutual_secret {
        target_secret
    } else {
        "not-the-target-1"
    };
    let mut initiator = ChapInitiator::new(
        credential(user, secret),
        algorithms(setup.initiator_algorithms),
        setup.mutual.then(|| credential("target", expected_target_secret)),
    );

    let shares_secret = setup.initiator_knows_secret && setup.target_knows_user;
    let mut to_target: Option<TextPairs> = Some(initiator.offer());
    let mut to_initiator: Option<TextPairs> = None;
    let mut sent: Vec<TextPairs> = to_target.iter().cloned().collect();
    let (mut target_failed, mut initiator_failed, mut tampered) = (false, false, false);
    let (mut authenticated, mut verified) = (false, false);

    // After the fuzzer's steps, honest deliveries finish the exchange.
    let honest = std::iter::repeat_with(|| Step { to_target: true, delivery: Delivery::Honest });
    for step in steps.into_iter().take(16).chain(honest.take(8)) {
        // The side the step names, unless nothing waits for it.
        let to_target_now = match step.to_target {
            true => to_target.is_some() || to_initiator.is_none(),
            false => to_initiator.is_none(),
        };
        if to_target_now {
            let Some(msg) = to_target.take() else { continue };
            let msg = deliver(&msg, step.delivery, &sent, &mut tampered);
            match target.receive(&msg, &mut fill) {
                Ok(ResponderStep::Wait) => {}
                Ok(ResponderStep::Challenge(pairs)) => {
                    sent.push(pairs.clone());
                    to_initiator = Some(pairs);
                }
                Ok(ResponderStep::Authenticated { user: who, mutual, answers }) => {
                    assert!(!target_failed, "a failed target authenticated");
                    assert!(shares_secret, "authenticated {who} without the secret");
                    assert_eq!(who, user);
                    assert_eq!(mutual, !answers.is_empty());
                    authenticated = true;
                    if mutual {
                        sent.push(answers.clone());
                        to_initiator = Some(answers);
                    }
                }
                Err(_) => target_failed = true,
            }
        } else {
            let Some(msg) = to_initiator.take() else { continue };
            let msg = deliver(&msg, step.delivery, &sent, &mut tampered);
            match initiator.receive(&msg, &mut fill) {
                Ok(InitiatorStep::Wait) => {}
                Ok(InitiatorStep::Respond(pairs)) => {
                    assert!(!initiator_failed, "a failed initiator answered");
                    sent.push(pairs.clone());
                    to_target = Some(pairs);
                }
                Ok(InitiatorStep::TargetVerified) => {
                    assert!(!initiator_failed, "a failed initiator verified the target");
                    assert!(setup.mutual, "verified a target it never challenged");
                    assert!(setup.target_knows_mutual_secret, "verified a target without the secret");
                    verified = true;
                }
                Err(_) => initiator_failed = true,
            }
        }
    }
    let common = algorithms(setup.initiator_algorithms)
        .iter()
        .any(|a| algorithms(setup.target_algorithms).contains(a))
        || setup.initiator_algorithms & 15 == 0
        || setup.target_algorithms & 15 == 0;
    if !tampered && shares_secret && common {
        assert!(authenticated, "an untouched exchange with a shared secret failed");
        if setup.mutual && setup.target_knows_mutual_secret {
            assert!(verified, "an untouched mutual exchange did not verify the target");
        }
    }
});
