// Round trips of hearth's Durable Object storage format (sdk/js/engine/src/
// objects.js): run at the module's top level, so building this module with
// the engine is the test (tests/it/js_objects.rs); a failed check throws,
// and the build fails with its message. It reaches the engine's codec
// through `__hearth.objects`, an internal of the engine, not an API.
//
// Each value is serialized, deserialized, and compared with a deep
// equality that tells -0 from 0, NaN from everything but NaN, a hole from
// undefined, and checks that shared and cyclic references stay shared; a
// few encodings are checked byte for byte (the format is stored: it must
// not change by accident); what structured clone refuses must throw a
// DataCloneError; malformed bytes must throw, not return a value.
import { DurableObject } from 'cloudflare:workers';

const { serialize, deserialize } = globalThis.__hearth.objects;

function fail(what) {
  throw new Error('storage format: ' + what);
}

// Deep equality of `a` (the original) and `b` (its copy); `pairs` maps each
// object of `a` to its copy in `b` (shared and cyclic references).
function same(a, b, pairs = new Map(), path = '$') {
  if (typeof a !== typeof b) fail(path + ': ' + typeof a + ' became ' + typeof b);
  if (typeof a !== 'object' || a === null) {
    if (!Object.is(a, b)) fail(path + ': ' + String(a) + ' became ' + String(b));
    return;
  }
  if (b === null) fail(path + ': became null');
  if (pairs.has(a)) {
    if (pairs.get(a) !== b) fail(path + ': a shared reference was not kept');
    return;
  }
  pairs.set(a, b);
  if (a === b) fail(path + ': not copied');
  if (Object.getPrototypeOf(a) !== Object.getPrototypeOf(b) && !(Object.getPrototypeOf(b) === Object.prototype)) {
    fail(path + ': ' + Object.prototype.toString.call(a) + ' became ' + Object.prototype.toString.call(b));
  }
  const tag = Object.prototype.toString.call(a);
  if (tag !== Object.prototype.toString.call(b)) fail(path + ': ' + tag + ' became ' + Object.prototype.toString.call(b));
  if (a instanceof Date) return same(a.getTime(), b.getTime(), pairs, path + '.time');
  if (a instanceof RegExp) {
    same(a.source, b.source, pairs, path + '.source');
    return same(a.flags, b.flags, pairs, path + '.flags');
  }
  if (a instanceof ArrayBuffer) {
    same(a.byteLength, b.byteLength, pairs, path + '.byteLength');
    const x = new Uint8Array(a);
    const y = new Uint8Array(b);
    for (let i = 0; i < x.length; i++) same(x[i], y[i], pairs, path + '[' + i + ']');
    return;
  }
  if (ArrayBuffer.isView(a)) {
    if (a.constructor !== b.constructor) fail(path + ': ' + a.constructor.name + ' became ' + b.constructor.name);
    same(a.byteOffset, b.byteOffset, pairs, path + '.byteOffset');
    same(a.byteLength, b.byteLength, pairs, path + '.byteLength');
    return same(a.buffer, b.buffer, pairs, path + '.buffer');
  }
  if (a instanceof Map) {
    same(a.size, b.size, pairs, path + '.size');
    const bk = [...b.keys()];
    let i = 0;
    for (const [k, v] of a) {
      same(k, bk[i], pairs, path + '.key' + i);
      same(v, b.get(bk[i]), pairs, path + '.value' + i);
      i++;
    }
    return;
  }
  if (a instanceof Set) {
    same(a.size, b.size, pairs, path + '.size');
    const bv = [...b];
    let i = 0;
    for (const v of a) same(v, bv[i], pairs, path + '.item' + i++);
    return;
  }
  if (a instanceof Error) {
    same(a.name, b.name, pairs, path + '.name');
    same(a.message, b.message, pairs, path + '.message');
    same(a.stack, b.stack, pairs, path + '.stack');
    if ('cause' in a) same(a.cause, b.cause, pairs, path + '.cause');
    return;
  }
  if (a instanceof Boolean || a instanceof Number || a instanceof String || a instanceof BigInt) {
    return same(a.valueOf(), b.valueOf(), pairs, path + '.valueOf()');
  }
  if (Array.isArray(a)) same(a.length, b.length, pairs, path + '.length');
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  same(ka.join(','), kb.join(','), pairs, path + ' keys');
  for (const k of ka) same(a[k], b[k], pairs, path + '.' + k);
}

function roundTrip(v, what) {
  const bytes = serialize(v);
  if (!(bytes instanceof Uint8Array)) fail(what + ': serialize did not answer a Uint8Array');
  same(v, deserialize(bytes), new Map(), what);
  return bytes;
}

let checks = 0;
const values = {
  undefined: undefined,
  null: null,
  true: true,
  false: false,
  zero: 0,
  minusZero: -0,
  nan: NaN,
  inf: Infinity,
  minusInf: -Infinity,
  int: 42,
  negative: -7,
  int32max: 2147483647,
  int32min: -2147483648,
  beyondInt32: 2147483648,
  safe: Number.MAX_SAFE_INTEGER,
  fraction: 0.1,
  tiny: 5e-324,
  bigZero: 0n,
  big: 123456789012345678901234567890n,
  bigNegative: -(2n ** 130n) + 1n,
  empty: '',
  ascii: 'hello',
  unicode: 'héllo wörld ✓ 🎉',
  loneHigh: 'a\uD800b',
  loneLow: '\uDC00',
  long: 'x'.repeat(70000),
  date: new Date(1700000000123),
  invalidDate: new Date(NaN),
  regexp: /a+b?[c-d]\//gimsuy,
  buffer: new Uint8Array([0, 1, 2, 255]).buffer,
  emptyBuffer: new ArrayBuffer(0),
  u8: new Uint8Array([1, 2, 3]),
  i16: new Int16Array([-1, 32767, -32768]),
  f64: new Float64Array([NaN, -0, 1.5]),
  big64: new BigInt64Array([-1n, 2n ** 62n]),
  clamped: new Uint8ClampedArray([0, 255]),
  view: new DataView(new ArrayBuffer(16), 4, 8),
  offsetView: new Uint32Array(new ArrayBuffer(32), 8, 3),
  map: new Map([['a', 1], [2, 'b'], [{ k: 1 }, [1]]]),
  set: new Set([1, 'two', null, undefined]),
  array: [1, 'a', null, undefined, [2, [3]]],
  sparse: [1, , 3],
  arrayProps: Object.assign([1, 2], { extra: 'yes' }),
  object: { a: 1, b: { c: [1, 2, { d: 'e' }] }, 'with space': true, 0: 'zero' },
  empty_object: {},
  error: new Error('boom'),
  typeError: new TypeError('bad type'),
  rangeError: new RangeError('out of range'),
  errorWithCause: new Error('outer', { cause: new Error('inner') }),
  boxed: [Object(true), Object(1.5), Object('s'), Object(10n)],
  classInstance: new (class Point { constructor() { this.x = 1; this.y = 2; } })(),
};
for (const [name, v] of Object.entries(values)) {
  roundTrip(v, name);
  checks++;
}
// Everything at once, in one value.
roundTrip(values, 'all');
checks++;

// Shared and cyclic references.
const shared = { s: 1 };
const cyclic = { name: 'loop', list: [] };
cyclic.self = cyclic;
cyclic.list.push(cyclic, shared, shared);
const m = new Map();
m.set('me', m);
const setLoop = new Set();
setLoop.add(setLoop);
const arrayLoop = [];
arrayLoop.push(arrayLoop);
const errorLoop = new Error('loop');
errorLoop.cause = errorLoop;
const buf = new ArrayBuffer(8);
const views = { a: new Uint8Array(buf), b: new Uint16Array(buf, 2, 2), buf };
for (const [name, v] of Object.entries({ cyclic, m, setLoop, arrayLoop, errorLoop, views, pair: [shared, shared] })) {
  roundTrip(v, name);
  checks++;
}
{
  const copy = deserialize(serialize(cyclic));
  if (copy.self !== copy || copy.list[0] !== copy || copy.list[1] !== copy.list[2]) fail('cyclic: references not kept');
  const v = deserialize(serialize(views));
  if (v.a.buffer !== v.buf || v.b.buffer !== v.buf) fail('views: their buffer is not shared');
  v.a[2] = 7;
  if (v.b[0] !== 7) fail('views: a write through one view is not seen by the other');
  checks++;
}
// Getters run; the prototype's properties are not copied.
{
  const o = Object.create({ inherited: 1 });
  Object.defineProperty(o, 'hidden', { value: 1, enumerable: false });
  o.own = 2;
  const copy = deserialize(serialize(o));
  if ('inherited' in copy || 'hidden' in copy || copy.own !== 2) fail('only own enumerable properties are copied');
  checks++;
}

// The bytes of a few values (the stored format must not change by accident).
const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join(' ');
const exact = [
  [undefined, '01 00'],
  [null, '01 01'],
  [true, '01 03'],
  [1, '01 04 02'],
  [-1, '01 04 01'],
  [300, '01 04 d8 04'],
  [-0, '01 05 00 00 00 00 00 00 00 80'],
  [1.5, '01 05 00 00 00 00 00 00 f8 3f'],
  [255n, '01 06 00 01 ff'],
  [-256n, '01 06 01 02 00 01'],
  ['hé', '01 07 03 68 c3 a9'],
  ['\uD800', '01 08 01 00 d8'],
  [{ a: 1 }, '01 10 01 07 01 61 04 02'],
  [[true, false], '01 11 02 03 02'],
  [new Set(['a']), '01 18 01 07 01 61'],
  [new Uint8Array([9]), '01 16 02 15 01 09 00 01'],
];
for (const [v, want] of exact) {
  const got = hex(serialize(v));
  if (got !== want) fail('the bytes of ' + String(v) + ' are ' + got + ', not ' + want);
  checks++;
}
{
  const o = {};
  const got = hex(serialize([o, o]));
  if (got !== '01 11 02 10 00 09 01') fail('a shared object is ' + got);
  checks++;
}

// What structured clone refuses.
const refused = {
  function: () => 1,
  symbol: Symbol('s'),
  nestedFunction: { f() {} },
  promise: Promise.resolve(1),
  weakMap: new WeakMap(),
  request: new Request('http://example.com/'),
  headers: new Headers(),
};
for (const [name, v] of Object.entries(refused)) {
  let error = null;
  try {
    serialize(v);
  } catch (e) {
    error = e;
  }
  if (error === null) fail(name + ' was serialized');
  if (error.name !== 'DataCloneError') fail(name + ' threw ' + error.name + ', not DataCloneError');
  checks++;
}

// Malformed bytes throw.
const malformed = [[], [2, 0], [1], [1, 0x30], [1, 0x07, 5, 97], [1, 0x09, 0], [1, 0x04, 0x80], [1, 0x00, 0x00],
  [1, 0x07, 2, 0xc3, 0x28]];
for (const bytes of malformed) {
  let threw = false;
  try {
    deserialize(new Uint8Array(bytes));
  } catch {
    threw = true;
  }
  if (!threw) fail('malformed bytes ' + hex(bytes) + ' were accepted');
  checks++;
}

// The comparison itself tells the values apart (a check that cannot fail
// proves nothing).
for (const [a, b] of [[0, -0], [NaN, 0], [[1, , 3], [1, undefined, 3]], [{ a: 1 }, { a: 2 }], [new Date(1), new Date(2)],
  [new Uint8Array([1]), new Int8Array([1])], [new Error('x'), new TypeError('x')], ['a\uD800', 'a\uFFFD']]) {
  let threw = false;
  try {
    same(a, b);
  } catch {
    threw = true;
  }
  if (!threw) fail('the comparison does not tell ' + String(a) + ' from ' + String(b));
  checks++;
}

// `cloudflare:workers`' DurableObject keeps its constructor's arguments.
class Probe extends DurableObject {}
const probe = new Probe('the ctx', 'the env');
if (probe.ctx !== 'the ctx' || probe.env !== 'the env') fail('DurableObject does not keep ctx and env');
checks++;

console.log('storage format: ' + checks + ' checks passed');

export default {
  fetch() {
    return new Response(String(checks));
  },
};
