"""kvgate: a KV-cache-aware, load-aware gateway for fleets of LLM inference servers."""

__version__ = "0.1.0"
