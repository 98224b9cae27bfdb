# placeenv inference service (and the locust load generator: same image).
#
#   docker build -t placeenv:local .                        # CPU Paddle; serves sim:0..3
#   docker run --rm -p 8000:8000 placeenv:local
#   docker build --build-arg PADDLE=gpu -t placeenv:gpu .    # CUDA Paddle (see docker-compose.gpu.yml)
#
# The sim device plugin is compiled at build time into PLACEENV_SIM_CACHE, so a
# container starts without compiling; g++ stays installed because the plugin is
# rebuilt (once, into the same cache) if the Paddle headers ever change.
FROM python:3.11-slim

# cpu: the paddlepaddle wheel from PyPI (what pyproject.toml depends on).
# gpu: paddlepaddle-gpu from Paddle's own index, in place of the CPU wheel.
ARG PADDLE=cpu
ARG PADDLE_GPU_INDEX=https://www.paddlepaddle.org.cn/packages/stable/cu126/

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PLACEENV_SIM_CACHE=/opt/placeenv/sim-cache \
    PLACEENV_HOST=0.0.0.0 \
    PLACEENV_PORT=8000

RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# Paddle first, in its own layer: by far the largest download, and it changes
# far less often than the project's source.
RUN pip install 'paddlepaddle>=3.3,<3.4'

COPY . /app
# '.[dev]' is the service extra plus locust and the test tools, so the compose `locust`
# service runs from this image too.
RUN pip install '.[dev]' \
    && if [ "$PADDLE" = "gpu" ]; then \
         pip uninstall -y paddlepaddle \
         && pip install 'paddlepaddle-gpu>=3.3,<3.4' -i "$PADDLE_GPU_INDEX"; \
       fi \
    && rm -rf build *.egg-info

# Unprivileged user; it owns the sim cache so a rebuild (new headers) can still
# write it, and /app/results, where a locust run in this image writes its CSVs.
# The bundled mobilenet is built here (the package directory is root's at run time).
# Your own models: mount a repository and set PLACEENV_MODEL_REPOSITORY (docs/serving.md).
RUN useradd --create-home --uid 10001 placeenv \
    && mkdir -p "$PLACEENV_SIM_CACHE" /app/results \
    && python -m placeenv.sim build \
    && python -m placeenv.serve.models.examples \
    && chown -R placeenv:placeenv "$PLACEENV_SIM_CACHE" /app/results
USER placeenv

EXPOSE 8000

# Ready, not just alive: /readyz answers 503 until every worker has its models
# loaded (and again while draining); urlopen raises on any status >= 400.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('PLACEENV_PORT', '8000'), timeout=4)"]

# SIGTERM drains: readyz turns 503, accepted requests finish (PLACEENV_SHUTDOWN_GRACE_S).
STOPSIGNAL SIGTERM
CMD ["python", "-m", "placeenv.serve"]
