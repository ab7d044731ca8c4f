//! How each GGUF weight type lies in GPU memory: the repacked layouts the kernels read
//! (documented in `shaders/quant_common.wgsl`, `shaders/matmul_q4_1.wgsl`, `shaders/matmul_q8_0.wgsl`)
//! and the repacking done once at upload.
//!
//! - Q4_1 and Q8_0 keep the interleaved layouts their own matmul bodies read (scales of a row group
//!   first, then each row's quants, per 32 columns), measured fastest on the software GPUs.
//! - Every other type uses the generic layout: the GGUF blocks of 4 adjacent rows that cover the same
//!   columns side by side, each block padded to whole words (Q4_0, Q5_0: 2 bytes after the f16 scale;
//!   Q3_K, Q6_K: 2 bytes at the end), so every field of a block is word-aligned. Same size as the
//!   GGUF data but for that padding (Q4_0 +11%, Q5_0 +9%, Q3_K/Q6_K +1%) and the zero rows that
//!   complete the last group.

use super::Preludes;
use crate::gguf::GgmlType;

/// The GPU side of one weight type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub ggml_type: GgmlType,
    /// Values per GGUF block (32, or 256 for the K-quants).
    pub block_values: u32,
    /// Bytes per GGUF block.
    pub block_bytes: u32,
    /// Rows interleaved in one group (= output rows per matmul invocation).
    pub group_rows: u32,
    /// u32 words one group occupies per block of columns.
    pub group_block_words: u32,
    /// Where the 2 padding bytes of a block go, for blocks that are not whole words.
    pad: Pad,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pad {
    /// The block is whole words.
    None,
    /// After the leading f16 (Q4_0, Q5_0).
    AfterHeader,
    /// At the end (Q3_K, Q6_K).
    End,
    /// Q4_1 and Q8_0: their own interleaved layouts.
    Interleaved,
}

impl Layout {
    /// The layout of `t`, or `None` for a type pagedlm does not compute with.
    pub fn of(t: GgmlType) -> Option<Layout> {
        let (block_values, block_bytes) = match t {
            // Float types go in 32-value "blocks", so every type is read per 32-value chunk.
            GgmlType::F32 => (32, 128),
            GgmlType::F16 | GgmlType::BF16 => (32, 64),
            GgmlType::Other(_) => return None,
            _ => {
                let (v, b) = t.block_size()?;
                (v as u32, b as u32)
            }
        };
        let pad = match t {
            GgmlType::Q4_1 | GgmlType::Q8_0 => Pad::Interleaved,
            GgmlType::Q4_0 | GgmlType::Q5_0 => Pad::AfterHeader,
            GgmlType::Q3_K | GgmlType::Q6_K => Pad::End,
            _ => Pad::None,
        };
        let group_rows = if t == GgmlType::Q8_0 { 8 } else { 4 };
        // The interleaved layouts keep the GGUF size (8 Q8_0 blocks of 34 bytes are 68 words).
        let group_block_words =
            if pad == Pad::Interleaved { group_rows * block_bytes / 4 } else { group_rows * block_bytes.div_ceil(4) };
        Some(Layout { ggml_type: t, block_values, block_bytes, group_rows, group_block_words, pad })
    }

    /// The matmul shader of this type (src/gpu/shaders.rs) built with `preludes`: plain, its
    /// `_subgroup` variant (activation blocks shared through subgroup broadcasts) or its
    /// `_subgroup_sum` variant (split rows summed within a subgroup), or the plain one's `_wide`
    /// kernel (tiles past 16 slots).
    pub fn matmul_shader(&self, preludes: Preludes) -> &'static str {
        let (plain, wide, shared, sum) = match self.ggml_type {
            GgmlType::F32 => ("matmul_f32", "matmul_f32_wide", "matmul_f32_subgroup", "matmul_f32_subgroup_sum"),
            GgmlType::F16 => ("matmul_f16", "matmul_f16_wide", "matmul_f16_subgroup", "matmul_f16_subgroup_sum"),
            GgmlType::BF16 => ("matmul_bf16", "matmul_bf16_wide", "matmul_bf16_subgroup", "matmul_bf16_subgroup_sum"),
            GgmlType::Q4_0 => ("matmul_q4_0", "matmul_q4_0_wide", "matmul_q4_0_subgroup", "matmul_q4_0_subgroup_sum"),
            GgmlType::Q4_1 => ("matmul_q4_1", "matmul_q4_1_wide", "matmul_q4_1_subgroup", "matmul_q4_1_subgroup_sum"),
            GgmlType::Q5_0 => ("matmul_q5_0", "matmul_q5_0_wide", "matmul_q5_0_subgroup", "matmul_q5_0_subgroup_sum"),
            GgmlType::Q5_1 => ("matmul_q5_1", "matmul_q5_1_wide", "matmul_q5_1_subgroup", "matmul_q5_1_subgroup_sum"),
            GgmlType::Q8_0 => ("matmul_q8_0", "matmul_q8_0_wide", "matmul_q8_0_subgroup", "matmul_q8_0_subgroup_sum"),
            GgmlType::Q2_K => ("matmul_q2_k", "matmul_q2_k_wide", "matmul_q2_k_subgroup", "matmul_q2_k_subgroup_sum"),
            GgmlType::Q3_K => ("matmul_q3_k", "matmul_q3_k_wide", "matmul_q3_k_subgroup", "matmul_q3_k_subgroup_sum"),
            GgmlType::Q4_K => ("matmul_q4_k", "matmul_q4_k_wide", "matmul_q4_k_subgroup", "matmul_q4_k_subgroup_sum"),
            GgmlType::Q5_K => ("matmul_q5_k", "matmul_q5_k_wide", "matmul_q5_k_subgroup", "matmul_q5_k_subgroup_sum"),
            GgmlType::Q6_K | GgmlType::Other(_) => ("matmul_q6_k", "matmul_q6_k_wide", "matmul_q6_k_subgroup", "matmul_q6_k_subgroup_sum"),
        };
        match preludes {
            Preludes::Plain => plain,
            Preludes::PlainWide => wide,
            Preludes::SharedLoads => shared,
            Preludes::SubgroupSum => sum,
        }
    }

    /// The embedding shader of this type: `embed_` and the matmul shader's suffix.
    pub fn embed_shader(&self) -> &'static str {
        match self.ggml_type {
            GgmlType::F32 => "embed_f32",
            GgmlType::F16 => "embed_f16",
            GgmlType::BF16 => "embed_bf16",
            GgmlType::Q4_0 => "embed_q4_0",
            GgmlType::Q4_1 => "embed_q4_1",
            GgmlType::Q5_0 => "embed_q5_0",
            GgmlType::Q5_1 => "embed_q5_1",
            GgmlType::Q8_0 => "embed_q8_0",
            GgmlType::Q2_K => "embed_q2_k",
            GgmlType::Q3_K => "embed_q3_k",
            GgmlType::Q4_K => "embed_q4_k",
            GgmlType::Q5_K => "embed_q5_k",
            GgmlType::Q6_K | GgmlType::Other(_) => "embed_q6_k",
        }
    }

    /// Whether this type's matmul body can take int8 activations (`dot4I8Packed`).
    pub fn has_int8_path(&self) -> bool {
        self.pad == Pad::Interleaved
    }

    /// GGUF bytes of one row of `cols` values.
    pub fn row_bytes(&self, cols: u32) -> u64 {
        (cols / self.block_values) as u64 * self.block_bytes as u64
    }

    /// GPU bytes of one row group of `cols` values.
    pub fn group_bytes(&self, cols: u32) -> u64 {
        (cols / self.block_values) as u64 * self.group_block_words as u64 * 4
    }

    /// Checks that `raw` is a GGUF matrix of this type, `rows` × `cols`, describing what is wrong.
    pub fn check_raw(&self, raw: &[u8], rows: u32, cols: u32) -> Result<(), String> {
        let name = self.ggml_type.name();
        if rows == 0 || cols == 0 || cols % self.block_values != 0 {
            return Err(format!("{name} {rows} rows × {cols} cols: both must be positive and cols a multiple of {}", self.block_values));
        }
        let want = rows as u64 * self.row_bytes(cols);
        if raw.len() as u64 != want {
            return Err(format!("{name} {rows} × {cols} takes {want} bytes, {} given", raw.len()));
        }
        Ok(())
    }

    /// Rewrites checked GGUF rows into this type's GPU layout, plus zero rows completing the last
    /// group: `ceil(rows / group_rows) · group_bytes(cols) / 4` words.
    pub fn repack(&self, raw: &[u8], rows: u32, cols: u32) -> Vec<u32> {
        let nb = (cols / self.block_values) as usize;
        let g_rows = self.group_rows as usize;
        let groups = (rows as usize).div_ceil(g_rows);
        let unit = self.group_block_words as usize;
        let bb = self.block_bytes as usize;
        let mut out = vec![0u32; groups * nb * unit];
        for row in 0..rows as usize {
            let (g, r) = (row / g_rows, row % g_rows);
            for b in 0..nb {
                let block = &raw[(row * nb + b) * bb..][..bb];
                let dst = &mut out[(g * nb + b) * unit..][..unit];
                self.place(block, r, dst);
            }
        }
        out
    }

    /// Writes row r's GGUF `block` into the group block `dst`.
    fn place(&self, block: &[u8], r: usize, dst: &mut [u32]) {
        let word = |at: usize| u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
        match (self.pad, self.ggml_type) {
            (Pad::Interleaved, GgmlType::Q4_1) => {
                // u32 r: d | m << 16, the first 4 bytes of the block read little-endian.
                dst[r] = word(0);
                for i in 0..4 {
                    dst[4 + 4 * r + i] = word(4 + 4 * i);
                }
            }
            (Pad::Interleaved, _) => {
                let d = u16::from_le_bytes([block[0], block[1]]) as u32;
                dst[r / 2] |= d << (16 * (r % 2));
                for i in 0..8 {
                    dst[4 + 8 * r + i] = word(2 + 4 * i);
                }
            }
            (pad, _) => {
                let words = self.group_block_words as usize / self.group_rows as usize;
                let mut bytes = Vec::with_capacity(words * 4);
                match pad {
                    Pad::AfterHeader => {
                        bytes.extend_from_slice(&block[..2]);
                        bytes.extend_from_slice(&[0, 0]);
                        bytes.extend_from_slice(&block[2..]);
                    }
                    _ => bytes.extend_from_slice(block),
                }
                bytes.resize(words * 4, 0);
                for (i, w) in bytes.chunks_exact(4).enumerate() {
                    dst[r * words + i] = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                }
            }
        }
    }
}
