#!/usr/bin/env node
// Builds the JS sample Worker into a wasi:http proxy component.
//
//   node build.mjs OUT.wasm
//
// Runs `npm ci` first when node_modules/ is missing or incomplete (the
// exact versions are pinned in package.json and package-lock.json), then
// componentizes worker.js against ../wit/ (world `hearth:samples/js-worker`,
// which exports wasi:http/incoming-handler@0.2.10) with componentize-js,
// and writes the component to OUT.wasm (its directory is created if
// needed). The sample is the one component of another JS toolchain the
// tests keep: a plain wasi:http component, run as it is (`hearth build`
// makes JS Workers with hearth's own engine instead).

import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const out = args[0];
if (!out || args.length !== 1) {
  console.error('usage: node build.mjs OUT.wasm');
  process.exit(2);
}
const outPath = resolve(process.cwd(), out);

// esbuild too: the tests and the bench point `hearth build` at this
// node_modules (HEARTH_JS_NODE_MODULES), and a node_modules from before it
// was added must be brought up to date.
const installed = (...path) => existsSync(join(here, 'node_modules', ...path));
if (!installed('@bytecodealliance', 'componentize-js') || !installed('esbuild')) {
  console.error('build.mjs: node_modules missing, running npm ci');
  execFileSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: here, stdio: 'inherit' });
}

// Imported only now: it is in node_modules, which npm ci may just have made.
const { componentize } = await import('@bytecodealliance/componentize-js');

const started = Date.now();
const { component } = await componentize({
  sourcePath: join(here, 'worker.js'),
  witPath: join(here, '..', 'wit'),
  worldName: 'js-worker',
});
await mkdir(dirname(outPath), { recursive: true });
await writeFile(outPath, component);
console.error(
  `build.mjs: wrote ${outPath} (${component.byteLength} bytes) in ${((Date.now() - started) / 1000).toFixed(1)} s`,
);
