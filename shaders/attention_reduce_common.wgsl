// The prelude of the two split-K reduce kernels (attention_reduce.wgsl, attention_batch_reduce.wgsl),
// prepended to each body when its module is created (src/gpu/shaders.rs): the bindings they share
// and the combination of one row's split records into its normalized output. One invocation per
// (row, head, vec4 of head_dim); a body finds its invocation's records.
//
// parts: split records as written by attention_common.wgsl's attend() with SPLIT, 1 + head_dim/4
//        vec4 each: ((m, l, 0, 0), acc[head_dim/4]), unnormalized
// out:   [rows, n_heads * head_dim] f32

@group(0) @binding(1) var<storage, read> parts: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

override D4: u32 = 16u;     // head_dim / 4
override CHUNK: u32 = 128u; // keys per split, as in the attention kernel
override WG: u32 = 8u;

// out[out_vec4] = vec4 d of the softmax-weighted sum of the n_splits records at base, base +
// stride, ...: every one of them saw at least one key of the row in this step. Zeros when no key
// was visible (every block unmapped, or no split), not 0 / 0. Loop budget: 2 * n_splits.
fn combine(out_vec4: u32, base: u32, stride: u32, n_splits: u32, d: u32) {
    var m = -3.0e38;
    for (var s = 0u; s < n_splits; s++) {
        m = max(m, parts[base + s * stride].x);
    }
    var l = 0.0;
    var o = vec4<f32>(0.0);
    for (var s = 0u; s < n_splits; s++) {
        let rec = base + s * stride;
        let w = exp(parts[rec].x - m);
        l += parts[rec].y * w;
        o += parts[rec + 1u + d] * w;
    }
    out[out_vec4] = select(o / l, vec4<f32>(0.0), l == 0.0);
}
