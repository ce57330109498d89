//! GPT-2's reversible map between bytes and printable code points ("byte-level" text).
//!
//! Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, DEL, NBSP,
//! soft hyphen...) are shifted to U+0100.. in byte order, so `' '` becomes `'Ġ'` and `'\n'` `'Ċ'`.

const fn stands_for_itself(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The byte-level code point of each byte.
pub(crate) const BYTE_TO_CHAR: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut shifted = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let cp = if stands_for_itself(b as u8) {
            b as u32
        } else {
            shifted += 1;
            255 + shifted
        };
        table[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => panic!("byte-level code points are below U+0144"),
        };
        b += 1;
    }
    table
};

/// Largest byte-level code point + 1.
const CHAR_LIMIT: usize = 0x144;

/// For each code point below `CHAR_LIMIT`, the byte it stands for, or -1.
const CHAR_TO_BYTE: [i16; CHAR_LIMIT] = {
    let mut table = [-1i16; CHAR_LIMIT];
    let mut b = 0usize;
    while b < 256 {
        table[BYTE_TO_CHAR[b] as usize] = b as i16;
        b += 1;
    }
    table
};

/// The byte a byte-level code point stands for.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    CHAR_TO_BYTE
        .get(c as usize)
        .and_then(|&b| u8::try_from(b).ok())
}

/// Byte-level text of raw bytes.
pub(crate) fn encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| BYTE_TO_CHAR[usize::from(b)])
        .collect()
}

/// Raw bytes of byte-level text. A code point outside the map (only in malformed vocabularies)
/// is kept as its own UTF-8, as HF `tokenizers`' ByteLevel decoder does.
pub(crate) fn decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_code_points() {
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[b'\t' as usize], 'ĉ');
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a');
        assert_eq!(BYTE_TO_CHAR[0], 'Ā');
        assert_eq!(BYTE_TO_CHAR[0xAD], 'Ń');
        assert_eq!(encode("é".as_bytes()), "Ã©");
    }

    #[test]
    fn all_bytes_round_trip() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)), all);
        assert_eq!(decode("ĠhelloĊ"), b" hello\n");
        assert_eq!(decode("aΩ"), "aΩ".as_bytes());
        assert_eq!(char_to_byte('Ω'), None);
    }
}
