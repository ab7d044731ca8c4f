// y[a, n] = Σ_k x[a, k] · W[n, k] for a < n_rows and n < rows, W in Q8_0 as repacked by
// QuantMatrix::upload (src/gpu/ops/matmul.rs): the 8 rows 8g..8g+7 of group g side by side.
// Group g, block b (columns 32b..32b+31) is 17 vec4<u32> (8 × 34 bytes, the GGUF size) at (g · nb + b) · 17:
//   [0]               the 8 rows' f16 scales d, row r in half r % 2 of u32 r / 2;
//   [1 + 2r, 2 + 2r]  row r's 32 signed quant bytes in order.
// Rows past `rows` are zero blocks. Value = d · q, dequantized in registers, f32 throughout.
//
// w: [groups · nb · 17] vec4<u32>; x: [n_rows, nb · 32] f32 (read as vec4); y: [n_rows, y_stride] f32.
//
// One invocation computes a tile of TM activation rows × 8 output rows (register tiling, no shared
// memory); KSPLIT > 1 (real GPUs) splits a group's blocks over adjacent invocations, as in matmul_q4_1.

struct Params {
    rows: u32,          // output features written (≤ 8 · groups)
    nb: u32,            // 32-value blocks per row (cols / 32)
    n_rows: u32,        // activation rows
    groups: u32,        // 8-row groups in w
    wgs_per_tile: u32,  // workgroups covering every group for one tile of TM activation rows
    tiles: u32,         // ceil(n_rows / TM)
    y_stride: u32,      // f32 elements between rows of y
}

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

override WG: u32 = 16u;     // invocations per workgroup (a multiple of KSPLIT)
override KSPLIT: u32 = 1u;  // invocations sharing one group
override TM: u32 = 1u;      // activation rows per invocation, ≤ MAX_TM
const MAX_TM: u32 = 16u;

var<workgroup> partial: array<vec4<f32>, WG>;
var<workgroup> partial_hi: array<vec4<f32>, WG>;

fn bytes(word: u32, d: f32) -> vec4<f32> {
    return vec4<f32>(unpack4xI8(word)) * d;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let linear = wg.x + wg.y * nwg.x;
    let tile = linear / params.wgs_per_tile;
    let lane = lid % KSPLIT;
    let g = (linear % params.wgs_per_tile) * (WG / KSPLIT) + lid / KSPLIT;
    let gc = min(g, params.groups - 1u);
    let a0 = min(tile, params.tiles - 1u) * TM;
    let cols4 = params.nb * 8u;

    var xrow: array<u32, MAX_TM>;
    for (var t = 0u; t < TM; t++) {
        xrow[t] = min(a0 + t, params.n_rows - 1u) * cols4;
    }
    // Rows 0..3 and 4..7 of the group.
    var acc_lo: array<vec4<f32>, MAX_TM>;
    var acc_hi: array<vec4<f32>, MAX_TM>;
    for (var b = lane; b < params.nb; b += KSPLIT) {
        let base = (gc * params.nb + b) * 17u;
        let sc = w[base];
        let d01 = unpack2x16float(sc.x);
        let d23 = unpack2x16float(sc.y);
        let d45 = unpack2x16float(sc.z);
        let d67 = unpack2x16float(sc.w);
        let xb = b * 8u;
        // Two halves of 16 values: vec4 h of row r is w[base + 1 + 2r + h].
        for (var h = 0u; h < 2u; h++) {
            let q0 = w[base + 1u + h];
            let q1 = w[base + 3u + h];
            let q2 = w[base + 5u + h];
            let q3 = w[base + 7u + h];
            let q4 = w[base + 9u + h];
            let q5 = w[base + 11u + h];
            let q6 = w[base + 13u + h];
            let q7 = w[base + 15u + h];
            for (var i = 0u; i < 4u; i++) {
                let v0 = bytes(q0[i], d01.x);
                let v1 = bytes(q1[i], d01.y);
                let v2 = bytes(q2[i], d23.x);
                let v3 = bytes(q3[i], d23.y);
                let v4 = bytes(q4[i], d45.x);
                let v5 = bytes(q5[i], d45.y);
                let v6 = bytes(q6[i], d67.x);
                let v7 = bytes(q7[i], d67.y);
                for (var t = 0u; t < TM; t++) {
                    let xv = x[xrow[t] + xb + 4u * h + i];
                    acc_lo[t] += vec4<f32>(dot(v0, xv), dot(v1, xv), dot(v2, xv), dot(v3, xv));
                    acc_hi[t] += vec4<f32>(dot(v4, xv), dot(v5, xv), dot(v6, xv), dot(v7, xv));
                }
            }
        }
    }

    let row0 = g * 8u;
    let live = g < params.groups && tile < params.tiles && lane == 0u;
    for (var t = 0u; t < TM; t++) {
        var lo = acc_lo[t];
        var hi = acc_hi[t];
        if (KSPLIT > 1u) {
            partial[lid] = lo;
            partial_hi[lid] = hi;
            workgroupBarrier();
            if (lane == 0u) {
                for (var l = 1u; l < KSPLIT; l++) {
                    lo += partial[lid + l];
                    hi += partial_hi[lid + l];
                }
            }
            workgroupBarrier();
        }
        let a = a0 + t;
        if (live && a < params.n_rows) {
            let out = a * params.y_stride + row0;
            for (var r = 0u; r < 4u; r++) {
                if (row0 + r < params.rows) {
                    y[out + r] = lo[r];
                }
                if (row0 + 4u + r < params.rows) {
                    y[out + 4u + r] = hi[r];
                }
            }
        }
    }
}
