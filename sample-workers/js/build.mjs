#!/usr/bin/env node
// Builds a JS sample Worker into a wasi:http proxy component.
//
//   node build.mjs OUT.wasm            worker.js, a fetch-event Worker
//   node build.mjs --module OUT.wasm   module/worker.js, a Workers-module-
//                                      syntax Worker behind the shim of
//                                      `hearth build` (sdk/js/shim.js)
//
// Runs `npm ci` first when node_modules/ is missing or incomplete (the
// exact versions are pinned in package.json and package-lock.json), then
// componentizes worker.js against ../wit/ (world `hearth:samples/js-worker`,
// which exports wasi:http/incoming-handler@0.2.10) with componentize-js,
// and writes the component to OUT.wasm (its directory is created if
// needed). With --module, esbuild first bundles module/entry.js (the
// shim `hearth build` uses, sdk/js/shim.js, then module/worker.js) and
// componentize-js builds that against sdk/js/wit (world `hearth:js/worker`)
// with the fetch event disabled: the shim exports the incoming handler, so
// an instance can serve many requests. One shim for the sample and for
// users' Workers, so what the bench measures is what `hearth build` ships.

import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const module = args[0] === '--module';
const out = module ? args[1] : args[0];
if (!out || args.length !== (module ? 2 : 1)) {
  console.error('usage: node build.mjs [--module] OUT.wasm');
  process.exit(2);
}
const outPath = resolve(process.cwd(), out);

// esbuild too: it was added later (for `hearth build`'s tests and the
// bench), and a node_modules from before it must be brought up to date.
const installed = (...path) => existsSync(join(here, 'node_modules', ...path));
if (!installed('@bytecodealliance', 'componentize-js') || !installed('esbuild')) {
  console.error('build.mjs: node_modules missing, running npm ci');
  execFileSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: here, stdio: 'inherit' });
}

// Imported only now: it is in node_modules, which npm ci may just have made.
const { componentize } = await import('@bytecodealliance/componentize-js');

const started = Date.now();
let component;
if (module) {
  const esbuild = await import('esbuild');
  const bundled = await esbuild.build({
    entryPoints: [join(here, 'module', 'entry.js')],
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    target: 'es2022',
    // The component's imports, resolved by componentize-js.
    external: ['wasi:*', 'hearth:*'],
    write: false,
  });
  const work = await mkdtemp(join(tmpdir(), 'hearth-js-module-'));
  try {
    const sourcePath = join(work, 'entry.js');
    await writeFile(sourcePath, bundled.outputFiles[0].contents);
    ({ component } = await componentize({
      sourcePath,
      witPath: join(here, '..', '..', 'sdk', 'js', 'wit'),
      worldName: 'worker',
      disableFeatures: ['fetch-event'],
    }));
  } finally {
    await rm(work, { recursive: true, force: true });
  }
} else {
  ({ component } = await componentize({
    sourcePath: join(here, 'worker.js'),
    witPath: join(here, '..', 'wit'),
    worldName: 'js-worker',
  }));
}
await mkdir(dirname(outPath), { recursive: true });
await writeFile(outPath, component);
console.error(
  `build.mjs: wrote ${outPath} (${component.byteLength} bytes) in ${((Date.now() - started) / 1000).toFixed(1)} s`,
);
