"""Test helpers for the gateway: a gateway running in the test's event loop.

Re-exported from ``kvgate.gateway.embedded`` so that tests keep one import
path while product code (the demo) never imports a testing module.
"""

from kvgate.gateway.embedded import GatewayHandle, running_gateway

__all__ = ["GatewayHandle", "running_gateway"]
