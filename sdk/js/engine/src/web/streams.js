// streams.js: ReadableStream (default controller and reader, async
// iteration, tee), the body of a Request or Response. The state of a
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
WEB_CLASSES.push(ReadableStream, ReadableStreamDefaultReader, ReadableStreamDefaultController);
define('ReadableStream', ReadableStream);
define('ReadableStreamDefaultReader', ReadableStreamDefaultReader);
define('ReadableStreamDefaultController', ReadableStreamDefaultController);
