"""The node layout of ``col.hierarchical``: pure functions, no communicator.

White-box on purpose (one of the few test modules that import private names): unit tests of
the pure layout module ``_nodes``, over every world of 1 to 8 ranks and every node size,
where a test job runs a few sizes only (tests/spmd/test_hierarchical.py checks the results
of the view at 3 and 4 ranks against the flat calls).
"""

from __future__ import annotations

import pytest

import collectives as col
from collectives._topology.nodes import NodeLayout, emulated_keys, node_layout


def test_emulated_nodes_are_consecutive_groups():
    assert node_layout(emulated_keys(4, 2)) == [[0, 1], [2, 3]]
    assert node_layout(emulated_keys(6, 3)) == [[0, 1, 2], [3, 4, 5]]
    assert node_layout(emulated_keys(3, 1)) == [[0], [1], [2]]
    assert node_layout(emulated_keys(5, 2)) == [[0, 1], [2, 3], [4]]


def test_nodes_from_keys_are_listed_by_their_lowest_rank():
    assert node_layout([7, 3, 7, 3]) == [[0, 2], [1, 3]]  # round-robin placement
    assert node_layout([1, 1, 1]) == [[0, 1, 2]]


def test_equal_nodes_carry_one_slot_each():
    for node, local in ((0, 0), (0, 1), (1, 0), (1, 1)):
        layout = NodeLayout([[0, 1], [2, 3]], node, local)
        assert layout.even and layout.widest == 2 and layout.slots_per_rank == 1
        assert layout.served == [local]
        assert layout.slot_rows() == layout.slot_positions() == [0, 1]
        assert layout.block_rows() == [0, 2, 1, 3]  # local rank major, node minor


def test_round_robin_placement_needs_no_reordering():
    assert NodeLayout([[0, 2], [1, 3]], 0, 0).block_rows() == [0, 1, 2, 3]


def test_a_smaller_node_carries_the_missing_slots():
    # nodes of 3 and 2 ranks: on the node of 2, local rank 0 carries slots 0 and 2
    small = [NodeLayout([[0, 1, 2], [3, 4]], 1, local) for local in (0, 1)]
    assert [s.served for s in small] == [[0, 2], [1]]
    assert small[0].slots_per_rank == 2 and not small[0].even
    assert small[0].slot_rows() == [0, 2, 1, 3]  # row 3 (slot 3 = widest) unused
    assert small[0].slot_positions() == [0, 2, 1]
    # rows (local, j, node): slot 0 -> ranks 0, 3; slot 2 -> rank 2, none (5); slot 1 ->
    # ranks 1, 4; the unused row -> none, none
    assert small[0].block_rows() == [0, 3, 2, 5, 1, 4, 5, 5]
    big = NodeLayout([[0, 1, 2], [3, 4]], 0, 2)
    assert big.served == [2] and big.slots_per_rank == 1
    assert big.block_rows() == [0, 3, 1, 4, 2, 5]
    alone = NodeLayout([[0, 1], [2]], 1, 0)
    assert alone.served == [0, 1] and alone.block_rows() == [0, 2, 1, 3]


def test_every_block_appears_once_in_every_layout():
    for size in range(1, 9):
        for k in range(1, size + 1):
            nodes = node_layout(emulated_keys(size, k))
            for node, ranks in enumerate(nodes):
                for local in range(len(ranks)):
                    layout = NodeLayout(nodes, node, local)
                    rows = layout.block_rows()
                    assert sorted(r for r in rows if r < size) == list(range(size))
                    slots = layout.slot_rows()
                    assert sorted(s for s in slots if s < layout.widest) == list(
                        range(layout.widest)
                    )
                    positions = layout.slot_positions()
                    assert [slots[p] for p in positions] == list(range(layout.widest))


def test_ranks_per_node_from_the_environment(monkeypatch):
    with col.init("mpi", timeout=30) as comm:
        for told in (None, " 4 ", "1"):
            if told is None:
                monkeypatch.delenv("COLLECTIVES_RANKS_PER_NODE", raising=False)
            else:
                monkeypatch.setenv("COLLECTIVES_RANKS_PER_NODE", told)
            with col.hierarchical(comm) as view:
                assert (view.nodes, view.local_size) == (1, 1)
        for bad in ("0", "-2", "x", "1.5"):
            monkeypatch.setenv("COLLECTIVES_RANKS_PER_NODE", bad)
            with pytest.raises(col.InvalidArgumentError, match="must be a positive integer"):
                col.hierarchical(comm)
