"""Pipeline definitions: the YAML form, the SDK's tracing, and every rule a DAG obeys."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from shamal.errors import InvalidParameter
from shamal.pipelines import MAX_STEPS, PipelineSpec, Ref, dataset, load_pipeline, pipeline, step

RETRAIN = """
name: retrain
team: risk
params: {min_rows: 1000}
steps:
  - name: register
    function: steps.py:register
    args: {scores: "${steps.score.output}"}
    when: steps.train.output.f1 >= 0.8
  - name: validate
    function: steps.py:validate
    args: {data: "${data.wine@latest}", min_rows: "${params.min_rows}"}
  - name: train
    function: steps.py:train
    args: {data: "${steps.validate.output.data}", seed: 7}
    cpus: 2
    retries: 1
  - name: score
    command: [python, score.py]
    args: {fold: "${steps.train.output.folds}"}
    map: fold
triggers:
  - on: dataset_version_created where dataset = 'wine'
  - {schedule: "0 3 * * *", timezone: Asia/Dubai, catch_up: all}
"""


def _yaml(text: str) -> PipelineSpec:
    return PipelineSpec.from_json(yaml.safe_load(textwrap.dedent(text)), yaml_refs=True)


def test_yaml_reads_references_orders_steps_and_round_trips() -> None:
    spec = _yaml(RETRAIN)
    assert [s.name for s in spec.steps] == ["validate", "train", "score", "register"]
    train = spec.step("train")
    assert train.args["data"] == Ref("step", name="validate", path=("data",))
    assert train.args["seed"] == Ref("value", value=7)
    assert spec.step("validate").args["data"] == Ref("dataset", name="wine@latest")
    assert spec.step("register").upstream == ("score", "train")
    assert spec.triggers[1].timezone == "Asia/Dubai"
    again = PipelineSpec.from_json(spec.to_json())
    assert again == spec
    assert again.digest == spec.digest
    assert str(train.args["data"]) == "${steps.validate.output.data}"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": []}, "has no steps"),
        ({"name": "Bad Name"}, "is not a valid name"),
        ({"steps": [{"name": "a"}]}, "needs exactly one of function or command"),
        ({"steps": [{"name": "a", "command": ["x"], "after": ["a"]}]}, "depends on itself"),
        (
            {"steps": [{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}]},
            "step names must be unique",
        ),
        (
            {"steps": [{"name": "a", "command": ["x"], "args": {"n": "${params.nope}"}}]},
            "has no parameter 'nope'",
        ),
        ({"steps": [{"name": "a", "command": ["x"], "map": "items"}]}, "not one of its args"),
        ({"steps": [{"name": "a", "function": "../up.py:f"}]}, "no '..'"),
        ({"steps": [{"name": "a", "function": "x.py:f", "cpus": -1}]}, "cpus must be"),
        (
            {"steps": [{"name": "a", "command": ["x"], "args": {"n": "${steps.a.nope}"}}]},
            "refers to nothing",
        ),
        ({"steps": [{"name": "a", "command": ["x"], "env": {"K": 1}}]}, "env must map"),
        ({"steps": [{"name": "a", "command": ["x"], "surprise": 1}]}, "unknown keys"),
        ({"steps": [{"name": "a", "command": ["x"], "executor": "slurm"}]}, "local or ray"),
        ({"triggers": [{"on": "x", "schedule": "* * * * *"}]}, "exactly one of 'on'"),
    ],
)
def test_what_a_pipeline_may_not_be(change: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"name": "p", "steps": [{"name": "a", "command": ["x"]}]}
    with pytest.raises(InvalidParameter, match=message):
        PipelineSpec.from_json(base | change, yaml_refs=True)


def test_a_cycle_is_named_step_by_step() -> None:
    text = {
        "name": "p",
        "steps": [
            {"name": "a", "command": ["x"], "after": ["c"]},
            {"name": "b", "command": ["x"], "after": ["a"]},
            {"name": "c", "command": ["x"], "after": ["b"]},
            {"name": "d", "command": ["x"]},
        ],
    }
    with pytest.raises(InvalidParameter, match="cycle: a -> c -> b -> a"):
        PipelineSpec.from_json(text)


def test_hostile_sizes_are_refused() -> None:
    many = [{"name": f"s{i}", "command": ["x"]} for i in range(MAX_STEPS + 1)]
    with pytest.raises(InvalidParameter, match="at most 500 steps"):
        PipelineSpec.from_json({"name": "p", "steps": many})
    deep: object = 1
    for _ in range(100):
        deep = [deep]
    with pytest.raises(InvalidParameter, match="nests deeper"):
        PipelineSpec.from_json(
            {"name": "p", "params": {"x": deep}, "steps": [{"name": "a", "command": ["x"]}]}
        )
    with pytest.raises(InvalidParameter, match="small values stop at"):
        PipelineSpec.from_json(
            {"name": "p", "params": {"x": "y" * 20_000}, "steps": [{"name": "a", "command": ["x"]}]}
        )
    with pytest.raises(InvalidParameter, match="is not a JSON value"):
        PipelineSpec.from_json(
            {"name": "p", "params": {"x": float("nan")}, "steps": [{"name": "a", "command": ["x"]}]}
        )


SDK_FLOW = """
from shamal.pipelines import dataset, pipeline, step

@step(cpus=0.5)
def load(data: str) -> dict:
    return {"rows": 3}

@step
def score(row: int, scale: float = 1.0) -> float:
    return row * scale

@step(retries=2)
def summarize(values: list, rows: int) -> int:
    return len(values)

@pipeline(on="dataset_version_created where dataset = 'wine'", schedule="0 * * * *")
def flow(scale: float = 2.0) -> None:
    loaded = load(dataset("wine@prod"))
    scores = score.map(loaded["rows"], scale)
    summarize(scores, loaded["rows"])
    summarize.options(name="again", when="steps.load.output.rows > 2")(scores, 1)
"""


def test_the_sdk_traces_a_pipeline_into_its_definition(tmp_path: Path) -> None:
    (tmp_path / "flow.py").write_text(SDK_FLOW)
    spec, root = load_pipeline(f"{tmp_path / 'flow.py'}:flow")
    assert root == tmp_path.resolve()
    assert spec.params == {"scale": 2.0}
    assert [s.name for s in spec.steps] == ["load", "score", "summarize", "again"]
    score = spec.step("score")
    assert score.function == "flow.py:score"
    assert score.map == "row"
    assert score.args["row"] == Ref("step", name="load", path=("rows",))
    assert score.args["scale"] == Ref("param", name="scale")
    assert spec.step("load").args["data"] == Ref("dataset", name="wine@prod")
    assert spec.step("summarize").retries == 2
    assert spec.step("again").upstream == ("score", "load")
    assert [t.on for t in spec.triggers] == ["dataset_version_created where dataset = 'wine'", None]
    assert spec.triggers[1].schedule == "0 * * * *"
    # Outside a pipeline a step is its plain function.
    module = __import__("sys").modules[
        next(m for m in __import__("sys").modules if m.endswith("_flow") and "shamal_pipeline" in m)
    ]
    assert module.score(3, 2.0) == 6.0


def test_the_sdk_refuses_what_a_job_could_not_run() -> None:
    def local() -> None:
        @step
        def inner() -> None: ...

    with pytest.raises(InvalidParameter, match="module level"):
        local()
    with pytest.raises(InvalidParameter, match="module level"):
        step(lambda: None)

    @pipeline
    def flow() -> None: ...

    with pytest.raises(InvalidParameter, match="runs on the server"):
        flow()
    with pytest.raises(InvalidParameter, match="only for use inside a @pipeline"):
        step_fn.map([1])
    assert dataset("wine").ref == "wine"


def step_fn_impl(x: int) -> int:
    return x


step_fn = step(step_fn_impl)


def test_a_step_names_its_executor_and_only_then_does_its_json_carry_it(tmp_path: Path) -> None:
    text = {
        "name": "p",
        "steps": [
            {"name": "prep", "command": ["x"]},
            {"name": "train", "command": ["y"], "after": ["prep"], "executor": "ray"},
        ],
    }
    spec = PipelineSpec.from_json(text, yaml_refs=True)
    assert [s.executor for s in spec.steps] == [None, "ray"]
    stored = spec.to_json()
    assert "executor" not in stored["steps"][0]  # a step naming none keeps its old digest
    assert stored["steps"][1]["executor"] == "ray"
    assert PipelineSpec.from_json(stored) == spec
    # Naming the default changes the definition (and its digest), never the step's cache key.
    local = PipelineSpec.from_json(text | {"steps": [text["steps"][0] | {"executor": "local"}]})
    assert local.digest != PipelineSpec.from_json(text | {"steps": [text["steps"][0]]}).digest
    (tmp_path / "flow.py").write_text(
        textwrap.dedent(
            """
            from shamal.pipelines import pipeline, step

            @step(executor="ray", cpus=0.5)
            def train() -> int:
                return 1

            @step
            def check(n: int) -> bool:
                return n > 0

            @pipeline
            def flow() -> None:
                check.options(executor="local")(train())
            """
        )
    )
    traced, _ = load_pipeline(f"{tmp_path / 'flow.py'}:flow")
    assert [(s.name, s.executor) for s in traced.steps] == [("train", "ray"), ("check", "local")]
