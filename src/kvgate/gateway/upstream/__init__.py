"""The one boundary to the network towards workers: the forwarding client and its transport."""
