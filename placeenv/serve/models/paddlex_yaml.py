"""PaddleX's YAML reader in the service: each file parsed once while it is unchanged, in C where pyyaml can.

PaddleX reads an export's ``inference.yml`` for each predictor it builds (``load_model_config``, through its
``YAMLReaderBackend``), with pyyaml's pure-Python ``FullLoader``. A recogniser's file holds its character
dictionary (some 18,000 lines): 0.48 s a read, where libyaml's parser under the same constructor
(``CFullLoader``) takes 0.06 s for the same mapping. PP-StructureV3 builds five OCR predictors on each CPU
worker, so the reads were three quarters of its start's CPU (docs/benchmarks.md). ``read_once`` replaces
that one method of PaddleX's, once, in the service's process (``paddlex_pipeline.register``): PaddleX is
imported only there, so nothing changes for a program that does not serve a PaddleX pipeline.
"""

from __future__ import annotations

import copy
import os
import threading
from typing import Any

#: PaddleX's YAML files as read, by (path, mtime, size): their mappings, a copy handed out for each read.
_READ: dict[tuple, Any] = {}
_READ_LOCK = threading.Lock()
_READ_KEPT = 64


def read_once() -> None:
    """PaddleX's ``YAMLReaderBackend.read_file``: each file parsed once while it is unchanged (its path, time
    and size), each read a copy of its own (PaddleX may change what it read). ``register`` calls it once, when
    it registers the engine; a second call would only put the same reader in place again."""
    import yaml
    from paddlex.inference.utils.io.readers import YAMLReaderBackend

    loader = getattr(yaml, "CFullLoader", yaml.FullLoader)

    def read_file(self, in_path, **kwargs):
        with open(in_path, "r", encoding="utf-8", **kwargs) as yaml_file:
            stat = os.fstat(yaml_file.fileno())
            key = (os.path.realpath(in_path), stat.st_mtime_ns, stat.st_size, tuple(sorted(kwargs.items())))
            with _READ_LOCK:
                found = _READ.get(key, _READ)
            if found is _READ:
                found = yaml.load(yaml_file, Loader=loader)
                with _READ_LOCK:
                    while len(_READ) >= _READ_KEPT:
                        _READ.pop(next(iter(_READ)))
                    _READ[key] = found
        return copy.deepcopy(found)  # (PaddleX may change what it read)

    YAMLReaderBackend.read_file = read_file
