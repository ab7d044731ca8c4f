// y[a, n] = Σ_k x[a, k] · W[n, k] for a < n_rows and n < rows, W in Q4_1 as repacked by
// QuantMatrix::upload (src/gpu/ops/matmul.rs): the 4 rows 4g..4g+3 of group g side by side.
// Group g, block b (columns 32b..32b+31) is 5 vec4<u32> at (g · nb + b) · 5:
//   [0]      component r: row r's f16 scale d (low half) and f16 minimum m (high half), as in GGUF;
//   [1 + r]  row r's 16 quant bytes: byte j holds element j (low nibble) and element j + 16 (high).
// Rows past `rows` are zero blocks. Value = d · q + m, dequantized in registers, f32 throughout.
//
// w: [groups · nb · 5] vec4<u32>; x: [n_rows, nb · 32] f32 (read as vec4); y: [n_rows, y_stride] f32.
//
// One invocation computes a tile of TM activation rows × 4 output rows: every weight block is
// loaded and dequantized once per TM rows (register tiling, no shared memory). With KSPLIT > 1
// (real GPUs) KSPLIT adjacent invocations split a group's blocks and reduce through workgroup
// memory; CPU adapters use KSPLIT = 1, where the barriers are compiled out.

struct Params {
    rows: u32,          // output features written (≤ 4 · groups)
    nb: u32,            // 32-value blocks per row (cols / 32)
    n_rows: u32,        // activation rows
    groups: u32,        // 4-row groups in w
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

fn nibbles(word: u32, d: f32, m: f32) -> vec4<f32> {
    return fma(vec4<f32>(unpack4xU8(word & 0x0F0F0F0Fu)), vec4<f32>(d), vec4<f32>(m));
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let linear = wg.x + wg.y * nwg.x;
    // The group index is the fast one: consecutive workgroups share an activation tile.
    let tile = linear / params.wgs_per_tile;
    let lane = lid % KSPLIT;
    let g = (linear % params.wgs_per_tile) * (WG / KSPLIT) + lid / KSPLIT;
    // Out-of-range invocations compute on clamped indices and store nothing: no early return,
    // so that every invocation reaches the barriers.
    let gc = min(g, params.groups - 1u);
    let a0 = min(tile, params.tiles - 1u) * TM;
    let cols4 = params.nb * 8u;

    var xrow: array<u32, MAX_TM>;
    for (var t = 0u; t < TM; t++) {
        xrow[t] = min(a0 + t, params.n_rows - 1u) * cols4;
    }
    var acc: array<vec4<f32>, MAX_TM>;
    for (var b = lane; b < params.nb; b += KSPLIT) {
        let base = (gc * params.nb + b) * 5u;
        let sc = w[base];
        let dm0 = unpack2x16float(sc.x);
        let dm1 = unpack2x16float(sc.y);
        let dm2 = unpack2x16float(sc.z);
        let dm3 = unpack2x16float(sc.w);
        let q0 = w[base + 1u];
        let q1 = w[base + 2u];
        let q2 = w[base + 3u];
        let q3 = w[base + 4u];
        let xb = b * 8u;
        for (var i = 0u; i < 4u; i++) {
            // Word i of a row: elements 4i..4i+3 (low nibbles) and 16+4i..16+4i+3 (high nibbles).
            let lo0 = nibbles(q0[i], dm0.x, dm0.y);
            let hi0 = nibbles(q0[i] >> 4u, dm0.x, dm0.y);
            let lo1 = nibbles(q1[i], dm1.x, dm1.y);
            let hi1 = nibbles(q1[i] >> 4u, dm1.x, dm1.y);
            let lo2 = nibbles(q2[i], dm2.x, dm2.y);
            let hi2 = nibbles(q2[i] >> 4u, dm2.x, dm2.y);
            let lo3 = nibbles(q3[i], dm3.x, dm3.y);
            let hi3 = nibbles(q3[i] >> 4u, dm3.x, dm3.y);
            for (var t = 0u; t < TM; t++) {
                let xl = x[xrow[t] + xb + i];
                let xh = x[xrow[t] + xb + 4u + i];
                acc[t] += vec4<f32>(dot(lo0, xl) + dot(hi0, xh), dot(lo1, xl) + dot(hi1, xh),
                                    dot(lo2, xl) + dot(hi2, xh), dot(lo3, xl) + dot(hi3, xh));
            }
        }
    }

    let row0 = g * 4u;
    let live = g < params.groups && tile < params.tiles && lane == 0u;
    for (var t = 0u; t < TM; t++) {
        var sum = acc[t];
        if (KSPLIT > 1u) {
            partial[lid] = sum;
            workgroupBarrier();
            if (lane == 0u) {
                for (var l = 1u; l < KSPLIT; l++) {
                    sum += partial[lid + l];
                }
            }
            workgroupBarrier();
        }
        let a = a0 + t;
        if (live && a < params.n_rows) {
            let out = a * params.y_stride + row0;
            for (var r = 0u; r < 4u; r++) {
                if (row0 + r < params.rows) {
                    y[out + r] = sum[r];
                }
            }
        }
    }
}
