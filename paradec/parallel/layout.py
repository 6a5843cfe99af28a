"""ASPD training layout of one token sequence: the "Indep" mask and "Same-Seq" positions.

Tokens from a ``<|branch|>`` to its ``<|/branch|>`` (inclusive) belong to that branch; a run of
consecutive branches is a group. Rules (papers.md §3.4, with the release's delimiter bug fixed):

- a serial token sees every earlier token (plain causal), so text after a group sees all branches;
- a branch token sees everything before its group's first ``<|branch|>`` (prefix, titles,
  ``<|para|>``, earlier groups) and the earlier tokens of its own branch, never a sibling;
- every branch of a group restarts at the position of the group's first token, so the j-th token
  of each branch shares a position; serial tokens keep their index in the flattened sequence.

Example: [a, <|para|>, <B>, x, </B>, <B>, y, z, </B>, <|/para|>] -> positions
[0, 1, 2, 3, 4, 2, 3, 4, 5, 9]; token y (index 6) sees 0, 1, 5, 6 only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    branch: list[int]  # [T] branch id (1, 2, ...; unique in the sequence), -1 for serial tokens
    group_start: list[int]  # [T] index of the first token of the token's group, -1 for serial
    positions: torch.Tensor  # [T] position ids
    mask: torch.Tensor  # [T, T] bool, True = may attend


def layout(tokens: list[int], branch_open: int, branch_close: int) -> Layout:
    n = len(tokens)
    branch, group_start = [-1] * n, [-1] * n
    current, next_id, start = -1, 1, -1
    for i, tok in enumerate(tokens):
        if tok == branch_open and current < 0:
            if i == 0 or tokens[i - 1] != branch_close:
                start = i  # a new group starts; a branch right after a branch continues it
            current, next_id = next_id, next_id + 1
        if current > 0:
            branch[i], group_start[i] = current, start
        if tok == branch_close and current > 0:
            current = -1
    pos, offset_in_branch = [0] * n, 0
    for i in range(n):
        if branch[i] < 0:
            pos[i] = i
        else:
            offset_in_branch = offset_in_branch + 1 if i > 0 and branch[i - 1] == branch[i] else 0
            pos[i] = group_start[i] + offset_in_branch
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        if branch[i] < 0:
            mask[i, : i + 1] = True
        else:
            mask[i, : group_start[i]] = True
            for j in range(group_start[i], i + 1):
                mask[i, j] = branch[j] == branch[i]
    return Layout(branch, group_start, torch.tensor(pos), mask)
