"""With ``--auth``, the page before login is a login form and nothing else: no API description, no file
paths, no weight list. After login the model pickers show short names only, and the API description
names no path on the server either."""

from __future__ import annotations

import httpx
import pytest

from tests.support.synth import model_config
from tests.webui.test_server import _app, running_server

pytest.importorskip("gradio_client")


def server_paths(config_path) -> list[str]:
    """Every path the configuration names, and the folders they lie in."""
    from engine.config import load_config

    config = load_config(config_path, base_dir=config_path.parent)
    paths = {str(config_path), str(config_path.parent), str(config.base_dir)}
    for key in ("t2s_weights_path", "vits_weights_path", "bert_base_path", "cnhuhbert_base_path"):
        path = config.path(key)
        paths |= {str(path), str(path.parent)}
    return sorted(paths, key=len, reverse=True)


def test_the_login_page_carries_no_api_schema_no_paths_and_no_weights() -> None:
    config_path = model_config("v2")
    app, _ = _app(config_path, auth=[("ann", "s3cret")])
    paths = server_paths(config_path)
    with running_server(app) as url:
        for address in (f"{url}/", f"{url}/?view=api", f"{url}/?page="):
            page = httpx.get(address, timeout=30)
            assert page.status_code == 200 and '"auth_required":true' in page.text.replace(" ", "")
            for leak in (*paths, "named_endpoints", "/generate", "gpt_weights", ".ckpt", ".pth", "s2G2333k"):
                assert leak not in page.text, (address, leak)
        assert httpx.head(f"{url}/", timeout=30).status_code == 200
        for protected in ("/gradio_api/info", "/config", "/gradio_api/openapi.json"):
            assert httpx.get(f"{url}{protected}", timeout=30).status_code == 401, protected

        with httpx.Client(base_url=url, timeout=30) as session:  # logged in: the page as Gradio serves it
            assert session.post("/login", data={"username": "ann", "password": "s3cret"}).status_code == 200
            page = session.get("/").text
            assert "named_endpoints" in page and "/generate" in page
            info = session.get("/gradio_api/info").text
            assert "gpt_weights" in info
            for path in paths:
                assert path not in page and path not in info, path
            assert "v2 · s2G2333k.pth" in page  # the pickers' short names
