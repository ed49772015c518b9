//! Log pages (SPC-4 7.3): the LOG SENSE page header and log parameters,
//! the Supported Log Pages page (00h) and the resource counts of the Logical
//! Block Provisioning log page (0Ch, SBC-4 6.4.5).

use super::error::{need, DataError};
use super::wire::{be16, be32, bit, flag, u8_at};

/// Log page codes modelled here.
pub mod page {
    /// Supported Log Pages (SPC-4 7.3.18).
    pub const SUPPORTED_PAGES: u8 = 0x00;
    /// Logical Block Provisioning (SBC-4 6.4.5).
    pub const LOGICAL_BLOCK_PROVISIONING: u8 = 0x0c;
}

/// Parameter codes of the Logical Block Provisioning log page that match
/// the THRESHOLD RESOURCE of a threshold descriptor (SBC-4 table 196).
pub mod lbp_parameter {
    /// Available LBA Mapping Resource Count.
    pub const AVAILABLE: u16 = 0x0001;
    /// Used LBA Mapping Resource Count.
    pub const USED: u16 = 0x0002;
}

/// The parameter control byte of a binary format list log parameter (SPC-4
/// 7.3.2.2.2): DU 0, TSD 1 (the device server does not save it),
/// FORMAT AND LINKING 11b.
pub const BINARY_LIST_CONTROL: u8 = 0x23;

/// One log parameter (SPC-4 7.3.2.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogParameter {
    /// PARAMETER CODE.
    pub code: u16,
    /// The parameter control byte (DU, TSD, ETC, TMC, FORMAT AND LINKING).
    pub control: u8,
    /// The parameter value; at most 255 bytes (PARAMETER LENGTH is one byte).
    pub value: Vec<u8>,
}

/// What follows a log page's header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LogBody {
    /// Page 00h, subpage 00h: the supported page codes, one byte each.
    SupportedPages(Vec<u8>),
    /// Any other page: log parameters in order.
    Parameters(Vec<LogParameter>),
}

/// A log page as LOG SENSE returns it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogPage {
    /// DS: disable save (the page's parameters are not saved).
    pub ds: bool,
    /// SPF: subpage format.
    pub spf: bool,
    /// PAGE CODE (6 bits).
    pub page_code: u8,
    /// SUBPAGE CODE.
    pub subpage_code: u8,
    /// Page contents.
    pub body: LogBody,
}

impl LogPage {
    /// The page's bytes. Parameters past what the 16-bit PAGE LENGTH holds,
    /// and value bytes past 255, are left out.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        match &self.body {
            LogBody::SupportedPages(codes) => {
                body.extend(codes.iter().take(usize::from(u16::MAX)));
            }
            LogBody::Parameters(ps) => {
                for p in ps {
                    let n = p.value.len().min(255);
                    if body.len() + 4 + n > usize::from(u16::MAX) {
                        break;
                    }
                    body.extend_from_slice(&p.code.to_be_bytes());
                    body.push(p.control);
                    body.push(n as u8);
                    body.extend_from_slice(p.value.get(..n).unwrap_or_default());
                }
            }
        }
        let mut out = Vec::with_capacity(4 + body.len());
        out.push(flag(self.ds, 7) | flag(self.spf, 6) | (self.page_code & 0x3f));
        out.push(self.subpage_code);
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Parses a log page; bytes after PAGE LENGTH are ignored, and a
    /// parameter whose PARAMETER LENGTH runs past the page is refused.
    pub fn decode(b: &[u8]) -> Result<LogPage, DataError> {
        let h = need(b, 4)?;
        let b0 = u8_at(h, 0).unwrap_or(0);
        let page_code = b0 & 0x3f;
        let subpage_code = u8_at(h, 1).unwrap_or(0);
        let len = usize::from(be16(h, 2).unwrap_or(0));
        let d = need(b, 4 + len)?.get(4..).unwrap_or_default();
        let body = if page_code == page::SUPPORTED_PAGES && subpage_code == 0 {
            LogBody::SupportedPages(d.to_vec())
        } else {
            let mut ps = Vec::new();
            let mut at = 0usize;
            while at < d.len() {
                let Some(p) = d.get(at..).filter(|p| p.len() >= 4) else {
                    return Err(DataError::InvalidField {
                        byte: 4 + at,
                        bit: None,
                    });
                };
                let n = usize::from(u8_at(p, 3).unwrap_or(0));
                let Some(value) = p.get(4..4 + n) else {
                    return Err(DataError::InvalidField {
                        byte: 4 + at + 3,
                        bit: None,
                    });
                };
                ps.push(LogParameter {
                    code: be16(p, 0).unwrap_or(0),
                    control: u8_at(p, 2).unwrap_or(0),
                    value: value.to_vec(),
                });
                at += 4 + n;
            }
            LogBody::Parameters(ps)
        };
        Ok(LogPage {
            ds: bit(b0, 7),
            spf: bit(b0, 6),
            page_code,
            subpage_code,
            body,
        })
    }

    /// The parameter with `code`, if the page has parameters and that one.
    pub fn parameter(&self, code: u16) -> Option<&LogParameter> {
        match &self.body {
            LogBody::Parameters(ps) => ps.iter().find(|p| p.code == code),
            LogBody::SupportedPages(_) => None,
        }
    }
}

/// The SCOPE of a logical block provisioning resource count (SBC-4 table
/// 199).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceScope {
    /// 00b: not reported.
    NotReported,
    /// 01b: resources dedicated to this logical unit.
    Dedicated,
    /// 10b: resources that other logical units (or anything else) may use
    /// too, e.g. the free space of a file system that holds several files.
    Shared,
    /// 11b.
    Reserved,
}

impl ResourceScope {
    fn code(self) -> u8 {
        match self {
            Self::NotReported => 0,
            Self::Dedicated => 1,
            Self::Shared => 2,
            Self::Reserved => 3,
        }
    }

    fn from_code(c: u8) -> Self {
        match c & 3 {
            0 => Self::NotReported,
            1 => Self::Dedicated,
            2 => Self::Shared,
            _ => Self::Reserved,
        }
    }
}

/// An Available or Used LBA Mapping Resource Count log parameter's value
/// (SBC-4 6.4.5.2, 6.4.5.3): a count of threshold sets and its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResourceCount {
    /// RESOURCE COUNT, in threshold sets (2^THRESHOLD EXPONENT logical blocks).
    pub count: u32,
    /// SCOPE.
    pub scope: ResourceScope,
}

impl ResourceCount {
    /// The log parameter `code` (a binary format list parameter, 8 bytes).
    pub fn to_parameter(self, code: u16) -> LogParameter {
        let mut value = Vec::with_capacity(8);
        value.extend_from_slice(&self.count.to_be_bytes());
        value.extend_from_slice(&[self.scope.code(), 0, 0, 0]);
        LogParameter {
            code,
            control: BINARY_LIST_CONTROL,
            value,
        }
    }

    /// Reads a resource count from a parameter of 8 value bytes.
    pub fn from_parameter(p: &LogParameter) -> Result<ResourceCount, DataError> {
        if p.value.len() != 8 {
            return Err(DataError::Length {
                expected: 8,
                got: p.value.len(),
            });
        }
        Ok(ResourceCount {
            count: be32(&p.value, 0).unwrap_or(0),
            scope: ResourceScope::from_code(u8_at(&p.value, 4).unwrap_or(0)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provisioning_page_is_laid_out_as_sbc_shows_it() {
        let page = LogPage {
            ds: true,
            spf: false,
            page_code: page::LOGICAL_BLOCK_PROVISIONING,
            subpage_code: 0,
            body: LogBody::Parameters(vec![
                ResourceCount {
                    count: 0x0102_0304,
                    scope: ResourceScope::Shared,
                }
                .to_parameter(lbp_parameter::AVAILABLE),
                ResourceCount {
                    count: 7,
                    scope: ResourceScope::Dedicated,
                }
                .to_parameter(lbp_parameter::USED),
            ]),
        };
        let b = page.encode();
        assert_eq!(
            b,
            vec![
                0x8c, 0, 0, 24, //
                0, 1, 0x23, 8, 1, 2, 3, 4, 2, 0, 0, 0, //
                0, 2, 0x23, 8, 0, 0, 0, 7, 1, 0, 0, 0,
            ]
        );
        let back = LogPage::decode(&b).unwrap();
        assert_eq!(back, page);
        let used = ResourceCount::from_parameter(back.parameter(lbp_parameter::USED).unwrap());
        assert_eq!(used.unwrap().count, 7);
    }

    #[test]
    fn a_parameter_running_past_the_page_is_refused() {
        // PAGE LENGTH 6 holds the 4-byte parameter header and 2 bytes, but
        // PARAMETER LENGTH says 8.
        let b = [0x0c, 0, 0, 6, 0, 1, 0x23, 8, 0, 0];
        assert_eq!(
            LogPage::decode(&b),
            Err(DataError::InvalidField { byte: 7, bit: None })
        );
        // Two stray bytes after the last whole parameter.
        let b = [0x0c, 0, 0, 6, 0, 1, 0x23, 0, 0, 0];
        assert_eq!(
            LogPage::decode(&b),
            Err(DataError::InvalidField { byte: 8, bit: None })
        );
        assert!(matches!(
            LogPage::decode(&[0x0c, 0, 0, 9, 0]),
            Err(DataError::Truncated { .. })
        ));
    }
}
