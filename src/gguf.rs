//! GGUF (v2 and v3, little-endian) reader over an untrusted byte slice, with zero-copy tensor views.
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 metadata count, the metadata
//! key/value pairs, the tensor infos, padding up to `general.alignment` (default 32), then the
//! data section. Every tensor offset is relative to the start of the data section.
//!
//! The bytes may come from anyone (a file dropped on a web page), so every count, length and
//! offset is checked against the buffer before it is used or allocated for, and the parser never
//! indexes past the buffer. Allocation is bounded by the file size times a small constant and by
//! the caps below.
//!
//! Dimension order is GGUF's (= ggml's): `dims[0]` (ne0) is the innermost, contiguous one. A
//! matrix `[ne0 = cols, ne1 = rows]` stores row after row, so ne0 is a weight's input features.

use std::collections::{BTreeMap, HashSet};

/// Longest string (key, value, tensor name) accepted. Vocab entries are a few bytes and chat
/// templates a few KB, so 1 MiB leaves room without letting one length field claim the file.
pub const MAX_STRING_LEN: u64 = 1 << 20;
/// Most elements of one metadata array, and of all metadata arrays together: a parsed
/// `MetaValue` costs tens of bytes, so this bounds the memory a file can make us allocate
/// (the largest real vocabularies have a few hundred thousand entries per array).
pub const MAX_ARRAY_LEN: u64 = 16 << 20;
/// Deepest nesting of arrays inside arrays.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Most tensors and most metadata entries in one file.
pub const MAX_TENSORS: u64 = 1 << 20;
pub const MAX_METADATA_ENTRIES: u64 = 1 << 20;
/// GGUF tensors have at most 4 dimensions today; a little slack for future files.
pub const MAX_DIMS: u32 = 8;
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

const MAGIC: &[u8; 4] = b"GGUF";

/// A ggml tensor element type. The types whose block layout the reader knows have variants
/// (the model runs F32 norms and Q4_1 / Q8_0 matrices); every other id is kept as `Other` so a
/// file listing them still parses, and is refused only if such a tensor is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    /// Any other id: stored, sized where ggml defines a size, never computed with.
    Other(u32),
}

/// The ggml id of every variant but `Other`, in ggml's id order: the one place the supported
/// types are listed in this file. The ids stay here rather than in the quant type table
/// (`quant::WEIGHT_TYPES`, which holds everything else pagedlm knows of each type) because they
/// are the file format's: parsing maps ids to variants before any layer above exists, and
/// `gguf.rs` imports nothing above it. The table's tests check it has one row per entry here.
const SUPPORTED_IDS: &[(GgmlType, u32)] = &[
    (GgmlType::F32, 0),
    (GgmlType::F16, 1),
    (GgmlType::Q4_0, 2),
    (GgmlType::Q4_1, 3),
    (GgmlType::Q5_0, 6),
    (GgmlType::Q5_1, 7),
    (GgmlType::Q8_0, 8),
    (GgmlType::Q2_K, 10),
    (GgmlType::Q3_K, 11),
    (GgmlType::Q4_K, 12),
    (GgmlType::Q5_K, 13),
    (GgmlType::Q6_K, 14),
    (GgmlType::BF16, 30),
];

impl GgmlType {
    /// The weight types pagedlm computes with, in ggml's id order (the types of `SUPPORTED_IDS`).
    pub const SUPPORTED: [GgmlType; SUPPORTED_IDS.len()] = {
        let mut types = [GgmlType::F32; SUPPORTED_IDS.len()];
        let mut i = 0;
        while i < types.len() {
            types[i] = SUPPORTED_IDS[i].0;
            i += 1;
        }
        types
    };

    pub fn from_u32(v: u32) -> GgmlType {
        SUPPORTED_IDS.iter().find(|&&(_, id)| id == v).map_or(GgmlType::Other(v), |&(t, _)| t)
    }

    /// The id ggml uses for this type.
    pub fn to_u32(&self) -> u32 {
        match self {
            GgmlType::Other(v) => *v,
            known => match SUPPORTED_IDS.iter().find(|(t, _)| t == known) {
                Some(&(_, id)) => id,
                None => unreachable!("every variant but Other is in SUPPORTED_IDS"),
            },
        }
    }

    /// The type ggml calls `name` ("Q4_K", "BF16", ...; any case).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::SUPPORTED.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether pagedlm computes with this type (one of [`GgmlType::SUPPORTED`]).
    pub fn is_supported(&self) -> bool {
        !matches!(self, GgmlType::Other(_))
    }

    /// ggml's name for the type ("Q4_1", "Q5_K", ...), or "type N" for an id ggml does not know.
    pub fn name(&self) -> String {
        // Ids 4, 5 (Q4_2, Q4_3), 31-33 and 36-38 (repacked variants) were removed from ggml;
        // files never store them.
        let known = match self.to_u32() {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            other => return format!("type {other}"),
        };
        known.to_string()
    }

    /// (values per block, bytes per block) as ggml defines them, for every type ggml can store
    /// (so that a file holding an unsupported type still parses and is refused by tensor name);
    /// `None` for an id ggml does not know.
    pub fn block_size(&self) -> Option<(u64, u64)> {
        Some(match self.to_u32() {
            0 => (1, 4),
            1 | 30 => (1, 2),
            2 => (32, 18),
            3 => (32, 20),
            6 => (32, 22),
            7 => (32, 24),
            8 => (32, 34),
            9 => (32, 36),
            10 => (256, 84),
            11 => (256, 110),
            12 => (256, 144),
            13 => (256, 176),
            14 => (256, 210),
            15 => (256, 292),
            16 => (256, 66),
            17 => (256, 74),
            18 => (256, 98),
            19 => (256, 50),
            20 => (32, 18),
            21 => (256, 110),
            22 => (256, 82),
            23 => (256, 136),
            24 => (1, 1),
            25 => (1, 2),
            26 => (1, 4),
            27 | 28 => (1, 8),
            29 => (256, 56),
            34 => (256, 54),
            35 => (256, 66),
            39 => (32, 17),
            _ => return None,
        })
    }
}

/// One metadata value. Array elements all have one GGUF type (nested arrays may differ inside).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// Any unsigned integer, or a signed one that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer as i64 (a u64 above `i64::MAX` gives `None`).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v as i64),
            MetaValue::U16(v) => Some(v as i64),
            MetaValue::U32(v) => Some(v as i64),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any numeric value (integers and floats; not bools).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            MetaValue::U64(v) => Some(v as f64),
            MetaValue::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }

    /// The GGUF value-type id of this value.
    pub fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::String(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }
}

/// Fewest bytes one value of GGUF type `type_id` takes in a file (`None`: no such type).
/// Used to bound array counts by the bytes left before allocating.
fn min_encoded_size(type_id: u32) -> Option<u64> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8,     // u64 length, possibly empty
        9 => 4 + 8, // element type and count of an empty array
        _ => return None,
    })
}

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` = ne0 is the innermost (a matrix's input features).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset relative to the data section.
    pub offset: u64,
    /// Bytes of data, from dims and the type's block size; 0 for `Other` types, whose size
    /// pagedlm cannot compute (such tensors are not bounds-checked and cannot be required).
    pub size_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of dims; overflow was ruled out in parse).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).unwrap_or(u64::MAX)
    }

    fn block_size_known(&self) -> bool {
        self.ggml_type.block_size().is_some()
    }
}

/// Errors reading a GGUF file. Positions are byte offsets into the file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file: the first 4 bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    #[error("GGUF version {0} is not supported (pagedlm reads versions 2 and 3; re-convert the model with a recent llama.cpp)")]
    UnsupportedVersion(u32),
    #[error("this GGUF file is big-endian (version field {0:#010x}); pagedlm reads little-endian files only")]
    BigEndian(u32),
    #[error("truncated at byte {at} while reading {context}: needed {needed} bytes, {available} left")]
    Truncated { at: u64, context: String, needed: u64, available: u64 },
    #[error("{what} at byte {at} is {value}, more than the limit {limit}")]
    TooLarge { what: String, at: u64, value: u64, limit: u64 },
    #[error("invalid UTF-8 in {context} at byte {at}")]
    InvalidUtf8 { at: u64, context: String },
    #[error("unknown metadata value type {type_id} at byte {at} in {context}")]
    UnknownValueType { type_id: u32, at: u64, context: String },
    #[error("invalid bool value {value} at byte {at} in {context}")]
    InvalidBool { value: u8, at: u64, context: String },
    #[error("arrays nested more than {limit} deep at byte {at} in {context}")]
    NestingTooDeep { at: u64, limit: usize, context: String },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("tensor {0} appears twice")]
    DuplicateTensor(String),
    #[error("general.alignment is {found}; it must be a nonzero power of two")]
    BadAlignment { found: String },
    #[error("tensor {name} has an invalid shape {dims:?}: {reason}")]
    BadShape { name: String, dims: Vec<u64>, reason: String },
    #[error("tensor {name} at offset {offset} is not aligned to {alignment} bytes")]
    MisalignedTensor { name: String, offset: u64, alignment: u64 },
    #[error("tensor {name} (data offset {offset}, {size} bytes, data section at byte {data_offset}) lies past the end of the {file_len}-byte file")]
    TensorOutOfBounds { name: String, offset: u64, size: u64, data_offset: u64, file_len: u64 },
    #[error("tensor {name} has type {type_name}, which pagedlm does not support")]
    UnsupportedTensorType { name: String, type_name: String },
    #[error("metadata key {0} is missing")]
    MissingKey(String),
    #[error("metadata key {key} has type {found}, expected {expected}")]
    WrongType { key: String, expected: String, found: String },
    #[error("metadata key {key} is {value}, which does not fit in {target}")]
    OutOfRange { key: String, value: String, target: String },
    #[error("tensor {0} is missing")]
    MissingTensor(String),
    /// From the test-support writer (`synth::GgufWriter`, `testing` feature).
    #[error("cannot write GGUF: {0}")]
    InvalidWrite(String),
}

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

/// A parsed GGUF file borrowing its bytes; tensor data are views into them.
#[derive(Clone)]
pub struct Gguf<'a> {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    /// File offset of the data section (tensor offsets are relative to it).
    pub data_offset: u64,
    bytes: &'a [u8],
}

// By hand, so printing a parsed model does not dump its bytes.
impl std::fmt::Debug for Gguf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .field("file_len", &self.bytes.len())
            .finish()
    }
}

impl<'a> Gguf<'a> {
    /// Parses and validates header, metadata and tensor infos. On success every tensor of a
    /// known type has an aligned offset and its whole data range inside `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Gguf<'a>, GgufError> {
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
        let file_len = bytes.len() as u64;
        for t in &tensors {
            if t.block_size_known() {
                check_tensor_range(t, alignment, data_offset, file_len)?;
            }
        }
        Ok(Gguf { version, alignment, metadata, tensors, data_offset, bytes })
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| wrong_type(key, "a non-negative integer", v))
    }

    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.get_u64(key)?;
        u32::try_from(v).map_err(|_| GgufError::OutOfRange { key: key.to_string(), value: v.to_string(), target: "u32".into() })
    }

    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f64().map(|f| f as f32).ok_or_else(|| wrong_type(key, "a number", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| wrong_type(key, "a bool", v))
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong_type(key, "a string", v))
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let v = self.require(key)?;
        let arr = v.as_array().ok_or_else(|| wrong_type(key, "an array of strings", v))?;
        arr.iter().map(|e| e.as_str().ok_or_else(|| wrong_array_type(key, "an array of strings", e))).collect()
    }

    /// Any integer array, each value converted to i32 (out-of-range values are an error).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        let v = self.require(key)?;
        let arr = v.as_array().ok_or_else(|| wrong_type(key, "an array of integers", v))?;
        arr.iter()
            .map(|e| {
                let i = e.as_i64().ok_or_else(|| {
                    // A u64 above i64::MAX is an integer, just too large.
                    if let MetaValue::U64(u) = e {
                        GgufError::OutOfRange { key: key.to_string(), value: u.to_string(), target: "i32".into() }
                    } else {
                        wrong_array_type(key, "an array of integers", e)
                    }
                })?;
                i32::try_from(i).map_err(|_| GgufError::OutOfRange { key: key.to_string(), value: i.to_string(), target: "i32".into() })
            })
            .collect()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor's bytes, borrowed from the file. Bounds were checked in `parse` for every
    /// tensor of a known type; a `TensorInfo` not from this file, or of an `Other` type
    /// (size unknown, 0), gives the in-bounds part of its range, possibly empty.
    pub fn tensor_data(&self, info: &TensorInfo) -> &'a [u8] {
        let bytes: &'a [u8] = self.bytes;
        let range = self
            .data_offset
            .checked_add(info.offset)
            .and_then(|start| Some((start, start.checked_add(info.size_bytes)?)))
            .and_then(|(s, e)| Some((usize::try_from(s).ok()?, usize::try_from(e).ok()?)));
        match range {
            Some((s, e)) => bytes.get(s..e).unwrap_or(&[]),
            None => &[],
        }
    }

    /// The named tensor and its bytes, if its type is one of `allowed`.
    pub fn require_tensor(&self, name: &str, allowed: &[GgmlType]) -> Result<(&TensorInfo, &'a [u8]), GgufError> {
        let info = self.tensor(name).ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        if !allowed.contains(&info.ggml_type) || !info.ggml_type.is_supported() {
            return Err(GgufError::UnsupportedTensorType { name: name.to_string(), type_name: info.ggml_type.name() });
        }
        Ok((info, self.tensor_data(info)))
    }

    /// The whole file this view borrows.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// How many tensors the file holds of each type, by ggml's type name: SmolLM2's Q4_1 file
    /// gives `{"F32": 61, "Q4_1": 210, "Q8_0": 1}`.
    pub fn tensor_type_counts(&self) -> BTreeMap<String, u32> {
        let mut counts = BTreeMap::new();
        for t in &self.tensors {
            *counts.entry(t.ggml_type.name()).or_insert(0) += 1;
        }
        counts
    }
}

fn check_count(what: &str, at: u64, value: u64, limit: u64) -> Result<(), GgufError> {
    if value > limit {
        return Err(GgufError::TooLarge { what: what.into(), at, value, limit });
    }
    Ok(())
}

fn wrong_type(key: &str, expected: &str, found: &MetaValue) -> GgufError {
    GgufError::WrongType { key: key.to_string(), expected: expected.to_string(), found: found.type_name().to_string() }
}

fn wrong_array_type(key: &str, expected: &str, element: &MetaValue) -> GgufError {
    GgufError::WrongType { key: key.to_string(), expected: expected.to_string(), found: format!("an array of {}", element.type_name()) }
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
    Ok(TensorInfo { name, dims, ggml_type, offset, size_bytes })
}

/// Bytes of a tensor of `ggml_type` with GGUF-order `dims`: `Ok(None)` for `Other` types (size
/// unknown), `Err(reason)` for a shape ggml cannot store (a dimension above i64::MAX, an
/// overflowing size, ne0 not a whole number of blocks).
pub(crate) fn tensor_size_bytes(dims: &[u64], ggml_type: GgmlType) -> Result<Option<u64>, String> {
    // ggml stores dims as int64.
    if dims.iter().any(|&d| d > i64::MAX as u64) {
        return Err("a dimension exceeds i64::MAX".into());
    }
    let n_elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).ok_or_else(|| "the element count overflows 64 bits".to_string())?;
    let Some((block_values, block_bytes)) = ggml_type.block_size() else {
        return Ok(None);
    };
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % block_values != 0 {
        return Err(format!("ne0 = {ne0} is not a multiple of {block_values}, the {} block size", ggml_type.name()));
    }
    (n_elements / block_values).checked_mul(block_bytes).map(Some).ok_or_else(|| "the byte size overflows 64 bits".to_string())
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
