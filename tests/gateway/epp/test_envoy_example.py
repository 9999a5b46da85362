"""deploy/examples/envoy: a plain Envoy's config for the picker parses as Envoy's own
bootstrap proto (the xds-protos schemas) and agrees with the picker's config."""

from __future__ import annotations

from pathlib import Path

# The typed configs the bootstrap names must be in the descriptor pool to be parsed.
import envoy.extensions.filters.http.ext_proc.v3.ext_proc_pb2
import envoy.extensions.filters.http.router.v3.router_pb2
import envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2
import envoy.extensions.upstreams.http.v3.http_protocol_options_pb2  # noqa: F401
import yaml
from envoy.config.bootstrap.v3.bootstrap_pb2 import Bootstrap
from google.protobuf import json_format

from kvgate.gateway.config import load_config
from kvgate.gateway.dataplane.eppwire import DESTINATION

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "examples" / "envoy"


def test_the_envoy_example_is_a_valid_bootstrap_that_asks_the_picker() -> None:
    data = yaml.safe_load((EXAMPLE / "envoy.yaml").read_text())
    bootstrap = json_format.ParseDict(data, Bootstrap())  # unknown fields or types fail here
    picker = load_config(EXAMPLE / "kvgate.yaml")
    (listener,) = bootstrap.static_resources.listeners
    hcm_any = listener.filter_chains[0].filters[0].typed_config
    from envoy.extensions.filters.http.ext_proc.v3.ext_proc_pb2 import ExternalProcessor
    from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
        HttpConnectionManager,
    )

    hcm = HttpConnectionManager()
    assert hcm_any.Unpack(hcm)
    ext_proc = ExternalProcessor()
    assert hcm.http_filters[0].typed_config.Unpack(ext_proc)
    assert ext_proc.failure_mode_allow is False  # FailClose
    mode = ext_proc.processing_mode
    duplex = mode.FULL_DUPLEX_STREAMED
    assert (mode.request_body_mode == duplex) == (
        picker.epp.request_body_mode == "full_duplex_streamed"
    )
    assert mode.request_trailer_mode == mode.SEND and mode.response_trailer_mode == mode.SEND
    clusters = {c.name: c for c in bootstrap.static_resources.clusters}
    epp = clusters[ext_proc.grpc_service.envoy_grpc.cluster_name]
    address = epp.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert address.port_value == picker.epp.port
    route = hcm.route_config.virtual_hosts[0].routes[0].route
    picked = clusters[route.cluster]
    assert picked.original_dst_lb_config.http_header_name == DESTINATION
    assert picker.epp.fallbacks == 0  # an ORIGINAL_DST cluster reads one address
