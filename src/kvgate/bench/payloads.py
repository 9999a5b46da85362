"""Request bodies for live replay: ``kvgate.workload.payloads``, re-exported here.

The layout lives with the workloads because the simulator builds its request
features from the very same bodies (``workload.prompts.PromptCodec.features_of``).
"""

from kvgate.workload.payloads import CHAT_PATH, COMPLETIONS_PATH, Payload, PayloadBuilder

__all__ = ["CHAT_PATH", "COMPLETIONS_PATH", "Payload", "PayloadBuilder"]
