//! GPT-2's byte ↔ printable-character table: byte-level BPE stores every byte as a visible
//! character, so decoding a token means mapping its characters back to bytes.

use std::sync::OnceLock;

/// `byte_to_char()[b]` is the character GPT-2's `bytes_to_unicode` assigns to byte `b`.
pub fn byte_to_char() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..256u32 {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            let c = if printable {
                b
            } else {
                next += 1;
                next - 1
            };
            table[b as usize] = char::from_u32(c).expect("table values are valid chars");
        }
        table
    })
}

/// The byte a byte-level character stands for, if it is one of the 256.
pub fn char_to_byte(c: char) -> Option<u8> {
    let c = c as u32;
    let printable = (33..=126).contains(&c) || (161..=172).contains(&c) || (174..=255).contains(&c);
    if printable {
        return Some(c as u8);
    }
    if (256..256 + 68).contains(&c) {
        // The 68 non-printable bytes, in increasing byte order, took 256, 257, ...
        let table = byte_to_char();
        return table.iter().position(|&t| t as u32 == c).map(|b| b as u8);
    }
    None
}

/// Bytes a byte-level token string stands for; characters outside the table are kept as UTF-8
/// (added tokens are stored as plain text).
pub fn decode_token(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char()[b as usize]), Some(b));
        }
        assert_eq!(byte_to_char()[b' ' as usize], 'Ġ');
        assert_eq!(byte_to_char()[b'\n' as usize], 'Ċ');
        assert_eq!(decode_token("Ġhello"), b" hello");
    }
}
