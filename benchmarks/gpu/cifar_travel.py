"""cifar10-jpeg to a lent GPU: its JPEG files in one compact file under the carry's room, rebuilt there byte
for byte and checked against what the loader decodes here.

The mirror's cifar10-jpeg.zip is 53 MB, too much beside the tree and the kit on a 64 MiB carry. Its 60000
JPEG files share one 609-byte header and differ in ~310 bytes of scan data each, so the files' bytes, laid end
to end and compressed with xz, make 18.1 MB (`pack` prints the figure). The decoded tensors themselves (60000
x 32 x 32 x 3 bytes) do not fit: `pack --measure-decoded` compresses them too, for the record.

- `pack --mirror DIR --out FILE`: FILE (a tar: manifest.json, names.xz, blob.xz) from DIR/cifar10-jpeg.zip;
  the manifest holds every file's name and length, the blob's SHA-256, and what pflbench's loader decodes
  from the mirror here: the dataset checksum (over the files' names and bytes) and the SHA-256 of the decoded
  inputs, labels and source splits.
- `unpack --pack FILE --mirror DIR [--check]`: DIR/cifar10-jpeg/{train,test}/CLASS/*.jpg, the loader's
  folder layout in a mirror, byte for byte (the blob's SHA-256 checked); with `--check`, pflbench's loader
  then decodes them (through PFLBENCH_DATA's cache, as a cell does) and the dataset checksum and the decoded
  tensors' SHA-256 must be the ones recorded here (a device whose JPEG decoder rounds otherwise fails here,
  instead of giving a cifar10-jpeg cell other pixels under the same name).

    python benchmarks/gpu/cifar_travel.py pack --mirror ../shared/data --out .gpu-kit-cifar/data/cifar10-jpeg.travel
    PFLBENCH_GPU_KIT=.gpu-kit-cifar bash benchmarks/gpu/in_kit.sh python3 benchmarks/gpu/cifar_travel.py unpack \\
        --pack .gpu-kit-cifar/data/cifar10-jpeg.travel --check
"""
from __future__ import annotations

import argparse
import hashlib
import os
import io
import json
import lzma
import sys
import tarfile
import time
import zipfile
from pathlib import Path

FOLDER = "cifar10-jpeg"
ARCHIVE = "cifar10-jpeg.zip"


def decoded_digest(dataset) -> dict:
    """SHA-256 of what the loader decoded (inputs, labels, source splits, in order) and the dataset checksum."""
    digest = hashlib.sha256()
    for tensor in (dataset.inputs, dataset.labels, dataset.source_split):
        digest.update(tensor.contiguous().numpy().tobytes())
    return {"dataset_checksum": dataset.checksum, "decoded_sha256": digest.hexdigest(),
            "inputs_shape": list(dataset.inputs.shape), "inputs_bytes": dataset.inputs.numel()}


def load(mirror: Path, root: Path):
    from pflbench.data import load_dataset

    return load_dataset(FOLDER, root=root, mirror=mirror)


def pack(mirror: Path, out: Path, root: Path, measure_decoded: bool) -> dict:
    began = time.time()
    with zipfile.ZipFile(mirror / ARCHIVE) as z:
        members = [(info.filename, z.read(info)) for info in z.infolist() if not info.is_dir()]
    blob = b"".join(data for _, data in members)
    compressed = lzma.compress(blob, preset=6)
    names = lzma.compress(json.dumps([name for name, _ in members]).encode(), preset=6)
    packed_seconds = time.time() - began
    dataset = load(mirror, root)
    manifest = {"files": len(members), "lengths": [len(data) for _, data in members],
                "blob_sha256": hashlib.sha256(blob).hexdigest(), "blob_bytes": len(blob),
                "blob_xz_bytes": len(compressed), "pack_seconds": round(packed_seconds, 1),
                "source": f"{ARCHIVE} ({(mirror / ARCHIVE).stat().st_size} bytes)", **decoded_digest(dataset)}
    if measure_decoded:
        t = time.time()
        manifest["decoded_inputs_xz_bytes"] = len(lzma.compress(dataset.inputs.contiguous().numpy().tobytes(), preset=6))
        manifest["decoded_inputs_xz_seconds"] = round(time.time() - t, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as archive:
        for name, data in (("manifest.json", json.dumps(manifest).encode()), ("names.xz", names),
                           ("blob.xz", compressed)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    manifest["pack_bytes"] = out.stat().st_size
    return manifest


def unpack(pack_file: Path, mirror: Path) -> dict:
    began = time.time()
    with tarfile.open(pack_file) as archive:
        read = {name: archive.extractfile(name).read() for name in ("manifest.json", "names.xz", "blob.xz")}  # type: ignore[union-attr]
    manifest = json.loads(read["manifest.json"])
    names = json.loads(lzma.decompress(read["names.xz"]))
    blob = lzma.decompress(read["blob.xz"])
    if hashlib.sha256(blob).hexdigest() != manifest["blob_sha256"]:
        raise SystemExit(f"cifar_travel: {pack_file}'s files are not the ones packed (SHA-256 differs)")
    target = mirror / FOLDER
    offset = 0
    for name, length in zip(names, manifest["lengths"]):
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob[offset:offset + length])
        offset += length
    return {**manifest, "unpack_seconds": round(time.time() - began, 1), "folder": str(target)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--mirror", type=Path, required=True, help=f"the offline mirror holding {ARCHIVE}")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--root", type=Path, default=None, help="data root for the loader's cache (default: pflbench's)")
    p.add_argument("--measure-decoded", action="store_true", help="also xz the decoded inputs (minutes), for the record")
    u = sub.add_parser("unpack")
    u.add_argument("--pack", type=Path, required=True)
    u.add_argument("--mirror", type=Path, default=os.environ.get("PFLBENCH_DATA_MIRROR"),
                   help=f"where {FOLDER}/ is rebuilt, a mirror's layout (default: $PFLBENCH_DATA_MIRROR, which the kit sets)")
    u.add_argument("--check", action="store_true", help="decode with pflbench's loader and compare with the record")
    u.add_argument("--root", type=Path, default=None, help="data root for the loader's cache (default: pflbench's)")
    args = parser.parse_args(argv)
    if args.command == "pack":
        facts = pack(args.mirror, args.out, args.root, args.measure_decoded)
        facts.pop("lengths")
        print(json.dumps(facts, indent=1))
        return 0
    facts = unpack(args.pack, args.mirror)
    facts.pop("lengths")
    if args.check:
        began = time.time()
        here = decoded_digest(load(args.mirror, args.root))
        facts["check_seconds"] = round(time.time() - began, 1)
        facts["check"] = {key: (here[key], facts[key]) for key in ("dataset_checksum", "decoded_sha256")}
        facts["check_ok"] = all(a == b for a, b in facts["check"].values())
    print(json.dumps(facts, indent=1))
    if args.check and not facts["check_ok"]:
        print("cifar_travel: the loader here decodes other tensors than were recorded at pack time", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
