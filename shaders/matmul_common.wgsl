// The prelude of the quantized matmul kernels (matmul_q4_1.wgsl, matmul_q8_0.wgsl, and
// matmul_blocks.wgsl after quant_common.wgsl and a quant_<type>.wgsl for every other type),
// prepended to each body, after act_common.wgsl and before the activation preludes, one of three
// combinations (src/gpu/shaders.rs): matmul_split.wgsl + matmul_x.wgsl (every invocation loads
// what it multiplies; split rows summed through workgroup memory), matmul_split_subgroup.wgsl +
// matmul_x.wgsl (split rows summed within a subgroup, real GPUs), or matmul_x_subgroup.wgsl alone
// (8 lanes of a subgroup load an activation block together, no split, CPU adapters), then the
// slots prelude (matmul_slots16.wgsl; matmul_slots32.wgsl in the `_wide` kernels of the first
// combination, see below):
// y[a, row_base + n] = Σ_k x[a, k] · W[n, k] for a < n_rows and n < rows, with W (one part of a
// QuantMatrix, src/gpu/ops/matmul/) repacked at upload so that the G rows of a row group lie side
// by side (G = 4, 8 for Q8_0; each body or quant prelude documents its block layout).
//
// w (binding 0, declared by each body): the repacked part; y: [n_rows, y_stride] f32;
// x: [n_rows, nb · 32] f32 (8 vec4 per block, as u32 bits), or with INT8 the activations quantized by
//    quantize_act.wgsl (or a norm that quantizes its output): [n_rows · nb · 3] vec4<u32> (32 int8
//    quants, then the scale and the exact sum).
//
// One invocation computes a tile of TM activation rows × TG row groups (TG · G output rows): every
// weight block is loaded and dequantized once per TM rows, every activation block once per TG
// groups (register tiling, no shared memory). Slot s of the tile is activation row t = s / TG
// against group j = s % TG, TM · TG ≤ MAX_SLOTS slots. The tile is written out slot by slot
// (`if (TM * TG > s)` on constants, `accumulate` and `run_tile` below) rather than as loops over
// s: a loop the compiler does not unroll indexes the accumulators dynamically, which lavapipe
// turns into a scatter and a gather per lane (measured 1.65× slower at TM = 8). Each body says
// what a slot is: its `State` (the TG groups' weight blocks and the activation block being
// multiplied), `load` (a block of each group), `slot` (one slot's sums, a `Sum`: a vec4 for G = 4,
// a mat2x4 for G = 8) and `finish_sum`. Slots 0..15 are written out here; slots 16..31 are in
// matmul_slots32.wgsl, which only the `_wide` kernels of the variant without shared loads or
// split sums include (SwiftShader's prefill, where activation loads cost as much as weight loads
// and 32-slot tiles load fewer words per product); every other kernel includes
// matmul_slots16.wgsl, so that no compiler is handed slots the kernel cannot reach (SwiftShader
// compiles them all). Where activation loads cost as much as weight loads
// (SwiftShader: no subgroups to share them, every storage load a gather over its 4 lanes) a
// squarer tile loads fewer words per product: at TM = 1 (decode) an f32 activation block is 32
// words against a Q4_1 group's 20. On lavapipe (Mesa 22) every
// storage load is a loop over the lanes of the SIMD group, each lane's words loaded one by one
// behind a bounds check, so what a kernel costs there is mostly the words each invocation loads,
// then the arithmetic. With KSPLIT > 1 (real GPUs) KSPLIT
// invocations split a group's blocks and sum their results, through workgroup memory
// (matmul_split.wgsl) or within a subgroup (matmul_split_subgroup.wgsl); CPU adapters use
// KSPLIT = 1, where the barriers are compiled out. The preludes say which invocations share a
// group (slot_of, k_lane_of) and how they sum (k_reduce). INT8 multiplies the quants with int8
// activations through dot4I8Packed (llama.cpp's trick): fewer words to load, but activations
// carry a rounding error of up to half a step of their block's scale.
//
// NORM is the input prologue, the RMSNorm before the matmul (so that it needs no dispatch of its
// own): the body multiplies x̂ = g ⊙ x / rms(x) with g = norm_w (binding 4, [nb · 32] f32) and
// rms(x) = sqrt(mean(x²) + eps) over the whole activation row. 1/rms(x) is one factor per row, so
// the body multiplies g ⊙ x (x_in) and finish scales the finished sums by it; the sum of squares
// is taken from the blocks the invocation loads anyway (every invocation walks the whole row, or
// its KSPLIT lanes share it and reduce it with their results), so the norm costs no extra pass
// over x, only the loads of g and a few multiplies per block. f32 activations only (INT8 reads
// activations quantized by the norm kernel, which then runs as a dispatch of its own).
//
// EPILOGUE says what is done with a result (store4), so that the kernel after a matmul need not
// run: 0 stores it; 1 adds it to y (the residual add, y = x of the block); 2 is the gated FFN:
// the part holds gate and up rows interleaved in fours (rows 4c..4c+3 = gate rows 2c, 2c+1, then
// up rows 2c, 2c+1; QuantMatrix::upload_gated), and y[a, (row_base + n) / 2 + j] = act(gate_j) ·
// up_j (act_common.wgsl, GELU picks the activation), y_stride being the FFN width.

struct Params {
    rows: u32,          // output features written (≤ G · groups)
    nb: u32,            // 32-value blocks per row (cols / 32)
    n_rows: u32,        // activation rows
    groups: u32,        // G-row groups in w
    wgs_per_tile: u32,  // workgroups covering every group for one tile of TM activation rows
    tiles: u32,         // ceil(n_rows / TM)
    y_stride: u32,      // f32 elements between rows of y
    row_base: u32,      // the column of y where this part's row 0 goes
    eps: f32,           // the prologue's RMSNorm epsilon (NORM)
}

@group(0) @binding(1) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> params: Params;
// The prologue's norm weight g (NORM), 8 vec4 per block; without NORM any buffer stands in.
@group(0) @binding(4) var<storage, read> norm_w: array<vec4<f32>>;

override WG: u32 = 16u;     // invocations per workgroup (a multiple of KSPLIT)
override KSPLIT: u32 = 1u;  // invocations sharing one group
override TM: u32 = 1u;      // activation rows per invocation
override TG: u32 = 1u;      // row groups per invocation (1, 2 or 4); TM · TG ≤ MAX_SLOTS
override INT8: bool = false;        // x holds int8-quantized activations
override EPILOGUE: u32 = 0u;        // 0 store, 1 add into y, 2 gated activation (see above)
override NORM: bool = false;        // the RMSNorm prologue (see above)
const MAX_TM: u32 = 16u;    // activation rows of a tile (MAX_SLOTS, the slots, is the slots prelude's)
const MAX_TG: u32 = 4u;

// Σ x² over the blocks of each tile row this invocation has loaded (NORM). Indexed by the tile
// row, a constant once the bodies' calls are inlined, so it stays in registers like the tile.
var<private> sumsq: array<f32, MAX_TM>;

// One 32-value block of an activation row, int8 (quantize_act.wgsl): values 0..15 in lo,
// 16..31 in hi, 4 per word; value ≈ d · q; s is the exact sum of the 32 inputs.
struct XInt8 {
    lo: vec4<u32>,
    hi: vec4<u32>,
    d: f32,
    s: f32,
}

// One 32-value block of an f32 activation row, 4 values per vec4 in order.
alias XF32 = array<vec4<f32>, 8>;

// Σ_j q_j · xq_j over a block of 32 int8 pairs: values 0..15 in (qlo, xlo), 16..31 in (qhi, xhi).
fn dot_block(qlo: vec4<u32>, qhi: vec4<u32>, xlo: vec4<u32>, xhi: vec4<u32>) -> i32 {
    return dot4I8Packed(qlo.x, xlo.x) + dot4I8Packed(qlo.y, xlo.y) + dot4I8Packed(qlo.z, xlo.z) + dot4I8Packed(qlo.w, xlo.w)
         + dot4I8Packed(qhi.x, xhi.x) + dot4I8Packed(qhi.y, xhi.y) + dot4I8Packed(qhi.z, xhi.z) + dot4I8Packed(qhi.w, xhi.w);
}

// Σ of the squares of the 32 values of a block.
fn block_sumsq(v: XF32) -> f32 {
    return ((dot(v[0], v[0]) + dot(v[1], v[1])) + (dot(v[2], v[2]) + dot(v[3], v[3])))
         + ((dot(v[4], v[4]) + dot(v[5], v[5])) + (dot(v[6], v[6]) + dot(v[7], v[7])));
}

// Block b of the tile's activation row a0 + t as a body multiplies it: x, or with NORM g ⊙ x
// (g: the norm weight's block b, g_f32), its squares added to the row's sum of squares.
fn x_in(it: Tile, t: u32, b: u32, g: XF32) -> XF32 {
    let v = x_f32(it, t, b);
    if (!NORM) {
        return v;
    }
    sumsq[t] += block_sumsq(v);
    return XF32(v[0] * g[0], v[1] * g[1], v[2] * g[2], v[3] * g[3], v[4] * g[4], v[5] * g[5], v[6] * g[6], v[7] * g[7]);
}

// Σ of the 32 values of a block.
fn block_sum(v: XF32) -> f32 {
    let s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    return (s.x + s.y) + (s.z + s.w);
}

// What an invocation computes.
struct Tile {
    tile: u32,     // its tile of TM activation rows
    lane: u32,     // its place among the KSPLIT invocations sharing a group
    g: u32,        // its first row group (of TG), possibly past the last one: out-of-range
                   // groups compute on the last one (group_at) and store nothing (no early
                   // return, so that every invocation reaches the barriers and the subgroup
                   // broadcasts)
    a0: u32,       // the first activation row of the (clamped) tile
    x_block: u32,  // vec4s per activation block
    x_lane: u32,   // its lane among the 8 that load an activation block together (matmul_x_subgroup)
    live: bool,    // it stores its results (those of its groups that exist)
}

fn tile_of(ids: Ids) -> Tile {
    var it: Tile;
    let linear = ids.wg.x + ids.wg.y * ids.nwg.x;
    // The group index is the fast one: consecutive workgroups share an activation tile.
    it.tile = linear / params.wgs_per_tile;
    it.lane = k_lane_of(ids);
    it.g = ((linear % params.wgs_per_tile) * (WG / KSPLIT) + slot_of(ids)) * TG;
    it.a0 = min(it.tile, params.tiles - 1u) * TM;
    it.x_block = select(8u, 3u, INT8);
    it.x_lane = x_lane_of(ids);
    it.live = it.tile < params.tiles && it.lane == 0u;
    return it;
}

// Row group j of the invocation's tile, clamped to the last group.
fn group_at(it: Tile, j: u32) -> u32 {
    return min(it.g + j, params.groups - 1u);
}

// The vec4 of x where block b of the tile's activation row a0 + t starts (the row clamped to the
// last one: a partial last tile computes on it and stores nothing).
fn x_at(it: Tile, t: u32, b: u32) -> u32 {
    return (min(it.a0 + t, params.n_rows - 1u) * params.nb + b) * it.x_block;
}

// A result and a sum of squares (NORM) summed over the KSPLIT invocations sharing a group.
struct Reduced {
    v: vec4<f32>,
    sumsq: f32,
}

// Output rows 4·quad..4·quad+3 of slot s's group (G rows, declared by the body) for its
// activation row a0 + s / TG: summed over the KSPLIT lanes (the activation prelude's k_reduce),
// scaled by the row's 1/rms with NORM, and stored by lane 0 (every invocation must call it:
// barriers or subgroup shuffles).
fn finish(it: Tile, lid: u32, s: u32, quad: u32, v: vec4<f32>) {
    let t = s / TG;
    let group = it.g + s % TG;
    let r = k_reduce(lid, it.lane, v, sumsq[t]);
    var sum = r.v;
    if (NORM) {
        // As rms_norm computes it: 1 / sqrt(mean + eps).
        sum *= 1.0 / sqrt(r.sumsq / f32(params.nb * 32u) + params.eps);
    }
    let a = it.a0 + t;
    if (it.live && group < params.groups && a < params.n_rows) {
        store4(a, group * G + quad * 4u, sum);
    }
}

// Adds every slot's sums over block b to acc (the body's `slot`, from what its `load` put in st).
fn accumulate(st: ptr<function, State>, acc: ptr<function, array<Sum, MAX_SLOTS>>, it: Tile, b: u32) {
    (*acc)[0] += slot(st, it, 0u, b);
    if (TM * TG > 1u) { (*acc)[1] += slot(st, it, 1u, b); }
    if (TM * TG > 2u) { (*acc)[2] += slot(st, it, 2u, b); }
    if (TM * TG > 3u) { (*acc)[3] += slot(st, it, 3u, b); }
    if (TM * TG > 4u) { (*acc)[4] += slot(st, it, 4u, b); }
    if (TM * TG > 5u) { (*acc)[5] += slot(st, it, 5u, b); }
    if (TM * TG > 6u) { (*acc)[6] += slot(st, it, 6u, b); }
    if (TM * TG > 7u) { (*acc)[7] += slot(st, it, 7u, b); }
    if (TM * TG > 8u) { (*acc)[8] += slot(st, it, 8u, b); }
    if (TM * TG > 9u) { (*acc)[9] += slot(st, it, 9u, b); }
    if (TM * TG > 10u) { (*acc)[10] += slot(st, it, 10u, b); }
    if (TM * TG > 11u) { (*acc)[11] += slot(st, it, 11u, b); }
    if (TM * TG > 12u) { (*acc)[12] += slot(st, it, 12u, b); }
    if (TM * TG > 13u) { (*acc)[13] += slot(st, it, 13u, b); }
    if (TM * TG > 14u) { (*acc)[14] += slot(st, it, 14u, b); }
    if (TM * TG > 15u) { (*acc)[15] += slot(st, it, 15u, b); }
    accumulate_wide(st, acc, it, b);
}

// The kernel of every body: each block's weights loaded for the TG groups, multiplied into every
// slot, the slots finished.
fn run_tile(ids: Ids) {
    let it = tile_of(ids);
    // Indexed by constants only, so the tile stays in registers (see above).
    var acc: array<Sum, MAX_SLOTS>;
    var st: State;
    for (var b = k_lane_of(ids); b < params.nb; b += KSPLIT) {
        load(&st, it, b);
        accumulate(&st, &acc, it, b);
    }
    finish_sum(it, ids.lid, 0u, acc[0]);
    if (TM * TG > 1u) { finish_sum(it, ids.lid, 1u, acc[1]); }
    if (TM * TG > 2u) { finish_sum(it, ids.lid, 2u, acc[2]); }
    if (TM * TG > 3u) { finish_sum(it, ids.lid, 3u, acc[3]); }
    if (TM * TG > 4u) { finish_sum(it, ids.lid, 4u, acc[4]); }
    if (TM * TG > 5u) { finish_sum(it, ids.lid, 5u, acc[5]); }
    if (TM * TG > 6u) { finish_sum(it, ids.lid, 6u, acc[6]); }
    if (TM * TG > 7u) { finish_sum(it, ids.lid, 7u, acc[7]); }
    if (TM * TG > 8u) { finish_sum(it, ids.lid, 8u, acc[8]); }
    if (TM * TG > 9u) { finish_sum(it, ids.lid, 9u, acc[9]); }
    if (TM * TG > 10u) { finish_sum(it, ids.lid, 10u, acc[10]); }
    if (TM * TG > 11u) { finish_sum(it, ids.lid, 11u, acc[11]); }
    if (TM * TG > 12u) { finish_sum(it, ids.lid, 12u, acc[12]); }
    if (TM * TG > 13u) { finish_sum(it, ids.lid, 13u, acc[13]); }
    if (TM * TG > 14u) { finish_sum(it, ids.lid, 14u, acc[14]); }
    if (TM * TG > 15u) { finish_sum(it, ids.lid, 15u, acc[15]); }
    finish_wide(it, ids.lid, &acc);
}

// Stores output rows row0..row0+3 of activation row a (those below params.rows) as EPILOGUE says;
// row0 is a multiple of 4.
fn store4(a: u32, row0: u32, v: vec4<f32>) {
    if (EPILOGUE == 2u) {
        // (gate 2c, gate 2c+1, up 2c, up 2c+1) with 2c = (row_base + row0) / 2: rows come in whole
        // fours (an even FFN width), so all four are real when row0 is.
        if (row0 < params.rows) {
            let out = a * params.y_stride + (params.row_base + row0) / 2u;
            y[out] = act(v.x) * v.z;
            y[out + 1u] = act(v.y) * v.w;
        }
        return;
    }
    let out = a * params.y_stride + params.row_base + row0;
    for (var r = 0u; r < 4u; r++) {
        if (row0 + r < params.rows) {
            if (EPILOGUE == 1u) {
                y[out + r] += v[r];
            } else {
                y[out + r] = v[r];
            }
        }
    }
}
