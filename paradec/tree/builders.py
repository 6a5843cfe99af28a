"""Tree shapes as rank paths: a path (r1, .., rd) is the node reached by taking the r1-th
guess at depth 1, then the r2-th at depth 2, ... (Medusa's sparse trees).
"""

from __future__ import annotations

import heapq


def top_paths(rank_prob: list[list[float]], n: int) -> list[tuple[int, ...]]:
    """The ``n`` rank paths of highest score, score = product of ``rank_prob[depth][rank]``.

    Parents always come first (a path scores at most its prefix when probabilities are
    <= 1 and fall with rank), so the result is a valid tree in topological order.
    Example: rank_prob [[.6, .2], [.5, .1]], n=3 -> [(0,), (0, 0), (1,)].
    """
    return [path for path, _ in top_paths_scored(rank_prob, n)]


def top_paths_scored(rank_prob: list[list[float]], n: int) -> list[tuple[tuple[int, ...], float]]:
    """``top_paths`` with each path's score (its probability of being accepted)."""
    depth, ranks = len(rank_prob), len(rank_prob[0]) if rank_prob else 0
    if n <= 0 or depth == 0 or ranks == 0:
        return []
    out: list[tuple[tuple[int, ...], float]] = []
    heap = [(-rank_prob[0][0], (0,))]
    seen = {(0,)}
    while heap and len(out) < n:
        neg, path = heapq.heappop(heap)
        out.append((path, -neg))
        d = len(path)
        nxt = []
        if d < depth:
            nxt.append(path + (0,))  # first child
        if path[-1] + 1 < ranks:
            nxt.append(path[:-1] + (path[-1] + 1,))  # next sibling
        for cand in nxt:
            if cand not in seen:
                seen.add(cand)
                score = 1.0
                for i, r in enumerate(cand):
                    score *= rank_prob[i][r]
                heapq.heappush(heap, (-score, cand))
    return out


def expected_accepted(rank_prob: list[list[float]], paths: list[tuple[int, ...]]) -> float:
    """Expected number of draft tokens accepted from a tree of ``paths`` (sum of node scores)."""
    total = 0.0
    for path in paths:
        score = 1.0
        for i, r in enumerate(path):
            score *= rank_prob[i][r]
        total += score
    return total
