// Tiles of up to 16 slots (a prelude after matmul_common.wgsl, in every matmul kernel but the
// `_wide` ones: see matmul_common.wgsl): no slots past those written out there.

const MAX_SLOTS: u32 = 16u;

fn accumulate_wide(st: ptr<function, State>, acc: ptr<function, array<Sum, MAX_SLOTS>>, it: Tile, b: u32) {}

fn finish_wide(it: Tile, lid: u32, acc: ptr<function, array<Sum, MAX_SLOTS>>) {}
