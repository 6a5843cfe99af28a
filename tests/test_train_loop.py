"""The one training loop (``paradec.train.loop``): a run killed mid-way and resumed ends with the
same weights as a run that was never stopped; a checkpoint of another unfinished run is refused;
the Medusa heads train through it too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paradec.config import ModelConfig
from paradec.errors import ParadecError
from paradec.models import Transformer
from paradec.train.heads import fit_heads
from paradec.train.lm import StreamBatches, TrainConfig, train_lm
from paradec.train.loop import LoopSpec, train_loop

CFG = ModelConfig("LlamaForCausalLM", 64, 32, 64, 1, 2, 2, 16, max_position_embeddings=64)
STREAM = np.random.default_rng(0).integers(0, 64, 4000).astype(np.uint16)


class Killed(Exception):
    pass


class DiesAfter(StreamBatches):
    """A data source whose process is killed after ``n`` batches."""

    def __init__(self, tokens: np.ndarray, n: int) -> None:
        super().__init__(tokens)
        self.n = n

    def sample(self, batch_size, seq_len, rng):
        if self.n == 0:
            raise Killed
        self.n -= 1
        return super().sample(batch_size, seq_len, rng)


def test_a_killed_lm_run_resumes_to_the_same_weights(tmp_path):
    cfg = TrainConfig(seq_len=16, batch_size=4, max_steps=8, warmup_steps=2, eval_every=4, save_every=1)
    held = StreamBatches(STREAM).fixed(2, 4, 16)
    straight = train_lm(CFG, StreamBatches(STREAM), held, tmp_path / "a", cfg)
    with pytest.raises(Killed):
        train_lm(CFG, DiesAfter(STREAM, 5), held, tmp_path / "b", cfg)
    resumed = train_lm(CFG, StreamBatches(STREAM), held, tmp_path / "b", cfg)
    assert straight["done"] and resumed["done"] and resumed["steps"] == 8
    assert resumed["tokens_seen"] == straight["tokens_seen"] == 8 * 4 * 16
    for (name, a), b in zip(straight["model"].state_dict().items(), resumed["model"].state_dict().values()):
        assert torch.equal(a, b), name  # data order, optimizer and schedule all carried over


def test_another_unfinished_run_is_refused(tmp_path):
    model = Transformer(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.from_numpy(STREAM[:33].astype(np.int64))[None]

    def batch_loss(_):
        return torch.nn.functional.cross_entropy(model(x[:, :-1])[0], x[0, 1:]), {"+tokens": 32}

    spec = LoopSpec(tmp_path, total=4, lr=1e-3, run_key=["a"], minutes=1e-9)  # out of time at once
    res = train_loop(spec, {"model": model}, opt, batch_loss, dict)
    assert res.step < 4 and not res.done and res.counters.get("tokens", 0) == 32 * res.step
    with pytest.raises(ParadecError, match="unfinished run"):
        train_loop(LoopSpec(tmp_path, total=4, lr=1e-3, run_key=["b"]), {"model": model}, opt, batch_loss, dict)
    res = train_loop(LoopSpec(tmp_path, total=4, lr=1e-3, run_key=["a"]), {"model": model}, opt, batch_loss, dict)
    assert res.done and res.step == 4 and res.counters == {"tokens": 128}


def test_medusa_heads_train_through_the_loop(tmp_path):
    torch.manual_seed(0)
    model = Transformer(CFG).eval()
    seqs = [STREAM[i : i + 24].tolist() for i in range(0, 960, 24)]
    spans = [(8, 23)] * len(seqs)
    meta = fit_heads(model, (seqs[:32], spans[:32]), (seqs[32:], spans[32:]), tmp_path / "heads", num_heads=2,
                     epochs=2, batch=64, run_dir=tmp_path / "run")  # fmt: skip
    assert len(meta["rank_accuracy"]) == 2 and meta["loss_log"][0]["step"] == 0
    assert (tmp_path / "run" / "heads_state.pt").is_file()
