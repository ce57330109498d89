//! Every architecture of the shared reference models (F32 files: llama3's frequency scaling,
//! qwen2's biases, qwen3's and gemma3's Q/K norms, phi3's fused tensors, gemma2's soft caps and
//! windows, gemma3's local and global layers, and the four mixtures of experts) on the GPU
//! backend with CUDA's and Metal's kernels, emulated: transformers' logits at each of the 32
//! prompt positions, within what the f16 KV pages round (the bound the CPU and wgpu backends
//! meet too).

use std::path::PathBuf;

use tallow_backend::Backend;
use tallow_backend_gpu::{GpuBackend, Replayed};
use tallow_gpu_emulation::{Api, Emulated};
use tallow_model::{Batch, KvBudget, Logits, Model, SingleSequence};

const ARCHITECTURES: [&str; 7] = [
    "llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3",
];

/// transformers' logits within this on the F32 files, through f16 KV pages.
const TOLERANCE: f32 = 5e-3;

/// `shared/reference/arch` (`$TALLOW_SHARED_DIR/reference/arch`).
fn arch_dir() -> PathBuf {
    let shared = std::env::var_os("TALLOW_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    shared.join("reference/arch")
}

/// The values of a little-endian 4-byte `.npy` array (`<f4` or `<i4`), row-major.
fn npy<T>(path: &PathBuf, descr: &str, from: fn([u8; 4]) -> T) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{}", path.display());
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&bytes[start..start + header_len]).unwrap();
    assert!(header.contains(&format!("'descr': '{descr}'")), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let data = &bytes[start + header_len..];
    data.as_chunks::<4>().0.iter().map(|b| from(*b)).collect()
}

/// The mixture-of-experts architectures (qwen3moe, Mixtral, qwen2moe's shared expert, gpt-oss's
/// sinks, biases and clamped SwiGLU), each token routed to 2 of 8 experts.
const MIXTURES: [&str; 4] = ["qwen3moe", "mixtral", "qwen2moe", "gpt-oss"];

/// The median over positions of the largest difference from transformers' logits within
/// TOLERANCE, and the largest within this: f16 KV pages may move a token's router logits
/// across a near tie (qwen2moe's gap is 0.0005), and that token then runs another expert.
const ROUTED_TOLERANCE: f32 = 0.5;

/// Both APIs' kernels.
const APIS: [Api; 2] = [Api::Cuda, Api::Metal];

/// The largest difference from transformers' logits at each of the prompt's positions, on the
/// emulated device with `api`'s kernels.
fn differences(api: Api, arch: &str) -> Vec<f32> {
    let dir = arch_dir();
    let prompt: Vec<u32> = npy(&dir.join("prompt_ids.npy"), "<i4", i32::from_le_bytes)
        .into_iter()
        .map(|t| t as u32)
        .collect();
    let model = Model::load(
        Emulated::backend(api),
        dir.join(arch).join(format!("{arch}-f32.gguf")),
        Default::default(),
    )
    .unwrap_or_else(|e| panic!("{arch}: {e}"));
    let want = npy(
        &dir.join(arch).join("ref_logits.npy"),
        "<f4",
        f32::from_le_bytes,
    );
    let mut sequence = SingleSequence::new(&model, prompt.len()).unwrap();
    let got = sequence.eval(&model, &prompt, Logits::All).unwrap();
    assert_eq!(got.len(), want.len(), "{arch}");
    let vocab = want.len() / prompt.len();
    (got.chunks_exact(vocab).zip(want.chunks_exact(vocab)))
        .map(|(got, want)| (got.iter().zip(want)).fold(0f32, |m, (a, b)| m.max((a - b).abs())))
        .collect()
}

#[test]
fn every_architecture_gives_transformers_logits() {
    for (api, arch) in APIS
        .into_iter()
        .flat_map(|a| ARCHITECTURES.map(|arch| (a, arch)))
    {
        let worst = differences(api, arch).into_iter().fold(0f32, f32::max);
        assert!(
            worst <= TOLERANCE,
            "{arch} ({api:?}): logits {worst} from transformers'"
        );
    }
}

#[test]
fn every_mixture_of_experts_gives_transformers_logits() {
    for (api, arch) in APIS
        .into_iter()
        .flat_map(|a| MIXTURES.map(|arch| (a, arch)))
    {
        let mut by_position = differences(api, arch);
        by_position.sort_by(f32::total_cmp);
        let median = by_position[by_position.len() / 2];
        let worst = by_position[by_position.len() - 1];
        assert!(
            median <= TOLERANCE && worst <= ROUTED_TOLERANCE,
            "{arch} ({api:?}): logits {median} (median over positions), {worst} (largest) \
             from transformers'"
        );
    }
}

/// A step's buffers go back to the device's spares and the next step takes them: a decode
/// step after the first allocates nothing (a GPU's free waits for the whole device), in a
/// mixture of experts too (its tables of experts' offsets are made once), in F32 and in
/// the integer products' Q8_0. And it copies to the device once, its plan (a copy from the
/// host is a call to the driver that waits for the device's queue).
#[test]
fn steps_reuse_the_buffers_of_earlier_steps() {
    let dir = arch_dir();
    let files = [
        "llama3/llama3-f32.gguf",
        "llama3/llama3-q8_0.gguf",
        "qwen3moe/qwen3moe-q8_0.gguf",
    ];
    for (api, file) in APIS.into_iter().flat_map(|a| files.map(|file| (a, file))) {
        let backend = Emulated::backend(api);
        let model = Model::load(backend.clone(), dir.join(file), Default::default()).unwrap();
        let mut sequence = SingleSequence::new(&model, 16).unwrap();
        sequence.eval(&model, &[1, 2, 3, 4], Logits::Last).unwrap();
        sequence.eval(&model, &[5], Logits::Last).unwrap();
        let made = backend.gpu().allocations_made();
        let writes = backend.gpu().writes_made();
        for token in 6..9 {
            sequence.eval(&model, &[token], Logits::Last).unwrap();
        }
        assert_eq!(backend.gpu().allocations_made(), made, "{file} ({api:?})");
        assert_eq!(backend.gpu().writes_made(), writes + 3, "{file} ({api:?})");
    }
}

/// Metal's devices share the host's memory: the weights are read where the file is mapped,
/// so loading a model copies none of its matrices to the device, where CUDA's copies each.
#[test]
fn metal_reads_the_weights_where_the_file_is_mapped() {
    let path = arch_dir().join("llama3/llama3-f32.gguf");
    let file_bytes = std::fs::metadata(&path).unwrap().len();
    let in_use = |api| {
        let backend = Emulated::backend(api);
        let model = Model::load(backend.clone(), &path, Default::default()).unwrap();
        let mut sequence = SingleSequence::new(&model, 8).unwrap();
        let logits = sequence.eval(&model, &[1, 2, 3], Logits::Last).unwrap();
        assert!(logits.iter().all(|v| v.is_finite()), "{api:?}");
        backend.memory().unwrap().in_use
    };
    let (cuda, metal) = (in_use(Api::Cuda), in_use(Api::Metal));
    assert!(
        cuda > file_bytes / 2,
        "cuda: {cuda} bytes for a file of {file_bytes}"
    );
    assert!(
        metal < file_bytes / 8,
        "metal: {metal} bytes for a file of {file_bytes}"
    );
}

/// CUDA's decode steps run as graphs (recorded the second time a step's kernels come, then
/// replayed with the launches that changed updated) give the logits the same launches give
/// one by one, bit for bit: in F32 and Q8_0, with gemma2's windows and soft caps, and in a
/// mixture of experts.
#[test]
fn decode_steps_replayed_as_graphs_give_the_same_logits() {
    let dir = arch_dir();
    let files = [
        "llama3/llama3-f32.gguf",
        "llama3/llama3-q8_0.gguf",
        "gemma2/gemma2-f32.gguf",
        "qwen3moe/qwen3moe-q8_0.gguf",
    ];
    let api = Api::Cuda;
    for file in files {
        let path = dir.join(file);
        let replaying = Emulated::replaying_backend(api);
        let want = decode(Emulated::backend(api), &path);
        let got = decode(replaying.clone(), &path);
        assert!(want.iter().all(|v| v.is_finite()), "{file}");
        assert!(
            want.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{file}: replayed graphs' logits differ"
        );
        let counts = replaying.gpu().counts();
        assert!(
            counts.recorded >= 1 && counts.replayed >= 4 && counts.updated >= 1,
            "{file}: {counts:?}"
        );
    }
}

/// A device that cannot record a step's graph (short of memory) launches its kernels one by
/// one instead, with the same logits.
#[test]
fn runs_the_device_cannot_record_are_launched_one_by_one() {
    let path = arch_dir().join("llama3/llama3-q8_0.gguf");
    let emulated = Emulated::new(Api::Cuda).with_graphs_of_at_most(8);
    let replaying = GpuBackend::new(Replayed::new(emulated));
    let want = decode(Emulated::backend(Api::Cuda), &path);
    let got = decode(replaying.clone(), &path);
    assert!(want
        .iter()
        .zip(&got)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    let counts = replaying.gpu().counts();
    assert!(
        counts.recorded == 0 && counts.replayed == 0 && counts.launched >= 7,
        "{counts:?}"
    );
}

/// Steps whose branches copy their parent's positions layer by layer (a fork taking two
/// tokens beside its parent's one, its first position inside a page) run as one graph a step
/// once recorded, the copies kept in it as kernels (a run cut at each copy was a run a layer),
/// with the logits of launches one by one.
#[test]
fn steps_with_branches_stay_one_run() {
    let path = arch_dir().join("llama3/llama3-q8_0.gguf");
    let replaying = Emulated::replaying_backend(Api::Cuda);
    let want = decode_with_branches(Emulated::backend(Api::Cuda), &path, |_| ());
    let mut runs = Vec::new();
    let got = decode_with_branches(replaying.clone(), &path, |()| {
        let c = replaying.gpu().counts();
        runs.push(c.launched + c.recorded + c.replayed);
    });
    assert!(want.iter().all(|v| v.is_finite()));
    assert!(want
        .iter()
        .zip(&got)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // A step is two runs: the copy-on-write copies of the page the branch shares with its
    // parent (made before the step's plan is uploaded), then the step's forward.
    let per_step: Vec<u64> = runs.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        per_step.iter().all(|&n| n == 2),
        "runs per step: {per_step:?}"
    );
    let counts = replaying.gpu().counts();
    assert!(counts.replayed >= 3, "{counts:?}");
}

/// A prompt of 5 tokens, then 5 steps each taking one token for the sequence and two for a
/// branch forked from it in the step (freed after it); `after_step` is called after each
/// step. The logits of every row.
fn decode_with_branches<B: Backend>(
    backend: B,
    path: &PathBuf,
    mut after_step: impl FnMut(()),
) -> Vec<f32> {
    let model = Model::load(backend, path, Default::default()).unwrap();
    let layout = model.kv_layout();
    assert!(layout.page_size > 7, "the branches start inside a page");
    let mut cache = model.new_kv_cache(layout, KvBudget::Pages(64)).unwrap();
    let seq = cache.create();
    cache.append_slots(seq, 5).unwrap();
    let mut prompt = Batch::new();
    prompt.push(seq, &[1, 2, 3, 4, 5], Logits::Last);
    let mut logits = model.forward(&mut cache, &prompt).unwrap();
    for token in 6..11 {
        cache.append_slots(seq, 1).unwrap();
        let branch = cache.fork(seq).unwrap();
        cache.append_slots(branch, 2).unwrap();
        let mut step = Batch::new();
        step.push(seq, &[token], Logits::Last).push_branch(
            branch,
            seq,
            &[token + 10, token + 20],
            Logits::All,
        );
        logits.extend(model.forward(&mut cache, &step).unwrap());
        cache.free(branch).unwrap();
        after_step(());
    }
    logits
}

/// The last logits of a prompt of 4 tokens and of each of 6 tokens after it, one a step.
fn decode<B: Backend>(backend: B, path: &PathBuf) -> Vec<f32> {
    let model = Model::load(backend, path, Default::default()).unwrap();
    let mut sequence = SingleSequence::new(&model, 16).unwrap();
    let mut logits = sequence.eval(&model, &[1, 2, 3, 4], Logits::Last).unwrap();
    for token in 5..11 {
        logits.extend(sequence.eval(&model, &[token], Logits::Last).unwrap());
    }
    logits
}
