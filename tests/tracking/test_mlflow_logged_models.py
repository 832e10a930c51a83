"""Searching logged models with the stock mlflow client: order by a metric, page sizes."""

from __future__ import annotations

import uuid

import httpx
import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.entities import LoggedModel, LoggedModelStatus, Metric
from mlflow.exceptions import MlflowException

from tests.live import LiveServer

pytestmark = pytest.mark.slow


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _pages(
    client: MlflowClient, experiment_id: str, order_by: list[dict[str, object]]
) -> list[str]:
    """Every model id, two a page, following the server's page tokens."""
    seen: list[str] = []
    token = None
    while True:
        page = client.search_logged_models(
            experiment_ids=[experiment_id], order_by=order_by, max_results=2, page_token=token
        )
        seen += [m.model_id for m in page]
        token = page.token
        if not token:
            return seen


def test_logged_models_ordered_by_a_metric(mlflow_env: LiveServer) -> None:
    """Each model's latest value of the key (newest timestamp, then highest step) orders
    it; models without the key come last in both directions, as on a stock server."""
    client = MlflowClient()
    exp_id = client.create_experiment(_name("lm-order"))
    run_id = client.create_run(exp_id).info.run_id
    # model -> points (value, timestamp, step, dataset name, dataset digest)
    plan: list[list[tuple[float, int, int, str | None, str | None]]] = [
        [(0.5, 1000, 0, None, None)],
        [(0.9, 1000, 0, "dA", "dgA"), (0.1, 2000, 0, "dB", "dgB")],  # latest 0.1; dA 0.9
        [],  # no acc at all
        [(0.7, 1000, 5, None, None), (0.2, 1000, 1, None, None)],  # same time: step 5 wins
        [(0.3, 3000, 0, None, None), (0.95, 1000, 9, None, None)],  # newest time wins
    ]
    ids: list[str] = []
    for i, points in enumerate(plan):
        model_id = client.create_logged_model(exp_id, name=f"m{i}").model_id
        metrics = [
            Metric("acc", v, ts, step, model_id=model_id, dataset_name=d, dataset_digest=g)
            for v, ts, step, d, g in points
        ]
        client.log_batch(run_id, metrics=metrics + [Metric("loss", 1.0, 0, 0, model_id=model_id)])
        ids.append(model_id)
    extra = client.create_logged_model(exp_id, name="only-a-tag", tags={"t": "x"}).model_id

    def order(**item: object) -> list[str]:
        found = mlflow.search_logged_models(
            experiment_ids=[exp_id], order_by=[item], output_format="list"
        )
        return [m.model_id for m in found]

    desc = order(field_name="metrics.acc", ascending=False)
    assert desc[:4] == [ids[3], ids[0], ids[4], ids[1]]
    assert set(desc[4:]) == {ids[2], extra}
    asc = order(field_name="metrics.acc", ascending=True)
    assert asc[:4] == [ids[1], ids[4], ids[0], ids[3]]
    assert set(asc[4:]) == {ids[2], extra}
    # Models that tie (here: all without the key) follow creation time, newest first, then
    # model id: the order with no order_by at all.
    unordered = order(field_name="creation_timestamp", ascending=False)
    assert [m for m in desc if m in (ids[2], extra)] == [
        m for m in unordered if m in (ids[2], extra)
    ]
    # Any column sorts too, as on a stock server (here every model ties on them).
    for column in ("experiment_id", "status", "model_type", "source_run_id"):
        assert order(field_name=column, ascending=False) == unordered, column
    # Only the points logged against a dataset count when the item names one.
    by_dataset = order(field_name="metrics.acc", ascending=False, dataset_name="dA")
    assert by_dataset[0] == ids[1]
    assert order(field_name="metrics.acc", dataset_name="dA", dataset_digest="dgA")[0] == ids[1]
    assert order(field_name="metrics.acc", dataset_name="dA", dataset_digest="zz") == unordered
    # Pages of two, by the page tokens, are the same order.
    for ascending in (False, True):
        item = {"field_name": "metrics.acc", "ascending": ascending}
        paged = _pages(client, exp_id, [item])
        assert paged == (desc if not ascending else asc)
    # Still a whitelist: other entities, unknown keys, malformed items are a clean 400.
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    url = f"{mlflow_env.url}/api/2.0/mlflow/logged-models/search"
    for bad in (
        {"field_name": "params.alpha"},
        {"field_name": "bogus"},
        {"field_name": "metrics.acc; DROP TABLE metrics"},
        {"ascending": False},
        {"field_name": "metrics.acc", "dataset_name": 5},
        {"field_name": "metrics.acc", "ascending": "sideways"},
        "metrics.acc DESC",
    ):
        r = httpx.post(url, headers=headers, json={"experiment_ids": [exp_id], "order_by": [bad]})
        assert (r.status_code, r.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE"), bad
        assert "Traceback" not in r.text


def _model_ids(models: list[LoggedModel]) -> list[str]:
    return [m.model_id for m in models]


def test_logged_model_search_page_sizes_match_stock(mlflow_env: LiveServer) -> None:
    """Stock: 100 models a page by default (and for max_results 0), no upper cap."""
    client = MlflowClient()
    exp_id = client.create_experiment(_name("lm-pages"))
    created = [client.create_logged_model(exp_id, name=f"m{i}").model_id for i in range(105)]
    everything = mlflow.search_logged_models(
        experiment_ids=[exp_id], max_results=100, output_format="list"
    )
    assert len(everything) == 100
    all_of_them = client.search_logged_models(experiment_ids=[exp_id], max_results=1000)
    assert sorted(_model_ids(all_of_them)) == sorted(created)
    assert all_of_them.token is None
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    url = f"{mlflow_env.url}/api/2.0/mlflow/logged-models/search"
    for body in ({}, {"max_results": 0}):
        page = httpx.post(url, headers=headers, json={"experiment_ids": [exp_id], **body}).json()
        assert len(page["models"]) == 100
        assert page["next_page_token"]
    negative = httpx.post(
        url, headers=headers, json={"experiment_ids": [exp_id], "max_results": -1}
    )
    assert (negative.status_code, negative.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")


def test_logged_model_search_by_datasets(mlflow_env: LiveServer) -> None:
    """``datasets`` narrows a logged-model search as on a stock server: metric clauses count
    only the points logged against one of the datasets (by name, and digest when given), and
    without metric clauses a model needs some metric logged against one of them."""
    client = MlflowClient()
    exp_id = client.create_experiment(_name("lm-datasets"))
    run_id = client.create_run(exp_id).info.run_id
    plan: list[list[tuple[str, float, str | None, str | None]]] = [
        [("acc", 0.9, "dA", "dgA")],
        [("acc", 0.5, "dA", "dgB")],
        [("acc", 0.7, "dB", "dgB")],
        [("acc", 0.3, None, None)],
        [("loss", 0.1, "dA", "dgA")],
        [("acc", 0.4, "dA", "dgA"), ("acc", 0.95, "dB", "dgB")],
        [],
    ]
    ids: list[str] = []
    for i, points in enumerate(plan):
        model_id = client.create_logged_model(exp_id, name=f"m{i}").model_id
        metrics = [
            Metric(k, v, 1000, 0, model_id=model_id, dataset_name=d, dataset_digest=g)
            for k, v, d, g in points
        ]
        if metrics:
            client.log_batch(run_id, metrics=metrics)
        ids.append(model_id)

    def found(**kwargs: object) -> set[int]:
        models = client.search_logged_models(experiment_ids=[exp_id], **kwargs)  # type: ignore[arg-type]
        return {ids.index(m.model_id) for m in models}

    assert found() == set(range(7))
    a_digest_a = {"dataset_name": "dA", "dataset_digest": "dgA"}
    assert found(datasets=[a_digest_a]) == {0, 4, 5}
    assert found(datasets=[{"dataset_name": "dA", "dataset_digest": "dgB"}]) == {1}
    # No digest: any digest of the dataset (the client's documented meaning).
    assert found(datasets=[{"dataset_name": "dA"}]) == {0, 1, 4, 5}
    assert found(datasets=[a_digest_a, {"dataset_name": "dB", "dataset_digest": "dgB"}]) == {
        0, 2, 4, 5,
    }  # fmt: skip
    assert found(datasets=[{"dataset_name": "nowhere"}]) == set()
    # With a metric clause only the points on the datasets count: model 5 has acc 0.95
    # on dB, but 0.4 on dA.
    assert found(filter_string="metrics.acc > 0.6") == {0, 2, 5}
    assert found(filter_string="metrics.acc > 0.6", datasets=[a_digest_a]) == {0}
    assert found(filter_string="metrics.acc > 0.6", datasets=[{"dataset_name": "dB"}]) == {2, 5}
    assert found(filter_string="metrics.acc < 0.6", datasets=[{"dataset_name": "dA"}]) == {1, 5}
    # Pages follow the same search.
    paged: list[str] = []
    token = None
    while True:
        page = client.search_logged_models(
            experiment_ids=[exp_id], datasets=[a_digest_a], max_results=1, page_token=token
        )
        paged += [m.model_id for m in page]
        token = page.token
        if not token:
            break
    assert paged == [ids[5], ids[4], ids[0]]
    # A dataset without a name, and malformed items, are a clean 400 as on a stock server.
    with pytest.raises(MlflowException) as no_name:
        client.search_logged_models(experiment_ids=[exp_id], datasets=[{"dataset_name": ""}])
    assert no_name.value.error_code == "INVALID_PARAMETER_VALUE"
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    url = f"{mlflow_env.url}/api/2.0/mlflow/logged-models/search"
    for bad in (
        {"dataset_name": "dA"},
        ["dA"],
        [{"dataset_digest": "dgA"}],
        [{"dataset_name": 5}],
        [{"dataset_name": "dA", "dataset_digest": ["x"]}],
        [{"dataset_name": "d\x00A"}],
        [{"dataset_name": "x" * 10_000}],
        [{"dataset_name": "dA"}] * 101,
    ):
        r = httpx.post(url, headers=headers, json={"experiment_ids": [exp_id], "datasets": bad})
        assert (r.status_code, r.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE"), bad
        assert "Traceback" not in r.text


def test_logged_model_filters_take_lists_and_every_string_column(mlflow_env: LiveServer) -> None:
    """As on a stock server, params, tags and string attributes take IN / NOT IN lists,
    and status_message and artifact_location are attributes a filter may name."""
    client = MlflowClient()
    exp_id = client.create_experiment(_name("lm-lists"))
    ids = [
        client.create_logged_model(
            exp_id,
            name=f"lm{i}",
            params={"opt": "adam" if i % 2 else "sgd"},
            tags={"t": f"v{i}"},
            model_type="clf" if i < 2 else "reg",
        ).model_id
        for i in range(4)
    ]

    def found(filter_string: str) -> set[int]:
        models = client.search_logged_models(experiment_ids=[exp_id], filter_string=filter_string)
        return {ids.index(m.model_id) for m in models}

    assert found("params.opt IN ('adam', 'other')") == {1, 3}
    assert found("params.opt NOT IN ('adam')") == {0, 2}
    assert found("tags.t IN ('v1', 'v2')") == {1, 2}
    assert found("tags.t not in ('v1', 'v2')") == {0, 3}
    assert found("name IN ('lm1', 'lm3') AND model_type = 'clf'") == {1}
    assert found("model_type NOT IN ('clf')") == {2, 3}
    assert found(f"model_id IN ('{ids[2]}')") == {2}
    assert found("artifact_location LIKE '%/models/%/artifacts'") == {0, 1, 2, 3}
    assert found(f"artifact_location = 'mlflow-artifacts:/{exp_id}/models/{ids[0]}/artifacts'") == {
        0
    }
    assert found("status_message = 'x'") == set()
    # Lists stay lists of quoted strings, and numbers stay numeric-only.
    for bad in ("params.opt IN (1, 2)", "metrics.m IN ('1')", "creation_timestamp IN ('1')"):
        with pytest.raises(MlflowException) as refused:
            found(bad)
        assert refused.value.error_code == "INVALID_PARAMETER_VALUE", bad


def test_finalize_takes_every_status_a_stock_server_takes(mlflow_env: LiveServer) -> None:
    """A stock server lets ``finalize_logged_model`` set any status of the enum, PENDING
    and UNSPECIFIED included; anything else is a clean 400 that changes nothing."""
    client = MlflowClient()
    exp_id = client.create_experiment(_name("lm-finalize"))
    model_id = client.create_logged_model(exp_id, name="m").model_id
    for status in (
        LoggedModelStatus.READY,
        LoggedModelStatus.PENDING,
        LoggedModelStatus.UNSPECIFIED,
        LoggedModelStatus.FAILED,
    ):
        assert client.finalize_logged_model(model_id, status).status == status
        assert client.get_logged_model(model_id).status == status
    url = f"{mlflow_env.url}/api/2.0/mlflow/logged-models/{model_id}"
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    for bad in ("BOGUS", "logged_model_ready", "READY"):
        answer = httpx.patch(url, headers=headers, json={"model_id": model_id, "status": bad})
        assert answer.status_code == 400
        assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
        assert "LOGGED_MODEL_PENDING" in answer.json()["message"]
    assert client.get_logged_model(model_id).status == LoggedModelStatus.FAILED


def test_filters_on_experiment_id_and_lifecycle_stage(mlflow_env: LiveServer) -> None:
    """A stock server filters logged models on the ``experiment_id`` (compared as text, so
    ``= 4``, ``= '04'`` and ``LIKE`` all work) and ``lifecycle_stage`` attributes; a search
    only ever finds active models, so ``lifecycle_stage = 'deleted'`` finds none."""
    client = MlflowClient()
    exp_a = client.create_experiment(_name("lm-exp-a"))
    exp_b = client.create_experiment(_name("lm-exp-b"))
    in_a = client.create_logged_model(exp_a, name="in-a").model_id
    in_b = client.create_logged_model(exp_b, name="in-b").model_id
    gone = client.create_logged_model(exp_a, name="gone").model_id
    client.delete_logged_model(gone)

    def found(filter_string: str) -> set[str]:
        models = client.search_logged_models(
            experiment_ids=[exp_a, exp_b], filter_string=filter_string
        )
        return {m.model_id for m in models}

    assert found(f"experiment_id = '{exp_a}'") == {in_a}
    assert found(f"attributes.experiment_id = {exp_b}") == {in_b}
    assert found(f"experiment_id = '0{exp_a}'") == {in_a}
    assert found(f"experiment_id != '{exp_a}'") == {in_b}
    assert found(f"experiment_id IN ('{exp_a}', '{exp_b}')") == {in_a, in_b}
    assert found(f"experiment_id NOT IN ('{exp_a}')") == {in_b}
    assert found(f"experiment_id LIKE '{exp_b}'") == {in_b}
    assert found("experiment_id = 'nope'") == set()
    assert found("lifecycle_stage = 'active'") == {in_a, in_b}
    assert found("lifecycle_stage = 'deleted'") == set()
    assert found("lifecycle_stage ILIKE 'ACT%' AND name = 'in-a'") == {in_a}
    assert found("lifecycle_stage IN ('active', 'deleted')") == {in_a, in_b}
    ordered = client.search_logged_models(
        experiment_ids=[exp_a], order_by=[{"field_name": "lifecycle_stage"}]
    )
    assert [m.model_id for m in ordered] == [in_a]
    for bad in (
        f"experiment_id > '{exp_a}'",
        "lifecycle_stage < 'b'",
        "experiment_id = '1' OR 1=1",
        "lifecycle_stage = 'active'; DROP TABLE logged_models",
    ):
        with pytest.raises(MlflowException) as refused:
            client.search_logged_models(experiment_ids=[exp_a], filter_string=bad)
        assert refused.value.error_code == "INVALID_PARAMETER_VALUE"
    assert found("name = 'gone'") == set()
