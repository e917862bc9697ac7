"""The data on every node (pflbench/run/node_data.py): a worker on another node than the driver's runs a
cell only on the driver's dataset and partition; otherwise one message names the node and the path,
and no download is tried."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from cells import small_cell
from pflbench.run.node_data import NodeDataError, check_node_data, fingerprint
from pflbench.simulator.rounds import prepare_cell

NODE = "node-b (10.213.45.2)"


@pytest.fixture
def driver(tmp_path):
    """A Synthetic cell prepared by 'the driver' in its data root, and its fingerprint."""
    cell = small_cell()
    dataset, splits = prepare_cell(cell, tmp_path / "driver-data")
    return cell, fingerprint(dataset, splits, tmp_path / "driver-data", None, "node-a")


def test_a_node_with_the_drivers_data_passes_and_a_missing_partition_is_made_there_and_verified(driver, tmp_path):
    cell, expected = driver
    elsewhere = replace(expected, data_root=str(tmp_path / "node-b-data"))  # this node has no partition cache
    check_node_data(cell, elsewhere, NODE)
    assert list((tmp_path / "node-b-data" / "cache" / "partitions").glob("*.npz"))
    check_node_data(cell, elsewhere, NODE)  # from its cache now


def test_a_node_without_a_file_dataset_fails_naming_the_node_and_the_paths_and_downloads_nothing(tmp_path, monkeypatch):
    from pflbench.data.sources import FileSource

    def no_download(self, root, download):
        raise AssertionError(f"decode({root}, download={download}) was called on the node")

    monkeypatch.setattr(FileSource, "decode", no_download)
    for subclass in FileSource.__subclasses__():
        monkeypatch.setattr(subclass, "decode", no_download, raising=False)
    cell = small_cell(dataset="fmnist", dataset_options={})
    expected = fingerprint(
        type("D", (), {"name": "fmnist", "checksum": "sha256:driver"})(),
        type("S", (), {"train": [], "val": [], "test": []})(),
        tmp_path / "data",
        None,
        "node-a (10.213.45.1)",
    )
    with pytest.raises(NodeDataError) as error:
        check_node_data(cell, expected, NODE)
    message = str(error.value)
    assert message.startswith(f"node {NODE} has no copy of dataset 'fmnist' (looked at {tmp_path / 'data'}")
    assert "the driver (node-a (10.213.45.1)) has it, checksum sha256:driver" in message
    assert "never downloads" in message and "\n" not in message


def test_another_copy_of_the_dataset_or_another_partition_fails_naming_both(driver):
    cell, expected = driver
    with pytest.raises(
        NodeDataError,
        match=rf"node {re.escape(NODE)} has another copy of dataset 'synthetic' under .*driver-data: "
        rf"checksum {expected.checksum}, the driver's \(node-a\) is sha256:other",
    ):
        check_node_data(cell, replace(expected, checksum="sha256:other"), NODE)
    with pytest.raises(
        NodeDataError,
        match=r"makes another partition of 'synthetic' .*driver's sha256:other; "
        r"partition cache .*driver-data/cache/partitions",
    ):
        check_node_data(cell, replace(expected, partition="sha256:other"), NODE)
