// Rotary position embedding, in place: llama's NORM pairing or NEOX pairing (NEOX).
// x: [n_tokens, row_stride] f32; heads 0..n_heads of each row start at column 0, head_dim apart
//    (on the fused qkv rows: the q heads, then the k heads; the v heads after them are untouched).
// positions: [n_tokens] u32, the absolute position of each token.
// Pair i of a head is (x[2i], x[2i+1]) (NORM) or (x[i], x[i + head_dim/2]) (NEOX, Gemma's) and rotates
// by pos * theta_i, theta_i = base^(-2i/head_dim).
// One invocation per (token, pair): it forms the angle once and rotates that pair in every head.
//
// The angle is built in turns: params.turns[i] holds theta_i / 2π as a 0.32 fixed-point fraction
// (a u32, the integer part dropped) and the f32 remainder the fixed point misses. pos * fraction
// wraps mod 2^32, which drops whole turns exactly, so the reduced angle is good to ~1e-7 rad at
// any position (a plain f32 pos * theta is off by up to ~6e-4 rad at pos 8191).
// WGSL's sin/cos are only specified to 2^-11 absolute on [-π, π], and SwiftShader's miss by ~2e-4,
// so the shader evaluates its own polynomials on [-π/4, π/4] and maps the quadrant back.

struct Params {
    n_tokens: u32,
    row_stride: u32,
    n_heads: u32,
    head_dim: u32,
    // pair i: turns[i / 2] components (2 * (i % 2), 2 * (i % 2) + 1) = (fixed-point fraction, f32 bits of the remainder)
    turns: array<vec4<u32>, 128>,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> positions: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

override WG: u32 = 64u;
override NEOX: bool = false;

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

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = gid.x + gid.y * nwg.x * WG;
    let half = params.head_dim / 2u;
    if (item >= params.n_tokens * half) {
        return;
    }
    let token = item / half;
    let pair = item % half;
    let entry = params.turns[pair / 2u];
    let odd = (pair & 1u) == 1u;
    let fraction = select(entry.x, entry.z, odd);
    let remainder = bitcast<f32>(select(entry.y, entry.w, odd));
    let pos = positions[token];
    // Wrapping u32 multiply: the fractional turns of pos * theta_i / 2π, read as signed [-0.5, 0.5).
    let wrapped = f32(bitcast<i32>(pos * fraction)) * INV_2_32;
    var turns = wrapped + f32(pos) * remainder;
    turns = turns - round(turns);
    let sc = sin_cos_turns(turns);
    let s = sc.x;
    let c = sc.y;
    let first = token * params.row_stride + select(2u * pair, pair, NEOX);
    let other = select(1u, half, NEOX);
    for (var h = 0u; h < params.n_heads; h += 1u) {
        let j = first + h * params.head_dim;
        let x0 = x[j];
        let x1 = x[j + other];
        x[j] = x0 * c - x1 * s;
        x[j + other] = x0 * s + x1 * c;
    }
}
