//! The kernels' sources, and the one library text the device compiles from them.

/// Every source of `kernels-metal/` and the headers it shares with CUDA's kernels
/// (`kernels-gpu/`: the weight formats, their codebooks, the dialects' spellings), as (name,
/// text), headers first in the order they include each other.
pub const SOURCES: [(&str, &str); 13] = [
    ("dialect.h", include_str!("../../../kernels-gpu/dialect.h")),
    ("grids.h", include_str!("../../../kernels-gpu/grids.h")),
    ("formats.h", include_str!("../../../kernels-gpu/formats.h")),
    ("tallow.h", include_str!("../../../kernels-metal/tallow.h")),
    (
        "attention.metal",
        include_str!("../../../kernels-metal/attention.metal"),
    ),
    (
        "embed.metal",
        include_str!("../../../kernels-metal/embed.metal"),
    ),
    (
        "experts.metal",
        include_str!("../../../kernels-metal/experts.metal"),
    ),
    ("kv.metal", include_str!("../../../kernels-metal/kv.metal")),
    (
        "logits.metal",
        include_str!("../../../kernels-metal/logits.metal"),
    ),
    (
        "matmul.metal",
        include_str!("../../../kernels-metal/matmul.metal"),
    ),
    (
        "rope.metal",
        include_str!("../../../kernels-metal/rope.metal"),
    ),
    (
        "rows.metal",
        include_str!("../../../kernels-metal/rows.metal"),
    ),
    (
        "tiles.metal",
        include_str!("../../../kernels-metal/tiles.metal"),
    ),
];

/// The text of the one library the device compiles: every source of [`SOURCES`] in order,
/// each `#include "..."` of one of them dropped (the header is already above it; a library
/// compiled from a string has no directory to include from) and each `#pragma once` with it.
pub fn library_source() -> String {
    let mut text = String::new();
    for (name, source) in SOURCES {
        text.push_str(&format!("// ---- {name}\n"));
        for line in source.lines() {
            let trimmed = line.trim();
            let included = trimmed
                .strip_prefix("#include \"")
                .and_then(|rest| rest.strip_suffix('"'))
                .is_some_and(|header| SOURCES.iter().any(|(n, _)| *n == header));
            if !included && trimmed != "#pragma once" {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{library_source, SOURCES};

    #[test]
    fn every_source_of_the_kernels_directory_is_built_in() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let listed = |dir: &str, ends: &[&str]| -> Vec<String> {
            (std::fs::read_dir(format!("{root}/{dir}")).unwrap())
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| ends.iter().any(|end| name.ends_with(end)))
                .collect()
        };
        let mut on_disk = listed("kernels-metal", &[".metal", ".h"]);
        on_disk.extend(listed("kernels-gpu", &[".h"]));
        on_disk.sort();
        let mut built_in: Vec<String> = SOURCES.iter().map(|(n, _)| n.to_string()).collect();
        built_in.sort();
        assert_eq!(built_in, on_disk);
    }

    #[test]
    fn the_library_includes_only_the_system_header() {
        let text = library_source();
        let includes: Vec<&str> = (text.lines())
            .filter(|l| l.trim_start().starts_with("#include"))
            .collect();
        assert_eq!(includes, ["#include <metal_stdlib>"]);
        assert!(!text.contains("#pragma once"));
        // Each source once, in order.
        let mut at = 0;
        for (name, _) in SOURCES {
            let marker = format!("// ---- {name}\n");
            at += text[at..].find(&marker).unwrap_or_else(|| panic!("{name}")) + marker.len();
        }
    }

    /// What the emulation's C++ build accepts and Metal does not (the Metal Shading Language
    /// specification's list of C++ features it leaves out): no struct derives from another,
    /// and no lambda, `goto`, virtual function, `new` or `delete`.
    #[test]
    fn the_library_uses_no_cpp_feature_that_metal_lacks() {
        let text = library_source();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let words: Vec<&str> = code
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .collect();
            let derives = (code.trim_start().starts_with("struct ")
                || code.trim_start().starts_with("class "))
                && code.contains(" : ")
                && !code.contains("enum");
            let lambda = code.contains("[](") || code.contains("[&]") || code.contains("[=]");
            let keyword = ["goto", "virtual", "new", "delete"]
                .iter()
                .find(|k| words.contains(k));
            assert!(
                !derives && !lambda && keyword.is_none(),
                "line {}: {line}",
                n + 1
            );
        }
    }
}
