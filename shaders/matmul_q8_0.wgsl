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

// Slot s of the tile (activation row t = s / TG against row group j = s % TG, see
// matmul_common.wgsl) over block b: the 8 rows' sums (rows 0..3, rows 4..7). wq holds the TG
// groups' blocks; the activation row's block is loaded at its first slot (j = 0), into xv (f32; g
// is the norm weight's block with NORM) or xq (INT8), and reused by its other groups.
fn q8_0_slot(wq: ptr<function, array<Q80, MAX_TG>>, xv: ptr<function, XF32>, xq: ptr<function, XInt8>, g: XF32, it: Tile, s: u32, b: u32) -> array<vec4<f32>, 2> {
    let t = s / TG;
    let wb = (*wq)[s % TG];
    if (INT8) {
        if (s % TG == 0u) {
            *xq = x_int8(it, t, b);
        }
        let x8 = *xq;
        let lo = vec4<f32>(f32(dot_block(wb.q[0], wb.q[1], x8.lo, x8.hi)), f32(dot_block(wb.q[2], wb.q[3], x8.lo, x8.hi)),
                           f32(dot_block(wb.q[4], wb.q[5], x8.lo, x8.hi)), f32(dot_block(wb.q[6], wb.q[7], x8.lo, x8.hi)));
        let hi = vec4<f32>(f32(dot_block(wb.q[8], wb.q[9], x8.lo, x8.hi)), f32(dot_block(wb.q[10], wb.q[11], x8.lo, x8.hi)),
                           f32(dot_block(wb.q[12], wb.q[13], x8.lo, x8.hi)), f32(dot_block(wb.q[14], wb.q[15], x8.lo, x8.hi)));
        return array<vec4<f32>, 2>(wb.d_lo * x8.d * lo, wb.d_hi * x8.d * hi);
    }
    if (s % TG == 0u) {
        *xv = x_in(it, t, b, g);
    }
    let v = *xv;
    let lo = vec4<f32>(bytes_dot(wb.q[0], wb.q[1], v), bytes_dot(wb.q[2], wb.q[3], v), bytes_dot(wb.q[4], wb.q[5], v), bytes_dot(wb.q[6], wb.q[7], v));
    let hi = vec4<f32>(bytes_dot(wb.q[8], wb.q[9], v), bytes_dot(wb.q[10], wb.q[11], v), bytes_dot(wb.q[12], wb.q[13], v), bytes_dot(wb.q[14], wb.q[15], v));
    return array<vec4<f32>, 2>(wb.d_lo * lo, wb.d_hi * hi);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
    let it = tile_of(ids);
    // Rows 0..3 and 4..7 of each slot's group, indexed by constants only (see matmul_common.wgsl).
    var acc_lo: array<vec4<f32>, MAX_TM>;
    var acc_hi: array<vec4<f32>, MAX_TM>;
    var wq: array<Q80, MAX_TG>;
    var xv: XF32;
    var xq: XInt8;
    for (var b = k_lane_of(ids); b < params.nb; b += KSPLIT) {
        wq[0] = q8_0_block(group_at(it, 0u), b);
        if (TG > 1u) { wq[1] = q8_0_block(group_at(it, 1u), b); }
        if (TG > 2u) { wq[2] = q8_0_block(group_at(it, 2u), b); wq[3] = q8_0_block(group_at(it, 3u), b); }
        let g = g_f32(it, b);
        let r0 = q8_0_slot(&wq, &xv, &xq, g, it, 0u, b);
        acc_lo[0] += r0[0];
        acc_hi[0] += r0[1];
        if (TM * TG > 1u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 1u, b); acc_lo[1] += r[0]; acc_hi[1] += r[1]; }
        if (TM * TG > 2u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 2u, b); acc_lo[2] += r[0]; acc_hi[2] += r[1]; }
        if (TM * TG > 3u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 3u, b); acc_lo[3] += r[0]; acc_hi[3] += r[1]; }
        if (TM * TG > 4u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 4u, b); acc_lo[4] += r[0]; acc_hi[4] += r[1]; }
        if (TM * TG > 5u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 5u, b); acc_lo[5] += r[0]; acc_hi[5] += r[1]; }
        if (TM * TG > 6u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 6u, b); acc_lo[6] += r[0]; acc_hi[6] += r[1]; }
        if (TM * TG > 7u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 7u, b); acc_lo[7] += r[0]; acc_hi[7] += r[1]; }
        if (TM * TG > 8u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 8u, b); acc_lo[8] += r[0]; acc_hi[8] += r[1]; }
        if (TM * TG > 9u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 9u, b); acc_lo[9] += r[0]; acc_hi[9] += r[1]; }
        if (TM * TG > 10u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 10u, b); acc_lo[10] += r[0]; acc_hi[10] += r[1]; }
        if (TM * TG > 11u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 11u, b); acc_lo[11] += r[0]; acc_hi[11] += r[1]; }
        if (TM * TG > 12u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 12u, b); acc_lo[12] += r[0]; acc_hi[12] += r[1]; }
        if (TM * TG > 13u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 13u, b); acc_lo[13] += r[0]; acc_hi[13] += r[1]; }
        if (TM * TG > 14u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 14u, b); acc_lo[14] += r[0]; acc_hi[14] += r[1]; }
        if (TM * TG > 15u) { let r = q8_0_slot(&wq, &xv, &xq, g, it, 15u, b); acc_lo[15] += r[0]; acc_hi[15] += r[1]; }
    }
    finish_tile(it, ids.lid, 0u, acc_lo);
    finish_tile(it, ids.lid, 1u, acc_hi);
}
