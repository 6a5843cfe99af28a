"""Tree attention: one pass over a tree equals running every root-to-node path on its own."""

from __future__ import annotations

import torch

import paradec
import paradec.state
from paradec.passes import prefill, verify_forward
from paradec.tree import ScratchTree, TokenTree, pass_tensors
from paradec.tree.shadow import Shadow, walk
from paradec.verify import accept_greedy

# r -> 1 -> 3 -> 6 ; r -> 1 -> 4 ; r -> 2 -> 5 ; r -> 2 -> 7 -> 8
TREE = TokenTree((10, 11, 12, 13, 14, 15, 16, 17, 18), (-1, 0, 0, 1, 1, 2, 3, 2, 7))


def test_derivations():
    assert TREE.depths == [0, 1, 1, 2, 2, 2, 3, 2, 3]
    assert TREE.leaf_paths() == [[0, 1, 4], [0, 2, 5], [0, 1, 3, 6], [0, 2, 7, 8]]
    anc = TREE.ancestor_mask()
    assert anc[6].nonzero().flatten().tolist() == [0, 1, 3, 6]
    assert anc.sum(1).tolist() == [d + 1 for d in TREE.depths]  # row sum = depth + 1
    rows = [ScratchTree.from_tree(TREE, 9), ScratchTree.from_tree(TokenTree.root_only(1), 9)]
    tokens, pos, mask = pass_tensors(rows, 0, 9, [4, 2])
    assert mask.shape == (2, 1, 9, 13) and tokens[1].tolist() == [1] * 9
    assert mask[0, 0, 6].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5, 7, 10]
    assert mask[1, 0, 0].nonzero().flatten().tolist() == [0, 1, 2]  # prefix + itself
    assert mask[1, 0, 3].nonzero().flatten().tolist() == [0, 1, 5]  # padding: prefix + itself
    assert pos[0].tolist() == [4, 5, 5, 6, 6, 6, 7, 6, 7] and pos[1].tolist() == [2] * 9
    # a later pass over nodes [3, 6) sees the earlier scratch nodes that are its ancestors
    _, pos, mask = pass_tensors(rows[:1], 3, 3, [4])
    assert mask.shape == (1, 1, 3, 10)
    assert mask[0, 0, 0].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5, 7]  # node 3
    assert pos[0].tolist() == [6, 6, 6]


def _prefill(engine, prompt):
    cache = engine.model.new_cache(1, 64)
    prefill(engine.model, [paradec.state.Row(list(prompt), len(prompt), None, None)], cache)
    return cache


def test_tree_logits_equal_path_logits(checkpoints):
    engine = paradec.load(checkpoints["llama-gqa-tied"], dtype="fp32")
    prompt = [5, 60, 7, 200, 31, 10]  # the last token is the root
    with torch.inference_mode():
        cache = _prefill(engine, prompt)
        tree_logits = verify_forward(engine.model, [TREE], cache)[0][0]  # [nodes, vocab]
        for path in TREE.leaf_paths():
            seq = torch.tensor([prompt[:-1] + [TREE.tokens[i] for i in path]])
            ref = engine.model(seq)[0, len(prompt) - 1 :]
            assert (ref - tree_logits[path]).abs().max() <= 1e-4


def test_commit_path_then_step_equals_fresh_prefill(checkpoints):
    engine = paradec.load(checkpoints["qwen2"], dtype="fp32")
    prompt = [5, 60, 7, 200, 31, 10]
    path = [0, 2, 7, 8]
    with torch.inference_mode():
        cache = _prefill(engine, prompt)
        verify_forward(engine.model, [TREE], cache)
        cache.commit(0, path[:-1])  # keep root, 2, 7; node 8 becomes the new root
        root = TREE.tokens[path[-1]]
        after = verify_forward(engine.model, [TokenTree.root_only(root)], cache)[0][0, 0]
        seq = prompt[:-1] + [TREE.tokens[i] for i in path]
        fresh = engine.model(torch.tensor([seq]))[0, -1]
    assert cache.lengths == [len(seq) - 1]
    assert (after - fresh).abs().max() <= 1e-4


def test_batched_trees_do_not_see_each_other(checkpoints):
    engine = paradec.load(checkpoints["llama"], dtype="fp32")
    prompts = [[5, 60, 7, 200, 31, 10], [9, 8]]
    trees = [TREE, TokenTree.chain(8, [3, 4])]
    with torch.inference_mode():
        cache = engine.model.new_cache(2, 64)
        rows = [paradec.state.Row(list(p), len(p), None, None) for p in prompts]
        prefill(engine.model, rows, cache)
        both = verify_forward(engine.model, trees, cache)[0]
        for b, (p, t) in enumerate(zip(prompts, trees)):
            solo_cache = _prefill(engine, p)
            solo = verify_forward(engine.model, [t], solo_cache)[0][0]
            assert (both[b, : len(t)] - solo).abs().max() <= 1e-4


def test_a_shadow_walks_the_path_that_greedy_verification_accepts():
    """Random trees over a 3-token alphabet (so paths often match) against random target tokens:
    the path the committed tokens trace, fed a few at a time as steps commit them, is the path
    ``accept_greedy`` accepts when the target's argmax at depth d is the d-th committed token."""
    gen = torch.Generator().manual_seed(0)
    ended = 0
    for _ in range(2000):
        n = int(torch.randint(1, 12, (1,), generator=gen))
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        tree = TokenTree(tuple(torch.randint(0, 3, (n,), generator=gen).tolist()), tuple(parents))
        target = torch.randint(0, 3, (12,), generator=gen).tolist()  # the tokens the row commits, in order
        verdict = accept_greedy(tree, [target[d] for d in tree.depths])
        shadow, fed = Shadow(("pld", n - 1), tree), 0
        while not shadow.done and fed < len(target):
            step = int(torch.randint(1, 4, (1,), generator=gen))
            shadow.feed(target[fed : fed + step])
            fed += step
        assert shadow.done and shadow.path == verdict.nodes[1:]
        assert walk(tree, target) == verdict.nodes[1:]
        ended += len(shadow.path) == max(tree.depths)
    assert ended > 300  # many walks reached a leaf
