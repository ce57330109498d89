//! The smallest complete use of the engine, the counterpart of llama.cpp's `llama-simple`:
//! load a GGUF model, encode a prompt, generate greedily and print the text as it comes. Its
//! peak resident memory is the engine's own (no interpreter), which is what
//! `benches/compare_llamacpp.py` sets beside `llama-simple`'s.
//!
//!     cargo run --release -p tallow-model --example simple -- MODEL.gguf [-n 32] [PROMPT]

use std::io::Write;
use std::process::ExitCode;

use tallow_backend_cpu::CpuBackend;
use tallow_model::{argmax, Logits, Model, SingleSequence};

struct Args {
    model: String,
    n_predict: usize,
    prompt: String,
}

fn parse_args() -> Result<Args, String> {
    let mut model = None;
    let mut n_predict = 32;
    let mut prompt = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-n" => {
                let value = args.next().ok_or("-n needs a number")?;
                n_predict = value
                    .parse()
                    .map_err(|_| format!("-n takes a number of tokens, not {value:?}"))?;
            }
            _ if model.is_none() => model = Some(arg),
            _ if prompt.is_none() => prompt = Some(arg),
            _ => return Err(format!("unexpected argument {arg:?}")),
        }
    }
    Ok(Args {
        model: model.ok_or("usage: simple MODEL.gguf [-n N] [PROMPT]")?,
        n_predict,
        prompt: prompt.unwrap_or_else(|| "Hello, my name is".to_string()),
    })
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let model = Model::load(CpuBackend::default(), &args.model, Default::default())?;
    let tokenizer = model.tokenizer();
    let prompt = tokenizer.encode(&args.prompt, tokenizer.add_bos(), false);
    if prompt.is_empty() {
        return Err("the prompt encodes to no tokens".into());
    }
    let mut sequence = SingleSequence::new(&model, prompt.len() + args.n_predict)?;
    let mut logits = sequence.eval(&model, &prompt, Logits::Last)?;
    let mut generated = Vec::with_capacity(args.n_predict);
    let mut printed = 0;
    let mut out = std::io::stdout().lock();
    write!(out, "{}", args.prompt)?;
    for _ in 0..args.n_predict {
        let token = argmax(&logits) as u32;
        if tokenizer.is_end_of_generation(token) {
            break;
        }
        generated.push(token);
        // Print only whole characters: a token may end inside a UTF-8 sequence.
        let text = tokenizer.decode(&generated)?;
        if !text.ends_with('\u{fffd}') {
            write!(out, "{}", &text[printed..])?;
            out.flush()?;
            printed = text.len();
        }
        logits = sequence.eval(&model, &[token], Logits::Last)?;
    }
    writeln!(out)?;
    Ok(())
}

fn main() -> ExitCode {
    let result = parse_args().map_err(Into::into).and_then(|args| run(&args));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("simple: {error}");
            ExitCode::FAILURE
        }
    }
}
