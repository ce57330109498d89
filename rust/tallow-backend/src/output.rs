//! What a step leaves in host memory for the rows that produce logits: the logits
//! themselves, or only the token drawn from each row.

use crate::draw::{draw, Draw};
use crate::plan::StepPlan;
use crate::BackendError;

/// A step's rows of output: those that produce logits, or those that produce final hidden
/// states (see [`crate::Batch::push_hidden`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputRows {
    Logits,
    Hidden,
}

impl OutputRows {
    /// The rows (tokens) of the step, in output order.
    pub fn of(self, plan: &StepPlan) -> &[u32] {
        match self {
            OutputRows::Logits => &plan.logit_rows,
            OutputRows::Hidden => &plan.hidden_rows,
        }
    }
}

/// Where a step writes its result, one entry per row that produces logits.
pub enum Output<'o> {
    /// `n_vocab` logits per row, row after row.
    Logits(&'o mut [f32]),
    /// Each row's token, drawn as `draws` says for the row (the [`argmax`] of its logits for
    /// a greedy draw; see [`draw`]), chosen on the device so that only one number per row
    /// comes back. A row with nothing to draw (every logit NaN or -inf) takes its argmax.
    Draw {
        draws: &'o [Draw],
        tokens: &'o mut [u32],
    },
    /// The logits of `tokens` only, `tokens.len()` per row, row after row: where a few
    /// tokens' are all that is read (scoring one-token answers), the LM head computes only
    /// their rows of the output matrix. Every id is below `n_vocab`.
    Selected {
        tokens: &'o [u32],
        logits: &'o mut [f32],
    },
}

impl Output<'_> {
    /// How many values it holds.
    pub fn len(&self) -> usize {
        match self {
            Output::Logits(l) => l.len(),
            Output::Draw { tokens, .. } => tokens.len(),
            Output::Selected { logits, .. } => logits.len(),
        }
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same buffer, borrowed again (for a step that may run more than once).
    pub fn reborrow(&mut self) -> Output<'_> {
        match self {
            Output::Logits(l) => Output::Logits(l),
            Output::Draw { draws, tokens } => Output::Draw { draws, tokens },
            Output::Selected { tokens, logits } => Output::Selected { tokens, logits },
        }
    }

    /// How many values `rows` rows of `n_vocab` logits make here.
    pub fn len_for(&self, rows: usize, n_vocab: usize) -> usize {
        match self {
            Output::Logits(_) => rows * n_vocab,
            Output::Draw { .. } => rows,
            Output::Selected { tokens, .. } => rows * tokens.len(),
        }
    }

    /// Fills this output from `logits`, every row's `n_vocab` logits: for a backend that
    /// computes them all and chooses on the host.
    pub fn take_from(self, logits: &[f32], n_vocab: usize) -> Result<(), BackendError> {
        let rows = logits.len() / n_vocab.max(1);
        if self.len() != self.len_for(rows, n_vocab) || rows * n_vocab != logits.len() {
            return Err(BackendError::InvalidArgument(format!(
                "an output of {} values for {rows} rows of {n_vocab} logits",
                self.len()
            )));
        }
        match self {
            Output::Logits(out) => out.copy_from_slice(logits),
            Output::Draw { draws, tokens } => {
                draw_rows(logits, n_vocab, draws, tokens)?;
            }
            Output::Selected {
                tokens,
                logits: out,
            } => {
                let width = tokens.len();
                if width == 0 {
                    return Ok(());
                }
                for (out, row) in out
                    .chunks_exact_mut(width)
                    .zip(logits.chunks_exact(n_vocab))
                {
                    for (o, &t) in out.iter_mut().zip(tokens) {
                        *o = *row.get(t as usize).ok_or_else(|| {
                            BackendError::InvalidArgument(format!(
                                "token {t} is not below the vocabulary's {n_vocab}"
                            ))
                        })?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Each row's token (`tokens[r]`) drawn from its `n_vocab` logits of `logits` as `draws[r]`
/// says, its argmax where nothing can be drawn: [`Output::Draw`] on the host.
pub fn draw_rows(
    logits: &[f32],
    n_vocab: usize,
    draws: &[Draw],
    tokens: &mut [u32],
) -> Result<(), BackendError> {
    if draws.len() != tokens.len() || logits.len() != tokens.len() * n_vocab {
        return Err(BackendError::InvalidArgument(format!(
            "{} draws into {} tokens from {} logits of rows of {n_vocab}",
            draws.len(),
            tokens.len(),
            logits.len()
        )));
    }
    for ((token, row), d) in tokens
        .iter_mut()
        .zip(logits.chunks_exact(n_vocab))
        .zip(draws)
    {
        *token = draw(row, d).unwrap_or_else(|| argmax(row));
    }
    Ok(())
}

/// Index of the largest logit (the first one on ties), ignoring NaN; the last index when every
/// value is NaN. Every backend's greedy choice follows this rule.
pub fn argmax(logits: &[f32]) -> u32 {
    // The largest value first, with sixteen independent running maxima (they vectorize),
    // then its first position; NaN is never the largest (f32::max skips it).
    let (chunks, tail) = logits.as_chunks::<16>();
    let mut lanes = [f32::NEG_INFINITY; 16];
    for chunk in chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            *m = m.max(l);
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if let Some(i) = logits.iter().position(|&l| l == max) {
        return i as u32;
    }
    // Every value is NaN: the last one, as a scan that replaces a NaN best would pick.
    logits.len().saturating_sub(1) as u32
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn argmax_takes_the_first_largest_value_and_skips_nan() {
        assert_eq!(argmax(&[0.1, 3.0, -1.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        // Long rows, with ties, NaN and infinities, against a plain scan for the first
        // largest value.
        let mut state = 5u64;
        for len in [1, 15, 16, 17, 40, 1000] {
            for _ in 0..50 {
                let row: Vec<f32> = (0..len)
                    .map(|_| {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                        match state >> 60 {
                            0 => f32::NAN,
                            1 => f32::NEG_INFINITY,
                            2 => 7.0,
                            _ => ((state >> 40) % 64) as f32 / 8.0,
                        }
                    })
                    .collect();
                let max = row
                    .iter()
                    .copied()
                    .filter(|v| !v.is_nan())
                    .fold(f32::NEG_INFINITY, f32::max);
                let want = row.iter().position(|&v| v == max).unwrap_or(len - 1);
                assert_eq!(argmax(&row), want as u32, "{row:?}");
            }
        }
    }
}
