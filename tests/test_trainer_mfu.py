"""MFU's FLOPs per token by the common convention (PaLM appendix B, torchtitan): 6 x every parameter
except the input embedding (the lm_head counts) + 12 x layers x heads x head_dim x sequence length,
checked against figures computed by hand from the published architectures."""

from __future__ import annotations

import pytest

from trainer.catalog import MODELS


def test_llama2_7b_by_hand():
    # h 4096, 32 layers, 32 heads (MHA), intermediate 11008, vocabulary 32000.
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096  # q k v o, gate up down, 2 norms
    counted = 32 * per_layer + 4096 + 32000 * 4096  # final norm, lm_head; no embedding
    assert counted == 6_607_343_616
    expected = 6 * counted + 12 * 32 * 32 * 128 * 4096  # 39.644e9 + 6.442e9
    assert MODELS["llama2-7b"].flops_per_token(4096) == expected == 46_086_512_640


def test_llama31_8b_by_hand():
    # h 4096, 32 layers, 32 query heads and 8 KV heads of 128, intermediate 14336, vocabulary 128256.
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    counted = 32 * per_layer + 4096 + 128256 * 4096
    assert counted == 7_504_924_672
    expected = 6 * counted + 12 * 32 * 32 * 128 * 4096
    assert MODELS["llama3.1-8b"].flops_per_token(4096) == expected == 51_471_998_976


@pytest.mark.parametrize("name, share", [("llama2-7b", 0.017), ("llama3.1-8b", 0.061)])
def test_the_lm_head_share_the_old_formula_left_out(name, share):
    arch = MODELS[name]
    lm_head = 6 * arch.vocab_size * arch.hidden_size
    assert lm_head / arch.flops_per_token(4096) == pytest.approx(share, abs=0.0005)
