//! Asymmetric logical unit access (SPC-4 5.16), implicit only (TPGS=01b):
//! the target port groups a target's logical units are reached through,
//! each with its access state, as plain data the fabric hands to the
//! [`LunTable`](super::LunTable) (an iSCSI fabric passes one group per
//! portal group, its relative port being the TPGT). The core reports them
//! in REPORT TARGET PORT GROUPS and VPD 83h and refuses media commands
//! through a port in standby; it never learns what a portal is.

use blockwire_pdu::scsi::{Asc, Sense, SenseKey};

use super::outcome::{invalid_cdb, CmdResult, Done, Failure};

/// The asymmetric access state of a target port group (SPC-4 table 49).
/// Only the states an implicit-ALUA target without transitions needs.
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

    /// Parses [`AluaState::name`]'s spelling.
    pub fn from_name(name: &str) -> Option<AluaState> {
        [
            AluaState::ActiveOptimized,
            AluaState::ActiveNonOptimized,
            AluaState::Standby,
        ]
        .into_iter()
        .find(|s| s.name() == name)
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

/// A target's port groups, in order (the first not in standby is the
/// preferred one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PortGroups(pub Vec<TargetPortGroup>);

impl PortGroups {
    /// The group holding `relative_port` and its state. A port in no
    /// configured group (or with none configured) is in the default group,
    /// active/optimized.
    pub fn of_port(&self, relative_port: u16) -> (u16, AluaState) {
        self.0
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
        let groups = if self.0.is_empty() {
            fallback = [TargetPortGroup {
                id: DEFAULT_GROUP,
                state: AluaState::ActiveOptimized,
                ports: vec![relative_port],
            }];
            &fallback[..]
        } else {
            &self.0[..]
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
            // Reserved; STATUS CODE 02h (altered by implicit ALUA
            // behavior); vendor specific; TARGET PORT COUNT.
            desc.extend_from_slice(&[0, 0x02, 0, g.ports.len().min(255) as u8]);
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

    fn two() -> PortGroups {
        PortGroups(vec![
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
            PortGroups(vec![
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
}
