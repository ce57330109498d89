//! A model on whichever backend it was loaded on, behind one type: for callers that pick the
//! device at run time (the Python binding, [`crate::SingleSequence`]).

use std::any::Any;

use tallow_backend::{Backend, Batch, DeviceInfo, DeviceMemory};
use tallow_gguf::GgufFile;
use tallow_grammar::{Constraint, Structured};
use tallow_kv::{KvBudget, KvLayout, LayerGroups, PagedKvCache};
use tallow_tokenizer::Tokenizer;

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::forward::{Outputs, Scratch};
use crate::Model;

/// What [`Model`] offers, whatever its backend.
pub trait AnyModel: Send + Sync {
    fn config(&self) -> &ModelConfig;
    fn tokenizer(&self) -> &Tokenizer;
    fn gguf(&self) -> &GgufFile;
    /// See [`Model::constraint`].
    fn constraint(&self, structured: &Structured) -> Result<Constraint, ModelError>;
    /// See [`Model::check_constraint`].
    fn check_constraint(&self, structured: &Structured) -> Result<(), ModelError>;
    /// The device the model runs on.
    fn device(&self) -> DeviceInfo;
    /// See [`Backend::memory`].
    fn device_memory(&self) -> Option<DeviceMemory>;
    /// See [`Backend::read_rate`].
    fn read_rate(&self, bytes: usize) -> Result<f64, ModelError>;
    /// See [`Model::max_context`].
    fn max_context(&self) -> usize;
    /// See [`Model::kv_layout`].
    fn kv_layout(&self) -> KvLayout;
    /// See [`Model::kv_groups`].
    fn kv_groups(&self) -> &LayerGroups;
    /// See [`Model::new_kv_cache`]: the pages live on the model's device.
    fn new_kv_cache(&self, layout: KvLayout, budget: KvBudget) -> Result<PagedKvCache, ModelError>;
    /// See [`Model::forward_into`].
    fn forward_into(
        &self,
        cache: &mut PagedKvCache,
        batch: &Batch,
        scratch: &mut AnyScratch,
        out: Outputs<'_>,
    ) -> Result<(), ModelError>;
}

/// The [`Scratch`] of whichever backend last used it; keep one per KV cache.
#[derive(Default)]
pub struct AnyScratch(Option<Box<dyn Any + Send + Sync>>);

impl AnyScratch {
    pub fn new() -> Self {
        Self::default()
    }

    /// The scratch of backend `B`, made anew if it held another backend's.
    fn of<B: Backend>(&mut self) -> &mut Scratch<B> {
        if !self.0.as_ref().is_some_and(|s| s.is::<Scratch<B>>()) {
            self.0 = Some(Box::new(Scratch::<B>::new()));
        }
        self.0
            .as_mut()
            .and_then(|s| s.downcast_mut())
            .expect("just made for B")
    }
}

impl<B: Backend> AnyModel for Model<B> {
    fn config(&self) -> &ModelConfig {
        Model::config(self)
    }

    fn tokenizer(&self) -> &Tokenizer {
        Model::tokenizer(self)
    }

    fn gguf(&self) -> &GgufFile {
        Model::gguf(self)
    }

    fn constraint(&self, structured: &Structured) -> Result<Constraint, ModelError> {
        Model::constraint(self, structured)
    }

    fn check_constraint(&self, structured: &Structured) -> Result<(), ModelError> {
        Model::check_constraint(self, structured)
    }

    fn device(&self) -> DeviceInfo {
        self.backend().device()
    }

    fn device_memory(&self) -> Option<DeviceMemory> {
        self.backend().memory()
    }

    fn read_rate(&self, bytes: usize) -> Result<f64, ModelError> {
        Ok(self.backend().read_rate(bytes)?)
    }

    fn max_context(&self) -> usize {
        Model::max_context(self)
    }

    fn kv_layout(&self) -> KvLayout {
        Model::kv_layout(self)
    }

    fn kv_groups(&self) -> &LayerGroups {
        Model::kv_groups(self)
    }

    fn new_kv_cache(&self, layout: KvLayout, budget: KvBudget) -> Result<PagedKvCache, ModelError> {
        Model::new_kv_cache(self, layout, budget)
    }

    fn forward_into(
        &self,
        cache: &mut PagedKvCache,
        batch: &Batch,
        scratch: &mut AnyScratch,
        out: Outputs<'_>,
    ) -> Result<(), ModelError> {
        Model::forward_into(self, cache, batch, scratch.of::<B>(), out)
    }
}
