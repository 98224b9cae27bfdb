"""What a person reads: ``GET /``'s index of the endpoints, and the documentation pages served
from installed files (no internet needed)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles


#: The endpoints ``GET /`` lists beside the inference routes (whose lines come from their table).
OTHER_ENDPOINTS = [
    {"method": "GET", "path": "/docs", "about": "Swagger UI: every endpoint, with a form to try it"},
    {"method": "GET", "path": "/redoc", "about": "the same documentation as one page (ReDoc)"},
    {"method": "GET", "path": "/openapi.json", "about": "the OpenAPI schema"},
    {"method": "GET", "path": "/v1/models", "about": "the models, their inputs and outputs, and the devices"},
    {"method": "GET", "path": "/v2", "about": "the Open Inference Protocol (KServe v2): server metadata"},
    {"method": "GET", "path": "/v2/models/{name}", "about": "a model's metadata: inputs, outputs, versions"},
    {"method": "GET", "path": "/v2/health/ready", "about": "the Open Inference Protocol's readiness"},
    {"method": "GET", "path": "/metrics", "about": "Prometheus metrics"},
    {"method": "GET", "path": "/healthz", "about": "liveness"},
    {"method": "GET", "path": "/readyz", "about": "readiness: every worker started"},
]


def endpoints(infer_routes) -> list[dict[str, str]]:
    """``GET /``'s index: the documentation's pages, the inference routes from their table, the rest."""
    infer = [{"method": "POST", "path": route.path, "about": route.about} for route in infer_routes]
    return [*OTHER_ENDPOINTS[:3], *infer, *OTHER_ENDPOINTS[3:]]


DOCS_URL, REDOC_URL = "/docs", "/redoc"
#: Where the documentation pages' files are served from.
ASSETS_URL = "/docs/assets"


def add_offline_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` as FastAPI serves them, with their scripts, stylesheet and
    icon served by the app from the fastapi-offline package (FastAPI's own pages load them from a CDN):
    the documentation works with no internet."""
    app.mount(ASSETS_URL, StaticFiles(packages=[("fastapi_offline", "static")]), name="docs-assets")

    def url(request: Request, path: str) -> str:
        """``path`` as the browser reaches it (behind a proxy that serves the app under a prefix)."""
        return f"{request.scope.get('root_path', '')}{path}"

    @app.get(DOCS_URL, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=url(request, app.openapi_url), title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=url(request, app.swagger_ui_oauth2_redirect_url),
            swagger_js_url=url(request, f"{ASSETS_URL}/swagger-ui-bundle.js"),
            swagger_css_url=url(request, f"{ASSETS_URL}/swagger-ui.css"),
            swagger_favicon_url=url(request, f"{ASSETS_URL}/favicon.png"),
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(app.swagger_ui_oauth2_redirect_url, include_in_schema=False)
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            openapi_url=url(request, app.openapi_url), title=f"{app.title} - ReDoc",
            redoc_js_url=url(request, f"{ASSETS_URL}/redoc.standalone.js"),
            redoc_favicon_url=url(request, f"{ASSETS_URL}/favicon.png"),
            with_google_fonts=False,  # Google's fonts are another host: ReDoc falls back to the browser's
        )
