// Int8 activations for the INT8 variant of matmul_q4_1 / matmul_q8_0 (llama.cpp's Q8_1 idea), a
// prelude of quantize_act.wgsl and of the norms that quantize their output (rms_norm.wgsl,
// residual_norm.wgsl): value ≈ d · q with d = max|x| / 127, q = round(x / d) in [-127, 127].
// Block b (values 32b..32b+31) of row a is 3 vec4<u32> at (a · nb + b) · 3:
//   [0], [1]  the 32 quants, 4 per u32 in order (pack4xI8), values 0..15 then 16..31;
//   [2]       x: d (f32 bits), y: the exact f32 sum of the block's 32 inputs (for Q4_1's minimum), z, w: 0.

// The 3 vec4 of the block holding the 32 values v (in order, 4 per vec4).
fn quantize_block(v: array<vec4<f32>, 8>) -> array<vec4<u32>, 3> {
    var amax = vec4<f32>(0.0);
    var sum = vec4<f32>(0.0);
    for (var i = 0u; i < 8u; i++) {
        amax = max(amax, abs(v[i]));
        sum += v[i];
    }
    let m = max(max(amax.x, amax.y), max(amax.z, amax.w));
    let d = m / 127.0;
    let inv = select(0.0, 1.0 / d, d > 0.0);
    var packed: array<u32, 8>;
    for (var i = 0u; i < 8u; i++) {
        packed[i] = pack4xI8(vec4<i32>(round(v[i] * inv)));
    }
    return array<vec4<u32>, 3>(vec4<u32>(packed[0], packed[1], packed[2], packed[3]),
                               vec4<u32>(packed[4], packed[5], packed[6], packed[7]),
                               vec4<u32>(bitcast<u32>(d), bitcast<u32>(dot(sum, vec4<f32>(1.0))), 0u, 0u));
}
