"""Connected components across partitions in shuffle rounds: alternating small-star / large-star
(Kiveris et al. 2014, "Connected Components in MapReduce and Beyond"), with finished components
settled as soon as they are known whole.

The graph is a set of edges between int64 node ids (row keys). Every round, each edge is held by
the partitions of both its endpoints as two directed rows ``(node, nbr)``, so a partition sees the
whole neighbourhood of each of its nodes and nothing else: a task's memory is its share of the
edges, never the corpus. Both operations keep the connected components:

* small-star at node u: connect u and each smaller neighbour to the smallest of them;
* large-star at node u: connect each larger neighbour to the smallest of u's neighbourhood.

Alternated, they turn every component into a star around its lowest id in O(log n) rounds in
practice (O(log^2 n) proven). Settling: in a small-star round a node whose only neighbour is lower
sends that neighbour a ``confirm`` row; in the next (large-star) round a node c whose neighbours
are all higher and have all confirmed is the centre of a whole component ({c} and its neighbours:
see ``large_star`` for why), which is handed back as settled (root, member) pairs and drops out of
the rounds. A round in which nothing is left receives no rows.
"""

from __future__ import annotations

import numpy as np

EDGE, CONFIRM = 0, 1  # row kinds


def node_partition(nodes: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of each node id: a splitmix64 mix, as row keys (shard << 32 | row) are not uniform."""
    x = nodes.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x % np.uint64(partitions)).astype(np.int32)


def both_ways(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Undirected edges as directed rows (node, nbr), one for each endpoint; self-loops dropped."""
    keep = u != v
    u, v = u[keep], v[keep]
    return np.concatenate([u, v]), np.concatenate([v, u])


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (a, b) pairs, sorted by a then b."""
    if len(a) == 0:
        return a.astype(np.int64), b.astype(np.int64)
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    first = np.ones(len(a), dtype=bool)
    first[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return a[first], b[first]


def _groups(node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted by node: the start index of each node's group and each row's group number."""
    start = np.ones(len(node), dtype=bool)
    start[1:] = node[1:] != node[:-1]
    return np.flatnonzero(start), np.cumsum(start) - 1


def small_star(node: np.ndarray, nbr: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """One small-star step over the rows (node, nbr) of a partition's nodes (every neighbour of each).

    Returns the new undirected edges (u, v) and the confirm rows (centre, leaf): a node whose only
    neighbour is lower tells that neighbour it is its leaf."""
    node, nbr = _unique_pairs(node, nbr)
    empty = np.empty(0, np.int64)
    if len(node) == 0:
        return (empty, empty), (empty, empty)
    starts, group = _groups(node)
    degree = np.diff(np.append(starts, len(node)))
    lowest = nbr[starts]  # sorted by nbr inside a group: the lowest neighbour
    leaf = (degree == 1) & (lowest < node[starts])
    lower = nbr < node
    m = lowest[group]  # per row: the node's lowest neighbour (= the lowest of its lower ones, if any)
    # Each lower neighbour x != m joins m; the node itself joins m (when it has a lower neighbour).
    join = lower & (nbr != m)
    has_lower = lowest < node[starts]
    u = np.concatenate([nbr[join], node[starts][has_lower]])
    v = np.concatenate([m[join], lowest[has_lower]])
    return (u, v), (lowest[leaf], node[starts][leaf])


def _is_member(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """For distinct sorted pairs ``a``: whether each is among the distinct pairs ``b``."""
    n = len(a[0])
    if n == 0 or len(b[0]) == 0:
        return np.zeros(n, dtype=bool)
    x = np.concatenate([a[0], b[0]])
    y = np.concatenate([a[1], b[1]])
    tag = np.concatenate([np.zeros(n, np.int8), np.ones(len(b[0]), np.int8)])
    order = np.lexsort((tag, y, x))  # equal pairs adjacent, the one of ``a`` first
    xs, ys, ts = x[order], y[order], tag[order]
    hit = (xs[:-1] == xs[1:]) & (ys[:-1] == ys[1:]) & (ts[:-1] == 0) & (ts[1:] == 1)
    found = np.zeros(n, dtype=bool)
    found[order[:-1][hit]] = True  # positions < n are rows of ``a``
    return found


def large_star(
    node: np.ndarray, nbr: np.ndarray, confirm: tuple[np.ndarray, np.ndarray]
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """One large-star step over the rows (node, nbr) of a partition's nodes, settling whole components.

    ``confirm``: the (centre, leaf) rows the small-star round before sent to this partition. Returns
    the new undirected edges (u, v) and the settled (root, member) pairs.

    Why a confirmed centre's component is whole: if c has only higher neighbours now, it had only
    higher neighbours in the round before (a lower one would have made small-star give c a lower
    neighbour), and each of them, y, got the edge (y, c) only if c was the lowest of y's lower
    neighbours then; so c's neighbours then are among its neighbours now. Every one of these having
    confirmed means it had c as its only neighbour then, so c's neighbours now are exactly those of
    then and {c} with them was a whole component of the graph then, hence of the input graph."""
    node, nbr = _unique_pairs(node, nbr)
    empty = np.empty(0, np.int64)
    if len(node) == 0:
        return (empty, empty), (empty, empty)
    starts, group = _groups(node)
    ends = np.append(starts, len(node))
    lowest = nbr[starts]
    centre = lowest > node[starts]
    confirmed = _is_member((node, nbr), _unique_pairs(*confirm))
    # A group is fully confirmed when its count of confirmed rows equals its size.
    all_confirmed = np.add.reduceat(confirmed.astype(np.int64), starts) == np.diff(ends)
    settled = (centre & all_confirmed)[group]
    m = np.minimum(lowest, node[starts])[group]  # the lowest of the node's neighbourhood, with itself
    emit = ~settled & (nbr > node)
    return (nbr[emit], m[emit]), (node[settled], nbr[settled])
