//! Metal's kernels (kernels-metal/*.metal) as one C++ translation unit for the emulator.
//!
//! Three steps that metal_emulation.h cannot take:
//! 1. The sources are preprocessed together as Metal's compiler sees them (`__METAL_VERSION__`
//!    defined), so that kernels written by a macro, one per weight format, are seen whole.
//! 2. `threadgroup` declares an array or variable shared by the threadgroup (a static here:
//!    one threadgroup runs at a time) or qualifies a pointer or reference to such memory (a
//!    plain pointer here): which one is told by what follows the word up to the end of the
//!    declarator, a `*` or `&` making it the second.
//! 3. Each kernel (`kernel void name(...)`) is registered with what each parameter receives:
//!    `[[buffer(i)]]` the launch's i-th argument (the host binds argument i at index i, so the
//!    indices must count up from 0 in order), or a built-in input named by its attribute.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Writes the translation unit of every Metal kernel of `dir` to `out` and returns its path.
pub fn unit(dir: &Path, shared: &Path, out: &Path) -> PathBuf {
    let mut sources: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("kernels-metal/")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    sources.sort();
    println!("cargo:rerun-if-changed={}", dir.display());
    for source in &sources {
        println!("cargo:rerun-if-changed={}", source.display());
    }
    let emulation = dir.join("emulation");
    for header in ["metal_emulation.h", "metal_stdlib"] {
        println!(
            "cargo:rerun-if-changed={}",
            emulation.join(header).display()
        );
    }
    let mut all = String::new();
    for source in sources
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "metal"))
    {
        writeln!(all, "#include \"{}\"", source.display()).unwrap();
    }
    let all_path = out.join("all.metal.cpp");
    std::fs::write(&all_path, all).expect("the list of Metal sources is written");
    let expanded = cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(dir)
        .include(shared)
        .include(&emulation)
        .define("__METAL_VERSION__", "310")
        .define("TALLOW_EMULATION", "1")
        .file(&all_path)
        .expand();
    let text = shared_memory(&String::from_utf8(expanded).expect("preprocessed UTF-8"));
    let kernels = signatures(&text);
    let mut unit = String::from("#include \"metal_emulation.h\"\n\nnamespace tallow_metal {\n");
    unit.push_str(&text);
    unit.push_str(
        "\n}  // namespace tallow_metal\n\n#line 1 \"the Metal kernels' registrations\"\n",
    );
    unit.push_str("using tallow_emu::Input;\n\n");
    for k in &kernels {
        let inputs: Vec<String> = k.inputs.iter().map(|i| format!("Input::{i}")).collect();
        writeln!(
            unit,
            "static const Input inputs_{name}[] = {{{inputs}}};\n\
             static void call_{name}(void*, void** params) {{\n    \
                 tallow_emu::call_metal(tallow_metal::{name}, params, inputs_{name},\n        \
                     std::make_index_sequence<{n}>{{}});\n}}",
            name = k.name,
            inputs = inputs.join(", "),
            n = k.inputs.len(),
        )
        .unwrap();
    }
    unit.push_str(
        "\n// Registers every Metal kernel (Rust calls it once, before the first launch).\n",
    );
    unit.push_str("extern \"C\" void tallow_emu_register_metal() {\n");
    for k in &kernels {
        writeln!(
            unit,
            "    tallow_emu::register_metal(\"{name}\", tallow_metal::{name}, call_{name}, inputs_{name});",
            name = k.name
        )
        .unwrap();
    }
    unit.push_str("}\n");
    let path = out.join("metal.cpp");
    std::fs::write(&path, unit).expect("the Metal translation unit is written");
    path
}

/// Whether `c` may continue an identifier.
fn word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The byte offsets of each whole word `word` in `text`.
fn words(text: &str, word: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    text.match_indices(word)
        .map(|(at, _)| at)
        .filter(|&at| {
            let before = at == 0 || !word_char(bytes[at - 1]);
            let end = at + word.len();
            before && (end == bytes.len() || !word_char(bytes[end]))
        })
        .collect()
}

/// `text` with each `threadgroup` made `static` where it declares shared memory, and removed
/// where it qualifies a pointer or reference.
fn shared_memory(text: &str) -> String {
    let mut out = text.to_string();
    for at in words(text, "threadgroup").into_iter().rev() {
        let rest = &text[at + "threadgroup".len()..];
        let end = rest
            .find([';', ',', ')', '=', '[', '{'])
            .unwrap_or(rest.len());
        let declarator = &rest[..end];
        let shared = !declarator.contains(['*', '&'])
            && matches!(rest.as_bytes().get(end), Some(b';' | b'['));
        out.replace_range(
            at..at + "threadgroup".len(),
            if shared { "static     " } else { "           " },
        );
    }
    out
}

/// A kernel, and what each of its parameters receives (tallow_emu::Input's names).
struct Kernel {
    name: String,
    inputs: Vec<&'static str>,
}

/// Every `kernel void name(...)` of `text`.
fn signatures(text: &str) -> Vec<Kernel> {
    let mut kernels = Vec::new();
    for at in words(text, "kernel") {
        let rest = text[at + "kernel".len()..].trim_start();
        let Some(rest) = rest.strip_prefix("void") else {
            continue;
        };
        let rest = rest.trim_start();
        let name_len = rest.bytes().take_while(|&c| word_char(c)).count();
        let name = &rest[..name_len];
        let open = rest[name_len..].trim_start();
        assert!(open.starts_with('('), "kernel {name}: no parameter list");
        let params = top_level(&open[1..], name);
        let mut buffers = 0;
        let inputs = params
            .iter()
            .map(|p| {
                let input = input(p, buffers).unwrap_or_else(|e| panic!("kernel {name}: {e}"));
                buffers += usize::from(input == "Buffer");
                input
            })
            .collect();
        kernels.push(Kernel {
            name: name.to_string(),
            inputs,
        });
    }
    kernels.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = kernels.windows(2).find(|w| w[0].name == w[1].name) {
        panic!("two kernels named {}", w[0].name);
    }
    kernels
}

/// The parameters of the list that starts after its `(`, split at the commas outside
/// brackets, up to its `)`.
fn top_level(text: &str, name: &str) -> Vec<String> {
    let (mut depth, mut start, mut params) = (0i32, 0, Vec::new());
    for (i, c) in text.char_indices() {
        match c {
            '(' | '[' | '<' => depth += 1,
            ')' if depth == 0 => {
                let last = text[start..i].trim();
                if !last.is_empty() {
                    params.push(last.to_string());
                }
                return params;
            }
            ')' | ']' | '>' => depth -= 1,
            ',' if depth == 0 => {
                params.push(text[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    panic!("kernel {name}: an unclosed parameter list")
}

/// What parameter `param` receives, `buffers` buffers having come before it.
fn input(param: &str, buffers: usize) -> Result<&'static str, String> {
    let open = param
        .find("[[")
        .ok_or(format!("`{param}` has no attribute"))?;
    let close = param[open..]
        .find("]]")
        .ok_or(format!("`{param}`: an unclosed attribute"))?;
    let attribute = param[open + 2..open + close].trim();
    if let Some(index) = attribute
        .strip_prefix("buffer(")
        .and_then(|a| a.strip_suffix(')'))
    {
        let index: usize =
            (index.trim().parse()).map_err(|_| format!("`{param}`: buffer index"))?;
        if index != buffers {
            return Err(format!(
                "`{param}` is buffer {index} where {buffers} comes next"
            ));
        }
        return Ok("Buffer");
    }
    Ok(match attribute {
        "threadgroup_position_in_grid" => "ThreadgroupPositionInGrid",
        "thread_position_in_threadgroup" => "ThreadPositionInThreadgroup",
        "threads_per_threadgroup" => "ThreadsPerThreadgroup",
        "threadgroups_per_grid" => "ThreadgroupsPerGrid",
        "thread_position_in_grid" => "ThreadPositionInGrid",
        "thread_index_in_threadgroup" => "ThreadIndexInThreadgroup",
        "thread_index_in_simdgroup" => "ThreadIndexInSimdgroup",
        "simdgroup_index_in_threadgroup" => "SimdgroupIndexInThreadgroup",
        other => return Err(format!("`{param}`: the attribute {other} is not emulated")),
    })
}
