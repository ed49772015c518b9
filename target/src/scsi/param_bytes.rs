//! Big-endian fields of a parameter list the initiator sent. A field that
//! runs past the end of the list reads as 0: callers compare lengths with
//! the list's size before they trust any of them, so a short list never
//! panics and never reads beyond what arrived.

pub(crate) fn be16(b: &[u8], o: usize) -> usize {
    b.get(o..o + 2)
        .map_or(0, |x| usize::from(u16::from_be_bytes([x[0], x[1]])))
}

pub(crate) fn be32(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .map_or(0, |x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
}

pub(crate) fn be64(b: &[u8], o: usize) -> u64 {
    b.get(o..o + 8).map_or(0, |x| {
        let mut a = [0u8; 8];
        a.copy_from_slice(x);
        u64::from_be_bytes(a)
    })
}
