"""The control plane: model versions, rollouts, membership, memory pressure actions."""
