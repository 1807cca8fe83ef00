// fetch.js: Headers, Blob, File, FormData, Request, Response, and the
// contract with runtime.js (__hearth_web, at the end). Request and
// Response share the body functions (Body, below): a body's source is kept
// as given (a string, bytes or a ReadableStream) and turned into a stream
// only when `body` is asked for. Request and Response are not subclasses
// of a Body class: making one (twice per request) then runs one
// constructor and one field initializer, not two. For the same reason a
// Request from the host and a Response made without headers make their
// Headers object only when `headers` is asked for (QuickJS spends about
// 1.5 us making one): most Workers never ask, and the host reads the
// header list straight from what was kept.

// ---- Headers ----
// RFC 9110 token characters (header names, methods).
const TOKEN = new Uint8Array(128);
for (const c of "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") TOKEN[c.charCodeAt(0)] = 1;
const isToken = (s) => {
  const n = s.length;
  if (n === 0) return false;
  for (let i = 0; i < n; i++) {
    const c = s.charCodeAt(i);
    if (c > 127 || TOKEN[c] === 0) return false;
  }
  return true;
};
// Valid names seen so far, as given -> lower case: a name the Worker uses
// again (a literal, usually) is checked once.
const NAMES = new Map();
const headerName = (name) => {
  let k = NAMES.get(name);
  if (k !== undefined) return k;
  name = String(name);
  if (!isToken(name)) throw new TypeError('Invalid header name.');
  k = name.toLowerCase();
  if (NAMES.size >= 1024) NAMES.clear();
  NAMES.set(name, k);
  return k;
};
const isWs = (c) => c === 32 || c === 9 || c === 10 || c === 13;
// A header value normalized (leading and trailing HTTP whitespace
// stripped); NUL, CR and LF inside are refused. Characters above U+00FF
// are taken, as workerd takes them (sent as UTF-8).
const headerValue = (v) => {
  if (typeof v !== 'string') v = String(v);
  const n = v.length;
  if (n > 0 && (v.charCodeAt(0) <= 32 || v.charCodeAt(n - 1) <= 32)) {
    let a = 0, b = n;
    while (a < b && isWs(v.charCodeAt(a))) a++;
    while (b > a && isWs(v.charCodeAt(b - 1))) b--;
    v = v.slice(a, b);
  }
  if (v.indexOf('\n') >= 0 || v.indexOf('\r') >= 0 || v.indexOf('\0') >= 0) throw new TypeError('Invalid header value.');
  return v;
};
const IMMUTABLE = 1;
const byName = (a, b) => (a[0] < b[0] ? -1 : 1);
let headersFill, headersFlat, headersGuard, headersDefault;
class Headers {
  #m = new Map(); // lower-case name -> value (repeated names combined)
  #cookies = null; // set-cookie values, one per header
  #sorted = null; // [[name, value], ...] sorted, until the next change
  #guard = 0;
  constructor(init) {
    if (init == null) return;
    if (init instanceof Headers) {
      for (const [k, v] of init.#m) this.#m.set(k, v);
      if (init.#cookies) this.#cookies = init.#cookies.slice();
      return;
    }
    if (typeof init !== 'object' && typeof init !== 'function') throw new TypeError('Headers init must be an object');
    if (Array.isArray(init) || typeof init[Symbol.iterator] === 'function') {
      for (const p of init) {
        if (p === null || typeof p !== 'object' || typeof p[Symbol.iterator] !== 'function') throw new TypeError('Each header must be a [name, value] pair');
        const a = Array.isArray(p) ? p : Array.from(p);
        if (a.length !== 2) throw new TypeError('Each header must be a [name, value] pair');
        this.#add(headerName(a[0]), headerValue(a[1]));
      }
    } else {
      const keys = Object.keys(init);
      for (let i = 0; i < keys.length; i++) this.#add(headerName(keys[i]), headerValue(init[keys[i]]));
    }
  }
  #add(k, v) {
    const old = this.#m.get(k);
    this.#m.set(k, old === undefined ? v : old + ', ' + v);
    if (k === 'set-cookie') (this.#cookies || (this.#cookies = [])).push(v);
    this.#sorted = null;
  }
  #check() { if (this.#guard === IMMUTABLE) throw new TypeError("Can't modify immutable headers."); }
  get(name) {
    // Stored names are lower case: the name as given first (no copy).
    const m = this.#m;
    let v = m.get(name);
    if (v !== undefined) return v;
    let k = NAMES.get(name);
    if (k === name) return null; // a valid lower-case name, not here
    if (k === undefined) k = headerName(name);
    v = m.get(k);
    return v === undefined ? null : v;
  }
  getAll(name) {
    const k = headerName(name);
    if (k !== 'set-cookie') throw new TypeError('getAll() can only be used with the header name "Set-Cookie".');
    return this.getSetCookie();
  }
  getSetCookie() { return this.#cookies ? this.#cookies.slice() : []; }
  has(name) {
    if (this.#m.has(name)) return true;
    const k = NAMES.get(name);
    return k !== name && this.#m.has(k === undefined ? headerName(name) : k);
  }
  set(name, value) {
    const k = headerName(name), v = headerValue(value);
    this.#check();
    this.#m.set(k, v);
    if (k === 'set-cookie') this.#cookies = [v];
    this.#sorted = null;
  }
  append(name, value) {
    const k = headerName(name), v = headerValue(value);
    this.#check();
    this.#add(k, v);
  }
  delete(name) {
    const k = headerName(name);
    this.#check();
    if (this.#m.delete(k)) {
      if (k === 'set-cookie') this.#cookies = null;
      this.#sorted = null;
    }
  }
  // The Fetch standard's sort and combine: by name, set-cookie not combined.
  #list() {
    let s = this.#sorted;
    if (s !== null) return s;
    s = [...this.#m];
    if (s.length > 1) s.sort(byName);
    const c = this.#cookies;
    if (c !== null && c.length > 1) {
      const i = s.findIndex((p) => p[0] === 'set-cookie');
      s.splice(i, 1, ...c.map((v) => ['set-cookie', v]));
    } else if (c !== null && c.length === 1) {
      const i = s.findIndex((p) => p[0] === 'set-cookie');
      s[i] = ['set-cookie', c[0]];
    }
    return (this.#sorted = s);
  }
  forEach(f, t) {
    if (typeof f !== 'function') throw new TypeError('forEach needs a function');
    for (const [k, v] of this.#list()) f.call(t, v, k, this);
  }
  *entries() { for (const [k, v] of this.#list()) yield [k, v]; }
  *keys() { for (const p of this.#list()) yield p[0]; }
  *values() { for (const p of this.#list()) yield p[1]; }
  [Symbol.iterator]() { return this.#list().values(); }
  static {
    // Headers from the host's [name, value, ...]: names already valid and
    // lower case.
    headersFill = (h, pairs, guard) => {
      const m = h.#m;
      h.#sorted = null;
      if (guard !== undefined) h.#guard = guard;
      for (let i = 0; i < pairs.length; i += 2) {
        const k = pairs[i], v = pairs[i + 1];
        const old = m.get(k);
        if (old === undefined) m.set(k, v);
        else m.set(k, old + ', ' + v);
        if (k === 'set-cookie') (h.#cookies || (h.#cookies = [])).push(v);
      }
    };
    // [name, value, ...] into `out`, set-cookie one per value.
    headersFlat = (h, out) => {
      const c = h.#cookies;
      h.#m.forEach((v, k) => {
        if (c !== null && k === 'set-cookie') for (const x of c) out.push(k, x);
        else out.push(k, v);
      });
    };
    headersGuard = (h, g) => { h.#guard = g; };
    // Sets `k` (a valid lower-case name) to `v` unless it is there.
    headersDefault = (h, k, v) => {
      if (!h.#m.has(k)) { h.#m.set(k, v); h.#sorted = null; }
    };
  }
}
tag(Headers, 'Headers');

// ---- Blob / File ----
const blobType = (t) => {
  if (t === undefined) return '';
  t = String(t);
  for (let i = 0; i < t.length; i++) { const c = t.charCodeAt(i); if (c < 0x20 || c > 0x7e) return ''; }
  return t.toLowerCase();
};
let blobBytes;
class Blob {
  #b; #type;
  constructor(parts, options) {
    if (parts === INTERNAL) { this.#b = options[0]; this.#type = options[1]; return; }
    const chunks = [];
    let n = 0;
    if (parts !== undefined) {
      if (parts === null || typeof parts !== 'object' || typeof parts[Symbol.iterator] !== 'function') throw new TypeError('Blob parts must be a sequence');
      for (const p of parts) {
        let b;
        if (p instanceof Blob) b = p.#b;
        else if ((b = bytesView(p)) === null) b = utf8(String(p));
        chunks.push(b); n += b.length;
      }
    }
    if (chunks.length === 1 && chunks[0] instanceof Uint8Array && !(parts[0] instanceof Blob)) this.#b = chunks[0].slice();
    else {
      const out = new Uint8Array(n);
      let at = 0;
      for (const c of chunks) { out.set(c, at); at += c.length; }
      this.#b = out;
    }
    this.#type = blobType(options == null ? undefined : options.type);
  }
  get size() { return this.#b.length; }
  get type() { return this.#type; }
  slice(start, end, type) {
    const n = this.#b.length;
    const rel = (x, d) => { if (x === undefined) return d; x = Math.trunc(Number(x)) || 0; return x < 0 ? Math.max(n + x, 0) : Math.min(x, n); };
    const a = rel(start, 0), b = rel(end, n);
    return new Blob(INTERNAL, [this.#b.subarray(a, Math.max(a, b)), blobType(type)]);
  }
  async text() { return N.utf8Decode(this.#b, false); }
  async arrayBuffer() { return this.#b.slice().buffer; }
  async bytes() { return this.#b.slice(); }
  stream() { return streamOf(this.#b.slice()); }
  static { blobBytes = (b) => b.#b; }
}
tag(Blob, 'Blob');
class File extends Blob {
  #name; #lastModified;
  constructor(parts, name, options) {
    if (arguments.length < 2) throw new TypeError("Failed to construct 'File': 2 arguments required");
    super(parts, options);
    this.#name = usv(name);
    this.#lastModified = options != null && options.lastModified !== undefined ? Number(options.lastModified) : Date.now();
  }
  get name() { return this.#name; }
  get lastModified() { return this.#lastModified; }
  get webkitRelativePath() { return ''; }
}
tag(File, 'File');

// ---- FormData ----
const formEntry = (name, value, filename) => {
  name = usv(name);
  if (value instanceof Blob) {
    if (!(value instanceof File) || filename !== undefined) {
      value = new File([value], filename !== undefined ? usv(filename) : value instanceof File ? value.name : 'blob', { type: value.type });
    }
    return [name, value];
  }
  return [name, usv(value)];
};
let formList;
class FormData {
  #l = [];
  constructor(form) {
    if (form !== undefined) throw new TypeError('FormData takes no form element here');
  }
  append(name, value, filename) {
    if (arguments.length < 2) throw new TypeError("'append' requires 2 arguments");
    this.#l.push(formEntry(name, value, filename));
  }
  set(name, value, filename) {
    if (arguments.length < 2) throw new TypeError("'set' requires 2 arguments");
    const e = formEntry(name, value, filename);
    const i = this.#l.findIndex((x) => x[0] === e[0]);
    if (i < 0) { this.#l.push(e); return; }
    this.#l[i] = e;
    this.#l = this.#l.filter((x, j) => j <= i || x[0] !== e[0]);
  }
  get(name) { name = usv(name); const e = this.#l.find((x) => x[0] === name); return e ? e[1] : null; }
  getAll(name) { name = usv(name); return this.#l.filter((x) => x[0] === name).map((x) => x[1]); }
  has(name) { name = usv(name); return this.#l.some((x) => x[0] === name); }
  delete(name) { name = usv(name); this.#l = this.#l.filter((x) => x[0] !== name); }
  forEach(f, t) { for (const [k, v] of this.#l.slice()) f.call(t, v, k, this); }
  *entries() { for (const [k, v] of this.#l) yield [k, v]; }
  *keys() { for (const e of this.#l) yield e[0]; }
  *values() { for (const e of this.#l) yield e[1]; }
  [Symbol.iterator]() { return this.entries(); }
  static { formList = (f) => f.#l; }
}
tag(FormData, 'FormData');
const escapeField = (s) => s.replace(/\r\n|\r|\n/g, '\r\n').replace(/[\n\r"]/g, (c) => ({ '\n': '%0A', '\r': '%0D', '"': '%22' })[c]);
// multipart/form-data: [bytes, boundary].
const formEncode = (f) => {
  const hex = N.uuid().replace(/-/g, '');
  const boundary = '----hearthformdata' + hex;
  const parts = [];
  for (const [k, v] of formList(f)) {
    let head = '--' + boundary + '\r\nContent-Disposition: form-data; name="' + escapeField(k) + '"';
    if (typeof v === 'string') {
      parts.push(utf8(head + '\r\n\r\n' + v.replace(/\r\n|\r|\n/g, '\r\n') + '\r\n'));
    } else {
      head += '; filename="' + escapeField(v.name) + '"\r\nContent-Type: ' + (v.type || 'application/octet-stream') + '\r\n\r\n';
      parts.push(utf8(head), blobBytes(v), utf8('\r\n'));
    }
  }
  parts.push(utf8('--' + boundary + '--\r\n'));
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return [out, boundary];
};
const indexOfBytes = (hay, needle, from) => {
  const first = needle[0], last = hay.length - needle.length;
  outer: for (let i = hay.indexOf(first, from); i !== -1 && i <= last; i = hay.indexOf(first, i + 1)) {
    for (let j = 1; j < needle.length; j++) if (hay[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
};
const paramOf = (header, name) => {
  const re = new RegExp(';\\s*' + name + '\\s*=\\s*(?:"((?:[^"\\\\]|\\\\.)*)"|([^;\\s]*))', 'i');
  const m = re.exec(header);
  return m ? (m[1] !== undefined ? m[1].replace(/\\(.)/g, '$1') : m[2]) : null;
};
const formDecode = (bytes, contentType) => {
  const ct = contentType || '';
  const essence = ct.split(';')[0].trim().toLowerCase();
  const fd = new FormData();
  if (essence === 'application/x-www-form-urlencoded') {
    const l = N.formParse(N.utf8Decode(bytes, false));
    for (let i = 0; i < l.length; i += 2) fd.append(l[i], l[i + 1]);
    return fd;
  }
  if (essence !== 'multipart/form-data') throw new TypeError('The body is not form data (content-type: ' + ct + ')');
  const boundary = paramOf(ct, 'boundary');
  if (!boundary) throw new TypeError('multipart/form-data without a boundary');
  const delim = utf8('--' + boundary);
  let at = indexOfBytes(bytes, delim, 0);
  if (at < 0) throw new TypeError('Malformed multipart/form-data');
  for (;;) {
    at += delim.length;
    if (bytes[at] === 45 && bytes[at + 1] === 45) break; // '--': the end
    if (bytes[at] === 13 && bytes[at + 1] === 10) at += 2;
    const headEnd = indexOfBytes(bytes, utf8('\r\n\r\n'), at);
    if (headEnd < 0) throw new TypeError('Malformed multipart/form-data');
    const head = N.utf8Decode(bytes.subarray(at, headEnd), false);
    const next = indexOfBytes(bytes, utf8('\r\n--' + boundary), headEnd + 4);
    if (next < 0) throw new TypeError('Malformed multipart/form-data');
    const content = bytes.subarray(headEnd + 4, next);
    let disp = '', type = '';
    for (const line of head.split('\r\n')) {
      const c = line.indexOf(':');
      if (c < 0) continue;
      const k = line.slice(0, c).trim().toLowerCase(), v = line.slice(c + 1).trim();
      if (k === 'content-disposition') disp = v; else if (k === 'content-type') type = v;
    }
    const name = paramOf(disp, 'name');
    if (name === null) throw new TypeError('A multipart/form-data part without a name');
    const filename = paramOf(disp, 'filename');
    if (filename !== null) fd.append(name, new File([content], filename, { type }));
    else fd.append(name, N.utf8Decode(content, false));
    at = next + 2;
  }
  return fd;
};

// ---- Body ----
// A body init as [source, content-type or null]; the source is a string,
// a Uint8Array this body owns, or a ReadableStream.
const extractBody = (b) => {
  if (typeof b === 'string') return [b, 'text/plain;charset=UTF-8'];
  if (b instanceof ReadableStream) {
    if (b.locked || streamState(b).disturbed) throw new TypeError('The body stream is locked or disturbed');
    return [b, null];
  }
  const v = bytesView(b);
  if (v !== null) return [v.slice(), null];
  if (b instanceof URLSearchParams) return [b.toString(), 'application/x-www-form-urlencoded;charset=UTF-8'];
  if (b instanceof Blob) return [blobBytes(b), b.type || null];
  if (b instanceof FormData) {
    const [bytes, boundary] = formEncode(b);
    return [bytes, 'multipart/form-data; boundary=' + boundary];
  }
  return [String(b), 'text/plain;charset=UTF-8'];
};
// A body is a state object, {src, stream, flags}, or null (no body);
// Request and Response each hold one in a private field and call these.
const USED = 1, SHARED = 2; // flags: USED consumed; SHARED a Uint8Array source a clone also has
const bodyOf = (src) => ({ src, stream: typeof src === 'object' && src instanceof ReadableStream ? src : null, flags: 0 });
const bodyStream = (b) => {
  if (b === null) return null;
  if (b.stream === null) {
    const s = b.src;
    b.stream = streamOf(typeof s === 'string' ? utf8(s) : b.flags & SHARED ? s.slice() : s);
  }
  return b.stream;
};
const bodyUsed = (b) => b !== null && ((b.flags & USED) !== 0 || (b.stream !== null && streamState(b.stream).disturbed));
// The body's content, once: a string, a Uint8Array (the caller's own), a
// Promise of one (a stream), or null.
const bodyTake = (b) => {
  if (b === null) return null;
  if (bodyUsed(b)) throw new TypeError('Body has already been used. It can only be used once. Use tee() first if you need to read it twice.');
  const s = b.src, shared = b.flags & SHARED;
  if (b.stream !== null && b.stream.locked) throw new TypeError('The body stream is locked');
  b.flags = USED;
  if (b.stream !== null) return readAll(b.stream);
  if (typeof s === 'string' || !shared) return s;
  return s.slice();
};
const bodyBytes = async (b) => {
  const s = await bodyTake(b);
  if (s === null) return new Uint8Array(0);
  return typeof s === 'string' ? utf8(s) : s;
};
const bodyArrayBuffer = async (b) => {
  const u = await bodyBytes(b);
  return u.byteOffset === 0 && u.byteLength === u.buffer.byteLength ? u.buffer : u.slice().buffer;
};
const bodyText = async (b) => {
  const s = await bodyTake(b);
  if (s === null) return '';
  if (typeof s === 'string') return s;
  if (s.length === 0) return '';
  const t = N.utf8Decode(s, false);
  return t.charCodeAt(0) === 0xfeff ? t.slice(1) : t;
};
const bodyJson = async (b) => JSON.parse(await bodyText(b));
const bodyBlob = async (b, headers) => new Blob(INTERNAL, [await bodyBytes(b), blobType(headers.get('content-type') || '')]);
const bodyFormData = async (b, headers) => formDecode(await bodyBytes(b), headers.get('content-type'));
// The source another body takes over (new Request(request)): this one is
// then used.
const bodyHandOver = (b) => {
  if (b === null) return null;
  if (bodyUsed(b)) throw new TypeError('Cannot construct a Request with a Request whose body has already been used.');
  b.flags = USED;
  return b.stream !== null ? b.stream : b.src;
};
// For the host, once: null, a string, a Uint8Array or a Promise of a
// Uint8Array (a stream read whole).
const bodyHost = (b) => {
  if (b === null) return null;
  if (bodyUsed(b)) throw new TypeError('The body has already been used');
  b.flags |= USED;
  if (b.stream !== null) {
    if (b.stream.locked) throw new TypeError('The body stream is locked');
    return readAll(b.stream);
  }
  return b.src;
};
// A body made by a stream, for the host to send as it is made: a function
// answering a promise of the next chunk (a Uint8Array), or of null once the
// stream has ended. A chunk that is not bytes cancels the stream and
// rejects.
const bodyPieces = (b) => {
  if (bodyUsed(b)) throw new TypeError('The body has already been used');
  if (b.stream.locked) throw new TypeError('The body stream is locked');
  b.flags |= USED;
  const reader = b.stream.getReader();
  return () => reader.read().then(({ value, done }) => {
    if (done) return null;
    const v = bytesView(value);
    if (v === null) {
      const e = new TypeError('A body stream chunk must be an ArrayBuffer or a view of one');
      reader.cancel(e);
      throw e;
    }
    return v;
  });
};
// A copy of body `b` for a clone (null if none); `b` keeps its content.
const bodyClone = (b) => {
  if (b === null) return null;
  if (bodyUsed(b)) throw new TypeError('The body has already been used; it cannot be cloned');
  if (b.stream !== null) {
    const [x, y] = b.stream.tee();
    b.stream = x; b.src = x;
    return bodyOf(y);
  }
  b.flags = SHARED;
  const c = bodyOf(b.src);
  c.flags = SHARED;
  return c;
};
// The body members Request and Response share, over their own #body.
const BODY_MEMBERS = (get) => ({
  body: { get() { return bodyStream(get(this)); }, configurable: true },
  bodyUsed: { get() { return bodyUsed(get(this)); }, configurable: true },
  arrayBuffer: { value() { try { return bodyArrayBuffer(get(this)); } catch (e) { return Promise.reject(e); } }, writable: true, configurable: true },
  bytes: { value() { try { return bodyBytes(get(this)); } catch (e) { return Promise.reject(e); } }, writable: true, configurable: true },
  text: { value() { try { return bodyText(get(this)); } catch (e) { return Promise.reject(e); } }, writable: true, configurable: true },
  json: { value() { try { return bodyJson(get(this)); } catch (e) { return Promise.reject(e); } }, writable: true, configurable: true },
  blob: { value() { try { return bodyBlob(get(this), this.headers); } catch (e) { return Promise.reject(e); } }, writable: true, configurable: true },
  formData: { value() { try { return bodyFormData(get(this), this.headers); } catch (e) { return Promise.reject(e); } }, writable: true, configurable: true },
});

// ---- Request ----
// workerd's methods: these six case-insensitively (the Fetch standard's
// normalization), the others as written; anything else is a TypeError.
const METHODS = { DELETE: 1, GET: 1, HEAD: 1, OPTIONS: 1, POST: 1, PUT: 1 };
const OTHER_METHODS = new Set(['PATCH', 'PURGE', 'TRACE', 'COPY', 'LOCK', 'MKCOL', 'MOVE', 'PROPFIND', 'PROPPATCH',
  'SEARCH', 'UNLOCK', 'ACL', 'REPORT', 'MKACTIVITY', 'CHECKOUT', 'MERGE', 'M-SEARCH', 'NOTIFY', 'SUBSCRIBE',
  'UNSUBSCRIBE', 'QUERY', 'BAN']);
const normMethod = (m) => {
  m = String(m);
  if (METHODS[m] === 1 || OTHER_METHODS.has(m)) return m;
  const u = m.toUpperCase();
  if (METHODS[u] === 1) return u;
  throw new TypeError('Invalid HTTP method string: ' + m);
};
const REDIRECTS = ['follow', 'manual', 'error'];
// What a Request or Response rarely has, kept apart so that making one
// (every request makes both) sets fewer fields.
const requestMore = () => ({ redirect: 'follow', signal: null, cf: undefined });
let requestBody;
class Request {
  #method = 'GET'; #url; #headers; #more = null; #body = null;
  constructor(input, init, url, headers, body) {
    if (input === INTERNAL) {
      // From the host: (INTERNAL, method, url, Headers or the host's
      // [name, value, ...] (lower case, valid; made into immutable Headers
      // when asked for), Uint8Array or undefined).
      this.#method = init; this.#url = url; this.#headers = headers;
      if (body !== undefined) this.#body = bodyOf(body);
      return;
    }
    if (arguments.length === 0) throw new TypeError("Failed to construct 'Request': 1 argument required");
    init = init == null ? {} : init;
    let src = null;
    if (input instanceof Request) {
      this.#url = input.#url; this.#method = input.#method;
      if (input.#more !== null) this.#more = { ...input.#more };
      this.#headers = new Headers(input.headers);
    } else {
      this.#url = new URL(input).href;
      this.#headers = new Headers();
    }
    if (init.method !== undefined) this.#method = normMethod(init.method);
    if (init.redirect !== undefined) {
      const r = String(init.redirect);
      if (!REDIRECTS.includes(r)) throw new TypeError('Invalid redirect value: ' + r);
      (this.#more || (this.#more = requestMore())).redirect = r;
    }
    if (init.signal !== undefined) {
      if (init.signal !== null && !(init.signal instanceof AbortSignal)) throw new TypeError('signal must be an AbortSignal');
      (this.#more || (this.#more = requestMore())).signal = init.signal;
    }
    if (init.cf !== undefined) (this.#more || (this.#more = requestMore())).cf = init.cf;
    if (init.headers !== undefined) this.#headers = new Headers(init.headers);
    const hasBody = init.body !== undefined && init.body !== null;
    if (hasBody || (init.body === undefined && input instanceof Request && input.#body !== null)) {
      if (this.#method === 'GET' || this.#method === 'HEAD') throw new TypeError('Request with a GET or HEAD method cannot have a body.');
    }
    if (hasBody) {
      const [s, type] = extractBody(init.body);
      src = s;
      if (type !== null && !this.#headers.has('content-type')) this.#headers.set('content-type', type);
    } else if (init.body === undefined && input instanceof Request) {
      src = bodyHandOver(input.#body);
    }
    if (src !== null) this.#body = bodyOf(src);
  }
  get method() { return this.#method; }
  get url() { return this.#url; }
  get headers() {
    const h = this.#headers;
    if (!Array.isArray(h)) return h;
    const made = new Headers();
    headersFill(made, h, IMMUTABLE);
    return (this.#headers = made);
  }
  get redirect() { return this.#more === null ? 'follow' : this.#more.redirect; }
  get signal() {
    const m = this.#more || (this.#more = requestMore());
    return m.signal || (m.signal = new AbortSignal(INTERNAL));
  }
  get cf() { return this.#more === null ? undefined : this.#more.cf; }
  get integrity() { return ''; }
  get keepalive() { return false; }
  clone() {
    const r = new Request(INTERNAL, this.#method, this.#url, new Headers(this.headers), undefined);
    if (this.#more !== null) r.#more = { ...this.#more };
    r.#body = bodyClone(this.#body);
    return r;
  }
  static { requestBody = (r) => r.#body; }
}
Object.defineProperties(Request.prototype, BODY_MEMBERS(requestBody));
tag(Request, 'Request');

// ---- Response ----
const NULL_BODY = (s) => s === 101 || s === 204 || s === 205 || s === 304;
const REDIRECT_STATUS = (s) => s === 301 || s === 302 || s === 303 || s === 307 || s === 308;
const responseMore = () => ({ statusText: '', type: 'default', url: '', redirected: false, ws: null, cf: undefined });
let responseMake, responseBody, responsePairs;
class Response {
  // #headers: a Headers object, or until `headers` is asked for, null (no
  // headers) or a string (only a content-type, this one).
  #status = 200; #headers = null; #more = null; #body = null;
  constructor(body, init) {
    if (body === INTERNAL) return;
    let headers = null;
    if (init != null) {
      if (typeof init !== 'object') throw new TypeError('Response init must be an object');
      const s = init.status;
      if (s !== undefined) {
        const n = typeof s === 'number' && (s | 0) === s ? s : Number(s) | 0;
        if (n < 200 || n > 599) {
          if (!(n === 101 && init.webSocket)) throw new RangeError('Responses may only be constructed with status codes in the range 200 to 599, inclusive.');
        }
        this.#status = n;
      }
      if (init.statusText !== undefined) {
        const t = String(init.statusText);
        for (let i = 0; i < t.length; i++) {
          const c = t.charCodeAt(i);
          if (c === 10 || c === 13 || c > 255 || (c < 32 && c !== 9)) throw new TypeError('Invalid statusText');
        }
        (this.#more || (this.#more = responseMore())).statusText = t;
      }
      if (init.headers !== undefined) headers = new Headers(init.headers);
      if (init.webSocket || init.cf !== undefined) {
        const m = this.#more || (this.#more = responseMore());
        if (init.webSocket) m.ws = init.webSocket;
        m.cf = init.cf;
      }
    }
    this.#headers = headers;
    if (body !== undefined && body !== null) {
      const st = this.#status;
      if (st === 204 || st === 205 || st === 304 || st === 101) throw new TypeError('Response with null body status (101, 204, 205, or 304) cannot have a body.');
      let type = 'text/plain;charset=UTF-8';
      if (typeof body === 'string') {
        this.#body = { src: body, stream: null, flags: 0 };
      } else {
        const e = extractBody(body);
        this.#body = bodyOf(e[0]);
        type = e[1];
      }
      if (type !== null) {
        if (headers === null) this.#headers = type;
        else headersDefault(headers, 'content-type', type);
      }
    }
  }
  get status() { return this.#status; }
  get statusText() { return this.#more === null ? '' : this.#more.statusText; }
  get ok() { return this.#status >= 200 && this.#status <= 299; }
  get headers() {
    const h = this.#headers;
    if (h !== null && typeof h === 'object') return h;
    const made = new Headers();
    if (h !== null) headersFill(made, ['content-type', h]);
    return (this.#headers = made);
  }
  get type() { return this.#more === null ? 'default' : this.#more.type; }
  get url() { return this.#more === null ? '' : this.#more.url; }
  get redirected() { return this.#more === null ? false : this.#more.redirected; }
  get webSocket() { return this.#more === null ? null : this.#more.ws; }
  get cf() { return this.#more === null ? undefined : this.#more.cf; }
  clone() {
    const r = new Response(INTERNAL);
    const h = this.#headers;
    r.#status = this.#status; r.#headers = h !== null && typeof h === 'object' ? new Headers(h) : h;
    if (this.#more !== null) {
      r.#more = { ...this.#more };
      if (this.#more.type === 'error') headersGuard(r.#headers, IMMUTABLE);
    }
    r.#body = bodyClone(this.#body);
    return r;
  }
  static json(data, init) {
    const s = JSON.stringify(data);
    if (init == null) {
      const r = new Response(s);
      r.#headers = 'application/json';
      return r;
    }
    const headers = new Headers(init == null ? undefined : init.headers);
    if (!headers.has('content-type')) headers.set('content-type', 'application/json');
    return new Response(s, init == null ? { headers } : { status: init.status, statusText: init.statusText, headers });
  }
  static redirect(url, status = 302) {
    const u = new URL(url).href;
    status = Number(status) | 0;
    if (!REDIRECT_STATUS(status)) throw new RangeError(status + ' is not a redirect status code.');
    const r = new Response(INTERNAL);
    r.#status = status;
    r.#headers = new Headers();
    headersFill(r.#headers, ['location', u]);
    headersGuard(r.#headers, IMMUTABLE);
    return r;
  }
  static error() {
    const r = new Response(INTERNAL);
    r.#status = 0;
    (r.#more = responseMore()).type = 'error';
    r.#headers = new Headers();
    headersGuard(r.#headers, IMMUTABLE);
    return r;
  }
  static {
    responseMake = (status, headers, body, url) => {
      const r = new Response(INTERNAL);
      r.#status = status; r.#headers = headers;
      if (url) (r.#more = responseMore()).url = url;
      if (body !== null && !(NULL_BODY(status) && body.length === 0)) r.#body = bodyOf(body);
      return r;
    };
    responseBody = (r) => r.#body;
    // The header list for the host, [name, value, ...], without making a
    // Headers object the Worker never asked for.
    responsePairs = (r) => {
      const h = r.#headers;
      if (h === null) return [];
      if (typeof h === 'string') return ['content-type', h];
      return hostPairs(h);
    };
  }
}
Object.defineProperties(Response.prototype, BODY_MEMBERS(responseBody));
tag(Response, 'Response');
WEB_CLASSES.push(Headers, Request, Response, FormData, AbortController);
INSPECTED.push([Headers, 'entries'], [FormData, 'entries'],
  [Request, ['method', 'url', 'headers', 'bodyUsed']],
  [Response, ['status', 'statusText', 'headers', 'ok', 'redirected', 'url', 'bodyUsed']],
  [Blob, ['size', 'type']]);

// ---- the contract with runtime.js ----
// incoming(method, url, pairs, body) -> Request
//     the request the host received; `pairs` is [name, value, ...] (names
//     lower case and valid), `body` a Uint8Array or undefined (GET/HEAD).
//     Its headers are immutable, as on workerd.
// outgoing(response) -> Promise<[status, pairs, body]>
//     a Response the Worker returned, taken apart for the host: `pairs`
//     [name, value, ...], `body` a string (sent as UTF-8), a Uint8Array
//     (possibly empty) or, for a body that is a stream, a function the host
//     calls for each next chunk (bodyPieces), sending each as it comes;
//     rejects with a TypeError if `response` is not a Response (or is
//     Response.error(), or its body was used).
// toFetch(input, init) -> Promise<[method, url, pairs, body]>
//     the arguments of `fetch(input, init)` as one outgoing request (`body`
//     a string, a Uint8Array or undefined); rejects as `fetch` would.
// fromFetch(status, pairs, body, url) -> Response
//     the answer to an outgoing request, for `fetch` to resolve with (its
//     headers immutable, as on workerd); `body` a ReadableStream (the
//     host's body, read as the Worker reads it), a Uint8Array or null.
const EMPTY = new Uint8Array(0);
const hostPairs = (h) => {
  const out = [];
  headersFlat(h, out);
  return out;
};
const hostAnswer = (r, s) => [r.status, responsePairs(r), s === null ? EMPTY : s];
g.__hearth_web = {
  incoming(method, url, pairs, body) {
    return new Request(INTERNAL, method, url, pairs, body);
  },
  // Not async: the usual answer (a string or bytes) settles at once.
  outgoing(r) {
    try {
      if (!(r instanceof Response)) throw new TypeError('The Worker did not return a Response');
      if (r.type === 'error') throw new TypeError('The Worker returned Response.error()');
      const b = responseBody(r);
      if (b !== null && b.stream !== null) return Promise.resolve([r.status, responsePairs(r), bodyPieces(b)]);
      const s = bodyHost(b);
      if (s !== null && typeof s === 'object' && typeof s.then === 'function') return s.then((b) => hostAnswer(r, b));
      return Promise.resolve(hostAnswer(r, s));
    } catch (e) {
      return Promise.reject(e);
    }
  },
  async toFetch(input, init) {
    const req = input instanceof Request && init === undefined ? input : new Request(input, init);
    if (req.signal.aborted) throw req.signal.reason;
    let s = bodyHost(requestBody(req));
    if (s !== null && typeof s === 'object' && typeof s.then === 'function') s = await s;
    return [req.method, req.url, hostPairs(req.headers), s === null ? undefined : s];
  },
  fromFetch(status, pairs, body, url) {
    const h = new Headers();
    if (pairs.length > 0) headersFill(h, pairs);
    headersGuard(h, IMMUTABLE);
    return responseMake(status, h, body == null ? null : body, url);
  },
};
define('Headers', Headers);
define('Blob', Blob);
define('File', File);
define('FormData', FormData);
define('Request', Request);
define('Response', Response);
