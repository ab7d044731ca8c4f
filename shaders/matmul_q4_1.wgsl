// Q4_1 weights, after matmul_common.wgsl: G = 4, the 4 rows 4g..4g+3 of group g side by side.
// Group g, block b (columns 32b..32b+31) is 5 vec4<u32> at (g · nb + b) · 5:
//   [0]      component r: row r's f16 scale d (low half) and f16 minimum m (high half), as in GGUF;
//   [1 + r]  row r's 16 quant bytes: byte j holds element j (low nibble) and element j + 16 (high).
// Rows past `rows` are zero blocks. Value = d · q + m, dequantized in registers, f32 throughout.
// INT8 is llama.cpp's Q4_1 × Q8_1: the 4-bit quants against int8 activations.

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;

// The low nibbles of the 4 bytes of `word`, as floats.
fn quants(word: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(word & 0x0F0F0F0Fu));
}

// Σ_j q_j · xq_j over a block: the low nibbles of q pair with xlo (values 0..15), the high with xhi.
fn dot_nibbles(q: vec4<u32>, xlo: vec4<u32>, xhi: vec4<u32>) -> i32 {
    let lo = q & vec4<u32>(0x0F0F0F0Fu);
    let hi = (q >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
    return dot_block(lo, hi, xlo, xhi);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let it = tile_of(lid, wg, nwg);
    let x_block = it.x_block;
    var xrow = x_rows(it);
    var acc: array<vec4<f32>, MAX_TM>;
    // Per-block sums of the SCALE_AFTER path, zeroed explicitly per block: Chromium 156 (Tint,
    // SwiftShader) does not re-zero a loop-local `var` declared without an initializer.
    var qx: array<vec4<f32>, MAX_TM>;
    var xs: array<vec4<f32>, MAX_TM>;
    for (var b = it.lane; b < params.nb; b += KSPLIT) {
        let base = (it.gc * params.nb + b) * 5u;
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

    for (var t = 0u; t < TM; t++) {
        let sum = ksplit_sum(lid, it.lane, acc[t]);
        let a = it.a0 + t;
        if (it.live && a < params.n_rows) {
            store4(a, it.g * 4u, sum);
        }
    }
}
