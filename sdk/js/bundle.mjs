#!/usr/bin/env node
// hearth-bundle: bundles a JavaScript Worker written in the Workers module
// syntax (`export default { async fetch(request, env, ctx) { ... } }`) into
// one ES module, the input of hearth's JS engine.
//
//   node bundle.mjs WORKER.js -o OUT.js
//
// `hearth build WORKER.js` runs this file (the hearth binary carries a copy
// of this package and installs its one dependency, esbuild, once into its
// cache dir), then snapshots hearth's QuickJS engine with the bundle's
// module started (crate hearth-js-engine). `hearth build --bundle-only`
// stops after this step: the bundle is what workerd or wrangler would run.
//
// esbuild bundles the Worker (ES module, imports resolved from the Worker's
// directory, the `workerd`/`worker`/`browser` export conditions Cloudflare's
// tooling uses; `cloudflare:workers`, and hearth's own name for it,
// `hearth:workers`, stay an import of `cloudflare:workers`, which the
// engine provides, as workerd does, so a `--bundle-only` bundle runs on
// both): a syntax error or a missing import stops here with
// esbuild's message, and so does a bundle without a default export. Whether
// that export has `fetch` is the engine's check, when it starts the module.
//
// Exit status: 0 bundled (nothing printed), 1 the Worker does not bundle
// (the message says why), 2 usage.

import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

function usage(message) {
  if (message) {
    console.error(`hearth-bundle: ${message}`);
  }
  console.error('usage: hearth-bundle WORKER.js -o OUT.js');
  process.exit(2);
}

/** Prints `message` as the reason the bundle failed and exits with 1. */
function fail(message) {
  console.error(`error: ${message}`);
  process.exit(1);
}

let input = null;
let out = null;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i += 1) {
  const a = args[i];
  if (a === '-o' || a === '--out') {
    out = args[i + 1];
    i += 1;
    if (!out) {
      usage(`${a} needs a path`);
    }
  } else if (a === '-h' || a === '--help') {
    usage();
  } else if (a.startsWith('-')) {
    usage(`unknown option ${a}`);
  } else if (input === null) {
    input = a;
  } else {
    usage('one Worker at a time');
  }
}
if (!input || !out) {
  usage(input ? 'no -o OUT.js given' : 'no Worker given');
}
const inputPath = resolve(process.cwd(), input);
if (!existsSync(inputPath)) {
  fail(`${input}: no such file`);
}
const outPath = resolve(process.cwd(), out);

let esbuild;
try {
  esbuild = await import('esbuild');
} catch (e) {
  fail(`esbuild is not installed next to ${here} (run npm ci there): ${e.message}`);
}

// The runtime's own modules: left as imports (see the top).
const builtins = {
  name: 'hearth-builtins',
  setup(build) {
    build.onResolve({ filter: /^(cloudflare|hearth):workers$/ }, () => ({
      path: 'cloudflare:workers',
      external: true,
    }));
  },
};

let result;
try {
  result = await esbuild.build({
    entryPoints: [inputPath],
    outfile: 'worker.js',
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    target: 'es2022',
    mainFields: ['workerd', 'worker', 'module', 'browser', 'main'],
    conditions: ['workerd', 'worker', 'browser'],
    logLevel: 'silent',
    write: false,
    metafile: true,
    plugins: [builtins],
  });
} catch (e) {
  if (e && Array.isArray(e.errors) && e.errors.length > 0) {
    const text = await esbuild.formatMessages(e.errors, { kind: 'error', color: false });
    fail(`${input} does not build:\n${text.join('').trimEnd()}`);
  }
  throw e;
}
const exports = Object.values(result.metafile.outputs)[0].exports;
if (!exports.includes('default')) {
  fail(
    `${input} has no default export: a Worker in the module syntax is ` +
      '`export default { async fetch(request, env, ctx) { ... } }` ' +
      "(the service-worker syntax, addEventListener('fetch', ...), is not what hearth build takes)",
  );
}
await mkdir(dirname(outPath), { recursive: true });
await writeFile(outPath, result.outputFiles[0].contents);
