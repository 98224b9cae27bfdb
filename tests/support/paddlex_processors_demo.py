"""A prototype (issue 44), not the product: PaddleX 3.7.2's own OCR processors used as a library,
with plain ``paddle.inference`` Predictors in place of PaddleX's predictor and pipeline classes.

Per image, the same steps and settings as PaddleX's ``OCR`` pipeline (``ocr_pipeline.yaml``:
use_doc_preprocessor and use_textline_orientation off, text_type general):

1. decode: ``cv2.imdecode(..., cv2.IMREAD_COLOR)``, BGR uint8, as PaddleX's ReadImage (its
   opencv backend) does; every later step works on BGR, as the exports' DecodeImage img_mode says;
2. det preprocess: ``DetResizeForTest(limit_side_len=64, limit_type="min", max_side_limit=4000)``,
   ``NormalizeImage(scale="1./255.", mean, std, order="hwc")`` (ImageNet mean/std applied to the B,
   G, R planes in that order, as PaddleX does), ``ToCHWImage()``, ``ToBatch()``;
3. det model: a ``paddle.inference`` Predictor, oneDNN off (``config.disable_mkldnn()``);
4. ``DBPostProcess(thresh=0.3, box_thresh=0.6, unclip_ratio=1.5, max_candidates=1000)``;
5. ``SortQuadBoxes()`` (top to bottom, then left to right within 10 px), ``CropByPolys("quad")``
   (minAreaRect, perspective warp, INTER_CUBIC, BORDER_REPLICATE, rot90 when h/w >= 1.5), empty
   crops dropped with their polygons;
6. rec: crops sorted by width/height ratio (a stable sort), in batches of 6 (the TextRecognition
   ``batch_size``) in that order; each crop ``OCRReisizeNormImg([3, 48, 320])`` (to height 48 at its
   own ratio, width at least 320, zero-padded to int(48 * max(320/48, w/h))), the batch then
   zero-padded to its widest (``ToBatch`` of text_recognition); a Predictor (oneDNN on, PaddleX's
   CPU default for this model: run_mode mkldnn); ``CTCLabelDecode(character_dict)`` from the
   export's inference.yml;
7. results in the sorted-box order, kept where ``rec_score >= text_rec_score_thresh`` (0.0);
   ``rec_boxes = convert_points_to_boxes(rec_polys)`` (x min, y min, x max, y max per polygon).

Run in a venv with paddlepaddle and paddlex (bare: no extras; the processors need opencv-contrib-python,
pyclipper and shapely beside it)::

    python tests/support/paddlex_processors_demo.py MODELS_DIR OUT.json IMAGE...

writes ``{"results": [per image: rec_texts, rec_scores, rec_polys, rec_boxes, dt_polys], "seconds":
[per image, after a warm-up run], "create_seconds"}``, the shape paddlex_reference.run_reference
returns. DEMO_REC_ONEDNN=0 runs the rec model with oneDNN off as well; DEMO_DECODE=pil decodes
with Pillow (RGB to BGR) instead of OpenCV.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

# PaddleX's processors and pipeline glue (paddlex 3.7.2); importing them imports paddlex/__init__.
from paddlex.inference.models.common.vision.processors import ToBatch, ToCHWImage
from paddlex.inference.models.text_detection.processors import DBPostProcess, DetResizeForTest, NormalizeImage
from paddlex.inference.models.text_recognition.processors import CTCLabelDecode, OCRReisizeNormImg
from paddlex.inference.models.text_recognition.processors import ToBatch as RecToBatch
from paddlex.inference.pipelines.components.common.convert_points_and_boxes import convert_points_to_boxes
from paddlex.inference.pipelines.components.common.crop_image_regions import CropByPolys
from paddlex.inference.pipelines.components.common.sort_boxes import SortQuadBoxes

import cv2  # noqa: E402  (after paddlex, which checks for opencv-contrib-python)
import yaml  # noqa: E402
from paddle import inference  # noqa: E402

#: The pipeline's settings (ocr_pipeline.yaml = PaddleX 3.7.2's OCR.yaml defaults).
DET = {"limit_side_len": 64, "limit_type": "min", "max_side_limit": 4000,
       "thresh": 0.3, "box_thresh": 0.6, "unclip_ratio": 1.5}
REC_BATCH_SIZE = 6
REC_SCORE_THRESH = 0.0
CPU_THREADS = int(os.environ.get("PADDLE_PDX_CPU_NUM_THREADS", 10))  # PaddleX's default


def predictor(model_dir: Path, onednn: bool) -> inference.Predictor:
    """A Predictor configured as PaddleX's PaddleStaticRunner does on a CPU."""
    config = inference.Config(str(model_dir / "inference.json"), str(model_dir / "inference.pdiparams"))
    config.disable_gpu()
    if onednn:
        config.enable_mkldnn()
        config.set_mkldnn_cache_capacity(10)
    else:
        config.disable_mkldnn()
    config.set_cpu_math_library_num_threads(CPU_THREADS)
    config.enable_new_ir(True)
    config.enable_new_executor()
    config.set_optimization_level(3)
    config.enable_memory_optim()
    config.disable_glog_info()
    return inference.create_predictor(config)


def run(p: inference.Predictor, x: np.ndarray) -> list[np.ndarray]:
    (name,) = p.get_input_names()
    handle = p.get_input_handle(name)
    handle.reshape(x.shape)
    handle.copy_from_cpu(x)
    p.run()
    return [p.get_output_handle(n).copy_to_cpu() for n in p.get_output_names()]


class OCR:
    def __init__(self, models: Path, rec_onednn: bool = True):
        det_dir, rec_dir = models / "PP-OCRv5_mobile_det", models / "PP-OCRv5_mobile_rec"
        det_yml = yaml.safe_load((det_dir / "inference.yml").read_text())
        rec_yml = yaml.safe_load((rec_dir / "inference.yml").read_text())
        ops = {k: v for op in det_yml["PreProcess"]["transform_ops"] for k, v in op.items()}
        resize_kwargs = {k: v for k, v in (ops["DetResizeForTest"] or {}).items()
                         if k not in ("limit_side_len", "limit_type", "resize_long")}
        # As TextDetRunnerPredictor.build_resize: the pipeline's limit_side_len/limit_type win.
        self.det_resize = DetResizeForTest(limit_side_len=DET["limit_side_len"], limit_type=DET["limit_type"],
                                           max_side_limit=DET["max_side_limit"], **resize_kwargs)
        norm = ops["NormalizeImage"]
        self.det_normalize = NormalizeImage(scale=norm["scale"], mean=norm["mean"], std=norm["std"],
                                            order=norm.get("order", ""))
        self.det_chw = ToCHWImage()
        self.det_batch = ToBatch()
        post = det_yml["PostProcess"]
        self.det_post = DBPostProcess(thresh=DET["thresh"], box_thresh=DET["box_thresh"],
                                      unclip_ratio=DET["unclip_ratio"],
                                      max_candidates=post.get("max_candidates", 1000),
                                      use_dilation=post.get("use_dilation", False),
                                      score_mode=post.get("score_mode", "fast"),
                                      box_type=post.get("box_type", "quad"))
        self.sort = SortQuadBoxes()
        self.crop = CropByPolys(det_box_type="quad")
        rec_ops = {k: v for op in rec_yml["PreProcess"]["transform_ops"] for k, v in op.items()}
        self.rec_resize = OCRReisizeNormImg(rec_image_shape=rec_ops["RecResizeImg"]["image_shape"])
        self.rec_batch = RecToBatch()
        self.rec_decode = CTCLabelDecode(character_list=rec_yml["PostProcess"]["character_dict"])
        self.det = predictor(det_dir, onednn=False)
        self.rec = predictor(rec_dir, onednn=rec_onednn)

    def __call__(self, data: bytes, decode: str = "cv2") -> dict:
        if decode == "cv2":  # PaddleX's ReadImage and its serving's image_bytes_to_array
            image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        else:  # Pillow, RGB to BGR: what a service that decodes with Pillow would feed
            from PIL import Image
            import io
            image = np.ascontiguousarray(np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[:, :, ::-1])
        resized, shapes = self.det_resize([image], limit_side_len=DET["limit_side_len"],
                                          limit_type=DET["limit_type"], max_side_limit=DET["max_side_limit"])
        x = self.det_batch(self.det_chw(self.det_normalize(resized)))
        preds = run(self.det, x[0])
        polys, _scores = self.det_post(preds, shapes, thresh=DET["thresh"], box_thresh=DET["box_thresh"],
                                       unclip_ratio=DET["unclip_ratio"])
        dt_polys = self.sort(polys[0])
        crops, kept = [], []
        for crop, poly in zip(self.crop(image, dt_polys), dt_polys):
            if crop.size > 0 and crop.shape[0] > 0 and crop.shape[1] > 0:
                crops.append(crop)
                kept.append(poly)
        dt_polys = kept
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / float(crops[i].shape[0]))
        found: dict[int, tuple[str, float]] = {}
        for start in range(0, len(order), REC_BATCH_SIZE):
            ids = order[start:start + REC_BATCH_SIZE]
            x = self.rec_batch(self.rec_resize([crops[i] for i in ids]))
            texts, scores = self.rec_decode(run(self.rec, x[0]))
            found.update({i: (t, s) for i, t, s in zip(ids, texts, scores)})
        result = {"rec_texts": [], "rec_scores": [], "rec_polys": [], "dt_polys": [p.tolist() for p in dt_polys]}
        for i, poly in enumerate(dt_polys):
            text, score = found[i]
            if score >= REC_SCORE_THRESH:
                result["rec_texts"].append(text)
                result["rec_scores"].append(float(score))
                result["rec_polys"].append(poly)
        result["rec_boxes"] = convert_points_to_boxes(result["rec_polys"]).tolist()
        result["rec_polys"] = [np.asarray(p).tolist() for p in result["rec_polys"]]
        return result


def main(argv: list[str]) -> None:
    models, out, images = Path(argv[0]), Path(argv[1]), argv[2:]
    rec_onednn = os.environ.get("DEMO_REC_ONEDNN", "1") == "1"  # 0: the rec model with oneDNN off too
    decode = os.environ.get("DEMO_DECODE", "cv2")  # pil: decode with Pillow instead
    started = time.perf_counter()
    ocr = OCR(models, rec_onednn=rec_onednn)
    created = time.perf_counter() - started
    datas = [Path(i).read_bytes() for i in images]
    if datas:
        ocr(datas[0], decode)  # warm-up, as the reference runner
    results, seconds = [], []
    for data in datas:
        begun = time.perf_counter()
        results.append(ocr(data, decode))
        seconds.append(time.perf_counter() - begun)
    out.write_text(json.dumps({"results": results, "seconds": seconds, "create_seconds": created}))


if __name__ == "__main__":
    main(sys.argv[1:])
