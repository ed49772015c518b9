//! Asymmetric logical unit access (SPC-4 5.16): the target port groups a
//! target's logical units are reached through, each with its access state,
//! as plain data the fabric hands to the [`LunTable`](super::LunTable) (an
//! iSCSI fabric passes one group per portal group, its relative port being
//! the TPGT). The core reports them in REPORT TARGET PORT GROUPS and VPD
//! 83h and refuses media commands through a port in standby; it never
//! learns what a portal is.
//!
//! States change implicitly, when the management plane sets new groups
//! (TPGS=01b), and, where the target allows it, explicitly: an initiator's
//! SET TARGET PORT GROUPS (TPGS=11b, SPC-4 5.16.2.5), which is how a
//! multipath host fails an active/passive pair over to the passive side.

use blockwire_pdu::scsi::{Asc, Sense, SenseKey};

use super::outcome::{invalid_cdb, invalid_param, param_length, CmdResult, Done, Failure};

/// The asymmetric access state of a target port group (SPC-4 table 49).
/// Only the states a target without transitions needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AluaState {
    /// Active/optimized (0h): the preferred path.
    #[default]
    ActiveOptimized,
    /// Active/non-optimized (1h): serves every command, at a cost.
    ActiveNonOptimized,
    /// Standby (2h): answers management commands; media commands get NOT
    /// READY, LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE.
    Standby,
}

impl AluaState {
    /// Every state, in code order.
    const ALL: [AluaState; 3] = [
        AluaState::ActiveOptimized,
        AluaState::ActiveNonOptimized,
        AluaState::Standby,
    ];

    /// The ASYMMETRIC ACCESS STATE code.
    pub fn code(self) -> u8 {
        match self {
            AluaState::ActiveOptimized => 0x0,
            AluaState::ActiveNonOptimized => 0x1,
            AluaState::Standby => 0x2,
        }
    }

    /// The configuration spelling: "active_optimized",
    /// "active_non_optimized", "standby".
    pub fn name(self) -> &'static str {
        match self {
            AluaState::ActiveOptimized => "active_optimized",
            AluaState::ActiveNonOptimized => "active_non_optimized",
            AluaState::Standby => "standby",
        }
    }

    /// The state of an ASYMMETRIC ACCESS STATE code, where supported.
    pub fn from_code(code: u8) -> Option<AluaState> {
        Self::ALL.into_iter().find(|s| s.code() == code)
    }

    /// Parses [`AluaState::name`]'s spelling.
    pub fn from_name(name: &str) -> Option<AluaState> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// One target port group: its identifier, state and relative target ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPortGroup {
    /// TARGET PORT GROUP identifier (VPD 83h, REPORT TARGET PORT GROUPS).
    pub id: u16,
    /// Its asymmetric access state.
    pub state: AluaState,
    /// RELATIVE TARGET PORT identifiers of its ports.
    pub ports: Vec<u16>,
}

/// A target port group whose access state differs between `old` and
/// `new` (the same identifier in both): its identifier, the state it had
/// and the one it takes.
pub fn state_changes(
    old: &[TargetPortGroup],
    new: &[TargetPortGroup],
) -> Vec<(u16, AluaState, AluaState)> {
    new.iter()
        .filter_map(|n| {
            let o = old.iter().find(|o| o.id == n.id)?;
            (o.state != n.state).then_some((n.id, o.state, n.state))
        })
        .collect()
}

/// The group every port belongs to when the fabric names none: one group,
/// active/optimized (all ports equal).
pub(crate) const DEFAULT_GROUP: u16 = 1;

/// ASYMMETRIC ACCESS STATES supported: active/optimized (AO_SUP),
/// active/non-optimized (AN_SUP), standby (S_SUP).
const SUPPORTED_STATES: u8 = 0x07;

/// One request of a SET TARGET PORT GROUPS parameter list: the group and
/// the state it is to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StateRequest {
    /// TARGET PORT GROUP.
    pub group: u16,
    /// The ASYMMETRIC ACCESS STATE asked for.
    pub state: AluaState,
    /// Where its descriptor starts in the parameter list (for the sense
    /// data's field pointer).
    pub offset: u16,
}

/// Bytes of the SET TARGET PORT GROUPS parameter list header (reserved).
const STPG_HEADER: usize = 4;
/// Bytes of one set target port group descriptor.
const STPG_DESCRIPTOR: usize = 4;

/// Parses a SET TARGET PORT GROUPS parameter list (SPC-4 6.38): the first
/// `parameter_list_length` bytes of `data_out`, a 4-byte reserved header
/// and 4-byte descriptors (ASYMMETRIC ACCESS STATE in the low nibble of
/// byte 0, TARGET PORT GROUP in bytes 2-3). A length of 0 asks for nothing.
/// A list that arrived shorter than its length, or that cuts a descriptor,
/// is a PARAMETER LIST LENGTH ERROR; a state this target does not support
/// (unavailable, LBA dependent, offline, transitioning, reserved codes) and
/// a group named twice are INVALID FIELD IN PARAMETER LIST. Whether each
/// group exists is the caller's check.
pub(crate) fn parse_set_target_port_groups(
    parameter_list_length: u32,
    data_out: &[u8],
) -> Result<Vec<StateRequest>, Failure> {
    let len = usize::try_from(parameter_list_length).map_err(|_| param_length())?;
    if len == 0 {
        return Ok(Vec::new());
    }
    let list = data_out.get(..len).ok_or_else(param_length)?;
    if len < STPG_HEADER || (len - STPG_HEADER) % STPG_DESCRIPTOR != 0 {
        return Err(param_length());
    }
    let mut requests: Vec<StateRequest> = Vec::with_capacity((len - STPG_HEADER) / STPG_DESCRIPTOR);
    // One bit per TARGET PORT GROUP value: a group named twice is found in
    // one pass, where searching the requests so far cost a list of 64 Ki
    // distinct groups two billion comparisons on the connection.
    let mut named = vec![0u64; (usize::from(u16::MAX) + 1) / 64];
    for (i, d) in list[STPG_HEADER..]
        .chunks_exact(STPG_DESCRIPTOR)
        .enumerate()
    {
        // The list is at most the fabric's largest transfer, far below
        // 64 KiB descriptors; a longer one points at its last reachable byte.
        let offset = u16::try_from(STPG_HEADER + i * STPG_DESCRIPTOR).unwrap_or(u16::MAX);
        let state =
            AluaState::from_code(d[0] & 0x0f).ok_or_else(|| invalid_param(offset, Some(3)))?;
        let group = u16::from_be_bytes([d[2], d[3]]);
        let (word, bit) = (usize::from(group / 64), 1u64 << (group % 64));
        if named[word] & bit != 0 {
            return Err(invalid_param(offset.saturating_add(2), None));
        }
        named[word] |= bit;
        requests.push(StateRequest {
            group,
            state,
            offset,
        });
    }
    Ok(requests)
}

/// A target's port groups, in order (the first not in standby is the
/// preferred one), and whether initiators may change their states.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PortGroups {
    /// The groups.
    pub groups: Vec<TargetPortGroup>,
    /// Explicit ALUA: SET TARGET PORT GROUPS is obeyed (TPGS=11b).
    pub explicit: bool,
    /// Groups whose state the last change to them was a SET TARGET PORT
    /// GROUPS (STATUS CODE 01h in REPORT TARGET PORT GROUPS).
    pub set_by_command: Vec<u16>,
}

impl PortGroups {
    /// The TPGS field of standard INQUIRY data: 01b implicit only, 11b
    /// implicit and explicit.
    pub fn tpgs(&self) -> u8 {
        if self.explicit {
            3
        } else {
            1
        }
    }

    /// Replaces the groups (an implicit change): a group whose state
    /// changes is no longer one a command set.
    pub fn replace(&mut self, groups: Vec<TargetPortGroup>) -> Vec<(u16, AluaState, AluaState)> {
        let changed = state_changes(&self.groups, &groups);
        self.set_by_command
            .retain(|id| groups.iter().any(|g| g.id == *id) && !changed.iter().any(|c| c.0 == *id));
        self.groups = groups;
        changed
    }

    /// Applies a SET TARGET PORT GROUPS: every group it names must be one
    /// of the target's, or nothing changes (INVALID FIELD IN PARAMETER
    /// LIST at that descriptor's TARGET PORT GROUP). Returns the groups whose
    /// state changed, with the states before and after.
    pub fn set_by_command(
        &mut self,
        requests: &[StateRequest],
    ) -> Result<Vec<(u16, AluaState, AluaState)>, Failure> {
        if let Some(r) = requests
            .iter()
            .find(|r| !self.groups.iter().any(|g| g.id == r.group))
        {
            return Err(invalid_param(r.offset.saturating_add(2), None));
        }
        Ok(self.take_states_set_by_command(requests.iter().map(|r| (r.group, r.state))))
    }

    /// Gives each named group its state, as set by SET TARGET PORT GROUPS;
    /// groups the target does not have are passed over. Returns the
    /// groups whose state changed, with the states before and after.
    fn take_states_set_by_command(
        &mut self,
        states: impl IntoIterator<Item = (u16, AluaState)>,
    ) -> Vec<(u16, AluaState, AluaState)> {
        let mut changed = Vec::new();
        for (id, state) in states {
            let Some(g) = self.groups.iter_mut().find(|g| g.id == id) else {
                continue;
            };
            if g.state != state {
                changed.push((id, g.state, state));
                g.state = state;
            }
            if !self.set_by_command.contains(&id) {
                self.set_by_command.push(id);
            }
        }
        changed
    }

    /// The groups whose state a SET TARGET PORT GROUPS set and still
    /// holds, with that state: what the target keeps across a restart.
    pub fn set_states(&self) -> Vec<(u16, AluaState)> {
        self.set_by_command
            .iter()
            .filter_map(|id| self.groups.iter().find(|g| g.id == *id))
            .map(|g| (g.id, g.state))
            .collect()
    }

    /// Puts back states SET TARGET PORT GROUPS set before a restart
    /// ([`Self::set_states`]): each group that still exists takes its
    /// state and counts as set by the command again. Returns the groups
    /// whose state changed (before and after) and the ones the target no
    /// longer has.
    pub fn restore(
        &mut self,
        saved: &[(u16, AluaState)],
    ) -> (Vec<(u16, AluaState, AluaState)>, Vec<u16>) {
        let gone = saved
            .iter()
            .map(|s| s.0)
            .filter(|id| !self.groups.iter().any(|g| g.id == *id))
            .collect();
        (self.take_states_set_by_command(saved.iter().copied()), gone)
    }

    /// The group holding `relative_port` and its state. A port in no
    /// configured group (or with none configured) is in the default group,
    /// active/optimized.
    pub fn of_port(&self, relative_port: u16) -> (u16, AluaState) {
        self.groups
            .iter()
            .find(|g| g.ports.contains(&relative_port))
            .map_or((DEFAULT_GROUP, AluaState::ActiveOptimized), |g| {
                (g.id, g.state)
            })
    }

    /// Refuses a media command arriving through `relative_port` when its
    /// group is in standby (SPC-4 5.16.2.4.4).
    pub fn check_media_access(&self, relative_port: u16) -> Result<(), Failure> {
        match self.of_port(relative_port).1 {
            AluaState::Standby => Err(Failure::Check(Sense::new(
                SenseKey::NotReady,
                Asc::LU_NOT_ACCESSIBLE_TARGET_PORT_IN_STANDBY_STATE,
            ))),
            _ => Ok(()),
        }
    }

    /// REPORT TARGET PORT GROUPS parameter data (SPC-4 6.27): one
    /// descriptor per group (PREF on the first not in standby), each listing its ports;
    /// with no group configured, the default group holding the port the
    /// command came through. `parameter_data_format` 0 is the length-only
    /// header, 1 the extended header.
    pub fn report(
        &self,
        relative_port: u16,
        parameter_data_format: u8,
        allocation_length: u32,
    ) -> CmdResult {
        if parameter_data_format > 1 {
            return Err(invalid_cdb(1, Some(7)));
        }
        let fallback;
        let groups = if self.groups.is_empty() {
            fallback = [TargetPortGroup {
                id: DEFAULT_GROUP,
                state: AluaState::ActiveOptimized,
                ports: vec![relative_port],
            }];
            &fallback[..]
        } else {
            &self.groups[..]
        };
        // PREF marks the first group not in standby: Linux's ALUA
        // prioritizer ranks a preferred group above any unpreferred one
        // whatever its state (80 points), so a preferred group in standby
        // would draw dm-multipath back to a port that refuses media
        // commands, again and again (failback immediate).
        let preferred = groups.iter().position(|g| g.state != AluaState::Standby);
        let mut desc = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            let pref = if Some(i) == preferred { 0x80 } else { 0 };
            desc.push(pref | g.state.code());
            desc.push(SUPPORTED_STATES);
            desc.extend_from_slice(&g.id.to_be_bytes());
            // Reserved; STATUS CODE (01h: altered by SET TARGET PORT
            // GROUPS, 02h: altered by implicit ALUA behavior); vendor
            // specific; TARGET PORT COUNT.
            let status = if self.set_by_command.contains(&g.id) {
                0x01
            } else {
                0x02
            };
            desc.extend_from_slice(&[0, status, 0, g.ports.len().min(255) as u8]);
            for p in g.ports.iter().take(255) {
                desc.extend_from_slice(&[0, 0]);
                desc.extend_from_slice(&p.to_be_bytes());
            }
        }
        let mut data = Vec::with_capacity(8 + desc.len());
        let header_extra = if parameter_data_format == 1 { 4 } else { 0 };
        data.extend_from_slice(&((desc.len() + header_extra) as u32).to_be_bytes());
        if parameter_data_format == 1 {
            // FORMAT TYPE 001b; IMPLICIT TRANSITION TIME 0 (never changes).
            data.extend_from_slice(&[0x10, 0, 0, 0]);
        }
        data.extend_from_slice(&desc);
        Ok(Done::data(data, allocation_length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups_of(groups: Vec<TargetPortGroup>) -> PortGroups {
        PortGroups {
            groups,
            ..PortGroups::default()
        }
    }

    fn two() -> PortGroups {
        groups_of(vec![
            TargetPortGroup {
                id: 1,
                state: AluaState::ActiveOptimized,
                ports: vec![1],
            },
            TargetPortGroup {
                id: 2,
                state: AluaState::Standby,
                ports: vec![2],
            },
        ])
    }

    #[test]
    fn states_by_name() {
        for s in [
            AluaState::ActiveOptimized,
            AluaState::ActiveNonOptimized,
            AluaState::Standby,
        ] {
            assert_eq!(AluaState::from_name(s.name()), Some(s));
        }
        assert_eq!(AluaState::from_name("offline"), None);
    }

    #[test]
    fn ports_find_their_group() {
        let g = two();
        assert_eq!(g.of_port(1), (1, AluaState::ActiveOptimized));
        assert_eq!(g.of_port(2), (2, AluaState::Standby));
        assert_eq!(g.of_port(9), (DEFAULT_GROUP, AluaState::ActiveOptimized));
        assert!(g.check_media_access(1).is_ok());
        let Err(Failure::Check(s)) = g.check_media_access(2) else {
            panic!("standby must refuse media commands")
        };
        assert_eq!(s.key, SenseKey::NotReady);
        assert_eq!((s.asc, s.ascq), (0x04, 0x0b));
    }

    #[test]
    fn report_lists_every_group_with_pref_on_the_first() {
        let d = two().report(2, 0, 4096).unwrap().data;
        assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 24);
        assert_eq!(
            &d[4..],
            &[
                0x80, 0x07, 0, 1, 0, 2, 0, 1, 0, 0, 0, 1, // group 1: PREF, AO, port 1
                0x02, 0x07, 0, 2, 0, 2, 0, 1, 0, 0, 0, 2, // group 2: standby, port 2
            ]
        );
        let ext = two().report(2, 1, 4096).unwrap().data;
        assert_eq!(u32::from_be_bytes(ext[0..4].try_into().unwrap()), 28);
        assert_eq!(&ext[4..8], &[0x10, 0, 0, 0]);
        assert_eq!(&ext[8..], &d[4..]);
        assert!(two().report(1, 2, 4096).is_err(), "format 2 is reserved");
    }

    #[test]
    fn a_first_group_in_standby_is_not_preferred() {
        let groups = |first: AluaState, second: AluaState| {
            groups_of(vec![
                TargetPortGroup {
                    id: 1,
                    state: first,
                    ports: vec![1],
                },
                TargetPortGroup {
                    id: 2,
                    state: second,
                    ports: vec![2],
                },
            ])
        };
        let firsts = |g: PortGroups| {
            let d = g.report(1, 0, 4096).unwrap().data;
            (d[4], d[16])
        };
        assert_eq!(
            firsts(groups(AluaState::Standby, AluaState::ActiveNonOptimized)),
            (0x02, 0x81),
            "PREF moves to the active group"
        );
        assert_eq!(
            firsts(groups(
                AluaState::ActiveNonOptimized,
                AluaState::ActiveOptimized
            )),
            (0x81, 0x00),
            "an active first group keeps it"
        );
        assert_eq!(
            firsts(groups(AluaState::Standby, AluaState::Standby)),
            (0x02, 0x02),
            "no group preferred when none is active"
        );
    }

    #[test]
    fn report_without_groups_holds_the_asking_port() {
        let d = PortGroups::default().report(7, 0, 4096).unwrap().data;
        assert_eq!(
            &d[..],
            &[0, 0, 0, 12, 0x80, 0x07, 0, 1, 0, 2, 0, 1, 0, 0, 0, 7]
        );
    }

    mod set_target_port_groups_list {
        use super::*;
        use proptest::prelude::*;

        fn list_of(requests: &[(u16, u8)]) -> Vec<u8> {
            let mut l = vec![0u8; STPG_HEADER];
            for (group, code) in requests {
                l.extend_from_slice(&[*code, 0]);
                l.extend_from_slice(&group.to_be_bytes());
            }
            l
        }

        proptest! {
            /// Any bytes and any length: never a panic, never a read past
            /// the data that came, and a list is accepted exactly when its
            /// length is whole descriptors within the data, every state is
            /// one this target supports and no group comes twice.
            #[test]
            fn any_list_is_accepted_only_when_whole_supported_and_distinct(
                data in proptest::collection::vec(any::<u8>(), 0..48),
                len in prop_oneof![0u32..52, any::<u32>()],
            ) {
                let got = parse_set_target_port_groups(len, &data);
                let l = len as usize;
                let whole = l == 0
                    || (l <= data.len() && l >= STPG_HEADER && (l - STPG_HEADER) % STPG_DESCRIPTOR == 0);
                if !whole {
                    prop_assert!(got.is_err());
                    return Ok(());
                }
                let descriptors: Vec<&[u8]> = if l == 0 {
                    Vec::new()
                } else {
                    data[STPG_HEADER..l].chunks(STPG_DESCRIPTOR).collect()
                };
                let supported = descriptors.iter().all(|d| d[0] & 0x0f <= 2);
                let groups: Vec<u16> = descriptors.iter().map(|d| u16::from_be_bytes([d[2], d[3]])).collect();
                let distinct = groups.iter().enumerate().all(|(i, g)| !groups[..i].contains(g));
                match got {
                    Ok(requests) => {
                        prop_assert!(supported && distinct);
                        prop_assert_eq!(requests.len(), descriptors.len());
                        for (i, (r, d)) in requests.iter().zip(&descriptors).enumerate() {
                            prop_assert_eq!(r.group, u16::from_be_bytes([d[2], d[3]]));
                            prop_assert_eq!(r.state.code(), d[0] & 0x0f);
                            prop_assert_eq!(usize::from(r.offset), STPG_HEADER + i * STPG_DESCRIPTOR);
                        }
                    }
                    Err(_) => prop_assert!(!(supported && distinct)),
                }
            }

            /// A list written from distinct groups and supported states
            /// reads back as the same requests, in order.
            #[test]
            fn a_written_list_reads_back(
                groups in proptest::collection::btree_set(any::<u16>(), 0..12),
                codes in proptest::collection::vec(0u8..3, 12),
            ) {
                let asked: Vec<(u16, u8)> = groups.iter().copied().zip(codes).collect();
                let data = list_of(&asked);
                let got = parse_set_target_port_groups(data.len() as u32, &data).unwrap();
                let back: Vec<(u16, u8)> = got.iter().map(|r| (r.group, r.state.code())).collect();
                prop_assert_eq!(back, asked);
            }
        }

        /// Every TARGET PORT GROUP value once is a list of 64 Ki
        /// requests, all taken; naming one of them again is refused at that
        /// descriptor's group field. Each descriptor is checked against the
        /// others by one bit, not by a search of those before it.
        #[test]
        fn a_list_of_every_group_value_is_taken_and_a_repeat_refused() {
            let every: Vec<(u16, u8)> = (0..=u16::MAX).map(|g| (g, 0)).collect();
            let data = list_of(&every);
            let got = parse_set_target_port_groups(data.len() as u32, &data).unwrap();
            assert_eq!(got.len(), 1 << 16);
            assert!(got
                .iter()
                .enumerate()
                .all(|(i, r)| usize::from(r.group) == i));
            let mut again = data;
            again.extend_from_slice(&[0, 0, 0, 7]);
            // Its descriptor starts past 64 KiB: the field pointer names
            // the last byte it can reach.
            assert_eq!(
                parse_set_target_port_groups(again.len() as u32, &again),
                Err(invalid_param(u16::MAX, None))
            );
        }

        #[test]
        fn applying_names_only_existing_groups_and_all_or_nothing() {
            let mut g = two();
            let asked = parse_set_target_port_groups(12, &list_of(&[(2, 0), (3, 0)])).unwrap();
            assert!(g.set_by_command(&asked).is_err());
            assert_eq!(g, two(), "group 2 kept its state: group 3 does not exist");
            let asked = parse_set_target_port_groups(12, &list_of(&[(2, 0), (1, 1)])).unwrap();
            assert_eq!(
                g.set_by_command(&asked).unwrap(),
                vec![
                    (2, AluaState::Standby, AluaState::ActiveOptimized),
                    (1, AluaState::ActiveOptimized, AluaState::ActiveNonOptimized)
                ]
            );
            assert_eq!(g.set_by_command, vec![2, 1]);
            // An implicit change of group 1 only: group 2 stays set by the command.
            let mut groups = g.groups.clone();
            groups[0].state = AluaState::ActiveOptimized;
            g.replace(groups);
            assert_eq!(g.set_by_command, vec![2]);
        }
    }
}
