"""Round checkpoints made smaller to carry between GPU loans: each tensor's bytes laid out as byte planes.

A round checkpoint (pflbench/storage/checkpoint.py) is one header line, then a torch.save zip whose tensor
storages are stored uncompressed. Float32 weights compress poorly as they are. Laid out as four planes
(every value's first byte, then every second byte, ...), the sign-and-exponent bytes sit together and
compress better (a 100-client cell's checkpoint: docs/inflight.md).

`to_planes` rearranges the bytes of every stored tensor entry of the zip, in place; `from_planes` puts
them back. Nothing else in the file moves (headers, pickle, central directory), so the pair is a
bijection on the file's bytes: the checkpoint that comes back is the one that left, byte for byte, and
its header's SHA-256 says so (`column.unpack` checks it).
"""
from __future__ import annotations

import io
import struct
import zipfile

import numpy as np

from pflbench.storage.checkpoint import decode_header

WIDTH = 4  # bytes a value: float32, the weights' type (other storages are rearranged alike, and put back)
LOCAL_HEADER = b"PK\x03\x04"


def storage_ranges(body: bytes) -> list[tuple[int, int]]:
    """(start, length) in `body`, a torch.save zip, of each stored (uncompressed) tensor entry's data."""
    ranges = []
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        for info in archive.infolist():
            if "/data/" not in info.filename or info.compress_type != zipfile.ZIP_STORED:
                continue
            offset = info.header_offset
            if body[offset:offset + 4] != LOCAL_HEADER:
                raise ValueError(f"{info.filename}: no local file header at {offset}")
            name_length, extra_length = struct.unpack("<HH", body[offset + 26:offset + 30])
            ranges.append((offset + 30 + name_length + extra_length, info.file_size))
    return ranges


def _transform(data: bytes, planes: bool) -> bytes:
    end = decode_header(data)["header_bytes"]  # the checkpoint's header line (CheckpointProblem if none); the zip follows
    out = bytearray(data)
    for start, length in storage_ranges(data[end:]):
        start += end
        whole = length // WIDTH * WIDTH  # a tail shorter than a value stays as it is
        block = np.frombuffer(data, np.uint8, whole, start)
        block = block.reshape(-1, WIDTH).T if planes else block.reshape(WIDTH, -1).T
        out[start:start + whole] = block.tobytes()
    return bytes(out)


def to_planes(checkpoint: bytes) -> bytes:
    """A checkpoint file's bytes with each stored tensor's bytes as WIDTH planes."""
    return _transform(checkpoint, planes=True)


def from_planes(data: bytes) -> bytes:
    """The checkpoint file's bytes that `to_planes` was given."""
    return _transform(data, planes=False)
