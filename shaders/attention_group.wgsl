// The first prelude of the attention kernels on devices without subgroups (src/gpu/shaders.rs;
// attention_group_subgroup.wgsl is the other one, with the same names): the invocation ids a
// kernel's entry point takes, and how the invocations of a workgroup that split one item's keys
// (WG_SPLIT, attention_common.wgsl) combine their softmax states in registers before they combine
// them through memory. Here every invocation is a group of its own: group_max and group_sum are
// the identity and every invocation leads its group, so each writes its own record.

struct Ids {
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
}

// The largest v over the invocation's group, per component.
fn group_max(v: vec4<f32>) -> vec4<f32> {
    return v;
}

// The sum of v over the invocation's group.
fn group_sum(v: vec4<f32>) -> vec4<f32> {
    return v;
}

// True for the one invocation of a group that writes the group's record.
fn group_leader(ids: Ids) -> bool {
    return true;
}

// The invocation's group among the workgroup's (the index of its record), and how many there are.
fn group_index(ids: Ids) -> u32 {
    return ids.lid;
}

fn group_count(ids: Ids) -> u32 {
    return WG;
}

// SHARED_KV needs subgroups (attention_group_subgroup.wgsl): never set with this prelude, where
// these keep every invocation on its own keys and loads.
fn kv_lane(ids: Ids) -> u32 {
    return 0u;
}

fn shared_span(begin: u32, end: u32) -> vec2<u32> {
    return vec2<u32>(begin, end);
}

fn from_lane(x: vec4<u32>, lane: u32) -> vec4<u32> {
    return x;
}
