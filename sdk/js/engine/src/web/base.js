// base.js: what the other web files build on: DOMException, Event,
// EventTarget, AbortController/AbortSignal, console, structuredClone,
// queueMicrotask (QuickJS's own), performance, atob/btoa, crypto,
// TextEncoder/TextDecoder.
const g = globalThis;
const N = __hearth_natives;
delete g.__hearth_natives;
// A sentinel the classes' constructors take to build an object without
// running the public constructor's checks (host-made objects).
const INTERNAL = Symbol('hearth internal');
const define = (name, value) => {
  Object.defineProperty(g, name, { value, writable: true, configurable: true, enumerable: false });
};
const tag = (cls, name) => {
  Object.defineProperty(cls.prototype, Symbol.toStringTag, { value: name, configurable: true });
};

// ---- DOMException ----
const DOM_CODES = {
  IndexSizeError: 1, HierarchyRequestError: 3, WrongDocumentError: 4, InvalidCharacterError: 5,
  NoModificationAllowedError: 7, NotFoundError: 8, NotSupportedError: 9, InvalidStateError: 11,
  SyntaxError: 12, InvalidModificationError: 13, NamespaceError: 14, InvalidAccessError: 15,
  TypeMismatchError: 17, SecurityError: 18, NetworkError: 19, AbortError: 20, URLMismatchError: 21,
  QuotaExceededError: 22, TimeoutError: 23, InvalidNodeTypeError: 24, DataCloneError: 25,
};
class DOMException extends Error {
  #name; #code;
  constructor(message = '', options = 'Error') {
    super(String(message));
    let name = options;
    if (options !== null && typeof options === 'object') {
      name = options.name === undefined ? 'Error' : options.name;
      if ('cause' in options) this.cause = options.cause;
    }
    this.#name = String(name);
    this.#code = DOM_CODES[this.#name] || 0;
  }
  get name() { return this.#name; }
  get code() { return this.#code; }
}
tag(DOMException, 'DOMException');
for (const [name, code] of Object.entries(DOM_CODES)) {
  const c = name.replace(/([a-z])([A-Z])/g, '$1_$2').toUpperCase().replace(/_ERROR$/, '_ERR');
  Object.defineProperty(DOMException, c, { value: code, enumerable: true });
  Object.defineProperty(DOMException.prototype, c, { value: code, enumerable: true });
}
const domError = (message, name) => new DOMException(message, name);

// ---- Event / EventTarget ----
const NONE = 0, AT_TARGET = 2;
let eventSet; // (event, field, value): dispatch's writes to an Event
class Event {
  #type; #bubbles; #cancelable; #composed; #canceled = false; #stop = false; #stopNow = false;
  #target = null; #current = null; #phase = NONE; #passive = false; #ts; #dispatching = false;
  constructor(type, init) {
    if (arguments.length === 0) throw new TypeError("Failed to construct 'Event': 1 argument required");
    this.#type = String(type);
    init = init == null ? {} : init;
    this.#bubbles = !!init.bubbles;
    this.#cancelable = !!init.cancelable;
    this.#composed = !!init.composed;
    this.#ts = g.performance.now();
  }
  get type() { return this.#type; }
  get bubbles() { return this.#bubbles; }
  get cancelable() { return this.#cancelable; }
  get composed() { return this.#composed; }
  get defaultPrevented() { return this.#canceled; }
  get returnValue() { return !this.#canceled; }
  set returnValue(v) { if (!v) this.preventDefault(); }
  get cancelBubble() { return this.#stop; }
  set cancelBubble(v) { if (v) this.#stop = true; }
  get target() { return this.#target; }
  get srcElement() { return this.#target; }
  get currentTarget() { return this.#current; }
  get eventPhase() { return this.#phase; }
  get isTrusted() { return false; }
  get timeStamp() { return this.#ts; }
  composedPath() { return this.#current ? [this.#current] : []; }
  preventDefault() { if (this.#cancelable && !this.#passive) this.#canceled = true; }
  stopPropagation() { this.#stop = true; }
  stopImmediatePropagation() { this.#stop = true; this.#stopNow = true; }
  static {
    eventSet = (e, k, v) => {
      switch (k) {
        case 'start':
          if (e.#dispatching) throw domError('The event is already being dispatched', 'InvalidStateError');
          e.#dispatching = true; e.#target = v; e.#current = v; e.#phase = AT_TARGET; e.#stop = false;
          return;
        case 'end': e.#dispatching = false; e.#current = null; e.#phase = NONE; e.#stopNow = false; return;
        case 'passive': e.#passive = v; return;
        case 'stopNow': return e.#stopNow;
      }
    };
  }
}
Event.NONE = 0; Event.CAPTURING_PHASE = 1; Event.AT_TARGET = 2; Event.BUBBLING_PHASE = 3;
tag(Event, 'Event');

let listenersOf;
class EventTarget {
  #l = null; // type -> [{cb, capture, once, passive, removed}]
  constructor() {}
  addEventListener(type, cb, options) {
    if (arguments.length < 2) throw new TypeError('addEventListener requires 2 arguments');
    if (cb == null) return;
    if (typeof cb !== 'function' && typeof cb !== 'object') throw new TypeError('The listener must be a function or an object');
    let capture = false, once = false, passive = false, signal;
    if (typeof options === 'boolean') capture = options;
    else if (options != null) {
      capture = !!options.capture; once = !!options.once; passive = !!options.passive; signal = options.signal;
      if (signal !== undefined && !(signal instanceof AbortSignal)) throw new TypeError('signal must be an AbortSignal');
    }
    if (signal && signal.aborted) return;
    type = String(type);
    if (this.#l === null) this.#l = new Map();
    let list = this.#l.get(type);
    if (!list) this.#l.set(type, (list = []));
    for (const e of list) if (e.cb === cb && e.capture === capture) return;
    const entry = { cb, capture, once, passive, removed: false };
    list.push(entry);
    if (signal) abortAlgorithm(signal, () => this.removeEventListener(type, cb, { capture }));
  }
  removeEventListener(type, cb, options) {
    if (this.#l === null) return;
    const capture = typeof options === 'boolean' ? options : !!(options && options.capture);
    const list = this.#l.get(String(type));
    if (!list) return;
    const i = list.findIndex((e) => e.cb === cb && e.capture === capture);
    if (i >= 0) { list[i].removed = true; list.splice(i, 1); }
  }
  dispatchEvent(event) {
    if (!(event instanceof Event)) throw new TypeError("The event must be an instance of Event");
    eventSet(event, 'start', this);
    try {
      const list = this.#l && this.#l.get(event.type);
      if (list) {
        for (const e of list.slice()) {
          if (e.removed) continue;
          if (e.once) this.removeEventListener(event.type, e.cb, { capture: e.capture });
          eventSet(event, 'passive', e.passive);
          try {
            if (typeof e.cb === 'function') e.cb.call(this, event);
            else if (typeof e.cb.handleEvent === 'function') e.cb.handleEvent(event);
          } catch (err) {
            reportError(err);
          }
          eventSet(event, 'passive', false);
          if (eventSet(event, 'stopNow')) break;
        }
      }
    } finally {
      eventSet(event, 'end');
    }
    return !event.defaultPrevented;
  }
  static { listenersOf = (t) => t.#l; }
}
tag(EventTarget, 'EventTarget');

// An exception no caller can take: logged, as workerd reports it.
const reportError = (err) => {
  try { g.console.error('Uncaught', err); } catch {}
};

// ---- AbortController / AbortSignal ----
let abortAlgorithm, signalAbort;
class AbortSignal extends EventTarget {
  #aborted = false; #reason = undefined; #algos = null; #onabort = null; #handler = null;
  constructor(key) {
    if (key !== INTERNAL) throw new TypeError('Illegal constructor');
    super();
  }
  get aborted() { return this.#aborted; }
  get reason() { return this.#reason; }
  throwIfAborted() { if (this.#aborted) throw this.#reason; }
  get onabort() { return this.#onabort; }
  set onabort(f) {
    this.#onabort = typeof f === 'function' || (f !== null && typeof f === 'object') ? f : null;
    if (this.#onabort && !this.#handler) {
      this.#handler = (e) => {
        const h = this.#onabort;
        if (typeof h === 'function') h.call(this, e);
      };
      this.addEventListener('abort', this.#handler);
    }
  }
  static abort(reason) {
    const s = new AbortSignal(INTERNAL);
    s.#aborted = true;
    s.#reason = reason === undefined ? domError('The operation was aborted', 'AbortError') : reason;
    return s;
  }
  static timeout(ms) {
    ms = Number(ms);
    if (!(ms >= 0) || ms > Number.MAX_SAFE_INTEGER) throw new TypeError('The timeout must be a non-negative number');
    if (typeof g.setTimeout !== 'function') throw new TypeError('AbortSignal.timeout needs setTimeout');
    const s = new AbortSignal(INTERNAL);
    g.setTimeout(() => signalAbort(s, domError('The operation was aborted due to timeout', 'TimeoutError')), ms);
    return s;
  }
  static any(signals) {
    const s = new AbortSignal(INTERNAL);
    const list = Array.from(signals);
    for (const x of list) {
      if (!(x instanceof AbortSignal)) throw new TypeError('AbortSignal.any takes AbortSignals');
      if (x.aborted) { s.#aborted = true; s.#reason = x.reason; return s; }
    }
    for (const x of list) abortAlgorithm(x, () => signalAbort(s, x.reason));
    return s;
  }
  static {
    abortAlgorithm = (s, f) => { (s.#algos || (s.#algos = [])).push(f); };
    signalAbort = (s, reason) => {
      if (s.#aborted) return;
      s.#aborted = true;
      s.#reason = reason === undefined ? domError('The operation was aborted', 'AbortError') : reason;
      const algos = s.#algos; s.#algos = null;
      if (algos) for (const f of algos) { try { f(); } catch (e) { reportError(e); } }
      s.dispatchEvent(new Event('abort'));
    };
  }
}
tag(AbortSignal, 'AbortSignal');
class AbortController {
  #signal = new AbortSignal(INTERNAL);
  get signal() { return this.#signal; }
  abort(reason) { signalAbort(this.#signal, reason); }
}
tag(AbortController, 'AbortController');

// ---- console ----
const inspect = (v, depth, seen, top) => {
  switch (typeof v) {
    case 'string': return top ? v : "'" + v.replace(/\\/g, '\\\\').replace(/'/g, "\\'").replace(/\n/g, '\\n') + "'";
    case 'number': return Object.is(v, -0) ? '-0' : String(v);
    case 'bigint': return v + 'n';
    case 'symbol': return v.toString();
    case 'undefined': return 'undefined';
    case 'boolean': return String(v);
    case 'function': {
      const src = Function.prototype.toString.call(v);
      const name = v.name;
      if (src.startsWith('class')) return '[class ' + (name || '(anonymous)') + ']';
      return '[Function: ' + (name || '(anonymous)') + ']';
    }
  }
  if (v === null) return 'null';
  if (seen.includes(v)) return '[Circular]';
  if (v instanceof Error) return v.stack ? (String(v) + ' ' + v.stack.trim().replace(/\s*\n\s*/g, ' ')) : String(v);
  if (v instanceof Date) return isNaN(v) ? 'Invalid Date' : v.toISOString();
  if (v instanceof RegExp) return String(v);
  if (depth > 2) return Array.isArray(v) ? '[Array]' : '[Object]';
  seen = seen.concat([v]);
  const inner = (x) => inspect(x, depth + 1, seen, false);
  // One line always: a console call is one line of the Worker's log.
  const wrap = (open, parts, close) => (parts.length === 0 ? open + close : open + ' ' + parts.join(', ') + ' ' + close);
  const props = (o, skipIndices) => Object.keys(o).filter((k) => !(skipIndices && /^\d+$/.test(k)))
    .map((k) => (/^[A-Za-z_$][\w$]*$/.test(k) ? k : inner(k)) + ': ' + inner(o[k]));
  if (Array.isArray(v)) return wrap('[', v.map(inner).concat(props(v, true)), ']');
  if (v instanceof Map) return wrap('Map(' + v.size + ') {', [...v].map(([k, x]) => inner(k) + ' => ' + inner(x)), '}');
  if (v instanceof Set) return wrap('Set(' + v.size + ') {', [...v].map(inner), '}');
  if (ArrayBuffer.isView(v) && !(v instanceof DataView)) {
    return wrap(v.constructor.name + '(' + v.length + ') [', Array.from(v, inner), ']');
  }
  if (v instanceof ArrayBuffer) return 'ArrayBuffer { byteLength: ' + v.byteLength + ' }';
  if (v instanceof Promise) return 'Promise { <pending> }';
  // The web classes keep their state private: shown through their getters
  // (or their entries), as workerd shows them.
  const shown = INSPECTED.find((x) => v instanceof x[0]);
  if (shown) {
    const [C, list] = shown;
    if (list === 'entries') return wrap(C.name + ' {', [...v].map(([k, x]) => inner(k) + ' => ' + inner(x)), '}');
    return wrap(C.name + ' {', list.map((k) => k + ': ' + inner(v[k])), '}');
  }
  const proto = Object.getPrototypeOf(v);
  let name = '';
  if (proto === null) name = '[Object: null prototype] ';
  else if (proto !== Object.prototype) {
    const t = v[Symbol.toStringTag] || (proto.constructor && proto.constructor.name);
    if (t) name = t + ' ';
  }
  return name + wrap('{', props(v, false), '}');
};
const format = (args) => {
  let first = args[0];
  let i = 1;
  let out = '';
  if (typeof first === 'string' && first.includes('%') && args.length > 1) {
    out = first.replace(/%([sdifjoOc%])/g, (m, c) => {
      if (c === '%') return '%';
      if (i >= args.length) return m;
      const a = args[i++];
      switch (c) {
        case 's': return typeof a === 'string' ? a : inspect(a, 1, [], false);
        case 'd': case 'i': return typeof a === 'bigint' ? a + 'n' : String(c === 'i' ? parseInt(a) : Number(a));
        case 'f': return String(parseFloat(a));
        case 'j': try { return JSON.stringify(a); } catch { return '[Circular]'; }
        case 'c': return '';
        default: return inspect(a, 0, [], false);
      }
    });
  } else {
    out = inspect(first, 0, [], true);
  }
  for (; i < args.length; i++) out += ' ' + inspect(args[i], 0, [], true);
  return out;
};
// [class, getters to show or 'entries'], filled as the classes are defined.
const INSPECTED = [];
const counts = new Map();
const timers = new Map();
const log = (...args) => { N.log(args.length === 0 ? '' : format(args)); };
const console = {
  log, info: log, debug: log, warn: log, error: log, trace: log,
  assert(c, ...args) { if (!c) log('Assertion failed' + (args.length ? ': ' + format(args) : '')); },
  dir(v) { log(inspect(v, 0, [], false)); },
  count(label = 'default') { const n = (counts.get(label) || 0) + 1; counts.set(label, n); log(label + ': ' + n); },
  countReset(label = 'default') { counts.delete(label); },
  time(label = 'default') { timers.set(label, g.performance.now()); },
  timeEnd(label = 'default') { const t = timers.get(label); timers.delete(label); if (t !== undefined) log(label + ': ' + (g.performance.now() - t) + 'ms'); },
  timeLog(label = 'default', ...a) { const t = timers.get(label); if (t !== undefined) log(label + ': ' + (g.performance.now() - t) + 'ms', ...a); },
  group: log, groupCollapsed: log, groupEnd() {}, table: log,
};

// ---- structuredClone ----
const TYPED = [Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array, Int32Array, Uint32Array,
  Float32Array, Float64Array, BigInt64Array, BigUint64Array];
const ERRORS = { Error, EvalError, RangeError, ReferenceError, SyntaxError, TypeError, URIError };
const cloneError = (what) => domError(what + ' could not be cloned.', 'DataCloneError');
const cloneValue = (v, seen) => {
  const t = typeof v;
  if (t === 'symbol') throw cloneError(String(v));
  if (t === 'function') throw cloneError(String(v).slice(0, 60));
  if (t !== 'object' || v === null) return v;
  const old = seen.get(v);
  if (old !== undefined) return old;
  let out;
  if (Array.isArray(v)) {
    out = new Array(v.length);
    seen.set(v, out);
    for (const k of Object.keys(v)) out[k] = cloneValue(v[k], seen);
    return out;
  }
  if (v instanceof Date) out = new Date(v.getTime());
  else if (v instanceof RegExp) out = new RegExp(v.source, v.flags);
  else if (v instanceof ArrayBuffer) out = v.slice(0);
  else if (v instanceof DataView) {
    out = new DataView(cloneValue(v.buffer, seen), v.byteOffset, v.byteLength);
  } else if (ArrayBuffer.isView(v)) {
    out = new v.constructor(cloneValue(v.buffer, seen), v.byteOffset, v.length);
  } else if (v instanceof Map) {
    out = new Map();
    seen.set(v, out);
    for (const [k, x] of v) out.set(cloneValue(k, seen), cloneValue(x, seen));
    return out;
  } else if (v instanceof Set) {
    out = new Set();
    seen.set(v, out);
    for (const x of v) out.add(cloneValue(x, seen));
    return out;
  } else if (v instanceof Error) {
    const C = ERRORS[v.name] || Error;
    out = new C(v.message);
    if (v.stack !== undefined) out.stack = v.stack;
    if ('cause' in v) { seen.set(v, out); out.cause = cloneValue(v.cause, seen); }
  } else if (v instanceof Boolean || v instanceof Number || v instanceof String || v instanceof BigInt) {
    out = Object(v.valueOf());
  } else if (v instanceof Promise || v instanceof WeakMap || v instanceof WeakSet || v instanceof WeakRef) {
    throw cloneError(Object.prototype.toString.call(v));
  } else if (v instanceof Blob) {
    out = v; // immutable: shared, as a copy would be equal
  } else if (Object.getPrototypeOf(v) !== Object.prototype && Object.getPrototypeOf(v) !== null && WEB_CLASSES.some((C) => v instanceof C)) {
    throw cloneError(Object.prototype.toString.call(v));
  } else {
    out = {};
    seen.set(v, out);
    for (const k of Object.keys(v)) out[k] = cloneValue(v[k], seen);
    return out;
  }
  seen.set(v, out);
  return out;
};
// Classes defined here whose objects do not clone (filled as they are defined).
const WEB_CLASSES = [EventTarget, Event];
function structuredClone(value, options) {
  if (arguments.length === 0) throw new TypeError("structuredClone requires 1 argument");
  return cloneValue(value, new Map());
}

// ---- performance ----
// engine.rs defines a plain `performance` before this runs, its origin
// seeded per instance (a snapshot would freeze one made here): this class
// reads its clock.
const ENGINE_PERF = g.performance;
class Performance {
  constructor(key) { if (key !== INTERNAL) throw new TypeError('Illegal constructor'); }
  now() { return ENGINE_PERF.now(); }
  get timeOrigin() { return ENGINE_PERF.timeOrigin; }
  toJSON() { return { timeOrigin: this.timeOrigin }; }
}
tag(Performance, 'Performance');
const performance = new Performance(INTERNAL);

// ---- atob / btoa ----
function btoa(data) {
  if (arguments.length === 0) throw new TypeError("btoa requires 1 argument");
  const r = N.btoa(String(data));
  if (r == null) throw domError('Invalid character', 'InvalidCharacterError');
  return r;
}
function atob(data) {
  if (arguments.length === 0) throw new TypeError("atob requires 1 argument");
  const r = N.atob(String(data));
  if (r == null) throw domError('The string to be decoded is not correctly encoded.', 'InvalidCharacterError');
  return r;
}

// ---- TextEncoder / TextDecoder ----
// A JS string as UTF-8 (the native makes lone surrogates U+FFFD).
const utf8 = (s) => N.utf8Encode(s);
// A BufferSource as a Uint8Array over the same bytes.
const bytesView = (b) => {
  if (b instanceof Uint8Array) return b;
  if (b instanceof ArrayBuffer) return new Uint8Array(b);
  if (ArrayBuffer.isView(b)) return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  if (typeof SharedArrayBuffer === 'function' && b instanceof SharedArrayBuffer) return new Uint8Array(b);
  return null;
};
class TextEncoder {
  get encoding() { return 'utf-8'; }
  encode(input = '') { return utf8(String(input)); }
  encodeInto(src, dest) {
    src = String(src);
    if (!(dest instanceof Uint8Array)) throw new TypeError('encodeInto needs a Uint8Array');
    let read = 0, written = 0;
    const cap = dest.length;
    for (let i = 0; i < src.length; i++) {
      let c = src.charCodeAt(i);
      let units = 1;
      if (c >= 0xd800 && c <= 0xdbff && i + 1 < src.length) {
        const d = src.charCodeAt(i + 1);
        if (d >= 0xdc00 && d <= 0xdfff) { c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00); units = 2; }
      }
      if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;
      const n = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
      if (written + n > cap) break;
      if (n === 1) dest[written] = c;
      else if (n === 2) { dest[written] = 0xc0 | (c >> 6); dest[written + 1] = 0x80 | (c & 63); }
      else if (n === 3) {
        dest[written] = 0xe0 | (c >> 12); dest[written + 1] = 0x80 | ((c >> 6) & 63); dest[written + 2] = 0x80 | (c & 63);
      } else {
        dest[written] = 0xf0 | (c >> 18); dest[written + 1] = 0x80 | ((c >> 12) & 63);
        dest[written + 2] = 0x80 | ((c >> 6) & 63); dest[written + 3] = 0x80 | (c & 63);
      }
      written += n; read += units; i += units - 1;
    }
    return { read, written };
  }
}
tag(TextEncoder, 'TextEncoder');
const UTF8_LABELS = new Set(['utf-8', 'utf8', 'unicode-1-1-utf-8', 'unicode11utf8', 'unicode20utf8', 'x-unicode20utf8']);
// How many bytes at the end of `b` are a sequence of UTF-8 not yet
// complete: a valid start of one, held back for the next chunk. A start
// that cannot be completed (`E0 80`, `C0`, `F5`) is not held back: its
// U+FFFD comes now, as the WHATWG decoder emits it.
const incompleteTail = (b) => {
  const n = b.length;
  for (let k = 1; k <= 3 && k <= n; k++) {
    const c = b[n - k];
    if ((c & 0xc0) === 0x80) continue; // continuation byte
    const need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 1;
    if (need <= k || c > 0xf4) return 0;
    if (k >= 2) {
      // The second byte's range depends on the first (no overlong forms,
      // surrogates or code points past U+10FFFF).
      const d = b[n - k + 1];
      if (d < (c === 0xe0 ? 0xa0 : c === 0xf0 ? 0x90 : 0x80) || d > (c === 0xed ? 0x9f : c === 0xf4 ? 0x8f : 0xbf)) return 0;
    }
    return k;
  }
  return 0;
};
const FATAL = 1, IGNORE_BOM = 2, BOM_SEEN = 4; // TextDecoder's #f
class TextDecoder {
  #f = 0; #pending = null;
  constructor(label, options) {
    if (label !== undefined) {
      const l = String(label).trim().toLowerCase();
      if (!UTF8_LABELS.has(l)) throw new RangeError('The "' + label + '" encoding is not supported');
    }
    if (options != null) this.#f = (options.fatal ? FATAL : 0) | (options.ignoreBOM ? IGNORE_BOM : 0);
  }
  get encoding() { return 'utf-8'; }
  get fatal() { return (this.#f & FATAL) !== 0; }
  get ignoreBOM() { return (this.#f & IGNORE_BOM) !== 0; }
  decode(input, options) {
    let b;
    if (input instanceof Uint8Array) b = input;
    else if (input === undefined) b = new Uint8Array(0);
    else if ((b = bytesView(input)) === null) throw new TypeError('decode needs an ArrayBuffer or a view of one');
    const stream = options !== undefined && options !== null && !!options.stream;
    // The usual call: one whole buffer.
    if (!stream && this.#pending === null && (this.#f & BOM_SEEN) === 0) {
      if (b.length === 0) return '';
      const s = N.utf8Decode(b, (this.#f & FATAL) !== 0);
      if (s == null) throw new TypeError('The encoded data was not valid utf-8');
      return (this.#f & IGNORE_BOM) === 0 && s.charCodeAt(0) === 0xfeff ? s.slice(1) : s;
    }
    if (this.#pending !== null) {
      const j = new Uint8Array(this.#pending.length + b.length);
      j.set(this.#pending); j.set(b, this.#pending.length);
      b = j; this.#pending = null;
    }
    if (stream) {
      const t = incompleteTail(b);
      if (t) { this.#pending = b.slice(b.length - t); b = b.subarray(0, b.length - t); }
    }
    let s = b.length === 0 ? '' : N.utf8Decode(b, (this.#f & FATAL) !== 0);
    if (s == null) { this.#f &= ~BOM_SEEN; this.#pending = null; throw new TypeError('The encoded data was not valid utf-8'); }
    if ((this.#f & BOM_SEEN) === 0 && s.length > 0) {
      if ((this.#f & IGNORE_BOM) === 0 && s.charCodeAt(0) === 0xfeff) s = s.slice(1);
      this.#f |= BOM_SEEN;
    }
    if (!stream) this.#f &= ~BOM_SEEN;
    return s;
  }
}
tag(TextDecoder, 'TextDecoder');

// ---- crypto ----
const INT_ARRAYS = [Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array, Int32Array, Uint32Array,
  BigInt64Array, BigUint64Array];
const DIGESTS = { 'SHA-1': 1, 'SHA-256': 256, 'SHA-384': 384, 'SHA-512': 512 };
// A hash's block size in bits: an HMAC key's default length.
const BLOCK_BITS = { 1: 512, 256: 512, 384: 1024, 512: 1024 };
const JWK_ALG = { 1: 'HS1', 256: 'HS256', 384: 'HS384', 512: 'HS512' };
const HASH_NAME = { 1: 'SHA-1', 256: 'SHA-256', 384: 'SHA-384', 512: 'SHA-512' };
// An algorithm identifier (a name, or an object with `name`): its name,
// upper case.
const algName = (a) => {
  const n = typeof a === 'object' && a !== null ? a.name : a;
  if (n === undefined) throw new TypeError('An algorithm needs a name');
  return String(n).toUpperCase();
};
const digestOf = (a) => {
  const which = DIGESTS[algName(a)];
  if (!which) throw domError('Unrecognized name.', 'NotSupportedError');
  return which;
};
// An HMAC algorithm's hash (`hash` is required).
const hmacHash = (a) => {
  if (typeof a !== 'object' || a === null || a.hash === undefined) throw new TypeError('HMAC needs a hash');
  return digestOf(a.hash);
};
const bufferSource = (b, what) => {
  const v = bytesView(b);
  if (v === null) throw new TypeError(what + ' needs an ArrayBuffer or a view of one');
  return v;
};
const copyOut = (v) => v.slice().buffer;
const HMAC_USAGES = ['sign', 'verify'];
// An HMAC key's usages, each checked; an empty list is refused later, by
// `someUsage`, once the key is made (WebCrypto's order, and workerd's).
const keyUsages = (usages) => {
  const u = Array.from(usages, String);
  for (const x of u) if (!HMAC_USAGES.includes(x)) throw domError('Unsupported key usage for an HMAC key: ' + x, 'SyntaxError');
  return [...new Set(u)];
};
const someUsage = (u) => {
  if (u.length === 0) throw domError('An HMAC key needs at least one usage', 'SyntaxError');
};
const binary = (bytes) => {
  let s = '';
  for (let i = 0; i < bytes.length; i += 8192) s += String.fromCharCode(...bytes.subarray(i, i + 8192));
  return s;
};
const b64url = (bytes) => btoa(binary(bytes)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
const unb64url = (s) => {
  try {
    return Uint8Array.from(atob(String(s).replace(/-/g, '+').replace(/_/g, '/')), (c) => c.charCodeAt(0));
  } catch { throw domError('The JWK member k is not base64url', 'DataError'); }
};
let keyBytes, newKey;
// A key of crypto.subtle (HMAC only): its bytes stay inside.
class CryptoKey {
  #bytes; #type; #extractable; #algorithm; #usages;
  constructor(key) { if (key !== INTERNAL) throw new TypeError('Illegal constructor'); }
  get type() { return this.#type; }
  get extractable() { return this.#extractable; }
  get algorithm() { return this.#algorithm; }
  get usages() { return this.#usages; }
  static {
    keyBytes = (k) => k.#bytes;
    newKey = (bytes, which, length, extractable, usages) => {
      const k = new CryptoKey(INTERNAL);
      k.#bytes = bytes; k.#type = 'secret'; k.#extractable = Boolean(extractable);
      k.#algorithm = Object.freeze({ name: 'HMAC', hash: Object.freeze({ name: HASH_NAME[which] }), length });
      k.#usages = Object.freeze(usages);
      return k;
    };
  }
}
tag(CryptoKey, 'CryptoKey');
// An HMAC key `usage` is allowed for, checked against the operation's
// algorithm: its hash's size.
const hmacKey = (algorithm, key, usage) => {
  if (!(key instanceof CryptoKey)) throw new TypeError('The key must be a CryptoKey');
  if (algName(algorithm) !== 'HMAC') throw domError('Unrecognized name.', 'NotSupportedError');
  if (key.algorithm.name !== 'HMAC') throw domError('The key is not an HMAC key', 'InvalidAccessError');
  if (!key.usages.includes(usage)) throw domError('The key does not allow ' + usage, 'InvalidAccessError');
  return DIGESTS[key.algorithm.hash.name];
};
class SubtleCrypto {
  constructor(key) { if (key !== INTERNAL) throw new TypeError('Illegal constructor'); }
  async digest(algorithm, data) {
    return N.digest(digestOf(algorithm), bufferSource(data, 'digest')).buffer;
  }
  // HMAC keys from raw bytes or a JWK ({kty: 'oct', k}). The checks come
  // in WebCrypto's order (the algorithm, the key data's type, the usages,
  // the key, then an empty list of usages), so a call wrong in several
  // ways fails as on workerd.
  async importKey(format, keyData, algorithm, extractable, usages) {
    if (algName(algorithm) !== 'HMAC') throw domError('Unrecognized name.', 'NotSupportedError');
    const which = hmacHash(algorithm);
    let bytes;
    if (format === 'raw') bytes = bufferSource(keyData, 'importKey').slice();
    else if (format !== 'jwk') throw domError('An HMAC key is imported as raw or jwk', 'NotSupportedError');
    else if (typeof keyData !== 'object' || keyData === null) throw new TypeError('A JWK must be an object');
    const u = keyUsages(usages);
    if (format === 'jwk') {
      if (keyData.kty !== 'oct') throw domError('An HMAC JWK has kty "oct"', 'DataError');
      if (keyData.alg !== undefined && keyData.alg !== JWK_ALG[which]) throw domError('The JWK alg does not match the hash', 'DataError');
      if (keyData.ext === false && extractable) throw domError('The JWK is not extractable', 'DataError');
      bytes = unb64url(keyData.k);
    }
    if (bytes.length === 0) throw domError('An HMAC key cannot be empty', 'DataError');
    let length = bytes.length * 8;
    if (algorithm.length !== undefined) {
      const l = Number(algorithm.length);
      if (!(l <= length && l > length - 8)) throw domError('The length does not match the key', 'DataError');
      length = l;
      // A key of `length` bits: the bits past it are zero (as workerd,
      // and generateKey below, make them).
      if (length % 8) bytes[bytes.length - 1] &= 0xff << (8 - (length % 8));
    }
    someUsage(u);
    return newKey(bytes, which, length, extractable, u);
  }
  async exportKey(format, key) {
    if (!(key instanceof CryptoKey)) throw new TypeError('The key must be a CryptoKey');
    if (!key.extractable) throw domError('The key is not extractable', 'InvalidAccessError');
    const bytes = keyBytes(key);
    if (format === 'raw') return copyOut(bytes);
    if (format === 'jwk') {
      return { kty: 'oct', k: b64url(bytes), alg: JWK_ALG[DIGESTS[key.algorithm.hash.name]], key_ops: [...key.usages], ext: true };
    }
    throw domError('An HMAC key is exported as raw or jwk', 'NotSupportedError');
  }
  async generateKey(algorithm, extractable, usages) {
    if (algName(algorithm) !== 'HMAC') throw domError('Unrecognized name.', 'NotSupportedError');
    const which = hmacHash(algorithm);
    const u = keyUsages(usages);
    const length = algorithm.length === undefined ? BLOCK_BITS[which] : Number(algorithm.length);
    if (!(length > 0 && length <= 8 * 65536)) throw domError('Invalid HMAC key length', 'OperationError');
    someUsage(u);
    const bytes = new Uint8Array(Math.ceil(length / 8));
    N.random(bytes);
    if (length % 8) bytes[bytes.length - 1] &= 0xff << (8 - (length % 8));
    return newKey(bytes, which, length, extractable, u);
  }
  async sign(algorithm, key, data) {
    const which = hmacKey(algorithm, key, 'sign');
    return N.hmac(which, keyBytes(key), bufferSource(data, 'sign')).buffer;
  }
  async verify(algorithm, key, signature, data) {
    const which = hmacKey(algorithm, key, 'verify');
    return N.hmacVerify(which, keyBytes(key), bufferSource(data, 'verify'), bufferSource(signature, 'verify'));
  }
  // workerd's extension: compares two buffers in time that does not
  // depend on where they differ.
  timingSafeEqual(a, b) {
    const x = bufferSource(a, 'timingSafeEqual'), y = bufferSource(b, 'timingSafeEqual');
    if (x.byteLength !== y.byteLength) throw new TypeError('timingSafeEqual needs two buffers of the same length');
    return N.timingSafeEqual(x, y);
  }
}
for (const m of ['encrypt', 'decrypt', 'deriveKey', 'deriveBits', 'wrapKey', 'unwrapKey']) {
  SubtleCrypto.prototype[m] = async function () { throw domError('crypto.subtle.' + m + ' is not supported', 'NotSupportedError'); };
}
tag(SubtleCrypto, 'SubtleCrypto');
class Crypto {
  #subtle = new SubtleCrypto(INTERNAL);
  constructor(key) { if (key !== INTERNAL) throw new TypeError('Illegal constructor'); }
  get subtle() { return this.#subtle; }
  getRandomValues(a) {
    if (!INT_ARRAYS.some((C) => a instanceof C)) throw domError('The data must be an integer typed array', 'TypeMismatchError');
    if (a.byteLength > 65536) throw domError('The byte length of the array exceeds 65536', 'QuotaExceededError');
    N.random(new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
    return a;
  }
  randomUUID() { return N.uuid(); }
}
tag(Crypto, 'Crypto');
const crypto = new Crypto(INTERNAL);

define('DOMException', DOMException);
define('Event', Event);
define('EventTarget', EventTarget);
define('AbortController', AbortController);
define('AbortSignal', AbortSignal);
define('console', console);
define('structuredClone', structuredClone);
define('Performance', Performance);
define('performance', performance);
define('atob', atob);
define('btoa', btoa);
define('TextEncoder', TextEncoder);
define('TextDecoder', TextDecoder);
define('Crypto', Crypto);
define('SubtleCrypto', SubtleCrypto);
define('CryptoKey', CryptoKey);
define('crypto', crypto);
