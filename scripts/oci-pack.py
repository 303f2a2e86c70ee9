#!/usr/bin/env python3
"""Packs llmroute_filter.wasm as an OCI image layout, and checks one.

The image is the "oci" variant of the Wasm image spec (solo-io/wasm-image-spec), which Istio's wasm image
fetcher and Envoy Gateway both pull: an OCI manifest whose config has media type
application/vnd.module.wasm.config.v1+json and whose single layer is the raw module, media type
application/vnd.module.wasm.content.layer.v1+wasm. (The spec's "compat" variant is a tar.gz layer holding
plugin.wasm; this is not that.) The layout (oci-layout, index.json, blobs/sha256/...) is what
`oras cp --from-oci-layout DIR:TAG REGISTRY/REPO:TAG` or `crane push DIR REGISTRY/REPO:TAG` push.

Usage: oci-pack.py WASM OUT_DIR           write the layout (OUT_DIR is replaced)
       oci-pack.py --check WASM OUT_DIR   check digests, sizes and media types against WASM; exit 1 on a mismatch
Standard library only.
"""
import hashlib
import json
import os
import shutil
import sys

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.module.wasm.config.v1+json"
LAYER = "application/vnd.module.wasm.content.layer.v1+wasm"
TAG = "0.1.0"
# proxy-wasm Rust SDK 0.2 speaks ABI 0.2.1.
CONFIG_BODY = {"type": "envoy_proxy", "abiVersions": ["proxy_abi_version_0_2_1"], "config": {}}


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blob_path(out, d):
    return os.path.join(out, "blobs", "sha256", d.split(":", 1)[1])


def pack(wasm_path, out):
    with open(wasm_path, "rb") as f:
        wasm = f.read()
    if wasm[:4] != b"\0asm":
        sys.exit(f"{wasm_path}: not a wasm module (no \\0asm magic)")
    config = json.dumps(CONFIG_BODY, sort_keys=True, separators=(",", ":")).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": digest(config), "size": len(config)},
            "layers": [
                {
                    "mediaType": LAYER,
                    "digest": digest(wasm),
                    "size": len(wasm),
                    "annotations": {"org.opencontainers.image.title": "plugin.wasm"},
                }
            ],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": MANIFEST,
                "digest": digest(manifest),
                "size": len(manifest),
                "annotations": {"org.opencontainers.image.ref.name": TAG},
            }
        ],
    }
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "blobs", "sha256"))
    for data in (config, manifest, wasm):
        with open(blob_path(out, digest(data)), "wb") as f:
            f.write(data)
    with open(os.path.join(out, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f, indent=2)
    print(f"{out}: {TAG} -> {digest(manifest)} (layer {digest(wasm)}, {len(wasm)} bytes)")


def check(wasm_path, out):
    """Every problem found, as strings."""
    errs = []

    def blob(desc, media_type, what):
        if desc.get("mediaType") != media_type:
            errs.append(f"{what}: mediaType {desc.get('mediaType')!r}, want {media_type!r}")
        try:
            with open(blob_path(out, desc["digest"]), "rb") as f:
                data = f.read()
        except (OSError, KeyError, IndexError) as e:
            errs.append(f"{what}: blob missing: {e}")
            return b""
        if digest(data) != desc["digest"]:
            errs.append(f"{what}: blob digest {digest(data)} != descriptor {desc['digest']}")
        if len(data) != desc.get("size"):
            errs.append(f"{what}: blob size {len(data)} != descriptor {desc.get('size')}")
        return data

    try:
        with open(os.path.join(out, "oci-layout")) as f:
            if json.load(f).get("imageLayoutVersion") != "1.0.0":
                errs.append("oci-layout: imageLayoutVersion is not 1.0.0")
        with open(os.path.join(out, "index.json")) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        return [f"layout: {e}"]
    if index.get("schemaVersion") != 2 or len(index.get("manifests", [])) != 1:
        return ["index.json: want schemaVersion 2 and exactly one manifest"]
    manifest = json.loads(blob(index["manifests"][0], MANIFEST, "manifest") or b"{}")
    if manifest.get("schemaVersion") != 2:
        errs.append("manifest: schemaVersion is not 2")
    config = blob(manifest.get("config", {}), CONFIG, "config")
    if config and json.loads(config).get("type") != "envoy_proxy":
        errs.append("config: type is not envoy_proxy")
    layers = manifest.get("layers", [])
    if len(layers) != 1:
        errs.append(f"manifest: {len(layers)} layers, want exactly 1")
    else:
        with open(wasm_path, "rb") as f:
            wasm = f.read()
        if blob(layers[0], LAYER, "layer") != wasm:
            errs.append(f"layer: not the bytes of {wasm_path}")
    return errs


def main(argv):
    if len(argv) == 4 and argv[1] == "--check":
        errs = check(argv[2], argv[3])
        for e in errs:
            print(f"FAIL {argv[3]}: {e}", file=sys.stderr)
        print(f"{argv[3]}: {'ok' if not errs else 'broken'}: index, manifest, config and layer checked")
        return 1 if errs else 0
    if len(argv) == 3:
        pack(argv[1], argv[2])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
