// Q4_1 weights, after matmul_common.wgsl and an activation prelude: G = 4, the 4 rows 4g..4g+3 of
// group g side by side. Group g, block b (columns 32b..32b+31) is 5 vec4<u32> at (g · nb + b) · 5:
//   [0]      component r: row r's f16 scale d (low half) and f16 minimum m (high half), as in GGUF;
//   [1 + r]  row r's 16 quant bytes: byte j holds element j (low nibble) and element j + 16 (high).
// Rows past `rows` are zero blocks. Value = d · q + m. f32 activations: Σ_k x_k (d q_k + m) =
// d · Σ_k q_k x_k + m · Σ_k x_k, f32 throughout. INT8 is llama.cpp's Q4_1 × Q8_1: the 4-bit quants
// against int8 activations, the minimum against their exact sum.

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;

// Rows per row group.
const G: u32 = 4u;

// One block of a group: each row's 32 quants as bytes, values 0..15 in lo, 16..31 in hi (the low
// and high nibbles of its 16 bytes), and the 4 rows' scales and minimums.
struct Q41 {
    lo: array<vec4<u32>, 4>,
    hi: array<vec4<u32>, 4>,
    d: vec4<f32>,
    m: vec4<f32>,
}

const NIBBLES: vec4<u32> = vec4<u32>(0x0F0F0F0Fu);

fn q4_1_block(g: u32, b: u32) -> Q41 {
    let base = (g * params.nb + b) * 5u;
    let sc = w[base];
    let dm0 = unpack2x16float(sc.x);
    let dm1 = unpack2x16float(sc.y);
    let dm2 = unpack2x16float(sc.z);
    let dm3 = unpack2x16float(sc.w);
    let q0 = w[base + 1u];
    let q1 = w[base + 2u];
    let q2 = w[base + 3u];
    let q3 = w[base + 4u];
    let four = vec4<u32>(4u);
    return Q41(array<vec4<u32>, 4>(q0 & NIBBLES, q1 & NIBBLES, q2 & NIBBLES, q3 & NIBBLES),
               array<vec4<u32>, 4>((q0 >> four) & NIBBLES, (q1 >> four) & NIBBLES, (q2 >> four) & NIBBLES, (q3 >> four) & NIBBLES),
               vec4<f32>(dm0.x, dm1.x, dm2.x, dm3.x), vec4<f32>(dm0.y, dm1.y, dm2.y, dm3.y));
}

// The 4 bytes of `word` (quants 0..15), as floats.
fn quants(word: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(word));
}

// Σ_k q_k x_k over one row's block.
fn nibbles_dot(lo: vec4<u32>, hi: vec4<u32>, v: XF32) -> f32 {
    return (dot(quants(lo.x), v[0]) + dot(quants(lo.y), v[1]) + dot(quants(lo.z), v[2]) + dot(quants(lo.w), v[3]))
         + (dot(quants(hi.x), v[4]) + dot(quants(hi.y), v[5]) + dot(quants(hi.z), v[6]) + dot(quants(hi.w), v[7]));
}

// What an invocation holds while it multiplies block b: the TG groups' blocks (wq), the
// activation row's block (loaded at its first slot, j = 0, and reused by its other groups) in xv
// with its sum in xs (f32, g ⊙ x with NORM, g being the norm weight's block) or in xq (INT8).
struct State {
    wq: array<Q41, MAX_TG>,
    xv: XF32,
    xs: f32,
    xq: XInt8,
    g: XF32,
}

// A slot's sums: the group's 4 rows.
alias Sum = vec4<f32>;

fn load(st: ptr<function, State>, it: Tile, b: u32) {
    (*st).wq[0] = q4_1_block(group_at(it, 0u), b);
    if (TG > 1u) { (*st).wq[1] = q4_1_block(group_at(it, 1u), b); }
    if (TG > 2u) { (*st).wq[2] = q4_1_block(group_at(it, 2u), b); (*st).wq[3] = q4_1_block(group_at(it, 3u), b); }
    (*st).g = g_f32(it, b);
}

// Slot s of the tile (activation row t = s / TG against row group j = s % TG, see
// matmul_common.wgsl) over block b: the 4 rows' sums.
fn slot(st: ptr<function, State>, it: Tile, s: u32, b: u32) -> Sum {
    let t = s / TG;
    let wb = (*st).wq[s % TG];
    if (INT8) {
        if (s % TG == 0u) {
            (*st).xq = x_int8(it, t, b);
        }
        let x8 = (*st).xq;
        let dots = vec4<f32>(f32(dot_block(wb.lo[0], wb.hi[0], x8.lo, x8.hi)), f32(dot_block(wb.lo[1], wb.hi[1], x8.lo, x8.hi)),
                             f32(dot_block(wb.lo[2], wb.hi[2], x8.lo, x8.hi)), f32(dot_block(wb.lo[3], wb.hi[3], x8.lo, x8.hi)));
        return wb.d * x8.d * dots + wb.m * x8.s;
    }
    if (s % TG == 0u) {
        (*st).xv = x_in(it, t, b, (*st).g);
        (*st).xs = block_sum((*st).xv);
    }
    let v = (*st).xv;
    let qx = vec4<f32>(nibbles_dot(wb.lo[0], wb.hi[0], v), nibbles_dot(wb.lo[1], wb.hi[1], v),
                       nibbles_dot(wb.lo[2], wb.hi[2], v), nibbles_dot(wb.lo[3], wb.hi[3], v));
    return wb.d * qx + wb.m * (*st).xs;
}

fn finish_sum(it: Tile, lid: u32, s: u32, v: Sum) {
    finish(it, lid, s, 0u, v);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
    run_tile(ids);
}
