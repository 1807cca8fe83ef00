// streams.js: ReadableStream (default controller and reader, async
// iteration, tee, pipeTo, pipeThrough), the body of a Request or Response;
// WritableStream, TransformStream, TextEncoderStream and TextDecoderStream
// (no byte streams or BYOB readers; writes are not held back by a full
// readable side). The state of a
// stream is one plain object (`st`) shared by the stream, its controller
// and its reader, worked on by the functions below.
const rsNew = () => ({
  state: 'readable', // 'closed', 'errored'
  queue: [], size: 0, hwm: 1, sizeOf: null,
  closeRequested: false, started: false, pulling: false, pullAgain: false,
  reads: [], // pending read requests: [resolve, reject]
  reader: null, disturbed: false, error: undefined,
  pull: null, cancel: null, closed: null, // closed: the reader's {promise, resolve, reject}
});
const deferred = () => {
  let resolve, reject;
  const promise = new Promise((a, b) => { resolve = a; reject = b; });
  return { promise, resolve, reject };
};
const rsDesired = (st) => (st.state === 'errored' ? null : st.state === 'closed' ? 0 : st.hwm - st.size);
const rsFinishClose = (st) => {
  st.state = 'closed';
  const reads = st.reads; st.reads = [];
  for (const r of reads) r[0]({ value: undefined, done: true });
  if (st.closed) st.closed.resolve(undefined);
  st.pull = st.cancel = null;
};
const rsError = (st, e) => {
  if (st.state !== 'readable') return;
  st.state = 'errored'; st.error = e; st.queue = []; st.size = 0;
  const reads = st.reads; st.reads = [];
  for (const r of reads) r[1](e);
  if (st.closed) { st.closed.reject(e); st.closed.promise.catch(() => {}); }
  st.pull = st.cancel = null;
};
const rsPullIfNeeded = (st) => {
  if (!st.started || st.state !== 'readable' || st.closeRequested || !st.pull) return;
  if (!(st.reads.length > 0 || st.hwm - st.size > 0)) return;
  if (st.pulling) { st.pullAgain = true; return; }
  st.pulling = true;
  let p;
  try { p = Promise.resolve(st.pull()); } catch (e) { p = Promise.reject(e); }
  p.then(() => {
    st.pulling = false;
    if (st.pullAgain) { st.pullAgain = false; rsPullIfNeeded(st); }
  }, (e) => rsError(st, e));
};
const rsEnqueue = (st, chunk) => {
  if (st.closeRequested || st.state !== 'readable') throw new TypeError('The stream is closed or errored; it cannot take more chunks');
  if (st.reads.length > 0) st.reads.shift()[0]({ value: chunk, done: false });
  else {
    let n = 1;
    if (st.sizeOf) {
      try { n = Number(st.sizeOf(chunk)); } catch (e) { rsError(st, e); throw e; }
      if (!(n >= 0) || n === Infinity) { const e = new RangeError('The chunk size is invalid'); rsError(st, e); throw e; }
    }
    st.queue.push(chunk, n); st.size += n;
  }
  rsPullIfNeeded(st);
};
const rsClose = (st) => {
  if (st.closeRequested || st.state !== 'readable') throw new TypeError('The stream is already closed');
  st.closeRequested = true;
  if (st.queue.length === 0) rsFinishClose(st);
};
const rsRead = (st) => {
  st.disturbed = true;
  if (st.queue.length > 0) {
    const chunk = st.queue.shift(); st.size -= st.queue.shift();
    if (st.closeRequested && st.queue.length === 0) rsFinishClose(st);
    else rsPullIfNeeded(st);
    return Promise.resolve({ value: chunk, done: false });
  }
  if (st.state === 'closed') return Promise.resolve({ value: undefined, done: true });
  if (st.state === 'errored') return Promise.reject(st.error);
  const d = deferred();
  st.reads.push([d.resolve, d.reject]);
  rsPullIfNeeded(st);
  return d.promise;
};
const rsCancel = (st, reason) => {
  st.disturbed = true;
  if (st.state === 'closed') return Promise.resolve(undefined);
  if (st.state === 'errored') return Promise.reject(st.error);
  const cancel = st.cancel;
  st.queue = []; st.size = 0;
  rsFinishClose(st);
  let p;
  try { p = Promise.resolve(cancel ? cancel(reason) : undefined); } catch (e) { p = Promise.reject(e); }
  return p.then(() => undefined);
};

let streamState;
class ReadableStreamDefaultController {
  #st;
  constructor(key, st) {
    if (key !== INTERNAL) throw new TypeError('Illegal constructor');
    this.#st = st;
  }
  get desiredSize() { return rsDesired(this.#st); }
  enqueue(chunk) { rsEnqueue(this.#st, chunk); }
  close() { rsClose(this.#st); }
  error(e) { rsError(this.#st, e); }
}
tag(ReadableStreamDefaultController, 'ReadableStreamDefaultController');

class ReadableStream {
  #st;
  constructor(source, strategy) {
    const st = (this.#st = rsNew());
    if (source === INTERNAL) return; // filled by the caller
    source = source == null ? {} : source;
    if (source.type !== undefined && String(source.type) !== 'bytes') throw new RangeError('Invalid stream type: ' + source.type);
    if (strategy != null) {
      if (strategy.highWaterMark !== undefined) {
        st.hwm = Number(strategy.highWaterMark);
        if (!(st.hwm >= 0)) throw new RangeError('Invalid highWaterMark');
      }
      if (strategy.size !== undefined) {
        if (typeof strategy.size !== 'function') throw new TypeError('size must be a function');
        st.sizeOf = strategy.size;
      }
    } else if (source.type === 'bytes') st.hwm = 0;
    const ctrl = new ReadableStreamDefaultController(INTERNAL, st);
    const { start, pull, cancel } = source;
    for (const f of [start, pull, cancel]) if (f !== undefined && typeof f !== 'function') throw new TypeError('A stream source method must be a function');
    if (pull) st.pull = () => pull.call(source, ctrl);
    if (cancel) st.cancel = (r) => cancel.call(source, r);
    const started = start ? start.call(source, ctrl) : undefined;
    Promise.resolve(started).then(() => { st.started = true; rsPullIfNeeded(st); }, (e) => rsError(st, e));
  }
  get locked() { return this.#st.reader !== null; }
  cancel(reason) {
    if (this.#st.reader !== null) return Promise.reject(new TypeError('The stream is locked to a reader'));
    return rsCancel(this.#st, reason);
  }
  getReader(options) {
    if (options != null && options.mode !== undefined) {
      if (String(options.mode) !== 'byob') throw new RangeError('Invalid reader mode');
      throw new TypeError('BYOB readers are not supported');
    }
    return new ReadableStreamDefaultReader(this);
  }
  tee() {
    const reader = this.getReader();
    const src = this.#st;
    const a = new ReadableStream(INTERNAL), b = new ReadableStream(INTERNAL);
    const sa = a.#st, sb = b.#st;
    let reading = false, canceledA = false, canceledB = false, reasonA, reasonB;
    const done = deferred();
    const pull = () => {
      if (reading) return Promise.resolve();
      reading = true;
      reader.read().then(({ value, done: end }) => {
        reading = false;
        if (end) {
          if (!canceledA && sa.state === 'readable') rsClose(sa);
          if (!canceledB && sb.state === 'readable') rsClose(sb);
          done.resolve();
          return;
        }
        if (!canceledA && sa.state === 'readable') rsEnqueue(sa, value);
        if (!canceledB && sb.state === 'readable') rsEnqueue(sb, value);
      }, (e) => { rsError(sa, e); rsError(sb, e); done.resolve(); });
      return Promise.resolve();
    };
    const cancelled = () => {
      if (canceledA && canceledB) { reader.cancel([reasonA, reasonB]).then(done.resolve, done.resolve); }
      return done.promise;
    };
    for (const [st, which] of [[sa, 0], [sb, 1]]) {
      st.pull = pull;
      st.cancel = (r) => { if (which === 0) { canceledA = true; reasonA = r; } else { canceledB = true; reasonB = r; } return cancelled(); };
      st.started = true;
    }
    reader.closed.catch((e) => { rsError(sa, e); rsError(sb, e); });
    void src;
    return [a, b];
  }
  values(options) {
    const reader = this.getReader();
    const keep = !!(options && options.preventCancel);
    return {
      next: () => reader.read().then((r) => { if (r.done) reader.releaseLock(); return r; }),
      return: (value) => {
        const p = keep ? Promise.resolve() : reader.cancel(value);
        return p.then(() => { reader.releaseLock(); return { value, done: true }; });
      },
      [Symbol.asyncIterator]() { return this; },
    };
  }
  [Symbol.asyncIterator](options) { return this.values(options); }
  static from(iterable) {
    const it = iterable[Symbol.asyncIterator] ? iterable[Symbol.asyncIterator]() : iterable[Symbol.iterator]();
    return new ReadableStream({
      async pull(c) {
        const r = await it.next();
        if (r.done) c.close(); else c.enqueue(r.value);
      },
      async cancel(reason) { if (typeof it.return === 'function') await it.return(reason); },
    }, { highWaterMark: 0 });
  }
  static { streamState = (s) => s.#st; }
}
tag(ReadableStream, 'ReadableStream');

class ReadableStreamDefaultReader {
  #st;
  constructor(stream) {
    if (!(stream instanceof ReadableStream)) throw new TypeError('A reader needs a ReadableStream');
    const st = streamState(stream);
    if (st.reader !== null) throw new TypeError('The stream is already locked to a reader');
    st.reader = this;
    this.#st = st;
    st.closed = deferred();
    if (st.state === 'closed') st.closed.resolve(undefined);
    else if (st.state === 'errored') { st.closed.reject(st.error); st.closed.promise.catch(() => {}); }
  }
  get closed() { return this.#st ? this.#st.closed.promise : Promise.reject(new TypeError('The reader is released')); }
  read() {
    if (!this.#st) return Promise.reject(new TypeError('The reader has been released'));
    return rsRead(this.#st);
  }
  cancel(reason) {
    if (!this.#st) return Promise.reject(new TypeError('The reader has been released'));
    return rsCancel(this.#st, reason);
  }
  releaseLock() {
    const st = this.#st;
    if (!st) return;
    const e = new TypeError('The reader was released');
    const reads = st.reads; st.reads = [];
    for (const r of reads) r[1](e);
    if (st.state === 'readable') { st.closed.reject(e); st.closed.promise.catch(() => {}); }
    else { st.closed = deferred(); st.closed.reject(e); st.closed.promise.catch(() => {}); }
    st.reader = null;
    this.#st = null;
  }
}
tag(ReadableStreamDefaultReader, 'ReadableStreamDefaultReader');

// ---- WritableStream ----
// The state of a writable stream: writes queue and reach the sink one at
// a time; `close` is queued after them.
const CLOSE = {};
let writableState;
class WritableStreamDefaultController {
  #st;
  constructor(key, st) {
    if (key !== INTERNAL) throw new TypeError('Illegal constructor');
    this.#st = st;
  }
  get signal() { return this.#st.abort.signal; }
  error(e) { wsError(this.#st, e); }
}
tag(WritableStreamDefaultController, 'WritableStreamDefaultController');
const wsError = (st, e) => {
  if (st.state !== 'writable' && st.state !== 'erroring') return;
  st.state = 'errored'; st.error = e;
  const q = st.queue; st.queue = [];
  for (const w of q) w.reject(e);
  st.closed.reject(e); st.closed.promise.catch(() => {});
  st.ready = Promise.reject(e); st.ready.catch(() => {});
};
const wsAdvance = (st) => {
  if (!st.started || st.inFlight || st.queue.length === 0 || st.state === 'errored') return;
  const w = st.queue[0];
  st.inFlight = true;
  let p;
  try {
    p = w.chunk === CLOSE ? (st.sink.close ? st.sink.close.call(st.sink) : undefined)
      : st.sink.write ? st.sink.write.call(st.sink, w.chunk, st.ctrl) : undefined;
    p = Promise.resolve(p);
  } catch (e) { p = Promise.reject(e); }
  p.then(() => {
    st.inFlight = false;
    if (st.state === 'errored') return;
    st.queue.shift();
    w.resolve(undefined);
    if (w.chunk === CLOSE) { st.state = 'closed'; st.closed.resolve(undefined); return; }
    wsAdvance(st);
  }, (e) => { st.inFlight = false; wsError(st, e); });
};
const wsWrite = (st, chunk) => {
  if (st.state === 'errored') return Promise.reject(st.error);
  if (st.state !== 'writable' || st.closeRequested) return Promise.reject(new TypeError('The stream is closing or closed'));
  const d = deferred();
  st.queue.push({ chunk, resolve: d.resolve, reject: d.reject });
  wsAdvance(st);
  return d.promise;
};
const wsClose = (st) => {
  if (st.state === 'errored') return Promise.reject(st.error);
  if (st.state !== 'writable' || st.closeRequested) return Promise.reject(new TypeError('The stream is already closing or closed'));
  st.closeRequested = true;
  const d = deferred();
  st.queue.push({ chunk: CLOSE, resolve: d.resolve, reject: d.reject });
  wsAdvance(st);
  return d.promise;
};
const wsAbort = (st, reason) => {
  if (st.state === 'closed' || st.state === 'errored') return Promise.resolve(undefined);
  st.abort.abort(reason);
  const abort = st.sink.abort;
  wsError(st, reason);
  try { return Promise.resolve(abort ? abort.call(st.sink, reason) : undefined).then(() => undefined); } catch (e) { return Promise.reject(e); }
};
class WritableStream {
  #st;
  constructor(sink, strategy) {
    sink = sink == null ? {} : sink;
    const st = (this.#st = {
      state: 'writable', queue: [], sink, writer: null, inFlight: false, closeRequested: false, error: undefined,
      started: false, hwm: 1, closed: deferred(), ready: Promise.resolve(undefined), abort: new AbortController(), ctrl: null,
    });
    if (strategy != null && strategy.highWaterMark !== undefined) st.hwm = Number(strategy.highWaterMark);
    for (const k of ['start', 'write', 'close', 'abort']) {
      if (sink[k] !== undefined && typeof sink[k] !== 'function') throw new TypeError('A sink method must be a function');
    }
    st.ctrl = new WritableStreamDefaultController(INTERNAL, st);
    let started;
    try { started = sink.start ? sink.start.call(sink, st.ctrl) : undefined; } catch (e) { throw e; }
    Promise.resolve(started).then(() => { st.started = true; wsAdvance(st); }, (e) => wsError(st, e));
  }
  get locked() { return this.#st.writer !== null; }
  abort(reason) {
    if (this.#st.writer !== null) return Promise.reject(new TypeError('The stream is locked to a writer'));
    return wsAbort(this.#st, reason);
  }
  close() {
    if (this.#st.writer !== null) return Promise.reject(new TypeError('The stream is locked to a writer'));
    return wsClose(this.#st);
  }
  getWriter() { return new WritableStreamDefaultWriter(this); }
  static { writableState = (w) => w.#st; }
}
tag(WritableStream, 'WritableStream');
class WritableStreamDefaultWriter {
  #st;
  constructor(stream) {
    if (!(stream instanceof WritableStream)) throw new TypeError('A writer needs a WritableStream');
    const st = writableState(stream);
    if (st.writer !== null) throw new TypeError('The stream is already locked to a writer');
    st.writer = this;
    this.#st = st;
  }
  #live() { if (this.#st === null) throw new TypeError('The writer has been released'); return this.#st; }
  get closed() { return this.#st === null ? Promise.reject(new TypeError('The writer has been released')) : this.#st.closed.promise; }
  get ready() { return this.#st === null ? Promise.reject(new TypeError('The writer has been released')) : this.#st.ready; }
  get desiredSize() {
    const st = this.#live();
    if (st.state === 'errored') return null;
    if (st.state === 'closed') return 0;
    return st.hwm - st.queue.filter((w) => w.chunk !== CLOSE).length;
  }
  write(chunk) { try { return wsWrite(this.#live(), chunk); } catch (e) { return Promise.reject(e); } }
  close() { try { return wsClose(this.#live()); } catch (e) { return Promise.reject(e); } }
  abort(reason) { try { return wsAbort(this.#live(), reason); } catch (e) { return Promise.reject(e); } }
  releaseLock() {
    if (this.#st === null) return;
    this.#st.writer = null;
    this.#st = null;
  }
}
tag(WritableStreamDefaultWriter, 'WritableStreamDefaultWriter');

// ---- TransformStream ----
class TransformStreamDefaultController {
  #t;
  constructor(key, t) {
    if (key !== INTERNAL) throw new TypeError('Illegal constructor');
    this.#t = t;
  }
  get desiredSize() { return this.#t.rc.desiredSize; }
  enqueue(chunk) { this.#t.rc.enqueue(chunk); }
  error(e) { this.#t.rc.error(e); wsError(this.#t.ws, e); }
  terminate() {
    try { this.#t.rc.close(); } catch {}
    wsError(this.#t.ws, new TypeError('The transform stream was terminated'));
  }
}
tag(TransformStreamDefaultController, 'TransformStreamDefaultController');
class TransformStream {
  #readable; #writable;
  constructor(transformer, writableStrategy, readableStrategy) {
    transformer = transformer == null ? {} : transformer;
    for (const k of ['start', 'transform', 'flush', 'cancel']) {
      if (transformer[k] !== undefined && typeof transformer[k] !== 'function') throw new TypeError('A transformer method must be a function');
    }
    const t = { rc: null, ws: null };
    const ctrl = new TransformStreamDefaultController(INTERNAL, t);
    const started = deferred();
    this.#readable = new ReadableStream({
      start(c) { t.rc = c; },
      cancel(reason) {
        if (t.ws) wsError(t.ws, reason);
        return transformer.cancel ? transformer.cancel.call(transformer, reason) : undefined;
      },
    }, readableStrategy === undefined ? { highWaterMark: 0 } : readableStrategy);
    this.#writable = new WritableStream({
      start() { return started.promise; },
      write(chunk) {
        if (transformer.transform) return transformer.transform.call(transformer, chunk, ctrl);
        ctrl.enqueue(chunk);
      },
      async close() {
        if (transformer.flush) await transformer.flush.call(transformer, ctrl);
        try { t.rc.close(); } catch {}
      },
      abort(reason) { t.rc.error(reason); },
    }, writableStrategy);
    t.ws = writableState(this.#writable);
    try {
      started.resolve(transformer.start ? transformer.start.call(transformer, ctrl) : undefined);
    } catch (e) {
      started.reject(e);
      throw e;
    }
  }
  get readable() { return this.#readable; }
  get writable() { return this.#writable; }
}
tag(TransformStream, 'TransformStream');

// pipeTo / pipeThrough on ReadableStream.
ReadableStream.prototype.pipeTo = function pipeTo(dest, options) {
  if (!(this instanceof ReadableStream)) return Promise.reject(new TypeError('pipeTo needs a ReadableStream'));
  if (!(dest instanceof WritableStream)) return Promise.reject(new TypeError('pipeTo needs a WritableStream'));
  if (this.locked || dest.locked) return Promise.reject(new TypeError('A stream is locked'));
  options = options == null ? {} : options;
  const reader = this.getReader();
  const writer = dest.getWriter();
  const signal = options.signal;
  return (async () => {
    try {
      if (signal && signal.aborted) throw signal.reason;
      for (;;) {
        if (signal && signal.aborted) throw signal.reason;
        const { value, done } = await reader.read();
        if (done) break;
        await writer.write(value);
      }
      if (!options.preventClose) await writer.close();
    } catch (e) {
      if (!options.preventAbort) await writer.abort(e).catch(() => {});
      if (!options.preventCancel) await reader.cancel(e).catch(() => {});
      throw e;
    } finally {
      reader.releaseLock();
      writer.releaseLock();
    }
  })();
};
ReadableStream.prototype.pipeThrough = function pipeThrough(pair, options) {
  if (pair == null || !(pair.writable instanceof WritableStream) || !(pair.readable instanceof ReadableStream)) {
    throw new TypeError('pipeThrough needs {writable, readable}');
  }
  this.pipeTo(pair.writable, options).catch(() => {});
  return pair.readable;
};

// ---- TextEncoderStream / TextDecoderStream ----
class TextEncoderStream {
  #t;
  constructor() {
    const enc = new TextEncoder();
    let high = '';
    this.#t = new TransformStream({
      transform(chunk, c) {
        let s = high + String(chunk);
        high = '';
        const last = s.charCodeAt(s.length - 1);
        if (last >= 0xd800 && last <= 0xdbff) { high = s.slice(-1); s = s.slice(0, -1); }
        if (s.length > 0) c.enqueue(enc.encode(s));
      },
      flush(c) { if (high) c.enqueue(enc.encode(high)); },
    });
  }
  get encoding() { return 'utf-8'; }
  get readable() { return this.#t.readable; }
  get writable() { return this.#t.writable; }
}
tag(TextEncoderStream, 'TextEncoderStream');
class TextDecoderStream {
  #t; #d;
  constructor(label, options) {
    const dec = (this.#d = new TextDecoder(label, options));
    this.#t = new TransformStream({
      transform(chunk, c) {
        const s = dec.decode(chunk, { stream: true });
        if (s) c.enqueue(s);
      },
      flush(c) { const s = dec.decode(); if (s) c.enqueue(s); },
    });
  }
  get encoding() { return this.#d.encoding; }
  get fatal() { return this.#d.fatal; }
  get ignoreBOM() { return this.#d.ignoreBOM; }
  get readable() { return this.#t.readable; }
  get writable() { return this.#t.writable; }
}
tag(TextDecoderStream, 'TextDecoderStream');

// A stream of one chunk (a body's bytes), already closed.
const streamOf = (bytes) => {
  const s = new ReadableStream(INTERNAL);
  const st = streamState(s);
  st.started = true;
  if (bytes.length > 0) { st.queue.push(bytes, 1); st.size = 1; }
  st.closeRequested = true;
  if (st.queue.length === 0) rsFinishClose(st);
  return s;
};
// All of a stream's chunks as one Uint8Array; rejects if a chunk is not
// bytes or the stream errors.
const readAll = async (s) => {
  const reader = s.getReader();
  const parts = [];
  let n = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const b = bytesView(value);
    if (b === null) {
      const e = new TypeError('A body stream chunk must be an ArrayBuffer or a view of one');
      reader.cancel(e);
      throw e;
    }
    parts.push(b); n += b.length;
  }
  if (parts.length === 1) return parts[0].byteOffset === 0 && parts[0].byteLength === parts[0].buffer.byteLength ? parts[0] : parts[0].slice();
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
};
WEB_CLASSES.push(ReadableStream, ReadableStreamDefaultReader, ReadableStreamDefaultController, WritableStream,
  WritableStreamDefaultWriter, TransformStream);
define('ReadableStream', ReadableStream);
define('ReadableStreamDefaultReader', ReadableStreamDefaultReader);
define('ReadableStreamDefaultController', ReadableStreamDefaultController);
define('WritableStream', WritableStream);
define('WritableStreamDefaultWriter', WritableStreamDefaultWriter);
define('WritableStreamDefaultController', WritableStreamDefaultController);
define('TransformStream', TransformStream);
define('TransformStreamDefaultController', TransformStreamDefaultController);
define('TextEncoderStream', TextEncoderStream);
define('TextDecoderStream', TextDecoderStream);
