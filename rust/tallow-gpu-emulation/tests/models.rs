//! Whole models on the GPU backend with CUDA's and Metal's kernels, emulated: smollm2-135m
//! (Q4_1) and gemma3-270m (Q4_K_M: sliding windows, GELU, Q/K norms, a vocabulary of 262,144)
//! give the CPU backend's greedy tokens, and its logits on a prompt and then token by token
//! within what the CPU's products round: it rounds activations to 8-bit blocks where Metal
//! keeps them in f32 and CUDA rounds them its own way (the largest difference is 3-6% of the
//! largest logit; the wgpu backend with f32 products gives CUDA's logits within 2e-4 of it,
//! and the F32 reference models of every architecture give transformers' within 5e-3:
//! tests/architectures.rs).

use std::path::PathBuf;

use tallow_backend::Backend;
use tallow_backend_cpu::CpuBackend;
use tallow_gpu_emulation::{Api, Emulated};
use tallow_model::{argmax, Logits, Model, SingleSequence};

/// A model of the cache (`tallow pull NAME` puts it there; the test script pulls both).
fn path(name: &str, file: &str) -> PathBuf {
    let home = std::env::var_os("TALLOW_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/tallow"));
    home.join("models").join(name).join(file)
}

/// The logits of every prompt token, then of `steps` tokens chosen greedily, one at a time.
fn logits_and_tokens<B: Backend>(
    model: &Model<B>,
    prompt: &[u32],
    steps: usize,
) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut sequence = SingleSequence::new(model, prompt.len() + steps).unwrap();
    let n_vocab = model.config().n_vocab;
    let all = sequence.eval(model, prompt, Logits::All).unwrap();
    let mut rows: Vec<Vec<f32>> = all.chunks_exact(n_vocab).map(<[f32]>::to_vec).collect();
    let mut tokens = Vec::new();
    for _ in 0..steps {
        let token = argmax(rows.last().unwrap()) as u32;
        tokens.push(token);
        rows.push(sequence.eval(model, &[token], Logits::Last).unwrap());
    }
    (rows, tokens)
}

fn same_as_the_cpu(name: &str, file: &str) {
    let path = path(name, file);
    let cpu = Model::load(CpuBackend::default(), &path, Default::default())
        .unwrap_or_else(|e| panic!("{e} (run `tallow pull {name}` first)"));
    let tokenizer = cpu.tokenizer();
    let prompt = tokenizer.encode("The capital of France is", tokenizer.add_bos(), false);
    let (want, want_tokens) = logits_and_tokens(&cpu, &prompt, 2);
    for api in [Api::Cuda, Api::Metal] {
        let gpu = Model::load(Emulated::backend(api), &path, Default::default()).unwrap();
        let (got, got_tokens) = logits_and_tokens(&gpu, &prompt, 2);
        assert_eq!(got_tokens, want_tokens, "{name} ({api:?}): greedy tokens");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let spread = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= 0.1 * spread,
                "{name} ({api:?}) row {i}: {worst} of {spread}"
            );
        }
    }
}

#[test]
fn smollm2_gives_the_cpus_logits_and_tokens() {
    same_as_the_cpu("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn gemma3_gives_the_cpus_logits_and_tokens() {
    same_as_the_cpu("gemma3-270m", "gemma-3-270m-q4_k_m.gguf");
}
