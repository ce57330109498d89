//! Compiling a request's [`Structured`] output against one model's vocabulary.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use llguidance::api::ParserLimits;
use llguidance::{Matcher, ParserFactory};
use tallow_tokenizer::Tokenizer;

use crate::constraint::Constraint;
use crate::error::{without_state, GrammarError, BEYOND_THE_COMPILER};
use crate::limits::{self, COMPILE_STACK};
use crate::structured::{source_bytes_of, Structured};
use crate::vocabulary::token_env;

/// Compiles constraints for one model; build it once (it indexes the whole vocabulary).
pub struct GrammarCompiler {
    factory: ParserFactory,
    /// The tokens that end an output.
    eog: Vec<u32>,
    /// The constraints compiled last, unstarted, or the errors they gave: a server sees the
    /// same schema again and again, and a copy costs far less than compiling it anew (a client
    /// that sends a constraint that fails slowly, again and again, costs one compilation).
    recent: Mutex<Recent>,
    /// Held while a constraint compiles: one at a time, so that compiling takes at most one
    /// core from the steps of the requests that run meanwhile.
    compiling: Mutex<()>,
}

/// Compiled constraints (or their errors) by [`Structured::key`], the oldest first out.
#[derive(Default)]
struct Recent {
    by_key: HashMap<String, Result<Constraint, GrammarError>>,
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
            compiling: Mutex::new(()),
        })
    }

    /// The constraint that `structured` puts on a request's output, from its first token: its
    /// first mask is computed here, so that a constraint whose lexer or parser goes beyond
    /// the limits on their work at the start fails now rather than in a step. Sources beyond
    /// the limits of [`crate::limits`] are refused before they are compiled.
    pub fn compile(&self, structured: &Structured) -> Result<Constraint, GrammarError> {
        let key = structured.key();
        if let Some(compiled) = self.recent().by_key.get(&key) {
            return compiled.clone();
        }
        if let Some(reason) = limits::exceeded(structured, source_bytes_of(&key)) {
            return Err(GrammarError::Compile {
                kind: structured.kind(),
                message: reason,
            });
        }
        let _one_at_a_time = self.compiling.lock().unwrap_or_else(|e| e.into_inner());
        // Compiled meanwhile for another request?
        if let Some(compiled) = self.recent().by_key.get(&key) {
            return compiled.clone();
        }
        let compiled = self.compile_on_own_stack(structured);
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
        compiled
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        // The map stays whole whatever panicked while it was held.
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Self::compile_anew`] on a thread with [`COMPILE_STACK`] bytes of stack (llguidance
    /// recurses through the definitions of a grammar), at the lowest priority: the engine's
    /// threads, which spin while they wait for each other, keep their cores while a large
    /// grammar compiles.
    fn compile_on_own_stack(&self, structured: &Structured) -> Result<Constraint, GrammarError> {
        std::thread::scope(|scope| {
            let compiler = std::thread::Builder::new()
                .name("tallow-grammar".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, || {
                    yield_to_other_threads();
                    self.compile_anew(structured)
                })
                .map_err(|e| GrammarError::Compile {
                    kind: structured.kind(),
                    message: format!("cannot start the compiler's thread: {e}"),
                })?;
            compiler.join().unwrap_or_else(|_| {
                Err(GrammarError::Compile {
                    kind: structured.kind(),
                    message: BEYOND_THE_COMPILER.into(),
                })
            })
        })
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
        Constraint::start(matcher, self.eog.clone()).map_err(error)
    }
}

/// Lowers the calling thread's priority to the least (nice 19) where the system has a
/// priority per thread (Linux); a no-op elsewhere, or where it is not allowed.
fn yield_to_other_threads() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain system calls on the calling thread's id.
    unsafe {
        let thread = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, thread as libc::id_t, 19);
    }
}
