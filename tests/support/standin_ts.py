"""A time-series forecaster as PaddleX exports one, for the tests of PaddleX's ``ts_forecast`` pipeline: a stand-in
under PaddleTS's ``DLinear`` name (PaddleX downloads the real export from its model hosts, which this machine cannot
reach, and no package of the index ships it), with its input (``past_target``, the last 96 hours of the target
column), its output (the next 96), its ``inference.yml`` (``input_data``, ``size``, ``info_params``, ``scale``) and
its ``scaler.pkl`` (scikit-learn's ``StandardScaler``, which PaddleX's ``TSNormalize`` and ``TSDeNormalize`` apply
on either side of the network), so PaddleX's own ``create_pipeline`` runs it as it runs the real one.

The network is DLinear's: the series split into its trend (a moving average of ``KERNEL`` steps, the ends
repeated) and the rest, a linear map over time of each, summed. Its weights are fixed, not learnt: both maps
repeat the last ``PERIOD`` hours, so the forecast is the last day's values again, four times, exactly (the
two parts add back to the series itself). ``series(seed, length)`` makes the tests' inputs, hourly ETT-like
CSVs (``date``, ``OT`` and a covariate the model does not read).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

NAME = "DLinear"
IN, OUT, PERIOD, KERNEL = 96, 96, 24, 25
TIME_COL, TARGET, FREQ = "date", "OT", "1h"
#: The scaler's fit: the series ``series`` draws are about this level and spread.
LEVEL, SPREAD = 20.0, 4.0

YML = f"""\
Global:
  model_name: {NAME}
input_data:
  past_target:
  - {IN}
  - 1
size:
  in_chunk_len: {IN}
  out_chunk_len: {OUT}
  skip_chunk_len: 0
info_params:
  time_col: {TIME_COL}
  target_cols:
  - {TARGET}
  freq: {FREQ}
scale: true
time_feat: false
holiday: false
"""


def network():
    """DLinear over a ``[N, IN, 1]`` series: ``[N, OUT, 1]``, the last ``PERIOD`` steps repeated (its weights)."""
    import paddle

    nn = paddle.nn

    class DLinear(nn.Layer):
        def __init__(self):
            super().__init__()
            self.seasonal, self.trend = nn.Linear(IN, OUT), nn.Linear(IN, OUT)
            repeat = np.zeros((IN, OUT), np.float32)  # (Paddle's Linear weight is [in, out])
            repeat[IN - PERIOD + np.arange(OUT) % PERIOD, np.arange(OUT)] = 1.0
            for layer in (self.seasonal, self.trend):
                layer.weight.set_value(repeat)
                layer.bias.set_value(np.zeros(OUT, np.float32))

        def forward(self, past_target):
            x = past_target.transpose([0, 2, 1])  # [N, 1, IN]
            half = (KERNEL - 1) // 2
            padded = paddle.concat([x[:, :, :1].tile([1, 1, half]), x, x[:, :, -1:].tile([1, 1, half])], axis=2)
            trend = nn.functional.avg_pool1d(padded, KERNEL, stride=1)
            return (self.seasonal(x - trend) + self.trend(trend)).transpose([0, 2, 1])

    return DLinear()


def scaler_file(directory: Path) -> None:
    """The export's ``scaler.pkl``: a ``StandardScaler`` of the target, as PaddleTS saves it (joblib)."""
    import joblib
    import pandas as pd
    from sklearn.preprocessing import StandardScaler

    fitted = StandardScaler().fit(pd.DataFrame({TARGET: [LEVEL - SPREAD, LEVEL + SPREAD]}))
    joblib.dump(fitted, directory / "scaler.pkl")


#: name -> (network, its inputs (shape, dtype, name), inference.yml), as standin_models builds them; and the
#: files beside them.
MODELS = {NAME: (network, [([None, IN, 1], "float32", "past_target")], YML)}
FILES = {NAME: scaler_file}


def series(seed: int, length: int) -> bytes:
    """An hourly series of ``length`` rows as CSV (``date``, ``OT``, ``HUFL``): a daily cycle, a drift and
    noise, its start and phase the seed's."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    hours = np.arange(length)
    level = LEVEL + 0.02 * rng.normal() * hours + SPREAD * np.sin(2 * np.pi * (hours + seed * 5) / PERIOD)
    frame = pd.DataFrame({
        TIME_COL: pd.date_range(f"2016-0{1 + seed % 9}-0{1 + seed % 7} 00:00:00", periods=length, freq="h")
        .strftime("%Y-%m-%d %H:%M:%S"),
        TARGET: np.round(level + rng.normal(0, 0.3, length), 3),
        "HUFL": np.round(rng.normal(5, 1, length), 3)})
    out = io.StringIO()
    frame.to_csv(out, index=False)
    return out.getvalue().encode()
