//! The seam between a model and the device it runs on: the [`Backend`] and [`Step`] traits,
//! and what their operations take (a ragged [`Batch`], [`Rope`], [`Scores`], ...). The forward
//! pass (tallow-model) is written once against them; each device (the CPU, wgpu) implements
//! them in a crate of its own.

mod backend;
mod batch;
mod capabilities;
mod draw;
mod error;
mod ops;
mod output;
mod plan;
mod rope;

pub use backend::{
    Backend, DeviceInfo, DeviceMemory, Experts, MatrixSpec, MatrixUse, Step, StepInput,
};
pub use batch::{Batch, KvCopy, Logits, SeqChunk};
pub use capabilities::Capabilities;
pub use draw::{candidates, draw, noise, Draw};
pub use error::BackendError;
pub use ops::{Activation, Heads, Moe, Routing, Scores};
pub use output::{argmax, draw_rows, Output, OutputRows};
pub use plan::{GroupPlan, KvSlot, StepPlan};
pub use rope::{Rope, RopeParams, RopeScaling, RopeStyle};
