// Runs a wasm32-wasip1 program in node's V8 (the engine Envoy embeds), with WASI: `node run.mjs FILE.wasm`.
import { WASI } from 'node:wasi';
import { readFileSync } from 'node:fs';

const wasi = new WASI({ version: 'preview1', args: [] });
const module = await WebAssembly.compile(readFileSync(process.argv[2]));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
process.exitCode = wasi.start(instance);
