"""PaddleX's time-series forecasting pipeline, served from its file with no code of its own (a row of
``paddlex_pipeline.INPUTS``, its input a CSV, and of ``FIELDS``, its forecast as CSV), against PaddleX itself.

The file is PaddleX's ts_forecast.yaml with its model the ``DLinear`` stand-in (tests/support/ts_forecast_pipeline.yaml;
standin_ts.py: DLinear's layers, weights that repeat the last day). The inputs are 8 hourly series of 96 to 376
rows. PaddleX's own pipeline on the same CSVs, read and written as PaddleX serving's app reads and writes them, is
the reference: the same result (the cut series, the forecast) and the same forecast CSV, over v2 (REST and gRPC,
4 in flight) and PaddleX serving's ``/time-series-forecasting``. Apart from PaddleX, the forecast is checked for
what the stand-in computes: the last 24 hours, again. The controls: a series shorter than the model's 96 hours,
a file that is not a CSV and a URL are each refused, naming what to send.
"""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
from support import paddlex_reference, standin_models, standin_ts

PIPELINE = paddlex_reference.PIPELINE.with_name("ts_forecast_pipeline.yaml")
LENGTHS = (96, 97, 120, 150, 200, 250, 300, 376)


@pytest.fixture(scope="module")
def series():
    return [standin_ts.series(seed, length) for seed, length in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, series):
    """PaddleX's answers, its file's model_dir the stand-in's export."""
    file = tmp_path_factory.mktemp("reference") / "pipeline.yaml"
    text = PIPELINE.read_text()
    assert text.count("model_dir: DLinear\n") == 1
    file.write_text(text.replace("model_dir: DLinear\n", f"model_dir: {standin_models.export(standin_ts.NAME)}\n"))
    return paddlex_reference.reference_forecast(file, series)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with paddlex_reference.served_standin(tmp_path_factory.mktemp("repository"), "forecast", standin_ts.NAME,
                                          PIPELINE) as proc:
        yield proc


def _frame(text: str):
    import pandas as pd  # (here: 0.4 s to import in every test worker that collects this module)

    return pd.read_csv(io.StringIO(text))


def _same_forecast(ours: str, theirs: str) -> list[str]:
    """What differs between two forecasts' CSVs: their dates, exactly; their values, within 1e-4."""
    a, b = _frame(ours), _frame(theirs)
    if list(a.columns) != list(b.columns) or a[standin_ts.TIME_COL].tolist() != b[standin_ts.TIME_COL].tolist():
        return [f"columns or dates differ: {list(a.columns)} {a.iloc[:2].values.tolist()} against "
                f"{list(b.columns)} {b.iloc[:2].values.tolist()}"]
    close = np.allclose(a[standin_ts.TARGET], b[standin_ts.TARGET], atol=1e-4)
    return [] if close else [f"values differ by up to {np.abs(a[standin_ts.TARGET] - b[standin_ts.TARGET]).max()}"]


def _over_v2(target: str, data: bytes) -> dict:
    answer = paddlex_reference.over_v2(target, "forecast", data, given="csv")
    return {"result": json.loads(answer.as_numpy("result")[0]), "csv": answer.as_numpy("forecast")[0].decode()}


def test_the_forecasts_are_paddlexs(served, series, reference):
    import pandas as pd

    answers = paddlex_reference.together(served, _over_v2, series)
    for seed, (answer, expected, data) in enumerate(zip(answers, reference, series)):
        assert _same_forecast(answer["csv"], expected["csv"]) == [], seed
        assert answer["result"]["cutoff_ts"] == expected["result"]["cutoff_ts"], seed
        assert paddlex_reference.near(answer["result"]["forecast"], expected["result"]["forecast"], 1e-4) == [], seed
        # The stand-in's forecast, apart from PaddleX: the series' last day, four times, on the next 96 hours.
        given, forecast = _frame(data.decode()), _frame(answer["csv"])
        last_day = given[standin_ts.TARGET].to_numpy()[-standin_ts.PERIOD:]
        assert np.allclose(forecast[standin_ts.TARGET], np.tile(last_day, 4), atol=1e-3), seed
        assert forecast[standin_ts.TIME_COL].iloc[0] == str(pd.Timestamp(given[standin_ts.TIME_COL].iloc[-1])
                                                            + pd.Timedelta(hours=1))


def test_paddlex_servings_api_answers_with_its_schema(served, series, reference):
    from paddlex.inference.serving.infra.models import AIStudioResultResponse
    from paddlex.inference.serving.schemas.ts_forecast import InferResult

    body = {"csv": base64.b64encode(series[3]).decode(), "visualize": False}
    answer = httpx.post(f"{served.url}/time-series-forecasting", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    result = AIStudioResultResponse[InferResult].model_validate(answer.json()).result
    assert _same_forecast(base64.b64decode(result.csv).decode(), reference[3]["csv"]) == []
    assert result.image is None  # (visualize draws nothing)


def test_a_series_the_model_cannot_take_is_refused_naming_what_to_send(served, series):
    from tritonclient.utils import InferenceServerException

    short = standin_ts.series(9, standin_ts.IN - 20)
    url = f"{served.url}/time-series-forecasting"
    for data, says in ((short, "at least 96"), (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not a CSV pandas can read"),
                       (b"date,OT\n", "the CSV has no rows")):
        answer = httpx.post(url, json={"csv": base64.b64encode(data).decode()}, timeout=120)
        assert answer.status_code == 422, answer.text
        assert says in answer.json()["errorMsg"] and "send" in answer.json()["errorMsg"], answer.text
    with pytest.raises(InferenceServerException) as refused:
        _over_v2(served.url[len("http://"):], short)
    assert refused.value.status() == "400" and "at least 96" in refused.value.message()
    refused = httpx.post(url, json={"csv": "https://127.0.0.1:9/series.csv"}, timeout=30)
    assert refused.status_code == 422 and "URLs are not fetched" in refused.json()["errorMsg"]
    # The control: the service still answers a series it can take.
    assert httpx.post(url, json={"csv": base64.b64encode(series[0]).decode()}, timeout=120).status_code == 200


def test_the_forecaster_is_a_model_of_the_repository_batched_as_the_file_says(served):
    config = httpx.get(f"{served.url}/v2/models/forecast.TSForecast/config", timeout=30).json()
    assert config["max_batch_size"] == 1
    assert [i["name"] for i in config["input"]] == ["past_target"]
    about = httpx.get(f"{served.url}/v2/models/forecast", timeout=30).json()
    assert [i["name"] for i in about["inputs"]] == ["csv"]
    assert [o["name"] for o in about["outputs"]] == ["result", "forecast"]
