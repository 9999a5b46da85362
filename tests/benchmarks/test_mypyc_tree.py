"""``benchmarks/mypyc_tree.py``: the rewrites of the compiled copy and its module list."""

from __future__ import annotations

from .loading import load_benchmark

tree = load_benchmark("mypyc_tree")


def test_mypyc_rewrite_marks_protocols_and_enums_non_native_and_renames_thread() -> None:
    source = (
        "from __future__ import annotations\n\nimport asyncio\n\n"
        "class Conn(asyncio.Protocol):\n    def f(self) -> None:\n        self._thread = 1\n\n"
        "class Plain:\n    pass\n"
    )
    out = tree.rewrite(source)
    assert "from mypy_extensions import mypyc_attr\n" in out
    assert "@mypyc_attr(native_class=False)\nclass Conn(asyncio.Protocol):" in out
    assert "@mypyc_attr(native_class=False)\nclass Plain" not in out
    assert "import asyncio\nimport asyncio.protocols\n" in out
    assert "self._loop_thread = 1" in out and "self._thread" not in out
    assert tree.rewrite("x = 1\n") == "x = 1\n"


def test_mypyc_modules_exist_and_are_listed_once() -> None:
    src = tree.SRC
    assert all((src / module).is_file() for module in tree.MODULES)
    assert len(set(tree.MODULES)) == len(tree.MODULES)
