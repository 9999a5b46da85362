"""Observing the fleet and the gateway: the worker pool, probes, scrapes, metrics and logs."""
