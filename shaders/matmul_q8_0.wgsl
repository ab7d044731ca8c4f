// Q8_0 weights, after matmul_common.wgsl and an activation prelude: G = 8, the 8 rows 8g..8g+7 of
// group g side by side. Group g, block b (columns 32b..32b+31) is 17 vec4<u32> (8 × 34 bytes, the
// GGUF size) at (g · nb + b) · 17:
//   [0]               the 8 rows' f16 scales d, row r in half r % 2 of u32 r / 2;
//   [1 + 2r, 2 + 2r]  row r's 32 signed quant bytes in order.
// Rows past `rows` are zero blocks. Value = d · q: Σ_k x_k d q_k = d · Σ_k q_k x_k, f32 throughout,
// or the quants against int8 activations with INT8 (llama.cpp's Q8_0 × Q8_0).

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;

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

// The 8 rows' sums (rows 0..3, rows 4..7) over block b of the tile's activation row a0 + t (g: the
// norm weight's block, NORM).
fn q8_0_row(wb: Q80, g: XF32, it: Tile, t: u32, b: u32) -> array<vec4<f32>, 2> {
    if (INT8) {
        let xq = x_int8(it, t, b);
        let lo = vec4<f32>(f32(dot_block(wb.q[0], wb.q[1], xq.lo, xq.hi)), f32(dot_block(wb.q[2], wb.q[3], xq.lo, xq.hi)),
                           f32(dot_block(wb.q[4], wb.q[5], xq.lo, xq.hi)), f32(dot_block(wb.q[6], wb.q[7], xq.lo, xq.hi)));
        let hi = vec4<f32>(f32(dot_block(wb.q[8], wb.q[9], xq.lo, xq.hi)), f32(dot_block(wb.q[10], wb.q[11], xq.lo, xq.hi)),
                           f32(dot_block(wb.q[12], wb.q[13], xq.lo, xq.hi)), f32(dot_block(wb.q[14], wb.q[15], xq.lo, xq.hi)));
        return array<vec4<f32>, 2>(wb.d_lo * xq.d * lo, wb.d_hi * xq.d * hi);
    }
    let v = x_in(it, t, b, g);
    let lo = vec4<f32>(bytes_dot(wb.q[0], wb.q[1], v), bytes_dot(wb.q[2], wb.q[3], v), bytes_dot(wb.q[4], wb.q[5], v), bytes_dot(wb.q[6], wb.q[7], v));
    let hi = vec4<f32>(bytes_dot(wb.q[8], wb.q[9], v), bytes_dot(wb.q[10], wb.q[11], v), bytes_dot(wb.q[12], wb.q[13], v), bytes_dot(wb.q[14], wb.q[15], v));
    return array<vec4<f32>, 2>(wb.d_lo * lo, wb.d_hi * hi);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
    let it = tile_of(ids);
    // Rows 0..3 and 4..7 of the group, indexed by constants only (see matmul_common.wgsl).
    var acc_lo: array<vec4<f32>, MAX_TM>;
    var acc_hi: array<vec4<f32>, MAX_TM>;
    for (var b = k_lane_of(ids); b < params.nb; b += KSPLIT) {
        let wb = q8_0_block(it.gc, b);
        let g = g_f32(it, b);
        let r0 = q8_0_row(wb, g, it, 0u, b);
        acc_lo[0] += r0[0];
        acc_hi[0] += r0[1];
        if (TM > 1u) { let r = q8_0_row(wb, g, it, 1u, b); acc_lo[1] += r[0]; acc_hi[1] += r[1]; }
        if (TM > 2u) { let r = q8_0_row(wb, g, it, 2u, b); acc_lo[2] += r[0]; acc_hi[2] += r[1]; }
        if (TM > 3u) { let r = q8_0_row(wb, g, it, 3u, b); acc_lo[3] += r[0]; acc_hi[3] += r[1]; }
        if (TM > 4u) { let r = q8_0_row(wb, g, it, 4u, b); acc_lo[4] += r[0]; acc_hi[4] += r[1]; }
        if (TM > 5u) { let r = q8_0_row(wb, g, it, 5u, b); acc_lo[5] += r[0]; acc_hi[5] += r[1]; }
        if (TM > 6u) { let r = q8_0_row(wb, g, it, 6u, b); acc_lo[6] += r[0]; acc_hi[6] += r[1]; }
        if (TM > 7u) { let r = q8_0_row(wb, g, it, 7u, b); acc_lo[7] += r[0]; acc_hi[7] += r[1]; }
        if (TM > 8u) { let r = q8_0_row(wb, g, it, 8u, b); acc_lo[8] += r[0]; acc_hi[8] += r[1]; }
        if (TM > 9u) { let r = q8_0_row(wb, g, it, 9u, b); acc_lo[9] += r[0]; acc_hi[9] += r[1]; }
        if (TM > 10u) { let r = q8_0_row(wb, g, it, 10u, b); acc_lo[10] += r[0]; acc_hi[10] += r[1]; }
        if (TM > 11u) { let r = q8_0_row(wb, g, it, 11u, b); acc_lo[11] += r[0]; acc_hi[11] += r[1]; }
        if (TM > 12u) { let r = q8_0_row(wb, g, it, 12u, b); acc_lo[12] += r[0]; acc_hi[12] += r[1]; }
        if (TM > 13u) { let r = q8_0_row(wb, g, it, 13u, b); acc_lo[13] += r[0]; acc_hi[13] += r[1]; }
        if (TM > 14u) { let r = q8_0_row(wb, g, it, 14u, b); acc_lo[14] += r[0]; acc_hi[14] += r[1]; }
        if (TM > 15u) { let r = q8_0_row(wb, g, it, 15u, b); acc_lo[15] += r[0]; acc_hi[15] += r[1]; }
    }
    let row0 = it.g * 8u;
    finish(it, ids.lid, 0u, row0, acc_lo[0]);
    finish(it, ids.lid, 0u, row0 + 4u, acc_hi[0]);
    if (TM > 1u) { finish(it, ids.lid, 1u, row0, acc_lo[1]); finish(it, ids.lid, 1u, row0 + 4u, acc_hi[1]); }
    if (TM > 2u) { finish(it, ids.lid, 2u, row0, acc_lo[2]); finish(it, ids.lid, 2u, row0 + 4u, acc_hi[2]); }
    if (TM > 3u) { finish(it, ids.lid, 3u, row0, acc_lo[3]); finish(it, ids.lid, 3u, row0 + 4u, acc_hi[3]); }
    if (TM > 4u) { finish(it, ids.lid, 4u, row0, acc_lo[4]); finish(it, ids.lid, 4u, row0 + 4u, acc_hi[4]); }
    if (TM > 5u) { finish(it, ids.lid, 5u, row0, acc_lo[5]); finish(it, ids.lid, 5u, row0 + 4u, acc_hi[5]); }
    if (TM > 6u) { finish(it, ids.lid, 6u, row0, acc_lo[6]); finish(it, ids.lid, 6u, row0 + 4u, acc_hi[6]); }
    if (TM > 7u) { finish(it, ids.lid, 7u, row0, acc_lo[7]); finish(it, ids.lid, 7u, row0 + 4u, acc_hi[7]); }
    if (TM > 8u) { finish(it, ids.lid, 8u, row0, acc_lo[8]); finish(it, ids.lid, 8u, row0 + 4u, acc_hi[8]); }
    if (TM > 9u) { finish(it, ids.lid, 9u, row0, acc_lo[9]); finish(it, ids.lid, 9u, row0 + 4u, acc_hi[9]); }
    if (TM > 10u) { finish(it, ids.lid, 10u, row0, acc_lo[10]); finish(it, ids.lid, 10u, row0 + 4u, acc_hi[10]); }
    if (TM > 11u) { finish(it, ids.lid, 11u, row0, acc_lo[11]); finish(it, ids.lid, 11u, row0 + 4u, acc_hi[11]); }
    if (TM > 12u) { finish(it, ids.lid, 12u, row0, acc_lo[12]); finish(it, ids.lid, 12u, row0 + 4u, acc_hi[12]); }
    if (TM > 13u) { finish(it, ids.lid, 13u, row0, acc_lo[13]); finish(it, ids.lid, 13u, row0 + 4u, acc_hi[13]); }
    if (TM > 14u) { finish(it, ids.lid, 14u, row0, acc_lo[14]); finish(it, ids.lid, 14u, row0 + 4u, acc_hi[14]); }
    if (TM > 15u) { finish(it, ids.lid, 15u, row0, acc_lo[15]); finish(it, ids.lid, 15u, row0 + 4u, acc_hi[15]); }
}
