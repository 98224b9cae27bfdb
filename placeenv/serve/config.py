"""Service configuration: environment variables ``PLACEENV_*`` and matching CLI flags.

Nothing here imports Paddle: ``python -m placeenv.serve`` reads the settings first,
so it can prepare simulated devices before Paddle loads its device plugins.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import importlib.metadata
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from placeenv import native

#: The bundled examples' repository, the default: named here because this module imports no Paddle
#: (placeenv.serve.models.repository re-exports it).
BUNDLED = Path(__file__).with_name("models") / "bundled"

#: The signal on which each process of the service prints every thread's Python stack (``kill -USR2``): where a
#: start that does not become ready, or a request that is not answered, waits.
STACKS = signal.SIGUSR2


class Settings(BaseSettings):
    """Multi-device Paddle inference service. Set each option by flag or [env: ...] variable; a flag wins."""

    # cli_implicit_flags: a yes/no setting is a bare flag, --access-log or --no-access-log.
    # cli_show_env_vars: each flag's help names its variable, PLACEENV_<NAME>.
    # cli_hide_none_type: --grpc-port reads as an int, not {int,null}.
    model_config = SettingsConfigDict(env_prefix="PLACEENV_", cli_kebab_case=True, cli_implicit_flags=True,
                                      cli_show_env_vars=True, cli_hide_none_type=True, extra="ignore")

    # The fields' order is --help's order: where to listen, devices, models, requests, batching,
    # tuning, shutdown, logging.
    host: str = Field("127.0.0.1", description="bind address; the container sets 0.0.0.0")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port; a port in use is refused before any "
                      "model loads")
    grpc_port: int | None = Field(
        None, ge=1, le=65535, description="also serve the Open Inference Protocol over gRPC (Triton's "
        "GRPCInferenceService; Triton uses 8001) on this port, on the same host; unset: HTTP only. "
        "Needs the grpc extra: pip install 'placeenv[grpc]'",
    )
    frontends: str = Field(
        "0", pattern=r"^\s*(auto|[0-9]{1,2})\s*$",
        description="front-end processes that serve HTTP and gRPC (parse, check, render) beside one engine "
        "process that owns the devices and models; 0: everything in one process; 'auto': chosen from the "
        "machine's cores (docs/deploy.md)",
    )
    restart: Literal["always", "never"] = Field(
        "always", description="with front ends: restart the engine or a front end that dies; 'never': the "
        "service exits non-zero when the engine dies (for an orchestrator that restarts it)",
    )
    hung_after_s: float = Field(
        30.0, ge=0, description="with front ends: the engine or a front end whose event loop has not run "
        "for this long (from when it is serving) is hung: it is killed and handled as one that died (see "
        "restart); 0: never; else at least 2 (a loop beats twice a second)",
    )

    devices: str = Field(
        "auto",
        description="comma-separated devices, e.g. 'gpu:0,gpu:1,cpu' or 'sim:0,sim:1'; "
        "'auto': every accelerator, or sim devices when there is none",
    )
    sim_devices: int = Field(4, ge=1, le=64, description="how many sim devices 'auto' creates")
    on_device_failure: Literal["fail", "skip"] = Field(
        "fail", description="a device that cannot start: refuse to start, or start without it"
    )
    workers_per_device: int = Field(2, ge=1, le=64, description="worker threads per device")
    isolation: Literal["on", "off"] = Field(
        "on",
        description="'off' is a demonstration of stock Paddle: placeenv uninstalled, workers "
        "call set_device before every batch, and the leak counters climb",
    )

    model_repository: str = Field(
        "", description="comma-separated model repository directories (Triton's layout: "
        "<repository>/<model>/<version>/model.json + model.pdiparams; docs/models.md); "
        "empty: the bundled examples (digits, mobilenet)",
    )
    models: str = Field("", description="comma-separated models to serve; empty: every model in the repository")
    model_control_mode: Literal["none", "explicit", "poll"] = Field(
        "none", description="loading models while serving, as Triton's: 'none' serves what the repository "
        "held at start; 'explicit' takes load and unload requests (POST /v2/repository/models/{m}/load and "
        "/unload, gRPC RepositoryModelLoad/Unload); 'poll' loads what changes in the repository, every "
        "--repository-poll-s",
    )
    repository_poll_s: float = Field(15.0, gt=0, description="with --model-control-mode poll: seconds between "
                                     "two looks at the repository's files")
    on_model_failure: Literal["fail", "skip"] = Field(
        "fail", description="a model that cannot be loaded (bad file, bad config, fails on a device): refuse to "
        "start, or start without it and report it not ready",
    )

    request_timeout_s: float = Field(
        60.0, gt=0, description="end-to-end limit per request (504 after); long enough for a real model on "
        "the CPU (a text detector's page takes about a second there) with a few requests queued before it")
    max_body_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="request body limit, HTTP and gRPC alike (413 / "
        "RESOURCE_EXHAUSTED above); the default takes a 12-megapixel photo encoded (base64 in JSON too) and a "
        "1x3x960x960 FP32 tensor")
    max_examples_per_request: int = Field(32, ge=1, description="examples in one request (400 above)")
    fetch_urls: bool = Field(
        False, description="PaddleX serving's API (POST /ocr): fetch a file given as an http(s) URL; off, such "
        "a request is refused (422), since any client could make the service fetch an address it names")
    max_pdf_pages: int = Field(100, ge=1, le=10_000, description="PaddleX serving's API: pages of one PDF "
                               "(fileType 0) at most; a longer one is refused (422), before any page is rendered")
    max_pdf_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="PaddleX serving's API: the bytes of one "
                               "PDF at most; a larger one is refused (422) before it is opened")
    queue_capacity: int = Field(64, ge=1, description="requests waiting per device; when every device's "
                                "queue is full, a request gets 503 with Retry-After")
    retry_after_s: int = Field(1, ge=1, description="the Retry-After header of a 503 (overloaded, draining, "
                               "model not ready), in seconds")

    max_batch_size: int = Field(8, ge=1, le=1024, description="examples per forward pass, for models "
                                "whose config does not say")
    max_batch_delay_ms: float = Field(
        2.0, ge=0, le=1000, description="the longest a batch waits for more requests (it goes sooner when "
        "full or when a twentieth of this passes with none for its model arriving), for models whose config "
        "does not say")

    cpu_threads: int | None = Field(
        None, ge=1, le=1024, description="threads a model's run uses on the CPU (ONNX Runtime, OpenVINO, a "
        "Predictor's math library) where its config names none; default: every core this process may use. "
        "In a container whose CPU limit is below the cores it sees, set the limit; on a machine shared with "
        "other work, one thread a run costs the least CPU a page")
    preprocess_threads: int = Field(2, ge=1, le=64, description="CPU threads that preprocess large bodies")
    inline_preprocess_bytes: int = Field(
        4096, ge=0, description="bodies up to this size are preprocessed on the event loop thread, where "
        "the work costs less than the two thread hand-offs it would take; 0: always on a preprocessing thread"
    )
    gil_switch_interval_ms: float = Field(
        0.5, gt=0, le=100, description="how long a thread holds the GIL while another waits for it "
        "(sys.setswitchinterval; Python's default is 5); shorter turns let a finished worker hand back "
        "its batch sooner",
    )
    openmp_blocktime_ms: int = Field(
        1, ge=0, le=1000, description="how long Paddle's OpenMP threads spin for more work after a parallel "
        "region (KMP_BLOCKTIME; an environment's own KMP_BLOCKTIME wins). Each worker thread has its own team "
        "of math threads: with OpenMP's default, far longer, one team's idle spinning takes the cores from the "
        "next step's team and from the CPU steps",
    )

    keep_host_memory: bool = Field(
        True, description="glibc's malloc keeps the host memory the process frees for its next allocations "
        "(one arena, large blocks from its heap rather than mmap, no trimming; an environment's own MALLOC_ARENA_MAX, "
        "MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ win). A Predictor's run and each batch's copies "
        "allocate megabytes at a time: with glibc's defaults each such block goes back to the kernel when "
        "freed, and the next request faults fresh pages in. The cost: resident memory stays at its peak. "
        "Off: glibc's defaults",
    )
    keep_host_block_mib: int = Field(
        4, ge=1, le=1024, description="with keep_host_memory, the largest block (MiB) malloc serves from its heap "
        "and keeps; a larger one is mmapped and goes back to the kernel when freed. A runtime's run on a large "
        "page allocates hundreds of MiB in blocks of tens: kept, resident memory stays at the peak of the "
        "largest pages' runs at once (docs/benchmarks.md). 1024: every block kept, the fastest for a "
        "Predictor's large tensors (a recogniser's output map)",
    )

    predictor_runs_without_gil: bool = Field(
        True, description="a Predictor on the CPU runs with the GIL released (Paddle Inference's C++ run, "
        "through a shim compiled on first use, as the sim device is), so runs, the CPU steps and the event "
        "loop overlap, and each worker runs a Predictor of its own (a copy of the weights a worker, unless "
        "the model's config says share_weights: true). Off, or where no C++ compiler builds the shim: the "
        "binding's own run, which holds the GIL, and one Predictor a device, one run at a time",
    )

    shutdown_delay_s: float = Field(
        0.0, ge=0, description="SIGTERM: readyz answers 503 at once, and requests are still served this "
        "long before the listener closes, so a load balancer or Kubernetes stops routing here first"
    )
    shutdown_grace_s: float = Field(30.0, ge=0, description="SIGTERM: once the listener closes, how "
                                    "long accepted requests have to finish")

    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field("info", description="log level")
    access_log: bool = Field(False, description="log a line per HTTP request (uvicorn's access log); off by "
                             "default, since at thousands of requests a second it costs the event loop time")
    opentelemetry: bool = Field(
        False, description="FastAPI's native OpenTelemetry instrumentation (spans, metrics and logs to the "
        "globally configured OTel providers); off, the service's own Prometheus metrics remain"
    )

    @field_validator("grpc_port", mode="before")
    @classmethod
    def _empty_is_unset(cls, value):
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("hung_after_s")
    @classmethod
    def _longer_than_beats(cls, value: float) -> float:
        if 0 < value < 2:  # a healthy loop beats every half second: shorter kills it between two
            raise ValueError("must be 0 (never) or at least 2 seconds")
        return value

    @field_validator("devices")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not [part for part in value.split(",") if part.strip()]:
            raise ValueError("must name at least one")
        return value

    def device_list(self) -> list[str]:
        return [part.strip() for part in self.devices.split(",") if part.strip()]

    def model_list(self) -> list[str] | None:
        """The models asked for, or None for all."""
        return [part.strip() for part in self.models.split(",") if part.strip()] or None

    def repository_list(self) -> list[Path]:
        paths = [Path(part.strip()) for part in self.model_repository.split(",") if part.strip()]
        return [p if p == BUNDLED else p.resolve() for p in paths] or [BUNDLED]

    def model_directories(self) -> dict[str, Path]:
        """Each model directory of the repositories, by name (the first where names repeat): what a load,
        a poll and the repository index look at."""
        return list_model_directories(self.repository_list())[0]

    def frontend_count(self) -> int:
        """Front-end processes to start; 'auto': none on a machine of 2 cores or fewer, where one process
        serves as much, else one per 2 cores beyond the engine's first two, at most 8."""
        value = self.frontends.strip()
        if value != "auto":
            return int(value)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return 0 if cores <= 2 else min(8, max(1, (cores - 2) // 2))

    def set_up_process(self) -> None:
        """What each process of the service (the single one, the supervisor, the engine, a front end)
        takes from the settings for itself: the log's level and format, and the GIL's switch interval
        (process-wide: with Python's default turns, a finished worker waits long for the event loop
        to let go of the GIL; docs/benchmarks.md, front-end ceiling), OpenMP's spin after a parallel
        region (read when Paddle's OpenMP runtime starts, at its first parallel region: so set before),
        malloc's reuse of freed memory (before the worker threads, whose arenas it decides), and whether
        a Predictor's runs leave the GIL. Each prints every thread's Python stack on ``STACKS``."""
        # faulthandler writes without the GIL: a thread deadlocked holding it does not stop the stacks.
        faulthandler.register(STACKS, all_threads=True)
        os.environ.setdefault("KMP_BLOCKTIME", str(self.openmp_blocktime_ms))
        # Read by placeenv.native where a Predictor first runs, in this process and the engine it starts.
        os.environ[native.SWITCH] = "1" if self.predictor_runs_without_gil else "0"
        if self.keep_host_memory:
            keep_freed_memory(self.keep_host_block_mib << 20)
        logging.basicConfig(level=self.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        sys.setswitchinterval(self.gil_switch_interval_ms / 1000)
        # Read by models/runtimes.py where a CPU run's threads are set, in this process and the engine it starts.
        if self.cpu_threads is None:
            os.environ.pop(CPU_THREADS, None)
        else:
            os.environ[CPU_THREADS] = str(self.cpu_threads)

    def wants_sim(self) -> bool:
        """Whether sim devices must be prepared before Paddle is imported."""
        names = self.device_list()
        if names == ["auto"]:
            return not gpu_present()
        return any(name.split(":")[0].strip() == "sim" for name in names)


#: The variable that carries ``cpu_threads`` to models/runtimes.py: its own setting's, as Settings reads it.
CPU_THREADS = "PLACEENV_CPU_THREADS"


#: glibc's mallopt parameters (malloc.h) and the environment variables glibc reads for them at start, that keep
#: freed memory: every thread in the main arena, whose heap has no size cap (a thread's own arena is capped, and
#: a block beyond it is mmapped); blocks up to the mmap threshold (fixed: glibc's own adapts, up to its cap)
#: from the heap; the heap's free top kept up to the trim threshold.
ARENA_MAX, MMAP_THRESHOLD, TRIM_THRESHOLD = (-8, "MALLOC_ARENA_MAX"), (-3, "MALLOC_MMAP_THRESHOLD_"), (
    -1, "MALLOC_TRIM_THRESHOLD_")


@functools.cache
def _glibc(name: str):
    """glibc's malloc function ``name``; None where the C library is not glibc."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None


def keep_freed_memory(block: int) -> list[str]:
    """Set glibc's malloc to keep what the process frees, in blocks up to ``block`` bytes (the values
    glibc takes: older glibc refuses a threshold above its own cap), each parameter the environment
    leaves unset; the names of those set: none where the C library is not glibc (no ``mallopt``)."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return []
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    wanted = ((ARENA_MAX, (1,)), (MMAP_THRESHOLD, (block, min(block, 32 << 20))), (TRIM_THRESHOLD, ((1 << 31) - 1,)))
    return [variable for (parameter, variable), values in wanted
            if variable not in os.environ and any(mallopt(parameter, value) == 1 for value in values)]


def trim_freed_memory() -> None:
    """glibc's malloc gives the free pages of its heap back (what a large run freed into the kept heap)."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)


def list_model_directories(repositories: list[Path]) -> tuple[dict[str, Path], list[tuple[Path, Path]]]:
    """Each model directory of ``repositories`` by name, the first where names repeat; and each repeat,
    with the directory whose name it repeats, in the repositories' order. A repository that is not a
    directory holds none. The one listing of the repositories: reading them (models/repository.py)
    reports the repeats, and refuses a repository that is not a directory."""
    found: dict[str, Path] = {}
    repeats: list[tuple[Path, Path]] = []
    for repository in repositories:
        if not repository.is_dir():
            continue
        for child in sorted(repository.iterdir()):
            if child.name.startswith((".", "_")) or not child.is_dir():
                continue
            if child.name in found:
                repeats.append((child, found[child.name]))
            else:
                found[child.name] = child
    return found, repeats


def gpu_present() -> bool:
    """A CUDA build of Paddle and an NVIDIA driver, checked without importing Paddle."""
    try:
        importlib.metadata.distribution("paddlepaddle-gpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")
