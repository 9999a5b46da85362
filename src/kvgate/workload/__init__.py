"""Workloads, traces and the prompt codec, shared by the simulator, live replay and the demo.

A request is a sequence of prompt segments (``request``); synthetic workloads
(``synthetic``) and trace replay (``traces``) stream them; ``prompts`` turns them into
block hashes or real text; ``bound`` computes the best hit rate any router could reach.
"""
