// How the matmul kernels split a row group's blocks over KSPLIT invocations and sum their results
// on devices whose subgroups hold KSPLIT invocations or more (a prelude after matmul_common.wgsl
// instead of matmul_split.wgsl, with the same functions, before matmul_x.wgsl's loads), for real
// GPUs (KSPLIT > 1, a power of two): the KSPLIT invocations sharing a group are adjacent lanes of
// one subgroup, and they sum their results with log2(KSPLIT) subgroupShuffleXor steps instead of
// through workgroup memory and two barriers.
// Groups are placed subgroup by subgroup (subgroup_id, subgroup_size), which holds whatever
// subgroup size the device picks between its minimum (≥ KSPLIT, Context::has_subgroups) and its
// maximum, as long as the workgroup's subgroups are filled in order, as Vulkan, Metal and D3D12
// fill one-dimensional workgroups.
// No `enable subgroups;` heads these sources: see matmul_x_subgroup.wgsl.

struct Ids {
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) sl: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_id) sg_id: u32,
}

// Its place among the KSPLIT lanes sharing a group.
fn k_lane_of(ids: Ids) -> u32 {
    return ids.sl % KSPLIT;
}

// Its group's place among the WG / KSPLIT groups of the workgroup: sg_size / KSPLIT groups per
// subgroup.
fn slot_of(ids: Ids) -> u32 {
    return ids.sg_id * (ids.sg_size / KSPLIT) + ids.sl / KSPLIT;
}

fn x_lane_of(ids: Ids) -> u32 {
    return 0u;
}

// The sums over the KSPLIT lanes of a group, in every one of them: a butterfly over lane
// distances 1, 2, .., KSPLIT / 2, which never leaves the aligned run of KSPLIT lanes. Every lane
// of the subgroup calls it (uniform control flow: after the block loop, no early return).
fn k_reduce(lid: u32, lane: u32, v: vec4<f32>, ss: f32) -> Reduced {
    var r = Reduced(v, ss);
    for (var d = 1u; d < KSPLIT; d <<= 1u) {
        r.v += subgroupShuffleXor(r.v, d);
        if (NORM) {
            r.sumsq += subgroupShuffleXor(r.sumsq, d);
        }
    }
    return r;
}
