"""The fp8 scaling recipe (parallelism.fp8_recipe) and the compile mode (parallelism.compile_mode):
their config rules, the torchao config each recipe gives, and a rowwise-scaled tiny model whose
emulated float8 step trains (CPU: torchao emulates the float8 matmuls)."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ConfigError, from_dict
from trainer.fp8 import float8_linear_config


def cfg(**parallelism):
    return from_dict({"model": {"name": "tiny"}, "data": {"format": "synthetic"}, "parallelism": parallelism})


@pytest.mark.parametrize(
    ("settings", "key", "fix"),
    [
        ({"fp8_recipe": "rowwise"}, "parallelism.fp8_recipe", "set parallelism.precision: fp8 or remove fp8_recipe"),
        ({"precision": "fp8", "fp8_recipe": "rowwise", "fp8_all_gather": True}, "parallelism.fp8_all_gather",
         "set parallelism.fp8_recipe: tensorwise or remove fp8_all_gather"),
        ({"compile": False, "compile_mode": "max-autotune"}, "parallelism.compile_mode",
         "set parallelism.compile: true or remove compile_mode"),
        ({"precision": "fp8", "fp8_recipe": "blockwise"}, "parallelism.fp8_recipe", "'tensorwise', 'rowwise'"),
    ],
)  # fmt: skip
def test_bad_combinations_name_the_key_and_the_fix(settings, key, fix):
    with pytest.raises(ConfigError) as err:
        cfg(**settings)
    assert err.value.key == key
    assert fix in str(err.value)


def test_the_defaults_are_tensorwise_and_the_default_compile_mode():
    par = cfg().parallelism
    assert (par.fp8_recipe, par.compile_mode) == ("tensorwise", "default")
    assert cfg(precision="fp8", fp8_recipe="rowwise").parallelism.fp8_recipe == "rowwise"
    assert cfg(compile_mode="max-autotune").parallelism.compile_mode == "max-autotune"


def test_each_recipe_gives_its_torchao_scaling():
    from torchao.float8.config import ScalingGranularity

    tensorwise = float8_linear_config(cfg(precision="fp8", fp8_all_gather=True).parallelism, emulate=True)
    rowwise = float8_linear_config(cfg(precision="fp8", fp8_recipe="rowwise").parallelism, emulate=False)
    assert tensorwise.cast_config_weight.scaling_granularity is ScalingGranularity.TENSORWISE
    assert tensorwise.enable_fsdp_float8_all_gather and tensorwise.emulate
    for cast in ("cast_config_input", "cast_config_weight", "cast_config_grad_output"):
        assert getattr(rowwise, cast).scaling_granularity is ScalingGranularity.AXISWISE, cast
    assert rowwise.round_scales_to_power_of_2 and not rowwise.emulate
    assert not rowwise.enable_fsdp_float8_all_gather


@pytest.mark.slow  # torchao conversion and emulated float8 steps: seconds
def test_a_rowwise_tiny_model_trains_with_emulated_float8():
    from torchao.float8.float8_linear import Float8Linear

    from trainer import model as modeling
    from trainer.parallelize import apply_fp8

    par = cfg(precision="fp8", fp8_recipe="rowwise").parallelism
    model = modeling.build_model(cfg().model)
    apply_fp8(model, par, "cpu")
    modeling.materialize(model, torch.device("cpu"))
    modeling.init_random_weights(model, 0)
    linears = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert linears and all(m.config.cast_config_weight.scaling_granularity.value == "axiswise" for m in linears)
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 64))
    targets = torch.roll(ids, -1, dims=1).reshape(-1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = model(ids, targets, None, loss_impl="full") / targets.numel()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] * 0.9, losses
