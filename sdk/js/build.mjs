#!/usr/bin/env node
// hearth-build: builds a JavaScript Worker written in the Workers module
// syntax into a hearth wasi:http component.
//
//   hearth-build WORKER.js [-o OUT.wasm]      bundle and componentize
//   hearth-build --bundle-only WORKER.js -o OUT.js
//                                             only bundle (what workerd runs)
//
// `hearth build WORKER.js` runs this file (the hearth binary carries a copy
// and installs this package's dependencies once into its cache dir).
//
// Steps:
//  1. esbuild bundles the Worker alone (ES module, imports resolved from the
//     Worker's directory, `workerd`/`worker`/`browser` export conditions as
//     Cloudflare's tooling uses): a syntax error or a missing import stops
//     here with esbuild's message. The bundle must have a default export.
//  2. If node can evaluate that bundle, its default export must have a
//     `fetch` method (a Worker that needs Workers-only globals at load time
//     is checked in step 4 instead).
//  3. esbuild bundles an entry that imports ./shim.js first (it wraps the
//     timer and fetch globals before the Worker's module runs), then the
//     Worker, and exports the shim's wasi:http/incoming-handler for it.
//  4. componentize-js componentizes that bundle against ./wit (world
//     `hearth:js/worker`) with its fetch event off: one instance serves
//     request after request (deploy with the default lifecycle; hearth
//     reuses it). Its snapshot runs the module's top level, so a Worker
//     without `fetch` fails here at the latest.
//
// Exit status: 0 built, 1 the Worker does not build (the message says
// why), 2 usage.

import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, extname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

function usage(message) {
  if (message) {
    console.error(`hearth-build: ${message}`);
  }
  console.error('usage: hearth-build [--bundle-only] WORKER.js [-o OUT]');
  process.exit(2);
}

/** Prints `message` as the reason the build failed and exits with 1. */
function fail(message) {
  console.error(`error: ${message}`);
  process.exit(1);
}

let input = null;
let out = null;
let bundleOnly = false;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i += 1) {
  const a = args[i];
  if (a === '-o' || a === '--out') {
    out = args[i + 1];
    i += 1;
    if (!out) {
      usage(`${a} needs a path`);
    }
  } else if (a === '--bundle-only') {
    bundleOnly = true;
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
if (!input) {
  usage('no Worker given');
}
const inputPath = resolve(process.cwd(), input);
if (!existsSync(inputPath)) {
  fail(`${input}: no such file`);
}
const outPath = resolve(
  process.cwd(),
  out || join(dirname(inputPath), basename(inputPath, extname(inputPath)) + (bundleOnly ? '.bundle.js' : '.wasm')),
);

let esbuild;
try {
  esbuild = await import('esbuild');
} catch (e) {
  fail(`esbuild is not installed next to ${here} (run npm ci there): ${e.message}`);
}

/** esbuild's messages, as it prints them, without colour. */
async function formatted(messages) {
  const text = await esbuild.formatMessages(messages, { kind: 'error', color: false });
  return text.join('').trimEnd();
}

/** Bundles with `options`; on failure exits with esbuild's messages. */
async function bundle(options) {
  try {
    return await esbuild.build({
      bundle: true,
      format: 'esm',
      platform: 'neutral',
      target: 'es2022',
      mainFields: ['workerd', 'worker', 'module', 'browser', 'main'],
      conditions: ['workerd', 'worker', 'browser'],
      // The shim's WASI and hearth:js imports are the component's, resolved by
      // componentize-js; node: built-ins do not exist in the engine.
      external: ['wasi:*', 'hearth:*'],
      logLevel: 'silent',
      write: false,
      metafile: true,
      ...options,
    });
  } catch (e) {
    if (e && Array.isArray(e.errors) && e.errors.length > 0) {
      fail(`${input} does not build:\n${await formatted(e.errors)}`);
    }
    throw e;
  }
}

const started = Date.now();

// 1. The Worker alone.
const alone = await bundle({ entryPoints: [inputPath], outfile: 'worker.js' });
const aloneOut = alone.outputFiles[0];
const exports = Object.values(alone.metafile.outputs)[0].exports;
if (!exports.includes('default')) {
  fail(
    `${input} has no default export: a Worker in the module syntax is ` +
      '`export default { async fetch(request, env, ctx) { ... } }` ' +
      "(the service-worker syntax, addEventListener('fetch', ...), is not what hearth build takes)",
  );
}
if (bundleOnly) {
  await mkdir(dirname(outPath), { recursive: true });
  await writeFile(outPath, aloneOut.contents);
  console.error(`hearth-build: wrote ${outPath} (${aloneOut.contents.byteLength} bytes)`);
  process.exit(0);
}

// 2. Its default export, if node can load it.
let loaded = null;
try {
  const url = `data:text/javascript;base64,${Buffer.from(aloneOut.contents).toString('base64')}`;
  loaded = await import(url);
} catch {
  // Needs what only the Workers runtime has: step 4 checks it.
}
if (loaded && !(loaded.default && typeof loaded.default.fetch === 'function')) {
  fail(
    `${input}'s default export has no fetch method: write ` +
      '`export default { async fetch(request, env, ctx) { ... } }`',
  );
}

// 3. The entry: the shim, then the Worker.
const shim = JSON.stringify(join(here, 'shim.js'));
const worker = JSON.stringify(inputPath);
const entry = await bundle({
  stdin: {
    contents:
      `import { incomingHandlerFor } from ${shim};\n` +
      `import worker from ${worker};\n` +
      'export const incomingHandler = incomingHandlerFor(worker);\n',
    resolveDir: dirname(inputPath),
    sourcefile: 'hearth-entry.js',
    loader: 'js',
  },
  outfile: 'entry.js',
});

// 4. Componentize.
let componentize;
try {
  ({ componentize } = await import('@bytecodealliance/componentize-js'));
} catch (e) {
  fail(`componentize-js is not installed next to ${here} (run npm ci there): ${e.message}`);
}
const work = await mkdtemp(join(tmpdir(), 'hearth-build-'));
try {
  const sourcePath = join(work, 'entry.js');
  await writeFile(sourcePath, entry.outputFiles[0].contents);
  let component;
  try {
    ({ component } = await componentize({
      sourcePath,
      witPath: join(here, 'wit'),
      worldName: 'worker',
      disableFeatures: ['fetch-event'],
    }));
  } catch (e) {
    fail(`componentize-js could not build ${input}: ${e && e.message ? e.message : e}`);
  }
  await mkdir(dirname(outPath), { recursive: true });
  await writeFile(outPath, component);
  console.error(
    `hearth-build: wrote ${outPath} (${component.byteLength} bytes) in ` +
      `${((Date.now() - started) / 1000).toFixed(1)} s`,
  );
} finally {
  await rm(work, { recursive: true, force: true });
}
