// A Worker that runs hostile and generated inputs through the web APIs
// whose work is done by the engine's natives (sdk/js/engine/src/web.rs):
// URL and its setters, URLSearchParams, Headers, TextEncoder/TextDecoder,
// atob/btoa and crypto.subtle.importKey. It answers every request 200 with
// a JSON digest of what each input came to: a value, or the class of the
// exception it threw. tests/it/js_inputs.rs runs it on hearth and on
// workerd and compares the digests (workerd is the oracle); on hearth no
// input may abort the instance.
//
//   POST /wpt/url      body: web-platform-tests urltestdata.json entries
//   POST /wpt/setters  body: setters_tests.json (or a part of it)
//   GET  /gen/<kind>?seed=S&n=N   N generated inputs (a seeded PRNG, so
//                      both runtimes see the same ones), kind one of KINDS
//
// The answer is {kind, total, passed, failed, outcomes: [[input, outcome],
// ...]}; `passed` counts the WPT cases whose every expected field matched,
// `failed` lists the others. Every
// string in an answer is well-formed: lone surrogates are shown as \u{d800}.

// ---- the digest ----
const safe = (s) => String(s).replace(/[\ud800-\udfff]/gu, (c) => '\\u{' + c.charCodeAt(0).toString(16) + '}');
const errClass = (e) => {
  if (e instanceof DOMException) return '!DOMException:' + e.name;
  if (e instanceof Error) return '!' + e.constructor.name;
  return '!thrown ' + typeof e;
};
// What `f()` (maybe async) came to: its value made a string by `show`, or
// the exception's class.
const outcome = async (f, show = (v) => v) => {
  try { return safe(JSON.stringify(show(await f()))); } catch (e) { return errClass(e); }
};
const URL_FIELDS = ['href', 'origin', 'protocol', 'username', 'password', 'host', 'hostname', 'port', 'pathname', 'search', 'hash'];
const urlParts = (u) => URL_FIELDS.map((k) => u[k]);
const hex = (buf) => Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, '0')).join('');

// ---- a seeded PRNG (mulberry32) and input makers ----
const prng = (seed) => {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (n) => Math.floor(next() * n);
  const pick = (a) => a[int(a.length)];
  return { next, int, pick };
};
const URL_PIECES = [':', '/', '//', '///', '@', '[', ']', '[::1]', '[1:2::3]', '%', '%2', '%41', '%zz', '%00', '?', '#',
  '\\', '.', '..', '%2e', ' ', '\t', '\n', '\r', '\0', 'a', 'b', 'x', '1', '0', ':8080', ':65536', ':0x10', 'http', 'https',
  'file', 'foo', 'ws', 'blob', 'data', 'mailto', 'javascript', 'sc', 'http://', 'https://', 'foo://', 'file:///', 'sc://',
  '::1', '0x7f', '127.0.0.1', '1.2.3.4.5', '256.0.0.1', '0300.168.0xF0', 'xn--', 'xn--a', 'xn--zca', 'é', 'ß', '日本',
  '\ufffd', '\u200b', '\uff0e', '\u3002', '\ufb00', '\u210c', '😀', '\ud800', '\udc00', 'C|', 'c:', '|', '^', '<', '>',
  "'", '"', '`', '{', '}', ';', '=', '&', '+', '~', '\x7f', '\x01', '\xad', 'ı', 'İ', 'user:pass@', '@@', 'example.com',
  'EXAMPLE.com', 'localhost', '-', '_', '*', '$', '!'];
const BASES = ['http://example.org/foo/bar', 'https://u:p@h:8/p/q?r#s', 'file:///C:/a/b', 'file://host/x', 'foo://',
  'sc://x/', 'sc:/a/b', 'a:b', 'data:text/plain,x', 'non-spec:/.//p', 'blob:https://a/b', 'about:blank'];
// A mix of URL pieces and, now and then, any UTF-16 code unit.
const urlish = (r, max = 8) => {
  let s = '';
  for (let i = r.int(max) + 1; i > 0; i--) s += r.next() < 0.9 ? r.pick(URL_PIECES) : String.fromCharCode(r.int(0x10000));
  return s;
};
// Any string: ASCII mostly, then Latin-1, BMP, astral and lone surrogates.
const anyString = (r, max = 12) => {
  let s = '';
  for (let i = r.int(max + 1); i > 0; i--) {
    const k = r.next();
    s += k < 0.5 ? String.fromCharCode(r.int(0x80))
      : k < 0.7 ? String.fromCharCode(0x80 + r.int(0x80))
        : k < 0.85 ? String.fromCharCode(r.int(0x10000))
          : k < 0.95 ? String.fromCodePoint(0x10000 + r.int(0x100000))
            : String.fromCharCode(0xd800 + r.int(0x800));
  }
  return s;
};
// Bytes that are UTF-8 now and then: valid sequences, truncated and
// overlong ones, surrogates, bytes past U+10FFFF, stray continuations.
const UTF8_BITS = [[0x41], [0xc3, 0xa9], [0xe6, 0x97, 0xa5], [0xf0, 0x9f, 0x98, 0x80], [0xef, 0xbb, 0xbf], [0x80], [0xbf],
  [0xc0, 0x80], [0xc1, 0xbf], [0xe0, 0x80, 0x80], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xf4, 0x90, 0x80, 0x80],
  [0xf5], [0xff], [0xfe], [0xc3], [0xe6, 0x97], [0xf0, 0x9f, 0x98], [0x00], [0x0a]];
const someBytes = (r, max = 10) => {
  const out = [];
  for (let i = r.int(max + 1); i > 0; i--) out.push(...(r.next() < 0.2 ? [r.int(256)] : r.pick(UTF8_BITS)));
  return new Uint8Array(out);
};
const B64_PIECES = ['A', 'B', 'z', '0', '9', '+', '/', '-', '_', '=', '==', '===', ' ', '\t', '\n', '\f', '\r', '\v', '\0',
  'QQ', 'QUI', 'QUJD', 'YQ==', 'YWI=', '%', '.', 'é', '\u0100', '\ud800', '😀'];
const b64ish = (r) => {
  let s = '';
  for (let i = r.int(10); i > 0; i--) s += r.pick(B64_PIECES);
  return s;
};
const HEADER_NAMES = ['a', 'X-Test', 'content-type', 'set-cookie', 'Set-Cookie', '', ' a', 'a ', 'a b', 'a:b', 'a\r', 'a\n',
  'a\0', 'é', 'ü-x', '\ud800', '!#$%&\'*+-.^_`|~', 'a,b', '(x)', 'a/b', 'a\t', '0', 'ÿ', '日本'];
const HEADER_VALUES = ['v', '', ' v ', '\tv\t', 'a, b', 'x\ry', 'x\ny', 'x\0y', 'x\r\ny', '\n', ' \r\n v', 'é', 'ÿ', '日本',
  '😀', '\ud800', 'a\udc00b', '\x7f', '\x01', 'a\tb', '\u2028', '\u0085'];

// ---- the generated kinds: each makes one input and runs it ----
const SETTERS = ['protocol', 'username', 'password', 'host', 'hostname', 'port', 'pathname', 'search', 'hash', 'href'];
const KINDS = {
  // new URL(x), new URL(x, base), URL.canParse.
  async url(r) {
    const input = urlish(r, 10);
    const base = r.next() < 0.5 ? undefined : r.next() < 0.7 ? r.pick(BASES) : urlish(r, 4);
    return [[input, base], [await outcome(() => urlParts(new URL(input, base))), await outcome(() => URL.canParse(input, base))]];
  },
  // One setter on a URL: one of BASES, or generated text parsed against
  // one (the input is the text, not what a runtime made of it).
  async setter(r) {
    const base = r.pick(BASES), text = r.next() < 0.4 ? urlish(r, 6) : '';
    const which = r.pick(SETTERS), value = r.next() < 0.8 ? urlish(r, 5) : anyString(r);
    return [[base, text, which, value], [await outcome(() => { const u = new URL(text, base); u[which] = value; return urlParts(u); })]];
  },
  // URLSearchParams from text, pairs and records; edits seen through a URL.
  async params(r) {
    const text = r.next() < 0.7 ? urlish(r, 8) : anyString(r);
    const k = anyString(r, 4), v = anyString(r, 4);
    return [[text, k, v], [
      await outcome(() => { const p = new URLSearchParams(text); return [[...p], p.toString(), p.size]; }),
      await outcome(() => new URLSearchParams([[k, v], [text, k]]).toString()),
      await outcome(() => new URLSearchParams({ [k]: v }).toString()),
      await outcome(() => {
        const u = new URL('http://h/?' + text);
        u.searchParams.append(k, v);
        u.searchParams.sort();
        return [u.href, u.search, [...u.searchParams]];
      }),
      await outcome(() => { const p = new URLSearchParams(text); p.delete(k); p.set(v, k); return [p.get(v), p.has(k), p.toString()]; }),
    ]];
  },
  // Headers: names and values with CR, LF, NUL, whitespace, non-ASCII.
  async headers(r) {
    const n = r.next() < 0.8 ? r.pick(HEADER_NAMES) : anyString(r, 4);
    const v = r.next() < 0.8 ? r.pick(HEADER_VALUES) + (r.next() < 0.3 ? r.pick(HEADER_VALUES) : '') : anyString(r, 6);
    return [[n, v], [
      await outcome(() => [...new Headers([[n, v]])]),
      await outcome(() => [...new Headers({ [n]: v })]),
      await outcome(() => { const h = new Headers(); h.append(n, v); h.append(n, v); return [h.get(n), h.has(n), [...h]]; }),
      await outcome(() => { const h = new Headers({ a: '1' }); h.set(n, v); h.delete('a'); return [...h]; }),
      await outcome(() => new Headers().get(n)),
    ]];
  },
  // TextEncoder on any string; TextDecoder (fatal or not, BOM or not,
  // whole or streamed in two pieces) on bytes that may be invalid.
  async text(r) {
    const s = anyString(r, 8), b = someBytes(r);
    const fatal = r.next() < 0.5, ignoreBOM = r.next() < 0.3, cut = r.int(b.length + 1);
    return [[s, hex(b), fatal, ignoreBOM, cut], [
      await outcome(() => hex(new TextEncoder().encode(s))),
      await outcome(() => { const d = new Uint8Array(8); const x = new TextEncoder().encodeInto(s, d); return [x.read, x.written, hex(d)]; }),
      await outcome(() => new TextDecoder('utf-8', { fatal, ignoreBOM }).decode(b)),
      await outcome(() => {
        const d = new TextDecoder('utf-8', { fatal, ignoreBOM });
        return d.decode(b.subarray(0, cut), { stream: true }) + '|' + d.decode(b.subarray(cut));
      }),
    ]];
  },
  // btoa on any string; atob on base64-like text.
  async base64(r) {
    const s = r.next() < 0.5 ? anyString(r, 8) : String.fromCharCode(...someBytes(r));
    const t = b64ish(r);
    return [[s, t], [
      await outcome(() => btoa(s)),
      await outcome(() => atob(t)),
      await outcome(() => atob(btoa(s)) === s),
    ]];
  },
  // crypto.subtle.importKey of HMAC keys, raw and JWK, with odd inputs;
  // a key that imports signs a message (the tag compared) and exports.
  async crypto(r) {
    const hash = r.pick(['SHA-1', 'SHA-256', 'sha-384', 'SHA-512', 'MD5', 'SHA-3', { name: 'SHA-256' }, undefined]);
    const length = r.pick([undefined, undefined, 0, 1, 7, 8, 9, 64, 65, 256, 257, -8, NaN, '8', 1e9]);
    const usages = r.pick([['sign'], ['sign', 'verify'], ['verify'], [], ['encrypt'], ['sign', 'sign'], ['deriveKey']]);
    const extractable = r.next() < 0.7;
    const raw = new Uint8Array(r.pick([0, 1, 7, 8, 16, 32, 33, 64, 65, 128, 129]));
    for (let i = 0; i < raw.length; i++) raw[i] = r.int(256);
    const jwk = r.next() < 0.5
      ? { kty: r.pick(['oct', 'oct', 'oct', 'RSA', undefined]), k: r.next() < 0.8 ? b64ish(r) : r.int(1000), alg: r.pick([undefined, 'HS256', 'HS1', 'HS512', 'none']), ext: r.pick([undefined, true, false]) }
      : r.pick([null, 'k', 5, [], { kty: 'oct' }]);
    // HMAC (the one algorithm the engine imports) but now and then.
    const algorithm = r.next() < 0.9 ? { name: r.pick(['HMAC', 'hmac', 'HMAC']), hash, length } : r.pick(['HMAC', 'AES-GCM', undefined, 5]);
    const use = async (format, data) => {
      const key = await crypto.subtle.importKey(format, data, algorithm, extractable, usages);
      const out = [key.type, key.extractable, key.algorithm.name, key.algorithm.hash.name, key.algorithm.length, key.usages];
      if (key.usages.includes('sign')) out.push(hex(await crypto.subtle.sign('HMAC', key, new TextEncoder().encode('message'))));
      if (extractable) out.push(hex(await crypto.subtle.exportKey('raw', key)));
      return out;
    };
    return [[hex(raw), jwk, algorithm, usages, extractable], [await outcome(() => use('raw', raw)), await outcome(() => use('jwk', jwk))]];
  },
};

// ---- web-platform-tests ----
// url/resources/urltestdata.json, as WPT's url-constructor.any.js runs it.
async function wptUrl(cases) {
  let passed = 0, total = 0;
  const outcomes = [], failed = [];
  for (const c of cases) {
    if (typeof c !== 'object' || c === null) continue;
    total++;
    const base = c.base === null || c.base === undefined ? undefined : c.base;
    let good = false;
    const got = await outcome(() => {
      const u = new URL(c.input, base);
      good = !c.failure && URL_FIELDS.every((k) => !(k in c) || u[k] === c[k])
        && (!('searchParams' in c) || u.searchParams.toString() === c.searchParams);
      return urlParts(u);
    });
    if (c.failure) good = got === '!TypeError';
    if (good) passed++;
    else failed.push(safe(JSON.stringify([c.input, c.base])));
    outcomes.push([safe(JSON.stringify([c.input, c.base])), got]);
  }
  return { total, passed, failed, outcomes };
}
// url/resources/setters_tests.json, as WPT's url-setters.any.js runs it.
async function wptSetters(tests) {
  let passed = 0, total = 0;
  const outcomes = [], failed = [];
  for (const [attribute, cases] of Object.entries(tests)) {
    if (attribute === 'comment') continue;
    for (const c of cases) {
      total++;
      let good = false;
      const got = await outcome(() => {
        const u = new URL(c.href);
        u[attribute] = c.new_value;
        good = Object.entries(c.expected).every(([k, v]) => u[k] === v);
        return urlParts(u);
      });
      if (good) passed++;
      else failed.push(safe(JSON.stringify([c.href, attribute, c.new_value])));
      outcomes.push([safe(JSON.stringify([c.href, attribute, c.new_value])), got]);
    }
  }
  return { total, passed, failed, outcomes };
}

export default {
  async fetch(request) {
    const url = new URL(request.url);
    let answer;
    try {
      if (url.pathname === '/wpt/url') answer = await wptUrl(await request.json());
      else if (url.pathname === '/wpt/setters') answer = await wptSetters(await request.json());
      else if (url.pathname.startsWith('/gen/') && KINDS[url.pathname.slice(5)]) {
        const kind = KINDS[url.pathname.slice(5)];
        const r = prng(Number(url.searchParams.get('seed') ?? 1));
        const n = Number(url.searchParams.get('n') ?? 100);
        const outcomes = [];
        for (let i = 0; i < n; i++) {
          const [input, results] = await kind(r);
          outcomes.push([safe(JSON.stringify(input)), results]);
        }
        answer = { total: n, passed: n, outcomes };
      } else answer = { error: 'unknown path ' + url.pathname, kinds: Object.keys(KINDS) };
    } catch (e) {
      answer = { error: errClass(e) + ': ' + safe(e && e.message) };
    }
    answer.kind = url.pathname;
    return new Response(JSON.stringify(answer), { headers: { 'content-type': 'application/json' } });
  },
};
