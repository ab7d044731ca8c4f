//! What pagedlm knows of each weight type it computes with, one row per type
//! ([`WEIGHT_TYPES`]): its codec, how the GPU lays its blocks out, how the CPU backend unpacks
//! its rows, what llama.cpp calls a file of it and what llama.cpp's quantizer writes instead
//! when a row is not whole blocks of it. The GPU layouts (`gpu/ops/matmul/layout.rs`), the CPU
//! dots (`cpu/qdot.rs`), the codecs ([`super::ggml`]), the synthetic writer (`synth`) and the
//! model's oracle (`model/reference.rs`) read their facts here rather than matching on types.
//!
//! The row is plain data. What it does not hold and where that lives:
//! - the ggml id: in `gguf.rs` (`SUPPORTED_IDS`), the file format's own fact, needed before any
//!   layer above `gguf.rs` exists; the tests below check that list and this table agree;
//! - bytes and values per block: `GgmlType::block_size`, which sizes every type ggml can store;
//! - shader names: derived from the type's name (`gpu/ops/matmul/layout.rs`);
//! - the bit layout inside a block: the codecs themselves ([`super::ggml`], `cpu/qdot.rs`).

use crate::gguf::GgmlType;

use super::{QK, QK_K};

/// How a type's values are coded: which codec of [`super::ggml`] reads and writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// F32, F16, BF16: one value per "block".
    Float,
    /// Q4_0 .. Q8_0: 32-value blocks, an f16 scale first.
    Legacy,
    /// Q2_K .. Q6_K: 256-value super-blocks of 16- or 32-value sub-blocks.
    K,
}

impl Codec {
    /// Values per block: 1, [`QK`] or [`QK_K`].
    pub const fn block_values(self) -> usize {
        match self {
            Codec::Float => 1,
            Codec::Legacy => QK,
            Codec::K => QK_K,
        }
    }
}

/// Rows per group of the generic GPU layout ([`GpuPacking::Blocks`]), which its matmul body
/// (`shaders/matmul_blocks.wgsl`) reads.
pub const BLOCK_GROUP_ROWS: u32 = 4;

/// How the GPU lays a type's blocks out (repacked once at upload; the layouts are documented in
/// `shaders/quant_common.wgsl`, `shaders/matmul_q4_1.wgsl` and `shaders/matmul_q8_0.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuPacking {
    /// A layout of its own, read by a matmul body of its own (`shaders/matmul_<type>.wgsl`) that
    /// can take int8 activations: per block of columns, the leading `header_bytes` of each block
    /// (scale, and minimum) of `group_rows` rows side by side, then each row's quants. Same size
    /// as the GGUF data.
    Interleaved { group_rows: u32, header_bytes: u32 },
    /// The generic layout: the GGUF blocks of [`BLOCK_GROUP_ROWS`] rows side by side, each padded
    /// to whole words where [`PadAt`] says, read by the generic body with the type's block format
    /// as a prelude (`shaders/quant_<type>.wgsl`).
    Blocks(PadAt),
}

impl GpuPacking {
    /// Rows interleaved in one group (= output rows per matmul invocation).
    pub const fn group_rows(self) -> u32 {
        match self {
            GpuPacking::Interleaved { group_rows, .. } => group_rows,
            GpuPacking::Blocks(_) => BLOCK_GROUP_ROWS,
        }
    }

    /// Whether the matmul body reading this layout can take int8 activations (`dot4I8Packed`):
    /// the bodies of their own can, the generic one cannot.
    pub const fn int8_body(self) -> bool {
        matches!(self, GpuPacking::Interleaved { .. })
    }
}

/// Where the generic GPU layout puts the 2 padding bytes of a block that is not whole words, so
/// that every field of the block is word-aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadAt {
    /// Nowhere: the block is whole words.
    Nowhere,
    /// After the leading f16 scale (Q4_0 +11%, Q5_0 +9%).
    AfterHeader,
    /// At the end (Q3_K, Q6_K: +1%).
    End,
}

/// How the CPU backend unpacks a quantized row (`cpu/qdot.rs`): one scale per sub-block of
/// `values`, and with `has_min` one minimum too (`value = scale · q + min`). `bias`: what the
/// unpacked codes `q` take off the stored ones, where those fit 7 bits (`q + bias` in 0..=127,
/// the unsigned operand of relaxed SIMD's int8 dot product); `None` where they take 8 (Q8_0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubBlocks {
    pub values: usize,
    pub has_min: bool,
    pub bias: Option<u8>,
}

/// One weight type pagedlm computes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightType {
    pub ggml_type: GgmlType,
    pub codec: Codec,
    pub gpu: GpuPacking,
    /// `None` for the float types, which the CPU dots read as f32 (never int8 activations).
    pub cpu: Option<SubBlocks>,
    /// llama.cpp's `general.file_type` (`llama_ftype`) for a file whose matrices are mostly this
    /// type; the K-quants as their "_M" mixes.
    pub llama_file_type: u32,
    /// The type llama.cpp's quantizer writes instead for a row that is not whole blocks of this
    /// one (the K-quants' fallbacks).
    pub row_fallback: Option<GgmlType>,
}

const fn sub(values: usize, has_min: bool, bias: Option<u8>) -> Option<SubBlocks> {
    Some(SubBlocks { values, has_min, bias })
}

/// Every supported type, in [`GgmlType::SUPPORTED`]'s order (ggml's id order); one row per
/// supported type, which the length checks at compile time and the tests below row by row.
#[rustfmt::skip]
pub const WEIGHT_TYPES: [WeightType; GgmlType::SUPPORTED.len()] = {
    use Codec::{Float, Legacy, K};
    use GgmlType as G;
    use GpuPacking::{Blocks, Interleaved};
    use PadAt::{AfterHeader, End, Nowhere};
    [
        WeightType { ggml_type: G::F32,  codec: Float,  gpu: Blocks(Nowhere),                                  cpu: None,                            llama_file_type: 0,  row_fallback: None },
        WeightType { ggml_type: G::F16,  codec: Float,  gpu: Blocks(Nowhere),                                  cpu: None,                            llama_file_type: 1,  row_fallback: None },
        WeightType { ggml_type: G::Q4_0, codec: Legacy, gpu: Blocks(AfterHeader),                              cpu: sub(QK, false, Some(8)),         llama_file_type: 2,  row_fallback: None },
        WeightType { ggml_type: G::Q4_1, codec: Legacy, gpu: Interleaved { group_rows: 4, header_bytes: 4 },   cpu: sub(QK, true, Some(0)),          llama_file_type: 3,  row_fallback: None },
        WeightType { ggml_type: G::Q5_0, codec: Legacy, gpu: Blocks(AfterHeader),                              cpu: sub(QK, false, Some(16)),        llama_file_type: 8,  row_fallback: None },
        WeightType { ggml_type: G::Q5_1, codec: Legacy, gpu: Blocks(Nowhere),                                  cpu: sub(QK, true, Some(0)),          llama_file_type: 9,  row_fallback: None },
        WeightType { ggml_type: G::Q8_0, codec: Legacy, gpu: Interleaved { group_rows: 8, header_bytes: 2 },   cpu: sub(QK, false, None),            llama_file_type: 7,  row_fallback: None },
        WeightType { ggml_type: G::Q2_K, codec: K,      gpu: Blocks(Nowhere),                                  cpu: sub(16, true, Some(0)),          llama_file_type: 10, row_fallback: Some(G::Q4_0) },
        WeightType { ggml_type: G::Q3_K, codec: K,      gpu: Blocks(End),                                      cpu: sub(16, false, Some(4)),         llama_file_type: 12, row_fallback: Some(G::Q4_0) },
        WeightType { ggml_type: G::Q4_K, codec: K,      gpu: Blocks(Nowhere),                                  cpu: sub(32, true, Some(0)),          llama_file_type: 15, row_fallback: Some(G::Q5_0) },
        WeightType { ggml_type: G::Q5_K, codec: K,      gpu: Blocks(Nowhere),                                  cpu: sub(32, true, Some(0)),          llama_file_type: 17, row_fallback: Some(G::Q5_1) },
        WeightType { ggml_type: G::Q6_K, codec: K,      gpu: Blocks(End),                                      cpu: sub(16, false, Some(32)),        llama_file_type: 18, row_fallback: Some(G::Q8_0) },
        WeightType { ggml_type: G::BF16, codec: Float,  gpu: Blocks(Nowhere),                                  cpu: None,                            llama_file_type: 32, row_fallback: None },
    ]
};

impl WeightType {
    /// The row of `t`, `None` for a type pagedlm does not compute with.
    pub fn of(t: GgmlType) -> Option<&'static WeightType> {
        WEIGHT_TYPES.iter().find(|row| row.ggml_type == t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's (values, bytes) per block of a row's type.
    fn block(row: &WeightType) -> (u64, u64) {
        row.ggml_type.block_size().unwrap_or_else(|| panic!("{} has no ggml block size", row.ggml_type.name()))
    }

    #[test]
    fn every_supported_type_has_exactly_one_row() {
        for t in GgmlType::SUPPORTED {
            let rows = WEIGHT_TYPES.iter().filter(|row| row.ggml_type == t).count();
            assert_eq!(rows, 1, "{} has {rows} rows", t.name());
            assert_eq!(WeightType::of(t).map(|row| row.ggml_type), Some(t));
        }
        for row in &WEIGHT_TYPES {
            assert!(GgmlType::SUPPORTED.contains(&row.ggml_type), "{:?} has a row but is not in gguf.rs's SUPPORTED_IDS", row.ggml_type);
            assert_eq!(GgmlType::from_u32(row.ggml_type.to_u32()), row.ggml_type);
        }
        assert_eq!(WeightType::of(GgmlType::Other(23)), None);
    }

    #[test]
    fn codecs_agree_with_ggmls_block_sizes() {
        for row in &WEIGHT_TYPES {
            let name = row.ggml_type.name();
            assert_eq!(block(row).0, row.codec.block_values() as u64, "{name}: values per block");
            let first = name.as_bytes()[0];
            let codec = match (first, name.ends_with("_K")) {
                (b'F' | b'B', _) => Codec::Float,
                (b'Q', false) => Codec::Legacy,
                _ => Codec::K,
            };
            assert_eq!(row.codec, codec, "{name}");
        }
    }

    #[test]
    fn cpu_sub_blocks_split_every_quantized_block() {
        for row in &WEIGHT_TYPES {
            let name = row.ggml_type.name();
            match (row.codec, row.cpu) {
                (Codec::Float, cpu) => assert_eq!(cpu, None, "{name}: floats are not unpacked"),
                (_, None) => panic!("{name}: a quantized type needs its sub-blocks"),
                (_, Some(sub)) => {
                    assert!(sub.values == 16 || sub.values == 32, "{name}: {} values per sub-block", sub.values);
                    assert_eq!(block(row).0 % sub.values as u64, 0, "{name}");
                }
            }
        }
    }

    #[test]
    fn gpu_packings_make_every_field_word_aligned() {
        for row in &WEIGHT_TYPES {
            let name = row.ggml_type.name();
            let bytes = block(row).1 as u32;
            match row.gpu {
                GpuPacking::Interleaved { group_rows, header_bytes } => {
                    assert_eq!(row.codec, Codec::Legacy, "{name}: the interleaved bodies read 32-value blocks");
                    assert_eq!((group_rows * header_bytes) % 4, 0, "{name}: the group's headers are whole words");
                    assert_eq!((bytes - header_bytes) % 4, 0, "{name}: each row's quants are whole words");
                    // The interleaved bodies take the scale (and Q4_1's minimum) from the header.
                    let min = row.cpu.is_some_and(|sub| sub.has_min);
                    assert_eq!(header_bytes, if min { 4 } else { 2 }, "{name}: f16 scale (and f16 minimum)");
                }
                GpuPacking::Blocks(pad) => {
                    let float_chunk = if row.codec == Codec::Float { bytes * QK as u32 } else { bytes };
                    let want = match float_chunk % 4 {
                        0 => vec![PadAt::Nowhere],
                        2 => vec![PadAt::AfterHeader, PadAt::End],
                        _ => vec![],
                    };
                    assert!(want.contains(&pad), "{name}: {bytes}-byte blocks padded {pad:?}");
                    // Legacy blocks lead with an f16 scale; the K-quants with 2-byte gaps end with one.
                    let codec = match pad {
                        PadAt::Nowhere => row.codec,
                        PadAt::AfterHeader => Codec::Legacy,
                        PadAt::End => Codec::K,
                    };
                    assert_eq!(row.codec, codec, "{name}: padded {pad:?}");
                }
            }
            assert!(row.gpu.group_rows() >= 1 && 32 % row.gpu.group_rows() == 0, "{name}: group rows {}", row.gpu.group_rows());
        }
    }

    #[test]
    fn row_fallbacks_are_legacy_types_without_a_fallback() {
        for row in &WEIGHT_TYPES {
            let name = row.ggml_type.name();
            match row.row_fallback {
                None => assert_ne!(row.codec, Codec::K, "{name}: llama.cpp falls back from every K-quant"),
                Some(fallback) => {
                    assert_eq!(row.codec, Codec::K, "{name}: only K-quants fall back");
                    let to = WeightType::of(fallback).unwrap_or_else(|| panic!("{name} falls back to unsupported {}", fallback.name()));
                    assert_eq!((to.codec, to.row_fallback), (Codec::Legacy, None), "{name} -> {}", fallback.name());
                }
            }
        }
    }

    #[test]
    fn llama_file_types_are_distinct() {
        for (i, a) in WEIGHT_TYPES.iter().enumerate() {
            for b in &WEIGHT_TYPES[i + 1..] {
                assert_ne!(a.llama_file_type, b.llama_file_type, "{} and {}", a.ggml_type.name(), b.ggml_type.name());
            }
        }
    }
}
