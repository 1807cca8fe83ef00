// url.js: URL and URLSearchParams. Parsing and the setters are the Rust
// `url` crate's (WHATWG), through natives: a parse returns the serialized
// href and writes the component boundaries into OFF, so a getter is a
// slice of the href (no further native call).
const usv = (s) => { s = String(s); return s.isWellFormed() ? s : s.toWellFormed(); };
// Component boundaries of an href, written by N.urlParse / N.urlSet:
// 0 scheme end, 1-2 username, 3-4 password, 5-6 hostname, 7-8 port,
// 9-10 path, 11-12 query, 13-14 fragment (start, end; the query and
// fragment without their '?' / '#').
const OFF = new Int32Array(15);
const SET = { protocol: 1, username: 2, password: 3, host: 4, hostname: 5, port: 6, pathname: 7, search: 8, hash: 9 };
let urlSetSearch, urlParamsChanged;
class URL {
  #href; #o; #params = null;
  constructor(url, base) {
    let s = typeof url === 'string' ? url : arguments.length === 0 ? undefined : String(url);
    if (s === undefined) throw new TypeError("Failed to construct 'URL': 1 argument required");
    if (!s.isWellFormed()) s = s.toWellFormed();
    const h = N.urlParse(s, base === undefined ? undefined : usv(base), OFF);
    if (h == null) throw new TypeError('Invalid URL: ' + s);
    this.#href = h;
    this.#o = OFF.slice();
  }
  static canParse(url, base) {
    if (arguments.length === 0) throw new TypeError("'URL.canParse' requires 1 argument");
    return N.urlParse(usv(url), base === undefined ? undefined : usv(base), OFF) != null;
  }
  static parse(url, base) {
    try { return new URL(url, base); } catch { return null; }
  }
  #part(i) { return this.#href.slice(this.#o[i], this.#o[i + 1]); }
  #set(which, v) {
    const h = N.urlSet(this.#href, which, usv(v), OFF);
    if (h != null) { this.#href = h; this.#o = OFF.slice(); }
  }
  get href() { return this.#href; }
  set href(v) {
    const h = N.urlParse(usv(v), undefined, OFF);
    if (h == null) throw new TypeError('Invalid URL: ' + v);
    this.#href = h; this.#o = OFF.slice();
    if (this.#params) urlParamsChanged(this.#params, this.search);
  }
  get origin() { return N.urlOrigin(this.#href); }
  get protocol() { return this.#href.slice(0, this.#o[0] + 1); }
  set protocol(v) { this.#set(1, v); }
  get username() { return this.#part(1); }
  set username(v) { this.#set(2, v); }
  get password() { return this.#part(3); }
  set password(v) { this.#set(3, v); }
  get host() { return this.#href.slice(this.#o[5], this.#o[8]); }
  set host(v) { this.#set(4, v); }
  get hostname() { return this.#part(5); }
  set hostname(v) { this.#set(5, v); }
  get port() { return this.#part(7); }
  set port(v) { this.#set(6, v); }
  get pathname() { return this.#part(9); }
  set pathname(v) { this.#set(7, v); }
  get search() { const o = this.#o; return o[12] > o[11] ? this.#href.slice(o[11] - 1, o[12]) : ''; }
  set search(v) {
    this.#set(8, v);
    if (this.#params) urlParamsChanged(this.#params, this.search);
  }
  get hash() { const o = this.#o; return o[14] > o[13] ? this.#href.slice(o[13] - 1, o[14]) : ''; }
  set hash(v) { this.#set(9, v); }
  get searchParams() {
    if (this.#params === null) this.#params = new URLSearchParams(INTERNAL, this, this.search);
    return this.#params;
  }
  toString() { return this.#href; }
  toJSON() { return this.#href; }
  static {
    urlSetSearch = (u, s) => {
      // An empty list removes the query (the URL standard's update steps).
      const h = N.urlSet(u.#href, 8, s, OFF);
      if (h != null) { u.#href = h; u.#o = OFF.slice(); }
    };
  }
}
tag(URL, 'URL');

const pairsOf = (init) => {
  const l = [];
  if (init instanceof URLSearchParams) {
    for (const [k, v] of init) l.push(k, v);
  } else if (typeof init[Symbol.iterator] === 'function') {
    for (const p of init) {
      if (p === null || typeof p !== 'object' || typeof p[Symbol.iterator] !== 'function') throw new TypeError('Each pair must be an iterable [name, value]');
      const a = Array.from(p);
      if (a.length !== 2) throw new TypeError('Each pair must have exactly two items [name, value]');
      l.push(usv(a[0]), usv(a[1]));
    }
  } else {
    for (const k of Object.keys(init)) l.push(usv(k), usv(init[k]));
  }
  return l;
};
class URLSearchParams {
  #l; #url = null;
  constructor(init = '', url, search) {
    if (init === INTERNAL) {
      this.#url = url;
      this.#l = search ? N.formParse(search.slice(1)) : [];
      return;
    }
    if (init !== null && typeof init === 'object') this.#l = pairsOf(init);
    else {
      let s = usv(init);
      if (s.charCodeAt(0) === 63) s = s.slice(1);
      this.#l = s ? N.formParse(s) : [];
    }
  }
  #update() {
    if (this.#url) urlSetSearch(this.#url, this.#l.length ? N.formSerialize(this.#l) : '');
  }
  get size() { return this.#l.length / 2; }
  append(k, v) {
    if (arguments.length < 2) throw new TypeError("'append' requires 2 arguments");
    this.#l.push(usv(k), usv(v)); this.#update();
  }
  delete(k, v) {
    k = usv(k);
    const check = v !== undefined;
    if (check) v = usv(v);
    const l = this.#l, out = [];
    for (let i = 0; i < l.length; i += 2) if (l[i] !== k || (check && l[i + 1] !== v)) out.push(l[i], l[i + 1]);
    this.#l = out; this.#update();
  }
  get(k) {
    k = usv(k);
    const l = this.#l;
    for (let i = 0; i < l.length; i += 2) if (l[i] === k) return l[i + 1];
    return null;
  }
  getAll(k) {
    k = usv(k);
    const l = this.#l, out = [];
    for (let i = 0; i < l.length; i += 2) if (l[i] === k) out.push(l[i + 1]);
    return out;
  }
  has(k, v) {
    k = usv(k);
    const check = v !== undefined;
    if (check) v = usv(v);
    const l = this.#l;
    for (let i = 0; i < l.length; i += 2) if (l[i] === k && (!check || l[i + 1] === v)) return true;
    return false;
  }
  set(k, v) {
    if (arguments.length < 2) throw new TypeError("'set' requires 2 arguments");
    k = usv(k); v = usv(v);
    const l = this.#l, out = [];
    let found = false;
    for (let i = 0; i < l.length; i += 2) {
      if (l[i] !== k) out.push(l[i], l[i + 1]);
      else if (!found) { out.push(k, v); found = true; }
    }
    if (!found) out.push(k, v);
    this.#l = out; this.#update();
  }
  sort() {
    const l = this.#l, ps = [];
    for (let i = 0; i < l.length; i += 2) ps.push([l[i], l[i + 1]]);
    // Array.prototype.sort is stable; names compare by UTF-16 code units.
    ps.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    this.#l = ps.flat(); this.#update();
  }
  forEach(f, t) {
    if (typeof f !== 'function') throw new TypeError('forEach needs a function');
    for (let i = 0; i < this.#l.length; i += 2) f.call(t, this.#l[i + 1], this.#l[i], this);
  }
  *entries() { for (let i = 0; i < this.#l.length; i += 2) yield [this.#l[i], this.#l[i + 1]]; }
  *keys() { for (let i = 0; i < this.#l.length; i += 2) yield this.#l[i]; }
  *values() { for (let i = 0; i < this.#l.length; i += 2) yield this.#l[i + 1]; }
  [Symbol.iterator]() { return this.entries(); }
  toString() { return this.#l.length ? N.formSerialize(this.#l) : ''; }
  static {
    urlParamsChanged = (p, search) => { p.#l = search ? N.formParse(search.slice(1)) : []; };
  }
}
tag(URLSearchParams, 'URLSearchParams');
INSPECTED.push([URL, ['href', 'origin', 'protocol', 'username', 'password', 'host', 'hostname', 'port', 'pathname', 'search', 'hash']],
  [URLSearchParams, 'entries']);
define('URL', URL);
define('URLSearchParams', URLSearchParams);
