"""The judge: a fixed protocol that compares ``default`` with the peers, shape by shape.

``scenarios`` names the shapes and their bars, ``stats`` the paired intervals,
``protocol`` the judgment, ``simulated`` and ``live`` the two ways to run a
scenario, ``report`` the table. ``benchmarks/judge.py`` is the command.
"""
