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
