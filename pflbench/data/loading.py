"""Getting a dataset by name: from the cache, else the data root, else the mirror, else a download.

The order for a dataset read from files, every time:
1. `<root>/cache/<key>.pt` if it exists (decoded once, loaded in well under a second);
2. the files in torchvision's layout under the root; if they are missing and a mirror is
   configured that holds them, they are first placed there from the mirror (what `prepare` does);
3. torchvision's own download, when allowed (`download=True`; the default when no mirror is set);
4. otherwise DatasetNotFoundError, naming every place looked at and how to get the data.
Decoded files are written to the cache. Generated datasets are simply generated.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, cast

from pflbench.data.cache import cache_path, read_cache, write_cache
from pflbench.data.dataset import Dataset
from pflbench.data.locations import MIRROR_ENV, DatasetNotFoundError, data_mirror, data_root
from pflbench.data.sources import DATASETS, FileSource, GeneratedSource, make_source

log = logging.getLogger(__name__)


def load_dataset(
    name: str, *, root: str | Path | None = None, mirror: str | Path | None = None, **options: Any
) -> Dataset:
    """The dataset `name` with `options`, train and test merged into one pool.

    Raises UnknownNameError (a ValueError listing the names) for an unknown name, ValueError for a
    wrong option, DatasetNotFoundError when the files cannot be found or fetched.
    """
    source = make_source(name, options)
    if isinstance(source, GeneratedSource):
        return source.generate()
    dataset, _ = _load_files(cast(FileSource, source), data_root(root), data_mirror(mirror))
    return dataset


def prepare(
    names: list[str] | None = None, *, root: str | Path | None = None, mirror: str | Path | None = None
) -> list[str]:
    """Place each dataset's files from the mirror into the root and decode them into the cache.

    `names=None` prepares every file dataset that the root or the mirror holds (and says which
    were skipped); named datasets that cannot be found raise DatasetNotFoundError. Datasets are
    prepared with their default options (e.g. EMNIST's balanced split). Returns one line per step.
    """
    root_path, mirror_path = data_root(root), data_mirror(mirror)
    lines = []
    for name in names if names is not None else DATASETS.names():
        source = make_source(name, {})
        if isinstance(source, GeneratedSource):
            if names is not None:
                lines.append(f"{name}: generated on demand, nothing to prepare")
            continue
        files = cast(FileSource, source)  # not generated: it reads files (FileSource's interface)
        if names is None and not _obtainable_offline(files, root_path, mirror_path):
            lines.append(f"{name}: skipped, not in {root_path}" + (f" or {mirror_path}" if mirror_path else ""))
            continue
        started = time.perf_counter()
        dataset, steps = _load_files(files, root_path, mirror_path)
        lines.extend(steps)
        lines.append(
            f"{name}: ready, {len(dataset)} samples of shape {dataset.input_shape}, {dataset.num_classes} classes "
            f"({time.perf_counter() - started:.1f} s)"
        )
    return lines


def available(root: str | Path | None = None, mirror: str | Path | None = None) -> dict[str, bool]:
    """For every dataset name: whether it loads here without network with its default options
    (cached, in the root, in the mirror, or generated). Checks that files exist; decodes nothing."""
    root_path, mirror_path = data_root(root), data_mirror(mirror)
    result = {}
    for name in DATASETS.names():
        source = make_source(name, {})
        result[name] = isinstance(source, GeneratedSource) or _obtainable_offline(
            cast(FileSource, source), root_path, mirror_path
        )
    return result


def _obtainable_offline(source: FileSource, root: Path, mirror: Path | None) -> bool:
    return (
        cache_path(root, source.cache_key()).is_file()
        or source.present(root)
        or (mirror is not None and source.in_mirror(mirror))
    )


def _load_files(source: FileSource, root: Path, mirror: Path | None) -> tuple[Dataset, list[str]]:
    """The dataset via cache, root, mirror or download (see the module docstring), and the steps taken."""
    cache = cache_path(root, source.cache_key())
    cached = read_cache(cache)
    if cached is not None:
        return cached, [f"{source.name}: already cached in {cache}"]
    steps = []
    if not source.present(root) and mirror is not None and source.in_mirror(mirror):
        steps.append(source.place_from_mirror(mirror, root))
        log.info(steps[-1])
    present = source.present(root)
    download = source.options.get("download")
    if download is None:
        download = mirror is None
    if not present and not (download and source.downloadable):
        raise DatasetNotFoundError(_not_found_message(source, root, mirror))
    started = time.perf_counter()
    try:
        dataset = source.decode(root, download=not present)
    except (RuntimeError, OSError) as error:  # torchvision's "not found or corrupted", or a failed download
        reason = f"the files could not be read: {error}" if present else f"the download failed: {error}"
        raise DatasetNotFoundError(_not_found_message(source, root, mirror, reason)) from error
    write_cache(cache, dataset)
    steps.append(f"{source.name}: decoded in {time.perf_counter() - started:.1f} s, cached in {cache}")
    log.info(steps[-1])
    return dataset, steps


def _not_found_message(source: FileSource, root: Path, mirror: Path | None, reason: str | None = None) -> str:
    looked = [f"  {path}{'' if path.exists() else ' (missing)'}" for path in source.required_paths(root)]
    looked.append(f"  {cache_path(root, source.cache_key())} (decoded cache, missing)")
    if mirror is None:
        looked.append(f"  no mirror configured (${MIRROR_ENV} is not set)")
    else:
        looked += [f"  {path} (mirror{'' if path.exists() else ', missing'})" for path in source.mirror_paths(mirror)]
    how = (
        f"To get it: point ${MIRROR_ENV} (or `pflbench data prepare --from DIR`) at a folder DIR "
        f"holding {source.mirror_hint()}"
    )
    if source.downloadable:
        how += f", or run with internet access and the option download=True so torchvision downloads it into {root}"
    else:
        how += "; it cannot be downloaded"
    parts = [f"dataset {source.name!r} is not available here. Looked in:", *looked]
    if reason:
        parts.append(reason)
    parts.append(how + ".")
    return "\n".join(parts)
