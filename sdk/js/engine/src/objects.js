// Durable Objects, Cloudflare's API (issue 43): the `cloudflare:workers`
// module (`DurableObject`), namespace bindings on `env`
// (`idFromName`, `newUniqueId`, `idFromString`, `get`, a stub's `fetch`),
// one instance of the exported class per object with its `ctx`
// (`DurableObjectState`: `id`, `storage`, `blockConcurrencyWhile`,
// `waitUntil`), and the storage format of values. Evaluated after
// runtime.js, before the Worker's module; its contract with the host is
// `wit/hearth-objects/objects.wit`, through the natives objects.rs defines
// as `__hearth_objects` (taken off the global object here).
//
// - **Bindings**: hearth names the Worker's Durable Object bindings in
//   its environment (`HEARTH_DURABLE_OBJECTS`, comma-separated, as
//   `HEARTH_SERVICES` for service bindings); each is a namespace on `env`
//   under its name. The host checks the binding again on every ID call.
// - **RPC**: `stub.method(...args)` is a POST to the object (see `rpc`).
// - **A stub's fetch** is an outgoing request to
//   `http://<binding>.<id>.object.internal<path and query>` with the header
//   `hearth-object-url: <the URL the caller gave>` (runtime.js's
//   `fetchObject`); the host routes it to the object's home.
// - **An object's request** (the host's `storage.this-object()` is some,
//   request.rs): the instance of the exported class for that ID is made on
//   its first request (`new Class(ctx, env)`: `DurableObject`'s constructor
//   keeps them as `this.ctx` and `this.env`; a plain class gets them as its
//   arguments) and kept for the engine instance's later requests; its
//   `fetch(request)` answers.
// - **Values** are stored in hearth's structured-clone format (below),
//   checked by `serialize`/`deserialize` round trips.
(() => {
  'use strict';
  const g = globalThis;
  const H = g.__hearth;
  const N = g.__hearth_objects;
  delete g.__hearth_objects;
  // Lets only this file make IDs, states and stubs.
  const TOKEN = Symbol('hearth');
  const illegal = () => new TypeError('Illegal constructor');

  // ---- The storage format (version 1) ----
  //
  // A value is a version byte (1), then one item: a tag byte and its
  // payload. Lengths, counts and indices are unsigned LEB128 varints.
  //   0x00 undefined   0x01 null   0x02 false   0x03 true
  //   0x04 an integer in [-2^31, 2^31) but -0: zigzag varint
  //   0x05 any other number (NaN, -0, Infinity, fractions, large): float64 LE
  //   0x06 BigInt: sign byte (0 or 1), varint n, n magnitude bytes LE
  //   0x07 string: varint n, n bytes of UTF-8
  //   0x08 string with lone surrogates: varint n, n UTF-16 code units LE
  //   0x09 an object written before: varint index (shared and cyclic
  //        references; each object below takes the next index, in the
  //        order its tag is written)
  //   0x10 object: varint n, n × (key string item, value item)
  //   0x11 dense array: varint length, length × value item
  //   0x12 other array (holes, extra properties): varint length, varint n,
  //        n × (key string item, value item)
  //   0x13 Date: float64 time value
  //   0x14 RegExp: source string item, flags string item
  //   0x15 ArrayBuffer: varint n, n bytes
  //   0x16 view: kind byte (VIEWS' index), its buffer (an 0x15 or 0x09
  //        item), varint byteOffset, varint length (elements; bytes for a
  //        DataView)
  //   0x17 Map: varint n, n × (key item, value item)
  //   0x18 Set: varint n, n × item
  //   0x19 Error: name string item (one of ERROR_NAMES, else "Error"),
  //        message string item, flags byte (1: stack, 2: cause), then the
  //        stack string item, then the cause item
  //   0x1a Boolean, Number, String or BigInt object: the primitive's item
  // Functions, symbols and objects no structured clone copies (promises,
  // weak collections, the web APIs' objects) throw a DataCloneError.
  const VERSION = 1;
  const VIEWS = [DataView, Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array,
    Int32Array, Uint32Array, Float32Array, Float64Array, BigInt64Array, BigUint64Array];
  const ERROR_NAMES = ['Error', 'EvalError', 'RangeError', 'ReferenceError', 'SyntaxError',
    'TypeError', 'URIError'];
  // Objects of these classes do not clone (as on workerd).
  const UNCLONEABLE = [Promise, WeakMap, WeakSet, WeakRef, g.FinalizationRegistry, g.Request,
    g.Response, g.Headers, g.ReadableStream, g.WritableStream, g.TransformStream, g.Blob, g.URL,
    g.URLSearchParams, g.EventTarget, g.Event, g.FormData, g.AbortController, g.TextEncoder,
    g.TextDecoder].filter((C) => typeof C === 'function');
  const cloneError = (what) => new DOMException(what + ' could not be cloned.', 'DataCloneError');
  const encoder = new TextEncoder();
  const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
  const scratch = new DataView(new ArrayBuffer(8));

  class Writer {
    constructor() {
      this.buf = new Uint8Array(64);
      this.n = 0;
      this.seen = new Map();
    }
    room(k) {
      if (this.n + k <= this.buf.length) return;
      let size = this.buf.length * 2;
      while (size < this.n + k) size *= 2;
      const b = new Uint8Array(size);
      b.set(this.buf.subarray(0, this.n));
      this.buf = b;
    }
    byte(b) {
      this.room(1);
      this.buf[this.n++] = b;
    }
    varint(v) {
      this.room(8);
      while (v >= 128) {
        this.buf[this.n++] = (v % 128) | 128;
        v = Math.floor(v / 128);
      }
      this.buf[this.n++] = v;
    }
    f64(x) {
      scratch.setFloat64(0, x, true);
      this.room(8);
      for (let i = 0; i < 8; i++) this.buf[this.n++] = scratch.getUint8(i);
    }
    raw(bytes) {
      this.varint(bytes.length);
      this.room(bytes.length);
      this.buf.set(bytes, this.n);
      this.n += bytes.length;
    }
    string(s) {
      if (s.isWellFormed()) {
        this.byte(0x07);
        this.raw(encoder.encode(s));
        return;
      }
      this.byte(0x08);
      this.varint(s.length);
      this.room(2 * s.length);
      for (let i = 0; i < s.length; i++) {
        const c = s.charCodeAt(i);
        this.buf[this.n++] = c & 255;
        this.buf[this.n++] = c >> 8;
      }
    }
    number(x) {
      if (Number.isInteger(x) && x >= -2147483648 && x < 2147483648 && !Object.is(x, -0)) {
        this.byte(0x04);
        this.varint(((x << 1) ^ (x >> 31)) >>> 0);
      } else {
        this.byte(0x05);
        this.f64(x);
      }
    }
    bigint(x) {
      this.byte(0x06);
      this.byte(x < 0n ? 1 : 0);
      let m = x < 0n ? -x : x;
      const bytes = [];
      while (m > 0n) {
        bytes.push(Number(m & 255n));
        m >>= 8n;
      }
      this.raw(bytes);
    }
    entries(pairs, n) {
      this.varint(n);
      for (const [k, v] of pairs) {
        this.value(k);
        this.value(v);
      }
    }
    props(v, keys) {
      this.varint(keys.length);
      for (const k of keys) {
        this.string(k);
        this.value(v[k]);
      }
    }
    value(v) {
      switch (typeof v) {
        case 'undefined': return this.byte(0x00);
        case 'boolean': return this.byte(v ? 0x03 : 0x02);
        case 'number': return this.number(v);
        case 'bigint': return this.bigint(v);
        case 'string': return this.string(v);
        case 'symbol': throw cloneError(String(v));
        case 'function': throw cloneError(String(v).slice(0, 60));
      }
      if (v === null) return this.byte(0x01);
      const index = this.seen.get(v);
      if (index !== undefined) {
        this.byte(0x09);
        return this.varint(index);
      }
      if (UNCLONEABLE.some((C) => v instanceof C)) {
        throw cloneError(Object.prototype.toString.call(v));
      }
      this.seen.set(v, this.seen.size);
      if (Array.isArray(v)) {
        const keys = Object.keys(v);
        if (keys.length === v.length) {
          this.byte(0x11);
          this.varint(v.length);
          for (let i = 0; i < v.length; i++) this.value(v[i]);
        } else {
          this.byte(0x12);
          this.varint(v.length);
          this.props(v, keys);
        }
      } else if (v instanceof Date) {
        this.byte(0x13);
        this.f64(v.getTime());
      } else if (v instanceof RegExp) {
        this.byte(0x14);
        this.string(v.source);
        this.string(v.flags);
      } else if (v instanceof ArrayBuffer) {
        this.byte(0x15);
        this.raw(new Uint8Array(v));
      } else if (ArrayBuffer.isView(v)) {
        const kind = VIEWS.findIndex((C) => v instanceof C);
        if (kind < 0) throw cloneError(Object.prototype.toString.call(v));
        this.byte(0x16);
        this.byte(kind);
        this.value(v.buffer);
        this.varint(v.byteOffset);
        this.varint(kind === 0 ? v.byteLength : v.length);
      } else if (v instanceof Map) {
        this.byte(0x17);
        this.entries(v, v.size);
      } else if (v instanceof Set) {
        this.byte(0x18);
        this.varint(v.size);
        for (const x of v) this.value(x);
      } else if (v instanceof Error) {
        this.byte(0x19);
        const name = ERROR_NAMES.includes(v.name) ? v.name : 'Error';
        this.string(name);
        this.string(v.message === undefined ? '' : String(v.message));
        const stack = typeof v.stack === 'string';
        const cause = Object.prototype.hasOwnProperty.call(v, 'cause');
        this.byte((stack ? 1 : 0) | (cause ? 2 : 0));
        if (stack) this.string(v.stack);
        if (cause) this.value(v.cause);
      } else if (v instanceof Boolean || v instanceof Number || v instanceof String || v instanceof BigInt) {
        this.byte(0x1a);
        this.value(v.valueOf());
      } else {
        this.byte(0x10);
        this.props(v, Object.keys(v));
      }
    }
  }

  // `value` in the storage format (a Uint8Array); a DataCloneError if it
  // holds something that does not clone.
  function serialize(value) {
    const w = new Writer();
    w.byte(VERSION);
    w.value(value);
    return w.buf.slice(0, w.n);
  }

  const corrupt = (why) => new Error('a stored value is not in hearth\'s storage format: ' + why);

  class Reader {
    constructor(bytes) {
      this.b = bytes;
      this.i = 0;
      this.objects = [];
    }
    byte() {
      if (this.i >= this.b.length) throw corrupt('it ends too early');
      return this.b[this.i++];
    }
    varint() {
      let v = 0;
      let scale = 1;
      for (;;) {
        const b = this.byte();
        v += (b & 127) * scale;
        if (b < 128) return v;
        scale *= 128;
        if (scale > 2 ** 56) throw corrupt('a varint is too long');
      }
    }
    take(n) {
      if (n > this.b.length - this.i) throw corrupt('it ends too early');
      const out = this.b.subarray(this.i, this.i + n);
      this.i += n;
      return out;
    }
    f64() {
      const bytes = this.take(8);
      for (let i = 0; i < 8; i++) scratch.setUint8(i, bytes[i]);
      return scratch.getFloat64(0, true);
    }
    string() {
      const v = this.value();
      if (typeof v !== 'string') throw corrupt('a string was expected');
      return v;
    }
    keep(o) {
      this.objects.push(o);
      return o;
    }
    props(o) {
      const n = this.varint();
      for (let k = 0; k < n; k++) {
        const key = this.string();
        o[key] = this.value();
      }
      return o;
    }
    value() {
      const tag = this.byte();
      switch (tag) {
        case 0x00: return undefined;
        case 0x01: return null;
        case 0x02: return false;
        case 0x03: return true;
        case 0x04: {
          const z = this.varint();
          return (z % 2 === 0 ? z / 2 : -(z + 1) / 2);
        }
        case 0x05: return this.f64();
        case 0x06: {
          const negative = this.byte() === 1;
          const bytes = this.take(this.varint());
          let m = 0n;
          for (let i = bytes.length - 1; i >= 0; i--) m = (m << 8n) | BigInt(bytes[i]);
          return negative ? -m : m;
        }
        case 0x07: {
          try {
            return decoder.decode(this.take(this.varint()));
          } catch {
            throw corrupt('a string is not UTF-8');
          }
        }
        case 0x08: {
          const n = this.varint();
          const bytes = this.take(2 * n);
          let s = '';
          for (let i = 0; i < n; i += 4096) {
            const units = [];
            for (let j = i; j < n && j < i + 4096; j++) units.push(bytes[2 * j] | (bytes[2 * j + 1] << 8));
            s += String.fromCharCode.apply(null, units);
          }
          return s;
        }
        case 0x09: {
          const index = this.varint();
          if (index >= this.objects.length) throw corrupt('a reference to nothing');
          return this.objects[index];
        }
        case 0x10: return this.props(this.keep({}));
        case 0x11: {
          const a = this.keep([]);
          const n = this.varint();
          for (let k = 0; k < n; k++) a.push(this.value());
          return a;
        }
        case 0x12: {
          const a = this.keep([]);
          a.length = this.varint();
          return this.props(a);
        }
        case 0x13: return this.keep(new Date(this.f64()));
        case 0x14: {
          const slot = this.objects.push(null) - 1;
          const source = this.string();
          const flags = this.string();
          let re;
          try {
            re = new RegExp(source, flags);
          } catch {
            throw corrupt('a RegExp does not compile');
          }
          this.objects[slot] = re;
          return re;
        }
        case 0x15: return this.keep(this.take(this.varint()).slice().buffer);
        case 0x16: {
          const C = VIEWS[this.byte()];
          if (C === undefined) throw corrupt('an unknown view kind');
          const slot = this.objects.push(null) - 1;
          const buffer = this.value();
          if (!(buffer instanceof ArrayBuffer)) throw corrupt('a view without a buffer');
          const offset = this.varint();
          const length = this.varint();
          let view;
          try {
            view = new C(buffer, offset, length);
          } catch {
            throw corrupt('a view outside its buffer');
          }
          this.objects[slot] = view;
          return view;
        }
        case 0x17: {
          const m = this.keep(new Map());
          const n = this.varint();
          for (let k = 0; k < n; k++) {
            const key = this.value();
            m.set(key, this.value());
          }
          return m;
        }
        case 0x18: {
          const s = this.keep(new Set());
          const n = this.varint();
          for (let k = 0; k < n; k++) s.add(this.value());
          return s;
        }
        case 0x19: {
          const slot = this.objects.push(null) - 1;
          const name = this.string();
          const message = this.string();
          const flags = this.byte();
          const C = ERROR_NAMES.includes(name) ? g[name] : Error;
          const e = new C(message);
          this.objects[slot] = e;
          if (flags & 1) {
            Object.defineProperty(e, 'stack', {
              value: this.string(), writable: true, configurable: true, enumerable: false,
            });
          }
          if (flags & 2) {
            Object.defineProperty(e, 'cause', {
              value: this.value(), writable: true, configurable: true, enumerable: false,
            });
          }
          return e;
        }
        case 0x1a: {
          const slot = this.objects.push(null) - 1;
          const o = Object(this.value());
          this.objects[slot] = o;
          return o;
        }
        default: throw corrupt('unknown tag ' + tag);
      }
    }
  }

  // The value `bytes` (a Uint8Array in the storage format) holds.
  function deserialize(bytes) {
    const r = new Reader(bytes);
    const version = r.byte();
    if (version !== VERSION) throw corrupt('version ' + version);
    const v = r.value();
    if (r.i !== bytes.length) throw corrupt('bytes after the value');
    return v;
  }

  // ---- IDs and namespaces ----

  // A host ID call (objects.rs): 0 id-from-name, 1 new-unique-id,
  // 2 id-from-string. The host answers the ID, or [kind, message] (kind 0:
  // no such binding, 1: not an ID of the namespace).
  function idCall(op, binding, arg) {
    const r = N.ids(op, binding, arg);
    if (typeof r === 'string') return r;
    throw new TypeError(r[0] === 0 ? 'no Durable Object binding ' + binding + ': ' + r[1]
      : 'Invalid Durable Object ID: ' + r[1]);
  }

  class DurableObjectId {
    #id;
    #name;
    #binding;
    constructor(token, id, name, binding) {
      if (token !== TOKEN) throw illegal();
      this.#id = id;
      this.#name = name;
      this.#binding = binding;
    }
    // The ID as 64 lowercase hex digits.
    toString() {
      return this.#id;
    }
    equals(other) {
      return other instanceof DurableObjectId && other.#id === this.#id;
    }
    // The name `idFromName` made it from; undefined otherwise.
    get name() {
      return this.#name;
    }
    static bindingOf(id) {
      return id.#binding;
    }
  }

  // RPC (`stub.method(...args)`): a POST to the object with the method's
  // name in RPC_HEADER and the arguments, serialized, as its body; the
  // object answers 200 with RPC_TYPE and [0, result] or [1, thrown]
  // serialized. Arguments and results are structured-clone values (no
  // functions, stubs or streams, which Cloudflare's RPC also carries).
  const RPC_HEADER = 'hearth-object-rpc';
  const RPC_TYPE = 'application/x-hearth-rpc';
  // The host's call of an object's alarm: the retry count (0 first).
  const ALARM_HEADER = 'hearth-object-alarm';

  async function rpc(host, method, args) {
    const body = serialize(args);
    const response = await H.fetchObject(host, 'http://' + host + '/', {
      method: 'POST',
      headers: { 'content-type': RPC_TYPE },
      body,
    }, method);
    if (response.headers.get('content-type') !== RPC_TYPE) {
      const text = await response.text();
      throw new Error('the Durable Object did not answer ' + method + '() (' + response.status + '): ' + text);
    }
    const [failed, value] = deserialize(new Uint8Array(await response.arrayBuffer()));
    if (failed) throw value;
    return value;
  }

  // The object's side of an RPC call to `o`.
  async function rpcAnswer(o, method, request) {
    let out;
    try {
      const f = o[method];
      if (typeof f !== 'function' || method === 'constructor' || method === 'fetch' || f === Object.prototype[method]) {
        throw new TypeError('The RPC receiver does not implement the method "' + method + '".');
      }
      const args = deserialize(new Uint8Array(await request.arrayBuffer()));
      out = [0, await f.apply(o, args)];
    } catch (e) {
      out = [1, e];
    }
    let bytes;
    try {
      bytes = serialize(out);
    } catch (e) {
      bytes = serialize([1, out[0] === 1 ? new Error(String(out[1])) : e]);
    }
    return new Response(bytes, { headers: { 'content-type': RPC_TYPE } });
  }

  class DurableObjectStub {
    #id;
    #host;
    constructor(token, id, host) {
      if (token !== TOKEN) throw illegal();
      this.#id = id;
      this.#host = host;
    }
    get id() {
      return this.#id;
    }
    get name() {
      return this.#id.name;
    }
    // `input` and `init` as for the global fetch; the object sees the URL
    // given as its request's URL.
    fetch(input, init) {
      return H.fetchObject(this.#host, input, init);
    }
    static hostOf(stub) {
      return stub.#host;
    }
  }

  // A stub's own members, or else an RPC method of that name (not `then`:
  // a stub is not a promise).
  const stubHandler = {
    get(target, prop) {
      if (typeof prop !== 'string' || prop in target || prop === 'then') {
        const v = Reflect.get(target, prop, target);
        return typeof v === 'function' ? v.bind(target) : v;
      }
      const host = DurableObjectStub.hostOf(target);
      return (...args) => rpc(host, prop, args);
    },
  };

  // The object's address: http://<binding>.<id>.object.internal
  const objectHost = (binding, id) => binding + '.' + id + '.object.internal';

  class DurableObjectNamespace {
    #binding;
    constructor(token, binding) {
      if (token !== TOKEN) throw illegal();
      this.#binding = binding;
    }
    idFromName(name) {
      name = String(name);
      return new DurableObjectId(TOKEN, idCall(0, this.#binding, name), name, this.#binding);
    }
    newUniqueId() {
      return new DurableObjectId(TOKEN, idCall(1, this.#binding, ''), undefined, this.#binding);
    }
    idFromString(id) {
      return new DurableObjectId(TOKEN, idCall(2, this.#binding, String(id)), undefined, this.#binding);
    }
    get(id) {
      if (!(id instanceof DurableObjectId)) {
        throw new TypeError('get() takes a DurableObjectId (from idFromName, newUniqueId or idFromString)');
      }
      // An ID made by another binding: the host says whether it is one of
      // this namespace's.
      if (DurableObjectId.bindingOf(id) !== this.#binding) idCall(2, this.#binding, id.toString());
      return new Proxy(new DurableObjectStub(TOKEN, id, objectHost(this.#binding, id.toString())), stubHandler);
    }
    getByName(name) {
      return this.get(this.idFromName(name));
    }
  }

  // `env` (runtime.js's) with a namespace for each Durable Object binding
  // the environment names.
  const makeEnv = H.makeEnv;
  H.makeEnv = (pairs) => {
    const env = makeEnv(pairs);
    for (let i = 0; i < pairs.length; i += 2) {
      if (pairs[i] !== 'HEARTH_DURABLE_OBJECTS') continue;
      for (const name of pairs[i + 1].split(',')) {
        if (name.length > 0) env[name] = new DurableObjectNamespace(TOKEN, name);
      }
    }
    return env;
  };

  // ---- ctx.storage ----

  const MAX_KEYS = 128;
  function key(k) {
    if (typeof k !== 'string') throw new TypeError('a Durable Object storage key must be a string');
    return k;
  }
  function keyList(keys) {
    if (keys.length > MAX_KEYS) {
      throw new RangeError('at most ' + MAX_KEYS + ' keys per call (' + keys.length + ' given)');
    }
    return keys.map(key);
  }
  const byKey = (a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0);

  // The operations `storage` and a transaction's `txn` share; `live()`
  // throws when they may no longer be used.
  function operations(live) {
    return {
      async get(keys) {
        live();
        if (Array.isArray(keys)) {
          const list = keyList(keys);
          const values = N.get(list);
          const found = [];
          for (let i = 0; i < list.length; i++) {
            if (values[i] !== undefined) found.push([list[i], deserialize(values[i])]);
          }
          return new Map(found.sort(byKey));
        }
        const v = N.get([key(keys)])[0];
        return v === undefined ? undefined : deserialize(v);
      },
      async put(k, value) {
        live();
        if (typeof k === 'object' && k !== null) {
          const names = keyList(Object.keys(k));
          N.put(names, names.map((name) => serialize(k[name])));
          return;
        }
        if (arguments.length < 2) throw new TypeError('put(key, value) needs a value');
        N.put([key(k)], [serialize(value)]);
      },
      async delete(keys) {
        live();
        if (Array.isArray(keys)) return N.delete(keyList(keys));
        return N.delete([key(keys)]) > 0;
      },
      async list(options) {
        live();
        const o = options || {};
        if (o.start !== undefined && o.startAfter !== undefined) {
          throw new TypeError('list(): start and startAfter cannot be used together');
        }
        const opt = (name) => (o[name] === undefined ? undefined : key(o[name]));
        let limit = o.limit;
        if (limit !== undefined) {
          limit = Number(limit);
          if (!(limit > 0) || !Number.isInteger(limit)) throw new TypeError('list(): limit must be a positive integer');
          limit = Math.min(limit, 4294967295);
        }
        const flat = N.list(opt('start'), opt('startAfter'), opt('end'), opt('prefix'), !!o.reverse, limit);
        const m = new Map();
        for (let i = 0; i < flat.length; i += 2) m.set(flat[i], deserialize(flat[i + 1]));
        return m;
      },
      // The alarm: one time per object (ms since the epoch), or null.
      async getAlarm() {
        live();
        return N.alarm(0, 0);
      },
      async setAlarm(scheduledTime) {
        live();
        const at = scheduledTime instanceof Date ? scheduledTime.getTime() : Number(scheduledTime);
        if (!Number.isFinite(at)) {
          throw new TypeError('setAlarm() takes a Date or a number of milliseconds since the epoch');
        }
        N.alarm(1, Math.max(0, Math.floor(at)));
      },
      async deleteAlarm() {
        live();
        N.alarm(2, 0);
      },
    };
  }

  const always = () => {};
  let inTransaction = false;
  // Commits the open transaction; if the host refuses (a limit), rolls it
  // back, so no transaction stays open, and throws the refusal.
  function commit() {
    try {
      N.txn(1);
    } catch (e) {
      try {
        N.txn(2);
      } catch {}
      throw e;
    }
  }

  class DurableObjectStorage {
    constructor(token) {
      if (token !== TOKEN) throw illegal();
      Object.assign(this, operations(always));
    }
    async deleteAll() {
      N.deleteAll();
    }
    // Runs `closure(txn)`: its writes apply together when its promise
    // fulfils, not at all when it rejects or calls `txn.rollback()`.
    async transaction(closure) {
      if (inTransaction) throw new Error('transactions do not nest');
      N.txn(0);
      inTransaction = true;
      let open = true;
      const live = () => {
        if (!open) throw new Error('this transaction is over');
      };
      const end = (op) => {
        if (!open) return;
        open = false;
        inTransaction = false;
        if (op === 1) commit();
        else N.txn(2);
      };
      const txn = operations(live);
      txn.rollback = () => end(2);
      txn.deleteAll = async () => {
        live();
        N.deleteAll();
      };
      try {
        const r = await closure(txn);
        end(1);
        return r;
      } catch (e) {
        try {
          end(2);
        } catch {}
        throw e;
      }
    }
    // `closure()` in a transaction, synchronously (it commits when
    // `closure` returns, rolls back when it throws).
    transactionSync(closure) {
      if (inTransaction) throw new Error('transactions do not nest');
      N.txn(0);
      let r;
      try {
        r = closure();
      } catch (e) {
        try {
          N.txn(2);
        } catch {}
        throw e;
      }
      commit();
      return r;
    }
    async sync() {
      N.sync();
    }
  }

  const storage = new DurableObjectStorage(TOKEN);

  class DurableObjectState {
    #id;
    // Promises blockConcurrencyWhile was given that requests wait for.
    #blockers = [];
    constructor(token, id) {
      if (token !== TOKEN) throw illegal();
      this.#id = id;
    }
    get id() {
      return this.#id;
    }
    get storage() {
      return storage;
    }
    waitUntil(promise) {
      H.ctx.waitUntil(promise);
    }
    // Runs `callback`; the object's next request (or the one the
    // constructor ran in) starts only once its promise settles. hearth
    // already runs one request at a time per object, so this only orders
    // the callback before the request's handler.
    blockConcurrencyWhile(callback) {
      const p = (async () => callback())();
      this.#blockers.push(p);
      return p;
    }
    static async unblocked(state) {
      while (state.#blockers.length > 0) {
        const waiting = state.#blockers;
        state.#blockers = [];
        await Promise.all(waiting);
      }
    }
  }

  // `cloudflare:workers`' DurableObject: `this.ctx`, `this.env`.
  class DurableObject {
    constructor(ctx, env) {
      this.ctx = ctx;
      this.env = env;
    }
  }

  // The instances of this engine instance's objects, by class and ID.
  const instances = new Map();

  // The answer of the object (class `cls`, ID `id`, made from `name`) to
  // `request`: its instance made on its first request (request.rs).
  H.objectFetch = async (cls, id, name, request, env) => {
    const slot = cls + '/' + id;
    let entry = instances.get(slot);
    if (entry === undefined) {
      const C = H.exports ? H.exports[cls] : undefined;
      if (typeof C !== 'function') {
        throw new TypeError('the Worker exports no class ' + cls + ' for its Durable Objects');
      }
      const state = new DurableObjectState(TOKEN, new DurableObjectId(TOKEN, id, name ?? undefined, null));
      entry = { state, object: null };
      instances.set(slot, entry);
      try {
        entry.object = new C(state, env);
      } catch (e) {
        instances.delete(slot);
        throw e;
      }
    }
    try {
      await DurableObjectState.unblocked(entry.state);
    } catch (e) {
      // As on Cloudflare: a failed blockConcurrencyWhile resets the object.
      instances.delete(slot);
      throw e;
    }
    const o = entry.object;
    // The host's alarm call (only the host sets this header): the class's
    // alarm(alarmInfo); 204 when it succeeded, 500 when it threw, so the
    // host retries.
    const retry = request.headers.get(ALARM_HEADER);
    if (retry !== null) {
      const retryCount = Number(retry) || 0;
      try {
        if (typeof o.alarm !== 'function') {
          throw new TypeError('the Durable Object class ' + cls + ' has no alarm() method');
        }
        await o.alarm({ retryCount, isRetry: retryCount > 0 });
      } catch (e) {
        console.error('alarm() of ' + cls + ' failed:', e);
        return new Response(String((e && e.stack) || e), { status: 500 });
      }
      return new Response(null, { status: 204 });
    }
    const method = request.headers.get(RPC_HEADER);
    if (method !== null) return rpcAnswer(o, method, request);
    if (typeof o.fetch !== 'function') {
      throw new TypeError('the Durable Object class ' + cls + ' has no fetch() method');
    }
    return o.fetch(request);
  };

  // Whether the module exports a class (a function other than `default`):
  // only then may a request be an object's (request.rs asks the host).
  H.setExports = (namespace) => {
    H.exports = namespace;
    return Object.keys(namespace).some((k) => k !== 'default' && typeof namespace[k] === 'function');
  };

  // The `cloudflare:workers` module's exports (engine.rs).
  H.workers = { DurableObject };
  // The storage format and the stub's address, for the engine's own tests.
  H.objects = { serialize, deserialize, objectHost };
})();
