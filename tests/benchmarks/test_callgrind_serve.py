"""``benchmarks/callgrind_serve.py`` (callgrind's and py-spy's output read into a split) and
``benchmarks/mypyc_tree.py`` (the rewrites of the compiled copy)."""

from __future__ import annotations

import pytest

from .loading import load_benchmark

cg = load_benchmark("callgrind_serve")
tree = load_benchmark("mypyc_tree")

ANNOTATE = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,000,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
600,000 (60.00%)  /tmp/b/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault'2 [/x/lib/libpython3.11.so.1.0]
200,000 (20.00%)  /tmp/b/Python-3.11.7/./Include/object.h:_PyFrame_Clear
100,000 (10.00%)  /project/uvloop/loop.c:__pyx_f_6uvloop_4loop_6Handle__run [/v/site-packages/uvloop/loop.cpython-311-x86_64-linux-gnu.so]
 60,000 ( 6.00%)  build/__native_ab12.c:CPyDef_route___route [/s/src/ab12__mypyc.cpython-311-x86_64-linux-gnu.so]
 40,000 ( 4.00%)  ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S:__memcpy_avx_unaligned_erms [/usr/lib/x86_64-linux-gnu/libc.so.6]
"""  # noqa: E501


def test_split_objects_reads_the_total_and_groups_functions_by_their_object() -> None:
    total, objects = cg.split_objects(ANNOTATE)
    assert total == 1_000_000
    assert objects == {
        "interpreter": 800_000,  # the inlined header's line counts with its interpreter
        "uvloop": 100_000,
        "kvgate compiled (mypyc)": 60_000,
        "libc": 40_000,
    }
    assert sum(objects.values()) == total


def test_split_objects_refuses_output_without_totals() -> None:
    with pytest.raises(SystemExit):
        cg.split_objects("nothing here\n")


RAW = """\
_run (asyncio/events.py:80);data_received (kvgate/gateway/dataplane/listener.py:259);route (kvgate/core/route.py:120) 5
_run (asyncio/events.py:80);send (kvgate/gateway/dataplane/http_answer.py:114);write (libc.so.6) 3
_run (asyncio/events.py:80);record (kvgate/gateway/observe/logs.py:211);replace (dataclasses.py:1494) 2
uv__run_idle (loop.cpython-311-x86_64-linux-gnu.so) 1
"""  # noqa: E501


def test_split_samples_sets_system_calls_apart_and_groups_by_module() -> None:
    leaf, owner, modules = cg.split_samples(RAW)
    assert leaf == {
        "core": 5,
        "system calls (kernel time)": 3,
        "other Python (stdlib, libraries)": 2,
        "native, no Python frame": 1,
    }
    assert owner == {"core": 5, "gateway/observe": 2, "no kvgate frame": 1}
    assert modules == {"core/route.py": 5, "gateway/observe/logs.py": 2}


def test_object_names_of_a_mypyc_build_are_told_apart() -> None:
    assert cg._object_name("/s/src/kvgate/core/route.cpython-311-x86_64-linux-gnu.so") == (
        "kvgate compiled (mypyc)"
    )
    assert cg._object_name("/v/site-packages/httptools/parser/parser.so") == "httptools/llhttp"


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
