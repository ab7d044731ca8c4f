// Q8_0 weights, after matmul_common.wgsl and an activation prelude: G = 8, the 8 rows 8g..8g+7 of
// group g side by side. Group g, block b (columns 32b..32b+31) is 17 vec4<u32> (8 × 34 bytes, the
// GGUF size) at (g · nb + b) · 17:
//   [0]               the 8 rows' f16 scales d, row r in half r % 2 of u32 r / 2;
//   [1 + 2r, 2 + 2r]  row r's 32 signed quant bytes in order.
// Rows past `rows` are zero blocks. Value = d · q: Σ_k x_k d q_k = d · Σ_k q_k x_k, f32 throughout,
// or the quants against int8 activations with INT8 (llama.cpp's Q8_0 × Q8_0).

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;

// Rows per row group.
const G: u32 = 8u;

// One block of a group: row r's quants in q[2r] (values 0..15) and q[2r + 1] (16..31), the
// scales of rows 0..3 and 4..7.
struct Q80 {
    q: array<vec4<u32>, 16>,
    d_lo: vec4<f32>,
    d_hi: vec4<f32>,
}

fn q8_0_block(g: u32, b: u32) -> Q80 {
    let base = (g * params.nb + b) * 17u;
    let sc = w[base];
    var out: Q80;
    out.d_lo = vec4<f32>(unpack2x16float(sc.x), unpack2x16float(sc.y));
    out.d_hi = vec4<f32>(unpack2x16float(sc.z), unpack2x16float(sc.w));
    out.q = array<vec4<u32>, 16>(w[base + 1u], w[base + 2u], w[base + 3u], w[base + 4u], w[base + 5u], w[base + 6u], w[base + 7u], w[base + 8u],
                                 w[base + 9u], w[base + 10u], w[base + 11u], w[base + 12u], w[base + 13u], w[base + 14u], w[base + 15u], w[base + 16u]);
    return out;
}

// The 4 signed bytes of `word` as floats.
fn quants(word: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xI8(word));
}

// Σ_k q_k x_k over one row's block (quants lo: values 0..15, hi: 16..31).
fn bytes_dot(lo: vec4<u32>, hi: vec4<u32>, v: XF32) -> f32 {
    return (dot(quants(lo.x), v[0]) + dot(quants(lo.y), v[1]) + dot(quants(lo.z), v[2]) + dot(quants(lo.w), v[3]))
         + (dot(quants(hi.x), v[4]) + dot(quants(hi.y), v[5]) + dot(quants(hi.z), v[6]) + dot(quants(hi.w), v[7]));
}

// What an invocation holds while it multiplies block b: the TG groups' blocks (wq), the
// activation row's block (loaded at its first slot, j = 0, and reused by its other groups) in xv
// (f32, g ⊙ x with NORM, g being the norm weight's block) or in xq (INT8).
struct State {
    wq: array<Q80, MAX_TG>,
    xv: XF32,
    xq: XInt8,
    g: XF32,
}

// A slot's sums: the group's rows 0..3 and 4..7.
alias Sum = mat2x4<f32>;

fn load(st: ptr<function, State>, it: Tile, b: u32) {
    (*st).wq[0] = q8_0_block(group_at(it, 0u), b);
    if (TG > 1u) { (*st).wq[1] = q8_0_block(group_at(it, 1u), b); }
    if (TG > 2u) { (*st).wq[2] = q8_0_block(group_at(it, 2u), b); (*st).wq[3] = q8_0_block(group_at(it, 3u), b); }
    (*st).g = g_f32(it, b);
}

// Slot s of the tile (activation row t = s / TG against row group j = s % TG, see
// matmul_common.wgsl) over block b: the 8 rows' sums.
fn slot(st: ptr<function, State>, it: Tile, s: u32, b: u32) -> Sum {
    let t = s / TG;
    let wb = (*st).wq[s % TG];
    if (INT8) {
        if (s % TG == 0u) {
            (*st).xq = x_int8(it, t, b);
        }
        let x8 = (*st).xq;
        let lo = vec4<f32>(f32(dot_block(wb.q[0], wb.q[1], x8.lo, x8.hi)), f32(dot_block(wb.q[2], wb.q[3], x8.lo, x8.hi)),
                           f32(dot_block(wb.q[4], wb.q[5], x8.lo, x8.hi)), f32(dot_block(wb.q[6], wb.q[7], x8.lo, x8.hi)));
        let hi = vec4<f32>(f32(dot_block(wb.q[8], wb.q[9], x8.lo, x8.hi)), f32(dot_block(wb.q[10], wb.q[11], x8.lo, x8.hi)),
                           f32(dot_block(wb.q[12], wb.q[13], x8.lo, x8.hi)), f32(dot_block(wb.q[14], wb.q[15], x8.lo, x8.hi)));
        return Sum(wb.d_lo * x8.d * lo, wb.d_hi * x8.d * hi);
    }
    if (s % TG == 0u) {
        (*st).xv = x_in(it, t, b, (*st).g);
    }
    let v = (*st).xv;
    let lo = vec4<f32>(bytes_dot(wb.q[0], wb.q[1], v), bytes_dot(wb.q[2], wb.q[3], v), bytes_dot(wb.q[4], wb.q[5], v), bytes_dot(wb.q[6], wb.q[7], v));
    let hi = vec4<f32>(bytes_dot(wb.q[8], wb.q[9], v), bytes_dot(wb.q[10], wb.q[11], v), bytes_dot(wb.q[12], wb.q[13], v), bytes_dot(wb.q[14], wb.q[15], v));
    return Sum(wb.d_lo * lo, wb.d_hi * hi);
}

fn finish_sum(it: Tile, lid: u32, s: u32, v: Sum) {
    finish(it, lid, s, 0u, v[0]);
    finish(it, lid, s, 1u, v[1]);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
    run_tile(ids);
}
