// Q8_0 weights, after matmul_common.wgsl: G = 8, the 8 rows 8g..8g+7 of group g side by side.
// Group g, block b (columns 32b..32b+31) is 17 vec4<u32> (8 × 34 bytes, the GGUF size) at (g · nb + b) · 17:
//   [0]               the 8 rows' f16 scales d, row r in half r % 2 of u32 r / 2;
//   [1 + 2r, 2 + 2r]  row r's 32 signed quant bytes in order.
// Rows past `rows` are zero blocks. Value = d · q, dequantized in registers, f32 throughout.

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;

// The 4 signed bytes of `word` times `scale`.
fn quants(word: u32, scale: f32) -> vec4<f32> {
    return vec4<f32>(unpack4xI8(word)) * scale;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let it = tile_of(lid, wg, nwg);
    let x_block = it.x_block;
    var xrow = x_rows(it);
    // Rows 0..3 and 4..7 of the group.
    var acc_lo: array<vec4<f32>, MAX_TM>;
    var acc_hi: array<vec4<f32>, MAX_TM>;
    // Per-block sums, zeroed explicitly per block: Chromium 156 (Tint, SwiftShader) does not
    // re-zero a loop-local `var` declared without an initializer.
    var qx_lo: array<vec4<f32>, MAX_TM>;
    var qx_hi: array<vec4<f32>, MAX_TM>;
    for (var b = it.lane; b < params.nb; b += KSPLIT) {
        let base = (it.gc * params.nb + b) * 17u;
        let sc = w[base];
        let d01 = unpack2x16float(sc.x);
        let d23 = unpack2x16float(sc.y);
        let d45 = unpack2x16float(sc.z);
        let d67 = unpack2x16float(sc.w);
        let xb = b * x_block;
        let d_lo = vec4<f32>(d01, d23);
        let d_hi = vec4<f32>(d45, d67);
        if (INT8) {
            // Row r's 32 quants: w[base + 1 + 2r] (values 0..15) and w[base + 2 + 2r] (16..31).
            let q0 = w[base + 1u];
            let q1 = w[base + 3u];
            let q2 = w[base + 5u];
            let q3 = w[base + 7u];
            let q4 = w[base + 9u];
            let q5 = w[base + 11u];
            let q6 = w[base + 13u];
            let q7 = w[base + 15u];
            let r0 = w[base + 2u];
            let r1 = w[base + 4u];
            let r2 = w[base + 6u];
            let r3 = w[base + 8u];
            let r4 = w[base + 10u];
            let r5 = w[base + 12u];
            let r6 = w[base + 14u];
            let r7 = w[base + 16u];
            for (var t = 0u; t < TM; t++) {
                let xlo = x[xrow[t] + xb];
                let xhi = x[xrow[t] + xb + 1u];
                let xd = bitcast<f32>(x[xrow[t] + xb + 2u].x);
                let lo = vec4<f32>(f32(dot_block(q0, r0, xlo, xhi)), f32(dot_block(q1, r1, xlo, xhi)),
                                   f32(dot_block(q2, r2, xlo, xhi)), f32(dot_block(q3, r3, xlo, xhi)));
                let hi = vec4<f32>(f32(dot_block(q4, r4, xlo, xhi)), f32(dot_block(q5, r5, xlo, xhi)),
                                   f32(dot_block(q6, r6, xlo, xhi)), f32(dot_block(q7, r7, xlo, xhi)));
                acc_lo[t] = fma(d_lo * xd, lo, acc_lo[t]);
                acc_hi[t] = fma(d_hi * xd, hi, acc_hi[t]);
            }
            continue;
        }
        // Σ_k x_k d q_k = d · Σ_k x_k q_k: one scale per block and row (SCALE_AFTER), or one per
        // value reused for all TM activation rows.
        let s_lo = select(d_lo, vec4<f32>(1.0), SCALE_AFTER);
        let s_hi = select(d_hi, vec4<f32>(1.0), SCALE_AFTER);
        for (var t = 0u; t < TM; t++) {
            qx_lo[t] = vec4<f32>(0.0);
            qx_hi[t] = vec4<f32>(0.0);
        }
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
                let v0 = quants(q0[i], s_lo.x);
                let v1 = quants(q1[i], s_lo.y);
                let v2 = quants(q2[i], s_lo.z);
                let v3 = quants(q3[i], s_lo.w);
                let v4 = quants(q4[i], s_hi.x);
                let v5 = quants(q5[i], s_hi.y);
                let v6 = quants(q6[i], s_hi.z);
                let v7 = quants(q7[i], s_hi.w);
                for (var t = 0u; t < TM; t++) {
                    let xv = bitcast<vec4<f32>>(x[xrow[t] + xb + 4u * h + i]);
                    qx_lo[t] += vec4<f32>(dot(v0, xv), dot(v1, xv), dot(v2, xv), dot(v3, xv));
                    qx_hi[t] += vec4<f32>(dot(v4, xv), dot(v5, xv), dot(v6, xv), dot(v7, xv));
                }
            }
        }
        for (var t = 0u; t < TM; t++) {
            if (SCALE_AFTER) {
                acc_lo[t] = fma(d_lo, qx_lo[t], acc_lo[t]);
                acc_hi[t] = fma(d_hi, qx_hi[t], acc_hi[t]);
            } else {
                acc_lo[t] += qx_lo[t];
                acc_hi[t] += qx_hi[t];
            }
        }
    }

    for (var t = 0u; t < TM; t++) {
        let lo = ksplit_sum(lid, it.lane, acc_lo[t]);
        let hi = ksplit_sum(lid, it.lane, acc_hi[t]);
        let a = it.a0 + t;
        if (it.live && a < params.n_rows) {
            store4(a, it.g * 8u, lo);
            store4(a, it.g * 8u + 4u, hi);
        }
    }
}
