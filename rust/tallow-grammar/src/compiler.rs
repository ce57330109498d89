//! Compiling a request's [`Structured`] output against one model's vocabulary.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use llguidance::api::ParserLimits;
use llguidance::{Matcher, ParserFactory};
use tallow_tokenizer::Tokenizer;

use crate::constraint::Constraint;
use crate::error::{without_state, GrammarError};
use crate::structured::Structured;
use crate::vocabulary::token_env;

/// Compiles constraints for one model; build it once (it indexes the whole vocabulary).
pub struct GrammarCompiler {
    factory: ParserFactory,
    /// The tokens that end an output.
    eog: Vec<u32>,
    /// The constraints compiled last, unstarted: a server sees the same schema again and
    /// again, and a copy costs far less than compiling it anew.
    recent: Mutex<Recent>,
}

/// Compiled constraints by [`Structured::key`], the oldest first out.
#[derive(Default)]
struct Recent {
    by_key: HashMap<String, Constraint>,
    order: VecDeque<String>,
}

/// Constraints kept compiled.
const RECENT: usize = 32;

impl GrammarCompiler {
    /// A compiler for `tokenizer`'s vocabulary, with limits on the size of a grammar and the
    /// work of building it and of each mask, so that no grammar can hang a request (or the
    /// step it is in).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Self, GrammarError> {
        let compile_error = |message: String| GrammarError::Compile {
            kind: "vocabulary",
            message,
        };
        let env = token_env(tokenizer).map_err(compile_error)?;
        let eog = env.tok_trie().eos_tokens().to_vec();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| compile_error(e.to_string()))?;
        factory.quiet();
        // llguidance's limits bound the work of building a grammar and of each mask; fewer
        // parser items per token than its default stops an ambiguous grammar (whose items
        // grow with every token) while each mask still takes milliseconds.
        *factory.limits_mut() = ParserLimits {
            max_items_in_row: 500,
            ..ParserLimits::default()
        };
        Ok(GrammarCompiler {
            factory,
            eog,
            recent: Mutex::default(),
        })
    }

    /// The constraint that `structured` puts on a request's output, from its first token.
    pub fn compile(&self, structured: &Structured) -> Result<Constraint, GrammarError> {
        let key = structured.key();
        if let Some(compiled) = self.recent().by_key.get(&key) {
            return Ok(compiled.clone());
        }
        let compiled = self.compile_anew(structured)?;
        let mut recent = self.recent();
        if recent
            .by_key
            .insert(key.clone(), compiled.clone())
            .is_none()
        {
            recent.order.push_back(key);
            if recent.order.len() > RECENT {
                let oldest = recent.order.pop_front().expect("over the bound");
                recent.by_key.remove(&oldest);
            }
        }
        Ok(compiled)
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        // The map stays whole whatever panicked while it was held.
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn compile_anew(&self, structured: &Structured) -> Result<Constraint, GrammarError> {
        let error = |message: String| GrammarError::Compile {
            kind: structured.kind(),
            message: without_state(&message),
        };
        let grammar = structured.grammar().map_err(error)?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| error(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher.get_error() {
            return Err(error(message));
        }
        Ok(Constraint::new(matcher, self.eog.clone()))
    }
}
