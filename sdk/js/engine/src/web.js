// The Workers web APIs (Headers, Request, Response, URL, TextDecoder, ...)
// on QuickJS-NG, evaluated once per engine before the Worker's module.
// So far only what the JSON-echo sample needs (the spike's surface).
//
// The contract with runtime.js (the request glue) is `__hearth_web`, four
// functions, so that neither side reaches into the other's objects:
//   incoming(method, url, pairs, body) -> Request
//       the request the host received; `pairs` is [name, value, ...],
//       `body` a Uint8Array or undefined (GET/HEAD).
//   outgoing(response) -> Promise<[status, pairs, body]>
//       a Response the Worker returned, taken apart for the host: `pairs`
//       [name, value, ...], `body` a Uint8Array (possibly empty); rejects
//       with a TypeError if `response` is not a Response.
//   toFetch(input, init) -> Promise<[method, url, pairs, body]>
//       the arguments of `fetch(input, init)` as one outgoing request
//       (`body` a Uint8Array or undefined); rejects as `fetch` would.
//   fromFetch(status, pairs, body, url) -> Response
//       the answer to an outgoing request, for `fetch` to resolve with.
(() => {
  const g = globalThis;
  class JsHeaders {
    constructor(init) {
      this._m = new Map();
      if (init == null) return;
      if (init instanceof JsHeaders) {
        for (const [k, v] of init._m) this._m.set(k, v);
      } else if (Array.isArray(init)) {
        for (const [k, v] of init) this.append(k, v);
      } else {
        for (const k of Object.keys(init)) this.append(k, init[k]);
      }
    }
    get(name) {
      // The stored names are lower case: try the name as given first.
      let v = this._m.get(name);
      if (v === undefined) v = this._m.get(String(name).toLowerCase());
      return v === undefined ? null : v;
    }
    has(name) { return this._m.has(String(name).toLowerCase()); }
    set(name, value) { this._m.set(String(name).toLowerCase(), String(value)); }
    append(name, value) {
      const k = String(name).toLowerCase();
      const old = this._m.get(k);
      this._m.set(k, old === undefined ? String(value) : old + ', ' + value);
    }
    delete(name) { this._m.delete(String(name).toLowerCase()); }
    entries() { return this._m.entries(); }
    keys() { return this._m.keys(); }
    values() { return this._m.values(); }
    forEach(f, t) { this._m.forEach((v, k) => f.call(t, v, k, this)); }
    [Symbol.iterator]() { return this._m.entries(); }
  }
  const Headers = JsHeaders;
  class Request {
    constructor(method, url, headers, body) {
      this.method = method;
      this.url = url;
      this.headers = headers;
      this._body = body;
    }
    async arrayBuffer() { return this._body ? this._body.buffer : new ArrayBuffer(0); }
    async text() { return this._body ? __hearth_utf8(this._body) : ''; }
    async json() { return JSON.parse(await this.text()); }
  }
  class Response {
    constructor(body, init) {
      init = init || {};
      this.status = init.status === undefined ? 200 : init.status;
      this.headers = init.headers instanceof Headers ? init.headers : new Headers(init.headers);
      this._body = body == null ? '' : body;
      if (typeof body === 'string' && !this.headers.has('content-type')) {
        this.headers.set('content-type', 'text/plain;charset=UTF-8');
      }
    }
    static json(v, init) {
      const r = new Response(JSON.stringify(v), init);
      if (!r.headers.has('content-type')) r.headers.set('content-type', 'application/json');
      return r;
    }
  }
  // Only absolute http(s)-style URLs; no regex (QuickJS's libregexp is a
  // backtracking interpreter, and this runs on every request).
  class URL {
    constructor(s) {
      s = String(s);
      const p = s.indexOf('://');
      if (p <= 0) throw new TypeError('Invalid URL: ' + s);
      this.protocol = s.slice(0, p + 1);
      let rest = s.slice(p + 3);
      let h = rest.indexOf('#');
      this.hash = h >= 0 && h < rest.length - 1 ? rest.slice(h) : '';
      if (h >= 0) rest = rest.slice(0, h);
      const q = rest.indexOf('?');
      this.search = q >= 0 && q < rest.length - 1 ? rest.slice(q) : '';
      if (q >= 0) rest = rest.slice(0, q);
      const slash = rest.indexOf('/');
      this.host = slash >= 0 ? rest.slice(0, slash) : rest;
      this.pathname = slash >= 0 ? rest.slice(slash) : '/';
      const colon = this.host.lastIndexOf(':');
      this.hostname = colon >= 0 ? this.host.slice(0, colon) : this.host;
    }
    get href() { return this.protocol + '//' + this.host + this.pathname + this.search + this.hash; }
    toString() { return this.href; }
  }
  class TextDecoder {
    decode(b) {
      if (!b || b.byteLength === 0) return '';
      return __hearth_utf8(b instanceof ArrayBuffer ? new Uint8Array(b) : b);
    }
  }
  g.Headers = Headers;
  g.Request = Request;
  g.Response = Response;
  g.URL = URL;
  g.TextDecoder = TextDecoder;
  const bytesOf = (b) => {
    if (b == null) return new Uint8Array(0);
    if (typeof b === 'string') return new Uint8Array(__hearth_utf8_encode(b));
    if (b instanceof ArrayBuffer) return new Uint8Array(b);
    if (ArrayBuffer.isView(b)) return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    return new Uint8Array(__hearth_utf8_encode(String(b)));
  };
  const flat = (h) => {
    const out = [];
    for (const [k, v] of h._m) out.push(k, v);
    return out;
  };
  g.__hearth_web = {
    incoming(method, url, pairs, body) {
      const h = new Headers();
      for (let i = 0; i < pairs.length; i += 2) h.append(pairs[i], pairs[i + 1]);
      return new Request(method, url, h, body);
    },
    async outgoing(r) {
      if (!(r instanceof Response)) throw new TypeError('fetch did not return a Response');
      return [r.status, flat(r.headers), bytesOf(r._body)];
    },
    async toFetch(input, init) {
      init = init || {};
      const url = String(input instanceof Request ? input.url : input);
      const method = String(init.method || (input instanceof Request ? input.method : 'GET')).toUpperCase();
      const headers = new Headers(init.headers || (input instanceof Request ? input.headers : undefined));
      const body = init.body !== undefined ? init.body : input instanceof Request ? input._body : undefined;
      return [method, url, flat(headers), body == null ? undefined : bytesOf(body)];
    },
    fromFetch(status, pairs, body, url) {
      const h = new Headers();
      for (let i = 0; i < pairs.length; i += 2) h.append(pairs[i], pairs[i + 1]);
      const r = new Response(body, { status, headers: h });
      r.url = url;
      return r;
    },
  };
})();
