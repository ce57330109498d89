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
    by_key: HashMap<String, Arc<Compiled>>,
    order: VecDeque<String>,
}

/// A constraint as compiled, unstarted, or why it could not be.
type Compiled = Result<Constraint, GrammarError>;

/// Constraints kept compiled.
const RECENT: usize = 32;

impl GrammarCompiler {
    /// A compiler for `tokenizer`'s vocabulary, with limits on the size of a grammar and the
    /// work of building it and of each mask, so that no grammar can hang a request (or the
    /// step it is in). Indexing the vocabulary takes a core for a fraction of a second: it
    /// runs where compilations do, off the engine's cores.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Self, GrammarError> {
        on_compiler_thread("vocabulary", || Self::index(tokenizer))?
    }

    fn index(tokenizer: Arc<Tokenizer>) -> Result<Self, GrammarError> {
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
        copy_of(structured, &self.compiled(structured))
    }

    /// Whether [`Self::compile`] gives `structured` a constraint, without the copy it would
    /// make for a request: the constraint is compiled (and kept) if it is not a recent one.
    pub fn check(&self, structured: &Structured) -> Result<(), GrammarError> {
        match self.compiled(structured).as_ref() {
            Ok(_) => Ok(()),
            Err(e) => Err(e.clone()),
        }
    }

    /// `structured` compiled (or why it cannot be), from the recent ones or anew.
    fn compiled(&self, structured: &Structured) -> Arc<Compiled> {
        let key = structured.key();
        if let Some(compiled) = self.recent_one(&key) {
            return compiled;
        }
        if let Some(reason) = limits::exceeded(structured, source_bytes_of(&key)) {
            return Arc::new(Err(GrammarError::Compile {
                kind: structured.kind(),
                message: reason,
            }));
        }
        let _one_at_a_time = self.compiling.lock().unwrap_or_else(|e| e.into_inner());
        // Compiled meanwhile for another request?
        if let Some(compiled) = self.recent_one(&key) {
            return compiled;
        }
        let compiled = Arc::new(
            on_compiler_thread(structured.kind(), || self.compile_anew(structured)).and_then(|c| c),
        );
        let mut recent = self.recent();
        if recent
            .by_key
            .insert(key.clone(), Arc::clone(&compiled))
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

    /// The constraint (or error) compiled for `key`, if it is one of the recent ones.
    fn recent_one(&self, key: &str) -> Option<Arc<Compiled>> {
        self.recent().by_key.get(key).cloned()
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
        Constraint::start(matcher, self.eog.clone()).map_err(error)
    }
}

/// A request's own copy of a compiled constraint (or its error). A copy of a large one
/// takes as long as a step or more (its lexer's states are copied whole), so it is made
/// where a compilation is: off the engine's cores.
fn copy_of(structured: &Structured, compiled: &Compiled) -> Compiled {
    if compiled.is_err() {
        return compiled.clone();
    }
    on_compiler_thread(structured.kind(), || compiled.clone())?
}

/// `work` on a thread with [`COMPILE_STACK`] bytes of stack (llguidance recurses through
/// the definitions of a grammar), at the lowest priority (see
/// [`yield_to_other_threads`]): the engine's threads, which spin
/// while they wait for each other, keep their cores while a large grammar compiles or is
/// copied. A panic in `work` is an error of the compiler, about a source of `kind`.
fn on_compiler_thread<T: Send>(
    kind: &'static str,
    work: impl FnOnce() -> T + Send,
) -> Result<T, GrammarError> {
    let error = |message: String| GrammarError::Compile { kind, message };
    std::thread::scope(|scope| {
        let compiler = std::thread::Builder::new()
            .name("tallow-grammar".into())
            .stack_size(COMPILE_STACK)
            .spawn_scoped(scope, || {
                yield_to_other_threads();
                work()
            })
            .map_err(|e| error(format!("cannot start the compiler's thread: {e}")))?;
        compiler
            .join()
            .map_err(|_| error(BEYOND_THE_COMPILER.into()))
    })
}

/// Puts the calling thread in the idle scheduling class where the system has one per thread
/// (Linux): it runs only on a core that nothing else wants, so even the engine's spinning
/// threads are not preempted by it (a nice 19 thread still takes slices from them). Where
/// that is not allowed, the lowest priority (nice 19); a no-op elsewhere.
fn yield_to_other_threads() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain system calls on the calling thread (0: the caller).
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
        }
    }
}
