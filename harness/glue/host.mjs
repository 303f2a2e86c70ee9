// A proxy-wasm host in JavaScript, for `llmroute-bench glue` (make bench-glue): it loads the filter's .wasm in
// node's V8 (the engine Envoy 1.40 embeds), configures it, and drives chat requests through it one after the
// other, each as Envoy would: the request headers, the whole body in one chunk, the answer's headers and body,
// then the log and the context's end. The host side of every call is as cheap as JavaScript allows (header maps
// serialized once, body edits counted and not applied), so a CPU profile of the run (node --cpu-prof) shows
// the filter's own code: which Rust functions, under which callback, cost what.
//
// node host.mjs FILTER.wasm BODY CONFIG ANSWER REQUESTS
// ANSWER is the engine's JSON answer, or a JSON array of strings: the chunks of a streamed (SSE) answer, each
// delivered in its own body callback.
// prints one JSON line: {"us_per_request": best round's mean, "rounds": [...], "calls": {kind: count per request}}
import { WASI } from 'node:wasi';
import { readFileSync } from 'node:fs';

const [wasmPath, bodyPath, configPath, answerPath, requestsArg] = process.argv.slice(2);
const requests = Math.max(1, Number(requestsArg) || 1000);
const body = readFileSync(bodyPath);
const config = readFileSync(configPath);
const enc = new TextEncoder();
const dec = new TextDecoder();
const answerFile = readFileSync(answerPath);
const streamed = answerFile[0] === 0x5b; // '['
const chunks = streamed ? JSON.parse(answerFile.toString()).map((c) => enc.encode(c)) : [answerFile];
let answer = chunks[0];

// The proxy-wasm ABI's status codes, buffer and map types (ABI 0.2.1).
const OK = 0, NOT_FOUND = 1, EMPTY = 7;
const REQUEST_BODY = 0, RESPONSE_BODY = 1, VM_CONFIGURATION = 6, PLUGIN_CONFIGURATION = 7;
const REQUEST_HEADERS = 0, RESPONSE_HEADERS = 2;

// The headers Envoy hands the filter for one bench request (the load generator's, plus Envoy's own).
const requestHeaders = headerMap([
  [':authority', '127.0.0.1:10000'], [':path', '/v1/chat/completions'], [':method', 'POST'], [':scheme', 'http'],
  ['content-type', 'application/json'], ['x-llmroute-affinity', '5d3d2f4b1c0a9e87'], ['accept', '*/*'],
  ['content-length', String(body.length)], ['x-forwarded-proto', 'http'],
  ['x-request-id', 'a5c1f1a2-4f7b-4b7e-9d6a-0c6f0f5d9b1e'],
]);
const responseHeaders = headerMap(streamed
  ? [[':status', '200'], ['content-type', 'text/event-stream'], ['date', 'Tue, 01 Dec 2026 00:00:00 GMT'],
    ['x-envoy-upstream-service-time', '1']]
  : [[':status', '200'], ['content-type', 'application/json'], ['content-length', String(answer.length)],
    ['date', 'Tue, 01 Dec 2026 00:00:00 GMT'], ['x-envoy-upstream-service-time', '1']]);

/** A header map with its ABI serialization, made once. */
function headerMap(pairs) {
  const entries = pairs.map(([k, v]) => [k, enc.encode(k), enc.encode(v)]);
  let size = 4 + entries.length * 8;
  for (const [, k, v] of entries) size += k.length + v.length + 2;
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  view.setUint32(0, entries.length, true);
  let at = 4;
  for (const [, k, v] of entries) {
    view.setUint32(at, k.length, true);
    view.setUint32(at + 4, v.length, true);
    at += 8;
  }
  for (const [, k, v] of entries) {
    out.set(k, at);
    at += k.length + 1;
    out.set(v, at);
    at += v.length + 1;
  }
  return { values: new Map(entries.map(([name, , v]) => [name, v])), serialized: out };
}

let instance, exports, wasmMemory;
// Views of the VM's memory, made again only when it grew (growing detaches the old buffer, and a view of a
// detached buffer has no bytes).
let bytes = new Uint8Array(), data = new DataView(new ArrayBuffer(0));
const memory = () => {
  if (bytes.byteLength === 0) {
    bytes = new Uint8Array(wasmMemory.buffer);
    data = new DataView(wasmMemory.buffer);
  }
  return bytes;
};
const view = () => {
  memory();
  return data;
};
const text = (ptr, len) => dec.decode(memory().subarray(ptr, ptr + len));
const calls = {};
const count = (kind) => { calls[kind] = (calls[kind] || 0) + 1; };

/** Hands bytes to the VM as Envoy does: memory from the filter's allocator, then the pointer and size. */
function give(payload, ptrPtr, sizePtr) {
  const ptr = exports.proxy_on_memory_allocate(payload.length);
  memory().set(payload, ptr);
  view().setUint32(ptrPtr, ptr, true);
  view().setUint32(sizePtr, payload.length, true);
  return OK;
}

const mapOf = (type) => (type === REQUEST_HEADERS ? requestHeaders : type === RESPONSE_HEADERS ? responseHeaders : null);
const noBytes = new Uint8Array();
function bufferOf(type) {
  switch (type) {
    case REQUEST_BODY: return body;
    case RESPONSE_BODY: return answer;
    case PLUGIN_CONFIGURATION: return config;
    case VM_CONFIGURATION: return noBytes;
    default: return undefined;
  }
}
const metricNames = [];
const shared = new Map();
let clock = 1_700_000_000_000_000_000n;
const refused = () => NOT_FOUND;

const env = {
  proxy_log: (level, ptr, len) => {
    if (level >= 3) console.error(`filter log (level ${level}): ${text(ptr, len)}`);
    return OK;
  },
  proxy_get_current_time_nanoseconds: (ret) => {
    count('Time');
    clock += 1000n;
    view().setBigUint64(ret, clock, true);
    return OK;
  },
  proxy_set_tick_period_milliseconds: () => OK,
  proxy_get_buffer_bytes: (type, start, max, ptrPtr, sizePtr) => {
    count('GetBuffer');
    const b = bufferOf(type);
    if (!b) return NOT_FOUND;
    start >>>= 0;
    max >>>= 0;
    const part = b.subarray(start, Math.min(b.length, start + max));
    return part.length === 0 ? EMPTY : give(part, ptrPtr, sizePtr);
  },
  // Envoy drains and prepends; nothing here reads the body after the edit, so it is only counted.
  proxy_set_buffer_bytes: () => { count('SetBuffer'); return OK; },
  proxy_get_header_map_pairs: (type, ptrPtr, sizePtr) => {
    count('GetMap');
    return give(mapOf(type).serialized, ptrPtr, sizePtr);
  },
  proxy_get_header_map_value: (type, keyPtr, keyLen, ptrPtr, sizePtr) => {
    count('GetMapValue');
    const value = mapOf(type).values.get(text(keyPtr, keyLen));
    return value === undefined ? NOT_FOUND : give(value, ptrPtr, sizePtr);
  },
  // The maps stay as Envoy first gave them: each request starts from the same headers.
  proxy_replace_header_map_value: () => { count('SetMapValue'); return OK; },
  proxy_remove_header_map_value: () => { count('SetMapValue'); return OK; },
  proxy_add_header_map_value: () => { count('SetMapValue'); return OK; },
  proxy_set_header_map_pairs: () => OK,
  proxy_get_property: (pathPtr, pathLen, ptrPtr, sizePtr) => {
    count('GetProperty');
    const path = text(pathPtr, pathLen).split('\0').join('.');
    return path === 'plugin_root_id' ? give(noBytes, ptrPtr, sizePtr) : NOT_FOUND;
  },
  proxy_set_property: () => { count('SetProperty'); return OK; },
  proxy_define_metric: (type, namePtr, nameLen, ret) => {
    metricNames.push(text(namePtr, nameLen));
    view().setUint32(ret, metricNames.length, true);
    return OK;
  },
  proxy_increment_metric: () => { count('IncrementMetric'); return OK; },
  proxy_record_metric: () => { count('RecordMetric'); return OK; },
  proxy_get_metric: (id, ret) => { view().setBigUint64(ret, 0n, true); return OK; },
  proxy_get_shared_data: (keyPtr, keyLen, ptrPtr, sizePtr, casPtr) => {
    count('GetSharedData');
    const entry = shared.get(text(keyPtr, keyLen));
    if (!entry) return NOT_FOUND;
    give(entry.value, ptrPtr, sizePtr);
    view().setUint32(casPtr, entry.cas, true);
    return OK;
  },
  proxy_set_shared_data: (keyPtr, keyLen, valuePtr, valueLen) => {
    count('SetSharedData');
    const key = text(keyPtr, keyLen);
    const cas = (shared.get(key)?.cas || 0) + 1;
    shared.set(key, { value: memory().slice(valuePtr, valuePtr + valueLen), cas });
    return OK;
  },
  proxy_send_local_response: (status, detailsPtr, detailsLen, bodyPtr, bodyLen) => {
    throw new Error(`the filter answered the bench request itself: ${status} ${text(bodyPtr, bodyLen)}`);
  },
  proxy_http_call: (a, b, c, d, e, f, g, h, timeout, tokenPtr) => { view().setUint32(tokenPtr, 1, true); return OK; },
  proxy_continue_stream: () => OK,
  proxy_close_stream: () => OK,
  proxy_done: () => OK,
  proxy_set_effective_context: () => OK,
  proxy_get_status: refused,
  proxy_call_foreign_function: refused,
  proxy_grpc_call: refused, proxy_grpc_stream: refused, proxy_grpc_send: refused, proxy_grpc_cancel: refused,
  proxy_grpc_close: refused, proxy_register_shared_queue: refused, proxy_resolve_shared_queue: refused,
  proxy_enqueue_shared_queue: refused, proxy_dequeue_shared_queue: refused,
};

const wasi = new WASI({ version: 'preview1', args: [] });
const module = await WebAssembly.compile(readFileSync(wasmPath));
instance = await WebAssembly.instantiate(module, { env, ...wasi.getImportObject() });
wasi.initialize(instance);
exports = instance.exports;
wasmMemory = exports.memory;
const vm = exports;
const ROOT = 1;
vm.proxy_on_context_create(ROOT, 0);
if (!vm.proxy_on_vm_start(ROOT, 0)) throw new Error('proxy_on_vm_start refused');
if (!vm.proxy_on_configure(ROOT, config.length)) throw new Error('proxy_on_configure refused the config');

let nextContext = ROOT + 1;
/** One request, callback by callback, as Envoy makes them. */
function request() {
  const id = nextContext++;
  vm.proxy_on_context_create(id, ROOT);
  vm.proxy_on_request_headers(id, 10, 0);
  vm.proxy_on_request_body(id, body.length, 1);
  vm.proxy_on_response_headers(id, 5, 0);
  for (let i = 0; i < chunks.length; i++) {
    answer = chunks[i];
    vm.proxy_on_response_body(id, answer.length, i === chunks.length - 1 ? 1 : 0);
  }
  vm.proxy_on_log(id);
  vm.proxy_on_done(id);
  vm.proxy_on_delete(id);
}

// Warm up (V8 tiers the code up, the filter defines its metrics), then count one request's host calls.
for (let i = 0; i < Math.min(2000, requests); i++) request();
for (const kind of Object.keys(calls)) delete calls[kind];
request();
const perRequest = { ...calls };
const rounds = [];
for (let r = 0; r < 7; r++) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < requests; i++) request();
  rounds.push(Number(process.hrtime.bigint() - start) / 1000 / requests);
}
console.log(JSON.stringify({ us_per_request: Math.min(...rounds), rounds, calls: perRequest }));
