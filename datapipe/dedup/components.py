"""Connected components across partitions in shuffle rounds, with no task gathering a node's
neighbourhood: alternating small-star / large-star (Kiveris et al. 2014, "Connected Components in
MapReduce and Beyond"), each step done as an aggregate and a join, as GraphFrames does for skewed
graphs, and finished components settled as soon as they are known whole.

Why not the textbook form: each star step there groups every edge of a node in one task, and the
steps end with each component a star around its lowest node, so one task holds the whole of the
largest component (a boilerplate page copied ten million times: ten million rows in one task).

Here every edge stays with the task that made it (its *holder*); nodes are represented only by
aggregates. A step is two rounds:

* holders send, per node of their edges, one partial row (lowest neighbour, highest neighbour) to
  the node's partition (``neighbour_partials``); there the partials are combined
  (``combine_partials``) and the node's aggregate is answered to each holder that asked, so a node
  receives one row per holder (at most the number of partitions), however many edges it has;
* holders then apply the step to each edge they hold, given its endpoints' aggregates
  (``star_step``), and keep the new edges. Both steps map each edge (and node) to new edges by
  the node aggregates alone, so the edge *set* after a step is Kiveris's whatever holder made
  which copy; a copy made by two holders is kept by both (min and max do not mind).

The same answers settle components (``star_checks``, ``settled``): an edge (c, v) passes when c has
no lower neighbour and v has exactly one neighbour, c; a node all of whose edges pass, at every
holder, is the centre of a star that is a whole component of this step's graph (it is closed under
adjacency), hence of the input graph. A star maps to itself under both steps, so the holders that
reported on it still hold it, and settle it when told.

Each node carries a ``rank`` (a float64 the survivor rule orders by; 0 for "earliest"), carried
along with its edges, so that a star's survivor (highest rank, then lowest id) is known where it
settles without asking for each member.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def node_partition(nodes: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of each node id: a splitmix64 mix, as row keys (shard << 32 | row) are not uniform."""
    x = nodes.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x % np.uint64(partitions)).astype(np.int32)


def _group_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Start index of each run of equal values in a sorted array (empty for an empty one)."""
    if len(sorted_keys) == 0:
        return np.empty(0, np.int64)
    start = np.ones(len(sorted_keys), dtype=bool)
    start[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return np.flatnonzero(start)


def distinct_edges(
    lo: np.ndarray, hi: np.ndarray, rlo: np.ndarray, rhi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Edges (lo < hi) without self-loops or repeats, sorted by (lo, hi); a node's rank is the same
    on every edge, so the ranks of repeats agree."""
    keep = lo != hi
    lo, hi, rlo, rhi = lo[keep], hi[keep], rlo[keep], rhi[keep]
    swap = lo > hi
    lo, hi = np.where(swap, hi, lo), np.where(swap, lo, hi)
    rlo, rhi = np.where(swap, rhi, rlo), np.where(swap, rlo, rhi)
    order = np.lexsort((hi, lo))
    lo, hi, rlo, rhi = lo[order], hi[order], rlo[order], rhi[order]
    first = np.ones(len(lo), dtype=bool)
    first[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    return lo[first], hi[first], rlo[first], rhi[first]


def neighbour_partials(
    lo: np.ndarray, hi: np.ndarray, rlo: np.ndarray, rhi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct node of a holder's edges: (node, lowest neighbour, its rank, highest neighbour)."""
    node = np.concatenate([lo, hi])
    nbr = np.concatenate([hi, lo])
    rank = np.concatenate([rhi, rlo])
    return combine_partials(node, nbr, rank, nbr)


def combine_partials(
    node: np.ndarray, low: np.ndarray, low_rank: np.ndarray, high: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Partials of the same nodes combined: per distinct node, the lowest ``low`` (with its rank) and
    the highest ``high``; sorted by node."""
    if len(node) == 0:
        empty = np.empty(0, np.int64)
        return empty, empty, np.empty(0, np.float64), empty
    order = np.lexsort((low, node))
    node_s, low_s = node[order], low[order]
    starts = _group_starts(node_s)
    top = np.maximum.reduceat(high[order], starts)
    return node_s[starts], low_s[starts], low_rank[order][starts], top


@dataclass(frozen=True)
class Aggregates:
    """The answered aggregates of the nodes a holder's edges touch: sorted ``node``, each one's lowest
    and highest neighbour and the lowest one's rank; ``settled`` nodes map to their survivor."""

    node: np.ndarray
    low: np.ndarray
    low_rank: np.ndarray
    high: np.ndarray

    def at(self, x: np.ndarray) -> np.ndarray:
        """Index of each of ``x`` in ``node`` (every one must be there: a holder asked for its nodes)."""
        i = np.searchsorted(self.node, x)
        if len(x) and (i.max() >= len(self.node) or not np.array_equal(self.node[i], x)):
            raise ValueError("an edge's node has no answered aggregate")
        return i

    def lowest(self, x: np.ndarray, rank_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The lowest of each node and its neighbours (Kiveris's m(x)), with its rank."""
        i = self.at(x)
        below = self.low[i] < x
        return np.where(below, self.low[i], x), np.where(below, self.low_rank[i], rank_x)


def star_step(
    lo: np.ndarray, hi: np.ndarray, rlo: np.ndarray, rhi: np.ndarray, agg: Aggregates, large: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One step applied to a holder's edges (lo < hi), as distinct edges.

    Large-star: each node u links its higher neighbours to m(u), the lowest of u and its neighbours;
    for an edge that is (hi, m(lo)). Small-star: each node u links its lower neighbours and itself to
    m(u); for an edge, (lo, m(hi)) and (hi, m(hi)) (hi has lo below it, so m(hi) is its lowest
    neighbour)."""
    if large:
        m, rm = agg.lowest(lo, rlo)
        return distinct_edges(m, hi, rm, rhi)
    m, rm = agg.lowest(hi, rhi)
    return distinct_edges(np.concatenate([m, m]), np.concatenate([lo, hi]), np.concatenate([rm, rm]), np.concatenate([rlo, rhi]))


def first_small_star(
    lo: np.ndarray, hi: np.ndarray, rlo: np.ndarray, rhi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Small-star over edges that include every lower neighbour of each of their higher ends (a
    holder that made all the edges of its nodes to lower ones): no aggregate is needed, each node's
    lowest lower neighbour is here. The first step, done where the edges are made."""
    if len(lo) == 0:
        return distinct_edges(lo, hi, rlo, rhi)
    order = np.lexsort((lo, hi))
    lo_s, hi_s = lo[order], hi[order]
    starts = _group_starts(hi_s)
    group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(hi_s)]))
    m, rm = lo_s[starts][group], rlo[order][starts][group]
    return distinct_edges(
        np.concatenate([m, m]), np.concatenate([lo_s, hi_s]), np.concatenate([rm, rm]), np.concatenate([rlo[order], rhi[order]])
    )


def best(key: np.ndarray, rank: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct ``group``, in sorted order: the key of highest rank (the lowest key among equals)
    and its rank: the survivor rule's order (``cluster.survivors``)."""
    if len(group) == 0:
        return group, key, rank
    order = np.lexsort((key, -rank, group))
    starts = _group_starts(group[order])
    return group[order][starts], key[order][starts], rank[order][starts]


def star_checks(
    lo: np.ndarray, hi: np.ndarray, rlo: np.ndarray, rhi: np.ndarray, agg: Aggregates
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct lower end c of a holder's edges: (c, whether every edge (c, v) here passes, the
    best of c and those v, its rank). An edge passes when c has no lower neighbour and v's only
    neighbour is c."""
    if len(lo) == 0:
        empty = np.empty(0, np.int64)
        return empty, np.empty(0, bool), empty, np.empty(0, np.float64)
    i, j = agg.at(lo), agg.at(hi)
    ok = (agg.low[i] > lo) & (agg.low[j] == lo) & (agg.high[j] == lo)
    order = np.argsort(lo, kind="stable")
    starts = _group_starts(lo[order])
    all_ok = np.logical_and.reduceat(ok[order], starts)
    centre, key, rank = best(np.concatenate([lo, hi]), np.concatenate([rlo, rhi]), np.concatenate([lo, lo]))
    return centre, all_ok, key, rank


def settled(centre: np.ndarray, ok: np.ndarray, key: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The holders' checks combined: the centres every holder passed, and each one's survivor."""
    if len(centre) == 0:
        return centre, centre
    order = np.argsort(centre, kind="stable")
    c, okay = centre[order], ok[order]
    starts = _group_starts(c)
    whole = np.logical_and.reduceat(okay, starts)
    group, survivor, _ = best(key[order], rank[order], c)
    return group[whole], survivor[whole]
