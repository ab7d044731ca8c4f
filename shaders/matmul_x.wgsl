// The activation loads of the matmul kernels when every invocation loads what it multiplies (a
// prelude after matmul_common.wgsl and a split prelude, matmul_split.wgsl or
// matmul_split_subgroup.wgsl; matmul_x_subgroup.wgsl is the other kind, with the same functions).

// Block b of the tile's activation row a0 + t, int8 (INT8).
fn x_int8(it: Tile, t: u32, b: u32) -> XInt8 {
    let at = x_at(it, t, b);
    let ds = bitcast<vec2<f32>>(x[at + 2u].xy);
    return XInt8(x[at], x[at + 1u], ds.x, ds.y);
}

// Block b of the tile's activation row a0 + t, f32.
fn x_f32(it: Tile, t: u32, b: u32) -> XF32 {
    let at = x_at(it, t, b);
    return XF32(bitcast<vec4<f32>>(x[at]), bitcast<vec4<f32>>(x[at + 1u]), bitcast<vec4<f32>>(x[at + 2u]), bitcast<vec4<f32>>(x[at + 3u]),
                bitcast<vec4<f32>>(x[at + 4u]), bitcast<vec4<f32>>(x[at + 5u]), bitcast<vec4<f32>>(x[at + 6u]), bitcast<vec4<f32>>(x[at + 7u]));
}

// Block b of the prologue's norm weight (NORM; zeros, unread, without).
fn g_f32(it: Tile, b: u32) -> XF32 {
    if (!NORM) {
        return XF32();
    }
    let at = b * 8u;
    return XF32(norm_w[at], norm_w[at + 1u], norm_w[at + 2u], norm_w[at + 3u], norm_w[at + 4u], norm_w[at + 5u], norm_w[at + 6u], norm_w[at + 7u]);
}
