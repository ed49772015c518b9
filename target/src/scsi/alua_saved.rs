//! The ALUA states initiators set with SET TARGET PORT GROUPS, kept in a
//! file of their target so that they outlive a restart of the daemon (as
//! LIO keeps them under /var/target/alua): a multipath host that failed a
//! target over to its other portal group finds it still failed over when
//! the target comes back, instead of its configured preferred group
//! suddenly active again and the group the host uses in standby.
//!
//! The file holds only groups a command set, as lines `group ID STATE`
//! under a `blockwire-alua 1` header; it is rewritten whenever those
//! change (a later command, an implicit change of the configuration).

use std::collections::BTreeSet;
use std::path::Path;

use super::alua::AluaState;
use super::saved_file::{read_saved, save_atomically};

/// The first line of the file.
const HEADER: &str = "blockwire-alua 1";

/// The file's text for `states` (group, state).
pub(crate) fn to_text(states: &[(u16, AluaState)]) -> String {
    let mut s = format!("{HEADER}\n");
    for (id, state) in states {
        s.push_str(&format!("group {id} {}\n", state.name()));
    }
    s
}

/// Reads [`to_text`]'s form back; None when `text` is not it: another
/// header, a line of any other shape, a state this target does not
/// support, or a group given twice.
pub(crate) fn from_text(text: &str) -> Option<Vec<(u16, AluaState)>> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    let mut seen = BTreeSet::new();
    let mut states = Vec::new();
    for line in lines {
        match line.split(' ').collect::<Vec<_>>().as_slice() {
            ["group", id, state] => {
                let id: u16 = id.parse().ok()?;
                if !seen.insert(id) {
                    return None;
                }
                states.push((id, AluaState::from_name(state)?));
            }
            [""] => {}
            _ => return None,
        }
    }
    Some(states)
}

/// Writes `states` to `path` atomically.
pub(crate) fn save(path: &Path, states: &[(u16, AluaState)]) -> std::io::Result<()> {
    save_atomically(path, &to_text(states))
}

/// What `path` holds: Ok(None) when there is no file (no state was ever
/// set by a command there), Err with the reason when it cannot be read or
/// is not [`to_text`]'s form.
pub(crate) fn load(path: &Path) -> Result<Option<Vec<(u16, AluaState)>>, String> {
    let Some(text) = read_saved(path)? else {
        return Ok(None);
    };
    from_text(&text)
        .map(Some)
        .ok_or_else(|| "it is damaged (not the format blockwire writes)".to_owned())
}

/// The reader for the `alua_state_file` fuzz target.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    /// Reads `text` as a target reads its saved ALUA states at start-up;
    /// whatever it accepts must name each group once and be written back
    /// as it was read; panics otherwise. Returns whether it was accepted.
    pub fn read_alua_state_file(text: &str) -> bool {
        let Some(states) = super::from_text(text) else {
            return false;
        };
        let ids: std::collections::BTreeSet<u16> = states.iter().map(|s| s.0).collect();
        assert_eq!(ids.len(), states.len(), "a group read twice: {states:?}");
        assert_eq!(
            super::from_text(&super::to_text(&states)).as_ref(),
            Some(&states)
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state() -> impl Strategy<Value = AluaState> {
        prop_oneof![
            Just(AluaState::ActiveOptimized),
            Just(AluaState::ActiveNonOptimized),
            Just(AluaState::Standby),
        ]
    }

    proptest! {
        /// Any groups, each once, come back as they went in, in order.
        #[test]
        fn any_states_round_trip(
            ids in proptest::collection::btree_set(any::<u16>(), 0..20),
            states in proptest::collection::vec(state(), 20),
        ) {
            let saved: Vec<(u16, AluaState)> = ids.into_iter().zip(states).collect();
            prop_assert_eq!(from_text(&to_text(&saved)), Some(saved));
        }

        /// Whatever a damaged or hand-edited file holds, reading it never
        /// panics, and what it reads as is what it would be written as.
        #[test]
        fn any_text_reads_as_what_it_writes(
            lines in proptest::collection::vec(
                prop_oneof![
                    Just(HEADER.to_owned()),
                    "group [0-9]{1,6} (active_optimized|active_non_optimized|standby|offline)",
                    ".{0,20}",
                ],
                0..8,
            ),
        ) {
            let text = lines.join("\n");
            if let Some(states) = from_text(&text) {
                let ids: BTreeSet<u16> = states.iter().map(|s| s.0).collect();
                prop_assert_eq!(ids.len(), states.len());
                prop_assert_eq!(from_text(&to_text(&states)), Some(states));
            }
        }
    }

    #[test]
    fn damaged_files_read_as_none() {
        assert_eq!(
            from_text("blockwire-alua 1\ngroup 2 standby\n"),
            Some(vec![(2, AluaState::Standby)])
        );
        for text in [
            "",
            "blockwire-alua 2\n",
            "blockwire-alua 1\ngroup 2 standby\ngroup 2 active_optimized\n",
            "blockwire-alua 1\ngroup 2 offline\n",
            "blockwire-alua 1\ngroup 65536 standby\n",
            "blockwire-alua 1\ngroup 2  standby\n",
        ] {
            assert_eq!(from_text(text), None, "{text:?}");
        }
    }

    #[test]
    fn a_missing_file_is_no_state_and_a_damaged_one_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.alua");
        assert_eq!(load(&path), Ok(None));
        save(
            &path,
            &[(1, AluaState::Standby), (2, AluaState::ActiveOptimized)],
        )
        .unwrap();
        assert_eq!(
            load(&path),
            Ok(Some(vec![
                (1, AluaState::Standby),
                (2, AluaState::ActiveOptimized)
            ]))
        );
        std::fs::write(&path, "group 1 standby\n").unwrap();
        assert!(load(&path).unwrap_err().contains("damaged"));
    }
}
