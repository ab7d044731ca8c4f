// The gate activations of the gated FFN, a prelude of glu.wgsl and of the matmul kernels (whose
// gated epilogue applies them, matmul_common.wgsl): silu(g) = g / (1 + exp(-g)) (SwiGLU, llama)
// or, with GELU, gelu_tanh(g) = g/2 * (1 + tanh(√(2/π) (g + 0.044715 g³))) (GeGLU, Gemma).

override GELU: bool = false;

// sigmoid through exp(-|g|) only: the exponent never overflows, so huge |g| gives exactly
// 0 or 1 instead of inf/inf or a NaN (implementations may assume no infinities in WGSL).
fn silu(g: f32) -> f32 {
    let e = exp(-abs(g));
    let sigmoid = select(e / (1.0 + e), 1.0 / (1.0 + e), g >= 0.0);
    return g * sigmoid;
}

// g/2 · (1 + tanh(u)) written as g · sigmoid(2u), through exp(-2|u|) only: no cancellation where
// tanh(u) is near -1 (a plain 1 + tanh loses most digits there), finite for any g.
fn gelu_tanh(g: f32) -> f32 {
    let u = 0.7978845608028654 * (g + 0.044715 * g * g * g);
    let e = exp(-2.0 * abs(u));
    let sigmoid = select(e / (1.0 + e), 1.0 / (1.0 + e), u >= 0.0);
    return g * sigmoid;
}

fn act(g: f32) -> f32 {
    if (GELU) {
        return gelu_tanh(g);
    }
    return silu(g);
}
