# placeenv inference service (the default target, api) and its load generator (target locust).
#
#   docker build -t placeenv:local .                        # CPU Paddle; serves sim:0..3
#   docker run --rm -p 8000:8000 placeenv:local
#   docker build --build-arg PADDLE=gpu -t placeenv:gpu .    # CUDA Paddle (see docker-compose.gpu.yml)
#   docker build --target locust -t placeenv-locust:local .  # the load generator (no Paddle)
#
# Two build arguments a corporate network needs:
#   BASE             another base image with Python >= 3.10 and venv (an internal mirror of
#                    python:3.11-slim, or a Debian image made with debootstrap, as CI does:
#                    tests/e2e/test_compose_engine.py makes one and passes it through deploy/compose.ci.yml)
#   EXTRA_CA_CERTS   PEM text of CA certificates that pip must trust besides the usual ones
#                    (a TLS-inspecting proxy): --build-arg EXTRA_CA_CERTS="$(cat corp-ca.pem)".
#                    Only the build stages see it.
#
# The sim device plugin is compiled at build time into PLACEENV_SIM_CACHE, so a
# container starts without compiling; g++ stays installed because the plugin is
# rebuilt (once, into the same cache) if the Paddle headers ever change.
# EXTRA_CA_CERTS reaches the build stages only; the images copy the finished virtualenvs,
# with pip's setting for it removed.
ARG BASE=python:3.11-slim

# ------------------------------------------------------------------ where pip runs (build stages only)
FROM ${BASE} AS pip-base
ARG EXTRA_CA_CERTS=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# pip trusts its usual CAs (certifi's) plus EXTRA_CA_CERTS, when given (PIP_CERT).
RUN python3 -m venv /opt/venv \
    && if [ -n "$EXTRA_CA_CERTS" ]; then \
         { cat "$(python -c 'import pip._vendor.certifi as c; print(c.where())')"; \
           printf '%s\n' "$EXTRA_CA_CERTS"; } > /opt/build-ca.pem \
         && pip config --site set global.cert /opt/build-ca.pem; \
       fi

# The service's dependencies, read from pyproject.toml alone: the grpc and openvino extras' requirements, the
# placeenv[...] extras they name expanded (tomllib from Python 3.11, pip's vendored tomli before it). A change
# elsewhere in the file (the tests' settings) makes the same list, which the deps stage copies by its content,
# so its install is kept.
FROM pip-base AS requirements
COPY pyproject.toml /src/pyproject.toml
RUN python -c "import importlib, sys; \
toml = importlib.import_module('tomllib' if sys.version_info >= (3, 11) else 'pip._vendor.tomli'); \
project = toml.load(open('/src/pyproject.toml', 'rb'))['project']; \
extras = project['optional-dependencies']; \
of = lambda extra: [r for given in extras[extra] \
                    for r in (of(given[9:-1]) if given.startswith('placeenv[') else [given])]; \
print('\n'.join(dict.fromkeys(project['dependencies'] + of('grpc') + of('openvino'))))" > /src/requirements.txt

# The service's virtualenv without the project: its dependencies alone, so that a change to the source
# rebuilds the project's small layer, not these gigabytes.
FROM pip-base AS deps
# cpu: the paddlepaddle wheel from PyPI (what pyproject.toml depends on).
# gpu: paddlepaddle-gpu from Paddle's own index, in place of the CPU wheel.
ARG PADDLE=cpu
ARG PADDLE_GPU_INDEX=https://www.paddlepaddle.org.cn/packages/stable/cu126/
# Paddle first, in its own layer: by far the largest download, and it changes
# far less often than the project's source.
RUN pip install 'paddlepaddle>=3.3,<3.4'
COPY --from=requirements /src/requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt \
    && if [ "$PADDLE" = "gpu" ]; then \
         pip uninstall -y paddlepaddle \
         && pip install 'paddlepaddle-gpu>=3.3,<3.4' -i "$PADDLE_GPU_INDEX"; \
       fi \
    && rm -f /opt/venv/pip.conf

# The project itself, a wheel: the api stage installs it over the dependencies, offline.
FROM pip-base AS build
COPY . /src
RUN pip wheel --no-deps --wheel-dir /wheels /src

# The load generator's virtualenv: what loadtest/ imports, no Paddle.
FROM pip-base AS build-locust
COPY loadtest/requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt \
    && rm -f /opt/venv/pip.conf

# ------------------------------------------------------------------ the images
# `docker build --target locust`: Locust with loadtest/ and locust.conf in /app, as the
# compose `locust` service runs it.
FROM ${BASE} AS locust
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    PATH=/opt/venv/bin:$PATH
COPY --from=build-locust /opt/venv /opt/venv
WORKDIR /app
COPY loadtest /app/loadtest
COPY locust.conf /app/locust.conf
RUN useradd --create-home --uid 10001 placeenv \
    && mkdir -p /app/results && chown placeenv:placeenv /app/results
USER placeenv
ENTRYPOINT ["locust"]

# The api: the default target, so it comes last.
FROM ${BASE} AS api
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    PLACEENV_SIM_CACHE=/opt/placeenv/sim-cache \
    XDG_CACHE_HOME=/opt/placeenv/cache \
    PLACEENV_HOST=0.0.0.0 \
    PLACEENV_PORT=8000
# g++ compiles the sim device; a base that has it already (debootstrap --include=g++)
# needs no package index.
RUN command -v g++ >/dev/null \
    || (apt-get update \
        && apt-get install -y --no-install-recommends g++ \
        && rm -rf /var/lib/apt/lists/*)
COPY --from=deps /opt/venv /opt/venv
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-deps --no-index /tmp/wheels/*.whl && rm -rf /tmp/wheels
WORKDIR /app
# Unprivileged user; it owns the sim cache so a rebuild (new headers) can still write it. The
# shim that runs Predictors without the GIL (placeenv.native) is built into XDG_CACHE_HOME.
# The bundled mobilenet is built here into XDG_CACHE_HOME, which the user owns too, so a
# container starts without building it.
# Your own models: mount a repository and set PLACEENV_MODEL_REPOSITORY (docs/models.md).
RUN useradd --create-home --uid 10001 placeenv \
    && mkdir -p "$PLACEENV_SIM_CACHE" "$XDG_CACHE_HOME" \
    && python -m placeenv.sim build \
    && python -m placeenv.native build \
    && python -m placeenv.serve.models.examples \
    && chown -R placeenv:placeenv "$PLACEENV_SIM_CACHE" "$XDG_CACHE_HOME"
USER placeenv

EXPOSE 8000

# Ready, not just alive: /readyz answers 503 until every worker has its models
# loaded (and again while draining); urlopen raises on any status >= 400.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('PLACEENV_PORT', '8000'), timeout=4)"]

# SIGTERM drains: readyz turns 503, accepted requests finish (PLACEENV_SHUTDOWN_GRACE_S).
STOPSIGNAL SIGTERM
CMD ["python", "-m", "placeenv.serve"]
