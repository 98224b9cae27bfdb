"""A PaddleX pipeline object's runners reach the engine over the links of the pipeline built or run on this
thread (models/paddlex_pipeline.building). A block may hold another's: a CPU worker waiting on a network call
runs other requests' jobs meanwhile, another PaddleX pipeline's among them. When that inner block ends, the
outer pipeline's links are back, so a module PaddleX builds after it (at a request's first need, as
PP-StructureV3 builds its table-orientation classifier at its first table) gets its runner. The control: a
module built outside any block is refused."""

from __future__ import annotations

import pytest

from placeenv.serve.models import paddlex_pipeline

OUTER = paddlex_pipeline.Link("documents.TableOrientationClassify", ("x",), ("fetch_name_0",))
INNER = paddlex_pipeline.Link("ocr.TextDetection", ("x",), ("fetch_name_0",))


def _runner(key: str):
    """The runner PaddleX's engine builds for a module whose engine_config names ``key``."""
    paddlex_pipeline.register(set())
    build = paddlex_pipeline._ENGINE[0]().get_default_runner_builder()
    return build(model_name="PP-LCNet_x1_0_doc_ori", model_dir="PP-LCNet_x1_0_doc_ori-tables", model_config={},
                 engine_config={paddlex_pipeline.MODEL_KEY: key})


def test_a_module_built_after_an_inner_pipelines_block_gets_the_outer_pipelines_link():
    def outer_call(link, arrays):
        return ["outer", link.model]

    with paddlex_pipeline.building({"orientation": OUTER}, outer_call):
        with paddlex_pipeline.building({"detection": INNER}, lambda link, arrays: ["inner"]):
            assert _runner("detection")([None]) == ["inner"]
        runner = _runner("orientation")
        assert runner([None]) == ["outer", OUTER.model]
    # The control: outside any block a module is refused, as it was here inside the outer block when the
    # inner one's end emptied the thread's links.
    with pytest.raises(RuntimeError, match="was built outside a placeenv pipeline"):
        _runner("orientation")
