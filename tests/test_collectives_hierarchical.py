"""The node layout of ``col.hierarchical``: pure functions, no communicator."""

from __future__ import annotations

import pytest

from collectives import InvalidArgumentError
from collectives._hierarchical import (
    block_order,
    check_even,
    emulated_keys,
    node_layout,
    ranks_per_node_from_env,
)


def test_emulated_nodes_are_consecutive_groups():
    assert node_layout(emulated_keys(4, 2)) == [[0, 1], [2, 3]]
    assert node_layout(emulated_keys(6, 3)) == [[0, 1, 2], [3, 4, 5]]
    assert node_layout(emulated_keys(3, 1)) == [[0], [1], [2]]
    assert node_layout(emulated_keys(3, 2)) == [[0, 1], [2]]


def test_nodes_from_keys_are_listed_by_their_lowest_rank():
    assert node_layout([7, 3, 7, 3]) == [[0, 2], [1, 3]]  # round-robin placement
    assert node_layout([1, 1, 1]) == [[0, 1, 2]]


def test_block_order_is_local_rank_major():
    assert block_order([[0, 1], [2, 3]]) == [0, 2, 1, 3]
    assert block_order([[0, 2], [1, 3]]) == [0, 1, 2, 3]  # round robin: no reordering
    assert block_order([[0, 1, 2]]) == [0, 1, 2]
    assert block_order([[0], [1], [2]]) == [0, 1, 2]


def test_uneven_nodes_are_refused_with_their_sizes():
    check_even([[0, 1], [2, 3]], "test")
    with pytest.raises(InvalidArgumentError, match=r"node sizes \[2, 1\] \(test, 3 ranks\)"):
        check_even([[0, 1], [2]], "test")


def test_ranks_per_node_from_the_environment(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_RANKS_PER_NODE", raising=False)
    assert ranks_per_node_from_env() is None
    monkeypatch.setenv("COLLECTIVES_RANKS_PER_NODE", " 4 ")
    assert ranks_per_node_from_env() == 4
    for bad in ("0", "-2", "x", "1.5"):
        monkeypatch.setenv("COLLECTIVES_RANKS_PER_NODE", bad)
        with pytest.raises(InvalidArgumentError, match="must be a positive integer"):
            ranks_per_node_from_env()
