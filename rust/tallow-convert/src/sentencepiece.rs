//! SentencePiece's `tokenizer.model`: a protocol-buffers `ModelProto`, of which a GGUF needs
//! the pieces (text, score, type). Read with a small wire-format decoder that checks every
//! length against the bytes it has.

use crate::ConvertError;

/// A piece's type, as SentencePiece numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

/// One entry of the vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub text: String,
    pub score: f32,
    pub kind: PieceType,
}

/// The pieces of a `tokenizer.model`, in id order.
pub fn pieces(bytes: &[u8]) -> Result<Vec<Piece>, ConvertError> {
    let mut out = Vec::new();
    for field in Fields::new(bytes) {
        let (number, value) = field?;
        if let (1, Wire::Bytes(piece)) = (number, value) {
            out.push(piece_of(piece)?);
        }
    }
    if out.is_empty() {
        return Err(bad("it holds no pieces".into()));
    }
    Ok(out)
}

fn piece_of(bytes: &[u8]) -> Result<Piece, ConvertError> {
    let mut piece = Piece {
        text: String::new(),
        score: 0.0,
        kind: PieceType::Normal,
    };
    for field in Fields::new(bytes) {
        match field? {
            (1, Wire::Bytes(text)) => {
                piece.text = String::from_utf8(text.to_vec())
                    .map_err(|_| bad("a piece that is not UTF-8".into()))?;
            }
            (2, Wire::Fixed32(bits)) => piece.score = f32::from_bits(bits),
            (3, Wire::Varint(kind)) => {
                piece.kind = match kind {
                    1 => PieceType::Normal,
                    2 => PieceType::Unknown,
                    3 => PieceType::Control,
                    4 => PieceType::UserDefined,
                    5 => PieceType::Unused,
                    6 => PieceType::Byte,
                    other => return Err(bad(format!("a piece of unknown type {other}"))),
                }
            }
            _ => {}
        }
    }
    Ok(piece)
}

fn bad(reason: String) -> ConvertError {
    ConvertError::Tokenizer {
        file: "tokenizer.model".into(),
        reason,
    }
}

/// A field's value, by wire type.
enum Wire<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// The fields of one message: `(field number, value)`.
struct Fields<'a> {
    bytes: &'a [u8],
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Fields { bytes }
    }

    fn varint(&mut self) -> Result<u64, ConvertError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self
                .bytes
                .split_first()
                .ok_or_else(|| bad("a number cut short".into()))?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(bad("a number of more than ten bytes".into()))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], ConvertError> {
        if n > self.bytes.len() as u64 {
            return Err(bad(format!(
                "a field of {n} bytes where {} are left",
                self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(n as usize);
        self.bytes = rest;
        Ok(head)
    }

    fn field(&mut self) -> Result<(u64, Wire<'a>), ConvertError> {
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Fixed64
            }
            2 => {
                let n = self.varint()?;
                Wire::Bytes(self.take(n)?)
            }
            5 => Wire::Fixed32(u32::from_le_bytes(
                self.take(4)?.try_into().expect("four bytes"),
            )),
            other => return Err(bad(format!("wire type {other} is not read"))),
        };
        Ok((key >> 3, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Wire<'a>), ConvertError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.bytes.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            self.bytes = &[]; // one error ends the message
        }
        Some(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn piece(text: &str, score: f32, kind: Option<u64>) -> Vec<u8> {
        let mut p = vec![0x0a];
        varint(text.len() as u64, &mut p);
        p.extend(text.as_bytes());
        p.push(0x15);
        p.extend(score.to_le_bytes());
        if let Some(kind) = kind {
            p.push(0x18);
            varint(kind, &mut p);
        }
        let mut out = vec![0x0a];
        varint(p.len() as u64, &mut out);
        out.extend(p);
        out
    }

    #[test]
    fn pieces_come_in_order_with_their_scores_and_types() {
        let mut model = piece("<unk>", 0.0, Some(2));
        model.extend(piece("<s>", 0.0, Some(3)));
        model.extend(piece("▁the", -3.5, None));
        model.extend(piece("<0x41>", 0.0, Some(6)));
        // A trainer spec (field 2) and a normalizer spec (field 3) are read past.
        model.extend([0x12, 0x02, 0x18, 0x02, 0x1a, 0x02, 0x18, 0x01]);
        let got = pieces(&model).unwrap();
        let kinds: Vec<_> = got
            .iter()
            .map(|p| (p.text.as_str(), p.score, p.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("<unk>", 0.0, PieceType::Unknown),
                ("<s>", 0.0, PieceType::Control),
                ("▁the", -3.5, PieceType::Normal),
                ("<0x41>", 0.0, PieceType::Byte)
            ]
        );
    }

    #[test]
    fn bad_models_are_errors() {
        for (bytes, needle) in [
            (vec![0x0a, 0x05, 0x0a], "5 bytes"),
            (vec![0x0a], "cut short"),
            (vec![0x0b], "wire type 3"),
            (vec![0x12, 0x00], "no pieces"),
            (piece("x", 0.0, Some(9)), "unknown type 9"),
        ] {
            let err = pieces(&bytes).unwrap_err();
            assert!(err.to_string().contains(needle), "{err} lacks {needle:?}");
        }
    }

    proptest! {
        #[test]
        fn any_bytes_are_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = pieces(&bytes);
        }
    }
}
