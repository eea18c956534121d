"""The dashboard and a job's metadata: the job page shows it, the search filters by it (jsonb @>)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from flask.testing import FlaskClient

import treadle


def text(client: FlaskClient, path: str, status: int = 200) -> str:
    response = client.get(path)
    assert response.status_code == status, response.get_data(as_text=True)
    return response.get_data(as_text=True)


def ids_on(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<a href="/jobs/(\d+)">[^<]*</a> <span class="muted">#\d+</span>', html)]


def test_the_job_page_shows_meta_only_when_there_is_some(client: FlaskClient, conn: psycopg.Connection[Any]) -> None:
    with_meta = treadle.enqueue(conn, "deliver", meta={"tenant": "<acme>", "traceparent": "00-ab-cd-01"})
    page = text(client, f"/jobs/{with_meta}")
    shown = re.search(r'<pre class="json" id="meta">(.*?)</pre>', page, re.S)
    assert shown is not None and "traceparent" in shown.group(1) and "00-ab-cd-01" in shown.group(1)
    assert "&lt;acme&gt;" in shown.group(1) and "<acme>" not in page
    without = treadle.enqueue(conn, "deliver")
    assert 'id="meta"' not in text(client, f"/jobs/{without}")


def test_the_search_filters_by_meta(client: FlaskClient, conn: psycopg.Connection[Any]) -> None:
    eu = treadle.enqueue(conn, "deliver", meta={"tenant": "acme", "region": "eu"})
    us = treadle.enqueue(conn, "deliver", meta={"tenant": "acme", "region": "us"})
    treadle.enqueue(conn, "deliver", meta={"tenant": "zeta"})
    treadle.enqueue(conn, "deliver")
    assert ids_on(text(client, "/jobs?meta=" + quote('{"tenant": "acme"}'))) == [us, eu]
    assert ids_on(text(client, "/jobs?meta=" + quote('{"tenant": "acme", "region": "eu"}'))) == [eu]
    assert ids_on(text(client, "/jobs?name=deliver&meta=" + quote('{"region": "us"}'))) == [us]
    assert "No job matches." in text(client, "/jobs?meta=" + quote('{"tenant": "nobody"}'))
    page = text(client, "/jobs?meta=" + quote('{"tenant": "acme"}'))
    assert 'name="meta" value="{&#34;tenant&#34;: &#34;acme&#34;}"' in page


@pytest.mark.parametrize("bad", ["[1]", '"acme"', "{", "7"])
def test_the_search_refuses_meta_that_is_not_an_object(client: FlaskClient, bad: str) -> None:
    assert "meta must be a JSON object" in text(client, "/jobs?meta=" + quote(bad), 400)
