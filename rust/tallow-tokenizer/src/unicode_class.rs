//! The three Unicode properties the pre-tokenizer regexes ask about: `\p{L}`, `\p{N}` and `\s`.
//!
//! `\s` is the Unicode `White_Space` property, as in llama.cpp and in the Oniguruma regexes of HF
//! `tokenizers` (U+001C..U+001F and U+180E are *not* whitespace there, unlike Python's `str.split`).
//! ASCII is answered from a constant table, the rest of the Basic Multilingual Plane from a table
//! built once on first use, and the astral planes by the category crate's binary search.

use std::sync::OnceLock;
use unicode_general_category::{get_general_category, GeneralCategory};

/// How a code point behaves in the GPT-2 family of pre-tokenizer regexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CharClass {
    /// General category L* (`\p{L}`).
    Letter,
    /// General category N* (`\p{N}`).
    Number,
    /// `White_Space` (`\s`).
    Whitespace,
    /// Anything else (`[^\s\p{L}\p{N}]`).
    Other,
}

const ASCII: [CharClass; 128] = {
    let mut table = [CharClass::Other; 128];
    let mut b = 0;
    while b < 128 {
        table[b] = match b as u8 {
            b'a'..=b'z' | b'A'..=b'Z' => CharClass::Letter,
            b'0'..=b'9' => CharClass::Number,
            b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ' => CharClass::Whitespace,
            _ => CharClass::Other,
        };
        b += 1;
    }
    table
};

fn classify_slow(c: char) -> CharClass {
    if c.is_whitespace() {
        // `char::is_whitespace` is exactly the `White_Space` property.
        return CharClass::Whitespace;
    }
    use GeneralCategory::*;
    match get_general_category(c) {
        UppercaseLetter | LowercaseLetter | TitlecaseLetter | ModifierLetter | OtherLetter => {
            CharClass::Letter
        }
        DecimalNumber | LetterNumber | OtherNumber => CharClass::Number,
        _ => CharClass::Other,
    }
}

fn bmp_table() -> &'static [CharClass] {
    static TABLE: OnceLock<Vec<CharClass>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=0xFFFFu32)
            .map(|cp| char::from_u32(cp).map_or(CharClass::Other, classify_slow))
            .collect()
    })
}

/// The class of one code point.
#[inline]
pub(crate) fn classify(c: char) -> CharClass {
    let cp = c as usize;
    if cp < 128 {
        ASCII[cp]
    } else if cp <= 0xFFFF {
        bmp_table()[cp]
    } else {
        classify_slow(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_table_agrees_with_the_general_rule() {
        for b in 0u8..128 {
            assert_eq!(
                classify(char::from(b)),
                classify_slow(char::from(b)),
                "byte {b:#x}"
            );
        }
    }

    #[test]
    fn classes_of_hand_picked_code_points() {
        assert_eq!(classify('é'), CharClass::Letter);
        assert_eq!(classify('ß'), CharClass::Letter);
        assert_eq!(classify('中'), CharClass::Letter);
        assert_eq!(classify('ʰ'), CharClass::Letter); // Lm
        assert_eq!(classify('٣'), CharClass::Number); // Arabic-Indic digit three
        assert_eq!(classify('Ⅻ'), CharClass::Number); // Nl
        assert_eq!(classify('½'), CharClass::Number); // No
        assert_eq!(classify('\u{a0}'), CharClass::Whitespace);
        assert_eq!(classify('\u{85}'), CharClass::Whitespace);
        assert_eq!(classify('\u{3000}'), CharClass::Whitespace);
        assert_eq!(classify('\u{2028}'), CharClass::Whitespace);
        assert_eq!(classify('\u{1c}'), CharClass::Other);
        assert_eq!(classify('\u{180e}'), CharClass::Other);
        assert_eq!(classify('\u{200b}'), CharClass::Other);
        assert_eq!(classify('\u{301}'), CharClass::Other); // combining mark
        assert_eq!(classify('€'), CharClass::Other);
        assert_eq!(classify('😀'), CharClass::Other);
        assert_eq!(classify('𝐀'), CharClass::Letter); // astral letter
        assert_eq!(classify('𝟙'), CharClass::Number); // astral digit
        assert_eq!(classify('\u{E0000}'), CharClass::Other); // unassigned
    }
}
