// Splits a GGUF into parts as llama.cpp's gguf-split does (`gguf-split --split-max-tensors`), for
// the storage tests: every part a valid GGUF with `split.no` (u16, from 0), `split.count` (u16)
// and `split.tensors.count` (i32) after its metadata; the first part holds all the original
// metadata, the others only those three keys; the tensors in their order, each part's data
// section aligned to the file's alignment (the default 32 in parts without general.alignment).
import { readFileSync, writeFileSync } from "node:fs";

const FIXED = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
const STRING = 8;
const ARRAY = 9;

/** The offset just past the value of type `type` at `at`. */
function skipValue(buf, type, at) {
  if (FIXED[type] !== undefined) return at + FIXED[type];
  if (type === STRING) return at + 8 + Number(buf.readBigUInt64LE(at));
  if (type === ARRAY) {
    const itemType = buf.readUInt32LE(at);
    const count = Number(buf.readBigUInt64LE(at + 4));
    let next = at + 12;
    if (FIXED[itemType] !== undefined) return next + count * FIXED[itemType];
    for (let i = 0; i < count; i++) next = skipValue(buf, itemType, next);
    return next;
  }
  throw new Error(`GGUF value type ${type} unknown`);
}

const readString = (buf, at) => {
  const length = Number(buf.readBigUInt64LE(at));
  return [buf.toString("utf8", at + 8, at + 8 + length), at + 8 + length];
};

function stringBytes(text) {
  const bytes = Buffer.from(text, "utf8");
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(bytes.length));
  return Buffer.concat([length, bytes]);
}

function kv(key, type, value) {
  const head = Buffer.concat([stringBytes(key), Buffer.from(new Uint32Array([type]).buffer)]);
  const body = Buffer.alloc(type === 2 ? 2 : 4);
  if (type === 2) body.writeUInt16LE(value);
  else body.writeInt32LE(value);
  return Buffer.concat([head, body]);
}

const pad = (n, align) => (align - (n % align)) % align;

/**
 * Writes `src` split into `parts` files (tensors shared out in order) at
 * `${stem}-0000k-of-0000N.gguf`; returns their paths.
 */
export function splitGguf(src, stem, parts) {
  const buf = readFileSync(src);
  if (buf.toString("latin1", 0, 4) !== "GGUF" || buf.readUInt32LE(4) !== 3) throw new Error(`${src}: not a GGUF v3 file`);
  const tensorCount = Number(buf.readBigUInt64LE(8));
  const kvCount = Number(buf.readBigUInt64LE(16));
  let at = 24;
  let alignment = 32;
  const kvStart = at;
  for (let i = 0; i < kvCount; i++) {
    const [key, next] = readString(buf, at);
    const type = buf.readUInt32LE(next);
    if (key === "general.alignment") alignment = buf.readUInt32LE(next + 4);
    at = skipValue(buf, type, next + 4);
  }
  const metadata = buf.subarray(kvStart, at);
  const tensors = [];
  for (let i = 0; i < tensorCount; i++) {
    const [name, next] = readString(buf, at);
    const dims = buf.readUInt32LE(next);
    const shape = buf.subarray(next, next + 4 + 8 * dims);
    const type = buf.readUInt32LE(next + 4 + 8 * dims);
    const offset = Number(buf.readBigUInt64LE(next + 8 + 8 * dims));
    tensors.push({ name, shape, type, offset });
    at = next + 16 + 8 * dims;
  }
  const dataStart = at + pad(at, alignment);
  const ends = [...tensors.slice(1).map((t) => t.offset), buf.length - dataStart];
  tensors.forEach((t, i) => { t.bytes = buf.subarray(dataStart + t.offset, dataStart + ends[i]); });
  const per = Math.ceil(tensors.length / parts);
  const paths = [];
  for (let p = 0; p < parts; p++) {
    const mine = tensors.slice(p * per, (p + 1) * per);
    const keys = [kv("split.no", 2, p), kv("split.count", 2, parts), kv("split.tensors.count", 5, tensorCount)];
    const header = Buffer.alloc(24);
    header.write("GGUF", 0, "latin1");
    header.writeUInt32LE(3, 4);
    header.writeBigUInt64LE(BigInt(mine.length), 8);
    header.writeBigUInt64LE(BigInt((p === 0 ? kvCount : 0) + keys.length), 16);
    const infos = [];
    const data = [];
    let offset = 0;
    for (const t of mine) {
      const where = Buffer.alloc(8);
      where.writeBigUInt64LE(BigInt(offset));
      infos.push(stringBytes(t.name), t.shape, Buffer.from(new Uint32Array([t.type]).buffer), where);
      data.push(t.bytes, Buffer.alloc(pad(t.bytes.length, alignment)));
      offset += t.bytes.length + pad(t.bytes.length, alignment);
    }
    const head = Buffer.concat([header, p === 0 ? metadata : Buffer.alloc(0), ...keys, ...infos]);
    const path = `${stem}-${String(p + 1).padStart(5, "0")}-of-${String(parts).padStart(5, "0")}.gguf`;
    writeFileSync(path, Buffer.concat([head, Buffer.alloc(pad(head.length, alignment)), ...data]));
    paths.push(path);
  }
  return paths;
}
