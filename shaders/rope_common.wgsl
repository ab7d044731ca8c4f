// The prelude of the kernels that apply rotary position embeddings (rope.wgsl: one invocation
// per (token, pair); qkv_heads.wgsl: one per (token, head)), prepended to each body
// (src/gpu/shaders.rs; and attention_fresh.wgsl, the decode attention that ropes its step's
// heads itself), so all rotate with the same arithmetic. Each body loads and stores the pairs it
// rotates and holds a turn table in its parameters (see below).
//
// Pair i of a head is (x[2i], x[2i+1]) (NORM) or (x[i], x[i + head_dim/2]) (NEOX, Gemma's) and
// rotates by pos * theta_i, theta_i = base^(-2i/head_dim) (the table may say otherwise: RoPE
// factors divide theta_i, and qkv_heads.wgsl may rotate only the first dims, paired within them).
//
// The angle is built in turns: the table's entry for pair i holds theta_i / 2π as a 0.32
// fixed-point fraction (a u32, the integer part dropped) and the f32 remainder the fixed point
// misses; two pairs per vec4<u32> (pair i: components (2 * (i % 2), 2 * (i % 2) + 1) of entry
// i / 2 = (fraction, f32 bits of the remainder); src/gpu/ops/rope.rs fills it). pos * fraction
// wraps mod 2^32, which drops whole turns exactly, so the reduced angle is good to ~1e-7 rad at
// any position (a plain f32 pos * theta is off by up to ~6e-4 rad at pos 8191).
// WGSL's sin/cos are only specified to 2^-11 absolute on [-π, π], and SwiftShader's miss by ~2e-4,
// so the prelude evaluates its own polynomials on [-π/4, π/4] and maps the quadrant back.

override NEOX: bool = false;
// cos and sin times this (LongRoPE's attention factor, phi3); 1 otherwise.
override ROPE_SCALE: f32 = 1.0;

const TWO_PI: f32 = 6.283185307179586;
const INV_2_32: f32 = 2.3283064365386963e-10;

// (sin, cos) of `turns` whole turns, |turns| <= 0.5 + a little: to within ~1e-7 absolute.
fn sin_cos_turns(turns: f32) -> vec2<f32> {
    let quadrant = round(turns * 4.0);
    // Exact (Sterbenz): turns is within a factor of two of quadrant / 4, or quadrant is 0.
    let a = (turns - quadrant * 0.25) * TWO_PI;
    let a2 = a * a;
    // Taylor series to a^9 / a^10: truncation below 2e-9 on [-π/4, π/4].
    let sin_a = a + a * a2 * (-1.0 / 6.0 + a2 * (1.0 / 120.0 + a2 * (-1.0 / 5040.0 + a2 * (1.0 / 362880.0))));
    let cos_a = 1.0 + a2 * (-0.5 + a2 * (1.0 / 24.0 + a2 * (-1.0 / 720.0 + a2 * (1.0 / 40320.0 - a2 * (1.0 / 3628800.0)))));
    // Rotate by quadrant * π/2.
    switch (u32(i32(quadrant) + 4) & 3u) {
        case 1u: { return vec2<f32>(cos_a, -sin_a); }
        case 2u: { return vec2<f32>(-sin_a, -cos_a); }
        case 3u: { return vec2<f32>(-cos_a, sin_a); }
        default: { return vec2<f32>(sin_a, cos_a); }
    }
}

// (sin, cos) of pair `pair`'s angle at position `pos`; `entry` is the table's entry pair / 2.
fn pair_sin_cos(entry: vec4<u32>, pair: u32, pos: u32) -> vec2<f32> {
    let odd = (pair & 1u) == 1u;
    let fraction = select(entry.x, entry.z, odd);
    let remainder = bitcast<f32>(select(entry.y, entry.w, odd));
    // Wrapping u32 multiply: the fractional turns of pos * theta_i / 2π, read as signed [-0.5, 0.5).
    let wrapped = f32(bitcast<i32>(pos * fraction)) * INV_2_32;
    var turns = wrapped + f32(pos) * remainder;
    turns = turns - round(turns);
    return sin_cos_turns(turns);
}

// Where pair `pair` of a head of 2 * half dims sits: (its first dim, the distance to its second).
fn pair_dims(pair: u32, half: u32) -> vec2<u32> {
    return vec2<u32>(select(2u * pair, pair, NEOX), select(1u, half, NEOX));
}

// The pair v = (x_j, x_other) rotated by the angle whose (sin, cos) is sc (times ROPE_SCALE).
fn rotated(v: vec2<f32>, sc: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(v.x * sc.y - v.y * sc.x, v.x * sc.x + v.y * sc.y) * ROPE_SCALE;
}
