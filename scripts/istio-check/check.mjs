// Validates Kubernetes manifests (Istio's EnvoyFilter, DestinationRule, VirtualService; a core Service) against
// the schemas published in @kubernetes-models/istio and kubernetes-models, which are generated from Istio's and
// Kubernetes' CRD/OpenAPI schemas.
//
// Two checks per document:
//  1. the package's JSON-schema validator (types, enums, required fields, one-of rules);
//  2. unknown fields: CRD schemas allow them (the API server prunes them, or refuses them with strict field
//     validation, kubectl's default), and the JSON-schema validator lets them pass. TypeScript's excess-property
//     check on the package's generated types refuses them, which is what `kubectl apply` would do.
//
// Usage: node check.mjs FILE_OR_DIR...            every manifest must pass
//        node check.mjs --expect-refused FILE...  every file must be refused, with each `&&`-separated
//                                                 substring of its first line `# expect: A && B` in the errors
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";
import ts from "typescript";

const here = path.dirname(fileURLToPath(import.meta.url));

const KINDS = {
  "networking.istio.io/v1alpha3/EnvoyFilter": "@kubernetes-models/istio/networking.istio.io/v1alpha3/EnvoyFilter",
  "networking.istio.io/v1/DestinationRule": "@kubernetes-models/istio/networking.istio.io/v1/DestinationRule",
  "networking.istio.io/v1/VirtualService": "@kubernetes-models/istio/networking.istio.io/v1/VirtualService",
  "networking.istio.io/v1/Gateway": "@kubernetes-models/istio/networking.istio.io/v1/Gateway",
  "v1/Service": "kubernetes-models/v1/Service",
};

function files(args) {
  return args.flatMap((a) =>
    fs.statSync(a).isDirectory()
      ? fs.readdirSync(a).filter((f) => /\.ya?ml$/.test(f)).sort().map((f) => path.join(a, f))
      : [a],
  );
}

/** All errors of one file, as strings naming the file, document and field. */
async function check(file) {
  const errors = [];
  const text = fs.readFileSync(file, "utf8");
  const docs = YAML.parseAllDocuments(text).map((d) => d.toJS()).filter((d) => d != null);
  if (docs.length === 0) errors.push(`${file}: no document`);
  const ts_lines = [];
  for (const [i, doc] of docs.entries()) {
    const key = `${doc.apiVersion}/${doc.kind}`;
    const mod = KINDS[key];
    if (!mod) {
      errors.push(`${file}[${i}]: unknown apiVersion/kind ${key}`);
      continue;
    }
    const Model = (await import(mod))[doc.kind];
    try {
      new Model(doc).validate();
    } catch (e) {
      errors.push(`${file}[${i}] ${doc.kind}: schema: ${e.message}`);
    }
    ts_lines.push(`import type { I${doc.kind} as T${i} } from ${JSON.stringify(mod)};`);
    ts_lines.push(`export const d${i}: T${i} = ${JSON.stringify(doc, null, 1)};`);
  }
  errors.push(...unknownFields(file, ts_lines.join("\n")));
  return errors;
}

function unknownFields(file, source) {
  const tmp = fs.mkdtempSync(path.join(here, ".tmp-"));
  const ts_file = path.join(tmp, "m.ts");
  try {
    fs.writeFileSync(ts_file, source);
    const program = ts.createProgram([ts_file], {
      noEmit: true,
      strict: true,
      skipLibCheck: true,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      target: ts.ScriptTarget.ES2022,
      types: [],
    });
    return ts.getPreEmitDiagnostics(program).map((d) => {
      const msg = ts.flattenDiagnosticMessageText(d.messageText, "\n");
      const where = d.file && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start) : null;
      const near = where ? d.file.text.split("\n")[where.line].trim() : "";
      return `${file}: field check: ${msg.split("\n")[0]} (near \`${near}\`)`;
    });
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

const args = process.argv.slice(2);
const expectRefused = args[0] === "--expect-refused";
const list = files(expectRefused ? args.slice(1) : args);
let failed = 0;
if (list.length === 0) {
  console.error("istio-check: no manifest given");
  process.exit(2);
}
for (const f of list) {
  const errs = await check(f);
  if (!expectRefused) {
    if (errs.length) {
      failed++;
      errs.forEach((e) => console.error(`FAIL ${e}`));
    } else console.log(`ok   ${f}`);
    continue;
  }
  const first = fs.readFileSync(f, "utf8").split("\n")[0];
  const wants = (first.match(/^# expect: (.*)$/)?.[1] ?? "").split("&&").map((s) => s.trim()).filter(Boolean);
  const all = errs.join("\n");
  const missing = wants.filter((w) => !all.includes(w));
  if (errs.length === 0 || wants.length === 0 || missing.length) {
    failed++;
    console.error(`FAIL ${f}: expected refusal with [${wants.join(" && ")}]; got:\n${all || "(accepted)"}`);
  } else console.log(`ok   ${f} refused: ${errs[0]}`);
}
console.log(`${list.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
