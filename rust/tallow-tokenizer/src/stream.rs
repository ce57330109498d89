//! Incremental detokenization for streaming generated text.

use crate::{Tokenizer, TokenizerError};

/// Turns ids into text one at a time. A token can end inside a multi-byte UTF-8 character
/// (byte-level and byte-fallback tokens often do), so bytes that could still become a character
/// are held back until the next id completes them. Invalid bytes become U+FFFD exactly where
/// [`Tokenizer::decode`] would put one, so the pieces of a stream concatenate to
/// `decode(all ids)`.
///
/// The decoder owns only its state and takes the tokenizer on each call, so it can live
/// beside a shared model (for example in a Python object) without borrowing from it.
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    /// Bytes of an incomplete character at the end of the text so far.
    pending: Vec<u8>,
    /// No id has been pushed yet (the first token may lose its leading space).
    at_start: bool,
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self {
            pending: Vec::new(),
            at_start: true,
        }
    }

    /// Adds one id of `tokenizer`; returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        let piece = tokenizer.piece(id, self.at_start)?;
        self.at_start = false;
        self.pending.extend_from_slice(piece);
        let mut text = String::new();
        let mut rest = &self.pending[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    text.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` was just checked.
                    text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // Invalid whatever follows: replace it as from_utf8_lossy would.
                        Some(len) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[len..];
                        }
                        // A prefix of a character: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        self.pending.drain(..self.pending.len() - keep);
        Ok(text)
    }

    /// Ends the stream: returns what is left (an incomplete character becomes U+FFFD) and
    /// resets the decoder for a new stream.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.at_start = true;
        text
    }
}
