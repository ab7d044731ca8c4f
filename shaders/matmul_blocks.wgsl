// The matmul of every weight type without a body of its own, after matmul_common.wgsl,
// quant_common.wgsl and the type's quant_<type>.wgsl: G = 4 rows per invocation, each chunk of 32
// values decoded in registers by `decode` and used for all TM activation rows. The scale and
// offset apply once per half chunk and activation row: Σ_k (d q_k + m) x_k = d · Σ q_k x_k + m · Σ x_k.
// Activations are f32 (INT8 is not used by this body). Accumulation is f32.

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let it = tile_of(lid, wg, nwg);
    var xrow = x_rows(it);
    var acc: array<vec4<f32>, MAX_TM>;
    let n0 = it.gc * 4u;
    for (var kc = it.lane; kc < params.nb; kc += KSPLIT) {
        let c0 = decode(n0, kc, params.nb);
        let c1 = decode(n0 + 1u, kc, params.nb);
        let c2 = decode(n0 + 2u, kc, params.nb);
        let c3 = decode(n0 + 3u, kc, params.nb);
        let d_lo = vec4<f32>(c0.d.x, c1.d.x, c2.d.x, c3.d.x);
        let d_hi = vec4<f32>(c0.d.y, c1.d.y, c2.d.y, c3.d.y);
        let m_lo = vec4<f32>(c0.m.x, c1.m.x, c2.m.x, c3.m.x);
        let m_hi = vec4<f32>(c0.m.y, c1.m.y, c2.m.y, c3.m.y);
        let xb = kc * 8u;
        for (var t = 0u; t < TM; t++) {
            // Zeroed explicitly: Chromium 156 (Tint, SwiftShader) does not re-zero a loop-local
            // `var` declared without an initializer.
            var lo = vec4<f32>(0.0);
            var hi = vec4<f32>(0.0);
            var xs_lo = vec4<f32>(0.0);
            var xs_hi = vec4<f32>(0.0);
            for (var i = 0u; i < 4u; i++) {
                let xl = bitcast<vec4<f32>>(x[xrow[t] + xb + i]);
                let xh = bitcast<vec4<f32>>(x[xrow[t] + xb + 4u + i]);
                lo += vec4<f32>(dot(c0.q[i], xl), dot(c1.q[i], xl), dot(c2.q[i], xl), dot(c3.q[i], xl));
                hi += vec4<f32>(dot(c0.q[4u + i], xh), dot(c1.q[4u + i], xh), dot(c2.q[4u + i], xh), dot(c3.q[4u + i], xh));
                xs_lo += xl;
                xs_hi += xh;
            }
            let one = vec4<f32>(1.0);
            acc[t] += d_lo * lo + d_hi * hi + m_lo * dot(xs_lo, one) + m_hi * dot(xs_hi, one);
        }
    }

    for (var t = 0u; t < TM; t++) {
        let sum = ksplit_sum(lid, it.lane, acc[t]);
        let a = it.a0 + t;
        if (it.live && a < params.n_rows) {
            store4(a, n0, sum);
        }
    }
}
