// Tiles of up to 32 slots (a prelude after matmul_common.wgsl, in the `_wide` kernels of the
// matmul variant without shared loads or split sums: see matmul_common.wgsl): slots 16..31,
// written out as slots 0..15 are there.

const MAX_SLOTS: u32 = 32u;

// accumulate for slots 16..31.
fn accumulate_wide(st: ptr<function, State>, acc: ptr<function, array<Sum, MAX_SLOTS>>, it: Tile, b: u32) {
    if (TM * TG > 16u) { (*acc)[16] += slot(st, it, 16u, b); }
    if (TM * TG > 17u) { (*acc)[17] += slot(st, it, 17u, b); }
    if (TM * TG > 18u) { (*acc)[18] += slot(st, it, 18u, b); }
    if (TM * TG > 19u) { (*acc)[19] += slot(st, it, 19u, b); }
    if (TM * TG > 20u) { (*acc)[20] += slot(st, it, 20u, b); }
    if (TM * TG > 21u) { (*acc)[21] += slot(st, it, 21u, b); }
    if (TM * TG > 22u) { (*acc)[22] += slot(st, it, 22u, b); }
    if (TM * TG > 23u) { (*acc)[23] += slot(st, it, 23u, b); }
    if (TM * TG > 24u) { (*acc)[24] += slot(st, it, 24u, b); }
    if (TM * TG > 25u) { (*acc)[25] += slot(st, it, 25u, b); }
    if (TM * TG > 26u) { (*acc)[26] += slot(st, it, 26u, b); }
    if (TM * TG > 27u) { (*acc)[27] += slot(st, it, 27u, b); }
    if (TM * TG > 28u) { (*acc)[28] += slot(st, it, 28u, b); }
    if (TM * TG > 29u) { (*acc)[29] += slot(st, it, 29u, b); }
    if (TM * TG > 30u) { (*acc)[30] += slot(st, it, 30u, b); }
    if (TM * TG > 31u) { (*acc)[31] += slot(st, it, 31u, b); }
}

// The finish of slots 16..31.
fn finish_wide(it: Tile, lid: u32, acc: ptr<function, array<Sum, MAX_SLOTS>>) {
    if (TM * TG > 16u) { finish_sum(it, lid, 16u, (*acc)[16]); }
    if (TM * TG > 17u) { finish_sum(it, lid, 17u, (*acc)[17]); }
    if (TM * TG > 18u) { finish_sum(it, lid, 18u, (*acc)[18]); }
    if (TM * TG > 19u) { finish_sum(it, lid, 19u, (*acc)[19]); }
    if (TM * TG > 20u) { finish_sum(it, lid, 20u, (*acc)[20]); }
    if (TM * TG > 21u) { finish_sum(it, lid, 21u, (*acc)[21]); }
    if (TM * TG > 22u) { finish_sum(it, lid, 22u, (*acc)[22]); }
    if (TM * TG > 23u) { finish_sum(it, lid, 23u, (*acc)[23]); }
    if (TM * TG > 24u) { finish_sum(it, lid, 24u, (*acc)[24]); }
    if (TM * TG > 25u) { finish_sum(it, lid, 25u, (*acc)[25]); }
    if (TM * TG > 26u) { finish_sum(it, lid, 26u, (*acc)[26]); }
    if (TM * TG > 27u) { finish_sum(it, lid, 27u, (*acc)[27]); }
    if (TM * TG > 28u) { finish_sum(it, lid, 28u, (*acc)[28]); }
    if (TM * TG > 29u) { finish_sum(it, lid, 29u, (*acc)[29]); }
    if (TM * TG > 30u) { finish_sum(it, lid, 30u, (*acc)[30]); }
    if (TM * TG > 31u) { finish_sum(it, lid, 31u, (*acc)[31]); }
}
