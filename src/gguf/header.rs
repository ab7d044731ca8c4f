//! Parsing a GGUF header (magic, version, metadata, tensor infos) from a file's first bytes,
//! every count, length and offset checked before it is used or allocated for; and finding how
//! many first bytes a header takes when the file is read by ranges.

use std::borrow::Cow;
use std::collections::HashSet;

use super::*;

/// A checked reader over the file. Every read either fits in the buffer or returns
/// `Truncated` naming what was being read.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, context: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated { at: self.pos as u64, context: context(), needed: n, available: self.remaining() });
        }
        // n <= remaining <= usize::MAX, so the cast and the slice are in range.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, context: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, context)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, c: &dyn Fn() -> String) -> Result<u8, GgufError> {
        Ok(self.array::<1>(c)?[0])
    }
    fn u16(&mut self, c: &dyn Fn() -> String) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(c)?))
    }
    fn u32(&mut self, c: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(c)?))
    }
    fn u64(&mut self, c: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(c)?))
    }

    fn string(&mut self, c: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(c)?;
        if len > MAX_STRING_LEN {
            return Err(GgufError::TooLarge { what: format!("string length in {}", c()), at, value: len, limit: MAX_STRING_LEN });
        }
        let data_at = self.pos as u64;
        let raw = self.take(len, c)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(GgufError::InvalidUtf8 { at: data_at + e.valid_up_to() as u64, context: c() }),
        }
    }
}

/// What a file's header says: metadata, tensor infos, where its data section starts.
pub(super) struct Header {
    pub(super) version: u32,
    pub(super) alignment: u64,
    pub(super) metadata: Vec<(String, MetaValue)>,
    pub(super) tensors: Vec<TensorInfo>,
    pub(super) data_offset: u64,
}

impl Header {
    // Long: the file's sections in order, each count and offset checked where it is read.
    /// Parses and validates the header at the start of `bytes`, the first bytes of a file of
    /// `file_len` bytes: every tensor of a known type must have an aligned offset and its whole
    /// data range inside the file.
    pub(super) fn parse(bytes: &[u8], file_len: u64) -> Result<Header, GgufError> {
        let mut cur = Cursor { bytes, pos: 0 };
        let magic = cur.take(4, &|| "the magic number".into()).map_err(|_| GgufError::BadMagic { found: bytes.to_vec() })?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic.to_vec() });
        }
        let version = cur.u32(&|| "the version".into())?;
        if version != 2 && version != 3 {
            if matches!(version.swap_bytes(), 2 | 3) {
                return Err(GgufError::BigEndian(version));
            }
            return Err(GgufError::UnsupportedVersion(version));
        }
        let count_at = cur.pos as u64;
        let tensor_count = cur.u64(&|| "the tensor count".into())?;
        let kv_at = cur.pos as u64;
        let kv_count = cur.u64(&|| "the metadata count".into())?;
        check_count("tensor count", count_at, tensor_count, MAX_TENSORS)?;
        check_count("metadata count", kv_at, kv_count, MAX_METADATA_ENTRIES)?;

        // Counts are not checked against the bytes left: a short file fails with `Truncated`
        // where it ends (the useful message for a partial download). Reservations are bounded
        // by the bytes left instead. Smallest metadata entry: empty key (8), value type (4),
        // a 1-byte value; smallest tensor info: empty name (8), n_dims (4), type (4), offset (8).
        let kv_capacity = kv_count.min(cur.remaining() / 13) as usize;
        let mut metadata = Vec::with_capacity(kv_capacity);
        let mut keys = HashSet::with_capacity(kv_capacity);
        let mut array_budget = MAX_ARRAY_LEN;
        for i in 0..kv_count {
            let key = cur.string(&|| format!("metadata entry {i} key"))?;
            let ctx = || format!("metadata entry {i} ({key})");
            let type_at = cur.pos as u64;
            let type_id = cur.u32(&ctx)?;
            let value = read_value(&mut cur, type_id, type_at, 0, &mut array_budget, &ctx)?;
            if !keys.insert(key.clone()) {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => return Err(GgufError::BadAlignment { found: format!("{v:?}") }),
            },
        };

        let tensor_capacity = tensor_count.min(cur.remaining() / 24) as usize;
        let mut tensors = Vec::with_capacity(tensor_capacity);
        let mut names = HashSet::with_capacity(tensor_capacity);
        for i in 0..tensor_count {
            let info = read_tensor_info(&mut cur, i)?;
            if !names.insert(info.name.clone()) {
                return Err(GgufError::DuplicateTensor(info.name));
            }
            tensors.push(info);
        }

        let end_of_infos = cur.pos as u64;
        let data_offset = align_up(end_of_infos, alignment).ok_or_else(|| GgufError::TooLarge {
            what: "data section start".into(),
            at: end_of_infos,
            value: end_of_infos,
            limit: u64::MAX - alignment,
        })?;
        for t in &tensors {
            if t.block_size_known() {
                check_tensor_range(t, alignment, data_offset, file_len)?;
            }
        }
        Ok(Header { version, alignment, metadata, tensors, data_offset })
    }
}

/// The header of `source`, read from its first MiB, then from more of it while the header goes on
/// (up to [`MAX_HEADER_BYTES`]).
pub(super) fn read_header(source: &dyn ReadAt) -> Result<Header, GgufError> {
    let size = source.size();
    let mut want = size.min(1 << 20).min(source.available());
    loop {
        let prefix: Cow<'_, [u8]> = match source.borrow(0, want) {
            Some(bytes) => Cow::Borrowed(bytes),
            None => {
                let mut buf = vec![0u8; want as usize];
                source.read_at(0, &mut buf).map_err(GgufError::Read)?;
                Cow::Owned(buf)
            }
        };
        match Header::parse(&prefix, size) {
            Err(GgufError::Truncated { at, needed, .. }) if want < size => {
                if want >= MAX_HEADER_BYTES {
                    return Err(GgufError::TooLarge { what: "the header".into(), at, value: at.saturating_add(needed), limit: MAX_HEADER_BYTES });
                }
                let grown = size.min(MAX_HEADER_BYTES).min(at.saturating_add(needed).max(want * 2));
                if at.saturating_add(needed) > source.available() {
                    return Err(GgufError::NeedMore { bytes: grown });
                }
                want = grown.min(source.available());
            }
            other => return other,
        }
    }
}

fn check_count(what: &str, at: u64, value: u64, limit: u64) -> Result<(), GgufError> {
    if value > limit {
        return Err(GgufError::TooLarge { what: what.into(), at, value, limit });
    }
    Ok(())
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    Some(x.checked_add(alignment - 1)? & !(alignment - 1))
}

/// Reads one value of GGUF type `type_id` (`type_at`: where the type id was, for errors).
/// `array_budget` is how many array elements all of the file's metadata may still have.
fn read_value(
    cur: &mut Cursor<'_>,
    type_id: u32,
    type_at: u64,
    depth: usize,
    array_budget: &mut u64,
    ctx: &dyn Fn() -> String,
) -> Result<MetaValue, GgufError> {
    Ok(match type_id {
        0 => MetaValue::U8(cur.u8(ctx)?),
        1 => MetaValue::I8(cur.u8(ctx)? as i8),
        2 => MetaValue::U16(cur.u16(ctx)?),
        3 => MetaValue::I16(cur.u16(ctx)? as i16),
        4 => MetaValue::U32(cur.u32(ctx)?),
        5 => MetaValue::I32(cur.u32(ctx)? as i32),
        6 => MetaValue::F32(f32::from_bits(cur.u32(ctx)?)),
        7 => {
            let at = cur.pos as u64;
            match cur.u8(ctx)? {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                value => return Err(GgufError::InvalidBool { value, at, context: ctx() }),
            }
        }
        8 => MetaValue::String(cur.string(ctx)?),
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep { at: type_at, limit: MAX_ARRAY_DEPTH, context: ctx() });
            }
            let elem_at = cur.pos as u64;
            let elem_type = cur.u32(ctx)?;
            let elem_size = min_encoded_size(elem_type).ok_or_else(|| GgufError::UnknownValueType { type_id: elem_type, at: elem_at, context: ctx() })?;
            let count_at = cur.pos as u64;
            let count = cur.u64(ctx)?;
            if count > *array_budget {
                return Err(GgufError::TooLarge {
                    what: format!("array length in {} (all arrays together may hold {MAX_ARRAY_LEN} elements)", ctx()),
                    at: count_at,
                    value: count,
                    limit: *array_budget,
                });
            }
            *array_budget -= count;
            // A lying count fails with `Truncated` once the bytes run out; reserve only what
            // the bytes left could hold.
            let mut items = Vec::with_capacity(count.min(cur.remaining() / elem_size) as usize);
            for _ in 0..count {
                items.push(read_value(cur, elem_type, elem_at, depth + 1, array_budget, ctx)?);
            }
            MetaValue::Array(items)
        }
        10 => MetaValue::U64(cur.u64(ctx)?),
        11 => MetaValue::I64(cur.u64(ctx)? as i64),
        12 => MetaValue::F64(f64::from_bits(cur.u64(ctx)?)),
        other => return Err(GgufError::UnknownValueType { type_id: other, at: type_at, context: ctx() }),
    })
}

fn read_tensor_info(cur: &mut Cursor<'_>, index: u64) -> Result<TensorInfo, GgufError> {
    let name = cur.string(&|| format!("tensor info {index} (name)"))?;
    let ctx = || format!("tensor info {index} ({name})");
    let dims_at = cur.pos as u64;
    let n_dims = cur.u32(&ctx)?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooLarge { what: format!("dimension count of {}", ctx()), at: dims_at, value: n_dims as u64, limit: MAX_DIMS as u64 });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(cur.u64(&ctx)?);
    }
    let ggml_type = GgmlType::from_u32(cur.u32(&ctx)?);
    let offset = cur.u64(&ctx)?;
    let size_bytes = tensor_size_bytes(&dims, ggml_type).map_err(|reason| GgufError::BadShape { name: name.clone(), dims: dims.clone(), reason })?.unwrap_or(0);
    Ok(TensorInfo { name, dims, ggml_type, offset, size_bytes, file: 0 })
}

fn check_tensor_range(t: &TensorInfo, alignment: u64, data_offset: u64, file_len: u64) -> Result<(), GgufError> {
    if t.offset % alignment != 0 {
        return Err(GgufError::MisalignedTensor { name: t.name.clone(), offset: t.offset, alignment });
    }
    let end = data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.size_bytes));
    match end {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(GgufError::TensorOutOfBounds { name: t.name.clone(), offset: t.offset, size: t.size_bytes, data_offset, file_len }),
    }
}
