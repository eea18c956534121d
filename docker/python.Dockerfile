# The treadle Python package with the dashboard: the image of the worker and the dashboard.
FROM python:3.11-slim-bookworm
WORKDIR /usr/src/treadle
COPY pyproject.toml README.md LICENSE ./
COPY python/ python/
RUN pip install --no-cache-dir '.[dashboard]'
USER nobody
