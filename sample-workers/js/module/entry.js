// The component's entry: the shim `hearth build` uses first (it wraps the
// timer and fetch globals before the Worker's module runs), then the Worker,
// whose default export becomes the wasi:http/incoming-handler export.
// ../build.mjs --module bundles this file with esbuild.
import { incomingHandlerFor } from '../../../sdk/js/shim.js';
import worker from './worker.js';

export const incomingHandler = incomingHandlerFor(worker);
