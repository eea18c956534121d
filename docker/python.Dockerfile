# The treadle Python package with the dashboard: the image of the worker and the dashboard.
FROM python:3.11-slim-bookworm
WORKDIR /usr/src/treadle
COPY pyproject.toml setup.py README.md LICENSE treadle.control ./
# the package's SQL scripts are built from sql/ as the package is built (setup.py)
COPY scripts/build-sql scripts/
COPY sql/ sql/
COPY python/ python/
RUN pip install --no-cache-dir '.[dashboard]'
USER nobody
