//! Bounds-checked big-endian readers shared by the SCSI codecs.
//!
//! Every reader returns `None` instead of panicking when the requested bytes
//! are not all present, so parsers of untrusted buffers never index directly.

/// One byte at `off`, if present.
pub(crate) fn u8_at(b: &[u8], off: usize) -> Option<u8> {
    b.get(off).copied()
}

/// `N` bytes starting at `off`, if all present.
pub(crate) fn array<const N: usize>(b: &[u8], off: usize) -> Option<[u8; N]> {
    let end = off.checked_add(N)?;
    b.get(off..end)?.try_into().ok()
}

/// Big-endian u16 at `off`.
pub(crate) fn be16(b: &[u8], off: usize) -> Option<u16> {
    array::<2>(b, off).map(u16::from_be_bytes)
}

/// Big-endian u32 at `off`.
pub(crate) fn be32(b: &[u8], off: usize) -> Option<u32> {
    array::<4>(b, off).map(u32::from_be_bytes)
}

/// Big-endian u64 at `off`.
pub(crate) fn be64(b: &[u8], off: usize) -> Option<u64> {
    array::<8>(b, off).map(u64::from_be_bytes)
}

/// Whether bit `n` of `byte` is set.
pub(crate) fn bit(byte: u8, n: u8) -> bool {
    byte & (1 << n) != 0
}

/// Sets bit `n` of the result when `v` is true.
pub(crate) fn flag(v: bool, n: u8) -> u8 {
    if v {
        1 << n
    } else {
        0
    }
}

/// Space-pads (or truncates) `s` to a fixed ASCII field, as SPC requires for
/// INQUIRY identification strings.
pub(crate) fn ascii_field<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [b' '; N];
    for (dst, src) in out.iter_mut().zip(s.bytes()) {
        *dst = if src.is_ascii_graphic() || src == b' ' {
            src
        } else {
            b'?'
        };
    }
    out
}

/// A fixed ASCII field with trailing spaces and NULs removed, for display.
pub(crate) fn trim_ascii(field: &[u8]) -> String {
    let end = field
        .iter()
        .rposition(|&c| c != b' ' && c != 0)
        .map_or(0, |p| p + 1);
    field
        .get(..end)
        .unwrap_or_default()
        .iter()
        .map(|&c| if c.is_ascii() { c as char } else { '?' })
        .collect()
}
