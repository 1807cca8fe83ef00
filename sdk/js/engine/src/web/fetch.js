// fetch.js: Headers, Blob, File, FormData, Request, Response, and the
// contract with runtime.js (__hearth_web). Request and Response share a
// body (Body, below): its source is kept as given (a string, bytes or a
// ReadableStream) and turned into a stream only when `body` is asked for.

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
  if (n > 0 && (isWs(v.charCodeAt(0)) || isWs(v.charCodeAt(n - 1)))) {
    let a = 0, b = n;
    while (a < b && isWs(v.charCodeAt(a))) a++;
    while (b > a && isWs(v.charCodeAt(b - 1))) b--;
    v = v.slice(a, b);
  }
  if (v.indexOf('\n') >= 0 || v.indexOf('\r') >= 0 || v.indexOf('\0') >= 0) throw new TypeError('Invalid header value.');
  return v;
};
const IMMUTABLE = 1;
let headersFill, headersFlat, headersGuard;
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
      for (const k of Object.keys(init)) this.#add(headerName(k), headerValue(init[k]));
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
    const k = headerName(name);
    if (k === name) return null;
    v = m.get(k);
    return v === undefined ? null : v;
  }
  getAll(name) {
    const k = headerName(name);
    if (k !== 'set-cookie') throw new TypeError('getAll() can only be used with the header name "Set-Cookie".');
    return this.getSetCookie();
  }
  getSetCookie() { return this.#cookies ? this.#cookies.slice() : []; }
  has(name) { return this.#m.has(name) || this.#m.has(headerName(name)); }
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
    const names = [...this.#m.keys()].sort();
    s = [];
    for (const k of names) {
      if (k === 'set-cookie' && this.#cookies) for (const c of this.#cookies) s.push([k, c]);
      else s.push([k, this.#m.get(k)]);
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
    headersFill = (h, pairs) => {
      const m = h.#m;
      for (let i = 0; i < pairs.length; i += 2) {
        const k = pairs[i], v = pairs[i + 1];
        const old = m.get(k);
        if (old === undefined) m.set(k, v);
        else m.set(k, old + ', ' + v);
        if (k === 'set-cookie') (h.#cookies || (h.#cookies = [])).push(v);
      }
    };
    headersFlat = (h) => {
      const out = [];
      for (const [k, v] of h.#m) {
        if (k === 'set-cookie' && h.#cookies) for (const c of h.#cookies) out.push(k, c);
        else out.push(k, v);
      }
      return out;
    };
    headersGuard = (h, g) => { h.#guard = g; };
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
let bodyInit, bodyTake, bodyBytes, bodyClone;
class Body {
  #src = null; // null, a string, a Uint8Array or a ReadableStream
  #stream = null; // the ReadableStream `body` returned, once asked for
  #used = false;
  #own = true; // a Uint8Array source may be handed out without a copy
  constructor(key) { if (key !== INTERNAL) throw new TypeError('Illegal constructor'); }
  get body() {
    const s = this.#src;
    if (s === null) return null;
    if (this.#stream === null) this.#stream = s instanceof ReadableStream ? s : streamOf(typeof s === 'string' ? utf8(s) : this.#own ? s : s.slice());
    return this.#stream;
  }
  get bodyUsed() { return this.#used || (this.#stream !== null && streamState(this.#stream).disturbed); }
  // The body's content, once: a string or a Uint8Array (the caller's own).
  #take() {
    if (this.bodyUsed) throw new TypeError('Body has already been used. It can only be used once. Use tee() first if you need to read it twice.');
    const s = this.#src;
    if (s === null) return null;
    if (this.#stream !== null) {
      if (this.#stream.locked) throw new TypeError('The body stream is locked');
      this.#used = true;
      return readAll(this.#stream);
    }
    this.#used = true;
    if (typeof s === 'string') return s;
    return this.#own ? s : s.slice();
  }
  async #bytes() {
    const s = await this.#take();
    if (s === null) return new Uint8Array(0);
    return typeof s === 'string' ? utf8(s) : s;
  }
  async arrayBuffer() {
    const b = await this.#bytes();
    return b.byteOffset === 0 && b.byteLength === b.buffer.byteLength ? b.buffer : b.slice().buffer;
  }
  bytes() { return this.#bytes(); }
  async text() {
    const s = await this.#take();
    if (s === null) return '';
    if (typeof s === 'string') return s;
    if (s.length === 0) return '';
    let t = N.utf8Decode(s, false);
    if (t.charCodeAt(0) === 0xfeff) t = t.slice(1);
    return t;
  }
  async json() { return JSON.parse(await this.text()); }
  async blob() {
    const b = await this.#bytes();
    return new Blob(INTERNAL, [b, blobType(this.headers.get('content-type') || '')]);
  }
  async formData() {
    const b = await this.#bytes();
    return formDecode(b, this.headers.get('content-type'));
  }
  static {
    bodyInit = (x, src, own) => { x.#src = src; x.#own = own !== false; if (src instanceof ReadableStream) x.#stream = src; };
    // The source handed to another body (new Request(request)); this one is used.
    bodyTake = (x) => {
      if (x.bodyUsed) throw new TypeError('Cannot construct a Request with a Request whose body has already been used.');
      const s = x.#stream !== null ? x.#stream : x.#src;
      if (s !== null) x.#used = true;
      return s;
    };
    // For the host: null, a string, a Uint8Array or a Promise of one.
    bodyBytes = (x) => {
      const s = x.#src;
      if (s === null) return null;
      if (x.#stream !== null) {
        if (x.bodyUsed || x.#stream.locked) throw new TypeError('The body has already been used');
        x.#used = true;
        return readAll(x.#stream);
      }
      if (x.#used) throw new TypeError('The body has already been used');
      return s;
    };
    bodyClone = (x, y) => {
      if (x.bodyUsed) throw new TypeError('The body has already been used; it cannot be cloned');
      if (x.#src === null) return;
      if (x.#stream !== null) {
        const [a, b] = x.#stream.tee();
        x.#stream = a; x.#src = a;
        y.#stream = b; y.#src = b;
        return;
      }
      x.#own = false; y.#own = false; y.#src = x.#src;
    };
  }
}

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
class Request extends Body {
  #method = 'GET'; #url; #headers; #redirect = 'follow'; #signal = null; #cf = undefined;
  constructor(input, init, url, headers, body) {
    super(INTERNAL);
    if (input === INTERNAL) {
      // From the host: (INTERNAL, method, url, Headers, Uint8Array or undefined).
      this.#method = init; this.#url = url; this.#headers = headers;
      if (body !== undefined) bodyInit(this, body);
      return;
    }
    if (arguments.length === 0) throw new TypeError("Failed to construct 'Request': 1 argument required");
    init = init == null ? {} : init;
    let src = null;
    if (input instanceof Request) {
      this.#url = input.#url; this.#method = input.#method; this.#redirect = input.#redirect;
      this.#signal = input.#signal; this.#cf = input.#cf;
      this.#headers = new Headers(input.#headers);
    } else {
      this.#url = new URL(input).href;
      this.#headers = new Headers();
    }
    if (init.method !== undefined) this.#method = normMethod(init.method);
    if (init.redirect !== undefined) {
      const r = String(init.redirect);
      if (!REDIRECTS.includes(r)) throw new TypeError('Invalid redirect value: ' + r);
      this.#redirect = r;
    }
    if (init.signal !== undefined) {
      if (init.signal !== null && !(init.signal instanceof AbortSignal)) throw new TypeError('signal must be an AbortSignal');
      this.#signal = init.signal;
    }
    if (init.cf !== undefined) this.#cf = init.cf;
    if (init.headers !== undefined) this.#headers = new Headers(init.headers);
    const hasBody = init.body !== undefined && init.body !== null;
    if (hasBody || (init.body === undefined && input instanceof Request && input.body !== null)) {
      if (this.#method === 'GET' || this.#method === 'HEAD') throw new TypeError('Request with a GET or HEAD method cannot have a body.');
    }
    if (hasBody) {
      const [s, type] = extractBody(init.body);
      src = s;
      if (type !== null && !this.#headers.has('content-type')) this.#headers.set('content-type', type);
    } else if (init.body === undefined && input instanceof Request) {
      src = bodyTake(input);
    }
    if (src !== null) bodyInit(this, src);
  }
  get method() { return this.#method; }
  get url() { return this.#url; }
  get headers() { return this.#headers; }
  get redirect() { return this.#redirect; }
  get signal() { return this.#signal || (this.#signal = new AbortSignal(INTERNAL)); }
  get cf() { return this.#cf; }
  get integrity() { return ''; }
  get keepalive() { return false; }
  clone() {
    const r = new Request(INTERNAL, this.#method, this.#url, new Headers(this.#headers), undefined);
    headersGuard(r.#headers, 0);
    r.#redirect = this.#redirect; r.#signal = this.#signal; r.#cf = this.#cf;
    bodyClone(this, r);
    return r;
  }
}
tag(Request, 'Request');

// ---- Response ----
const NULL_BODY = (s) => s === 101 || s === 204 || s === 205 || s === 304;
const REDIRECT_STATUS = (s) => s === 301 || s === 302 || s === 303 || s === 307 || s === 308;
let responseMake;
class Response extends Body {
  #status = 200; #statusText = ''; #headers; #type = 'default'; #url = ''; #redirected = false; #ws = null; #cf;
  constructor(body, init) {
    super(INTERNAL);
    if (body === INTERNAL) return;
    if (init == null) init = {};
    else if (typeof init !== 'object') throw new TypeError('Response init must be an object');
    if (init.status !== undefined) {
      const s = init.status;
      this.#status = typeof s === 'number' && (s | 0) === s ? s : Number(s) | 0;
      if (this.#status < 200 || this.#status > 599) {
        if (!(this.#status === 101 && init.webSocket)) throw new RangeError('Responses may only be constructed with status codes in the range 200 to 599, inclusive.');
      }
    }
    if (init.statusText !== undefined) {
      const t = String(init.statusText);
      for (let i = 0; i < t.length; i++) {
        const c = t.charCodeAt(i);
        if (c === 10 || c === 13 || c > 255 || (c < 32 && c !== 9)) throw new TypeError('Invalid statusText');
      }
      this.#statusText = t;
    }
    this.#headers = init.headers === undefined ? new Headers() : new Headers(init.headers);
    if (init.webSocket) this.#ws = init.webSocket;
    if (init.cf !== undefined) this.#cf = init.cf;
    if (body !== undefined && body !== null) {
      if (NULL_BODY(this.#status)) throw new TypeError('Response with null body status (101, 204, 205, or 304) cannot have a body.');
      if (typeof body === 'string') {
        bodyInit(this, body);
        if (!this.#headers.has('content-type')) this.#headers.set('content-type', 'text/plain;charset=UTF-8');
      } else {
        const [s, type] = extractBody(body);
        bodyInit(this, s);
        if (type !== null && !this.#headers.has('content-type')) this.#headers.set('content-type', type);
      }
    }
  }
  get status() { return this.#status; }
  get statusText() { return this.#statusText; }
  get ok() { return this.#status >= 200 && this.#status <= 299; }
  get headers() { return this.#headers; }
  get type() { return this.#type; }
  get url() { return this.#url; }
  get redirected() { return this.#redirected; }
  get webSocket() { return this.#ws; }
  get cf() { return this.#cf; }
  clone() {
    const r = new Response(INTERNAL);
    r.#status = this.#status; r.#statusText = this.#statusText; r.#headers = new Headers(this.#headers);
    headersGuard(r.#headers, this.#type === 'error' ? IMMUTABLE : 0);
    r.#type = this.#type; r.#url = this.#url; r.#redirected = this.#redirected; r.#cf = this.#cf;
    bodyClone(this, r);
    return r;
  }
  static json(data, init) {
    const s = JSON.stringify(data);
    if (s === undefined) throw new TypeError('The value cannot be converted to JSON');
    const headers = new Headers(init == null ? undefined : init.headers);
    if (!headers.has('content-type')) headers.set('content-type', 'application/json');
    return new Response(s, init == null ? { headers } : { status: init.status, statusText: init.statusText, headers });
  }
  static redirect(url, status = 302) {
    const u = new URL(url).href;
    status = Number(status) | 0;
    if (!REDIRECT_STATUS(status)) throw new RangeError('Invalid redirect status: ' + status);
    const r = new Response(INTERNAL);
    r.#status = status;
    r.#headers = new Headers();
    r.#headers.set('location', u);
    headersGuard(r.#headers, IMMUTABLE);
    return r;
  }
  static error() {
    const r = new Response(INTERNAL);
    r.#status = 0; r.#type = 'error';
    r.#headers = new Headers();
    headersGuard(r.#headers, IMMUTABLE);
    return r;
  }
  static {
    responseMake = (status, headers, body, url) => {
      const r = new Response(INTERNAL);
      r.#status = status; r.#headers = headers; r.#url = url || '';
      if (body !== null && !(NULL_BODY(status) && body.length === 0)) bodyInit(r, body);
      return r;
    };
  }
}
tag(Response, 'Response');
WEB_CLASSES.push(Headers, Request, Response, FormData, AbortController);

// The host's [name, value, ...] as Headers.
const hostHeaders = (pairs) => {
  const h = new Headers();
  if (pairs && pairs.length) headersFill(h, pairs);
  return h;
};
// A body for the host: a Uint8Array (possibly empty).
const hostBody = (s) => (s === null ? new Uint8Array(0) : typeof s === 'string' ? utf8(s) : s);
g.__hearth_web = {
  incoming(method, url, pairs, body) {
    const h = hostHeaders(pairs);
    headersGuard(h, IMMUTABLE);
    return new Request(INTERNAL, method, url, h, body);
  },
  async outgoing(r) {
    if (!(r instanceof Response)) throw new TypeError('The Worker did not return a Response');
    if (r.type === 'error') throw new TypeError('The Worker returned Response.error()');
    let s = bodyBytes(r);
    if (s !== null && typeof s.then === 'function') s = await s;
    return [r.status, headersFlat(r.headers), hostBody(s)];
  },
  async toFetch(input, init) {
    const req = input instanceof Request && init === undefined ? input : new Request(input, init);
    if (req.signal.aborted) throw req.signal.reason;
    let s = bodyBytes(req);
    if (s !== null && typeof s.then === 'function') s = await s;
    return [req.method, req.url, headersFlat(req.headers), s === null ? undefined : hostBody(s)];
  },
  fromFetch(status, pairs, body, url) {
    const h = hostHeaders(pairs);
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
