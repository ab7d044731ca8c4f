// Gated activation, after act_common.wgsl: out[r, j] = act(gate[r, j]) * up[r, j] (SwiGLU for
// llama, GeGLU with GELU for Gemma). For stacked gate|up matrices whose types differ; otherwise
// the gate/up matmul applies act itself (its gated epilogue, matmul_common.wgsl).
// gu: [n_rows, 2 * ffn] f32 (each row: ffn gate values, then ffn up values), out: [n_rows, ffn] f32.
// Each invocation handles PER consecutive columns of one row. (Lane-interleaved columns measured
// no faster on lavapipe; vec4 loads were ~1.5x faster at 512 rows but need ffn % 4 == 0 and a
// second binding type, for ~1% of a prefill.)

struct Params { n_rows: u32, ffn: u32 }

@group(0) @binding(0) var<storage, read> gu: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> params: Params;

override WG: u32 = 64u;
override PER: u32 = 4u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = gid.x + gid.y * nwg.x * WG;
    let ffn = params.ffn;
    let chunks = (ffn + PER - 1u) / PER;
    if (item >= params.n_rows * chunks) {
        return;
    }
    let row = item / chunks;
    let col0 = (item % chunks) * PER;
    let src = row * 2u * ffn;
    let dst = row * ffn;
    for (var k = 0u; k < PER; k += 1u) {
        let col = col0 + k;
        if (col < ffn) {
            out[dst + col] = act(gu[src + col]) * gu[src + ffn + col];
        }
    }
}
