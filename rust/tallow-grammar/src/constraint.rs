//! One request's constraint as it generates.

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

use crate::error::GrammarError;

/// Which tokens may come next for one request, advanced by each token it takes.
pub struct Constraint {
    matcher: Matcher,
    /// The model's end-of-generation tokens: all allowed where the grammar may end.
    eog: Vec<u32>,
    /// The mask before the first token, computed when the constraint was compiled.
    first: Option<SimpleVob>,
}

impl Clone for Constraint {
    /// A copy that goes on independently: its own parser and lexer caches (a shallow copy of
    /// llguidance's matcher would share the lexer's behind a lock with every other copy).
    fn clone(&self) -> Self {
        Constraint {
            matcher: self.matcher.deep_clone(),
            eog: self.eog.clone(),
            first: self.first.clone(),
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// The constraint of `matcher` (not started), its first mask computed now: where the
    /// lexer or the parser cannot even start within their limits, that error is the
    /// compiler's, not one of a step.
    pub(crate) fn start(mut matcher: Matcher, eog: Vec<u32>) -> Result<Self, String> {
        let first = matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
        Ok(Constraint {
            matcher,
            eog,
            first: Some(first),
        })
    }

    /// Sets to -inf the logits of the tokens that may not come next. The model's
    /// end-of-generation tokens may come only where the output is complete.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let allowed = match self.first.take() {
            Some(first) => first,
            None => self
                .matcher
                .compute_mask_or_eos()
                .map_err(GrammarError::matcher)?,
        };
        let words = allowed.as_slice();
        for (i, chunk) in logits.chunks_mut(32).enumerate() {
            let word = words.get(i).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            for (bit, logit) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// Takes `token` as the next one of the output (end-of-generation tokens end it).
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        self.first = None;
        if self.eog.contains(&token) {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(GrammarError::matcher)
    }

    /// Whether the output so far is complete (the grammar allows it to end here).
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
