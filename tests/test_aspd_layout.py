"""ASPD's training layout: siblings invisible, shared positions, the suffix at its flat index."""

from __future__ import annotations

from paradec.parallel.layout import layout

P, EP, B, EB = 100, 101, 102, 103  # <|para|> <|/para|> <|branch|> <|/branch|>


def test_docstring_example():
    seq = [1, P, B, 7, EB, B, 8, 9, EB, EP]
    lay = layout(seq, B, EB)
    assert lay.positions.tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5, 9]
    assert lay.mask[6].nonzero().flatten().tolist() == [0, 1, 5, 6]


def test_two_groups_siblings_invisible_suffix_sees_all():
    seq = [1, 2, P, B, 3, 4, EB, B, 5, EB, B, 6, 7, 8, EB, EP, 9, P, B, 10, EB, B, 11, EB, EP, 12]
    lay = layout(seq, B, EB)
    br = lay.branch
    for i in range(len(seq)):
        for j in range(i + 1):
            sibling = br[i] > 0 and br[j] > 0 and br[i] != br[j] and lay.group_start[i] == lay.group_start[j]
            assert lay.mask[i, j] == (not sibling), (i, j)
        assert not lay.mask[i, i + 1 :].any()  # still causal
    # the j-th token of every branch of a group shares a position
    starts = [i for i, t in enumerate(seq) if t == B]
    assert [int(lay.positions[s]) for s in starts[:3]] == [3, 3, 3]
    assert [int(lay.positions[s]) for s in starts[3:]] == [18, 18]
    # serial text after a group continues at the flattened index
    assert int(lay.positions[seq.index(EP)]) == seq.index(EP)
    assert int(lay.positions[len(seq) - 1]) == len(seq) - 1
    # a branch of the second group sees the first group's branches (an earlier stage)
    second = starts[3] + 1
    assert lay.mask[second, starts[0] : starts[3]].all()
