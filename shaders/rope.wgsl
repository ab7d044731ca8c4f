// Rotary position embedding, in place, after rope_common.wgsl (the pairing, the angle, the
// rotation): llama's NORM pairing or NEOX pairing (NEOX).
// x: [n_tokens, row_stride] f32; heads 0..n_heads of each row start at column 0, head_dim apart
//    (on the fused qkv rows: the q heads, then the k heads; the v heads after them are untouched).
// positions: [n_tokens] u32, the absolute position of each token.
// One invocation per (token, pair): it forms the angle once and rotates that pair in every head.

struct Params {
    n_tokens: u32,
    row_stride: u32,
    n_heads: u32,
    head_dim: u32,
    // The turn table of rope_common.wgsl.
    turns: array<vec4<u32>, 128>,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> positions: array<u32>;
@group(0) @binding(2) var<storage, read> params: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = gid.x + gid.y * nwg.x * WG;
    let half = params.head_dim / 2u;
    if (item >= params.n_tokens * half) {
        return;
    }
    let token = item / half;
    let pair = item % half;
    let sc = pair_sin_cos(params.turns[pair / 2u], pair, positions[token]);
    let dims = pair_dims(pair, half);
    let first = token * params.row_stride + dims.x;
    for (var h = 0u; h < params.n_heads; h += 1u) {
        let j = first + h * params.head_dim;
        let r = rotated(vec2<f32>(x[j], x[j + dims.y]), sc);
        x[j] = r.x;
        x[j + dims.y] = r.y;
    }
}
