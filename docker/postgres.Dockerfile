# PostgreSQL with the treadle extension and pgTAP, installed by the project's own Makefile.
ARG PG_MAJOR=15
FROM postgres:${PG_MAJOR}-bookworm
ARG PG_MAJOR
RUN apt-get update \
 && apt-get install -y --no-install-recommends make "postgresql-server-dev-${PG_MAJOR}" "postgresql-${PG_MAJOR}-pgtap" \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /usr/src/treadle
COPY Makefile treadle.control ./
COPY sql/ sql/
RUN make install
# run once, when the container first initialises its data folder
COPY docker/initdb.sql /docker-entrypoint-initdb.d/010-treadle.sql
