"""Pipelines in the model repository, read as the service reads them at start (``repository.read``):
every broken config is ONE error naming the pipeline, its file and the step; a good one is linked
with its steps in an order that runs each after what it reads. How a pipeline runs its steps
(``engine.pipeline.plan``): which outputs stay tensors between steps. And the bundled pipelines'
parts, off the service: encoded images decoded (``models/images.py``) with clear refusals that quote
none of their bytes, and the OCR example's steps finding as many lines as were drawn.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.models import run_locally
from support.servers import TEST_REPOSITORY

from placeenv.serve.engine.pipeline import plan
from placeenv.serve.models import RepositoryError, examples, images
from placeenv.serve.models.repository import read
from placeenv.serve.protocol.request import InputError

TESTS = Path(TEST_REPOSITORY)
STEP_MODELS = ("affine", "affine_host", "rowsum", "faulty", "text")


@pytest.fixture
def repo(tmp_path) -> Path:
    """A repository with the test models a pipeline's steps name (model.py files copied, links followed)."""
    for name in STEP_MODELS:
        shutil.copytree(TESTS / name, tmp_path / name, symlinks=False)
    return tmp_path


def pipeline(repo: Path, name: str, *parts: str) -> Path:
    """``<repo>/<name>/config.yaml`` of ``parts``, each dedented on its own."""
    (repo / name).mkdir(exist_ok=True)
    path = repo / name / "config.yaml"
    path.write_text("".join(textwrap.dedent(part).lstrip("\n") for part in parts))
    return path


def read_all(repo: Path, select=None):
    return read([repo], select, max_batch_size=8, max_batch_delay_ms=2.0)


HEAD = """
    inputs:
      - {name: x, datatype: FP32, shape: [-1, 4]}
    outputs:
      - {name: sum, datatype: FP32, shape: [-1, 1]}
"""
CHAIN = textwrap.dedent(HEAD) + textwrap.dedent("""
    pipeline:
      - model: affine
        inputs: {x: x}
        outputs: {y: first}
      - model: rowsum
        inputs: {x: first}
        outputs: {sum: sum}
""")


def only_error(found, name: str) -> RepositoryError:
    errors = [e for e in found.errors if e.model == name]
    assert len(errors) == 1 and name not in found.pipelines, found.errors
    return errors[0]


def test_a_pipeline_is_linked_to_its_steps_models_in_the_order_they_run(repo):
    # Listed last-first: the order the steps run in is the order of the tensors they read.
    path = pipeline(repo, "p", HEAD, """
        description: two steps
        pipeline:
          - model: rowsum
            inputs: {x: first}
            outputs: {sum: sum}
          - model: affine
            version: 1
            inputs: {x: x}
            outputs: {y: first}
    """)
    found = read_all(repo)
    assert found.errors == []
    (p,) = found.pipelines.values()
    assert [s.model for s in p.steps] == ["affine", "rowsum"] and [s.index for s in p.steps] == [2, 1]
    assert p.config_file == path and p.max_batch_size == 8 and p.version == 1
    assert [s.describe() for s in p.inputs] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert "p" not in found.entries and {"affine", "rowsum"} <= set(found.entries)


def test_selecting_a_pipeline_serves_the_models_of_its_steps(repo):
    pipeline(repo, "p", CHAIN)
    found = read_all(repo, ["p"])
    assert found.errors == [] and set(found.pipelines) == {"p"} and set(found.entries) == {"affine", "rowsum"}


def test_a_model_used_twice_is_two_steps_labelled_apart(repo):
    pipeline(repo, "p", HEAD, """
        pipeline:
          - {model: affine, inputs: {x: x}, outputs: {y: first}}
          - {model: affine, inputs: {x: first}, outputs: {y: second}}
          - {model: rowsum, inputs: {x: second}, outputs: {sum: sum}}
    """)
    (p,) = read_all(repo).pipelines.values()
    assert [s.label for s in p.steps] == ["affine", "affine#2", "rowsum"]


BROKEN = {
    "unknown model": ("""
        pipeline:
          - {model: affine, inputs: {x: x}, outputs: {y: first}}
          - {model: rowsun, inputs: {x: first}, outputs: {sum: sum}}
    """, "step 2 ('rowsun'): no model 'rowsun' in the repository; it holds affine, affine_host, faulty, rowsum, text"),
    "a pipeline as a step": ("""
        pipeline:
          - {model: p, inputs: {x: x}, outputs: {sum: sum}}
    """, "step 1 ('p'): 'p' is a pipeline; a step is a model (pipelines do not nest)"),
    "no such version": ("""
        pipeline:
          - {model: affine, version: 3, inputs: {x: x}, outputs: {y: first}}
          - {model: rowsum, inputs: {x: first}, outputs: {sum: sum}}
    """, "step 1 ('affine'): model 'affine' has no version 3; it has 1"),
    "an input the model does not have": ("""
        pipeline:
          - {model: affine, inputs: {x: x, z: x}, outputs: {y: first}}
          - {model: rowsum, inputs: {x: first}, outputs: {sum: sum}}
    """, "step 1 ('affine'): model 'affine' has no input 'z'; its inputs are 'x' (FP32 [-1, 4])"),
    "an unmapped input": ("""
        pipeline:
          - {model: affine, inputs: {x: x}, outputs: {y: first}}
          - {model: rowsum, inputs: {}, outputs: {sum: sum}}
    """, "step 2 ('rowsum'): input 'x' (FP32 [-1, 4]) is not mapped: map it to a pipeline input or another "
         "step's output"),
    "an output the model does not have": ("""
        pipeline:
          - {model: affine, inputs: {x: x}, outputs: {z: first}}
          - {model: rowsum, inputs: {x: first}, outputs: {sum: sum}}
    """, "step 1 ('affine'): model 'affine' has no output 'z'; its outputs are 'y' (FP32 [-1, 4])"),
    "a tensor made twice": ("""
        pipeline:
          - {model: affine, inputs: {x: x}, outputs: {y: x}}
          - {model: rowsum, inputs: {x: x}, outputs: {sum: sum}}
    """, "step 1 ('affine'): output 'y' becomes tensor 'x', which is already a pipeline input: give it another name"),
    "a tensor nothing makes": ("""
        pipeline:
          - {model: affine, inputs: {x: x}, outputs: {y: first}}
          - {model: rowsum, inputs: {x: firts}, outputs: {sum: sum}}
    """, "step 2 ('rowsum'): input 'x' reads tensor 'firts', which no step makes and the pipeline does not "
         "take; there are x, first, sum"),
    "another datatype": ("""
        pipeline:
          - {model: affine, inputs: {x: x}, outputs: {y: first}}
          - {model: faulty, inputs: {values: first}, outputs: {sum: made}}
          - {model: text, inputs: {text: made}, outputs: {length: sum}}
    """, "step 3 ('text'): input 'text' is BYTES, but tensor 'made' (step 2 ('faulty')'s output 'sum') is FP32"),
    "another shape": ("""
        pipeline:
          - {model: rowsum, inputs: {x: x}, outputs: {sum: first}}
          - {model: rowsum, inputs: {x: first}, outputs: {sum: sum}}
    """, "step 2 ('rowsum'): input 'x' has shape [-1, 4], but tensor 'first' (step 1 ('rowsum')'s output 'sum') "
         "has [-1, 1] (-1: any size)"),
    "a cycle": ("""
        pipeline:
          - {model: affine, inputs: {x: third}, outputs: {y: first}}
          - {model: affine, inputs: {x: first}, outputs: {y: second}}
          - {model: affine_host, inputs: {x: second}, outputs: {y: third}}
          - {model: rowsum, inputs: {x: x}, outputs: {sum: sum}}
    """, "steps read each other's outputs in a cycle: step 1 ('affine') -> step 2 ('affine') -> "
         "step 3 ('affine_host') -> step 1 ('affine')"),
    "a step reading its own output": ("""
        pipeline:
          - {model: affine, inputs: {x: first}, outputs: {y: first}}
          - {model: rowsum, inputs: {x: x}, outputs: {sum: sum}}
    """, "in a cycle: step 1 ('affine') -> step 1 ('affine')"),
    "an output no step makes": ("""
        pipeline:
          - {model: affine, inputs: {x: x}, outputs: {y: first}}
          - {model: rowsum, inputs: {x: first}, outputs: {sum: total}}
    """, "output 'sum' is made by no step: map a step's output to it"),
    "a tensor nobody reads": ("""
        pipeline:
          - {model: affine, inputs: {x: x}, outputs: {y: first}}
          - {model: rowsum, inputs: {x: x}, outputs: {sum: sum}}
    """, "tensor 'first' (step 1 ('affine')'s output 'y') is read by no step and is not an output of the pipeline"),
}


@pytest.mark.parametrize("problem", list(BROKEN))
def test_a_broken_pipeline_is_one_error_naming_the_pipeline_its_file_and_the_step(repo, problem):
    steps, says = BROKEN[problem]
    path = pipeline(repo, "p", HEAD, steps)
    error = only_error(read_all(repo), "p")
    assert error.path == str(path)
    assert says in error.problem, error.problem
    assert str(error) == f"model 'p': {path}: pipeline: {error.problem.removeprefix('pipeline: ')}"
    assert set(read_all(repo).entries) >= {"affine", "rowsum"}  # the models themselves still serve


@pytest.mark.parametrize("config, says", [
    (textwrap.dedent(HEAD) + "backend: jit\npipeline:\n  - {model: affine, inputs: {x: x}, outputs: {y: sum}}\n",
     "backend: a pipeline's steps run as their models do"),
    ("outputs:\n  - {name: y, datatype: FP32, shape: [-1, 4]}\npipeline:\n"
     "  - {model: affine, inputs: {x: x}, outputs: {y: y}}\n", "no inputs: a pipeline declares its inputs"),
    ("inputs:\n  - {name: x, datatype: FP32}\noutputs:\n  - {name: y, datatype: FP32, shape: [-1, 4]}\n"
     "pipeline:\n  - {model: affine, inputs: {x: x}, outputs: {y: y}}\n", "inputs[0]: give its name, datatype and shape"),
    (textwrap.dedent(HEAD) + "pipeline: []\n", "no steps"),
    (textwrap.dedent(HEAD) + "max_batch_size: 16\npipeline:\n  - {model: affine, inputs: {x: x}, outputs: {y: y}}\n"
     "  - {model: rowsum, inputs: {x: y}, outputs: {sum: sum}}\n",
     "max_batch_size 16 is more than step 1 ('affine') takes: its model's max_batch_size is 8"),
    (textwrap.dedent(HEAD) + "pipeline:\n  - {model: affine, inputs: {x: x}, outputs: {y: sum}, batch: 2}\n", "pipeline.0.batch"),
])
def test_a_pipeline_config_is_refused_naming_what_to_change(repo, config, says):
    pipeline(repo, "p", config)
    assert says in str(only_error(read_all(repo), "p"))


def test_a_pipeline_whose_step_cannot_be_served_says_why(repo):
    (repo / "affine" / "config.yaml").write_text("max_batch_size: lots\n")
    pipeline(repo, "p", CHAIN)
    error = only_error(read_all(repo), "p")
    assert "step 1 ('affine'): model 'affine' cannot be served: invalid config: max_batch_size" in error.problem


def test_a_pipelines_version_directory_holds_no_model(repo):
    pipeline(repo, "p", CHAIN)
    (repo / "p" / "1").mkdir()  # Triton's layout: an empty version directory is fine
    assert read_all(repo).errors == []
    (repo / "p" / "1" / "model.py").write_text("")
    error = only_error(read_all(repo), "p")
    assert error.path == str(repo / "p" / "1") and "holds no program or model.py" in error.problem


def test_the_plan_keeps_a_tensor_on_its_device_only_where_every_reader_takes_tensors(repo):
    pipeline(repo, "p", HEAD, """
        pipeline:
          - {model: affine, inputs: {x: x}, outputs: {y: first}}
          - {model: affine, inputs: {x: first}, outputs: {y: second}}
          - {model: rowsum, inputs: {x: second}, outputs: {sum: sum}}
    """)
    pipeline(repo, "host", CHAIN.replace("model: rowsum", "model: affine_host").replace("sum: sum", "y: sum")
             .replace("[-1, 1]", "[-1, 4]"))
    found = read_all(repo)
    assert found.errors == []
    kept = {name: {s.step.label: set(s.keep) for s in plan(p, found.entries).steps}
            for name, p in found.pipelines.items()}
    # affine's y goes to affine#2, whose preprocess is the default and which runs on the devices: a
    # tensor. rowsum runs on CPU workers only, and its sum is the pipeline's output: host arrays.
    # affine_host has a preprocess of its own: it reads host arrays.
    assert kept == {"p": {"affine": {"y"}, "affine#2": set(), "rowsum": set()},
                    "host": {"affine": set(), "affine_host": set()}}


# -- encoded images ------------------------------------------------------------------------------


def rgb(height: int = 40, width: int = 60) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.mark.parametrize("format", ["PNG", "JPEG"])
def test_an_image_decodes_to_the_size_and_mode_asked_in_0_to_1(format):
    pixels = rgb()
    decoded = images.decode_all(np.array([images.encode(pixels, format)] * 2, dtype=object), "image",
                                mode="RGB", size=(32, 24))
    assert decoded.shape == (2, 3, 24, 32) and decoded.dtype == np.float32
    expected = np.asarray(Image.fromarray(pixels).resize((32, 24), Image.Resampling.BILINEAR)) / 255
    tolerance = 0.002 if format == "PNG" else 0.35  # JPEG is lossy
    assert np.abs(decoded[0].transpose(1, 2, 0) - expected).max() < tolerance
    grey = images.decode(images.encode(pixels[..., 0]), "page", mode="L", size=(8, 4))
    assert grey.shape == (1, 4, 8)


@pytest.mark.parametrize("data, says", [
    (b"not an image, and the secret s3cr3t", "is not a PNG or JPEG image"),
    (images.encode(rgb(), "PNG")[:200] + b"s3cr3t", "cannot be decoded"),
    (images.encode(rgb(), "GIF"), "is not a PNG or JPEG image"),
    (b"", "is not a PNG or JPEG image"),
])
def test_what_is_not_an_image_is_refused_naming_the_element_and_quoting_nothing(data, says):
    batch = np.array([images.encode(rgb(), "PNG"), data], dtype=object)
    with pytest.raises(InputError) as refused:
        images.decode_all(batch, "image", mode="RGB", size=(8, 8))
    message = str(refused.value)
    assert message.startswith("input 'image' element 1 ") and says in message, message
    assert "s3cr3t" not in message and len(message) < 200


def test_an_image_that_claims_to_be_huge_is_refused_before_it_is_decoded():
    png = bytearray(images.encode(np.zeros((2, 2), np.uint8)))
    png[16:24] = (100_000).to_bytes(4, "big") * 2  # IHDR's width and height (its CRC is not checked first)
    with pytest.raises(InputError, match=r"input 'image' element 0 is (100000x100000 pixels|not a PNG)"):
        images.decode_all(np.array([bytes(png)], dtype=object), "image", mode="L", size=(8, 8))


# -- the OCR example's steps -----------------------------------------------------------------------


def test_the_ocr_steps_find_as_many_lines_as_a_page_has():
    """The detector's program (built as the service builds it) and text_lines, by hand, on pages of 1 to 3
    lines: the count is the pipeline's ground truth in the served tests."""
    examples.ensure("ocr_det")
    rng = np.random.default_rng(7)
    for lines in (1, 2, 3) * 4:
        page = examples.ocr_page(lines, rng)
        (rows,) = run_locally(examples.home("ocr_det") / "1" / "model", (page / 255).astype(np.float32)[None, None])
        found = examples.text_lines(rows[0])
        assert len(found) == lines, (lines, found)
        crops = examples.line_crops((page / 255).astype(np.float32)[None], found)
        assert crops.shape == (lines, 1, *examples.CROP) and crops.dtype == np.float32
    assert examples.read_lines(np.eye(len(examples.CHARSET))[[[1, 1, 0, 2, 3, 3, 0, 1]]]) == ["0120"]
