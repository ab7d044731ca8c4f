//! How each GGUF weight type lies in GPU memory: the repacked layouts the kernels read
//! (documented in `shaders/quant_common.wgsl`, `shaders/matmul_q4_1.wgsl`, `shaders/matmul_q8_0.wgsl`)
//! and the repacking done once at upload. Which type takes which layout, and with how many rows
//! per group, is its row of [`WEIGHT_TYPES`] ([`GpuPacking`]); this file only carries it out.
//!
//! - Q4_1 and Q8_0 keep the interleaved layouts their own matmul bodies read (scales of a row group
//!   first, then each row's quants, per 32 columns), measured fastest on the software GPUs.
//! - Every other type uses the generic layout: the GGUF blocks of 4 adjacent rows that cover the same
//!   columns side by side, each block padded to whole words (Q4_0, Q5_0: 2 bytes after the f16 scale;
//!   Q3_K, Q6_K: 2 bytes at the end), so every field of a block is word-aligned. Same size as the
//!   GGUF data but for that padding (Q4_0 +11%, Q5_0 +9%, Q3_K/Q6_K +1%) and the zero rows that
//!   complete the last group.

use std::sync::OnceLock;

use super::Preludes;
use crate::gguf::GgmlType;
use crate::quant::{Codec, GpuPacking, PadAt, WeightType, QK, WEIGHT_TYPES};

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
    /// How the blocks lie (the type's row of [`WEIGHT_TYPES`]).
    packing: GpuPacking,
    names: &'static ShaderNames,
}

/// The shaders of one type (src/gpu/shaders.rs), named after the type's lower-case name: the
/// matmul shader `matmul_<type>` with its `_wide`, `_subgroup` and `_subgroup_sum` variants,
/// and `embed_<type>`.
#[derive(Debug, PartialEq, Eq)]
struct ShaderNames {
    plain: String,
    wide: String,
    shared: String,
    sum: String,
    embed: String,
}

impl ShaderNames {
    /// The names of `t`'s shaders, made once per supported type and kept for the program's life
    /// (a [`Kernel`](crate::gpu::Kernel) keeps its shader's name as a `&'static str`).
    fn of(t: GgmlType) -> Option<&'static ShaderNames> {
        static NAMES: OnceLock<Vec<(GgmlType, ShaderNames)>> = OnceLock::new();
        let all = NAMES.get_or_init(|| {
            WEIGHT_TYPES
                .iter()
                .map(|row| {
                    let lower = row.ggml_type.name().to_ascii_lowercase();
                    let matmul = format!("matmul_{lower}");
                    let names = ShaderNames {
                        wide: format!("{matmul}_wide"),
                        shared: format!("{matmul}_subgroup"),
                        sum: format!("{matmul}_subgroup_sum"),
                        embed: format!("embed_{lower}"),
                        plain: matmul,
                    };
                    (row.ggml_type, names)
                })
                .collect()
        });
        all.iter().find(|(ty, _)| *ty == t).map(|(_, names)| names)
    }
}

impl Layout {
    /// The layout of `t`, or `None` for a type pagedlm does not compute with.
    pub fn of(t: GgmlType) -> Option<Layout> {
        let row = WeightType::of(t)?;
        let (values, bytes) = t.block_size()?;
        let (block_values, block_bytes) = match row.codec {
            // Float types go in 32-value "blocks", so every type is read per 32-value chunk.
            Codec::Float => (QK as u32, (QK as u64 * bytes) as u32),
            Codec::Legacy | Codec::K => (values as u32, bytes as u32),
        };
        let packing = row.gpu;
        let group_rows = packing.group_rows();
        // The interleaved layouts keep the GGUF size (8 Q8_0 blocks of 34 bytes are 68 words).
        let group_block_words = match packing {
            GpuPacking::Interleaved { .. } => group_rows * block_bytes / 4,
            GpuPacking::Blocks(_) => group_rows * block_bytes.div_ceil(4),
        };
        Some(Layout { ggml_type: t, block_values, block_bytes, group_rows, group_block_words, packing, names: ShaderNames::of(t)? })
    }

    /// The matmul shader of this type (src/gpu/shaders.rs) built with `preludes`: plain, its
    /// `_subgroup` variant (activation blocks shared through subgroup broadcasts) or its
    /// `_subgroup_sum` variant (split rows summed within a subgroup), or the plain one's `_wide`
    /// kernel (tiles past 16 slots).
    pub fn matmul_shader(&self, preludes: Preludes) -> &'static str {
        let names: &'static ShaderNames = self.names;
        match preludes {
            Preludes::Plain => &names.plain,
            Preludes::PlainWide => &names.wide,
            Preludes::SharedLoads => &names.shared,
            Preludes::SubgroupSum => &names.sum,
        }
    }

    /// The embedding shader of this type: `embed_` and the matmul shader's suffix.
    pub fn embed_shader(&self) -> &'static str {
        let names: &'static ShaderNames = self.names;
        &names.embed
    }

    /// Whether this type's matmul body can take int8 activations (`dot4I8Packed`).
    pub fn has_int8_path(&self) -> bool {
        self.packing.int8_body()
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

    /// Writes row r's GGUF `block` into the group block `dst` (zeroed before).
    fn place(&self, block: &[u8], r: usize, dst: &mut [u32]) {
        match self.packing {
            GpuPacking::Interleaved { group_rows, header_bytes } => {
                // Row r's header (scale, and minimum) at byte r · header_bytes of the group's
                // headers, its quants in words after every row's header.
                let header = header_bytes as usize;
                or_bytes(dst, r * header, &block[..header]);
                let quants = &block[header..];
                or_bytes(dst, group_rows as usize * header + r * quants.len(), quants);
            }
            GpuPacking::Blocks(pad) => {
                let words = self.group_block_words as usize / self.group_rows as usize;
                let at = r * words * 4;
                match pad {
                    PadAt::AfterHeader => {
                        or_bytes(dst, at, &block[..2]);
                        or_bytes(dst, at + 4, &block[2..]);
                    }
                    PadAt::Nowhere | PadAt::End => or_bytes(dst, at, block),
                }
            }
        }
    }
}

/// ORs `bytes` into the little-endian words of `dst` from byte `at` on: whole words at once
/// where `at` is word-aligned (the quants of every layout), byte by byte otherwise.
fn or_bytes(dst: &mut [u32], at: usize, bytes: &[u8]) {
    let whole = if at % 4 == 0 { bytes.len() / 4 * 4 } else { 0 };
    for (d, w) in dst[at / 4..].iter_mut().zip(bytes[..whole].chunks_exact(4)) {
        *d |= u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    }
    for (i, &b) in bytes.iter().enumerate().skip(whole) {
        dst[(at + i) / 4] |= (b as u32) << (8 * ((at + i) % 4));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_type_has_its_shaders() {
        for t in GgmlType::SUPPORTED {
            let layout = Layout::of(t).unwrap_or_else(|| panic!("{} has no layout", t.name()));
            let matmuls = [Preludes::Plain, Preludes::PlainWide, Preludes::SharedLoads, Preludes::SubgroupSum].map(|p| layout.matmul_shader(p));
            for name in matmuls.into_iter().chain([layout.embed_shader()]) {
                assert!(crate::gpu::shaders::source(name).is_some(), "{}: no shader {name}", t.name());
            }
        }
        let q4_k = Layout::of(GgmlType::Q4_K).unwrap();
        assert_eq!((q4_k.matmul_shader(Preludes::SubgroupSum), q4_k.embed_shader()), ("matmul_q4_k_subgroup_sum", "embed_q4_k"));
        assert_eq!(Layout::of(GgmlType::Other(23)), None);
    }
}
