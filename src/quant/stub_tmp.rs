//! TEMPORARY until branch quant-cpu merges: the generic dequantizer for the types that exist today.
use crate::gguf::GgmlType;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct QuantError(String);

pub fn dequantize(t: GgmlType, raw: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    match t {
        GgmlType::Q4_1 => super::dequantize_q4_1(raw, out),
        GgmlType::Q8_0 => super::dequantize_q8_0(raw, out),
        GgmlType::F32 => out.copy_from_slice(bytemuck::cast_slice(raw)),
        other => return Err(QuantError(format!("no CPU dequantizer for {} yet", other.name()))),
    }
    Ok(())
}
