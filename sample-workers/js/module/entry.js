// The component's entry: ./shim.js first (it wraps the timer and fetch
// globals before the Worker's module runs), then the Worker, whose default
// export becomes the wasi:http/incoming-handler export.
import { incomingHandlerFor } from './shim.js';
import worker from './worker.js';

export const incomingHandler = incomingHandlerFor(worker);
