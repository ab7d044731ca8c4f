// The first prelude of the attention kernels on devices with the `subgroups` feature
// (src/gpu/shaders.rs; attention_group.wgsl is the other one, with the same names): a group is a
// subgroup, whose invocations combine their softmax states with subgroup reductions, in registers,
// with no memory and no barrier; its first invocation writes the group's record. When the
// workgroup is one subgroup (ONE_GROUP, attention_common.wgsl) no record is written at all.
// Called in uniform control flow only (every invocation of the subgroup takes part).
// No `enable subgroups;` heads these sources: naga 30 refuses the directive ("not yet
// implemented") and accepts the operations without it; wgpu's browser backend never reports
// subgroups today, so tint never sees these sources.

struct Ids {
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) sl: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
}

fn group_max(v: vec4<f32>) -> vec4<f32> {
    return subgroupMax(v);
}

fn group_sum(v: vec4<f32>) -> vec4<f32> {
    return subgroupAdd(v);
}

fn group_leader(ids: Ids) -> bool {
    return ids.sl == 0u;
}

// The invocation's group among the workgroup's, and how many there are: the records a WG_SPLIT
// workgroup writes and combines are its subgroups' (4 for 128 invocations in subgroups of 32),
// not its invocations'.
fn group_index(ids: Ids) -> u32 {
    return ids.sg;
}

fn group_count(ids: Ids) -> u32 {
    return ids.nsg;
}

// SHARED_KV (attention_common.wgsl): the invocation's lane among the 8 that share a key's loads.
fn kv_lane(ids: Ids) -> u32 {
    return ids.sl & 7u;
}

// SHARED_KV: the key range every invocation of the subgroup walks, the union of theirs.
fn shared_span(begin: u32, end: u32) -> vec2<u32> {
    return vec2<u32>(subgroupMin(begin), subgroupMax(end));
}

// SHARED_KV: what lane `lane` (< 8) of the subgroup loaded. A broadcast takes a constant lane,
// so one per case; every caller passes a constant, and the switch folds away once inlined.
fn from_lane(x: vec4<u32>, lane: u32) -> vec4<u32> {
    switch (lane) {
        case 0u: { return subgroupBroadcast(x, 0u); }
        case 1u: { return subgroupBroadcast(x, 1u); }
        case 2u: { return subgroupBroadcast(x, 2u); }
        case 3u: { return subgroupBroadcast(x, 3u); }
        case 4u: { return subgroupBroadcast(x, 4u); }
        case 5u: { return subgroupBroadcast(x, 5u); }
        case 6u: { return subgroupBroadcast(x, 6u); }
        default: { return subgroupBroadcast(x, 7u); }
    }
}
