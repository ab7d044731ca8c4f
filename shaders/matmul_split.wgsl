// How the matmul kernels split a row group's blocks over KSPLIT adjacent invocations and sum
// their results, through workgroup memory (a prelude after matmul_common.wgsl, with matmul_x.wgsl's
// loads; matmul_split_subgroup.wgsl sums within a subgroup instead). With KSPLIT = 1 (CPU
// adapters) the barriers are compiled out. The entry point's inputs are `Ids`.

struct Ids {
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
}

var<workgroup> partial: array<vec4<f32>, WG>;
var<workgroup> partial_sumsq: array<f32, WG>;

// Its place among the KSPLIT invocations sharing a group.
fn k_lane_of(ids: Ids) -> u32 {
    return ids.lid % KSPLIT;
}

// Its group's place among the WG / KSPLIT groups of the workgroup.
fn slot_of(ids: Ids) -> u32 {
    return ids.lid / KSPLIT;
}

fn x_lane_of(ids: Ids) -> u32 {
    return 0u;
}

// The sums of v and ss over the KSPLIT invocations sharing a group, valid in lane 0, through
// workgroup memory. With KSPLIT > 1 every invocation of the workgroup must call it (barriers).
fn k_reduce(lid: u32, lane: u32, v: vec4<f32>, ss: f32) -> Reduced {
    var r = Reduced(v, ss);
    if (KSPLIT > 1u) {
        partial[lid] = v;
        if (NORM) {
            partial_sumsq[lid] = ss;
        }
        workgroupBarrier();
        if (lane == 0u) {
            for (var l = 1u; l < KSPLIT; l++) {
                r.v += partial[lid + l];
                if (NORM) {
                    r.sumsq += partial_sumsq[lid + l];
                }
            }
        }
        workgroupBarrier();
    }
    return r;
}
