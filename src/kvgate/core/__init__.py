"""Pure, synchronous decision code: features, fleet snapshots, policies, admission.

Nothing in ``core`` awaits, reads a clock it was not given, or touches a socket.
"""
