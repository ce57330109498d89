// THROWAWAY verification harness (to be deleted): dequantize / quantize files for Python.
use std::io::Read;
use tallow_quant::{dequantize, quantize_row, GgmlType};

fn ty(name: &str) -> Option<GgmlType> {
    GgmlType::ALL.into_iter().find(|t| t.name() == name)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut input = Vec::new();
    std::fs::File::open(&args[3])
        .unwrap()
        .read_to_end(&mut input)
        .unwrap();
    let Some(t) = ty(&args[2]) else {
        eprintln!("unknown type");
        std::process::exit(2)
    };
    match args[1].as_str() {
        "deq" => {
            let n = input.len() / t.block_bytes() * t.block_len();
            let mut out = vec![0f32; n];
            if let Err(e) = dequantize(t, &input, &mut out) {
                eprintln!("{e}");
                std::process::exit(2)
            }
            let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(&args[4], bytes).unwrap();
        }
        "quant" => {
            let x: Vec<f32> = input
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let mut out = vec![0u8; x.len() / t.block_len() * t.block_bytes()];
            quantize_row(t, &x, &mut out).unwrap();
            std::fs::write(&args[4], out).unwrap();
        }
        _ => panic!(),
    }
}
