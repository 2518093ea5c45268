"""Strict matrix loading: every bad input is a InputError naming the file, the line, the key and a fix."""

from __future__ import annotations

import pytest
from matrix_support import GOOD, HEADER, RUNS, line_of, load

from generators.core.errors import InputError
from generators.matrix.schema import trainer_schema


def error_of(text: str) -> InputError:
    with pytest.raises(InputError) as info:
        load(text)
    err = info.value
    assert err.file == "m.yaml"
    assert err.fix, "every error says how to fix it"
    assert "\n" not in str(err)
    return err


def test_good_matrix_loads_with_clusters_repository_and_defaults():
    m = load(GOOD)
    assert m.repository.url == "https://github.com/example-org/fsdp-gitops"
    assert list(m.clusters) == ["fsdp-p5", "fsdp-mixed"]
    p5 = m.clusters["fsdp-p5"]
    assert (p5.namespace, p5.instance_types, p5.region, p5.availability_zones) == (
        "fsdp",
        ("p5.48xlarge",),
        "us-west-2",
        ("us-west-2a",),
    )
    # Documented defaults of optional cluster fields.
    assert (p5.capacity_reservation_ids, p5.volume_size_gib, p5.kubernetes_version, p5.max_nodes) == (
        (),
        500,
        "1.33",
        16,
    )
    assert m.clusters["fsdp-mixed"].namespace == "research"
    assert [a.path for a in m.axes] == ["model", "nodes"]


def test_error_format_is_file_line_key_message_fix():
    err = InputError("must be at least 1", file="m.yaml", line=12, key="defaults.nodes", fix="set nodes to 1 or more")
    assert str(err) == "m.yaml:12: defaults.nodes: must be at least 1; fix: set nodes to 1 or more"
    assert str(InputError("x", file="m.yaml", key="k", fix="y")) == "m.yaml: k: x; fix: y"


def test_yaml_syntax_error_names_its_line():
    text = HEADER + "defaults:\n  nodes: [1, 2\naxes: {}\n"
    err = error_of(text)
    assert "YAML syntax error" in err.message
    assert err.line >= line_of(text, "nodes: [1, 2")


def test_empty_file_is_an_error():
    err = error_of("")
    assert (err.line, "empty" in err.message) == (1, True)
    assert error_of("# only a comment\n").message == "the file is empty"


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "42\n"])
def test_top_level_must_be_a_mapping(text):
    err = error_of(text)
    assert err.line == 1
    assert "not a mapping" in err.message


def test_duplicate_top_level_key():
    text = GOOD + "defaults:\n  nodes: 1\n"
    err = error_of(text)
    assert err.key == "defaults"
    assert err.line == line_of(text, "defaults:", nth=2)
    assert f"first at line {line_of(text, 'defaults:')}" in err.message


def test_duplicate_nested_key_names_its_path():
    text = (
        HEADER
        + "defaults:\n  cluster: fsdp-p5\n  trainer:\n    training:\n"
        + "      lr: 1.0e-5\n      lr: 2.0e-5\naxes:\n  nodes: [1]\n"
    )
    err = error_of(text)
    assert err.key == "defaults.trainer.training.lr"
    assert err.line == line_of(text, "lr: 2.0e-5")


def test_dotted_and_nested_spelling_of_one_key_is_a_duplicate():
    text = (
        HEADER
        + "defaults:\n  trainer:\n    training: {lr: 1.0e-5}\n  trainer.training.lr: 2.0e-5\naxes:\n  nodes: [1]\n"
    )
    err = error_of(text)
    assert err.key == "defaults.trainer.training.lr"
    assert err.line == line_of(text, "trainer.training.lr: 2.0e-5")
    assert "set twice" in err.message


def test_anchor_is_rejected():
    text = HEADER + "defaults: &base\n  cluster: fsdp-p5\naxes:\n  nodes: [1]\n"
    err = error_of(text)
    assert "anchor &base" in err.message
    assert (err.line, err.key) == (line_of(text, "&base"), "defaults")


def test_alias_is_rejected():
    text = GOOD + "include:\n  - *x\n"
    err = error_of(text)
    assert "alias *x" in err.message
    assert (err.line, err.key) == (line_of(text, "*x"), "include[0]")


def test_merge_key_is_rejected():
    text = HEADER + "defaults:\n  <<: {cluster: fsdp-p5}\naxes:\n  nodes: [1]\n"
    err = error_of(text)
    assert "merge key" in err.message
    assert err.line == line_of(text, "<<")


def test_non_string_key_is_rejected():
    text = HEADER + "defaults:\n  on: 1\naxes:\n  nodes: [1]\n"
    err = error_of(text)
    assert "not a string" in err.message
    assert err.line == line_of(text, "on: 1")


@pytest.mark.parametrize(
    "text, needle, key, hint",
    [
        (GOOD + "axis: {}\n", "axis:", "axis", "did you mean 'axes'"),
        (GOOD.replace("  nodes: [1, 2]", "  nodes: [1, 2]\n  nodez: [3]"), "nodez", "axes.nodez", "nodes"),
        (
            GOOD.replace("  cluster: fsdp-p5\n", "  cluster: fsdp-p5\n  gpus: 4\n"),
            "gpus: 4",
            "defaults.gpus",
            "gpus_per_node",
        ),
        (GOOD.replace("      path: /shared", "      pathh: /shared"), "pathh", "defaults.trainer.data.pathh", "'path'"),
        (
            GOOD.replace("    region: us-west-2", "    regoin: us-west-2"),
            "regoin",
            "clusters.fsdp-p5.regoin",
            "'region'",
        ),
        (GOOD.replace("  branch: main", "  branch: main\n  path: x"), "path: x", "repository.path", "branch, url"),
        (
            GOOD + "include:\n  - {model: llama2-7b, nodes: 4, trainer: {training: {lrate: 1.0e-4}}}\n",
            "lrate",
            "include[0].trainer.training.lrate",
            " lr,",
        ),
    ],
)
def test_unknown_keys_at_every_level(text, needle, key, hint):
    err = error_of(text)
    assert (err.key, err.line) == (key, line_of(text, needle))
    assert "unknown" in err.message
    assert hint in err.fix


@pytest.mark.parametrize(
    "replace, key, word",
    [
        (("nodes: [1, 2]", "nodes: [1, two]"), "axes.nodes[1]", "an integer"),
        (("  cluster: fsdp-p5\n", "  cluster: fsdp-p5\n  rev: 1.5\n"), "defaults.rev", "an integer"),
        (("  cluster: fsdp-p5\n", "  cluster: [fsdp-p5]\n"), "defaults.cluster", "single value"),
        (
            ("    instance_types: [p5.48xlarge]", "    instance_types: p5.48xlarge"),
            "clusters.fsdp-p5.instance_types",
            "a list",
        ),
        (
            ("  fsdp-p5:\n    region: us-west-2", "  fsdp-p5:\n    kubernetes_version: 1.33\n    region: us-west-2"),
            "clusters.fsdp-p5.kubernetes_version",
            "a string",
        ),
        (("  cluster: fsdp-p5\n", "  cluster: fsdp-p5\n  rdzv_backend: true\n"), "defaults.rdzv_backend", "a string"),
    ],
)
def test_wrong_types(replace, key, word):
    text = GOOD.replace(*replace)
    assert text != GOOD
    err = error_of(text)
    assert err.key == key
    assert word in err.message


def test_unquoted_kubernetes_version_gets_a_quoting_fix():
    text = GOOD.replace("    region: us-west-2", "    kubernetes_version: 1.33\n    region: us-west-2")
    assert error_of(text).fix == 'quote it: kubernetes_version: "1.33"'


@pytest.mark.parametrize(
    "replace, key, what",
    [
        (
            ("model: [llama2-7b, llama2-13b]", "model: [llama2-7b, llama-9b]"),
            "axes.model[1]",
            "unknown model 'llama-9b'",
        ),
        (("  cluster: fsdp-p5\n", "  cluster: fsdp-p6\n"), "defaults.cluster", "unknown cluster 'fsdp-p6'"),
        (
            ("  cluster: fsdp-p5\n", "  cluster: fsdp-p5\n  instance_type: p6.48xlarge\n"),
            "defaults.instance_type",
            "unknown instance type 'p6.48xlarge'",
        ),
        (
            ("instance_types: [p5.48xlarge]", "instance_types: [p5.4xlarge]"),
            "clusters.fsdp-p5.instance_types[0]",
            "unknown instance type",
        ),
    ],
)
def test_unknown_model_instance_type_and_cluster(replace, key, what):
    text = GOOD.replace(*replace)
    err = error_of(text)
    assert err.key == key
    assert what in err.message
    assert err.line == line_of(text, replace[1].strip().splitlines()[-1].split(":")[0] + ":")


@pytest.mark.parametrize("value", ["0", "-2"])
def test_nodes_below_one(value):
    text = GOOD.replace("nodes: [1, 2]", f"nodes: [1, {value}]")
    err = error_of(text)
    assert (err.key, err.line) == ("axes.nodes[1]", line_of(text, "nodes: [1,"))
    assert "below 1" in err.message


def test_api_version_and_kind_are_checked():
    err = error_of(GOOD.replace("fsdp-gitops/v1", "fsdp-gitops/v2"))
    assert (err.key, err.line) == ("apiVersion", 1)
    assert err.fix == "set apiVersion: fsdp-gitops/v1"
    assert error_of(GOOD.replace("kind: ExperimentMatrix", "kind: Matrix")).key == "kind"


def test_missing_repository_and_clusters_are_errors():
    no_repo = GOOD.replace("repository:\n  url: https://github.com/example-org/fsdp-gitops\n  branch: main\n", "")
    assert error_of(no_repo).key == "repository"
    assert error_of(HEADER.split("clusters:")[0] + "clusters: {}\n" + RUNS).key == "clusters"


def test_cluster_values_are_checked():
    assert "not a zone of region" in error_of(GOOD.replace("[us-west-2a]", "[us-east-1a]")).message
    assert error_of(GOOD.replace("    region: us-west-2", "    region: west")).key == "clusters.fsdp-p5.region"
    bad_cr = GOOD.replace("    namespace: research", "    namespace: research\n    capacity_reservation_ids: [cr-xyz]")
    assert error_of(bad_cr).key == "clusters.fsdp-mixed.capacity_reservation_ids[0]"
    assert error_of(GOOD.replace("  fsdp-p5:", "  FSDP_P5:")).key == "clusters.FSDP_P5"


def test_axis_must_be_a_nonempty_list_without_repeats():
    assert "non-empty list" in error_of(GOOD.replace("nodes: [1, 2]", "nodes: 2")).message
    assert "non-empty list" in error_of(GOOD.replace("nodes: [1, 2]", "nodes: []")).message
    err = error_of(GOOD.replace("nodes: [1, 2]", "nodes: [1, 2, 1]"))
    assert (err.key, err.message) == ("axes.nodes[2]", "same value as axes.nodes[0]")


def test_a_matrix_without_runs_is_an_error():
    assert error_of(HEADER + "defaults:\n  nodes: 1\n").message == "the matrix defines no runs"


def test_run_name_field_must_be_a_dns_label():
    err = error_of(GOOD + "include:\n  - {model: llama2-7b, nodes: 4, name: My_Run}\n")
    assert err.key == "include[0].name"
    assert "DNS-1035" in err.message


def test_trainer_schema_mirrors_the_trainer_config():
    schema = trainer_schema()
    assert set(schema) == {"model", "data", "training", "parallelism", "checkpoint", "metrics"}
    assert "sharding_strategy" in schema["parallelism"] and schema["parallelism"]["sharding_strategy"] is None
