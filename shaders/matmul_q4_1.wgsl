// y[a, n] = Σ_k x[a, k] · W[n, k] for a < n_rows and n < rows, W in Q4_1 as repacked by
// QuantMatrix::upload (src/gpu/ops/matmul.rs): the 4 rows 4g..4g+3 of group g side by side.
// Group g, block b (columns 32b..32b+31) is 5 vec4<u32> at (g · nb + b) · 5:
//   [0]      component r: row r's f16 scale d (low half) and f16 minimum m (high half), as in GGUF;
//   [1 + r]  row r's 16 quant bytes: byte j holds element j (low nibble) and element j + 16 (high).
// Rows past `rows` are zero blocks. Value = d · q + m, dequantized in registers, f32 throughout.
//
// w: [groups · nb · 5] vec4<u32>; y: [n_rows, y_stride] f32;
// x: [n_rows, nb · 32] f32 (8 vec4 per block, as u32 bits), or with INT8 the activations quantized by
//    quantize_act.wgsl: [n_rows · nb · 3] vec4<u32> (32 int8 quants, then the scale and the exact sum).
//
// One invocation computes a tile of TM activation rows × 4 output rows: every weight block is
// loaded and dequantized once per TM rows (register tiling, no shared memory). With KSPLIT > 1
// (real GPUs) KSPLIT adjacent invocations split a group's blocks and reduce through workgroup
// memory; CPU adapters use KSPLIT = 1, where the barriers are compiled out. INT8 multiplies the
// 4-bit quants with int8 activations through dot4I8Packed (llama.cpp's Q4_1 × Q8_1): faster, but
// activations carry a rounding error of up to half a step of their block's scale.

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
@group(0) @binding(1) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

override WG: u32 = 16u;     // invocations per workgroup (a multiple of KSPLIT)
override KSPLIT: u32 = 1u;  // invocations sharing one group
override TM: u32 = 1u;      // activation rows per invocation, ≤ MAX_TM
override SCALE_AFTER: bool = true;  // apply scale and minimum per block (small TM) or per value (large TM)
override INT8: bool = false;        // x holds int8-quantized activations
const MAX_TM: u32 = 16u;

var<workgroup> partial: array<vec4<f32>, WG>;

// The low nibbles of the 4 bytes of `word`, as floats.
fn quants(word: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(word & 0x0F0F0F0Fu));
}

// Σ_j q_j · xq_j over a block: the low nibbles of q pair with xlo (values 0..15), the high with xhi.
fn dot_nibbles(q: vec4<u32>, xlo: vec4<u32>, xhi: vec4<u32>) -> i32 {
    let lo = q & vec4<u32>(0x0F0F0F0Fu);
    let hi = (q >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
    return dot4I8Packed(lo.x, xlo.x) + dot4I8Packed(lo.y, xlo.y) + dot4I8Packed(lo.z, xlo.z) + dot4I8Packed(lo.w, xlo.w)
         + dot4I8Packed(hi.x, xhi.x) + dot4I8Packed(hi.y, xhi.y) + dot4I8Packed(hi.z, xhi.z) + dot4I8Packed(hi.w, xhi.w);
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
    let x_block = select(8u, 3u, INT8);  // vec4s per activation block
    let cols4 = params.nb * x_block;

    var xrow: array<u32, MAX_TM>;
    for (var t = 0u; t < TM; t++) {
        xrow[t] = min(a0 + t, params.n_rows - 1u) * cols4;
    }
    var acc: array<vec4<f32>, MAX_TM>;
    // Per-block sums of the SCALE_AFTER path, zeroed explicitly per block: Chromium 156 (Tint,
    // SwiftShader) does not re-zero a loop-local `var` declared without an initializer.
    var qx: array<vec4<f32>, MAX_TM>;
    var xs: array<vec4<f32>, MAX_TM>;
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
        let xb = b * x_block;
        if (INT8) {
            let m = vec4<f32>(dm0.y, dm1.y, dm2.y, dm3.y);
            let d = vec4<f32>(dm0.x, dm1.x, dm2.x, dm3.x);
            for (var t = 0u; t < TM; t++) {
                let xlo = x[xrow[t] + xb];
                let xhi = x[xrow[t] + xb + 1u];
                let scale_sum = bitcast<vec2<f32>>(x[xrow[t] + xb + 2u].xy);
                let dots = vec4<f32>(f32(dot_nibbles(q0, xlo, xhi)), f32(dot_nibbles(q1, xlo, xhi)),
                                     f32(dot_nibbles(q2, xlo, xhi)), f32(dot_nibbles(q3, xlo, xhi)));
                acc[t] += d * scale_sum.x * dots + m * scale_sum.y;
            }
        } else if (SCALE_AFTER) {
            // Σ_k x_k (d q_k + m) = d · Σ_k x_k q_k + m · Σ_k x_k: no per-value dequantization,
            // two multiply-adds per block and activation row instead.
            for (var t = 0u; t < TM; t++) {
                qx[t] = vec4<f32>(0.0);
                xs[t] = vec4<f32>(0.0);
            }
            for (var i = 0u; i < 4u; i++) {
                let lo0 = quants(q0[i]);
                let hi0 = quants(q0[i] >> 4u);
                let lo1 = quants(q1[i]);
                let hi1 = quants(q1[i] >> 4u);
                let lo2 = quants(q2[i]);
                let hi2 = quants(q2[i] >> 4u);
                let lo3 = quants(q3[i]);
                let hi3 = quants(q3[i] >> 4u);
                for (var t = 0u; t < TM; t++) {
                    let xl = bitcast<vec4<f32>>(x[xrow[t] + xb + i]);
                    let xh = bitcast<vec4<f32>>(x[xrow[t] + xb + 4u + i]);
                    qx[t] += vec4<f32>(dot(lo0, xl) + dot(hi0, xh), dot(lo1, xl) + dot(hi1, xh),
                                       dot(lo2, xl) + dot(hi2, xh), dot(lo3, xl) + dot(hi3, xh));
                    xs[t] += xl + xh;
                }
            }
            let d = vec4<f32>(dm0.x, dm1.x, dm2.x, dm3.x);
            let m = vec4<f32>(dm0.y, dm1.y, dm2.y, dm3.y);
            for (var t = 0u; t < TM; t++) {
                acc[t] += d * qx[t] + m * dot(xs[t], vec4<f32>(1.0));
            }
        } else {
            // Dequantize each value once and reuse it for all TM activation rows.
            for (var i = 0u; i < 4u; i++) {
                let lo0 = fma(quants(q0[i]), vec4<f32>(dm0.x), vec4<f32>(dm0.y));
                let hi0 = fma(quants(q0[i] >> 4u), vec4<f32>(dm0.x), vec4<f32>(dm0.y));
                let lo1 = fma(quants(q1[i]), vec4<f32>(dm1.x), vec4<f32>(dm1.y));
                let hi1 = fma(quants(q1[i] >> 4u), vec4<f32>(dm1.x), vec4<f32>(dm1.y));
                let lo2 = fma(quants(q2[i]), vec4<f32>(dm2.x), vec4<f32>(dm2.y));
                let hi2 = fma(quants(q2[i] >> 4u), vec4<f32>(dm2.x), vec4<f32>(dm2.y));
                let lo3 = fma(quants(q3[i]), vec4<f32>(dm3.x), vec4<f32>(dm3.y));
                let hi3 = fma(quants(q3[i] >> 4u), vec4<f32>(dm3.x), vec4<f32>(dm3.y));
                for (var t = 0u; t < TM; t++) {
                    let xl = bitcast<vec4<f32>>(x[xrow[t] + xb + i]);
                    let xh = bitcast<vec4<f32>>(x[xrow[t] + xb + 4u + i]);
                    acc[t] += vec4<f32>(dot(lo0, xl) + dot(hi0, xh), dot(lo1, xl) + dot(hi1, xh),
                                        dot(lo2, xl) + dot(hi2, xh), dot(lo3, xl) + dot(hi3, xh));
                }
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
