//! KV snapshots: a sequence's token ids and the K/V of its blocks as bytes, to move a cached
//! conversation between engines (prefill on one, decode on another) or keep it across a page
//! reload.
//!
//! ## Format (version 1, little-endian)
//! ```text
//! magic    8 bytes  "PGLMKV\0\x01"
//! version  u32      1
//! hlen     u32      length of the header
//! header   hlen     JSON: {model (fingerprint, 16 hex digits), dtype, layout, block_size,
//!                          n_layers, n_kv_heads, head_dim, n_tokens, n_blocks, block_bytes,
//!                          window and local_layers (only when the model has windowed layers)}
//! tokens   4 · n_tokens   u32 ids
//! data     per block, per layer, K then V, each the block's regions of that layer's buffer in
//!          the pool's own encoding (f32 values, or INT8 codes then scales), block_bytes each;
//!          a local (windowed) layer's blocks before `WindowRule::first_needed_block(n_tokens)`
//!          are left out: the cache no longer holds them and no later query reads them
//! checksum u64      FNV-1a of every byte before it
//! ```
//! A block is the unit: the last one may be partly filled (its unused slots travel as they are
//! and are never read, since attention stops at the sequence length). Reading a snapshot checks
//! the magic, version, checksum, every length, and that the header matches the importing cache's
//! [`CacheKey`] and shape; any mismatch is a typed error and changes nothing.

use crate::gpu::Context;

use super::pool::KvPool;
use super::radix::{CacheKey, NO_BLOCK};
use super::window::WindowRule;
use super::{KvDtype, KvError, KvLayout, KvShape};

const MAGIC: &[u8; 8] = b"PGLMKV\0\x01";
pub const VERSION: u32 = 1;

/// Why a snapshot was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SnapshotError {
    #[error("not a pagedlm KV snapshot (bad magic)")]
    NotASnapshot,
    #[error("snapshot version {0} is not supported (this build reads version {VERSION})")]
    Version(u32),
    #[error("the snapshot is truncated or has trailing bytes: {0}")]
    Length(String),
    #[error("the snapshot is corrupted (checksum mismatch)")]
    Checksum,
    #[error("the snapshot's header is invalid: {0}")]
    Header(String),
    #[error("the snapshot was made for {what} {got}, this engine has {want}")]
    Mismatch { what: &'static str, got: String, want: String },
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Header {
    model: String,
    dtype: KvDtype,
    layout: KvLayout,
    block_size: u32,
    n_layers: u32,
    n_kv_heads: u32,
    head_dim: u32,
    n_tokens: u32,
    n_blocks: u32,
    block_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    window: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    local_layers: u64,
}

fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// One layer's K/V as a snapshot reads or writes it: the pool of the layer's block group, the
/// layer's buffer index in that pool, and the sequence's blocks in that group in logical order
/// ([`NO_BLOCK`] where the group no longer holds one).
pub struct LayerBlocks<'a> {
    pub pool: &'a KvPool,
    pub buffer: usize,
    pub blocks: &'a [u32],
}

/// The (layer, physical block) pairs whose K/V a snapshot carries, in its order: block-major,
/// then layer, skipping blocks a group does not hold.
fn units<'a>(layers: &'a [LayerBlocks<'a>]) -> impl Iterator<Item = (&'a LayerBlocks<'a>, u32)> + 'a {
    let n_blocks = layers.first().map_or(0, |l| l.blocks.len());
    (0..n_blocks).flat_map(move |i| layers.iter().map(move |l| (l, l.blocks[i]))).filter(|&(_, b)| b != NO_BLOCK)
}

/// A parsed, verified snapshot.
pub struct Snapshot<'a> {
    pub tokens: Vec<u32>,
    /// The K and V regions of each unit (see [`units`]), `block_bytes` each.
    data: &'a [u8],
}

/// The byte ranges of one block in one layer's K (or V) buffer, in order.
pub fn block_regions(pool: &KvPool, block: u32) -> Vec<(u64, u64)> {
    match pool.int8_layout() {
        None => {
            let bytes = pool.n_kv_heads as u64 * pool.block_size as u64 * pool.head_dim as u64 * 4;
            vec![(block as u64 * bytes, bytes)]
        }
        // The codes, then the scales.
        Some(layout) => layout.block_ranges(block).to_vec(),
    }
}

fn block_bytes(pool: &KvPool) -> u64 {
    block_regions(pool, 0).iter().map(|r| r.1).sum()
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn header_for(pool: &KvPool, key: &CacheKey, shape: &KvShape, n_tokens: u32, n_blocks: u32) -> Header {
    Header {
        model: format!("{:016x}", key.model),
        dtype: key.dtype,
        layout: key.layout,
        block_size: key.block_size,
        n_layers: shape.n_layers,
        n_kv_heads: pool.n_kv_heads,
        head_dim: pool.head_dim,
        n_tokens,
        n_blocks,
        block_bytes: block_bytes(pool),
        window: if shape.windowed() { shape.window } else { 0 },
        local_layers: if shape.windowed() { shape.local_layers } else { 0 },
    }
}

/// How many (layer, block) units a snapshot of `n_tokens` carries for `shape`.
fn unit_count(shape: &KvShape, block_size: u32, n_tokens: u32) -> u64 {
    let n_blocks = n_tokens.div_ceil(block_size) as u64;
    let n_local = shape.n_local() as u64;
    let local_blocks = if n_local == 0 {
        0
    } else {
        let rule = WindowRule { window: shape.window, block_size };
        n_blocks - (rule.first_needed_block(n_tokens) as u64).min(n_blocks)
    };
    n_blocks * (shape.n_layers as u64 - n_local) + local_blocks * n_local
}

/// Reads the blocks of `layers` (holding `tokens`, in order) back from the GPU and serializes
/// them: copies of every region into staging buffers, one map each.
pub async fn export(ctx: Option<&Context>, layers: &[LayerBlocks<'_>], key: &CacheKey, shape: &KvShape, tokens: &[u32]) -> Result<Vec<u8>, KvError> {
    let pool = layers.first().map(|l| l.pool).ok_or_else(|| KvError::Internal("a snapshot of no layers".into()))?;
    let n_blocks = (tokens.len() as u64).div_ceil(pool.block_size as u64);
    if layers.iter().any(|l| l.blocks.len() as u64 != n_blocks) {
        return Err(KvError::Internal(format!("{} tokens cannot live in the layers' blocks of {}", tokens.len(), pool.block_size)));
    }
    let bb = block_bytes(pool);
    if bb == 0 {
        return Err(KvError::NotAvailable(format!("snapshots of a {} pool", pool.dtype.name())));
    }
    let all: Vec<(&LayerBlocks<'_>, u32)> = units(layers).collect();
    if all.len() as u64 != unit_count(shape, pool.block_size, tokens.len() as u32) {
        return Err(KvError::Internal(format!(
            "{} layer blocks held where the window rule wants {}",
            all.len(),
            unit_count(shape, pool.block_size, tokens.len() as u32)
        )));
    }
    let total = all.len() as u64 * 2 * bb;
    let mut data = Vec::with_capacity(total as usize);
    let Some(ctx) = ctx else {
        // A pool in CPU memory: the regions are read where they are.
        for &(layer, b) in &all {
            let host = layer.pool.host.as_ref().ok_or_else(|| KvError::Internal("a GPU pool without its device".into()))?;
            let (k, v) = host.lock(layer.buffer);
            for words in [&*k, &*v] {
                for (offset, len) in block_regions(layer.pool, b) {
                    data.extend_from_slice(bytemuck::cast_slice(&words[(offset / 4) as usize..((offset + len) / 4) as usize]));
                }
            }
        }
        return serialize(pool, (key, shape), tokens, n_blocks, &data);
    };
    if total > 0 {
        // Stage in pieces no larger than the device allows for one buffer.
        let limit = (ctx.limits.max_buffer_size / 2).max(bb * 2);
        let per_piece = (limit / (bb * 2)).max(1) as usize;
        for piece in all.chunks(per_piece) {
            let size = piece.len() as u64 * 2 * bb;
            let staging = ctx.staging("kv.snapshot.staging", size);
            let mut encoder = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kv.export") });
            let mut at = 0u64;
            for &(layer, b) in piece {
                for buf in [&layer.pool.k[layer.buffer], &layer.pool.v[layer.buffer]] {
                    for (offset, len) in block_regions(layer.pool, b) {
                        encoder.copy_buffer_to_buffer(buf, offset, &staging, at, len);
                        at += len;
                    }
                }
            }
            ctx.submit(Some(encoder.finish()));
            let bytes = ctx.map_staging_range(&staging, size).await.map_err(|e| KvError::Internal(e.to_string()))?;
            data.extend_from_slice(&bytes);
        }
    }
    serialize(pool, (key, shape), tokens, n_blocks, &data)
}

/// The snapshot's bytes: magic, version, header, tokens, the K/V `data`, checksum.
fn serialize(pool: &KvPool, (key, shape): (&CacheKey, &KvShape), tokens: &[u32], n_blocks: u64, data: &[u8]) -> Result<Vec<u8>, KvError> {
    let header = serde_json::to_vec(&header_for(pool, key, shape, tokens.len() as u32, n_blocks as u32)).map_err(|e| KvError::Internal(e.to_string()))?;
    let mut out = Vec::with_capacity(24 + header.len() + tokens.len() * 4 + data.len() + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    tokens.iter().for_each(|t| out.extend_from_slice(&t.to_le_bytes()));
    out.extend_from_slice(data);
    let sum = fnv(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// Parses and verifies `bytes` against the importing cache: a pool of it (dtype and block
/// format), its cache key and its shape (layers and window).
pub fn parse<'a>(bytes: &'a [u8], pool: &KvPool, key: &CacheKey, shape: &KvShape, vocab: u32) -> Result<Snapshot<'a>, SnapshotError> {
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    if bytes.len() < 16 + 8 {
        return Err(SnapshotError::Length(format!("{} bytes is shorter than any snapshot", bytes.len())));
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let version = u32_at(8);
    if version != VERSION {
        return Err(SnapshotError::Version(version));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if fnv(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err(SnapshotError::Checksum);
    }
    let hlen = u32_at(12) as usize;
    let header_end = 16usize.checked_add(hlen).filter(|&e| e <= body.len()).ok_or_else(|| SnapshotError::Length("the header runs past the end".into()))?;
    let h: Header = serde_json::from_slice(&body[16..header_end]).map_err(|e| SnapshotError::Header(e.to_string()))?;
    let want = header_for(pool, key, shape, h.n_tokens, h.n_blocks);
    let checks: [(&'static str, String, String); 10] = [
        ("model", h.model.clone(), want.model.clone()),
        ("KV dtype", h.dtype.name().into(), want.dtype.name().into()),
        ("KV layout", format!("{:?}", h.layout).to_lowercase(), format!("{:?}", want.layout).to_lowercase()),
        ("block size", h.block_size.to_string(), want.block_size.to_string()),
        ("layer count", h.n_layers.to_string(), want.n_layers.to_string()),
        ("KV head count", h.n_kv_heads.to_string(), want.n_kv_heads.to_string()),
        ("head dimension", h.head_dim.to_string(), want.head_dim.to_string()),
        ("block bytes", h.block_bytes.to_string(), want.block_bytes.to_string()),
        ("sliding window", h.window.to_string(), want.window.to_string()),
        ("local layer mask", format!("{:#x}", h.local_layers), format!("{:#x}", want.local_layers)),
    ];
    for (what, got, want) in checks {
        if got != want {
            return Err(SnapshotError::Mismatch { what, got, want });
        }
    }
    if h.n_tokens == 0 || h.n_blocks as u64 != (h.n_tokens as u64).div_ceil(h.block_size.max(1) as u64) {
        return Err(SnapshotError::Header(format!("{} tokens in {} blocks of {}", h.n_tokens, h.n_blocks, h.block_size)));
    }
    let tokens_end = (h.n_tokens as u64 * 4)
        .checked_add(header_end as u64)
        .filter(|&e| e <= body.len() as u64)
        .ok_or_else(|| SnapshotError::Length("the token ids run past the end".into()))? as usize;
    let tokens: Vec<u32> = body[header_end..tokens_end].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    if let Some(t) = tokens.iter().find(|&&t| t >= vocab) {
        return Err(SnapshotError::Header(format!("token id {t} is outside the vocabulary of {vocab}")));
    }
    let data_len = unit_count(shape, h.block_size, h.n_tokens) * 2 * h.block_bytes;
    if (body.len() - tokens_end) as u64 != data_len {
        return Err(SnapshotError::Length(format!("{} bytes of K/V where {data_len} were expected", body.len() - tokens_end)));
    }
    Ok(Snapshot { tokens, data: &body[tokens_end..] })
}

impl Snapshot<'_> {
    /// Uploads the snapshot's K/V into the blocks of `layers` (a sequence holding exactly the
    /// blocks the window rule keeps for its tokens, as [`parse`] checked the data has).
    /// `ctx`: the device of a GPU pool, `None` for a pool in CPU memory.
    pub fn upload(&self, ctx: Option<&Context>, layers: &[LayerBlocks<'_>]) -> Result<(), KvError> {
        let mut at = 0usize;
        for (layer, b) in units(layers) {
            for which in 0..2 {
                for (offset, len) in block_regions(layer.pool, b) {
                    let bytes =
                        self.data.get(at..at + len as usize).ok_or_else(|| KvError::Internal("the snapshot holds fewer blocks than the sequence".into()))?;
                    match (ctx, &layer.pool.host) {
                        (_, Some(host)) => {
                            let (mut k, mut v) = host.lock(layer.buffer);
                            let words = if which == 0 { &mut *k } else { &mut *v };
                            let at_word = (offset / 4) as usize;
                            bytemuck::cast_slice_mut::<u32, u8>(&mut words[at_word..at_word + (len / 4) as usize]).copy_from_slice(bytes);
                        }
                        (Some(ctx), None) => {
                            let buf = if which == 0 { &layer.pool.k[layer.buffer] } else { &layer.pool.v[layer.buffer] };
                            ctx.queue.write_buffer(buf, offset, bytes);
                        }
                        (None, None) => return Err(KvError::Internal("a GPU pool without its device".into())),
                    }
                    at += len as usize;
                }
            }
        }
        if at != self.data.len() {
            return Err(KvError::Internal("the snapshot holds more blocks than the sequence".into()));
        }
        Ok(())
    }
}
