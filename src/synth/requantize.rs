//! Re-encoding a GGUF file's weight matrices to another type, through f32, so that tests can run
//! the same weights in every format (a re-encoded file holds its own weights' rounding, and the
//! CPU reference recomputes it from the same file).

use super::GgufWriter;
use crate::gguf::{GgmlType, Gguf, GgufError};
use crate::quant::{dequantize, quantize, WeightType};

/// The type llama.cpp's quantizer writes for a matrix with rows of `ne0` values when asked for
/// `target`: a K-quant needs whole 256-value super-blocks per row and otherwise falls back as
/// llama.cpp does (its row's `row_fallback` in [`crate::quant::WEIGHT_TYPES`]: Q4_K → Q5_0, ...);
/// a row that is not whole blocks of that type either is F16.
pub fn row_type(target: GgmlType, ne0: u64) -> GgmlType {
    let fits = |t: GgmlType| t.block_size().is_some_and(|(values, _)| ne0 % values == 0);
    let fallback = WeightType::of(target).and_then(|row| row.row_fallback).unwrap_or(target);
    [target, fallback].into_iter().find(|&t| fits(t)).unwrap_or(GgmlType::F16)
}

/// A copy of the GGUF `bytes` with every 2-D weight matrix (not norms, not 1-D tensors)
/// re-encoded to `target` (or its [`row_type`] fallback), through f32: dequantized, then
/// quantized. Metadata (`general.file_type` included) and every other tensor are kept as they
/// are, in the same order; the copy is GGUF v3.
pub fn requantize_gguf(bytes: &[u8], target: GgmlType) -> Result<Vec<u8>, GgufError> {
    if !target.is_supported() {
        return Err(GgufError::InvalidWrite(format!("cannot re-encode to {}, which pagedlm does not support", target.name())));
    }
    let gguf = Gguf::parse(bytes)?;
    let mut writer = GgufWriter::new();
    for (key, value) in &gguf.metadata {
        writer.add_meta(key.clone(), value.clone())?;
    }
    for info in &gguf.tensors {
        let data = gguf.tensor_data(info);
        if info.dims.len() != 2 {
            writer.add_tensor(info.name.clone(), &info.dims, info.ggml_type, data.to_vec())?;
            continue;
        }
        if !info.ggml_type.is_supported() {
            return Err(GgufError::UnsupportedTensorType { name: info.name.clone(), type_name: info.ggml_type.name() });
        }
        let invalid = |e: crate::quant::QuantError| GgufError::InvalidWrite(format!("re-encoding tensor {}: {e}", info.name));
        let mut values = vec![0f32; info.n_elements() as usize];
        dequantize(info.ggml_type, data, &mut values).map_err(invalid)?;
        let t = row_type(target, info.dims[0]);
        writer.add_tensor(info.name.clone(), &info.dims, t, quantize(t, &values).map_err(invalid)?)?;
    }
    Ok(writer.to_bytes())
}
