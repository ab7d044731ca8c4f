// The activation loads of the matmul kernels shared through subgroup broadcasts (a prelude after
// matmul_common.wgsl instead of matmul_split.wgsl + matmul_x.wgsl, with the same functions), for
// devices with the `subgroups` feature and subgroups of at least 8 invocations, with KSPLIT = 1.
// Every invocation of a subgroup multiplies the same activation block (the tile is the
// workgroup's), so 8 lanes load one word (int8) or one vec4 (f32) each and read the rest from each
// other: on lavapipe a storage load costs a loop over the SIMD lanes while a broadcast is one
// vector instruction, and this cuts the words each invocation loads per activation block from 10
// to 2 (int8), 32 to 4 (f32). Called in uniform control flow only (every lane of the subgroup
// takes part).
// No `enable subgroups;` heads these sources: naga 30 refuses the directive ("not yet
// implemented") and accepts the operations without it, while tint (Chromium) requires it. The
// `_subgroup` variants (and `_subgroup_sum`, matmul_split_subgroup.wgsl) run only where
// `Context::has_subgroups` holds, which wgpu's browser backend never reports today; a browser
// variant would need the directive prepended on wasm32.

struct Ids {
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) sl: u32,
}

// KSPLIT is 1 here: every invocation walks all the blocks, in step with its subgroup (so that
// the broadcasts are in uniform control flow, which a lane derived from the invocation index is
// not, as far as WGSL's uniformity analysis can tell).
fn k_lane_of(ids: Ids) -> u32 {
    return 0u;
}

fn x_lane_of(ids: Ids) -> u32 {
    return ids.sl & 7u;
}

fn slot_of(ids: Ids) -> u32 {
    return ids.lid;
}

// KSPLIT is 1: nothing to sum.
fn k_reduce(lid: u32, lane: u32, v: vec4<f32>, ss: f32) -> Reduced {
    return Reduced(v, ss);
}

// Block b of the tile's activation row a0 + t, int8 (INT8): lane l loads quant word l and, for
// l < 2, the scale (l = 0) or the sum (l = 1); the lanes above load those again.
fn x_int8(it: Tile, t: u32, b: u32) -> XInt8 {
    let at = x_at(it, t, b);
    let l = it.x_lane;
    let q = x[at + l / 4u][l % 4u];
    let e = x[at + 2u][l % 2u];
    return XInt8(vec4<u32>(subgroupBroadcast(q, 0u), subgroupBroadcast(q, 1u), subgroupBroadcast(q, 2u), subgroupBroadcast(q, 3u)),
                 vec4<u32>(subgroupBroadcast(q, 4u), subgroupBroadcast(q, 5u), subgroupBroadcast(q, 6u), subgroupBroadcast(q, 7u)),
                 bitcast<f32>(subgroupBroadcast(e, 0u)), bitcast<f32>(subgroupBroadcast(e, 1u)));
}

// Block b of the tile's activation row a0 + t, f32: lane l loads vec4 l.
fn x_f32(it: Tile, t: u32, b: u32) -> XF32 {
    let v = bitcast<vec4<f32>>(x[x_at(it, t, b) + it.x_lane]);
    return XF32(subgroupBroadcast(v, 0u), subgroupBroadcast(v, 1u), subgroupBroadcast(v, 2u), subgroupBroadcast(v, 3u),
                subgroupBroadcast(v, 4u), subgroupBroadcast(v, 5u), subgroupBroadcast(v, 6u), subgroupBroadcast(v, 7u));
}

// Block b of the prologue's norm weight (NORM; zeros, unread, without): lane l loads vec4 l.
fn g_f32(it: Tile, b: u32) -> XF32 {
    if (!NORM) {
        return XF32();
    }
    let v = norm_w[b * 8u + it.x_lane];
    return XF32(subgroupBroadcast(v, 0u), subgroupBroadcast(v, 1u), subgroupBroadcast(v, 2u), subgroupBroadcast(v, 3u),
                subgroupBroadcast(v, 4u), subgroupBroadcast(v, 5u), subgroupBroadcast(v, 6u), subgroupBroadcast(v, 7u));
}
