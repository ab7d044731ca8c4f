//! A GGUF split into parts as llama.cpp's `gguf-split` writes them (tools/gguf-split), which its
//! model loader (src/llama-model-loader.cpp) reads back:
//! - every part is a GGUF of its own, with `split.no` (u16, 0-based), `split.count` (u16) and
//!   `split.tensors.count` (i32, the model's tensors in all parts);
//! - the first part holds all the model's other metadata (the split keys after it), later parts
//!   only the split keys;
//! - the tensors are dealt out in file order, each part's offsets relative to its own data
//!   section;
//! - part `i` of `n` is named `PREFIX-0000i-of-0000n.gguf` ([`split_part_name`]).

use super::GgufWriter;
pub use crate::gguf::split_part_name;
use crate::gguf::{Gguf, GgufError, MetaValue, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS};

/// The GGUF `bytes` split into `parts` files ([`try_split_gguf`]).
///
/// # Panics
/// If `bytes` is not a GGUF or cannot be split so (use [`try_split_gguf`] to get the error).
pub fn split_gguf(bytes: &[u8], parts: usize) -> Vec<Vec<u8>> {
    try_split_gguf(bytes, parts).unwrap_or_else(|e| panic!("split_gguf: {e}"))
}

/// The GGUF `bytes` split into `parts` files as `gguf-split` lays them out (see the module doc),
/// each part's tensors a run of the file's, the runs about equal in bytes and none empty.
/// Refuses a file that is already a part, and more parts than tensors or than a u16 counts.
pub fn try_split_gguf(bytes: &[u8], parts: usize) -> Result<Vec<Vec<u8>>, GgufError> {
    let gguf = Gguf::parse(bytes)?;
    let invalid = |msg: String| Err(GgufError::InvalidWrite(format!("splitting a GGUF: {msg}")));
    let n = gguf.tensors.len();
    if parts == 0 || parts > n || parts > u16::MAX as usize || n > i32::MAX as usize {
        return invalid(format!("{parts} parts of a file of {n} tensors"));
    }
    if gguf.metadata.iter().any(|(k, _)| k.starts_with("split.")) {
        return invalid("the file is already a part of a split model".into());
    }
    let mut writers: Vec<GgufWriter> = (0..parts).map(|_| GgufWriter::new()).collect();
    for (key, value) in &gguf.metadata {
        writers[0].add_meta(key.clone(), value.clone())?;
    }
    for (i, w) in writers.iter_mut().enumerate() {
        w.add_meta(SPLIT_NO, MetaValue::U16(i as u16))?;
        w.add_meta(SPLIT_COUNT, MetaValue::U16(parts as u16))?;
        w.add_meta(SPLIT_TENSORS, MetaValue::I32(n as i32))?;
    }
    let sizes: Vec<u64> = gguf.tensors.iter().map(|t| t.size_bytes).collect();
    for (t, part) in gguf.tensors.iter().zip(deal(&sizes, parts)) {
        writers[part].add_tensor(t.name.clone(), &t.dims, t.ggml_type, gguf.tensor_data(t).to_vec())?;
    }
    Ok(writers.iter().map(GgufWriter::to_bytes).collect())
}

/// The part of each tensor: runs in order, a new part once the bytes so far reach its share of
/// the total, or when each remaining tensor must start a part of its own; `parts` ≤ tensors.
fn deal(sizes: &[u64], parts: usize) -> Vec<usize> {
    let total: u64 = sizes.iter().sum();
    let (mut part, mut in_part, mut bytes_before) = (0usize, 0usize, 0u64);
    let mut out = Vec::with_capacity(sizes.len());
    for (i, &size) in sizes.iter().enumerate() {
        let parts_after = parts - 1 - part;
        let share_reached = (bytes_before as u128) * parts as u128 >= total as u128 * (part as u128 + 1);
        if in_part > 0 && parts_after > 0 && (sizes.len() - i == parts_after || share_reached) {
            part += 1;
            in_part = 0;
        }
        out.push(part);
        in_part += 1;
        bytes_before += size;
    }
    out
}
