"""Validate Kubernetes manifests against Istio's and Kubernetes' schemas, refusing unknown fields.

The schemas are the pydantic models of `cloudcoil-models-istio` and `cloudcoil-models-kubernetes` (PyPI), which
are generated from Istio's CRDs and Kubernetes' OpenAPI document. Two checks per document, as `kubectl apply` with
its default strict field validation would make them:

1. schema: types, enums and required fields (`schema:` in the errors);
2. unknown fields: CRD schemas allow them and the models would drop them, so every model is built with
   `extra="forbid"` and fields are matched by their API names only (`field check:` in the errors).

Usage: check.py FILE_OR_DIR...            every manifest must pass
       check.py --expect-refused FILE...  every file must be refused, with each `&&`-separated substring of its
                                          first line `# expect: A && B` in the errors
"""

import importlib
import pathlib
import sys

import cloudcoil.pydantic
import pydantic
import yaml

# Before any model module is imported: every model class inherits this config when it is created.
cloudcoil.pydantic.BaseModel.model_config["extra"] = "forbid"

KINDS = {
    "networking.istio.io/v1alpha3/EnvoyFilter": ("cloudcoil.models.istio.networking.v1alpha3", "EnvoyFilter"),
    "networking.istio.io/v1/DestinationRule": ("cloudcoil.models.istio.networking.v1", "DestinationRule"),
    "networking.istio.io/v1/VirtualService": ("cloudcoil.models.istio.networking.v1", "VirtualService"),
    "networking.istio.io/v1/Gateway": ("cloudcoil.models.istio.networking.v1", "Gateway"),
    "security.istio.io/v1/AuthorizationPolicy": ("cloudcoil.models.istio.security.v1", "AuthorizationPolicy"),
    "v1/Service": ("cloudcoil.models.kubernetes.core.v1", "Service"),
    "v1/ServiceAccount": ("cloudcoil.models.kubernetes.core.v1", "ServiceAccount"),
    "v1/ConfigMap": ("cloudcoil.models.kubernetes.core.v1", "ConfigMap"),
    "apps/v1/Deployment": ("cloudcoil.models.kubernetes.apps.v1", "Deployment"),
}
# A resource's own top level: the Resource base class accepts any key, so these are checked here.
TOP_LEVEL = {"apiVersion", "kind", "metadata", "spec"}
# Kinds whose top level differs: a ConfigMap has no spec, a ServiceAccount neither.
TOP_LEVEL_OF = {
    "v1/ConfigMap": {"apiVersion", "kind", "metadata", "data", "binaryData", "immutable"},
    "v1/ServiceAccount": {"apiVersion", "kind", "metadata", "automountServiceAccountToken", "imagePullSecrets", "secrets"},
}


def files(args):
    out = []
    for a in args:
        p = pathlib.Path(a)
        out.extend(sorted(x for x in p.iterdir() if x.suffix in (".yaml", ".yml")) if p.is_dir() else [p])
    return out


def where(loc):
    return ".".join(str(part) for part in loc)


def check(path):
    """Every error of one file, each naming the file, the document and the field."""
    errors = []
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    if not docs:
        errors.append(f"{path}: no document")
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            errors.append(f"{path}[{i}]: not a mapping")
            continue
        key = f"{doc.get('apiVersion')}/{doc.get('kind')}"
        if key not in KINDS:
            errors.append(f"{path}[{i}]: unknown apiVersion/kind {key}")
            continue
        module, name = KINDS[key]
        model = getattr(importlib.import_module(module), name)
        top = TOP_LEVEL_OF.get(key, TOP_LEVEL)
        for extra in sorted(set(doc) - top):
            errors.append(f"{path}[{i}] {name}: field check: unknown field {extra!r} at the top level")
        body = {k: v for k, v in doc.items() if k in top}
        try:
            model.model_validate(body, strict=True, by_alias=True, by_name=False)
        except pydantic.ValidationError as e:
            for err in e.errors():
                kind = "field check: unknown field" if err["type"] == "extra_forbidden" else "schema:"
                errors.append(f"{path}[{i}] {name}: {kind} {where(err['loc'])}: {err['msg']}")
    return errors


def main(argv):
    expect_refused = bool(argv) and argv[0] == "--expect-refused"
    paths = files(argv[1:] if expect_refused else argv)
    if not paths:
        print("istio-check: no manifest given", file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        errs = check(path)
        if not expect_refused:
            if errs:
                failed += 1
                for e in errs:
                    print(f"FAIL {e}", file=sys.stderr)
            else:
                print(f"ok   {path}")
            continue
        first = path.read_text().split("\n", 1)[0]
        wants = [w.strip() for w in first.removeprefix("# expect:").split("&&") if w.strip()]
        if not first.startswith("# expect:"):
            wants = []
        text = "\n".join(errs)
        missing = [w for w in wants if w not in text]
        if not errs or not wants or missing:
            failed += 1
            got = text or "(accepted)"
            print(f"FAIL {path}: expected refusal with [{' && '.join(wants)}]; got:\n{got}", file=sys.stderr)
        else:
            print(f"ok   {path} refused: {errs[0]}")
    print(f"{len(paths) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
