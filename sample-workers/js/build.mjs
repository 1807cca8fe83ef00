#!/usr/bin/env node
// Builds the JS sample Worker (worker.js) into a wasi:http proxy component.
//
//   node build.mjs OUT.wasm
//
// Runs `npm ci` first when node_modules/ is missing (the exact versions are
// pinned in package.json and package-lock.json), then componentizes
// worker.js against ../wit/ (world `hearth:samples/js-worker`, which exports
// wasi:http/incoming-handler@0.2.10) with componentize-js, and writes the
// component to OUT.wasm (its directory is created if needed).

import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = process.argv[2];
if (!out || process.argv.length > 3) {
  console.error('usage: node build.mjs OUT.wasm');
  process.exit(2);
}
const outPath = resolve(process.cwd(), out);

if (!existsSync(join(here, 'node_modules', '@bytecodealliance', 'componentize-js'))) {
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
