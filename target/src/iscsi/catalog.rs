//! What the fabric serves: targets, their portal groups, access lists,
//! CHAP credentials and logical units. Built from the configuration by the
//! daemon; read by login, discovery and sessions.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::scsi::LunTable;

/// One CHAP credential: a user name and its secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapSecret {
    /// CHAP_N.
    pub user: String,
    /// The shared secret (never logged).
    pub secret: String,
}

impl std::fmt::Debug for ChapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapSecret")
            .field("user", &self.user)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// How initiators authenticate to a target (or to discovery).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthPolicy {
    /// Credentials initiators may use (one-way CHAP). Empty: no CHAP, AuthMethod=None.
    pub incoming: Vec<ChapSecret>,
    /// Per-initiator credentials: (InitiatorName, credential). Checked
    /// before `incoming` when the initiator's name matches.
    pub per_initiator: Vec<(String, ChapSecret)>,
    /// The target's own credential for mutual CHAP, if it offers it.
    pub outgoing: Option<ChapSecret>,
    /// CHAP algorithms accepted, in the target's order of preference when
    /// the initiator leaves a choice (IANA numbers: 5 MD5, 6 SHA1, 7 SHA-256, 8 SHA3-256).
    pub algorithms: Vec<u8>,
}

impl AuthPolicy {
    /// Whether CHAP is required.
    pub fn requires_chap(&self) -> bool {
        !self.incoming.is_empty() || !self.per_initiator.is_empty()
    }

    /// The secrets an initiator may prove knowledge of.
    pub fn credentials_for<'a>(
        &'a self,
        initiator_name: &'a str,
    ) -> impl Iterator<Item = &'a ChapSecret> + 'a {
        let own: Vec<&ChapSecret> = self
            .per_initiator
            .iter()
            // iSCSI names compare without case (RFC 7143 §4.2.7.1), as
            // the access list and reinstatement compare them.
            .filter(|(name, _)| name.eq_ignore_ascii_case(initiator_name))
            .map(|(_, c)| c)
            .collect();
        let fallback = own.is_empty();
        own.into_iter()
            .chain(self.incoming.iter().filter(move |_| fallback))
    }
}

/// A group of portals sharing one target portal group tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortalGroup {
    /// Target Portal Group Tag.
    pub tag: u16,
    /// Addresses the group listens on.
    pub addresses: Vec<SocketAddr>,
}

/// Which initiators may see and log in to a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acl {
    /// Any initiator.
    Any,
    /// Only these InitiatorNames (compared case-insensitively, as iSCSI names are).
    Only(Vec<String>),
}

impl Acl {
    /// Whether `initiator_name` may access the target.
    pub fn allows(&self, initiator_name: &str) -> bool {
        match self {
            Acl::Any => true,
            Acl::Only(names) => names.iter().any(|n| n.eq_ignore_ascii_case(initiator_name)),
        }
    }
}

/// One iSCSI target.
#[derive(Debug)]
pub struct TargetEntry {
    /// iSCSI name (iqn./eui./naa.).
    pub name: String,
    /// TargetAlias, if any.
    pub alias: Option<String>,
    /// Tags of the portal groups it is reachable through.
    pub portal_groups: Vec<u16>,
    /// Access control.
    pub acl: Acl,
    /// Authentication for normal sessions to this target.
    pub auth: AuthPolicy,
    /// Its logical units.
    pub luns: Arc<LunTable>,
    /// How each LUN's data should move, as configured (LUNs not listed
    /// take the SCSI core's copy path).
    pub data_paths: Vec<(u16, DataPathPolicy)>,
    /// The QoS ceilings of its LUNs that have any, as configured (a LUN
    /// kept across a live change takes them from here; see
    /// [`crate::scsi::qos`]).
    pub qos: Vec<(u16, crate::scsi::QosLimits)>,
}

impl TargetEntry {
    /// The ceilings configured for LUN `id` (none if not listed).
    pub fn qos_of(&self, id: u16) -> crate::scsi::QosLimits {
        self.qos
            .iter()
            .find(|(l, _)| *l == id)
            .map_or(crate::scsi::QosLimits::NONE, |(_, q)| *q)
    }
}

/// How a LUN's data should move, as configured. The fabric maps it onto
/// what the LUN's storage can do ([`crate::backstore::Capabilities`]) in
/// [`super::Fabric::start_data_paths`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataPathPolicy {
    /// READs through the I/O engine into registered buffers:
    /// synchronized sends or serial (read every chunk, then send).
    pub engine_reads: Option<crate::datapath::Mode>,
    /// READ payloads from the page cache by `sendfile(2)`, when the
    /// storage is a file read through the page cache.
    pub sendfile: bool,
    /// Double-buffered WRITEs through the I/O engine.
    pub double_buffered_writes: bool,
    /// Chunk size in bytes of both engine paths.
    pub chunk: usize,
}

/// Everything the fabric serves.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Portal groups.
    pub portal_groups: Vec<PortalGroup>,
    /// Targets.
    pub targets: Vec<Arc<TargetEntry>>,
    /// Authentication for discovery sessions.
    pub discovery_auth: AuthPolicy,
}

impl Catalog {
    /// One target named `name`, with `lun` as LUN 0, reachable in portal group 1 at
    /// `portal`, under `acl`, with no authentication and no data paths besides the core's.
    pub fn one_target(
        name: &str,
        portal: SocketAddr,
        acl: Acl,
        lun: Arc<crate::scsi::LogicalUnit>,
    ) -> Catalog {
        Catalog {
            portal_groups: vec![PortalGroup {
                tag: 1,
                addresses: vec![portal],
            }],
            targets: vec![Arc::new(TargetEntry {
                name: name.into(),
                alias: None,
                portal_groups: vec![1],
                acl,
                auth: AuthPolicy::default(),
                luns: Arc::new(LunTable::new(vec![(0, lun)])),
                data_paths: Vec::new(),
                qos: Vec::new(),
            })],
            discovery_auth: AuthPolicy::default(),
        }
    }

    /// The target with this name (iSCSI names compare case-insensitively).
    pub fn target(&self, name: &str) -> Option<&Arc<TargetEntry>> {
        self.targets
            .iter()
            .find(|t| t.name.eq_ignore_ascii_case(name))
    }

    /// The portal group with this tag.
    pub fn portal_group(&self, tag: u16) -> Option<&PortalGroup> {
        self.portal_groups.iter().find(|g| g.tag == tag)
    }

    /// The targets by name, for a caller that looks up many names (every target of another
    /// catalog, every session's target): [`Catalog::target`] scans the list, and a scan per
    /// target would cost the square of their number.
    pub fn targets_by_name(&self) -> TargetsByName<'_> {
        let mut by_name = std::collections::HashMap::with_capacity(self.targets.len());
        for t in &self.targets {
            // The first of two names equal but for case wins, as with `target`.
            by_name.entry(t.name.to_ascii_lowercase()).or_insert(t);
        }
        TargetsByName(by_name)
    }
}

/// A catalog's targets by name; names compare without regard to ASCII case, as iSCSI
/// names do (RFC 3722 maps them to lower case).
pub struct TargetsByName<'a>(std::collections::HashMap<String, &'a Arc<TargetEntry>>);

impl<'a> TargetsByName<'a> {
    /// The target named `name`, as [`Catalog::target`] finds it.
    pub fn get(&self, name: &str) -> Option<&'a Arc<TargetEntry>> {
        self.0.get(&name.to_ascii_lowercase()).copied()
    }
}
