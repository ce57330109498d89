//! The kernels' sources.

/// Every source of `kernels-cuda/` and the headers it shares with Metal's kernels
/// (`kernels-gpu/`: the weight formats, their codebooks, the dialects' spellings), as (name,
/// text): what NVRTC compiles for a device, headers included.
pub const SOURCES: [(&str, &str); 14] = [
    (
        "tallow.cuh",
        include_str!("../../../kernels-cuda/tallow.cuh"),
    ),
    ("dialect.h", include_str!("../../../kernels-gpu/dialect.h")),
    ("grids.h", include_str!("../../../kernels-gpu/grids.h")),
    ("formats.h", include_str!("../../../kernels-gpu/formats.h")),
    (
        "attention.cu",
        include_str!("../../../kernels-cuda/attention.cu"),
    ),
    ("embed.cu", include_str!("../../../kernels-cuda/embed.cu")),
    (
        "experts.cu",
        include_str!("../../../kernels-cuda/experts.cu"),
    ),
    ("kv.cu", include_str!("../../../kernels-cuda/kv.cu")),
    ("logits.cu", include_str!("../../../kernels-cuda/logits.cu")),
    ("matmul.cu", include_str!("../../../kernels-cuda/matmul.cu")),
    ("matvec.cu", include_str!("../../../kernels-cuda/matvec.cu")),
    ("rope.cu", include_str!("../../../kernels-cuda/rope.cu")),
    ("rows.cu", include_str!("../../../kernels-cuda/rows.cu")),
    ("tiles.cu", include_str!("../../../kernels-cuda/tiles.cu")),
];

#[cfg(test)]
mod tests {
    use super::SOURCES;

    #[test]
    fn every_source_of_the_kernels_directory_is_built_in() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let listed = |dir: &str, ends: &[&str]| -> Vec<String> {
            (std::fs::read_dir(format!("{root}/{dir}")).unwrap())
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| ends.iter().any(|end| name.ends_with(end)))
                .collect()
        };
        let mut on_disk = listed("kernels-cuda", &[".cu", ".cuh"]);
        on_disk.extend(listed("kernels-gpu", &[".h"]));
        on_disk.sort();
        let mut built_in: Vec<String> = SOURCES.iter().map(|(n, _)| n.to_string()).collect();
        built_in.sort();
        assert_eq!(built_in, on_disk);
    }
}
