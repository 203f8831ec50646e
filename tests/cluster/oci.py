"""OCI images assembled from directories, without Docker and without a registry.

Why: the real node (tests/cluster/realnode.py) runs pods in containerd, which needs
images, but there is no Docker engine here and no image registry is reachable. An OCI
image is only a few JSON documents and some tar files, so tests/cluster/build-images.sh
prepares root filesystems (debootstrap, pip, gcc) and this module turns directories into
layers, writes the config and manifest, and streams one image at a time into
containerd (``ctr images import``).

Layout: one content-addressed blob store for all images (``ROOT/blobs/sha256/<hex>``,
so the Debian base layer the operator and engine images share is stored once) and
``ROOT/images.json``, image reference -> manifest digest plus the hash of the inputs it
was built from (``--inputs``), which is what makes a rebuild a no-op. Layers are plain,
uncompressed tars (``application/vnd.oci.image.layer.v1.tar``): nothing is pushed
anywhere, and gzip over the engine's gigabytes of wheels would only cost minutes.

Standard library only: build-images.sh runs it with whatever ``python3`` is on PATH.

    python3 tests/cluster/oci.py layer ROOT DIR [--dest PATH] [--exclude PATTERN]...
        -> prints the layer's digest
    python3 tests/cluster/oci.py image ROOT REF --layer DIGEST... --config JSON --inputs H
        -> prints the manifest digest
    python3 tests/cluster/oci.py current ROOT REF --inputs H   (exit 0: up to date)
    python3 tests/cluster/oci.py gc ROOT                       (drop unreferenced blobs)
    python3 tests/cluster/oci.py version                       (LAYOUT_VERSION)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
NAME_ANNOTATION = "io.containerd.image.name"  # the full reference containerd stores
REF_ANNOTATION = "org.opencontainers.image.ref.name"
CHUNK = 1 << 20
# Part of every image's input hash (build-images.sh): bump it when a change here alters
# the blobs written, so cached images are rebuilt; other edits here rebuild nothing.
LAYOUT_VERSION = 1


@dataclass(frozen=True)
class Blob:
    digest: str  # "sha256:<hex>"
    size: int

    def descriptor(self, media_type: str) -> dict[str, Any]:
        return {"mediaType": media_type, "digest": self.digest, "size": self.size}


class Store:
    """The blob store and image index under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)

    @property
    def index_path(self) -> Path:
        return self.root / "images.json"

    def blob_path(self, digest: str) -> Path:
        algo, _, hexdigest = digest.partition(":")
        return self.root / "blobs" / algo / hexdigest

    def images(self) -> dict[str, dict[str, str]]:
        """reference -> {"manifest": digest, "inputs": hash}."""
        if not self.index_path.is_file():
            return {}
        data: dict[str, dict[str, str]] = json.loads(self.index_path.read_text())
        return data

    def image(self, ref: str) -> dict[str, str] | None:
        return self.images().get(ref)

    def current(self, ref: str, inputs: str) -> bool:
        """Whether ``ref`` was built from these inputs and all its blobs are still here."""
        entry = self.image(ref)
        if entry is None or entry.get("inputs") != inputs:
            return False
        return all(self.blob_path(d).is_file() for d in self.digests(entry["manifest"]))

    def digests(self, manifest_digest: str) -> list[str]:
        """The manifest, its config and its layers (empty if the manifest is missing)."""
        path = self.blob_path(manifest_digest)
        if not path.is_file():
            return []
        manifest = json.loads(path.read_text())
        layers = [layer["digest"] for layer in manifest["layers"]]
        return [manifest_digest, manifest["config"]["digest"], *layers]

    def put_bytes(self, data: bytes) -> Blob:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        path = self.blob_path(digest)
        if not path.is_file():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.rename(path)
        return Blob(digest, len(data))

    def put_json(self, doc: dict[str, Any]) -> Blob:
        return self.put_bytes(json.dumps(doc, indent=2, sort_keys=True).encode())

    def put_layer(self, source: Path, dest: str = "", exclude: Sequence[str] = ()) -> Blob:
        """Tar ``source`` (its contents land at ``dest`` inside the image) into a blob.

        GNU tar does the archiving: it keeps owners numerically, hard links, xattrs and
        device files, and is several times faster than Python's tarfile on gigabytes.
        Symbolic link targets are never rewritten (flag S), hard link targets are."""
        argv = ["tar", "--create", "--file=-", "--numeric-owner", "--sort=name", "--xattrs"]
        argv += [f"--exclude={pattern}" for pattern in exclude]
        prefix = dest.strip("/")
        if prefix:
            argv.append(f"--transform=s,^\\.,{prefix},S")
        argv += ["-C", str(source), "."]
        tmp = self.root / "blobs" / f"layer-{os.getpid()}.tmp"
        sha, size = hashlib.sha256(), 0
        with tmp.open("wb") as out, subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
            assert proc.stdout is not None
            while chunk := proc.stdout.read(CHUNK):
                sha.update(chunk)
                out.write(chunk)
                size += len(chunk)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"tar of {source} failed with exit {proc.returncode}")
        blob = Blob("sha256:" + sha.hexdigest(), size)
        tmp.rename(self.blob_path(blob.digest))
        return blob

    def blob(self, digest: str) -> Blob:
        path = self.blob_path(digest)
        if not path.is_file():
            raise FileNotFoundError(f"blob {digest} is not in {self.root}")
        return Blob(digest, path.stat().st_size)

    def put_image(
        self, ref: str, layers: Sequence[str], config: dict[str, Any], inputs: str
    ) -> Blob:
        """Write the image config and manifest for ``layers`` and record ``ref``.

        ``config`` is the OCI config's ``config`` object (Entrypoint, Cmd, Env, User,
        WorkingDir, ExposedPorts); uncompressed layers are their own diff IDs."""
        blobs = [self.blob(d) for d in layers]
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [b.digest for b in blobs]},
            "history": [{"created_by": "tests/cluster/build-images.sh"} for _ in blobs],
        }
        config_blob = self.put_json(image_config)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": config_blob.descriptor(CONFIG),
            "layers": [b.descriptor(LAYER) for b in blobs],
        }
        manifest_blob = self.put_json(manifest)
        images = self.images()
        images[ref] = {"manifest": manifest_blob.digest, "inputs": inputs}
        tmp = self.index_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(images, indent=2, sort_keys=True) + "\n")
        tmp.rename(self.index_path)
        return manifest_blob

    def gc(self, keep: Iterable[str] = ()) -> list[str]:
        """Delete blobs no recorded image references (old builds) and not in ``keep``;
        return their digests."""
        images = self.images().values()
        kept = {*keep, *(d for e in images for d in self.digests(e["manifest"]))}
        removed = []
        for path in (self.root / "blobs" / "sha256").iterdir():
            digest = f"sha256:{path.name}"
            if digest not in kept:
                path.unlink()
                removed.append(digest)
        return removed

    # ---------------------------------------------------------------- containerd

    def import_into(self, ref: str, ctr: Sequence[str], namespace: str = "k8s.io") -> str:
        """Stream ``ref`` as an OCI archive into ``ctr -n namespace images import -``.

        ``ctr`` is the command prefix with its address (``["ctr", "--address", SOCK]``).
        Only this image's blobs travel; containerd stores and unpacks them (overlayfs)."""
        entry = self.image(ref)
        if entry is None:
            raise KeyError(f"no image {ref} in {self.root}: run tests/cluster/build-images.sh")
        manifest = self.blob(entry["manifest"])
        tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
        descriptor = manifest.descriptor(MANIFEST)
        descriptor["annotations"] = {NAME_ANNOTATION: ref, REF_ANNOTATION: tag}
        with tempfile.TemporaryDirectory(prefix="oci-import-") as tmp:
            head = Path(tmp)
            (head / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
            index = {"schemaVersion": 2, "manifests": [descriptor]}
            (head / "index.json").write_text(json.dumps(index))
            blobs = [f"blobs/sha256/{d.partition(':')[2]}" for d in self.digests(manifest.digest)]
            tar = ["tar", "--create", "--file=-", "-C", tmp, "oci-layout", "index.json"]
            tar += ["-C", str(self.root), *blobs]
            cmd = [*ctr, "-n", namespace, "images", "import", "-"]
            with subprocess.Popen(tar, stdout=subprocess.PIPE) as producer:
                done = subprocess.run(cmd, stdin=producer.stdout, capture_output=True, text=True)
            if producer.returncode != 0 or done.returncode != 0:
                raise RuntimeError(f"import of {ref} failed: {done.stderr.strip()}")
        return manifest.digest


def imported_digests(ctr: Sequence[str], namespace: str = "k8s.io") -> dict[str, str]:
    """reference -> manifest digest of the images containerd has in ``namespace``."""
    out = subprocess.run(
        [*ctr, "-n", namespace, "images", "ls"], capture_output=True, text=True, check=True
    ).stdout
    result = {}
    for line in out.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3:
            result[fields[0]] = fields[2]
    return result


def ensure_imported(
    store: Store, refs: Iterable[str], ctr: Sequence[str], namespace: str = "k8s.io"
) -> list[str]:
    """Import each ref whose manifest containerd does not already hold under that name;
    return the refs imported. A warm node imports nothing."""
    have = imported_digests(ctr, namespace)
    imported = []
    for ref in refs:
        entry = store.image(ref)
        if entry is None:
            raise KeyError(f"no image {ref} in {store.root}: run tests/cluster/build-images.sh")
        if have.get(ref) != entry["manifest"]:
            store.import_into(ref, ctr, namespace)
            imported.append(ref)
    if imported:
        prune_stale(store, ctr, namespace)
    return imported


def prune_stale(store: Store, ctr: Sequence[str], namespace: str = "k8s.io") -> list[str]:
    """Remove the image records that still hold an earlier build's layers: containerd's
    CRI names every image it sees by ID too (``sha256:<config>``), so a re-imported tag
    leaves its old version referenced there. containerd's GC then frees the content and
    snapshots. Returns the references removed."""
    current = {e["manifest"] for e in store.images().values()}
    stale = [
        ref
        for ref, digest in imported_digests(ctr, namespace).items()
        if ref.startswith("sha256:") and digest not in current
    ]
    if stale:
        subprocess.run([*ctr, "-n", namespace, "images", "rm", *stale], capture_output=True)
    return stale


def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="oci.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    layer = sub.add_parser("layer", help="tar a directory into a layer blob")
    layer.add_argument("root", type=Path)
    layer.add_argument("source", type=Path)
    layer.add_argument("--dest", default="", help="where the directory lands in the image")
    layer.add_argument("--exclude", action="append", default=[])
    image = sub.add_parser("image", help="write config + manifest, record the reference")
    image.add_argument("root", type=Path)
    image.add_argument("ref")
    image.add_argument("--layer", action="append", default=[], required=True)
    image.add_argument("--config", required=True, help="the OCI config's `config` as JSON")
    image.add_argument("--inputs", required=True, help="hash of what the image is built from")
    current = sub.add_parser("current", help="exit 0 if REF is built from these inputs")
    current.add_argument("root", type=Path)
    current.add_argument("ref")
    current.add_argument("--inputs", required=True)
    sub.add_parser("version", help="print LAYOUT_VERSION")
    gc = sub.add_parser("gc", help="delete blobs no image references")
    gc.add_argument("root", type=Path)
    gc.add_argument("--keep", action="append", default=[], help="a digest to keep")
    args = parser.parse_args(argv)
    if args.cmd == "version":
        print(LAYOUT_VERSION)
        return 0
    store = Store(args.root)
    if args.cmd == "layer":
        print(store.put_layer(args.source, args.dest, args.exclude).digest)
    elif args.cmd == "image":
        config = json.loads(args.config)
        print(store.put_image(args.ref, args.layer, config, args.inputs).digest)
    elif args.cmd == "current":
        return 0 if store.current(args.ref, args.inputs) else 1
    elif args.cmd == "gc":
        print(f"removed {len(store.gc(args.keep))} unreferenced blob(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
