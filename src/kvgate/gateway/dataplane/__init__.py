"""The data plane: accepting a client's request, routing it, forwarding it, answering it."""
