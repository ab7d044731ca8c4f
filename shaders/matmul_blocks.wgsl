// The matmul of every weight type without a body of its own, after matmul_common.wgsl, an
// activation prelude, quant_common.wgsl and the type's quant_<type>.wgsl: G = 4 rows per
// invocation, each chunk of 32 values decoded in registers by `decode` and used for all TM
// activation rows. The scale and offset apply once per half chunk and activation row:
// Σ_k (d q_k + m) x_k = d · Σ q_k x_k + m · Σ x_k. Activations are f32 (INT8 is not used by this
// body). Accumulation is f32.

// Rows per row group.
const G: u32 = 4u;

// The chunks of the 4 rows of a group.
struct Chunks {
    c0: Chunk,
    c1: Chunk,
    c2: Chunk,
    c3: Chunk,
}

// Σ_k q_k x_k over the two halves (values 0..15, 16..31) of one row's chunk.
fn halves_dot(c: Chunk, v: XF32) -> vec2<f32> {
    return vec2<f32>((dot(c.q[0], v[0]) + dot(c.q[1], v[1])) + (dot(c.q[2], v[2]) + dot(c.q[3], v[3])),
                     (dot(c.q[4], v[4]) + dot(c.q[5], v[5])) + (dot(c.q[6], v[6]) + dot(c.q[7], v[7])));
}

// What an invocation holds while it multiplies chunk kc: the TG groups' chunks (cq), the
// activation row's block (loaded at its first slot, j = 0, and reused by its other groups) in xv,
// g ⊙ x with NORM (g: the norm weight's block).
struct State {
    cq: array<Chunks, MAX_TG>,
    xv: XF32,
    g: XF32,
}

// A slot's sums: the group's 4 rows.
alias Sum = vec4<f32>;

// Chunk kc of the 4 rows n0..n0+3 of a group.
fn group_chunks(n0: u32, kc: u32) -> Chunks {
    return Chunks(decode(n0, kc, params.nb), decode(n0 + 1u, kc, params.nb), decode(n0 + 2u, kc, params.nb), decode(n0 + 3u, kc, params.nb));
}

fn load(st: ptr<function, State>, it: Tile, kc: u32) {
    (*st).cq[0] = group_chunks(group_at(it, 0u) * 4u, kc);
    if (TG > 1u) { (*st).cq[1] = group_chunks(group_at(it, 1u) * 4u, kc); }
    if (TG > 2u) { (*st).cq[2] = group_chunks(group_at(it, 2u) * 4u, kc); (*st).cq[3] = group_chunks(group_at(it, 3u) * 4u, kc); }
    (*st).g = g_f32(it, kc);
}

// The 4 rows' sums of slot s of the tile (activation row t = s / TG against row group j = s % TG,
// see matmul_common.wgsl) over chunk kc.
fn slot(st: ptr<function, State>, it: Tile, s: u32, kc: u32) -> Sum {
    if (s % TG == 0u) {
        (*st).xv = x_in(it, s / TG, kc, (*st).g);
    }
    let v = (*st).xv;
    let cs = (*st).cq[s % TG];
    let p0 = halves_dot(cs.c0, v);
    let p1 = halves_dot(cs.c1, v);
    let p2 = halves_dot(cs.c2, v);
    let p3 = halves_dot(cs.c3, v);
    let lo = vec4<f32>(p0.x, p1.x, p2.x, p3.x);
    let hi = vec4<f32>(p0.y, p1.y, p2.y, p3.y);
    let s_lo = (v[0] + v[1]) + (v[2] + v[3]);
    let s_hi = (v[4] + v[5]) + (v[6] + v[7]);
    let d_lo = vec4<f32>(cs.c0.d.x, cs.c1.d.x, cs.c2.d.x, cs.c3.d.x);
    let d_hi = vec4<f32>(cs.c0.d.y, cs.c1.d.y, cs.c2.d.y, cs.c3.d.y);
    let m_lo = vec4<f32>(cs.c0.m.x, cs.c1.m.x, cs.c2.m.x, cs.c3.m.x);
    let m_hi = vec4<f32>(cs.c0.m.y, cs.c1.m.y, cs.c2.m.y, cs.c3.m.y);
    let one = vec4<f32>(1.0);
    return d_lo * lo + d_hi * hi + m_lo * dot(s_lo, one) + m_hi * dot(s_hi, one);
}

fn finish_sum(it: Tile, lid: u32, s: u32, v: Sum) {
    finish(it, lid, s, 0u, v);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
    run_tile(ids);
}
