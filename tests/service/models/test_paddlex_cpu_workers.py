"""The PaddleX pipelines' CPU worker count (models/paddlex.py): CPU_WORKERS, or
PLACEENV_PADDLEX_CPU_WORKERS where set (benchmarks/paddlex_serving.py --cpu-scaling sets it)."""

import pytest

from placeenv.serve.models import paddlex


def test_the_default_is_cpu_workers(monkeypatch):
    monkeypatch.delenv(paddlex.CPU_WORKERS_VARIABLE, raising=False)
    assert paddlex.cpu_workers() == paddlex.CPU_WORKERS == 8


@pytest.mark.parametrize("given, expected", [("1", 1), (" 4 ", 4), ("", 8)])
def test_the_variable_sets_the_count(monkeypatch, given, expected):
    monkeypatch.setenv(paddlex.CPU_WORKERS_VARIABLE, given)
    assert paddlex.cpu_workers() == expected


@pytest.mark.parametrize("given", ["0", "65", "two", "-1", "1.5"])
def test_a_wrong_count_is_refused_naming_the_variable(monkeypatch, given):
    monkeypatch.setenv(paddlex.CPU_WORKERS_VARIABLE, given)
    with pytest.raises(ValueError, match="PLACEENV_PADDLEX_CPU_WORKERS"):
        paddlex.cpu_workers()
