"""treadle: background jobs and step workflows inside PostgreSQL."""

__version__ = "0.1.0"
