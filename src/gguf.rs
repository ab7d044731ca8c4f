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

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

mod header;
mod source;
mod split;

use header::{read_header, Header};

#[cfg(unix)]
pub use source::DiskFile;
pub use source::{Prefix, ReadAhead, ReadAt};
pub use split::{part_names, split_part_name, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS};

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
    /// Which file of a split model holds it (0 for a model in one file), its `offset` relative
    /// to that file's data section.
    pub file: u32,
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
    /// The model's bytes could not be read from where they come from.
    #[error("reading the model failed: {0}")]
    Read(String),
    /// The header goes on past the bytes at hand ([`Prefix`]): read `bytes` of the file's start.
    #[error("the GGUF header goes on past the file's first bytes at hand: {bytes} are needed")]
    NeedMore { bytes: u64 },
    /// A split model's parts do not make one model.
    #[error("split model: {0}")]
    Split(String),
    /// From the test-support writer (`synth::GgufWriter`, `testing` feature).
    #[error("cannot write GGUF: {0}")]
    InvalidWrite(String),
}

/// The most bytes a header (metadata and tensor infos) may take: real ones take a few MB (a
/// 262k-token vocabulary with its scores ~10 MB), so a lying count cannot make the reader pull
/// a whole multi-GB file into memory looking for the header's end.
pub const MAX_HEADER_BYTES: u64 = 256 << 20;

/// The most bytes one read asks of a source.
pub const READ_PIECE_BYTES: usize = 64 << 20;

/// One file of a model and where its data section starts.
#[derive(Clone, Copy)]
struct File<'a> {
    source: Src<'a>,
    data_offset: u64,
}

/// A file's bytes: in memory for the model's lifetime, or read on demand.
#[derive(Clone, Copy)]
enum Src<'a> {
    Bytes(&'a [u8]),
    Reader(&'a dyn ReadAt),
}

impl<'a> Src<'a> {
    fn size(&self) -> u64 {
        match self {
            Src::Bytes(b) => b.len() as u64,
            Src::Reader(r) => r.size(),
        }
    }

    /// Reads in pieces of at most [`READ_PIECE_BYTES`], so that a source never has to produce a
    /// whole large tensor at once (a browser reads each piece into a buffer of its own).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        match self {
            Src::Bytes(b) => b.read_at(offset, buf),
            Src::Reader(r) => {
                let mut at = offset;
                for piece in buf.chunks_mut(READ_PIECE_BYTES) {
                    r.read_at(at, piece)?;
                    at += piece.len() as u64;
                }
                Ok(())
            }
        }
    }

    fn borrow(&self, offset: u64, len: u64) -> Option<&'a [u8]> {
        match *self {
            Src::Bytes(b) => b.borrow(offset, len),
            Src::Reader(r) => r.borrow(offset, len),
        }
    }
}

/// A parsed GGUF model: its header, and its tensors' data read from its file (or the files of a
/// split model) on demand, borrowed where the file is in memory.
#[derive(Clone)]
pub struct Gguf<'a> {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    /// File offset of the data section (tensor offsets are relative to it); of the first file
    /// for a split model.
    pub data_offset: u64,
    files: Vec<File<'a>>,
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
            .field("file_len", &self.file_size())
            .finish()
    }
}

impl<'a> Gguf<'a> {
    /// Parses and validates header, metadata and tensor infos. On success every tensor of a
    /// known type has an aligned offset and its whole data range inside `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Gguf<'a>, GgufError> {
        let header = Header::parse(bytes, bytes.len() as u64)?;
        Ok(Gguf::of(header, vec![Src::Bytes(bytes)]))
    }

    /// Opens a model from its files: one, or the parts of a split model in order (llama.cpp's
    /// `gguf-split`: `name-00001-of-00003.gguf`, ...), each read by ranges. Reads each header
    /// (1 MiB first, more while it goes on), never the tensors' data.
    pub fn open(files: &[&'a dyn ReadAt]) -> Result<Gguf<'a>, GgufError> {
        let mut headers = Vec::with_capacity(files.len());
        for &file in files {
            headers.push(read_header(file)?);
        }
        split::check_parts(&headers.iter().map(|h| h.metadata.as_slice()).collect::<Vec<_>>())?;
        let mut parts = headers.into_iter();
        let Some(mut header) = parts.next() else {
            return Err(GgufError::Split("no file given".into()));
        };
        let mut data_offsets = vec![header.data_offset];
        for (i, part) in (1u32..).zip(parts) {
            let mut names: HashSet<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
            if let Some(t) = part.tensors.iter().find(|t| !names.insert(t.name.as_str())) {
                return Err(GgufError::DuplicateTensor(t.name.clone()));
            }
            header.tensors.extend(part.tensors.into_iter().map(|t| TensorInfo { file: i, ..t }));
            data_offsets.push(part.data_offset);
        }
        split::check_tensor_count(&header.metadata, header.tensors.len())?;
        let mut gguf = Gguf::of(header, files.iter().map(|&r| Src::Reader(r)).collect());
        for (file, offset) in gguf.files.iter_mut().zip(data_offsets) {
            file.data_offset = offset;
        }
        Ok(gguf)
    }

    /// How many of the file's first bytes its header needs when `source` holds fewer than that
    /// ([`Prefix`]: a header read before a download); `None` when it holds the whole header.
    pub fn header_need(source: &dyn ReadAt) -> Result<Option<u64>, GgufError> {
        match read_header(source) {
            Ok(_) => Ok(None),
            Err(GgufError::NeedMore { bytes }) => Ok(Some(bytes)),
            Err(e) => Err(e),
        }
    }

    fn of(h: Header, sources: Vec<Src<'a>>) -> Gguf<'a> {
        let files = sources.into_iter().map(|source| File { source, data_offset: h.data_offset }).collect();
        Gguf { version: h.version, alignment: h.alignment, metadata: h.metadata, tensors: h.tensors, data_offset: h.data_offset, files }
    }

    /// Bytes of the model's files together.
    pub fn file_size(&self) -> u64 {
        self.files.iter().map(|f| f.source.size()).sum()
    }

    /// Where `len` bytes at `start` within `info`'s data lie: its file and the file offset,
    /// if the range lies within the tensor.
    fn locate(&self, info: &TensorInfo, start: u64, len: u64) -> Option<(File<'a>, u64)> {
        let file = *self.files.get(info.file as usize)?;
        if start.checked_add(len)? > info.size_bytes {
            return None;
        }
        Some((file, file.data_offset.checked_add(info.offset)?.checked_add(start)?))
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

    /// The tensor's bytes where the file is in memory (a model parsed from its bytes); empty
    /// for a file read on demand (use [`Gguf::read_tensor`]). Bounds were checked in `parse` for
    /// every tensor of a known type; a `TensorInfo` not from this file, or of an `Other` type
    /// (size unknown, 0), gives the in-bounds part of its range, possibly empty.
    pub fn tensor_data(&self, info: &TensorInfo) -> &'a [u8] {
        self.locate(info, 0, info.size_bytes).and_then(|(file, at)| file.source.borrow(at, info.size_bytes)).unwrap_or(&[])
    }

    /// The tensor's bytes: borrowed where the file is in memory, read otherwise.
    pub fn read_tensor(&self, info: &TensorInfo) -> Result<Cow<'a, [u8]>, GgufError> {
        self.read_range(info, 0, info.size_bytes)
    }

    /// `len` bytes of the tensor's data from byte `start` of it: borrowed where the file is in
    /// memory, read otherwise.
    pub fn read_range(&self, info: &TensorInfo, start: u64, len: u64) -> Result<Cow<'a, [u8]>, GgufError> {
        let (file, at) = self.locate(info, start, len).ok_or_else(|| out_of_tensor(info, start, len))?;
        if let Some(bytes) = file.source.borrow(at, len) {
            return Ok(Cow::Borrowed(bytes));
        }
        let mut buf = vec![0u8; usize::try_from(len).map_err(|_| out_of_tensor(info, start, len))?];
        file.source.read_at(at, &mut buf).map_err(|e| GgufError::Read(format!("tensor {}: {e}", info.name)))?;
        Ok(Cow::Owned(buf))
    }

    /// Fills `buf` with the tensor's bytes from byte `start` of it (straight into the memory
    /// that keeps them: no copy on the way).
    pub fn read_into(&self, info: &TensorInfo, start: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        let len = buf.len() as u64;
        let (file, at) = self.locate(info, start, len).ok_or_else(|| out_of_tensor(info, start, len))?;
        file.source.read_at(at, buf).map_err(|e| GgufError::Read(format!("tensor {}: {e}", info.name)))
    }

    /// The named tensor, if its type is one of `allowed`.
    pub fn require_tensor(&self, name: &str, allowed: &[GgmlType]) -> Result<&TensorInfo, GgufError> {
        let info = self.tensor(name).ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        if !allowed.contains(&info.ggml_type) || !info.ggml_type.is_supported() {
            return Err(GgufError::UnsupportedTensorType { name: name.to_string(), type_name: info.ggml_type.name() });
        }
        Ok(info)
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

fn out_of_tensor(info: &TensorInfo, start: u64, len: u64) -> GgufError {
    GgufError::Read(format!("bytes {start}..{} are outside tensor {} ({} bytes)", start.saturating_add(len), info.name, info.size_bytes))
}

fn wrong_type(key: &str, expected: &str, found: &MetaValue) -> GgufError {
    GgufError::WrongType { key: key.to_string(), expected: expected.to_string(), found: found.type_name().to_string() }
}

fn wrong_array_type(key: &str, expected: &str, element: &MetaValue) -> GgufError {
    GgufError::WrongType { key: key.to_string(), expected: expected.to_string(), found: format!("an array of {}", element.type_name()) }
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
