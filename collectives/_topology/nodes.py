"""Where each rank sits for ``hierarchical``: nodes, local ranks, and which parts of a
message each rank carries across nodes. Pure functions of the layout, no communicator.

A message is cut into ``widest`` parts, one per *slot*, where ``widest`` is the largest
node's number of ranks. On a node of that size, local rank l carries slot l across nodes;
on a smaller node of n ranks, local rank l carries slots l, l + n, l + 2n... So every node
has one carrier for every slot, and the carriers of a slot, one per node, form the
communicator that reduces it across nodes. On equal nodes each rank carries one slot, its
own local rank.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from .._errors import InvalidArgumentError

RANKS_PER_NODE = "COLLECTIVES_RANKS_PER_NODE"


def node_layout(keys: Sequence[int]) -> list[list[int]]:
    """Ranks grouped by node: ``keys[r]`` names rank r's node; nodes are listed by their
    lowest rank, the ranks of each in rank order.

    Example:
        >>> node_layout([0, 0, 1, 1])          # COLLECTIVES_RANKS_PER_NODE=2, 4 ranks
        [[0, 1], [2, 3]]
        >>> node_layout([5, 9, 5, 9])          # two hosts, ranks placed round-robin
        [[0, 2], [1, 3]]
    """
    nodes: dict[int, list[int]] = {}
    for rank, key in enumerate(keys):
        nodes.setdefault(key, []).append(rank)
    return sorted(nodes.values(), key=lambda ranks: ranks[0])


def emulated_keys(size: int, ranks_per_node: int) -> list[int]:
    """Node keys that make consecutive groups of ``ranks_per_node`` ranks one node each (the
    last one smaller where ``ranks_per_node`` does not divide ``size``).

    Example: ``emulated_keys(5, 2) == [0, 0, 1, 1, 2]``.
    """
    return [rank // ranks_per_node for rank in range(size)]


def ranks_per_node_from_env() -> int | None:
    """``COLLECTIVES_RANKS_PER_NODE`` as a positive int, None where unset or empty."""
    text = os.environ.get(RANKS_PER_NODE, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise InvalidArgumentError(
            f"hierarchical: {RANKS_PER_NODE} must be a positive integer, got {text!r}"
        )
    return int(text)


@dataclass(frozen=True)
class NodeLayout:
    """The nodes (lists of ranks) and this rank's place among them.

    Example (5 ranks, 2 per node, this rank 4: the last node has one rank):
        >>> layout = NodeLayout([[0, 1], [2, 3], [4]], node=2, local=0)
        >>> layout.widest, layout.slots_per_rank, layout.served
        (2, 2, [0, 1])
    """

    nodes: list[list[int]]
    node: int
    local: int

    @property
    def size(self) -> int:
        return sum(len(ranks) for ranks in self.nodes)

    @property
    def widest(self) -> int:
        """Ranks of the largest node: the number of slots."""
        return max(len(ranks) for ranks in self.nodes)

    @property
    def even(self) -> bool:
        return all(len(ranks) == self.widest for ranks in self.nodes)

    @property
    def node_size(self) -> int:
        return len(self.nodes[self.node])

    @property
    def slots_per_rank(self) -> int:
        """Rows each rank of this node holds for the slots it carries (the last may be
        unused where the node's size does not divide ``widest``)."""
        return math.ceil(self.widest / self.node_size)

    @property
    def served(self) -> list[int]:
        """The slots this rank carries across nodes, in order: row j holds slot
        ``local + j * node_size``.

        Example: local rank 1 of a node of 2 ranks, nodes up to 5 ranks: ``[1, 3]``.
        """
        return list(range(self.local, self.widest, self.node_size))

    def slot_rows(self) -> list[int]:
        """The slot that each row of this node's arrangement holds, local rank major: row
        ``l * slots_per_rank + j`` holds slot ``l + j * node_size``, or ``widest`` (an unused
        row) past the last slot.

        Example: a node of 2 ranks, nodes up to 3: ``[0, 2, 1, 3]`` (row 3 unused).
        """
        rows, n = self.slots_per_rank, self.node_size
        return [
            min(local + j * n, self.widest) for local in range(n) for j in range(rows)
        ]  # fmt: skip

    def slot_positions(self) -> list[int]:
        """Inverse of :meth:`slot_rows`: the row that holds each slot.

        Example: a node of 2 ranks, nodes up to 3: ``[0, 2, 1]``.
        """
        return [(s % self.node_size) * self.slots_per_rank + s // self.node_size
                for s in range(self.widest)]  # fmt: skip

    def block_rows(self) -> list[int]:
        """For reduce_scatter and all_gather, the rank whose block each row of this node's
        arrangement holds: row ``(l * slots_per_rank + j) * nodes + a`` holds the block of
        the rank of slot ``l + j * node_size`` on node a, or ``size`` (an unused row) where
        node a has no such rank.

        Example: ``NodeLayout([[0, 1], [2, 3]], 0, 0).block_rows() == [0, 2, 1, 3]``;
        ``NodeLayout([[0, 1], [2]], 1, 0).block_rows() == [0, 2, 1, 3]`` (row 3 unused).
        """
        size, n, rows = self.size, self.node_size, self.slots_per_rank
        blocks = []
        for local in range(n):
            for j in range(rows):
                slot = local + j * n
                for ranks in self.nodes:
                    blocks.append(ranks[slot] if slot < len(ranks) else size)
        return blocks
