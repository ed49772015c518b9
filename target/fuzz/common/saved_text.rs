//! Arbitrary bytes as the text of a file a target reads back at start-up
//! (saved reservations, saved ALUA states), shared by the fuzz targets of
//! those readers (included with `#[path]`).

/// Hands `read` the text of `input` past its first byte, which picks
/// whether that text follows the file's first line, `header` (to reach the
/// records), or is the whole file. A file that is not UTF-8 is never read
/// as records (read_to_string refuses it), so only text reaches `read`.
pub fn as_saved_text(input: &[u8], header: &str, read: impl FnOnce(&str) -> bool) {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let Ok(rest) = std::str::from_utf8(rest) else {
        return;
    };
    if mode & 1 == 1 {
        read(&format!("{header}\n{rest}"));
    } else {
        read(rest);
    }
}
